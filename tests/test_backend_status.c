/* SPDX-License-Identifier: MIT */
/*
 * test_backend_status.c — throttle_backend_status(): "shm" is always up;
 * on Redis, up while it answers, and once it is stopped (a real
 * redis-server, stopped and started again), down since a time and with a
 * count of the calls this host's segment served meanwhile; up again, with
 * both back to 0, once it answers.  No timing is asserted beyond "some
 * time passed" (down_ms is not checked against a clock).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

#include <stdio.h>

static struct th_redis R;

static int setup(void **state) { return th_redis_setup(state, &R); }
static int teardown(void **state) { return th_redis_teardown(state, &R); }

static void status(throttle_t *h, int *up, uint64_t *down_ms,
                   uint64_t *served) {
  *up = -1;
  assert_int_equal(throttle_backend_status(h, up, down_ms, served), 0);
}

static void test_backend_status_shm_is_up(void **state) {
  (void)state;
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  char name[128];
  th_unique_name(name, sizeof name);
  assert_int_equal(throttle_config_set_segment(cfg, name), 0);
  assert_int_equal(throttle_config_set_backend(cfg, "shm"), 0);
  throttle_t *h = NULL;
  assert_int_equal(throttle_open(cfg, &h), 0);
  throttle_config_free(cfg);
  int up;
  uint64_t down_ms = 7, served = 7;
  status(h, &up, &down_ms, &served);
  assert_int_equal(up, 1);
  assert_true(down_ms == 0 && served == 0);
  assert_int_equal(throttle_backend_status(h, NULL, NULL, NULL),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_backend_status(NULL, &up, NULL, NULL),
                   THROTTLE_EINVAL);
  throttle_close(h);
  throttle_unlink(name);
}

static void test_backend_status_redis_down_then_back(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  int up;
  uint64_t down_ms, served;
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  status(h, &up, &down_ms, &served);
  assert_int_equal(up, 1);
  assert_true(down_ms == 0 && served == 0);

  th_redis_stop(&R, 1);
  uint64_t left = 0;
  for (int i = 0; i < 3; i++) /* served by the segment */
    assert_int_equal(throttle_remaining(h, "k", &left), 0);
  status(h, &up, &down_ms, &served);
  assert_int_equal(up, 0);
  assert_true(served >= 3);
  status(h, &up, NULL, NULL); /* the out-parameters may be NULL */
  assert_int_equal(up, 0);

  assert_int_equal(th_redis_start(&R), 0);
  /* the module reconnects on a later call, not at once */
  for (int i = 0; i < 100; i++) {
    (void)throttle_remaining(h, "k", &left);
    status(h, &up, &down_ms, &served);
    if (up)
      break;
    th_sleep_ms(100);
  }
  assert_int_equal(up, 1);
  assert_true(down_ms == 0 && served == 0);
}

int main(int argc, char **argv) {
  (void)argc;
  const struct CMUnitTest shm[] = {
      cmocka_unit_test_setup_teardown(test_backend_status_shm_is_up, th_setup,
                                      th_teardown),
  };
  int rc = cmocka_run_group_tests(shm, NULL, NULL);
  if (!th_redis_available()) {
    printf("SKIP the Redis cases: redis-server is not installed (make deps)\n");
    return rc;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest redis[] = {
      cmocka_unit_test_setup_teardown(test_backend_status_redis_down_then_back,
                                      setup, teardown),
  };
  return rc | cmocka_run_group_tests(redis, NULL, NULL);
}
