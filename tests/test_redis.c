/* SPDX-License-Identifier: MIT */
/*
 * test_redis.c — the contracts across hosts on the Redis backend, with
 * real processes and a throw-away redis-server per test (redis_helpers.h).
 * A "host" is a handle on its own segment name: two hosts share nothing
 * but Redis, so anything one sees of the other came through Redis.
 *
 * Covered: the switch (a bad URL or a missing module is an error at open
 * and the handle works on its segment), back-off across hosts (I1), caps
 * (I5) and one probe per episode (I3) with processes of two hosts, fencing
 * of a lapsed admission, a kill -9'ed holder reclaimed through its
 * liveness record, cancel, the fall back to the segment when Redis dies
 * and the return when it is back, and a stalled Redis (DEBUG SLEEP) that
 * blocks no call beyond its timeout.  Skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANG_GUARD_MS 30000

static struct th_redis R;

static int setup(void **state) { return th_redis_setup(state, &R); }
static int teardown(void **state) { return th_redis_teardown(state, &R); }

/* A second host: its own segment, the same Redis. */
#define other_host(fx) th_redis_other_host(fx, R.url)

#define field th_field

/* Shared between a test and its children. */
struct shared {
  _Atomic int in_flight;
  _Atomic int max_in_flight;
  _Atomic int probe_holding;
  _Atomic int admitted_during_probe;
  _Atomic int probes;
  _Atomic int admitted;
};

static struct shared *shared_new(void) {
  struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(s != MAP_FAILED);
  memset(s, 0, sizeof *s);
  return s;
}

/* ---- the switch ---------------------------------------------------------- */

static void test_redis_open_bad_url_works_on_segment(void **state) {
  struct th_fx *fx = *state;
  assert_int_equal(throttle_config_set_backend(fx->cfg, "redis://host:99999"),
                   0);
  int rc = throttle_open(fx->cfg, &fx->h);
  assert_int_equal(rc, THROTTLE_EINVAL);
  assert_non_null(fx->h);
  assert_true(th_contains(throttle_errmsg(fx->h), "THROTTLE_BACKEND"));
  assert_int_equal(throttle_backoff(fx->h, "t", TH_LONG_MS), 0);
  assert_true(th_remaining(fx->h, "t") > 0);
}

static void test_redis_open_missing_module_is_ebackend(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_BACKEND_MODULE", "/nonexistent/libthrottle-redis.so.1", 1);
  int rc = throttle_open(fx->cfg, &fx->h);
  assert_int_equal(rc, THROTTLE_EBACKEND);
  assert_non_null(fx->h);
  assert_true(th_contains(throttle_errmsg(fx->h), "libthrottle-redis.so.1"));
  assert_int_equal(throttle_backoff(fx->h, "t", TH_LONG_MS), 0);
  assert_true(th_remaining(fx->h, "t") > 0);
}

static void test_redis_backend_named_password_masked(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_string_equal(throttle_backend(a), R.url);
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, th_extra_name(fx)), 0);
  assert_int_equal(
      throttle_config_set_backend(cfg, "redis://:s3cret@127.0.0.1:1/2"), 0);
  throttle_t *b = NULL;
  assert_int_equal(throttle_open(cfg, &b), 0);
  throttle_config_free(cfg);
  assert_string_equal(throttle_backend(b), "redis://:***@127.0.0.1:1/2");
  throttle_close(b);
  /* a holder's host is shown */
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(a, "k", &info), 0);
  char me[256] = "";
  gethostname(me, sizeof me - 1);
  assert_string_equal(throttle_info_holder_host(info, 0), me);
  assert_null(throttle_info_holder_host(info, 1));
  throttle_info_free(info);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* ---- back-off ------------------------------------------------------------- */

static void test_redis_backoff_seen_by_another_host(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  const char *key = "hotdata:ws{1}/orders"; /* braces: harmless */
  assert_int_equal(throttle_backoff(a, key, TH_LONG_MS), 0);
  uint64_t left = th_remaining(b, key);
  assert_true(left > TH_LONG_MS - 5000 && left <= TH_LONG_MS);
  /* only ever later */
  assert_int_equal(throttle_backoff(b, key, 1000), 0);
  assert_true(th_remaining(a, key) > TH_LONG_MS - 5000);
  /* a clear on one host opens it on the other */
  assert_int_equal(throttle_clear(b, key), 0);
  assert_int_equal(th_remaining(a, key), 0);
  assert_int_equal(throttle_clear(b, "never-seen"), THROTTLE_ENOKEY);
  assert_int_equal(field(a, key, THROTTLE_FIELD_PUBLISHES), 2);
  throttle_close(b);
}

struct waiter_arg {
  struct th_fx *fx;
  uint64_t t0;
  uint64_t delay;
};

static int wait_child(void *p) {
  struct waiter_arg *w = p;
  throttle_t *b = other_host(w->fx);
  TH_CHILD_CHECK(throttle_wait(b, "t", THROTTLE_FOREVER) == 0);
  /* Redis's clock is read in whole milliseconds: allow 2 ms of rounding. */
  TH_CHILD_CHECK(th_mono_ms() - w->t0 + 2 >= w->delay);
  throttle_close(b);
  return 0;
}

static void test_redis_wait_not_before_published(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  struct waiter_arg w = {fx, th_mono_ms(), 400};
  assert_int_equal(throttle_backoff(a, "t", w.delay), 0);
  pid_t kids[4];
  for (int i = 0; i < 4; i++)
    kids[i] = th_spawn(fx, wait_child, &w);
  for (int i = 0; i < 4; i++)
    th_reap_ok(fx, kids[i], HANG_GUARD_MS);
  assert_true(field(a, "t", THROTTLE_FIELD_WAITS) >= 1);
}

/* ---- admission ------------------------------------------------------------ */

struct enter_arg {
  struct th_fx *fx;
  struct shared *s;
  int host; /* 0: the fixture's segment, 1: another */
  int rounds;
  int hold_ms;
};

static int enter_child(void *p) {
  struct enter_arg *e = p;
  throttle_t *h = NULL;
  if (e->host == 0)
    TH_CHILD_CHECK(throttle_open(e->fx->cfg, &h) == 0);
  else
    h = other_host(e->fx);
  for (int i = 0; i < e->rounds; i++) {
    throttle_ticket_t *t = NULL;
    TH_CHILD_CHECK(throttle_enter(h, "k", THROTTLE_CLASS_LIVE,
                                  THROTTLE_FOREVER, &t) == 0);
    int probe = throttle_ticket_is_probe(t);
    if (atomic_load(&e->s->probe_holding))
      atomic_fetch_add(&e->s->admitted_during_probe, 1);
    if (probe) {
      atomic_store(&e->s->probe_holding, 1);
      atomic_fetch_add(&e->s->probes, 1);
    }
    int n = atomic_fetch_add(&e->s->in_flight, 1) + 1;
    int m = atomic_load(&e->s->max_in_flight);
    while (n > m && !atomic_compare_exchange_weak(&e->s->max_in_flight, &m, n))
      ;
    atomic_fetch_add(&e->s->admitted, 1);
    th_sleep_ms((unsigned)e->hold_ms);
    atomic_fetch_sub(&e->s->in_flight, 1);
    if (probe)
      atomic_store(&e->s->probe_holding, 0);
    TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  }
  throttle_close(h);
  return 0;
}

static void run_fleet(struct th_fx *fx, struct shared *s, int n, int rounds,
                      int hold_ms) {
  struct enter_arg e[2] = {{fx, s, 0, rounds, hold_ms},
                           {fx, s, 1, rounds, hold_ms}};
  pid_t kids[16];
  for (int i = 0; i < n; i++)
    kids[i] = th_spawn(fx, enter_child, &e[i % 2]);
  for (int i = 0; i < n; i++)
    th_reap_ok(fx, kids[i], HANG_GUARD_MS);
}

static void test_redis_cap_holds_across_hosts(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 2), 0);
  struct shared *s = shared_new();
  run_fleet(fx, s, 6, 5, 15);
  assert_int_equal(atomic_load(&s->admitted), 30);
  assert_true(atomic_load(&s->max_in_flight) <= 2);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_ADMITTED), 30);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_IN_FLIGHT), 0);
  munmap(s, sizeof *s);
}

struct class_arg {
  struct th_fx *fx;
  throttle_class_t cls;
};

static int enter_class_child(void *p) {
  struct class_arg *c = p;
  throttle_t *h = other_host(c->fx);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, "q", c->cls, 20000, &t) == 0);
  TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(h);
  return 0;
}

/* show on one host lists the waiters of another, in arrival order, with
 * their pid, class and host. */
static void test_redis_info_lists_waiters_of_other_hosts(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_pause(a, "q"), 0);
  struct class_arg c[2] = {{fx, THROTTLE_CLASS_BACKFILL},
                           {fx, THROTTLE_CLASS_LIVE}};
  pid_t kids[2];
  for (int i = 0; i < 2; i++) {
    kids[i] = th_spawn(fx, enter_class_child, &c[i]);
    throttle_field_t f = c[i].cls == THROTTLE_CLASS_LIVE
                             ? THROTTLE_FIELD_WAITING_LIVE
                             : THROTTLE_FIELD_WAITING_BACKFILL;
    for (int n = 0; n < 400 && field(a, "q", f) < 1; n++)
      th_sleep_ms(25);
  }
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(a, "q", &info), 0);
  for (size_t i = 0; i < 2; i++) {
    int64_t pid = 0, age = -1;
    throttle_class_t cls = THROTTLE_CLASS_LIVE;
    assert_int_equal(throttle_info_waiter(info, i, &pid, &age, &cls), 0);
    assert_int_equal(pid, kids[i]);
    assert_int_equal(cls, c[i].cls);
    assert_true(age >= 0 && age < HANG_GUARD_MS);
    const char *host = throttle_info_waiter_host(info, i);
    assert_non_null(host);
    assert_true(host[0] != 0);
  }
  assert_int_equal(throttle_info_waiter(info, 2, NULL, NULL, NULL),
                   THROTTLE_ENOKEY);
  throttle_info_free(info);
  assert_int_equal(throttle_resume(a, "q"), 0);
  for (int i = 0; i < 2; i++)
    th_reap_ok(fx, kids[i], HANG_GUARD_MS);
}

static void test_redis_one_probe_per_episode(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 4), 0);
  assert_int_equal(throttle_backoff(a, "k", 300), 0);
  struct shared *s = shared_new();
  run_fleet(fx, s, 6, 1, 50);
  assert_int_equal(atomic_load(&s->admitted), 6);
  assert_int_equal(atomic_load(&s->probes), 1);
  assert_int_equal(atomic_load(&s->admitted_during_probe), 0);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_LOCK_EPISODE), 0);
  munmap(s, sizeof *s);
}

/* try_enter against a back-off, a pause, a rate and the backfill share,
 * set on another host. */
static void test_redis_try_enter_obeys_settings_of_other_hosts(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t = NULL, *t2 = NULL;
  uint64_t wait_ms = 0;
  assert_int_equal(throttle_backoff(b, "k", TH_LONG_MS), 0);
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, &wait_ms),
                   THROTTLE_EWOULDBLOCK);
  assert_null(t);
  assert_true(wait_ms > TH_LONG_MS - 5000);
  /* the timeout comes at once when the not-before lies beyond it */
  uint64_t t0 = th_mono_ms();
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 5000, &t),
                   THROTTLE_ETIMEDOUT);
  assert_true(th_mono_ms() - t0 < 4000);
  assert_int_equal(throttle_clear(b, "k"), 0);

  assert_int_equal(throttle_pause(b, "k"), 0);
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_PAUSED), 1);
  assert_int_equal(throttle_resume(b, "k"), 0);
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, NULL), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);

  /* 2 per minute, burst 2: the third is refused with a hint */
  assert_int_equal(throttle_set_rate(b, "r", 2, 60000), 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(throttle_try_enter(a, "r", THROTTLE_CLASS_LIVE, &t, NULL),
                     0);
    assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  }
  assert_int_equal(throttle_try_enter(a, "r", THROTTLE_CLASS_LIVE, &t, &wait_ms),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(field(a, "r", THROTTLE_FIELD_RATE_N), 2);

  /* backfill share 0.5 of a cap of 2: one backfill at a time */
  assert_int_equal(throttle_set_max_parallel(b, "s", 2), 0);
  assert_int_equal(throttle_set_backfill_share(b, "s", 0.5), 0);
  assert_int_equal(
      throttle_try_enter(a, "s", THROTTLE_CLASS_BACKFILL, &t, NULL), 0);
  assert_int_equal(
      throttle_try_enter(a, "s", THROTTLE_CLASS_BACKFILL, &t2, NULL),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(a, "s", THROTTLE_CLASS_LIVE, &t2, NULL),
                   0);
  assert_int_equal(field(b, "s", THROTTLE_FIELD_BACKFILL_SHARE_PERMILLE), 500);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(a, t2, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* A requeued admission on Redis reports (publishing the back-off) and
 * queues again; it is admitted once the back-off has passed. */
static void test_redis_requeue_waits_out_its_backoff(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  uint64_t t0 = th_mono_ms();
  assert_int_equal(
      throttle_requeue(a, &t, THROTTLE_OUTCOME_LOCKED, 300, THROTTLE_FOREVER),
      0);
  assert_non_null(t);
  assert_true(th_mono_ms() - t0 + 2 >= 300);
  assert_int_equal(field(b, "k", THROTTLE_FIELD_LOCKED), 1);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(field(b, "k", THROTTLE_FIELD_IN_FLIGHT), 0);
  throttle_close(b);
}

static int stop_after(void *arg) {
  _Atomic int *calls = arg;
  return atomic_fetch_add(calls, 1) >= 3;
}

/* The interrupt hook ends a wait on Redis too, and the queue place goes
 * back: the next caller is admitted at once. */
static void test_redis_interrupt_ends_wait_and_gives_place_back(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  throttle_ticket_t *t = NULL, *t2 = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  static _Atomic int calls;
  atomic_store(&calls, 0);
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, th_extra_name(fx)), 0);
  assert_int_equal(throttle_config_set_backend(cfg, R.url), 0);
  assert_int_equal(throttle_config_set_interrupt(cfg, stop_after,
                                                 (void *)&calls, 50),
                   0);
  throttle_t *b = NULL;
  assert_int_equal(throttle_open(cfg, &b), 0);
  throttle_config_free(cfg);
  assert_int_equal(
      throttle_enter(b, "k", THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t2),
      THROTTLE_EINTR);
  assert_true(atomic_load(&calls) >= 4);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_WAITING_LIVE), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* A report with a fence that no longer holds a slot frees nothing (the
 * slot went to another holder) and can only push the not-before later. */
static void test_redis_lapsed_report_frees_nothing(void **state) {
  struct th_fx *fx = *state;
  assert_int_equal(throttle_config_set_lease(fx->cfg, 200), 0);
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  throttle_ticket_t *ta = NULL, *tb = NULL;
  assert_int_equal(
      throttle_enter(a, "k", THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &ta), 0);
  /* a's lease lapses; b gets the slot */
  assert_int_equal(throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 10000, &tb), 0);
  assert_true(field(b, "k", THROTTLE_FIELD_RECLAIMS) >= 1);
  assert_int_equal(throttle_leave(a, ta, THROTTLE_OUTCOME_LOCKED, TH_LONG_MS),
                   THROTTLE_ESTALE);
  assert_true(th_contains(throttle_errmsg(a), "taken back"));
  assert_int_equal(field(b, "k", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_true(th_remaining(b, "k") > TH_LONG_MS - 5000);
  assert_int_equal(throttle_leave(b, tb, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(field(b, "k", THROTTLE_FIELD_IN_FLIGHT), 0);
  throttle_close(b);
}


static void test_redis_dead_holder_reclaimed(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct th_hold ha = {fx, "k", fds[1]};
  pid_t kid = th_spawn(fx, th_child_holds, &ha);
  uint64_t v;
  assert_int_equal(th_recv_u64(fds[0], &v), 0);
  kill(kid, SIGKILL);
  th_reap(fx, kid, HANG_GUARD_MS);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t = NULL;
  /* within the liveness bound (1 s here), far before the 10 min lease */
  int rc = throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 20000, &t);
  assert_int_equal(rc, 0);
  assert_true(field(b, "k", THROTTLE_FIELD_RECLAIMS) >= 1);
  assert_int_equal(throttle_leave(b, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
  close(fds[0]);
  close(fds[1]);
}

static int cancel_child(void *p) {
  struct th_fx *fx = p;
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(b, "k", THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t);
  TH_CHILD_CHECK(rc == THROTTLE_ECANCELED);
  throttle_close(b);
  return 0;
}

static void test_redis_cancel_ends_waiters_on_other_hosts(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  pid_t kid = th_spawn(fx, cancel_child, fx);
  for (int i = 0; i < 400 && field(a, "k", THROTTLE_FIELD_WAITING_LIVE) == 0;
       i++)
    th_sleep_ms(10);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_WAITING_LIVE), 1);
  assert_int_equal(throttle_cancel(a, "k"), 0);
  th_reap_ok(fx, kid, HANG_GUARD_MS);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(field(a, "k", THROTTLE_FIELD_CANCELED), 1);
}

/* ---- failure --------------------------------------------------------------- */

static void test_redis_down_falls_back_and_returns(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  th_redis_stop(&R, 1);
  /* served by the host's segment, and said */
  assert_int_equal(throttle_backoff(a, "t", TH_LONG_MS), 0);
  assert_true(th_contains(throttle_errmsg(a), "segment serves"));
  assert_true(th_remaining(a, "t") > 0);
  assert_int_equal(th_remaining(b, "t"), 0); /* another host's segment */
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "u", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  /* back: after the retry pause, calls go to Redis again */
  assert_int_equal(th_redis_start(&R), 0);
  th_sleep_ms(1200);
  assert_int_equal(throttle_backoff(a, "v", TH_LONG_MS), 0);
  th_sleep_ms(1200);
  assert_true(th_remaining(b, "v") > 0);
  assert_string_equal(throttle_errmsg(b), "");
  throttle_close(b);
}

/* Redis restarts empty: what a host was told stays in its segment, holds
 * that host's callers and goes back into Redis for the other hosts. */
static void test_redis_restart_healed_from_host_segment(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  assert_int_equal(throttle_backoff(a, "k", TH_LONG_MS), 0);
  th_redis_stop(&R, 1);
  assert_int_equal(th_redis_start(&R), 0); /* empty */
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  int rc = THROTTLE_OK;
  /* a failed call may still send a handle to its segment for a second */
  for (int i = 0; i < 30 && th_remaining(b, "k") == 0; i++) {
    rc = throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, &wait_ms);
    assert_int_equal(rc, THROTTLE_EWOULDBLOCK);
    th_sleep_ms(100);
  }
  assert_true(wait_ms > TH_LONG_MS - 10000);
  assert_true(th_remaining(b, "k") > TH_LONG_MS - 10000);
  throttle_close(b);
}

/* A caller the segment admitted during an outage is still in flight when
 * Redis is back (empty): Redis knows nothing of it, so the host's next
 * caller must queue behind it in the segment rather than be admitted by
 * Redis as a second gate on this host. */
static void test_redis_host_returns_once_its_segment_is_empty(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  th_redis_stop(&R, 1);
  throttle_ticket_t *held = NULL, *t = NULL;
  assert_int_equal(throttle_enter(a, "c", THROTTLE_CLASS_LIVE, 1000, &held),
                   0);
  assert_int_equal(th_redis_start(&R), 0);
  th_sleep_ms(1200); /* past the retry pause: Redis is asked again */
  uint64_t wait_ms = 0;
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t,
                                      &wait_ms),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(a, held, THROTTLE_OUTCOME_OK, 0), 0);
  /* the segment's gate is empty: this one goes through Redis */
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t,
                                      &wait_ms),
                   0);
  assert_int_equal(field(b, "c", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* A clear across hosts clears the copy the publishing host keeps for
 * healing too: its next call must not publish the back-off again. */
static void test_redis_clear_takes_the_host_copy_too(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  for (int reset = 0; reset < 2; reset++) {
    assert_int_equal(throttle_backoff(a, "k", TH_LONG_MS), 0);
    assert_true(th_remaining(b, "k") > 0);
    assert_int_equal(reset ? throttle_reset(a) : throttle_clear(a, "k"), 0);
    throttle_ticket_t *t = NULL;
    uint64_t wait_ms = 0;
    assert_int_equal(
        throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, &wait_ms), 0);
    assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
    assert_int_equal(th_remaining(b, "k"), 0);
    assert_int_equal(th_remaining(a, "k"), 0);
  }
  /* a key only this host's segment knows is cleared there */
  assert_int_equal(throttle_clear(a, "never-published"), THROTTLE_ENOKEY);
  throttle_close(b);
}

struct fork_loop {
  throttle_t *h;
  _Atomic int stop;
};

static void *remaining_loop(void *arg) {
  struct fork_loop *l = arg;
  while (!atomic_load(&l->stop)) {
    uint64_t ms;
    (void)throttle_remaining(l->h, "f", &ms);
  }
  return NULL;
}

static int use_and_close_inherited(void *arg) {
  throttle_t *h = arg;
  uint64_t ms;
  TH_CHILD_CHECK(throttle_remaining(h, "f", &ms) == 0);
  throttle_close(h);
  /* What the parent's other thread was using at the fork (a connection
   * out of the pool, a call's buffers) has no owner in the child: a leak
   * checker would report it at exit, so end by exec, which it does not
   * check. */
  execl("/bin/true", "true", (char *)NULL);
  return 0;
}

/* fork() while another thread of the parent is inside a Redis call: the
 * child's copy of the handle must not stay locked; its calls and its
 * close go through.  (Each fork has a few per cent of a chance to catch
 * the other thread holding the handle's mutex; 150 of them make a hang
 * without the fork handlers all but certain.) */
static void test_redis_fork_while_another_thread_calls(void **state) {
#ifdef TH_ASAN
  /* AddressSanitizer's allocator (gcc 12's and clang 14's runtimes) takes
   * no lock at fork: a child forked while the other thread is in malloc
   * hangs in its first malloc, whatever the library does.  glibc's malloc
   * is fork-safe; the plain, valgrind and tsan runs keep the test. */
  skip();
#endif
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_backoff(a, "f", TH_LONG_MS), 0);
  struct fork_loop l = {a, 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, remaining_loop, &l), 0);
  int bad = 0;
  for (int i = 0; i < 100 && bad == 0; i++) {
    pid_t kid = th_spawn(fx, use_and_close_inherited, a);
    /* no assert before the thread is stopped: a failure would leave it
     * running on a handle the teardown closes */
    uint64_t t0 = th_mono_ms();
    siginfo_t si = {0};
    while (waitid(P_PID, (id_t)kid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == 0 && th_mono_ms() - t0 < HANG_GUARD_MS)
      th_sleep_ms(2);
    if (si.si_pid == 0)
      kill(kid, SIGKILL); /* hung */
    int st = th_reap(fx, kid, HANG_GUARD_MS);
    bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  atomic_store(&l.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(bad, 0);
}

static int close_inherited(void *arg) {
  throttle_close(arg);
  return 0;
}

/* fork() while the parent holds an admission (its heartbeat thread waits
 * on the handle's condition variable): the child closes its copy and
 * exits (pthread_cond_destroy() in the child waited for the parent's
 * sleeper, forever). */
static void test_redis_fork_while_holding_closes_in_child(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "f", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  th_sleep_ms(50); /* the heartbeat thread is asleep on its wait */
  th_reap_ok(fx, th_spawn(fx, close_inherited, a), HANG_GUARD_MS);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* More keys than the host's segment holds (4,096 by default), each with a
 * back-off still running, so none can be evicted: Redis takes every one,
 * and a mirror in the segment that finds no room turns no success into
 * THROTTLE_EFULL (some 3,000-5,000 of 5,000 calls failed so). */
static void test_redis_backoff_beyond_segment_capacity_succeeds(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(a, &cap, NULL, NULL, NULL), 0);
  uint32_t n = cap + 900;
  uint32_t failed = 0;
  int first = 0;
  for (uint32_t i = 0; i < n; i++) {
    char key[32];
    snprintf(key, sizeof key, "many/%u", i);
    int rc = throttle_backoff(a, key, TH_LONG_MS);
    if (rc != 0 && failed++ == 0)
      first = rc;
  }
  printf("%u keys, segment capacity %u: %u failed (first %s)\n", n, cap,
         failed, failed ? throttle_err_name(first) : "-");
  assert_int_equal(failed, 0);
  throttle_t *b = other_host(fx);
  char last[32];
  snprintf(last, sizeof last, "many/%u", n - 1);
  assert_true(th_remaining(b, last) > 0);
  throttle_close(b);
}

static void test_redis_stalled_server_blocks_no_call(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_backoff(a, "t", 1), 0); /* connected, loaded */
  const char *args[] = {"DEBUG", "SLEEP", "1", NULL};
  int cli = th_redis_cli(&R, 1, args);
  assert_true(cli > 0);
  th_sleep_ms(300); /* redis-cli started and the server asleep; 700 ms left */
  uint64_t t0 = th_mono_ms();
  assert_int_equal(throttle_backoff(a, "t", TH_LONG_MS), 0);
  uint64_t took = th_mono_ms() - t0;
  printf("took %llu ms: %s\n", (unsigned long long)took, throttle_errmsg(a));
  /* the command timeout is 250 ms; the stall lasts 1000 ms */
  assert_true(took < 800);
  assert_true(th_contains(throttle_errmsg(a), "segment serves"));
  assert_true(th_remaining(a, "t") > 0);
  th_reap(fx, cli, HANG_GUARD_MS);
}

/* Settings made through Redis outlast the idle TTL, as a segment keeps a
 * record with settings: a key's cap, a pool's cap (entered beneath, so
 * that it is stored as a scope too) and a pause are still there for
 * another host after the TTL, while a key without settings is gone; once
 * unset, a key lapses with the TTL again. */
static void test_redis_settings_outlive_idle_ttl(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_REDIS_TTL_MS", "1000", 1); /* the least it takes */
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  unsetenv("THROTTLE_REDIS_TTL_MS");
  assert_int_equal(throttle_set_max_parallel(a, "ws/orders", 1), 0);
  assert_int_equal(throttle_set_max_parallel(a, "ws", 3), 0);
  assert_int_equal(throttle_pause(a, "held"), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(
      throttle_enter(a, "ws/orders", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(a, "plain", THROTTLE_CLASS_LIVE, 1000, &t),
                   0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  th_sleep_ms(2500); /* the TTL, twice, and a margin */
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(b, "plain", &info), THROTTLE_ENOKEY);
  assert_int_equal(field(b, "ws/orders", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(b, "ws/orders", THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(field(b, "ws", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(b, "held", THROTTLE_FIELD_PAUSED), 1);
  assert_int_equal(throttle_set_max_parallel(a, "ws/orders", 0), 0);
  assert_int_equal(throttle_resume(a, "held"), 0);
  th_sleep_ms(2500);
  assert_int_equal(throttle_info(b, "ws/orders", &info), THROTTLE_ENOKEY);
  assert_int_equal(throttle_info(b, "held", &info), THROTTLE_ENOKEY);
  assert_int_equal(field(b, "ws", THROTTLE_FIELD_CAP), 3);
  throttle_close(b);
}

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_redis: redis-server is not installed (make deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_redis_open_bad_url_works_on_segment,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_open_missing_module_is_ebackend,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_backend_named_password_masked,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_backoff_seen_by_another_host,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_wait_not_before_published,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_cap_holds_across_hosts, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_info_lists_waiters_of_other_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_one_probe_per_episode, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_try_enter_obeys_settings_of_other_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_interrupt_ends_wait_and_gives_place_back, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_requeue_waits_out_its_backoff,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_lapsed_report_frees_nothing,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_dead_holder_reclaimed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_cancel_ends_waiters_on_other_hosts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_down_falls_back_and_returns,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_restart_healed_from_host_segment, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_host_returns_once_its_segment_is_empty, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_clear_takes_the_host_copy_too,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_fork_while_another_thread_calls, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_fork_while_holding_closes_in_child, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_backoff_beyond_segment_capacity_succeeds, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_redis_settings_outlive_idle_ttl,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_stalled_server_blocks_no_call,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
