/* SPDX-License-Identifier: MIT */
/*
 * test_clock.c — the throttle clock is the host's: a process whose C
 * library reports another time (run under libfaketime, as a test of date
 * logic is) still reads every not-before and every holder's lease on the
 * kernel's clock, so it neither sends within another process's back-off
 * nor reclaims a live holder's slot.  The faked process is this binary
 * run again under faketime(1); skipped when faketime is not installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LONG_MS 10000

static struct th_fx *fx_of(void **state) { return *state; }

/* The faked process: on segment seg, "held" is backed off and "capped"
 * has its one place taken.  Exit 0 when both hold it back. */
static int faked_child(const char *seg) {
  throttle_config_t *cfg = throttle_config_new();
  throttle_t *h = NULL;
  if (cfg == NULL || throttle_config_set_segment(cfg, seg) != 0 ||
      throttle_open(cfg, &h) != 0)
    return 10;
  uint64_t ms = 0;
  if (throttle_remaining(h, "held", &ms) != 0 || ms < LONG_MS / 2)
    return 11;
  if (throttle_wait(h, "held", 0) != THROTTLE_ETIMEDOUT)
    return 12;
  throttle_ticket_t *t = NULL;
  if (throttle_try_enter(h, "held", THROTTLE_CLASS_LIVE, &t, NULL) !=
      THROTTLE_EWOULDBLOCK)
    return 13;
  if (throttle_try_enter(h, "capped", THROTTLE_CLASS_LIVE, &t, NULL) !=
      THROTTLE_EWOULDBLOCK)
    return 14; /* admitted: the holder's lease looked lapsed, its slot taken */
  throttle_close(h);
  throttle_config_free(cfg);
  return 0;
}

static int faketime_installed(void) {
  return system("command -v faketime >/dev/null 2>&1") == 0;
}

static void test_clock_faked_process_reads_the_hosts_clock(void **state) {
  struct th_fx *fx = fx_of(state);
  if (!faketime_installed())
    skip();
#ifdef TH_ASAN
  /* faketime's LD_PRELOAD comes before AddressSanitizer's runtime in the
   * re-run child, and that runtime refuses to start so; the plain and
   * valgrind runs keep the test. */
  skip();
#endif
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "held", LONG_MS), 0);
  assert_int_equal(throttle_set_max_parallel(h, "capped", 1), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(
      throttle_try_enter(h, "capped", THROTTLE_CLASS_LIVE, &t, NULL), 0);
  char self[512];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  assert_true(n > 0);
  self[n] = 0;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execlp("faketime", "faketime", "-f", "+0", self, "--faked-child",
           fx->name, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) != 0)
    fail_msg("the faked process: exit %d (faked_child says which check)",
             WEXITSTATUS(st));
  /* the holder still holds its place */
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--faked-child") == 0)
    return faked_child(argv[2]);
  const struct CMUnitTest tests[] = {
      T(test_clock_faked_process_reads_the_hosts_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
