/* SPDX-License-Identifier: MIT */
/*
 * test_redis_scope.c — keys as paths across hosts: the scope contracts of
 * test_scope.c (its test bodies, compiled in here) on the Redis backend,
 * with the test's children on two "hosts" (even children on the test's
 * segment, odd ones on another; the two share nothing but Redis), and a
 * few of their own: a 429 on one table holds every table of the
 * workspace on the other host, and scope records are listed.  A
 * throw-away redis-server per test (redis_helpers.h); skipped without
 * redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

static struct th_redis R;
static throttle_config_t *other_cfg; /* the second host */

static throttle_config_t *host_cfg(struct th_fx *fx, int i) {
  return i % 2 ? other_cfg : fx->cfg;
}

#define TH_SCOPE_CFG(fx, i) host_cfg((fx), (i))
#define TH_SCOPE_NO_MAIN
/* Not every body of test_scope.c runs here (the open-key path's memory,
 * the learned cap's seeding and the crash repair are the segment's). */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "test_scope.c"

static int setup(void **state) {
  if (th_redis_setup(state, &R) != 0)
    return -1;
  struct th_fx *fx = *state;
  other_cfg = throttle_config_new();
  if (other_cfg == NULL ||
      throttle_config_set_segment(other_cfg, th_extra_name(fx)) != 0 ||
      throttle_config_set_backend(other_cfg, R.url) != 0)
    return -1;
  return 0;
}

static int teardown(void **state) {
  int rc = th_teardown(state);
  throttle_config_free(other_cfg);
  other_cfg = NULL;
  th_redis_cleanup(&R);
  unsetenv("THROTTLE_LIVENESS_MS");
  return rc;
}

static throttle_t *open_cfg(throttle_config_t *cfg) {
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  if (rc != 0)
    fail_msg("open: %s: %s", throttle_err_name(rc), throttle_errmsg(h));
  return h;
}

/* A 429 answered on one host's table is the workspace's: the other host
 * waits on every table of it, and on no other workspace. */
static void test_redis_scope_429_holds_every_table_on_other_host(
    void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx), *b = open_cfg(other_cfg);
  throttle_ticket_t *t = NULL;
  assert_int_equal(
      throttle_enter(a, "ws1/orders", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  assert_int_equal(
      throttle_leave(a, t, THROTTLE_OUTCOME_RATE_LIMITED, TH_LONG_MS), 0);
  for (int i = 0; i < NTABLES; i++) {
    assert_true(th_remaining(b, tables[i]) > TH_LONG_MS - 10000);
    assert_int_equal(throttle_wait(b, tables[i], 0), THROTTLE_ETIMEDOUT);
    assert_int_equal(throttle_try_enter(b, tables[i], THROTTLE_CLASS_LIVE,
                                        &t, NULL),
                     THROTTLE_EWOULDBLOCK);
  }
  assert_int_equal(throttle_wait(b, "ws2/orders", 0), 0);
  assert_int_equal(throttle_wait(b, "ws10/orders", 0), 0);
  /* published on the scope, not on the table */
  assert_int_equal(th_field(b, "ws1", THROTTLE_FIELD_PUBLISHES), 1);
  assert_int_equal(th_field(b, "ws1/orders", THROTTLE_FIELD_PUBLISHES), 0);
  /* the clear of the scope opens every table of it */
  assert_int_equal(throttle_clear(b, "ws1"), 0);
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(throttle_wait(b, tables[i], 0), 0);
  throttle_close(b);
}

struct seen {
  int ws1, orders;
  int64_t in_flight, left;
};

static int note(const throttle_info_t *info, void *arg) {
  struct seen *s = arg;
  const char *k = throttle_info_key(info);
  if (strcmp(k, "ws1") == 0) {
    s->ws1 = 1;
    s->in_flight = throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT);
    s->left = throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS);
  } else if (strcmp(k, "ws1/orders") == 0) {
    s->orders = 1;
  }
  return 0;
}

/* A scope's record is listed with the keys: its not-before and the
 * places its pool holds, whichever host holds them. */
static void test_redis_scope_records_are_listed(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx), *b = open_cfg(other_cfg);
  assert_int_equal(throttle_set_max_parallel(a, "ws1", 3), 0);
  throttle_ticket_t *t = NULL, *u = NULL;
  assert_int_equal(
      throttle_enter(a, "ws1/orders", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  assert_int_equal(
      throttle_enter(b, "ws1/items", THROTTLE_CLASS_LIVE, 5000, &u), 0);
  struct seen s = {0};
  assert_int_equal(throttle_foreach(b, note, &s), 0);
  assert_true(s.ws1 && s.orders);
  assert_int_equal(s.in_flight, 2);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(b, u, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_backoff(a, "ws1", TH_LONG_MS), 0);
  memset(&s, 0, sizeof s);
  assert_int_equal(throttle_foreach(b, note, &s), 0);
  assert_int_equal(s.in_flight, 0);
  assert_true(s.left > (int64_t)TH_LONG_MS - 10000);
  throttle_close(b);
}

/* (The parent's handle is left alone: its heartbeat thread may have held
 * the handle's mutex at the fork.) */
static int child_enters_and_dies(void *p) {
  (void)p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(other_cfg, &h) == 0);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, "ws1/orders", THROTTLE_CLASS_LIVE, 5000,
                                &t) == 0);
  raise(SIGKILL);
  return 0;
}

/* A pool's place is held as long as its holder lives (the heartbeat keeps
 * it past the liveness bound), and a holder killed on another host gives
 * it back within that bound. */
static void test_redis_scope_pool_place_lives_with_its_holder(void **state) {
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "ws1", 1), 0);
  throttle_ticket_t *t = NULL, *u = NULL;
  assert_int_equal(
      throttle_enter(a, "ws1/users", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  th_sleep_ms(2500); /* past the liveness bound: the heartbeat kept it */
  assert_int_equal(th_field(a, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(try_in(a, "ws1/items", &u), THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  th_reap_killed(fx, th_spawn(fx, child_enters_and_dies, fx), HANG_GUARD_MS);
  assert_int_equal(th_field(a, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  uint64_t m0 = th_mono_ms();
  assert_int_equal(
      throttle_enter(a, "ws1/items", THROTTLE_CLASS_LIVE, 10000, &u), 0);
  assert_true(th_mono_ms() - m0 < 5000);
  assert_int_equal(th_field(a, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(a, u, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(a, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
}

/* The dead probe's place is reclaimed through its liveness record. */
static void test_redis_scope_dead_probe_is_reclaimed(void **state) {
  setenv("THROTTLE_LIVENESS_MS", "2000", 1);
  test_scope_dead_probe_is_reclaimed(state);
}

#define TR(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_redis_scope: redis-server is not installed (make "
           "deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest tests[] = {
      TR(test_redis_scope_429_holds_every_table_on_other_host),
      TR(test_redis_scope_records_are_listed),
      TR(test_scope_signals_go_where_meant_by_default),
      TR(test_scope_publish_level_is_configurable),
      TR(test_scope_backoff_holds_waits_beneath),
      TR(test_scope_backoff_holds_admissions_beneath),
      TR(test_scope_one_probe_for_the_scope),
      TR(test_scope_probe_refused_again_holds_the_scope),
      TR(test_scope_cold_scope_sends_one_first_request),
      TR(test_scope_cold_scope_refused_holds_its_retry_after),
      TR(test_scope_cold_scope_opens_on_any_answer),
      TR(test_scope_cold_hold_is_bounded),
      TR(test_scope_cold_hold_bounds_every_wait),
      TR(test_scope_cold_rule_only_where_signals_go),
      TR(test_redis_scope_dead_probe_is_reclaimed),
      TR(test_scope_pause_holds_every_key_until_resume),
      TR(test_scope_cancel_reaches_every_key),
      TR(test_scope_clear_wakes_keys_beneath),
      TR(test_scope_commands_reach_keys_without_scope_record),
      TR(test_scope_pool_caps_the_sum),
      TR(test_scope_pool_fifo_across_tables_live_first),
      TR(test_scope_pool_rate_is_a_budget),
      TR(test_redis_scope_pool_place_lives_with_its_holder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
