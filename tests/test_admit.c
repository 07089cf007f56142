/* SPDX-License-Identifier: MIT */
/*
 * test_admit.c — what the uncontended admission remembers between calls
 * (gate_enter.c): where this thread last found a key, that a key's scopes are
 * quiet (scope.c; test_scope.c changes them behind it too), the lease's
 * CLOCK_MONOTONIC start derived from the throttle clock, and the coarse
 * clock a leave stamps a key's last use with (clock.c).  Each memory is
 * only a hint; these tests make it wrong and check that the answer is
 * still right.  The timings of the path itself are bench/bench_admit.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* A caller that reuses one buffer for its keys: the record this thread
 * found for the buffer's previous key must not be taken for the new one
 * (it would count the admission on the wrong key, and its cap). */
static void test_admit_reused_key_buffer(void **state) {
  throttle_t *h = th_open(*state);
  char buf[32];
  throttle_ticket_t *t, *held;
  assert_int_equal(throttle_set_max_parallel(h, "hotdata:ws1/orders", 1), 0);
  snprintf(buf, sizeof buf, "%s", "hotdata:ws1/orders");
  /* the workspace's first answer, so that "held" is no cold scope's first
   * request, which would hold the other key (scope.c) */
  assert_int_equal(throttle_enter(h, buf, THROTTLE_CLASS_LIVE, 1000, &held),
                   0);
  assert_int_equal(throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(h, buf, THROTTLE_CLASS_LIVE, 1000, &held),
                   0);
  /* the same buffer, another key, which has no record yet */
  snprintf(buf, sizeof buf, "%s", "hotdata:ws1/items");
  assert_int_equal(throttle_try_enter(h, buf, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "hotdata:ws1/items", THROTTLE_FIELD_ADMITTED),
                   1);
  assert_int_equal(th_field(h, "hotdata:ws1/orders", THROTTLE_FIELD_ADMITTED),
                   2);
  assert_int_equal(throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0), 0);
}

/* A key admitted while its scope had no record, then the scope named (a
 * back-off published on it): the key's next admission must see the scope,
 * and so must the leave of an admission granted before it was named. */
static void test_admit_scope_named_after_admission(void **state) {
  throttle_t *h = th_open(*state);
  const char *key = "hotdata:ws1/orders";
  throttle_ticket_t *t, *early;
  assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, &early),
                   0);
  assert_int_equal(throttle_backoff(h, "hotdata:ws1", 60000), 0);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  /* the scope turns into a pool; the early admission, granted with no
   * place in it, is counted by the new cap (its place given), and its
   * leave frees that place only, not another admission's */
  assert_int_equal(throttle_clear(h, "hotdata:ws1"), 0);
  assert_int_equal(throttle_set_max_parallel(h, "hotdata:ws1", 1), 0);
  throttle_ticket_t *pooled;
  assert_int_equal(throttle_try_enter(h, "hotdata:ws1/items",
                                      THROTTLE_CLASS_LIVE, &pooled, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, early, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(h, "hotdata:ws1/items", THROTTLE_CLASS_LIVE,
                                  1000, &pooled),
                   0);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK); /* the pool's one place is taken */
  assert_int_equal(throttle_leave(h, pooled, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* The lease's start on CLOCK_MONOTONIC, derived from a throttle clock
 * reading: never before the monotonic reading that preceded it (a lease
 * that started early would lapse early, and its slot be taken from a live
 * holder), whether the difference of the clocks is measured by the call
 * or remembered from an earlier one. */
static void test_admit_lease_start_never_early(void **state) {
  (void)state;
  for (int i = 0; i < 1000; i++) {
    uint64_t before = throttle__mono_ns();
    uint64_t now = throttle__now_ns();
    uint64_t start = throttle__mono_at(now);
    assert_true(start >= before);
  }
}

/* The coarse throttle clock: never ahead of a precise reading that
 * follows it (a stamp from the future would make a key look used later
 * than it was), and behind one that precedes it by at most a few ticks,
 * whether this thread measured the difference of the clocks just now or
 * never (then it reads the precise clock). */
static void test_admit_coarse_clock_never_ahead(void **state) {
  (void)state;
  for (int i = 0; i < 1000; i++) {
    if (i % 100 == 0) /* measure the difference again (a grant does) */
      (void)throttle__mono_at(throttle__now_ns());
    uint64_t before = throttle__now_ns();
    uint64_t coarse = throttle__now_coarse_ns();
    uint64_t after = throttle__now_ns();
    assert_true(coarse <= after);
    assert_true(coarse + 50 * UINT64_C(1000000) >= before);
  }
}

/* A leave that decides nothing by the time stamps the key's last use with
 * the coarse clock: the key still reads as just used, not as idle since
 * its grant or since never. */
static void test_admit_leave_stamps_last_use(void **state) {
  throttle_t *h = th_open(*state);
  throttle_ticket_t *t;
  const char *key = "hotdata:ws1/orders";
  for (int i = 0; i < 3; i++) {
    assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, &t), 0);
    assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  }
  assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, &t), 0);
  th_sleep_ms(300);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  int64_t idle = th_field(h, key, THROTTLE_FIELD_IDLE_MS);
  printf("idle after a 300 ms hold: %lld ms\n", (long long)idle);
  assert_true(idle >= 0 && idle < 200);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_admit_reused_key_buffer),
      T(test_admit_scope_named_after_admission),
      T(test_admit_lease_start_never_early),
      T(test_admit_coarse_clock_never_ahead),
      T(test_admit_leave_stamps_last_use),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
