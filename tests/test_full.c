/* SPDX-License-Identifier: MIT */
/*
 * test_full.c — a full table: a back-off that cannot be stored where it
 * belongs (its scope has no record and no room for one) is stored on the
 * key, and one stored nowhere is never reported as published; a record in
 * a lock episode (its back-off passed, no probe answered yet) or with a
 * probe out is not idle, so no insert evicts it, until one maximum delay
 * of the segment has passed with nobody coming back for it.  Real
 * processes ask after the facts (fork).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HANG_GUARD_MS 15000
#define LONG_MS 10000
#define CAP 8

static struct th_fx *fx_of(void **state) { return *state; }

static throttle_t *open_cap(struct th_fx *fx, uint32_t keys) {
  assert_int_equal(throttle_config_set_capacity(fx->cfg, keys), 0);
  return th_open(fx);
}

static uint32_t used(throttle_t *h) {
  uint32_t n = 0;
  assert_int_equal(throttle_stats(h, NULL, &n, NULL, NULL), 0);
  return n;
}

/* Fill the table with keys backed off for LONG_MS (none evictable). */
static void fill(throttle_t *h) {
  char key[32];
  for (int i = 0; used(h) < CAP; i++) {
    snprintf(key, sizeof key, "full-%d", i);
    assert_int_equal(throttle_backoff(h, key, LONG_MS), 0);
  }
}

/* Another process asks for key: held (EWOULDBLOCK, with a hint of 0 for
 * a probe's answer, at most the cold hold for a scope's probe that holds
 * its keys no longer, or more than half of LONG_MS for a back-off; with
 * held 2, by a back-off, so that a wait of 100 ms ends ETIMEDOUT too), or
 * admitted. */
struct ask {
  struct th_fx *fx;
  const char *key;
  int held;
};

static int child_asks(void *p) {
  const struct ask *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  int rc = throttle_try_enter(h, a->key, THROTTLE_CLASS_LIVE, &t, &wait_ms);
  if (a->held) {
    TH_CHILD_CHECK(rc == THROTTLE_EWOULDBLOCK);
    TH_CHILD_CHECK(wait_ms <= THROTTLE__COLD_HOLD_NS / THROTTLE__NS_PER_MS ||
                   wait_ms > LONG_MS / 2);
    TH_CHILD_CHECK(a->held == 1 || (wait_ms > LONG_MS / 2 &&
                                    throttle_enter(h, a->key,
                                                   THROTTLE_CLASS_LIVE, 100,
                                                   &t) == THROTTLE_ETIMEDOUT &&
                                    t == NULL));
  } else {
    TH_CHILD_CHECK(rc == 0);
    TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  }
  throttle_close(h);
  return 0;
}

static void ask_elsewhere(struct th_fx *fx, const char *key, int held) {
  struct ask a = {fx, key, held};
  th_reap_ok(fx, th_spawn(fx, child_asks, &a), HANG_GUARD_MS);
}

/* A 429 goes to the root scope; with the table full and the scope without
 * a record, it is kept on the key (it was dropped, and leave said 0). */
static void test_full_scope_backoff_kept_on_the_key(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = open_cap(fx, CAP);
  const char *key = "ws/a";
  assert_int_equal(throttle_set_max_parallel(h, key, 4), 0); /* kept */
  fill(h);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_RATE_LIMITED, LONG_MS),
                   0);
  assert_true(th_remaining(h, key) > LONG_MS / 2);
  ask_elsewhere(fx, key, 1);
}

/* The same through throttle_backoff() on the scope: refused, not lost. */
static void test_full_backoff_on_a_full_table_is_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = open_cap(fx, CAP);
  fill(h);
  assert_int_equal(throttle_backoff(h, "ws", LONG_MS), THROTTLE_EFULL);
  assert_non_null(strstr(throttle_errmsg(h), "back-off"));
}

/* Wait until key's own back-off has passed (a condition, polled). */
static void until_passed(throttle_t *h, const char *key) {
  uint64_t m0 = th_mono_ms();
  while (th_remaining(h, key) > 0) {
    assert_true(th_mono_ms() - m0 < HANG_GUARD_MS);
    th_sleep_ms(5);
  }
}

/* A scope whose back-off passed, no probe yet: a full table does not
 * evict it, so one admission beneath goes as its probe and the others
 * wait for its answer (they all went). */
static void test_full_scope_in_episode_not_evicted(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = open_cap(fx, CAP);
  assert_int_equal(throttle_set_max_parallel(h, "ws/a", 4), 0);
  assert_int_equal(throttle_backoff(h, "ws", 50), 0);
  until_passed(h, "ws");
  fill(h);
  /* one more key: nothing is evictable (the scope was) */
  int more = throttle_backoff(h, "one-more", LONG_MS);
  throttle_ticket_t *t = NULL;
  assert_int_equal(
      throttle_try_enter(h, "ws/a", THROTTLE_CLASS_LIVE, &t, NULL), 0);
  for (int i = 0; i < 3; i++)
    ask_elsewhere(fx, "ws/a", 1); /* the scope's probe is out */
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  ask_elsewhere(fx, "ws/a", 0);
  assert_int_equal(more, THROTTLE_EFULL);
}

/* The same for a key: its episode's record stays, and the next admission
 * is its probe. */
static void test_full_key_in_episode_not_evicted(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = open_cap(fx, CAP);
  assert_int_equal(throttle_backoff(h, "k", 50), 0);
  until_passed(h, "k");
  fill(h);
  int more = throttle_backoff(h, "one-more", LONG_MS);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, "k", THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  int probe = throttle_ticket_is_probe(t);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_true(probe);
  assert_int_equal(more, THROTTLE_EFULL);
}

/* Nobody comes back for an episode for one maximum delay of the segment
 * after its back-off passed: then its record may go, so a table does not
 * fill up with episodes that nobody ends. */
static void test_full_forgotten_episode_is_evicted(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 300), 0);
  throttle_t *h = open_cap(fx, CAP);
  assert_int_equal(throttle_backoff(h, "k", 50), 0);
  char key[32];
  for (int i = 0; used(h) < CAP; i++) {
    snprintf(key, sizeof key, "full-%d", i);
    assert_int_equal(throttle_backoff(h, key, 300), 0);
  }
  uint64_t m0 = th_mono_ms();
  int rc;
  while ((rc = throttle_backoff(h, "one-more", 300)) == THROTTLE_EFULL) {
    assert_true(th_mono_ms() - m0 < HANG_GUARD_MS);
    th_sleep_ms(20);
  }
  assert_int_equal(rc, 0);
}

/* A key that finds no room (EFULL: the caller fails open and sends) still
 * honours the back-off of a scope above it that has a record: a 429 on
 * the workspace holds a table never seen before, full table or not; and
 * a wait bounded below that back-off ends ETIMEDOUT, not EFULL. */
static void test_full_no_room_honours_scopes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = open_cap(fx, CAP);
  assert_int_equal(throttle_backoff(h, "ws", LONG_MS), 0);
  fill(h);
  assert_int_equal(throttle_backoff(h, "ws/never-seen", 1), THROTTLE_EFULL);
  ask_elsewhere(fx, "ws/never-seen", 2);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_full_scope_backoff_kept_on_the_key),
      T(test_full_backoff_on_a_full_table_is_refused),
      T(test_full_scope_in_episode_not_evicted),
      T(test_full_key_in_episode_not_evicted),
      T(test_full_forgotten_episode_is_evicted),
      T(test_full_no_room_honours_scopes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
