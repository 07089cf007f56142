/* SPDX-License-Identifier: MIT */
/*
 * test_redis_learn.c — the learned cap on the Redis backend (common.lua
 * learn, the rules of gate_learn.c), with two "hosts": handles on their own
 * segment names that share nothing but Redis, the refusals and raises of
 * one reported by a process of its own.  Mirrors tests/test_learn.c where
 * a rule can be driven from outside: a refusal with k others in flight
 * sets the cap to k (not k / 2), slow start, a raise priced at
 * 20 x R x 2^fails of work (R = 50 ms, so the test runs in seconds),
 * auto:MAX, a fixed cap that keeps what was learned, the same fields as
 * the segment's learner for the same reports, hostile stored values, and
 * a key new to a scope seeded by what its siblings learned.
 * Skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANG_GUARD_MS 30000
#define R_MS 50 /* the Retry-After of every refusal here */
#define OK THROTTLE_OUTCOME_OK
#define LOCKED THROTTLE_OUTCOME_LOCKED

static struct th_redis R;
static char ctl_path[4200];

static int setup(void **state) { return th_redis_setup(state, &R); }

static int teardown(void **state) { return th_redis_teardown(state, &R); }

/* A handle on segment seg; on Redis too unless url is NULL. */
static throttle_t *open_on(const char *seg, const char *url) {
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL || throttle_config_set_segment(cfg, seg) != 0 ||
      (url != NULL && throttle_config_set_backend(cfg, url) != 0))
    return NULL;
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  if (rc != 0) {
    throttle_close(h);
    return NULL;
  }
  return h;
}

static int64_t field(throttle_t *h, const char *key, throttle_field_t f) {
  return th_field(h, key, f);
}

static throttle_ticket_t *in(throttle_t *h, const char *key) {
  return th_enter(h, key, THROTTLE_CLASS_LIVE, 10000);
}

#define out th_leave

/* Slow start from cap 1 to n with one handle: c admissions at once, the
 * last granted (at the cap) reporting first.  Leaves cap n, good n - 1. */
static void slow_start_to(throttle_t *h, const char *key, int n) {
  for (int c = 1; c < n; c++) {
    throttle_ticket_t *t[32];
    for (int i = 0; i < c; i++)
      t[i] = in(h, key);
    for (int i = c - 1; i >= 0; i--)
      out(h, t[i], OK, 0);
  }
}

/* ---- the other host: one admission in a process of its own --------------- */

struct one_arg {
  const char *seg;
  const char *key;
  throttle_outcome_t outcome;
  int hold_ms;
};

static int one_child(void *p) {
  const struct one_arg *o = p;
  throttle_t *h = open_on(o->seg, R.url);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, o->key, THROTTLE_CLASS_LIVE, 10000, &t) ==
                 0);
  if (o->hold_ms > 0)
    th_sleep_ms((unsigned)o->hold_ms);
  TH_CHILD_CHECK(throttle_leave(h, t, o->outcome,
                                o->outcome == LOCKED ? R_MS : 0) == 0);
  throttle_close(h);
  return 0;
}

/* One admission of key on host seg, reported with outcome (a refusal
 * carries Retry-After R_MS), by a process of its own. */
static void on_host(struct th_fx *fx, const char *seg, const char *key,
                    throttle_outcome_t outcome) {
  struct one_arg o = {seg, key, outcome, 0};
  th_reap_ok(fx, th_spawn(fx, one_child, &o), HANG_GUARD_MS);
}

/* throttlectl with the backend on host seg; its output in buf. */
static int ctl(const char *seg, char *buf, size_t len, const char *args) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "THROTTLE_BACKEND='%s' THROTTLE_SEGMENT='%s' '%s' %s 2>&1",
           R.url, seg, ctl_path, args);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, len - 1, f);
  buf[n] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- the rules -------------------------------------------------------- */

/* Slow start: one more per success at the cap, whichever host reports it;
 * one granted below the cap says nothing. */
static void test_redis_learn_slow_start_by_one_across_hosts(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  out(a, in(a, "s"), OK, 0);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP), 2);
  on_host(fx, b, "s", OK); /* granted alone, below the cap of 2 */
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP), 2);
  throttle_ticket_t *t = in(a, "s");
  on_host(fx, b, "s", OK); /* granted second: at the cap */
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP), 3);
  out(a, t, OK, 0);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP_AUTO), 1);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP_GOOD), 2);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP_FAILS), 0);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), 0);
  assert_int_equal(field(a, "s", THROTTLE_FIELD_CAP_LEARNED_AGO_MS), -1);
}

/* A refusal with 3 others in flight sets the cap to 3 (not 4 / 2), keeps
 * R and counts the failed raise; later refusals of the burst only lower
 * it and are not counted again; a refusal with nobody else in flight, and
 * the other outcomes, teach nothing. */
static void test_redis_learn_locked_sets_cap_to_k(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  slow_start_to(a, "k", 4);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP), 4);
  throttle_ticket_t *t[3];
  for (int i = 0; i < 3; i++)
    t[i] = in(a, "k");
  on_host(fx, b, "k", LOCKED); /* the fourth at once: refused */
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_GOOD), 3);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_FAIL), 4);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_FAILS), 1);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_RETRY_AFTER_MS), R_MS);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_WORK_MS), 0);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_NEXT_RAISE_MS),
                   20 * R_MS * 2);
  int64_t ago = field(a, "k", THROTTLE_FIELD_CAP_LEARNED_AGO_MS);
  assert_true(ago >= 0 && ago < 10000);
  /* The same burst, 2 others in flight: lowered, counted once. */
  out(a, t[2], OK, 0);
  on_host(fx, b, "k", LOCKED);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_FAILS), 1);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CAP_FAIL), 4);
  /* Alone: somebody else's lock. */
  out(a, t[1], OK, 0);
  out(a, t[0], OK, 0);
  throttle_info_t *before = NULL, *after = NULL;
  assert_int_equal(throttle_info(a, "k", &before), 0);
  on_host(fx, b, "k", LOCKED);
  on_host(fx, b, "k", THROTTLE_OUTCOME_RATE_LIMITED);
  on_host(fx, b, "k", THROTTLE_OUTCOME_FAILED);
  assert_int_equal(throttle_info(a, "k", &after), 0);
  for (throttle_field_t f = THROTTLE_FIELD_CAP_GOOD;
       f <= THROTTLE_FIELD_CAP_RETRY_AFTER_MS; f++)
    assert_int_equal(throttle_info_get(before, f), throttle_info_get(after, f));
  assert_int_equal(throttle_info_get(after, THROTTLE_FIELD_CAP), 2);
  assert_int_equal(throttle_info_get(after, THROTTLE_FIELD_LOCKED), 3);
  throttle_info_free(before);
  throttle_info_free(after);
}

/* After the refusal that ends slow start, no raise until the work at the
 * cap reaches 40 x R (20 x R, doubled by that failure); the raised cap
 * used in full becomes good, and the next raise is priced at 20 x R. */
static void test_redis_learn_raise_waits_for_work(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  const int64_t need = 20 * R_MS * 2;
  slow_start_to(a, "w", 2);
  throttle_ticket_t *t = in(a, "w");
  on_host(fx, b, "w", LOCKED); /* granted second, refused: k = 1 */
  out(a, t, THROTTLE_OUTCOME_FAILED, 0); /* says nothing: no work */
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_FAIL), 2);
  int64_t work = field(a, "w", THROTTLE_FIELD_CAP_WORK_MS), next;
  assert_int_equal(work, 0);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), need);
  int rounds = 0;
  while (field(a, "w", THROTTLE_FIELD_CAP) == 1) {
    assert_true(++rounds <= 30); /* >= 99 ms of work each: due by 21 */
    t = in(a, "w");
    th_sleep_ms(100);
    out(a, t, OK, 0);
    int64_t w2 = field(a, "w", THROTTLE_FIELD_CAP_WORK_MS);
    assert_true(w2 >= work + 98); /* the hold, on Redis's clock */
    work = w2;
    if (field(a, "w", THROTTLE_FIELD_CAP) == 1) {
      assert_true(work < need);
      next = field(a, "w", THROTTLE_FIELD_CAP_NEXT_RAISE_MS);
      assert_true(next + work >= need - 1 && next + work <= need);
    }
  }
  printf("raised after %d holds of 100 ms, %lld ms of work\n", rounds,
         (long long)work);
  assert_true(work >= need);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_GOOD), 1);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_FAILS), 1);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), 0);
  /* Cap 2 used in full, the second reported by the other host. */
  t = in(a, "w");
  on_host(fx, b, "w", OK);
  out(a, t, OK, 0);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_GOOD), 2);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_FAILS), 0);
  assert_int_equal(field(a, "w", THROTTLE_FIELD_CAP_NEXT_RAISE_MS),
                   20 * R_MS);
}

/* auto:MAX reaches Redis from the API and from throttlectl, on every
 * host: it stops slow start, lowers a cap learned above it at once, and
 * shows; refusals still lower the cap. */
static void test_redis_learn_auto_max_bounds(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  char buf[8192];
  assert_int_equal(throttle_set_max_parallel_auto(a, "m", 3), 0);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_MAX), 3);
  slow_start_to(a, "m", 3);
  throttle_ticket_t *t[3];
  for (int i = 0; i < 3; i++)
    t[i] = in(a, "m");
  for (int i = 2; i >= 0; i--)
    out(a, t[i], OK, 0);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), -1);
  assert_int_equal(ctl(b, buf, sizeof buf, "set m --max-parallel auto:2"), 0);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_MAX), 2);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_GOOD), 2);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_AUTO), 1);
  assert_int_equal(ctl(b, buf, sizeof buf, "show m"), 0);
  if (!th_contains(buf, "cap learner: cap 2, at most 2, slow start"))
    fail_msg("show: %s", buf);
  throttle_ticket_t *one = in(a, "m");
  on_host(fx, b, "m", LOCKED);
  out(a, one, OK, 0);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_MAX), 2);
  assert_int_equal(ctl(b, buf, sizeof buf, "show m"), 0);
  if (!th_contains(buf, "cap learner: cap 1, at most 2: set by a refusal") ||
      !th_contains(buf, "(Retry-After 50ms)") ||
      !th_contains(buf, "next raise after"))
    fail_msg("show: %s", buf);
  /* auto drops the bound */
  assert_int_equal(throttle_set_max_parallel(a, "m", 0), 0);
  assert_int_equal(field(a, "m", THROTTLE_FIELD_CAP_MAX), 0);
  assert_int_equal(throttle_set_max_parallel_auto(a, "m", 33), THROTTLE_EINVAL);
}

/* A fixed cap turns the learner off and keeps what it learned; auto
 * resumes from it. */
static void test_redis_learn_fixed_cap_keeps_learned(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  char buf[8192];
  slow_start_to(a, "f", 3);
  throttle_ticket_t *t[4];
  for (int i = 0; i < 2; i++)
    t[i] = in(a, "f");
  on_host(fx, b, "f", LOCKED);
  out(a, t[1], OK, 0);
  out(a, t[0], OK, 0);
  out(a, in(a, "f"), OK, 0); /* the probe: ends the refusal's episode */
  assert_int_equal(field(a, "f", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(ctl(b, buf, sizeof buf, "set f --max-parallel 5"), 0);
  throttle_info_t *before = NULL, *after = NULL;
  assert_int_equal(throttle_info(a, "f", &before), 0);
  assert_int_equal(throttle_info_get(before, THROTTLE_FIELD_CAP), 5);
  assert_int_equal(throttle_info_get(before, THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(throttle_info_get(before, THROTTLE_FIELD_CAP_GOOD), 2);
  assert_int_equal(throttle_info_get(before, THROTTLE_FIELD_CAP_FAIL), 3);
  assert_int_equal(
      throttle_info_get(before, THROTTLE_FIELD_CAP_NEXT_RAISE_MS), -1);
  assert_int_equal(ctl(b, buf, sizeof buf, "show f"), 0);
  if (!th_contains(buf, "cap learner: off, cap 5 fixed (--max-parallel); "
                        "learned 2 is kept for auto"))
    fail_msg("show: %s", buf);
  /* at the fixed cap: refused, and used in full; nothing learned */
  for (int i = 0; i < 4; i++)
    t[i] = in(a, "f");
  on_host(fx, b, "f", LOCKED);
  for (int i = 0; i < 4; i++)
    out(a, t[i], OK, 0);
  out(a, in(a, "f"), OK, 0); /* the probe */
  for (int i = 0; i < 4; i++)
    t[i] = in(a, "f");
  on_host(fx, b, "f", OK);
  for (int i = 0; i < 4; i++)
    out(a, t[i], OK, 0);
  assert_int_equal(throttle_info(a, "f", &after), 0);
  for (throttle_field_t f = THROTTLE_FIELD_CAP_GOOD;
       f <= THROTTLE_FIELD_CAP_WORK_MS; f++)
    assert_int_equal(throttle_info_get(before, f), throttle_info_get(after, f));
  throttle_info_free(before);
  throttle_info_free(after);
  assert_int_equal(ctl(b, buf, sizeof buf, "set f --max-parallel auto"), 0);
  assert_int_equal(field(a, "f", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "f", THROTTLE_FIELD_CAP_AUTO), 1);
}

/* The same reports on a segment alone and on Redis give the same fields
 * (the times within a scheduling's slack). */
static void same_reports(throttle_t *h) {
  slow_start_to(h, "q", 4);
  throttle_ticket_t *t[4];
  for (int i = 0; i < 4; i++)
    t[i] = in(h, "q");
  out(h, t[3], LOCKED, R_MS); /* 3 others in flight */
  out(h, t[2], LOCKED, 0);    /* 2: lowered, R the default (clamped) */
  out(h, t[1], OK, 0);        /* granted second: at the cap of 2 */
  out(h, t[0], OK, 0);
}

static void test_redis_learn_fields_match_segment(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *shm = open_on(th_extra_name(fx), NULL);
  assert_non_null(shm);
  assert_string_equal(throttle_backend(shm), "shm");
  same_reports(a);
  same_reports(shm);
  static const throttle_field_t exact[] = {
      THROTTLE_FIELD_CAP,       THROTTLE_FIELD_CAP_AUTO,
      THROTTLE_FIELD_CAP_GOOD,  THROTTLE_FIELD_CAP_FAIL,
      THROTTLE_FIELD_CAP_FAILS, THROTTLE_FIELD_CAP_MAX,
      THROTTLE_FIELD_CAP_RETRY_AFTER_MS, THROTTLE_FIELD_LOCKED};
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
    if (field(a, "q", exact[i]) != field(shm, "q", exact[i]))
      fail_msg("%s: redis %lld, segment %lld", throttle_field_name(exact[i]),
               (long long)field(a, "q", exact[i]),
               (long long)field(shm, "q", exact[i]));
  assert_int_equal(field(a, "q", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "q", THROTTLE_FIELD_CAP_FAIL), 4);
  assert_int_equal(field(a, "q", THROTTLE_FIELD_CAP_RETRY_AFTER_MS), 5000);
  static const throttle_field_t near[] = {THROTTLE_FIELD_CAP_WORK_MS,
                                          THROTTLE_FIELD_CAP_NEXT_RAISE_MS,
                                          THROTTLE_FIELD_CAP_LEARNED_AGO_MS};
  for (size_t i = 0; i < sizeof near / sizeof near[0]; i++) {
    int64_t x = field(a, "q", near[i]), y = field(shm, "q", near[i]);
    if (x < 0 || y < 0 || llabs(x - y) > 2000)
      fail_msg("%s: redis %lld, segment %lld", throttle_field_name(near[i]),
               (long long)x, (long long)y);
  }
  /* auto:MAX and a fixed cap, the same on both */
  assert_int_equal(throttle_set_max_parallel_auto(a, "q", 1), 0);
  assert_int_equal(throttle_set_max_parallel_auto(shm, "q", 1), 0);
  for (throttle_field_t f = THROTTLE_FIELD_CAP_GOOD;
       f <= THROTTLE_FIELD_CAP_RETRY_AFTER_MS; f++)
    assert_int_equal(field(a, "q", f), field(shm, "q", f));
  assert_int_equal(field(a, "q", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), -1);
  assert_int_equal(field(shm, "q", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), -1);
  assert_int_equal(throttle_set_max_parallel(a, "q", 7), 0);
  assert_int_equal(throttle_set_max_parallel(shm, "q", 7), 0);
  for (throttle_field_t f = THROTTLE_FIELD_CAP;
       f <= THROTTLE_FIELD_CAP_AUTO; f++)
    assert_int_equal(field(a, "q", f), field(shm, "q", f));
  throttle_close(shm);
}

/* I8: every learned field is bounded where it is read; a hostile value
 * (negative, huge, not a number) neither breaks a call nor lifts the cap,
 * and the price of a raise stays a finite number of ms. */
static void test_redis_learn_hostile_fields_bounded(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  out(a, in(a, "h"), OK, 0);
  const char *args[] = {"HSET",          "thr1:{h}:k:h", "auto_cap",
                        "nan",           "auto_good",    "99",
                        "auto_fail_cap", "1e9",          "auto_fails",
                        "-1",            "auto_max",     "33",
                        "auto_ra_ms",    "inf",          "auto_work_us",
                        "-7",            "auto_learned", "9e18",
                        NULL};
  assert_int_equal(th_redis_cli(&R, 0, args), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_GOOD), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_FAIL), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_FAILS), 10);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_MAX), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_RETRY_AFTER_MS),
                   INT64_C(604800000));
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_WORK_MS), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_LEARNED_AGO_MS), 0);
  /* 20 x 7 days x 2^10: finite, more than 20 x 7 days */
  assert_true(field(a, "h", THROTTLE_FIELD_CAP_NEXT_RAISE_MS) >
              INT64_C(20) * 604800000);
  out(a, in(a, "h"), OK, 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP), 1); /* no raise */
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP_GOOD), 1);
  const char *cap[] = {"HSET", "thr1:{h}:k:h", "auto_cap", "1e300",
                       "fixed_cap", "-inf", NULL};
  assert_int_equal(th_redis_cli(&R, 0, cap), 0);
  assert_int_equal(field(a, "h", THROTTLE_FIELD_CAP), 1);
  out(a, in(a, "h"), OK, 0);
}

/* A key new to a scope starts from what its siblings learned last
 * (gate_learn.c throttle__scope_seed_locked), on any host: the refused cap, R,
 * out of slow start; a key that has learned keeps its own; another
 * scope's key and a copied hostile value start as a new key does. */
static void test_redis_learn_new_key_seeded_by_siblings(void **state) {
  struct th_fx *fx = *state;
  throttle_info_t *info = NULL;
  throttle_t *a = th_open(fx);
  const char *b = th_extra_name(fx);
  out(a, in(a, "ws/c"), OK, 0); /* learning alone: slow start to 2 */
  slow_start_to(a, "ws/a", 4);
  throttle_ticket_t *t[3];
  for (int i = 0; i < 3; i++)
    t[i] = in(a, "ws/a");
  on_host(fx, b, "ws/a", LOCKED);
  for (int i = 0; i < 3; i++)
    out(a, t[i], OK, 0);
  on_host(fx, b, "ws/b", OK); /* new: seeded, then granted below its cap */
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP_GOOD), 3);
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP_FAIL), 4);
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP_FAILS), 0);
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP_RETRY_AFTER_MS), R_MS);
  int64_t ago = field(a, "ws/b", THROTTLE_FIELD_CAP_LEARNED_AGO_MS);
  assert_true(ago >= 0 && ago < 10000); /* not slow start */
  assert_int_equal(field(a, "ws/b", THROTTLE_FIELD_CAP_NEXT_RAISE_MS),
                   20 * R_MS);
  assert_int_equal(field(a, "ws/c", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "ws/c", THROTTLE_FIELD_CAP_LEARNED_AGO_MS), -1);
  on_host(fx, b, "other/b", OK);
  assert_int_equal(field(a, "other/b", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "other/b", THROTTLE_FIELD_CAP_LEARNED_AGO_MS), -1);
  /* what the parent scope's hash holds for its keys is not the scope's
   * own learned cap (the scope is a record of its own: its cold start) */
  int rc = throttle_info(a, "ws", &info);
  assert_true(rc == 0 || rc == THROTTLE_ENOKEY);
  if (rc == 0) {
    assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_CAP_GOOD), 0);
    assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_CAP_FAIL), 0);
    throttle_info_free(info);
  }
  char buf[8192];
  assert_int_equal(ctl(b, buf, sizeof buf, "ls"), 0);
  if (!th_contains(buf, "ws/a"))
    fail_msg("ls: %s", buf);
  const char *args[] = {"HSET",          "thr1:{ws}:k:ws", "seed_cap",
                        "1e9",           "seed_good",      "-3",
                        "seed_fail_cap", "nan",            "seed_ra_ms",
                        "inf",           NULL};
  assert_int_equal(th_redis_cli(&R, 0, args), 0);
  on_host(fx, b, "ws/d", OK);
  assert_int_equal(field(a, "ws/d", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(a, "ws/d", THROTTLE_FIELD_CAP_GOOD), 1);
  assert_int_equal(field(a, "ws/d", THROTTLE_FIELD_CAP_FAIL), 0);
  assert_int_equal(field(a, "ws/d", THROTTLE_FIELD_CAP_RETRY_AFTER_MS),
                   INT64_C(604800000));
}

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_redis_learn: redis-server is not installed (make deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", argv[0]);
  snprintf(ctl_path, sizeof ctl_path, "%s/../throttlectl", dirname(buf));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_redis_learn_slow_start_by_one_across_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_locked_sets_cap_to_k,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_raise_waits_for_work,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_auto_max_bounds, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_fixed_cap_keeps_learned,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_fields_match_segment,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_learn_hostile_fields_bounded,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_learn_new_key_seeded_by_siblings, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
