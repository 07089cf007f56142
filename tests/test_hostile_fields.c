/* SPDX-License-Identifier: MIT */
/*
 * test_hostile_fields.c — I8 for time: every time-like field of the
 * segment, damaged one at a time, delays its key by at most the segment's
 * maximum delay (or a slot by the longest lease), never forever; and a
 * damaged value never shortens a live holder's lease.
 *
 * Each case forges one field of a fresh key's record (or the header) in
 * place, then asks the library to admit.  The segment's maximum delay is
 * 500 ms; the timeouts are a hang guard far above it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_DELAY_MS 500u
#define GUARD_MS 5000u

static throttle_t *open_small_max(struct th_fx *fx) {
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, MAX_DELAY_MS), 0);
  return th_open(fx);
}

/* Admitted within the hang guard (the bound is the 500 ms maximum). */
static void admits(throttle_t *h, const char *key) {
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, key, THROTTLE_CLASS_LIVE, GUARD_MS, &t);
  if (rc != 0)
    fail_msg("%s: %s: %s", key, throttle_err_name(rc), throttle_errmsg(h));
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* A holding slot forged into key's record: this very process (alive, so
 * only its lease can end it), the given grant time and lease. */
static struct throttle__slot *forge_holder(throttle_t *h, const char *key,
                                           uint64_t since_ns,
                                           uint32_t lease_ms) {
  assert_int_equal(throttle_set_max_parallel(h, key, 1), 0);
  struct throttle__rec *r = th_rec(h, key);
  struct throttle__slot *s = &r->slot[5];
  assert_int_equal(throttle__lock(h), 0);
  s->state = THROTTLE__SLOT_HOLDING;
  s->cls = THROTTLE_CLASS_LIVE;
  s->pid = (uint32_t)getpid();
  s->ticket = UINT64_C(1) << 40;
  s->since_ns = since_ns;
  /* the lease's own clock, damaged alike */
  s->since_mono_ns = since_ns == UINT64_MAX ? UINT64_MAX : throttle__mono_ns();
  s->lease_ms = lease_ms;
  throttle__unlock(h);
  return s;
}

/* The GCRA state far in the future. */
static void test_hostile_fields_rate_tat(void **state) {
  throttle_t *h = open_small_max(*state);
  assert_int_equal(throttle_set_rate(h, "tat", 1, 1000), 0);
  struct throttle__rec *r = th_rec(h, "tat");
  r->rate_tat_ns = UINT64_MAX - 1;
  admits(h, "tat");
}

/* A rate period far beyond any setting: the first admission pushes the
 * state one such period ahead, the second must still come. */
static void test_hostile_fields_rate_period(void **state) {
  throttle_t *h = open_small_max(*state);
  assert_int_equal(throttle_set_rate(h, "period", 1, 1000), 0);
  struct throttle__rec *r = th_rec(h, "period");
  r->rate_period_ns = UINT64_MAX;
  admits(h, "period");
  admits(h, "period");
}

/* A grant time in the future (on both clocks): the lease would never
 * lapse. */
static void test_hostile_fields_slot_since(void **state) {
  throttle_t *h = open_small_max(*state);
  forge_holder(h, "since", UINT64_MAX, 100);
  admits(h, "since");
}

/* A lease of 0 must not free a live holder's slot at once (the cap would
 * then admit a second caller); it is read as the longest lease. */
static void test_hostile_fields_slot_lease_zero(void **state) {
  throttle_t *h = open_small_max(*state);
  struct throttle__slot *s = forge_holder(h, "lease", th_now_ns(), 0);
  for (int i = 0; i < 3; i++) {
    throttle_ticket_t *t = NULL;
    assert_int_equal(
        throttle_try_enter(h, "lease", THROTTLE_CLASS_LIVE, &t, NULL),
        THROTTLE_EWOULDBLOCK);
    th_sleep_ms(60); /* past the reap interval */
  }
  assert_int_equal(th_field(h, "lease", THROTTLE_FIELD_RECLAIMS), 0);
  assert_true(s->lease_ms > 0);
}

/* The header's maximum delay: 0 or beyond seven days reads as the
 * default, never as "no bound" or "no delay". */
static void test_hostile_fields_header_max_delay(void **state) {
  throttle_t *h = open_small_max(*state);
  const uint64_t bad[] = {0, 1, UINT64_MAX};
  for (size_t i = 0; i < 3; i++) {
    atomic_store(&h->hdr->max_delay_ns, bad[i]);
    uint64_t ms = 0;
    assert_int_equal(throttle_segment_max_delay(h, &ms), 0);
    assert_int_equal(ms, 900000);
  }
  assert_int_equal(throttle_backoff(h, "far", UINT64_MAX), 0);
  assert_true(th_remaining(h, "far") <= 900000);
}

/* A not-before beyond the maximum, damaged after it was published. */
static void test_hostile_fields_not_before(void **state) {
  throttle_t *h = open_small_max(*state);
  assert_int_equal(throttle_backoff(h, "nb", 100), 0);
  atomic_store(&((struct throttle__rec *)th_rec(h, "nb"))->not_before,
               UINT64_MAX - 1);
  admits(h, "nb");
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, th_setup, th_teardown)
      T(test_hostile_fields_rate_tat),
      T(test_hostile_fields_rate_period),
      T(test_hostile_fields_slot_since),
      T(test_hostile_fields_slot_lease_zero),
      T(test_hostile_fields_header_max_delay),
      T(test_hostile_fields_not_before),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
