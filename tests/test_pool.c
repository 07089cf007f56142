/* SPDX-License-Identifier: MIT */
/*
 * test_pool.c — a pool's turn (scope.c): which waiters of the keys beneath
 * a capped scope hold the next place, and what the place count starts
 * from.  A waiter that is gone (killed, or silent past its lease) and a
 * waiter that cannot go for a reason of its own (its key's or a nested
 * scope's pause, back-off or probe, a nested pool that is full) must not
 * hold a place that another key beneath could take; a cap set on a scope
 * with admissions already in flight beneath counts them.  Real processes
 * (fork, kill -9); no timing assertions, only "admitted" or "not admitted".
 *
 * test_redis_pool.c runs these bodies again on the Redis backend: it
 * defines TH_POOL_NO_MAIN before it includes this file.
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
#include <unistd.h>

#define HANG_GUARD_MS 20000
/* How long a child waits for admission: ample on a loaded machine for an
 * admission that is due, so a timeout means it was held. */
#define ADMIT_MS 10000

static struct th_fx *fx_of(void **state) { return *state; }

struct kid {
  struct th_fx *fx;
  const char *key;
  int up; /* the parent hears "admitted" (1) or the error (2 + -rc) */
  uint64_t timeout_ms; /* ADMIT_MS unless set */
  int go;              /* > 0: admitted, hold until a word comes on it */
};

/* Enter key (live, ADMIT_MS), tell the parent, (hold,) leave OK. */
static int kid_enters(void *p) {
  struct kid *k = p;
  throttle_close(k->fx->h);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(k->fx->cfg, &h) == 0);
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, k->key, THROTTLE_CLASS_LIVE,
                          k->timeout_ms ? k->timeout_ms : ADMIT_MS, &t);
  th_send_u64(k->up, rc == 0 ? 1 : (uint64_t)(2 - rc));
  uint64_t word;
  if (rc == 0 && k->go > 0)
    TH_CHILD_CHECK(th_recv_u64(k->go, &word) == 0);
  if (rc == 0)
    TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(h);
  return 0;
}

/* A child queued on key: spawned, then seen waiting in its slot. */
static pid_t queue_kid(struct th_fx *fx, struct kid *k, const char *key,
                       int up) {
  *k = (struct kid){fx, key, up, k->timeout_ms, 0};
  pid_t pid = th_spawn(fx, kid_enters, k);
  th_wait_field(fx->h, key, THROTTLE_FIELD_WAITING_LIVE, 1, HANG_GUARD_MS);
  return pid;
}

/* The scope answered once (an admission beneath left OK), so that no
 * cold-scope first request holds the keys beneath (scope.c). */
static void answer(throttle_t *h, const char *key) {
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

static throttle_ticket_t *must_enter(throttle_t *h, const char *key) {
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  return t;
}

/* ---- a waiter that is gone -------------------------------------------- */

/* Pool "ws" of 1, held by the parent on ws/c.  B queues on ws/b, then A on
 * ws/a; B is killed.  When the parent leaves, A takes the place: B's
 * waiting slot, older than A's, is judged by evidence (its process is
 * gone), not counted as a turn that nobody will ever take. */
static void test_pool_dead_waiter_of_a_sibling_is_skipped(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  answer(h, "ws/c");
  assert_int_equal(throttle_set_max_parallel(h, "ws", 1), 0);
  throttle_ticket_t *held = must_enter(h, "ws/c");
  int up[2];
  assert_int_equal(pipe(up), 0);
  struct kid b = {0}, a = {0};
  pid_t bp = queue_kid(fx, &b, "ws/b", up[1]);
  pid_t ap = queue_kid(fx, &a, "ws/a", up[1]);
  close(up[1]); /* the children's: a child gone unheard reads as EOF */
  assert_int_equal(kill(bp, SIGKILL), 0);
  th_reap_killed(fx, bp, HANG_GUARD_MS);
  assert_int_equal(throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0), 0);
  uint64_t word = 0;
  assert_int_equal(th_recv_u64(up[0], &word), 0);
  assert_int_equal(word, 1); /* A admitted, not timed out */
  th_reap_ok(fx, ap, HANG_GUARD_MS);
  close(up[0]);
}

/* A waiter whose process cannot be judged (another PID namespace) counts
 * until its lease lapses, as a holder does: a waiting slot forged on ws/b
 * with a foreign namespace and a short lease holds the pool's turn only
 * that long; then A, queued behind it on ws/a, goes. */
static void test_pool_unjudged_waiter_counts_until_its_lease(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  answer(h, "ws/c");
  answer(h, "ws/b"); /* ws/b's record, with a slot to forge */
  assert_int_equal(throttle_set_max_parallel(h, "ws", 1), 0);
  throttle_ticket_t *held = must_enter(h, "ws/c");
  struct throttle__rec *rb = th_rec(h, "ws/b");
  struct throttle__slot *q = &rb->slot[5];
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  q->pid = 1; /* alive here, but not ours to judge */
  q->pidns = 1; /* no real namespace: never this process's */
  q->start = 0;
  q->ticket = 1; /* older than every real arrival */
  q->cls = THROTTLE_CLASS_LIVE;
  q->lease_ms = 300;
  q->since_ns = th_now_ns();
  q->since_mono_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  __atomic_store_n(&q->state, THROTTLE__SLOT_WAITING, __ATOMIC_RELEASE);
  int up[2];
  assert_int_equal(pipe(up), 0);
  struct kid a = {0};
  pid_t ap = queue_kid(fx, &a, "ws/a", up[1]);
  close(up[1]);
  assert_int_equal(throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0), 0);
  uint64_t word = 0;
  assert_int_equal(th_recv_u64(up[0], &word), 0);
  assert_int_equal(word, 1);
  th_reap_ok(fx, ap, HANG_GUARD_MS);
  close(up[0]);
}

/* ---- a waiter that cannot go for a reason of its own ------------------ */

enum { HELD_PAUSE, HELD_BACKOFF, HELD_KEY_BACKOFF, HELD_NESTED_FULL,
       HELD_PROBE, HELD_KINDS };
static const char *const held_name[HELD_KINDS] = {
    "pause", "back-off", "key back-off", "nested full pool", "probe out"};

/* A back-off that outlasts A's wait, within O's. */
#define HELD_MS 30000

/* Pool "ws" of 2, full: the parent holds a place on ws/c, and one on
 * ws/x/u (ws/x a pool of 1; or its probe) or on ws/d.  O queues on
 * ws/x/t, held by its own reason; then A on ws/a.  The parent leaves
 * ws/c: A takes the place while O stays held (on a turn O cannot take, A
 * would wait for as long as O's reason lasts). */
static void held_round(void **state, int kind) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  printf("a waiter held by: %s\n", held_name[kind]);
  assert_int_equal(throttle_pause(h, "ws/x"), 0); /* a record, then */
  assert_int_equal(throttle_resume(h, "ws/x"), 0);
  answer(h, "ws/c"); /* ws and ws/x answered */
  answer(h, "ws/x/u");
  assert_int_equal(throttle_set_max_parallel(h, "ws", 2), 0);
  throttle_ticket_t *inner = NULL;
  switch (kind) {
  case HELD_PAUSE:
    assert_int_equal(throttle_pause(h, "ws/x"), 0);
    inner = must_enter(h, "ws/d");
    break;
  case HELD_BACKOFF:
    assert_int_equal(throttle_backoff(h, "ws/x", HELD_MS), 0);
    inner = must_enter(h, "ws/d");
    break;
  case HELD_KEY_BACKOFF:
    assert_int_equal(throttle_backoff(h, "ws/x/t", HELD_MS), 0);
    inner = must_enter(h, "ws/d");
    break;
  case HELD_NESTED_FULL:
    assert_int_equal(throttle_set_max_parallel(h, "ws/x", 1), 0);
    inner = must_enter(h, "ws/x/u");
    break;
  case HELD_PROBE:
    /* ws/x in an episode whose probe (the parent's ws/x/u) is out */
    assert_int_equal(throttle_backoff(h, "ws/x", 1), 0);
    for (uint64_t m0 = th_mono_ms();
         th_remaining(h, "ws/x") > 0 && th_mono_ms() - m0 < 5000;)
      th_sleep_ms(5);
    inner = must_enter(h, "ws/x/u");
    assert_int_equal(th_field(h, "ws/x", THROTTLE_FIELD_PROBE_OUT), 1);
    break;
  }
  throttle_ticket_t *held = must_enter(h, "ws/c");
  int oup[2], up[2];
  assert_int_equal(pipe(oup), 0);
  assert_int_equal(pipe(up), 0);
  struct kid o = {.timeout_ms = 2 * HELD_MS}, a = {0};
  pid_t op = queue_kid(fx, &o, "ws/x/t", oup[1]);
  pid_t ap = queue_kid(fx, &a, "ws/a", up[1]);
  close(oup[1]);
  close(up[1]);
  assert_int_equal(throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0), 0);
  uint64_t word = 0;
  assert_int_equal(th_recv_u64(up[0], &word), 0);
  assert_int_equal(word, 1); /* A admitted while O is held */
  th_reap_ok(fx, ap, HANG_GUARD_MS);
  assert_int_equal(th_field(h, "ws/x/t", THROTTLE_FIELD_IN_FLIGHT), 0);
  /* O's own reason ends: O goes too */
  switch (kind) {
  case HELD_PAUSE:
    assert_int_equal(throttle_resume(h, "ws/x"), 0);
    break;
  case HELD_BACKOFF:
    assert_int_equal(throttle_clear(h, "ws/x"), 0);
    break;
  case HELD_KEY_BACKOFF:
    assert_int_equal(throttle_clear(h, "ws/x/t"), 0);
    break;
  default:
    break;
  }
  if (inner != NULL)
    assert_int_equal(throttle_leave(h, inner, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_recv_u64(oup[0], &word), 0);
  assert_int_equal(word, 1);
  th_reap_ok(fx, op, HANG_GUARD_MS);
  close(oup[0]);
  close(up[0]);
}

static void test_pool_paused_subscope_holds_no_turn(void **state) {
  held_round(state, HELD_PAUSE);
}
static void test_pool_backed_off_subscope_holds_no_turn(void **state) {
  held_round(state, HELD_BACKOFF);
}
static void test_pool_backed_off_key_holds_no_turn(void **state) {
  held_round(state, HELD_KEY_BACKOFF);
}
static void test_pool_full_nested_pool_holds_no_turn(void **state) {
  held_round(state, HELD_NESTED_FULL);
}
static void test_pool_probe_out_on_subscope_holds_no_turn(void **state) {
  held_round(state, HELD_PROBE);
}

/* ---- a cap set with admissions in flight ------------------------------ */

/* 4 admissions in flight beneath "ws" (two keys), then "ws" gets a cap of
 * 2: nothing more is admitted beneath until fewer than 2 are in flight,
 * and then one at a time.  Lowering the cap of a pool works the same. */
static void test_pool_new_cap_counts_what_is_in_flight(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  answer(h, "ws/a");
  assert_int_equal(throttle_set_max_parallel(h, "ws/a", 8), 0);
  assert_int_equal(throttle_set_max_parallel(h, "ws/b", 8), 0);
  throttle_ticket_t *t[4], *x = NULL;
  for (int i = 0; i < 4; i++)
    t[i] = must_enter(h, i < 2 ? "ws/a" : "ws/b");
  assert_int_equal(throttle_set_max_parallel(h, "ws", 2), 0);
  /* at once on the segment; on Redis within a holder's heartbeat */
  th_wait_field(h, "ws", THROTTLE_FIELD_IN_FLIGHT, 4, HANG_GUARD_MS);
  assert_int_equal(throttle_try_enter(h, "ws/c", THROTTLE_CLASS_LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(h, t[2], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(h, "ws/c", THROTTLE_CLASS_LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK); /* 2 in flight: at the cap */
  assert_int_equal(throttle_leave(h, t[1], THROTTLE_OUTCOME_OK, 0), 0);
  x = must_enter(h, "ws/c");
  throttle_ticket_t *y = NULL;
  assert_int_equal(throttle_try_enter(h, "ws/a", THROTTLE_CLASS_LIVE, &y, NULL),
                   THROTTLE_EWOULDBLOCK);
  /* lowered to 1 with 2 in flight: none until both are gone */
  assert_int_equal(throttle_set_max_parallel(h, "ws", 1), 0);
  assert_int_equal(throttle_leave(h, t[3], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(h, "ws/a", THROTTLE_CLASS_LIVE, &y, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(h, x, THROTTLE_OUTCOME_OK, 0), 0);
  y = must_enter(h, "ws/a");
  assert_int_equal(throttle_leave(h, y, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(h, "ws", THROTTLE_FIELD_IN_FLIGHT), 0);
}

/* A holder of another process already beneath a scope when it becomes a
 * pool keeps its place until it leaves, and its leave hands it on. */
static void test_pool_new_cap_counts_other_processes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  answer(h, "ws/a");
  int up[2], down[2];
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  struct kid k = {fx, "ws/a", up[1], 0, down[0]};
  pid_t pid = th_spawn(fx, kid_enters, &k);
  close(up[1]);
  uint64_t word;
  assert_int_equal(th_recv_u64(up[0], &word), 0); /* it holds ws/a */
  assert_int_equal(throttle_set_max_parallel(h, "ws", 1), 0);
  /* at once on the segment; on Redis within the holder's heartbeat */
  th_wait_field(h, "ws", THROTTLE_FIELD_IN_FLIGHT, 1, HANG_GUARD_MS);
  throttle_ticket_t *x = NULL;
  assert_int_equal(throttle_try_enter(h, "ws/b", THROTTLE_CLASS_LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK);
  th_send_u64(down[1], 1); /* it leaves */
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  x = must_enter(h, "ws/b");
  assert_int_equal(throttle_leave(h, x, THROTTLE_OUTCOME_OK, 0), 0);
  close(up[0]);
  close(down[0]);
  close(down[1]);
}

/* ---- kill -9 under a pool ---------------------------------------------- */

#define KW 12 /* workers */
#define POOL_CAP 2
struct killboard {
  _Atomic int holding[KW]; /* set after the grant, cleared before the leave */
  _Atomic int over;        /* a worker saw more than POOL_CAP holding */
  _Atomic long admitted;
};

struct kworker {
  struct th_fx *fx;
  struct killboard *b;
  int i;
};

static int kworker_main(void *p) {
  static const char *const keys[] = {"ws/a", "ws/b", "ws/c", "ws/d"};
  struct kworker *w = p;
  throttle_close(w->fx->h);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(w->fx->cfg, &h) == 0);
  for (unsigned n = (unsigned)w->i;; n++) {
    throttle_ticket_t *t = NULL;
    if (throttle_enter(h, keys[n % 4], THROTTLE_CLASS_LIVE, 2000, &t) != 0)
      continue;
    atomic_store(&w->b->holding[w->i], 1);
    int at_once = 0;
    for (int k = 0; k < KW; k++)
      at_once += atomic_load(&w->b->holding[k]);
    if (at_once > POOL_CAP)
      atomic_fetch_add(&w->b->over, 1);
    atomic_fetch_add(&w->b->admitted, 1);
    th_sleep_ms(2);
    atomic_store(&w->b->holding[w->i], 0);
    throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
  }
  return 0;
}

/* A pool of 2 over 4 keys, 12 workers entering and leaving, one killed
 * with -9 every 10 ms (at any instant: waiting, holding, inside the
 * library) and replaced, for 2 s: never more than 2 hold at once, and
 * afterwards the pool is not blocked (a fresh caller of each key goes).
 * A worker's mark is cleared before it is killed, so a mark counts only
 * admissions the pool still holds. */
static void test_pool_holds_under_kill_9(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  answer(h, "ws/a");
  assert_int_equal(throttle_set_max_parallel(h, "ws", POOL_CAP), 0);
  struct killboard *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(b != MAP_FAILED);
  memset(b, 0, sizeof *b);
  struct kworker w[KW];
  pid_t pid[KW];
  for (int i = 0; i < KW; i++) {
    w[i] = (struct kworker){fx, b, i};
    pid[i] = th_spawn(fx, kworker_main, &w[i]);
  }
  unsigned seed = 20261203;
  printf("seed %u\n", seed);
  int kills = 0;
  for (uint64_t m0 = th_mono_ms(); th_mono_ms() - m0 < 2000; kills++) {
    int i = (int)(rand_r(&seed) % KW);
    atomic_store(&b->holding[i], 0);
    kill(pid[i], SIGKILL);
    th_reap(fx, pid[i], HANG_GUARD_MS);
    pid[i] = th_spawn(fx, kworker_main, &w[i]);
    th_sleep_ms(10);
  }
  for (int i = 0; i < KW; i++) {
    atomic_store(&b->holding[i], 0);
    kill(pid[i], SIGKILL);
    th_reap(fx, pid[i], HANG_GUARD_MS);
  }
  printf("%d kills, %ld admissions, %d seen over the cap\n", kills,
         atomic_load(&b->admitted), atomic_load(&b->over));
  assert_int_equal(atomic_load(&b->over), 0);
  static const char *const keys[] = {"ws/a", "ws/b", "ws/c", "ws/d"};
  for (int k = 0; k < 4; k++) {
    throttle_ticket_t *t = NULL;
    assert_int_equal(
        throttle_enter(h, keys[k], THROTTLE_CLASS_LIVE, HANG_GUARD_MS, &t), 0);
    assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  }
  munmap(b, sizeof *b);
}

#ifndef TH_POOL_NO_MAIN
#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_pool_dead_waiter_of_a_sibling_is_skipped),
      T(test_pool_unjudged_waiter_counts_until_its_lease),
      T(test_pool_paused_subscope_holds_no_turn),
      T(test_pool_backed_off_subscope_holds_no_turn),
      T(test_pool_backed_off_key_holds_no_turn),
      T(test_pool_full_nested_pool_holds_no_turn),
      T(test_pool_probe_out_on_subscope_holds_no_turn),
      T(test_pool_new_cap_counts_what_is_in_flight),
      T(test_pool_new_cap_counts_other_processes),
      T(test_pool_holds_under_kill_9),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif
