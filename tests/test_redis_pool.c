/* SPDX-License-Identifier: MIT */
/*
 * test_redis_pool.c — a pool's turn across hosts: the bodies of
 * test_pool.c (compiled in here) on the Redis backend, where the pool's
 * rules are mirrored in the scripts (libthrottle/redis/common.lua).  The
 * body that forges a segment's slot is the segment's alone.  A throw-away
 * redis-server per test (redis_helpers.h); skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

static struct th_redis R;

#define TH_POOL_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#include "test_pool.c"

/* A dead waiter is told by its liveness lapsing (no /proc across hosts):
 * 2 s here, so that one killed is judged well within a waiter's wait. */
static int setup(void **state) {
  if (setenv("THROTTLE_LIVENESS_MS", "2000", 1) != 0)
    return -1;
  return th_redis_setup(state, &R);
}

static int teardown(void **state) {
  int rc = th_teardown(state);
  th_redis_cleanup(&R);
  unsetenv("THROTTLE_LIVENESS_MS");
  return rc;
}

#define TR(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_redis_pool: redis-server is not installed (make "
           "deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest tests[] = {
      TR(test_pool_dead_waiter_of_a_sibling_is_skipped),
      TR(test_pool_paused_subscope_holds_no_turn),
      TR(test_pool_backed_off_subscope_holds_no_turn),
      TR(test_pool_backed_off_key_holds_no_turn),
      TR(test_pool_full_nested_pool_holds_no_turn),
      TR(test_pool_probe_out_on_subscope_holds_no_turn),
      TR(test_pool_new_cap_counts_what_is_in_flight),
      TR(test_pool_new_cap_counts_other_processes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
