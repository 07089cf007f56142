/* SPDX-License-Identifier: MIT */
/*
 * test_learn.c — the learned cap's rules (gate_learn.c), one at a time, on
 * a record in memory: outcomes are fed to throttle__learn_locked() with
 * the hold times and Retry-After they would carry, so every rule is
 * checked by count and value, with no clock and no timing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "internal.h"

#include <stdio.h>
#include <string.h>

#define MS THROTTLE__NS_PER_MS
#define NOW (UINT64_C(1000000) * MS) /* a throttle clock reading */

static struct throttle__rec *fresh(void) {
  static struct throttle__rec r;
  memset(&r, 0, sizeof r);
  r.auto_cap = 1;
  return &r;
}

static void feed_others(struct throttle__rec *r, throttle_outcome_t o,
                        uint32_t concurrent, uint32_t others, uint64_t hold_ms,
                        uint64_t ra_ms) {
  struct throttle__learn_in in = {o,     concurrent, others, hold_ms * MS,
                                  ra_ms, 900000,     NOW};
  throttle__learn_locked(r, &in);
}

static void feed(struct throttle__rec *r, throttle_outcome_t o,
                 uint32_t concurrent, uint64_t hold_ms, uint64_t ra_ms) {
  feed_others(r, o, concurrent, 0, hold_ms, ra_ms);
}

/* OKs granted at the cap, hold_ms each, until the cap moves (or n). */
static int oks_until_raise(struct throttle__rec *r, uint64_t hold_ms, int n) {
  uint32_t cap = r->auto_cap;
  for (int i = 1; i <= n; i++) {
    feed(r, THROTTLE_OUTCOME_OK, r->auto_cap, hold_ms, 0);
    if (r->auto_cap != cap)
      return i;
  }
  return -1;
}

/* Slow start: one more per success at the cap, none below it. */
static void test_learn_slow_start_by_one_at_cap(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0);
  assert_int_equal(r->auto_cap, 2);
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0); /* below the cap: says nothing */
  assert_int_equal(r->auto_cap, 2);
  feed(r, THROTTLE_OUTCOME_OK, 2, 150, 0);
  assert_int_equal(r->auto_cap, 3);
  assert_int_equal(r->auto_good, 2);
  assert_int_equal(throttle__learn_next_raise_ns(r), 0);
}

/* LOCKED with k in flight sets the cap to k, not k / 2, and counts the
 * failed raise with its Retry-After. */
static void test_learn_locked_sets_cap_to_k(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  for (uint32_t c = 1; c <= 4; c++)
    feed(r, THROTTLE_OUTCOME_OK, c, 150, 0);
  assert_int_equal(r->auto_cap, 5);
  feed(r, THROTTLE_OUTCOME_LOCKED, 5, 1, 1000); /* 4 others in flight */
  assert_int_equal(r->auto_cap, 4);
  assert_int_equal(r->auto_good, 4);
  assert_int_equal(r->auto_fail_cap, 5);
  assert_int_equal(r->auto_fails, 1);
  assert_int_equal(r->auto_ra_ms, 1000);
  assert_int_equal(r->auto_learned_ns, NOW);
  /* The same burst: counted once, may only lower the cap. */
  feed(r, THROTTLE_OUTCOME_LOCKED, 5, 1, 1000);
  assert_int_equal(r->auto_fails, 1);
  assert_int_equal(r->auto_cap, 4);
  feed(r, THROTTLE_OUTCOME_LOCKED, 3, 1, 1000);
  assert_int_equal(r->auto_cap, 2);
  assert_int_equal(r->auto_fails, 1);
}

/* Refused, though granted first: the one granted after it reached the
 * server first (it is still in flight), so the server admits 1. */
static void test_learn_locked_counts_later_grants_in_flight(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0);
  assert_int_equal(r->auto_cap, 2);
  feed_others(r, THROTTLE_OUTCOME_LOCKED, 1, 1, 1, 1000);
  assert_int_equal(r->auto_cap, 1);
  assert_int_equal(r->auto_fails, 1);
  assert_int_equal(r->auto_fail_cap, 2);
}

/* A refusal with nobody of ours in flight is somebody else's lock. */
static void test_learn_locked_alone_learns_nothing(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0);
  struct throttle__rec before = *r;
  feed(r, THROTTLE_OUTCOME_LOCKED, 1, 1, 5000);
  feed(r, THROTTLE_OUTCOME_RATE_LIMITED, 2, 1, 5000);
  feed(r, THROTTLE_OUTCOME_UNAVAILABLE, 2, 1, 5000);
  feed(r, THROTTLE_OUTCOME_FAILED, 2, 1, 0);
  assert_memory_equal(&before, r, sizeof before);
}

/* After the refusal that ends slow start, the next raise waits 40 x R of
 * work at the cap (20 x R, doubled by that failure); a failed raise
 * doubles it again; a raise used in full resets the doubling. */
static void test_learn_raise_priced_by_retry_after(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  feed(r, THROTTLE_OUTCOME_OK, 1, 200, 0);
  feed(r, THROTTLE_OUTCOME_LOCKED, 2, 1, 1000); /* serialised, R = 1 s */
  assert_int_equal(r->auto_cap, 1);
  assert_int_equal(throttle__learn_next_raise_ns(r), 40000 * MS);
  /* 200 ms holds at cap 1: 40 s of work is 200 of them. */
  assert_int_equal(oks_until_raise(r, 200, 1000), 200);
  assert_int_equal(r->auto_cap, 2);
  feed(r, THROTTLE_OUTCOME_LOCKED, 2, 1, 1000); /* refused again */
  assert_int_equal(r->auto_cap, 1);
  assert_int_equal(r->auto_fails, 2);
  assert_int_equal(oks_until_raise(r, 200, 1000), 400);
  /* With R = 5 s the same learner waits five times longer. */
  struct throttle__rec *r5 = fresh();
  feed(r5, THROTTLE_OUTCOME_OK, 1, 200, 0);
  feed(r5, THROTTLE_OUTCOME_LOCKED, 2, 1, 5000);
  assert_int_equal(oks_until_raise(r5, 200, 5000), 1000);
  /* A raise used in full: good, and the doubling starts over. */
  feed(r5, THROTTLE_OUTCOME_OK, 2, 200, 0);
  assert_int_equal(r5->auto_good, 2);
  assert_int_equal(r5->auto_fails, 0);
  assert_int_equal(throttle__learn_next_raise_ns(r5), 100000 * MS);
}

/* A fixed cap turns the learner off and keeps what it learned; auto:MAX
 * bounds slow start and raises. */
static void test_learn_fixed_and_bound(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0);
  feed(r, THROTTLE_OUTCOME_OK, 2, 150, 0);
  r->fixed_cap = 8;
  feed(r, THROTTLE_OUTCOME_OK, 8, 150, 0);
  feed(r, THROTTLE_OUTCOME_LOCKED, 8, 1, 1000);
  assert_int_equal(r->auto_cap, 3);
  assert_int_equal(throttle__cap_of(r), 8);
  assert_true(throttle__learn_next_raise_ns(r) == UINT64_MAX);
  r->fixed_cap = 0;
  r->auto_max = 4;
  for (int i = 0; i < 20; i++)
    feed(r, THROTTLE_OUTCOME_OK, r->auto_cap, 150, 0);
  assert_int_equal(r->auto_cap, 4);
  assert_true(throttle__learn_next_raise_ns(r) == UINT64_MAX);
  r->auto_max = 2; /* lowered: the cap follows at once */
  assert_int_equal(throttle__cap_of(r), 2);
  feed(r, THROTTLE_OUTCOME_OK, 2, 150, 0);
  assert_int_equal(r->auto_cap, 2);
}

/* I8: every learned field from shared memory is bounded before use; a
 * hostile Retry-After cannot overflow the price of a raise. */
static void test_learn_hostile_fields_bounded(void **state) {
  (void)state;
  struct throttle__rec *r = fresh();
  r->auto_cap = 0xffffffffu;
  r->auto_good = 99;
  r->auto_fail_cap = 1000;
  r->auto_fails = 77;
  r->auto_max = 33;
  r->auto_ra_ms = 0xffffffffu;
  r->auto_work_ns = UINT64_MAX - 1;
  r->auto_learned_ns = NOW + 1;
  throttle__learn_bound_locked(r, NOW);
  assert_int_equal(r->auto_cap, 1);
  assert_int_equal(r->auto_good, 0);
  assert_int_equal(r->auto_fail_cap, 0);
  assert_int_equal(r->auto_fails, THROTTLE__MAX_AUTO_FAILS);
  assert_int_equal(r->auto_max, 0);
  assert_true(r->auto_ra_ms <= THROTTLE__MAX_MAX_DELAY_MS);
  assert_int_equal(r->auto_learned_ns, NOW);
  /* need = 20 x 7 days x 2^10 fits: no wrap to a tiny price. */
  r->auto_work_ns = 0;
  assert_true(throttle__learn_next_raise_ns(r) >
              UINT64_C(20) * THROTTLE__MAX_MAX_DELAY_MS * MS);
  feed(r, THROTTLE_OUTCOME_OK, 1, 150, 0);
  assert_int_equal(r->auto_cap, 1); /* a used cap 1 is not a raise */
  assert_int_equal(r->auto_good, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_learn_slow_start_by_one_at_cap),
      cmocka_unit_test(test_learn_locked_sets_cap_to_k),
      cmocka_unit_test(test_learn_locked_counts_later_grants_in_flight),
      cmocka_unit_test(test_learn_locked_alone_learns_nothing),
      cmocka_unit_test(test_learn_raise_priced_by_retry_after),
      cmocka_unit_test(test_learn_fixed_and_bound),
      cmocka_unit_test(test_learn_hostile_fields_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
