/* SPDX-License-Identifier: MIT */
/*
 * test_scope.c — keys as paths (scope.c): a scope's not-before, pause,
 * cancel and clear reach every key beneath it; one probe goes for a whole
 * scope; 429 and 503 are published on the root scope, LOCKED on the key,
 * as the handle's publish levels say.  Real processes (fork), no timing
 * assertions beyond "not before the published time" and orders.
 *
 * test_redis_scope.c runs these bodies again on the Redis backend, with
 * the children on two "hosts": it defines TH_SCOPE_CFG (the config child
 * i opens) and TH_SCOPE_NO_MAIN before it includes this file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_GUARD_MS 15000
#define NTABLES 4

static struct th_fx *fx_of(void **state) { return *state; }

#ifndef TH_SCOPE_CFG
#define TH_SCOPE_CFG(fx, i) ((void)(i), (fx)->cfg)
#endif

static const char *const tables[NTABLES] = {"ws1/orders", "ws1/items",
                                            "ws1/users", "ws1/events"};

/* What the children of one test share (an anonymous shared mapping). */
#define MAXKIDS 16
struct board {
  _Atomic uint64_t admit_ns[MAXKIDS];
  _Atomic uint64_t leave_ns[MAXKIDS];
  _Atomic int rc[MAXKIDS];
  _Atomic int order[MAXKIDS]; /* admission rank */
  _Atomic int admitted;
  _Atomic int in_flight, max_in_flight;
  uint64_t hold_ms;
  throttle_outcome_t probe_outcome; /* the first admission's answer */
  int die_first;                     /* the first admission is killed */
};

static struct board *board_new(void) {
  struct board *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(b != MAP_FAILED);
  memset(b, 0, sizeof *b);
  for (int i = 0; i < MAXKIDS; i++)
    b->rc[i] = -1000;
  return b;
}

struct kid {
  struct th_fx *fx;
  struct board *b;
  int i;                /* its place in the board; table i % NTABLES */
  throttle_class_t cls; /* LIVE unless set */
};

/* Child i's own handle (the inherited one is the parent's), or NULL. */
static throttle_t *child_handle(struct th_fx *fx, int i) {
  throttle_close(fx->h);
  throttle_t *h = NULL;
  return throttle_open(TH_SCOPE_CFG(fx, i), &h) == 0 ? h : NULL;
}

/* Enter table i, note the time, hold, leave (the first admitted of all
 * with the board's probe outcome, or dying without a leave). */
static int child_enters(void *p) {
  struct kid *k = p;
  throttle_t *h = child_handle(k->fx, k->i);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, tables[k->i % NTABLES], k->cls, HANG_GUARD_MS,
                          &t);
  k->b->rc[k->i] = rc;
  if (rc != 0) {
    throttle_close(h);
    return 0;
  }
  k->b->admit_ns[k->i] = th_now_ns();
  int rank = atomic_fetch_add(&k->b->admitted, 1), first = rank == 0;
  k->b->order[k->i] = rank;
  int n = atomic_fetch_add(&k->b->in_flight, 1) + 1;
  for (int m = atomic_load(&k->b->max_in_flight);
       n > m && !atomic_compare_exchange_weak(&k->b->max_in_flight, &m, n);)
    ;
  if (first && k->b->die_first)
    raise(SIGKILL); /* the scope's probe dies holding its place */
  th_sleep_ms((unsigned)k->b->hold_ms);
  k->b->leave_ns[k->i] = th_now_ns();
  atomic_fetch_sub(&k->b->in_flight, 1);
  TH_CHILD_CHECK(throttle_leave(h, t,
                                first ? k->b->probe_outcome
                                      : THROTTLE_OUTCOME_OK,
                                1000) == 0);
  throttle_close(h);
  return 0;
}

static int child_waits(void *p) {
  struct kid *k = p;
  throttle_t *h = child_handle(k->fx, k->i);
  TH_CHILD_CHECK(h != NULL);
  k->b->rc[k->i] = throttle_wait(h, tables[k->i], THROTTLE_FOREVER);
  k->b->admit_ns[k->i] = th_now_ns();
  throttle_close(h);
  return 0;
}

static void spawn_all(struct th_fx *fx, struct board *b, struct kid *k,
                      int (*fn)(void *), pid_t *pid) {
  for (int i = 0; i < NTABLES; i++) {
    k[i] = (struct kid){fx, b, i, THROTTLE_CLASS_LIVE};
    pid[i] = th_spawn(fx, fn, &k[i]);
  }
}

static void reap_all(struct th_fx *fx, pid_t *pid) {
  for (int i = 0; i < NTABLES; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS + 5000);
}

/* ---- not-before on a scope ------------------------------------------- */

/* 300 ms on "ws1", then one child per table runs fn: every one returns
 * 0, none before the scope's not-before. */
static void backoff_round(void **state, int (*fn)(void *)) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "ws1", 300), 0);
  assert_true(th_remaining(h, "ws1/orders") > 0); /* the scope's, read */
  assert_int_equal(th_remaining(h, "ws2/orders"), 0); /* another scope */
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, fn, pid);
  reap_all(fx, pid);
  for (int i = 0; i < NTABLES; i++) {
    assert_int_equal(b->rc[i], 0);
    assert_true(b->admit_ns[i] >= t0 + 300 * NS_PER_MS);
  }
  munmap(b, sizeof *b);
}

static void test_scope_backoff_holds_waits_beneath(void **state) {
  backoff_round(state, child_waits);
  /* a key of another scope, and one named like a longer scope, are open */
  assert_int_equal(throttle_backoff(fx_of(state)->h, "ws1", 60000), 0);
  assert_int_equal(throttle_wait(fx_of(state)->h, "ws10/orders", 0), 0);
  assert_int_equal(throttle_wait(fx_of(state)->h, "ws1/orders", 0),
                   THROTTLE_ETIMEDOUT);
}

static void test_scope_backoff_holds_admissions_beneath(void **state) {
  backoff_round(state, child_enters);
}

/* ---- one probe for the scope ------------------------------------------ */

static int first_admitted(const struct board *b) {
  int f = 0;
  for (int i = 1; i < NTABLES; i++)
    if (b->admit_ns[i] < b->admit_ns[f])
      f = i;
  return f;
}

/* A back-off of backoff_ms on "ws1" (none: 0), then one child per table
 * enters; the
 * first admitted answers with o after holding hold_ms.  *first = its table. */
static struct board *probe_round(struct th_fx *fx, uint64_t backoff_ms,
                                 uint64_t hold_ms, throttle_outcome_t o,
                                 int *first) {
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->hold_ms = hold_ms;
  b->probe_outcome = o;
  if (backoff_ms != 0) /* else the scope is cold: nothing known yet */
    assert_int_equal(throttle_backoff(h, "ws1", backoff_ms), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_enters, pid);
  reap_all(fx, pid);
  *first = first_admitted(b);
  return b;
}

/* A probe round (see probe_round) in which every child was admitted and
 * none but the first before its answer, plus after_ms; then the count of
 * back-offs "ws1" was given is publishes. */
static void others_follow(void **state, uint64_t backoff_ms,
                          throttle_outcome_t o, uint64_t after_ms,
                          int64_t publishes) {
  int f;
  struct board *b = probe_round(fx_of(state), backoff_ms, 50, o, &f);
  for (int i = 0; i < NTABLES; i++) {
    assert_int_equal(b->rc[i], 0);
    if (i != f)
      assert_true(b->admit_ns[i] >= b->leave_ns[f] + after_ms * NS_PER_MS);
  }
  assert_int_equal(th_field(fx_of(state)->h, "ws1", THROTTLE_FIELD_PUBLISHES),
                   publishes);
  munmap(b, sizeof *b);
}

static void test_scope_one_probe_for_the_scope(void **state) {
  others_follow(state, 300, THROTTLE_OUTCOME_OK, 0, 1);
}

/* the probe's 429 publishes 1000 ms on "ws1" again */
static void test_scope_probe_refused_again_holds_the_scope(void **state) {
  others_follow(state, 200, THROTTLE_OUTCOME_RATE_LIMITED, 1000, 2);
}

/* ---- a cold scope: one first request for the whole scope -------------- */

/* Nothing known of "ws1" yet: 4 tables, one process each.  The first
 * admitted goes alone; the others follow its answer, and when that answer
 * is a 429 (published on "ws1"), its Retry-After too.  Without the rule,
 * each table's first writer would go at once: 4 refusals, not 1. */
static void test_scope_cold_scope_sends_one_first_request(void **state) {
  others_follow(state, 0, THROTTLE_OUTCOME_OK, 0, 0);
}

static void test_scope_cold_scope_refused_holds_its_retry_after(void **state) {
  others_follow(state, 0, THROTTLE_OUTCOME_RATE_LIMITED, 1000, 1);
}

static int try_in(throttle_t *h, const char *key, throttle_ticket_t **t) {
  return throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, t, NULL);
}

/* What ends a cold scope's wait: an answer the server gave.  A LOCKED
 * (the table's) opens the scope at once; a transport failure or a caller
 * who gave up says nothing of it, so the next admission goes alone. */
static void test_scope_cold_scope_opens_on_any_answer(void **state) {
  throttle_t *h = th_open(fx_of(state));
  throttle_ticket_t *t, *u, *v;
  assert_int_equal(try_in(h, "ws1/orders", &t), 0);
  assert_int_equal(try_in(h, "ws1/items", &u), THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_FAILED, 0), 0);
  assert_int_equal(try_in(h, "ws1/items", &u), 0); /* the next one alone */
  assert_int_equal(try_in(h, "ws1/users", &v), THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_ABANDONED, 0), 0);
  assert_int_equal(try_in(h, "ws1/users", &u), 0);
  assert_int_equal(try_in(h, "ws1/events", &v), THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_LOCKED, 1), 0);
  assert_int_equal(try_in(h, "ws1/events", &v), 0); /* open: all at once */
  assert_int_equal(try_in(h, "ws1/orders", &t), 0);
  assert_int_equal(throttle_leave(h, v, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_LOCK_EPISODE), 0);
}

/* A cold scope's first request holds its siblings at most 1 s
 * (THROTTLE__COLD_HOLD_NS): a caller holding one table while it enters
 * another (nested work) waits that long, never for itself forever.  Its
 * answer still ends the episode; a 429 after the bound still holds all. */
static void test_scope_cold_hold_is_bounded(void **state) {
  throttle_t *h = th_open(fx_of(state));
  throttle_ticket_t *t, *u, *v;
  uint64_t m0 = th_mono_ms();
  assert_int_equal(try_in(h, "ws1/orders", &t), 0);
  assert_int_equal(try_in(h, "ws1/items", &u), THROTTLE_EWOULDBLOCK);
  assert_int_equal(
      throttle_enter(h, "ws1/items", THROTTLE_CLASS_LIVE, 10000, &u), 0);
  assert_true(th_mono_ms() - m0 >= 990); /* not before the bound */
  assert_true(th_mono_ms() - m0 < 9000); /* and not the 10 s timeout */
  assert_int_equal(try_in(h, "ws1/users", &v), 0);
  assert_int_equal(throttle_leave(h, v, THROTTLE_OUTCOME_OK, 0), 0);
  /* the first request's late 429 is the scope's, for every key */
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_RATE_LIMITED, 30000),
                   0);
  assert_int_equal(try_in(h, "ws1/users", &v), THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_OK, 0), 0);
  uint64_t left = 0;
  assert_int_equal(throttle_remaining(h, "ws1/events", &left), 0);
  assert_true(left > 25000);
}

/* One rule for the cold hold in every waiting call: the first request of
 * a cold scope is its probe (throttle_ticket_is_probe), and a wait on a
 * sibling, by the holder itself or by another process, ends with the
 * hold's bound as an admission's does, never with the timeout (nor, with
 * THROTTLE_FOREVER, when the first request's lease lapses). */
static struct th_gate sibling_go;

static int child_waits_sibling(void *p) {
  struct kid *k = p;
  throttle_t *h = child_handle(k->fx, k->i);
  TH_CHILD_CHECK(h != NULL);
  th_gate_wait(&sibling_go); /* the parent holds the scope's probe */
  k->b->rc[k->i] = throttle_wait(h, "ws1/items", 8000);
  throttle_close(h);
  return 0;
}

static void test_scope_cold_hold_bounds_every_wait(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  throttle_ticket_t *t, *u;
  /* forked before the parent holds anything: its own handle, then go */
  th_gate_init(&sibling_go);
  struct kid k = {fx, b, 1, THROTTLE_CLASS_LIVE};
  pid_t pid = th_spawn(fx, child_waits_sibling, &k);
  assert_int_equal(try_in(h, "ws1/orders", &t), 0);
  assert_int_equal(throttle_ticket_is_probe(t), 1); /* the scope's probe */
  assert_int_equal(try_in(h, "ws1/items", &u), THROTTLE_EWOULDBLOCK);
  th_gate_open(&sibling_go);
  /* the holder's own wait on a sibling: the bound, not its own answer */
  assert_int_equal(throttle_wait(h, "ws1/items", 8000), 0);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_int_equal(b->rc[1], 0);
  assert_int_equal(try_in(h, "ws1/items", &u), 0); /* as enter says */
  assert_int_equal(throttle_ticket_is_probe(u), 0);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  th_gate_close(&sibling_go);
  munmap(b, sizeof *b);
}

/* A handle that publishes 429 and 503 on the key keeps every table
 * independent: no scope record, no first request for the scope. */
static void test_scope_cold_rule_only_where_signals_go(void **state) {
  throttle_t *h = th_open(fx_of(state));
  assert_int_equal(throttle_set_publish_level(h, THROTTLE_OUTCOME_RATE_LIMITED,
                                              THROTTLE_LEVEL_KEY),
                   0);
  assert_int_equal(throttle_set_publish_level(h, THROTTLE_OUTCOME_UNAVAILABLE,
                                              THROTTLE_LEVEL_KEY),
                   0);
  throttle_ticket_t *t, *u;
  assert_int_equal(try_in(h, "ws1/orders", &t), 0);
  assert_int_equal(try_in(h, "ws1/items", &u), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(h, "ws1", &info), THROTTLE_ENOKEY);
}

static void test_scope_dead_probe_is_reclaimed(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->die_first = 1;
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  assert_int_equal(throttle_backoff(h, "ws1", 100), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_enters, pid);
  int f = -1;
  for (int i = 0; i < NTABLES; i++) {
    int st = th_reap(fx, pid[i], HANG_GUARD_MS + 5000);
    if (WIFSIGNALED(st))
      f = i;
    else
      assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  assert_true(f >= 0);
  for (int i = 0; i < NTABLES; i++)
    if (i != f)
      assert_int_equal(b->rc[i], 0); /* admitted: the place was reclaimed */
  munmap(b, sizeof *b);
}

/* ---- pause, resume, cancel, clear on a scope -------------------------- */

static void wait_all_sleeping(const pid_t *pid) {
  for (int i = 0; i < NTABLES; i++)
    th_wait_sleeping(pid[i], 5000);
}

static void test_scope_pause_holds_every_key_until_resume(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  assert_int_equal(throttle_pause(h, "ws1"), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_enters, pid);
  wait_all_sleeping(pid);
  th_sleep_ms(300);
  assert_int_equal(atomic_load(&b->admitted), 0);
  uint64_t t_resume = th_now_ns();
  assert_int_equal(throttle_resume(h, "ws1"), 0);
  reap_all(fx, pid);
  for (int i = 0; i < NTABLES; i++) {
    assert_int_equal(b->rc[i], 0);
    assert_true(b->admit_ns[i] >= t_resume);
  }
  munmap(b, sizeof *b);
}

static void test_scope_cancel_reaches_every_key(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  assert_int_equal(throttle_pause(h, "ws1"), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_enters, pid);
  wait_all_sleeping(pid);
  for (int i = 0; i < NTABLES; i++) /* every child is queued on its key */
    th_wait_field(h, tables[i], THROTTLE_FIELD_WAITING_LIVE, 1, 5000);
  assert_int_equal(throttle_cancel(h, "ws1"), 0);
  reap_all(fx, pid);
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(b->rc[i], THROTTLE_ECANCELED);
  assert_int_equal(atomic_load(&b->admitted), 0);
  munmap(b, sizeof *b);
}

static void test_scope_clear_wakes_keys_beneath(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  assert_int_equal(throttle_backoff(h, "ws1", 30000), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_waits, pid);
  wait_all_sleeping(pid);
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_clear(h, "ws1"), 0);
  reap_all(fx, pid);
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(b->rc[i], 0);
  assert_true(th_mono_ms() - m0 < 10000); /* not the 30 s */
  munmap(b, sizeof *b);
}

/* 429 and 503 on the key: no scope record is ever made for a handle so
 * configured (the cold-scope rule is where signals go). */
static int publish_on_key(throttle_t *h) {
  int rc = throttle_set_publish_level(h, THROTTLE_OUTCOME_RATE_LIMITED,
                                      THROTTLE_LEVEL_KEY);
  return rc != 0 ? rc
                 : throttle_set_publish_level(h, THROTTLE_OUTCOME_UNAVAILABLE,
                                              THROTTLE_LEVEL_KEY);
}

/* Enter table i with signals published on the key (no scope record). */
static int child_enters_key_only(void *p) {
  struct kid *k = p;
  throttle_t *h = child_handle(k->fx, k->i);
  TH_CHILD_CHECK(h != NULL);
  TH_CHILD_CHECK(publish_on_key(h) == 0);
  throttle_ticket_t *t = NULL;
  k->b->rc[k->i] = throttle_enter(h, tables[k->i], k->cls, HANG_GUARD_MS, &t);
  if (k->b->rc[k->i] == 0)
    TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(h);
  return 0;
}

/* Tables that publish on themselves leave their scope without a record:
 * resume, clear and cancel on the scope still reach every key beneath
 * (cancel ends its waiters), and only a name with nothing at or beneath
 * it is an unknown key. */
static void test_scope_commands_reach_keys_without_scope_record(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(publish_on_key(h), 0);
  struct board *b = board_new();
  assert_int_equal(throttle_set_max_parallel(h, tables[0], 1), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, tables[0], THROTTLE_CLASS_LIVE, &t,
                                      NULL),
                   0);
  struct kid k = {fx, b, 0, THROTTLE_CLASS_LIVE};
  pid_t pid = th_spawn(fx, child_enters_key_only, &k);
  th_wait_field(h, tables[0], THROTTLE_FIELD_WAITING_LIVE, 1, 5000);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(h, "ws1", &info), THROTTLE_ENOKEY);
  assert_int_equal(throttle_resume(h, "ws1"), 0);
  assert_int_equal(throttle_clear(h, "ws1"), 0);
  assert_int_equal(th_field(h, tables[0], THROTTLE_FIELD_WAITING_LIVE), 1);
  assert_int_equal(throttle_cancel(h, "ws1"), 0);
  th_reap_ok(fx, pid, HANG_GUARD_MS + 5000);
  assert_int_equal(b->rc[0], THROTTLE_ECANCELED);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_cancel(h, "ws9"), THROTTLE_ENOKEY);
  assert_int_equal(throttle_cancel(h, "ws"), THROTTLE_ENOKEY); /* no '/' */
  assert_int_equal(throttle_clear(h, "ws9"), THROTTLE_ENOKEY);
  assert_int_equal(throttle_resume(h, "ws9"), THROTTLE_ENOKEY);
  munmap(b, sizeof *b);
}

/* ---- where a signal is published ------------------------------------- */

static void leave_with(throttle_t *h, const char *key, throttle_outcome_t o) {
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, o, TH_LONG_MS), 0);
}

static void test_scope_signals_go_where_meant_by_default(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  leave_with(h, "ws1/orders", THROTTLE_OUTCOME_LOCKED); /* the table's */
  assert_true(th_remaining(h, "ws1/orders") > 0);
  assert_int_equal(th_remaining(h, "ws1/items"), 0);
  assert_int_equal(th_remaining(h, "ws1"), 0);
  leave_with(h, "ws2/a/b", THROTTLE_OUTCOME_RATE_LIMITED); /* the root's */
  assert_true(th_remaining(h, "ws2") > 0);
  assert_true(th_remaining(h, "ws2/x") > 0);
  assert_int_equal(th_field(h, "ws2/a/b", THROTTLE_FIELD_PUBLISHES), 0);
  leave_with(h, "ws3/t", THROTTLE_OUTCOME_UNAVAILABLE);
  assert_true(th_remaining(h, "ws3/other") > 0);
  leave_with(h, "plain", THROTTLE_OUTCOME_RATE_LIMITED); /* no scope */
  assert_true(th_remaining(h, "plain") > 0);
}

static void test_scope_publish_level_is_configurable(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_publish_level(h, THROTTLE_OUTCOME_RATE_LIMITED,
                                              THROTTLE_LEVEL_KEY),
                   0);
  leave_with(h, "ws1/orders", THROTTLE_OUTCOME_RATE_LIMITED);
  assert_true(th_remaining(h, "ws1/orders") > 0);
  assert_int_equal(th_remaining(h, "ws1/items"), 0);
  assert_int_equal(throttle_set_publish_level(h, THROTTLE_OUTCOME_LOCKED, 2),
                   0);
  leave_with(h, "a/b/c/d", THROTTLE_OUTCOME_LOCKED);
  assert_true(th_remaining(h, "a/b") > 0);
  assert_int_equal(th_remaining(h, "a"), 0);
  assert_true(th_remaining(h, "a/b/other") > 0);
  leave_with(h, "x/y", THROTTLE_OUTCOME_LOCKED); /* fewer levels: the key */
  assert_true(th_remaining(h, "x/y") > 0);
  assert_int_equal(th_remaining(h, "x"), 0);
  assert_int_equal(
      throttle_set_publish_level(h, THROTTLE_OUTCOME_OK, THROTTLE_LEVEL_KEY),
      THROTTLE_EINVAL);
  assert_int_equal(
      throttle_set_publish_level(h, THROTTLE_OUTCOME_LOCKED, -2),
      THROTTLE_EINVAL);
  assert_int_equal(throttle_set_publish_level(NULL, THROTTLE_OUTCOME_LOCKED,
                                              THROTTLE_LEVEL_KEY),
                   THROTTLE_EINVAL);
}

/* ---- the open-key path's memory of open scopes ------------------------ */

static int child_backs_off(void *p) {
  struct th_fx *fx = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_backoff(h, "ws1", TH_LONG_MS) == 0);
  throttle_close(h);
  return 0;
}

static void test_scope_open_path_sees_later_scope_backoff(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  char key[32] = "ws1/orders";
  const char *named[] = {key, "ws1"}; /* both exist: no insert below */
  for (int i = 0; i < 2; i++) {
    assert_int_equal(throttle_backoff(h, named[i], 1), 0);
    assert_int_equal(throttle_clear(h, named[i]), 0);
  }
  for (int i = 0; i < 3; i++) /* seen open, remembered */
    assert_int_equal(throttle_wait(h, key, 0), 0);
  th_reap_ok(fx, th_spawn(fx, child_backs_off, fx), HANG_GUARD_MS);
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
  /* the same buffer, now another key of the same length: its scope is
   * looked at, not what was remembered for the buffer */
  assert_int_equal(throttle_clear(h, "ws1"), 0);
  assert_int_equal(throttle_backoff(h, "ws2/orders", 1), 0);
  assert_int_equal(throttle_clear(h, "ws2/orders"), 0);
  assert_int_equal(throttle_wait(h, key, 0), 0);
  memcpy(key, "ws2/orders", 11);
  assert_int_equal(throttle_wait(h, key, 0), 0);
  assert_int_equal(throttle_backoff(h, "ws2", TH_LONG_MS), 0);
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
  assert_int_equal(throttle_pause(h, "ws3"), 0);
  memcpy(key, "ws3/orders", 11); /* never named: looked at in full */
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
}

/* An admission remembers that the scopes of its key were quiet (scope.c),
 * and must still see every later change of a scope: another process's
 * back-off, a pause, a pool.  Each try is made from the same buffer, after
 * admissions that found "ws1" answered and open. */
static void quiet_admissions(throttle_t *h, const char *key) {
  for (int i = 0; i < 3; i++) {
    throttle_ticket_t *t = NULL;
    assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                     0);
    assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  }
}

static void test_scope_admission_sees_later_scope_changes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  char key[32] = "ws1/orders";
  throttle_ticket_t *t = NULL, *u = NULL;
  uint64_t wait_ms = 0;
  quiet_admissions(h, key); /* the cold scope "ws1" answered, then quiet */
  th_reap_ok(fx, th_spawn(fx, child_backs_off, fx), HANG_GUARD_MS);
  assert_int_equal(
      throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_clear(h, "ws1"), 0);
  quiet_admissions(h, key);
  assert_int_equal(throttle_pause(h, "ws1"), 0);
  assert_int_equal(
      throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_resume(h, "ws1"), 0);
  quiet_admissions(h, key);
  /* a pool of 1: the remembered quiet must not let a second key in */
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 1), 0);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_try_enter(h, "ws1/items", THROTTLE_CLASS_LIVE, &u,
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
  /* the pool gone again, and quiet: an admission granted then takes no
   * place; one held across the pool's return is counted by it (the new
   * cap counts what is in flight) and its leave leaves none behind */
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 0), 0);
  quiet_admissions(h, key);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 1), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_try_enter(h, "ws1/items", THROTTLE_CLASS_LIVE, &u,
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(throttle_try_enter(h, "ws1/items", THROTTLE_CLASS_LIVE, &u,
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(h, u, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
}

/* throttle_try_enter()'s hint: a key held by its scope's back-off waits a
 * time, the time until the scope's not-before passes (the later of the
 * key's and its scopes'), as for the key's own back-off. */
static void test_scope_try_enter_hint_counts_scope_backoff(void **state) {
  throttle_t *h = th_open(fx_of(state));
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  assert_int_equal(throttle_backoff(h, "ws1", 30000), 0);
  assert_int_equal(
      throttle_try_enter(h, "ws1/orders", THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_null(t);
  printf("held by the scope's 30 s back-off: hint %llu ms\n",
         (unsigned long long)wait_ms);
  assert_true(wait_ms > 25000 && wait_ms <= 30000);
  /* the key's own shorter back-off does not shorten the hint */
  assert_int_equal(throttle_backoff(h, "ws1/orders", 5000), 0);
  assert_int_equal(
      throttle_try_enter(h, "ws1/orders", THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_true(wait_ms > 25000 && wait_ms <= 30000);
  /* a deeper key: every scope above counts */
  assert_int_equal(
      throttle_try_enter(h, "ws1/db/orders", THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_true(wait_ms > 25000 && wait_ms <= 30000);
  /* a pause is no time: the hint stays 0 */
  assert_int_equal(throttle_clear(h, "ws1"), 0);
  assert_int_equal(throttle_clear(h, "ws1/orders"), 0);
  assert_int_equal(throttle_pause(h, "ws1"), 0);
  assert_int_equal(
      throttle_try_enter(h, "ws1/orders", THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(wait_ms, 0);
}

/* ---- pools ------------------------------------------------------------ */

/* A pool of 3 on "ws1" over 4 tables that each admit 8: 16 processes never
 * hold more than 3 admissions at once in all. */
static void test_scope_pool_caps_the_sum(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->hold_ms = 60;
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 3), 0);
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(throttle_set_max_parallel(h, tables[i], 8), 0);
  struct kid k[MAXKIDS];
  pid_t pid[MAXKIDS];
  for (int i = 0; i < MAXKIDS; i++) {
    k[i] = (struct kid){fx, b, i, THROTTLE_CLASS_LIVE};
    pid[i] = th_spawn(fx, child_enters, &k[i]);
  }
  for (int i = 0; i < MAXKIDS; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS + 5000);
  for (int i = 0; i < MAXKIDS; i++)
    assert_int_equal(b->rc[i], 0);
  printf("pool of 3 over 4 tables, 16 processes: at most %d at once\n",
         atomic_load(&b->max_in_flight));
  assert_true(atomic_load(&b->max_in_flight) <= 3);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
  munmap(b, sizeof *b);
}

/* A pool of 1, paused: 4 backfill callers arrive (tables 0..3), then 4
 * live ones (tables 3..0).  On resume the live go first, each class in
 * arrival order, across tables. */
static void test_scope_pool_fifo_across_tables_live_first(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->hold_ms = 20;
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 1), 0);
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(throttle_set_max_parallel(h, tables[i], 8), 0);
  assert_int_equal(throttle_pause(h, "ws1"), 0);
  struct kid k[8];
  pid_t pid[8];
  for (int i = 0; i < 8; i++) {
    int tbl = i < 4 ? i : 7 - i;
    throttle_class_t cls =
        i < 4 ? THROTTLE_CLASS_BACKFILL : THROTTLE_CLASS_LIVE;
    k[i] = (struct kid){fx, b, tbl + (i < 4 ? 0 : NTABLES), cls};
    pid[i] = th_spawn(fx, child_enters, &k[i]);
    th_wait_field(h, tables[tbl],
                  cls == THROTTLE_CLASS_LIVE ? THROTTLE_FIELD_WAITING_LIVE
                                             : THROTTLE_FIELD_WAITING_BACKFILL,
                  1, 5000); /* registered: its arrival is fixed */
  }
  assert_int_equal(throttle_resume(h, "ws1"), 0);
  for (int i = 0; i < 8; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS + 5000);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(b->rc[k[i].i], 0);
    int want = i < 4 ? 4 + i : i - 4; /* live first, each by arrival */
    assert_int_equal(b->order[k[i].i], want);
  }
  assert_true(atomic_load(&b->max_in_flight) <= 1);
  munmap(b, sizeof *b);
}

/* A rate on "ws1" is a budget for every table beneath: 2 per second with
 * a burst of 2, over 4 tables, admits the third no sooner than 500 ms
 * after the first (less what the first took to note its time). */
static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void test_scope_pool_rate_is_a_budget(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct board *b = board_new();
  b->probe_outcome = THROTTLE_OUTCOME_OK;
  assert_int_equal(throttle_set_rate(h, "ws1", 2, 1000), 0);
  struct kid k[NTABLES];
  pid_t pid[NTABLES];
  spawn_all(fx, b, k, child_enters, pid);
  reap_all(fx, pid);
  uint64_t at[NTABLES];
  for (int i = 0; i < NTABLES; i++) {
    assert_int_equal(b->rc[i], 0);
    at[i] = b->admit_ns[i];
  }
  qsort(at, NTABLES, sizeof at[0], cmp_u64);
  assert_true(at[2] >= at[0] + 400 * NS_PER_MS);
  assert_true(at[3] >= at[0] + 900 * NS_PER_MS);
  munmap(b, sizeof *b);
}

/* A table new to a workspace starts from the cap its siblings learned;
 * a table of another workspace does not. */
static void test_scope_new_key_starts_from_siblings(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "ws1/a", 1), 0);
  assert_int_equal(throttle_backoff(h, "ws1/b", 1), 0);
  int64_t cold = th_field(h, "ws1/a", THROTTLE_FIELD_CAP);
  struct throttle__rec *ra = th_rec(h, "ws1/a"), *rb = th_rec(h, "ws1/b");
  ra->auto_cap = 3; /* as a refusal with 3 in flight teaches it */
  ra->auto_learned_ns = th_now_ns();
  rb->auto_cap = 2; /* learned before a's */
  rb->auto_learned_ns = ra->auto_learned_ns - 1000;
  assert_int_equal(throttle_backoff(h, "ws1/new", 1), 0);
  assert_int_equal(th_field(h, "ws1/new", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(throttle_backoff(h, "ws2/new", 1), 0);
  assert_int_equal(th_field(h, "ws2/new", THROTTLE_FIELD_CAP), cold);
  ra->auto_cap = 5; /* a key that exists keeps its own */
  assert_int_equal(throttle_backoff(h, "ws1/new", 1), 0);
  assert_int_equal(th_field(h, "ws1/new", THROTTLE_FIELD_CAP), 3);
}

/* ---- a grant cut short by a crash --------------------------------------- */

struct crash_kid {
  struct th_fx *fx;
  int out, in; /* words to the parent, its go-ahead */
  int armed;   /* dies at gate-mid-grant, handing ws1/orders on */
};

/* Holds "ws1/orders" (cap 1), says so, waits for the go-ahead, leaves
 * (armed: killed while granting the slot to the waiting process). */
static int kid_holds_orders(void *p) {
  struct crash_kid *k = p;
  throttle_t *h = child_handle(k->fx, 0);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, "ws1/orders", THROTTLE_CLASS_LIVE,
                                HANG_GUARD_MS, &t) == 0);
  th_send_u64(k->out, 1);
  uint64_t go;
  TH_CHILD_CHECK(th_recv_u64(k->in, &go) == 0);
  if (k->armed)
    TH_CHILD_CHECK(setenv("THROTTLE_CRASH_AT", "gate-mid-grant", 1) == 0);
  throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
  TH_CHILD_CHECK(!k->armed); /* the crash point was not reached */
  throttle_close(h);
  return 0;
}

/* A pool of 2 over "ws1"; "ws1/orders" has a cap of 1.  A holds orders, B
 * waits for it; A is killed while its leave grants B the key's slot,
 * before B's place in the pool is taken.  After the repair the pool
 * counts B: beside it one more admission beneath, not two. */
static void test_scope_pool_place_of_a_grant_cut_short(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(h, "ws1", 2), 0);
  assert_int_equal(throttle_set_max_parallel(h, "ws1/orders", 1), 0);
  throttle_ticket_t *t = NULL, *t2 = NULL;
  assert_int_equal(try_in(h, "ws1/items", &t), 0); /* "ws1" answered: */
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  t = NULL; /* A's admission is no probe of a cold scope */
  int up[2], down[2], bup[2], bdown[2];
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  assert_int_equal(pipe(bup), 0);
  assert_int_equal(pipe(bdown), 0);
  struct crash_kid a = {fx, up[1], down[0], 1}, b = {fx, bup[1], bdown[0], 0};
  pid_t ap = th_spawn(fx, kid_holds_orders, &a);
  uint64_t word;
  assert_int_equal(th_recv_u64(up[0], &word), 0);
  pid_t bp = th_spawn(fx, kid_holds_orders, &b);
  th_wait_field(h, "ws1/orders", THROTTLE_FIELD_WAITING_LIVE, 1, 5000);
  th_send_u64(down[1], 1); /* A leaves, and dies granting B */
  th_reap_killed(fx, ap, HANG_GUARD_MS);
  assert_int_equal(th_recv_u64(bup[0], &word), 0); /* B is in */
  /* A's own place goes with A (reaped once someone waits); then one
   * admission fits beside B, and no second one */
  uint64_t m0 = th_mono_ms();
  while (throttle_try_enter(h, "ws1/items", THROTTLE_CLASS_LIVE, &t, NULL) !=
             0 &&
         th_mono_ms() - m0 < 5000)
    th_sleep_ms(20);
  assert_non_null(t);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 2);
  assert_int_equal(
      throttle_try_enter(h, "ws1/users", THROTTLE_CLASS_LIVE, &t2, NULL),
      THROTTLE_EWOULDBLOCK);
  th_send_u64(bdown[1], 1); /* B leaves: its place goes with it */
  th_reap_ok(fx, bp, HANG_GUARD_MS);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
  int fds[] = {up[0], up[1], down[0], down[1], bup[0], bup[1], bdown[0],
               bdown[1]};
  for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
    close(fds[i]);
}

#ifndef TH_SCOPE_NO_MAIN
#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_scope_backoff_holds_waits_beneath),
      T(test_scope_backoff_holds_admissions_beneath),
      T(test_scope_one_probe_for_the_scope),
      T(test_scope_probe_refused_again_holds_the_scope),
      T(test_scope_cold_scope_sends_one_first_request),
      T(test_scope_cold_scope_refused_holds_its_retry_after),
      T(test_scope_cold_scope_opens_on_any_answer),
      T(test_scope_cold_hold_is_bounded),
      T(test_scope_cold_hold_bounds_every_wait),
      T(test_scope_cold_rule_only_where_signals_go),
      T(test_scope_dead_probe_is_reclaimed),
      T(test_scope_pause_holds_every_key_until_resume),
      T(test_scope_cancel_reaches_every_key),
      T(test_scope_clear_wakes_keys_beneath),
      T(test_scope_commands_reach_keys_without_scope_record),
      T(test_scope_signals_go_where_meant_by_default),
      T(test_scope_publish_level_is_configurable),
      T(test_scope_open_path_sees_later_scope_backoff),
      T(test_scope_admission_sees_later_scope_changes),
      T(test_scope_try_enter_hint_counts_scope_backoff),
      T(test_scope_pool_caps_the_sum),
      T(test_scope_pool_fifo_across_tables_live_first),
      T(test_scope_pool_rate_is_a_budget),
      T(test_scope_new_key_starts_from_siblings),
      T(test_scope_pool_place_of_a_grant_cut_short),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
