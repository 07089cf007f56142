/* SPDX-License-Identifier: MIT */
/*
 * test_segment_full.c — a segment that cannot be reserved because
 * /dev/shm is full (posix_fallocate fails with ENOSPC, injected) leaves no
 * empty object behind for `ls` and every later opener to trip on; a
 * segment that was already built is never touched by a failing opener.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "internal.h"

static struct th_fx *fx_of(void **state) { return *state; }

static bool shm_exists(const char *name) {
  char path[256];
  th_shm_path(name, path, sizeof path);
  struct stat st;
  return stat(path, &st) == 0;
}

static void test_segment_full_create_leaves_no_empty_object(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_NO_FALLBACK), 0);
  throttle__fault_errno(THROTTLE__FAULT_FALLOCATE, ENOSPC);
  throttle__fault_arm(THROTTLE__FAULT_FALLOCATE, 1);
  throttle_t *h = NULL;
  int rc = throttle_open(fx->cfg, &h);
  throttle__fault_reset();
  assert_int_equal(rc, THROTTLE_ENOSPC);
  assert_null(h);
  assert_true(th_contains(throttle_errmsg(NULL), "/dev/shm"));
  assert_false(shm_exists(fx->name));
  /* and the next open, with room, creates it */
  h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
}

static void test_segment_full_built_segment_is_kept(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
  /* A second opener whose reservation fails (it only re-reserves when it
   * builds, which it does not here) must leave the built one alone. */
  throttle__fault_errno(THROTTLE__FAULT_FALLOCATE, ENOSPC);
  throttle__fault_arm(THROTTLE__FAULT_FALLOCATE, 1);
  throttle_t *h2 = NULL;
  int rc = throttle_open(fx->cfg, &h2);
  throttle__fault_reset();
  throttle_close(h2);
  (void)rc;
  assert_true(shm_exists(fx->name));
  assert_true(th_remaining(h, "k") > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_segment_full_create_leaves_no_empty_object, th_setup,
          th_teardown),
      cmocka_unit_test_setup_teardown(test_segment_full_built_segment_is_kept,
                                      th_setup, th_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
