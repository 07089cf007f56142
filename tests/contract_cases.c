/* SPDX-License-Identifier: MIT */
/*
 * contract_cases.c — the contract cases, written once for every backend
 * (see contract.h).  Each case says which rule it pins; the two programs
 * tests/test_contract_shm.c and tests/test_contract_redis.c run the same
 * table, so a rule changed in the segment's C (gate*.c, scope.c) and not
 * in the Redis scripts (the scripts in libthrottle/redis/), or the other way round,
 * fails one of them.
 *
 * Other processes are real (fork, kill -9), on the two "hosts" of the
 * fixture (child i on host i % 2 unless said otherwise).  What they
 * observe is counted outside the library, in an anonymous shared mapping.
 * The one time assertion is "not before the not-before", on the library's
 * clock (CLOCK_BOOTTIME; Redis's clock is read in whole milliseconds, the
 * backend's clock_ms_rounding); the rest are waits on conditions bounded
 * by hang guards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "contract.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_MS 20000 /* hang guard of one wait; the lease is 10 min */
#define CT_MAXKIDS 16
#define R_MS 50 /* the Retry-After of the learned cap's refusals */

#define LIVE THROTTLE_CLASS_LIVE
#define BACKFILL THROTTLE_CLASS_BACKFILL
#define OK THROTTLE_OUTCOME_OK
#define LOCKED THROTTLE_OUTCOME_LOCKED

/* ---- the fixture ------------------------------------------------------ */

static const struct ct_backend *the_backend;

/* Handles the parent opened besides fx->h, closed by the teardown. */
#define CT_MAXOPEN 6
static throttle_t *opened[CT_MAXOPEN];
static int nopened;

/* A handle of the parent on host i (0 is fx->h). */
static throttle_t *ct_open(struct ct_fx *c, int host) {
  if (host == 0)
    return c->fx->h != NULL ? c->fx->h : th_open(c->fx);
  assert_true(nopened < CT_MAXOPEN);
  throttle_t *h = NULL;
  int rc = throttle_open(c->host[host], &h);
  if (h != NULL)
    opened[nopened++] = h;
  if (rc != 0)
    fail_msg("open host %d: %s: %s", host, throttle_err_name(rc),
             throttle_errmsg(h));
  return h;
}

/* A handle of the parent opened from cfg (freed here); the teardown
 * closes it. */
static throttle_t *ct_open_cfg(throttle_config_t *cfg) {
  assert_non_null(cfg);
  assert_true(nopened < CT_MAXOPEN);
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  if (h != NULL)
    opened[nopened++] = h;
  if (rc != 0)
    fail_msg("open: %s: %s", throttle_err_name(rc), throttle_errmsg(h));
  return h;
}

/* A child's own handle on host i (never the parent's inherited one: a
 * backend's thread may have held its lock at the fork), or NULL. */
static throttle_t *ct_child_open(struct ct_fx *c, int host) {
  throttle_t *h = NULL;
  if (throttle_open(c->host[host], &h) != 0) {
    fprintf(stderr, "child %ld: open host %d: %s\n", (long)getpid(), host,
            throttle_errmsg(h));
    throttle_close(h);
    return NULL;
  }
  return h;
}

/* The backend's clock: a not-before of ms after t0_ns has passed by now. */
static int not_before_passed(uint64_t t0_ns, uint64_t ms, uint64_t at_ns) {
  uint64_t round = the_backend->clock_ms_rounding;
  return at_ns + round * NS_PER_MS >= t0_ns + ms * NS_PER_MS;
}

static void use_short_liveness(void) {
  if (the_backend->liveness_env != NULL)
    putenv((char *)the_backend->liveness_env);
}

/* ---- what children observe -------------------------------------------- */

struct board {
  _Atomic int in_flight, max_in_flight;
  _Atomic int admitted;
  _Atomic int probes, probe_holding, admitted_during_probe;
  _Atomic int server_refusals; /* stand-in server: probes still refused */
  _Atomic int rank[CT_MAXKIDS]; /* admission rank, -1 none */
  _Atomic int rc[CT_MAXKIDS];
  _Atomic uint64_t at_ns[CT_MAXKIDS]; /* admitted (or woken) */
  _Atomic int ready[CT_MAXKIDS];      /* holding (for kill -9) */
};

static struct board *board_new(void) {
  struct board *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(b != MAP_FAILED);
  memset(b, 0, sizeof *b);
  for (int i = 0; i < CT_MAXKIDS; i++) {
    b->rank[i] = -1;
    b->rc[i] = -1000;
  }
  return b;
}

static void board_free(struct board *b) { munmap(b, sizeof *b); }

enum kid_mode {
  KID_ENTER, /* enter, hold, leave, rounds times */
  KID_WAIT,  /* throttle_wait once */
  KID_HOLD,  /* enter, say ready, wait to be killed */
};

struct kid {
  struct ct_fx *c;
  struct board *b;
  int i;    /* its place on the board */
  int host; /* 0 or 1 */
  const char *key;
  enum kid_mode mode;
  throttle_class_t cls;
  int rounds, hold_ms;
  uint64_t timeout_ms;
  throttle_outcome_t outcome; /* reported on leave */
};

static int kid_main(void *p) {
  struct kid *k = p;
  struct board *b = k->b;
  throttle_t *h = ct_child_open(k->c, k->host);
  TH_CHILD_CHECK(h != NULL);
  if (k->mode == KID_WAIT) {
    b->rc[k->i] = throttle_wait(h, k->key, k->timeout_ms);
    b->at_ns[k->i] = th_now_ns();
    throttle_close(h);
    return 0;
  }
  for (int r = 0; r < (k->rounds > 0 ? k->rounds : 1); r++) {
    throttle_ticket_t *t = NULL;
    int rc = throttle_enter(h, k->key, k->cls, k->timeout_ms, &t);
    b->rc[k->i] = rc;
    if (rc != 0)
      break;
    b->at_ns[k->i] = th_now_ns();
    int probe = throttle_ticket_is_probe(t);
    if (atomic_load(&b->probe_holding))
      atomic_fetch_add(&b->admitted_during_probe, 1);
    if (probe) {
      atomic_store(&b->probe_holding, 1);
      atomic_fetch_add(&b->probes, 1);
    }
    b->rank[k->i] = atomic_fetch_add(&b->admitted, 1);
    int n = atomic_fetch_add(&b->in_flight, 1) + 1;
    for (int m = atomic_load(&b->max_in_flight);
         n > m && !atomic_compare_exchange_weak(&b->max_in_flight, &m, n);)
      ;
    if (k->mode == KID_HOLD) {
      atomic_store(&b->ready[k->i], 1);
      for (;;)
        pause(); /* until kill -9 */
    }
    /* the stand-in server refuses the first probes it is told to */
    throttle_outcome_t o = k->outcome;
    if (probe && atomic_fetch_sub(&b->server_refusals, 1) > 0)
      o = LOCKED;
    if (k->hold_ms > 0)
      th_sleep_ms((unsigned)k->hold_ms);
    atomic_fetch_sub(&b->in_flight, 1);
    if (probe)
      atomic_store(&b->probe_holding, 0);
    TH_CHILD_CHECK(throttle_leave(h, t, o, o == LOCKED ? 200 : 0) == 0);
    if (o == LOCKED)
      r--; /* sent again, as a loader would */
  }
  throttle_close(h);
  return 0;
}

/* A child of the given mode on key, host i % 2, place i on the board. */
static struct kid kid_of(struct ct_fx *c, struct board *b, int i,
                         const char *key, enum kid_mode mode) {
  return (struct kid){c,    b,    i,    i % 2, key, mode, LIVE, 1, 0,
                      HANG_MS, OK};
}

static void reap_all(struct ct_fx *c, const pid_t *pid, int n) {
  for (int i = 0; i < n; i++)
    th_reap_ok(c->fx, pid[i], 3 * HANG_MS);
}

static int64_t field(throttle_t *h, const char *key, throttle_field_t f) {
  return th_field(h, key, f);
}

static void wait_field(throttle_t *h, const char *key, throttle_field_t f,
                       int64_t want) {
  th_wait_field(h, key, f, want, HANG_MS);
}

static void wait_ready(struct board *b, int i) {
  uint64_t t0 = th_mono_ms();
  while (!atomic_load(&b->ready[i]) && th_mono_ms() - t0 < HANG_MS)
    th_sleep_ms(5);
  assert_true(atomic_load(&b->ready[i]));
}

static throttle_ticket_t *in(throttle_t *h, const char *key,
                             throttle_class_t cls) {
  return th_enter(h, key, cls, HANG_MS);
}

#define out th_leave

/* One admission of key, answered OK: a cold scope above it has had its
 * first answer. */
static void warm(throttle_t *h, const char *key) {
  out(h, in(h, key, LIVE), OK, 0);
}

/* ---- I1: never early --------------------------------------------------- */

/* Rule: a not-before published on one host holds waits and admissions on
 * every host until it has passed; it only ever moves later. */
static void case_never_early_across_hosts(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  struct board *b = board_new();
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(b1, "nb", 400), 0);
  uint64_t left = th_remaining(a, "nb");
  assert_true(left > 0 && left <= 400);
  /* a shorter one does not shorten it */
  assert_int_equal(throttle_backoff(a, "nb", 1), 0);
  assert_true(th_remaining(b1, "nb") > 1 || th_remaining(b1, "nb") == 0);
  struct kid k[4];
  pid_t pid[4];
  for (int i = 0; i < 4; i++) {
    k[i] = kid_of(c, b, i, "nb", i < 2 ? KID_WAIT : KID_ENTER);
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  reap_all(c, pid, 4);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(b->rc[i], 0);
    if (!not_before_passed(t0, 400, b->at_ns[i]))
      fail_msg("child %d (host %d, %s) went %lld ns after the publish, "
               "before its 400 ms",
               i, i % 2, i < 2 ? "wait" : "enter",
               (long long)(b->at_ns[i] - t0));
  }
  board_free(b);
}

/* Rule: a back-off published while a caller sleeps holds it on (it
 * re-arms for the later time), on every host. */
static void case_later_backoff_holds_sleepers(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  struct board *b = board_new();
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(a, "ext", 1000), 0);
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, "ext", i == 0 ? KID_WAIT : KID_ENTER);
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  wait_field(a, "ext", THROTTLE_FIELD_WAITING_LIVE, 1); /* the enter */
  th_wait_sleeping(pid[0], 2000);
  uint64_t t1 = th_now_ns();
  assert_int_equal(throttle_backoff(b1, "ext", 1500), 0);
  /* Published before the first one passed, it holds both sleepers to
   * t1 + 1500 ms.  (On a machine so loaded that the first had passed by
   * then, a sleeper may have gone at its time: only that is checked.) */
  int in_time = th_now_ns() < t0 + 1000 * NS_PER_MS;
  reap_all(c, pid, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(b->rc[i], 0);
    assert_true(not_before_passed(t0, 1000, b->at_ns[i]));
    if (in_time && !not_before_passed(t1, 1500, b->at_ns[i]))
      fail_msg("child %d (host %d) went %lld ms after the second back-off "
               "of 1500 ms",
               i, i % 2, (long long)((b->at_ns[i] - t1) / NS_PER_MS));
  }
  if (!in_time)
    printf("the machine was too slow to publish the second back-off in "
           "time: only the first is checked\n");
  board_free(b);
}

/* ---- I2: right class --------------------------------------------------- */

/* Rule: what a leave publishes, per outcome.  LOCKED on the key (a
 * table's lock is the table's); RATE_LIMITED and UNAVAILABLE on the root
 * scope (the workspace is overloaded); PERMANENT, FAILED, ABANDONED and
 * OK publish nothing; a Retry-After of 0 is the default 5 s. */
static void case_outcome_classes_publish(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  static const struct {
    throttle_outcome_t o;
    int on_key, on_scope;
  } row[] = {
      {OK, 0, 0},
      {LOCKED, 1, 0},
      {THROTTLE_OUTCOME_RATE_LIMITED, 1, 1},
      {THROTTLE_OUTCOME_UNAVAILABLE, 1, 1},
      {THROTTLE_OUTCOME_PERMANENT, 0, 0},
      {THROTTLE_OUTCOME_FAILED, 0, 0},
      {THROTTLE_OUTCOME_ABANDONED, 0, 0},
  };
  for (size_t i = 0; i < sizeof row / sizeof row[0]; i++) {
    char key[64], sib[64];
    snprintf(key, sizeof key, "cls%zu/t", i);
    snprintf(sib, sizeof sib, "cls%zu/sibling", i);
    throttle_ticket_t *t = in(a, key, LIVE);
    out(a, t, row[i].o, TH_LONG_MS);
    uint64_t lk = th_remaining(b1, key), ls = th_remaining(b1, sib);
    if ((lk > TH_LONG_MS - 10000) != row[i].on_key ||
        (ls > TH_LONG_MS - 10000) != row[i].on_scope)
      fail_msg("outcome %d: key held %llu ms (want %s), its scope %llu ms "
               "(want %s)",
               (int)row[i].o, (unsigned long long)lk,
               row[i].on_key ? "held" : "open", (unsigned long long)ls,
               row[i].on_scope ? "held" : "open");
    if (!row[i].on_key)
      assert_int_equal(lk, 0);
    assert_int_equal(field(b1, key, THROTTLE_FIELD_LOCKED), row[i].o == LOCKED);
    assert_int_equal(field(b1, key, THROTTLE_FIELD_PERMANENT),
                     row[i].o == THROTTLE_OUTCOME_PERMANENT);
  }
  /* LOCKED with no Retry-After: the default 5 s */
  throttle_ticket_t *t = in(a, "cls-default", LIVE);
  out(a, t, LOCKED, 0);
  uint64_t left = th_remaining(b1, "cls-default");
  assert_true(left > 0 && left <= 5000);
}

/* Rule: where a transient answer is published is the handle's own
 * setting (key, root scope, or a prefix of n names), and only its own:
 * another host's handle keeps the defaults. */
static void case_publish_level_per_handle(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_set_publish_level(
                       a, THROTTLE_OUTCOME_RATE_LIMITED, THROTTLE_LEVEL_KEY),
                   0);
  assert_int_equal(throttle_set_publish_level(a, LOCKED, 2), 0);
  out(a, in(a, "pl1/t", LIVE), THROTTLE_OUTCOME_RATE_LIMITED, TH_LONG_MS);
  assert_true(th_remaining(b1, "pl1/t") > TH_LONG_MS - 10000);
  assert_int_equal(th_remaining(b1, "pl1/u"), 0); /* not on the scope */
  out(a, in(a, "pl2/x/t", LIVE), LOCKED, TH_LONG_MS);
  assert_true(th_remaining(b1, "pl2/x/u") > TH_LONG_MS - 10000); /* pl2/x */
  assert_int_equal(th_remaining(b1, "pl2/y"), 0);
  /* the other host's handle: 429 on the root scope, as by default */
  out(b1, in(b1, "pl3/t", LIVE), THROTTLE_OUTCOME_RATE_LIMITED, TH_LONG_MS);
  assert_true(th_remaining(a, "pl3/u") > TH_LONG_MS - 10000);
}

/* ---- I3: no herd ------------------------------------------------------- */

/* Rule: when a not-before passes, one admission is the probe; nobody else
 * is admitted until its answer; a refused probe starts the next episode
 * with one probe again; OK ends the episode. */
static void case_one_probe_per_episode(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  atomic_store(&b->server_refusals, 1); /* the first probe is refused */
  assert_int_equal(throttle_set_max_parallel(a, "pr", 4), 0);
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(a, "pr", 300), 0);
  struct kid k[6];
  pid_t pid[6];
  for (int i = 0; i < 6; i++) {
    k[i] = kid_of(c, b, i, "pr", KID_ENTER);
    k[i].hold_ms = 30;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  reap_all(c, pid, 6);
  for (int i = 0; i < 6; i++) {
    assert_int_equal(b->rc[i], 0);
    /* the first episode's 300 ms, then the refused probe's 200 ms */
    assert_true(not_before_passed(t0, 500, b->at_ns[i]));
  }
  assert_int_equal(atomic_load(&b->admitted), 7); /* 6 + the retry */
  assert_int_equal(atomic_load(&b->probes), 2);
  assert_int_equal(atomic_load(&b->admitted_during_probe), 0);
  assert_int_equal(field(a, "pr", THROTTLE_FIELD_PROBES), 2);
  assert_int_equal(field(a, "pr", THROTTLE_FIELD_LOCKED), 1);
  assert_int_equal(field(a, "pr", THROTTLE_FIELD_LOCK_EPISODE), 0);
  board_free(b);
}

/* Rule: only an OK from the probe ends a lock episode; a probe answered
 * FAILED, PERMANENT or ABANDONED hands the probe to the next admission,
 * whichever host it is on. */
static void case_only_ok_ends_an_episode(struct ct_fx *c) {
  throttle_t *h[2] = {ct_open(c, 0), ct_open(c, 1)};
  assert_int_equal(throttle_backoff(h[0], "ep", 1), 0);
  assert_int_equal(throttle_wait(h[1], "ep", HANG_MS), 0);
  /* h[0]'s segment keeps its copy of the back-off on this host's clock:
   * an admission the backend grants before that copy lapses is handed
   * back and granted again (api/backend.c enter), a probe counted twice;
   * a backend that answers within the millisecond met it at times */
  th_sleep_ms(5);
  static const throttle_outcome_t answers[] = {
      THROTTLE_OUTCOME_FAILED, THROTTLE_OUTCOME_PERMANENT,
      THROTTLE_OUTCOME_ABANDONED, OK};
  for (int i = 0; i < 4; i++) {
    throttle_t *on = h[i % 2];
    throttle_ticket_t *t = in(on, "ep", LIVE);
    assert_int_equal(throttle_ticket_is_probe(t), 1);
    assert_int_equal(field(h[1 - i % 2], "ep", THROTTLE_FIELD_PROBE_OUT), 1);
    out(on, t, answers[i], 0);
    assert_int_equal(field(h[1 - i % 2], "ep", THROTTLE_FIELD_LOCK_EPISODE),
                     answers[i] != OK);
  }
  throttle_ticket_t *t = in(h[1], "ep", LIVE);
  assert_int_equal(throttle_ticket_is_probe(t), 0);
  out(h[1], t, OK, 0);
  assert_int_equal(field(h[0], "ep", THROTTLE_FIELD_PROBES), 4);
}

/* Rule: a probe killed while it holds is replaced by the next waiter,
 * which goes as the probe (the episode is still unanswered). */
static void case_dead_probe_replaced(struct ct_fx *c) {
  use_short_liveness();
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  assert_int_equal(throttle_set_max_parallel(a, "dp", 4), 0);
  assert_int_equal(throttle_backoff(a, "dp", 1), 0);
  struct kid k = kid_of(c, b, 1, "dp", KID_HOLD);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_ready(b, 1);
  assert_int_equal(atomic_load(&b->probes), 1);
  assert_int_equal(field(a, "dp", THROTTLE_FIELD_PROBE_OUT), 1);
  kill(pid, SIGKILL);
  th_reap_killed(c->fx, pid, HANG_MS);
  throttle_ticket_t *t = in(a, "dp", LIVE);
  assert_int_equal(throttle_ticket_is_probe(t), 1);
  assert_true(field(a, "dp", THROTTLE_FIELD_RECLAIMS) >= 1);
  out(a, t, OK, 0);
  assert_int_equal(field(a, "dp", THROTTLE_FIELD_LOCK_EPISODE), 0);
  board_free(b);
}

/* Rule (I3 on scopes): when a scope's back-off passes, one admission
 * beneath it, on any key and any host, goes as the scope's probe; the
 * others wait for its answer. */
static void case_scope_one_probe(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(a, "sp", 300), 0);
  static const char *const keys[] = {"sp/a", "sp/b", "sp/c", "sp/d"};
  struct kid k[4];
  pid_t pid[4];
  for (int i = 0; i < 4; i++) {
    k[i] = kid_of(c, b, i, keys[i], KID_ENTER);
    k[i].hold_ms = 30;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  reap_all(c, pid, 4);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(b->rc[i], 0);
    assert_true(not_before_passed(t0, 300, b->at_ns[i]));
  }
  assert_int_equal(atomic_load(&b->probes), 1);
  assert_int_equal(atomic_load(&b->admitted_during_probe), 0);
  assert_int_equal(field(a, "sp", THROTTLE_FIELD_LOCK_EPISODE), 0);
  board_free(b);
}

/* Rule (I3 on scopes): a back-off published on a scope itself (a script's
 * `throttlectl backoff ws 30`, not a leave beneath) is the server's answer:
 * when it passes, its probe holds every key beneath until its own answer,
 * however long that takes (the cold-scope bound, 1 s, is for a scope
 * nothing was heard of yet). */
static void case_scope_backoff_probe_holds_past_cold_bound(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_backoff(a, "sl", 50), 0);
  uint64_t m0 = th_mono_ms();
  while (th_remaining(a, "sl") > 0) {
    assert_true(th_mono_ms() - m0 < HANG_MS);
    th_sleep_ms(5);
  }
  throttle_ticket_t *t = NULL, *u = NULL;
  assert_int_equal(throttle_try_enter(a, "sl/a", LIVE, &t, NULL), 0);
  assert_int_equal(throttle_ticket_is_probe(t), 1);
  /* past the cold bound: the probe's answer is still what holds them */
  th_sleep_ms(1300);
  assert_int_equal(throttle_try_enter(b1, "sl/b", LIVE, &u, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(a, t, OK, 0);
  assert_int_equal(throttle_try_enter(b1, "sl/b", LIVE, &u, NULL), 0);
  out(b1, u, OK, 0);
}

/* Rule: throttle_wait() also waits while the key is paused and while the
 * probe of its lock episode is out, whichever host paused or probes. */
static void case_wait_honours_pause_and_probe(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  struct board *b = board_new();
  assert_int_equal(throttle_pause(b1, "wp"), 0);
  assert_int_equal(throttle_wait(a, "wp", 0), THROTTLE_ETIMEDOUT);
  struct kid k = kid_of(c, b, 0, "wp", KID_WAIT);
  k.timeout_ms = THROTTLE_FOREVER;
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  th_wait_sleeping(pid, 2000);
  assert_int_equal(b->rc[0], -1000); /* still waiting */
  assert_int_equal(throttle_resume(b1, "wp"), 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[0], 0);
  /* a probe out on another host */
  assert_int_equal(throttle_backoff(a, "wq", 1), 0);
  assert_int_equal(throttle_wait(a, "wq", HANG_MS), 0);
  throttle_ticket_t *t = in(b1, "wq", LIVE);
  assert_int_equal(throttle_ticket_is_probe(t), 1);
  assert_int_equal(throttle_wait(a, "wq", 0), THROTTLE_ETIMEDOUT);
  k = kid_of(c, b, 1, "wq", KID_WAIT);
  k.timeout_ms = THROTTLE_FOREVER;
  pid = th_spawn(c->fx, kid_main, &k);
  th_wait_sleeping(pid, 2000);
  assert_int_equal(b->rc[1], -1000);
  out(b1, t, OK, 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[1], 0);
  board_free(b);
}

static int stop_at_third_look(void *arg) {
  _Atomic int *looks = arg;
  return atomic_fetch_add(looks, 1) >= 2;
}

/* Rule: the interrupt hook ends a wait with EINTR and gives its place
 * back: the next caller is not held behind it. */
static void case_interrupt_gives_place_back(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "ir", &t);
  static _Atomic int looks;
  atomic_store(&looks, 0);
  throttle_config_t *cfg = c->be->config(c, 1);
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_interrupt(cfg, stop_at_third_look,
                                                 (void *)&looks, 50),
                   0);
  throttle_t *b1 = ct_open_cfg(cfg);
  throttle_ticket_t *u = NULL;
  assert_int_equal(throttle_enter(b1, "ir", LIVE, THROTTLE_FOREVER, &u),
                   THROTTLE_EINTR);
  assert_null(u);
  assert_true(atomic_load(&looks) >= 3);
  assert_int_equal(field(a, "ir", THROTTLE_FIELD_WAITING_LIVE), 0);
  out(a, t, OK, 0);
  assert_int_equal(throttle_try_enter(a, "ir", LIVE, &t, NULL), 0);
  out(a, t, OK, 0);
}

/* ---- I4: waiting holds nothing ---------------------------------------- */

/* Rule: a caller asleep for a not-before holds no slot of its key and no
 * place in the pool above it: a sibling is admitted meanwhile, and once
 * the pool is full the sleeper waits for the place, not the other way. */
static void case_waiting_holds_no_slot(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  assert_int_equal(throttle_set_max_parallel(a, "wh", 1), 0); /* a pool */
  assert_int_equal(throttle_set_max_parallel(a, "wh/a", 1), 0);
  assert_int_equal(throttle_backoff(a, "wh/a", TH_LONG_MS), 0);
  struct kid k = kid_of(c, b, 1, "wh/a", KID_ENTER);
  k.timeout_ms = THROTTLE_FOREVER;
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_field(a, "wh/a", THROTTLE_FIELD_WAITING_LIVE, 1);
  assert_int_equal(field(a, "wh/a", THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(field(a, "wh", THROTTLE_FIELD_IN_FLIGHT), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(a, "wh/b", LIVE, &t, NULL), 0);
  assert_int_equal(field(a, "wh", THROTTLE_FIELD_IN_FLIGHT), 1);
  /* its back-off gone, the sleeper now waits for the pool's place */
  assert_int_equal(throttle_clear(a, "wh/a"), 0);
  assert_int_equal(field(a, "wh", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(field(a, "wh/a", THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(atomic_load(&b->admitted), 0);
  out(a, t, OK, 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[1], 0);
  assert_int_equal(field(a, "wh", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* ---- I5: caps hold ------------------------------------------------------ */

/* Rule: in-flight admissions of a key never exceed its cap, whichever
 * hosts they come from. */
static void case_cap_holds_across_hosts(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  assert_int_equal(throttle_set_max_parallel(a, "cap", 2), 0);
  struct kid k[6];
  pid_t pid[6];
  for (int i = 0; i < 6; i++) {
    k[i] = kid_of(c, b, i, "cap", KID_ENTER);
    k[i].rounds = 4;
    k[i].hold_ms = 10;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  reap_all(c, pid, 6);
  assert_int_equal(atomic_load(&b->admitted), 24);
  assert_true(atomic_load(&b->max_in_flight) <= 2);
  assert_int_equal(field(a, "cap", THROTTLE_FIELD_ADMITTED), 24);
  assert_int_equal(field(a, "cap", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* Rule: a freed slot goes to the oldest waiter, across hosts. */
static void case_fifo_across_hosts(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "fifo", &t);
  struct board *b = board_new();
  struct kid k[5];
  pid_t pid[5];
  for (int i = 0; i < 5; i++) {
    k[i] = kid_of(c, b, i, "fifo", KID_ENTER);
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, "fifo", THROTTLE_FIELD_WAITING_LIVE, i + 1);
  }
  out(a, t, OK, 0);
  reap_all(c, pid, 5);
  for (int i = 0; i < 5; i++)
    if (b->rank[i] != i)
      fail_msg("arrival %d (host %d) admitted as %d", i, i % 2,
               (int)b->rank[i]);
  board_free(b);
}

/* Rule: waiting live callers are admitted before waiting backfill ones,
 * whatever their arrival. */
static void case_live_before_backfill(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "lb", &t);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  k[0] = kid_of(c, b, 0, "lb", KID_ENTER);
  k[0].cls = BACKFILL;
  k[0].host = 1;
  pid[0] = th_spawn(c->fx, kid_main, &k[0]);
  wait_field(a, "lb", THROTTLE_FIELD_WAITING_BACKFILL, 1);
  k[1] = kid_of(c, b, 1, "lb", KID_ENTER);
  k[1].host = 0;
  pid[1] = th_spawn(c->fx, kid_main, &k[1]);
  wait_field(a, "lb", THROTTLE_FIELD_WAITING_LIVE, 1);
  out(a, t, OK, 0);
  reap_all(c, pid, 2);
  assert_int_equal(b->rank[1], 0); /* live, arrived second */
  assert_int_equal(b->rank[0], 1);
  board_free(b);
}

/* Rule: backfill holds at most its share of the cap (at least one slot);
 * live callers use the rest. */
static void case_backfill_share(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_set_max_parallel(b1, "bs", 2), 0);
  assert_int_equal(throttle_set_backfill_share(b1, "bs", 0.5), 0);
  throttle_ticket_t *t = NULL, *u = NULL, *v = NULL;
  assert_int_equal(throttle_try_enter(a, "bs", BACKFILL, &t, NULL), 0);
  assert_int_equal(throttle_try_enter(a, "bs", BACKFILL, &u, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(a, "bs", LIVE, &u, NULL), 0);
  assert_int_equal(throttle_try_enter(a, "bs", LIVE, &v, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(field(a, "bs", THROTTLE_FIELD_BACKFILL_SHARE_PERMILLE),
                   500);
  out(a, t, OK, 0);
  out(a, u, OK, 0);
}

/* Rule: a rate of n per period admits a burst of n, then refuses, for
 * every host; other keys are not touched. */
static void case_key_rate(struct ct_fx *c) {
  throttle_t *h[2] = {ct_open(c, 0), ct_open(c, 1)};
  assert_int_equal(throttle_set_rate(h[1], "rt", 2, 60000), 0);
  assert_int_equal(field(h[0], "rt", THROTTLE_FIELD_RATE_N), 2);
  assert_int_equal(field(h[0], "rt", THROTTLE_FIELD_RATE_PERIOD_MS), 60000);
  throttle_ticket_t *t = NULL;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(throttle_try_enter(h[i], "rt", LIVE, &t, NULL), 0);
    out(h[i], t, OK, 0);
  }
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_try_enter(h[i], "rt", LIVE, &t, NULL),
                     THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(h[0], "rt2", LIVE, &t, NULL), 0);
  out(h[0], t, OK, 0);
  assert_int_equal(throttle_set_rate(h[0], "rt", 0, 60000), 0); /* off */
  assert_int_equal(throttle_try_enter(h[1], "rt", LIVE, &t, NULL), 0);
  out(h[1], t, OK, 0);
}

/* Rule: the slot of a holder killed with kill -9 on another host is
 * reclaimed (within the backend's liveness bound, long before its lease),
 * and goes to the next caller. */
static void case_dead_holder_reclaimed(struct ct_fx *c) {
  use_short_liveness();
  throttle_t *a = ct_open(c, 0);
  struct board *b = board_new();
  assert_int_equal(throttle_set_max_parallel(a, "dh", 1), 0);
  struct kid k = kid_of(c, b, 1, "dh", KID_HOLD);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_ready(b, 1);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(a, "dh", LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  kill(pid, SIGKILL);
  th_reap_killed(c->fx, pid, HANG_MS);
  t = in(a, "dh", LIVE);
  assert_true(field(a, "dh", THROTTLE_FIELD_RECLAIMS) >= 1);
  assert_int_equal(field(a, "dh", THROTTLE_FIELD_IN_FLIGHT), 1);
  out(a, t, OK, 0);
  assert_int_equal(field(a, "dh", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* Rule: a waiter killed in the queue holds no turn: the slot goes past it
 * to the live waiter behind it. */
static void case_dead_waiter_skipped(struct ct_fx *c) {
  use_short_liveness();
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "dw", &t);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, "dw", KID_ENTER);
    k[i].host = 1 - i;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, "dw", THROTTLE_FIELD_WAITING_LIVE, i + 1);
  }
  kill(pid[0], SIGKILL);
  th_reap_killed(c->fx, pid[0], HANG_MS);
  out(a, t, OK, 0);
  th_reap_ok(c->fx, pid[1], HANG_MS);
  assert_int_equal(b->rc[1], 0);
  assert_int_equal(b->rank[1], 0);
  assert_int_equal(field(a, "dw", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* ---- I7: fail open ----------------------------------------------------- */

/* Rule: with the backend unusable a handle still works, on per-process
 * (or per-host) state: a back-off it publishes holds its own callers,
 * never early, and its message names the cause. */
static void case_fail_open_when_backend_cut(struct ct_fx *c) {
  c->be->cut(c);
  throttle_t *h = NULL;
  (void)throttle_open(c->host[0], &h); /* an error, or 0 and a message */
  assert_non_null(h);
  assert_true(nopened < CT_MAXOPEN);
  opened[nopened++] = h;
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "fo", 300), 0);
  if (!th_contains(throttle_errmsg(h), c->be->cut_says))
    fail_msg("message \"%s\" does not say \"%s\"", throttle_errmsg(h),
             c->be->cut_says);
  assert_true(th_remaining(h, "fo") > 0);
  throttle_ticket_t *t = in(h, "fo", LIVE);
  assert_true(not_before_passed(t0, 300, th_now_ns()));
  out(h, t, OK, 0);
  assert_int_equal(throttle_wait(h, "fo", HANG_MS), 0);
}

/* ---- I8: what is stored is input ---------------------------------------- */

/* Rule: a not-before damaged in the backend's state, far past any
 * maximum, delays the key by at most the maximum delay (here 500 ms, the
 * segment's as its creator's, and the caller's own on Redis); the reader
 * neither hangs nor fails. */
static void case_hostile_not_before_bounded(struct ct_fx *c) {
  assert_int_equal(throttle_config_set_max_delay(c->host[0], 500), 0);
  throttle_t *a = ct_open(c, 0);
  assert_int_equal(throttle_backoff(a, "hx", 100), 0);
  c->be->forge_not_before(c, a, "hx");
  /* read (past the 100 ms published), bounded by the maximum */
  uint64_t left = th_remaining(a, "hx");
  if (left <= 100 || left > 500)
    fail_msg("a damaged not-before reads as %llu ms (want 101 to 500)",
             (unsigned long long)left);
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(a, "hx", LIVE, HANG_MS, &t);
  if (rc != 0)
    fail_msg("enter: %s: %s", throttle_err_name(rc), throttle_errmsg(a));
  out(a, t, OK, 0);
  assert_int_equal(throttle_wait(a, "hx", HANG_MS), 0);
}

/* ---- scopes ------------------------------------------------------------ */

static const char *const tables[] = {"ws1/orders", "ws1/items", "ws1/users",
                                     "ws1/events"};
#define NTABLES 4

/* Rule: a scope's back-off holds every key beneath it (waits, admissions,
 * the hint), no key of another scope (nor "ws10", named like a longer
 * one); a clear of the scope wakes the sleepers beneath at once. */
static void case_scope_backoff_holds_every_key(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_backoff(b1, "ws1", TH_LONG_MS), 0);
  for (int i = 0; i < NTABLES; i++) {
    throttle_ticket_t *t = NULL;
    uint64_t hint = 0;
    assert_true(th_remaining(a, tables[i]) > TH_LONG_MS - 10000);
    assert_int_equal(throttle_wait(a, tables[i], 0), THROTTLE_ETIMEDOUT);
    assert_int_equal(throttle_try_enter(a, tables[i], LIVE, &t, &hint),
                     THROTTLE_EWOULDBLOCK);
    assert_true(hint > TH_LONG_MS - 10000);
  }
  assert_int_equal(throttle_wait(a, "ws2/orders", 0), 0);
  assert_int_equal(throttle_wait(a, "ws10/orders", 0), 0);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, tables[i], i == 0 ? KID_WAIT : KID_ENTER);
    k[i].timeout_ms = THROTTLE_FOREVER;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  wait_field(a, tables[1], THROTTLE_FIELD_WAITING_LIVE, 1);
  th_wait_sleeping(pid[0], 2000);
  assert_int_equal(throttle_clear(a, "ws1"), 0);
  reap_all(c, pid, 2); /* long before the minute of the back-off */
  assert_int_equal(b->rc[0], 0);
  assert_int_equal(b->rc[1], 0);
  board_free(b);
}

/* Rule: a scope's pause holds new admissions of every key beneath (those
 * in flight finish), none elsewhere; resume releases them. */
static void case_scope_pause_holds_every_key(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  warm(a, tables[3]); /* not cold: only the pause holds them */
  throttle_ticket_t *held = in(a, tables[0], LIVE), *t = NULL;
  assert_int_equal(throttle_pause(b1, "ws1"), 0);
  struct board *b = board_new();
  struct kid k = kid_of(c, b, 0, tables[1], KID_ENTER);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_field(a, tables[1], THROTTLE_FIELD_WAITING_LIVE, 1);
  for (int i = 1; i < NTABLES; i++) /* tables[0]: its cap of 1 is held */
    assert_int_equal(throttle_try_enter(b1, tables[i], LIVE, &t, NULL),
                     THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(b1, "ws2/orders", LIVE, &t, NULL), 0);
  out(b1, t, OK, 0);
  out(a, held, OK, 0); /* in flight before the pause: finishes */
  assert_int_equal(atomic_load(&b->admitted), 0);
  assert_int_equal(throttle_resume(a, "ws1"), 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[0], 0);
  board_free(b);
}

/* Rule: a cancel on a scope ends every current waiter of every key
 * beneath with ECANCELED, on every host; later callers are not
 * affected. */
static void case_scope_cancel_reaches_every_key(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_pause(a, "ws1"), 0);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, tables[i], KID_ENTER);
    k[i].timeout_ms = THROTTLE_FOREVER;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, tables[i], THROTTLE_FIELD_WAITING_LIVE, 1);
  }
  assert_int_equal(throttle_cancel(b1, "ws1"), 0);
  reap_all(c, pid, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(b->rc[i], THROTTLE_ECANCELED);
    assert_int_equal(field(a, tables[i], THROTTLE_FIELD_CANCELED), 1);
  }
  assert_int_equal(throttle_resume(b1, "ws1"), 0);
  throttle_ticket_t *t = in(a, tables[0], LIVE);
  out(a, t, OK, 0);
  assert_int_equal(throttle_cancel(a, "nothing-here"), THROTTLE_ENOKEY);
  board_free(b);
}

/* Rule: every scope of a key is honoured, down to the deepest allowed
 * (THROTTLE_KEY_MAX_SCOPES); a deeper key is refused on every backend. */
static void case_deepest_scope_honoured(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  char key[128] = "d0", deeper[160];
  for (int i = 1; i <= THROTTLE_KEY_MAX_SCOPES; i++) {
    size_t n = strlen(key);
    snprintf(key + n, sizeof key - n, "/d%d", i);
  }
  char scope[128];
  snprintf(scope, sizeof scope, "%s", key);
  *strrchr(scope, '/') = 0; /* the deepest scope */
  assert_int_equal(throttle_backoff(b1, scope, TH_LONG_MS), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(a, key, LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_clear(b1, scope), 0);
  assert_int_equal(throttle_backoff(b1, "d0", TH_LONG_MS), 0); /* the root */
  assert_int_equal(throttle_try_enter(a, key, LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  snprintf(deeper, sizeof deeper, "%s/x", key);
  assert_int_equal(throttle_try_enter(a, deeper, LIVE, &t, NULL),
                   THROTTLE_EKEY);
  assert_int_equal(throttle_backoff(a, deeper, 1), THROTTLE_EKEY);
}

/* ---- pools ------------------------------------------------------------- */

/* Rule: a cap on a scope bounds the sum of the admissions of every key
 * beneath it, across hosts. */
static void case_pool_caps_the_sum(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  assert_int_equal(throttle_set_max_parallel(a, "ws1", 2), 0);
  struct board *b = board_new();
  struct kid k[8];
  pid_t pid[8];
  for (int i = 0; i < 8; i++) {
    k[i] = kid_of(c, b, i, tables[i % NTABLES], KID_ENTER);
    k[i].rounds = 3;
    k[i].hold_ms = 10;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  reap_all(c, pid, 8);
  assert_int_equal(atomic_load(&b->admitted), 24);
  assert_true(atomic_load(&b->max_in_flight) <= 2);
  assert_int_equal(field(a, "ws1", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* Rule: the pool place of a holder killed beneath a pool is reclaimed
 * with its slot, and goes to a caller of another key beneath. */
static void case_pool_place_of_dead_holder_reclaimed(struct ct_fx *c) {
  use_short_liveness();
  throttle_t *a = ct_open(c, 0);
  warm(a, "pd/x");
  assert_int_equal(throttle_set_max_parallel(a, "pd", 1), 0);
  struct board *b = board_new();
  struct kid k = kid_of(c, b, 1, "pd/a", KID_HOLD);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_ready(b, 1);
  assert_int_equal(field(a, "pd", THROTTLE_FIELD_IN_FLIGHT), 1);
  kill(pid, SIGKILL);
  th_reap_killed(c->fx, pid, HANG_MS);
  throttle_ticket_t *t = in(a, "pd/b", LIVE);
  assert_int_equal(field(a, "pd", THROTTLE_FIELD_IN_FLIGHT), 1);
  out(a, t, OK, 0);
  assert_int_equal(field(a, "pd", THROTTLE_FIELD_IN_FLIGHT), 0);
  board_free(b);
}

/* Rule: the backfill share of a pool bounds backfill's part of the sum
 * beneath it; live callers use the rest. */
static void case_pool_backfill_share(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  warm(a, "pb/x");
  assert_int_equal(throttle_set_max_parallel(b1, "pb", 2), 0);
  assert_int_equal(throttle_set_backfill_share(b1, "pb", 0.5), 0);
  throttle_ticket_t *t = NULL, *u = NULL, *v = NULL;
  assert_int_equal(throttle_try_enter(a, "pb/a", BACKFILL, &t, NULL), 0);
  assert_int_equal(throttle_try_enter(b1, "pb/b", BACKFILL, &u, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(b1, "pb/b", LIVE, &u, NULL), 0);
  assert_int_equal(throttle_try_enter(a, "pb/c", LIVE, &v, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(a, t, OK, 0);
  out(b1, u, OK, 0);
}

/* Rule: a rate on a scope is one budget for every key beneath. */
static void case_pool_rate_is_a_budget(struct ct_fx *c) {
  throttle_t *h[2] = {ct_open(c, 0), ct_open(c, 1)};
  assert_int_equal(throttle_set_rate(h[1], "ws1", 2, 60000), 0);
  throttle_ticket_t *t = NULL;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(throttle_try_enter(h[i], tables[i], LIVE, &t, NULL), 0);
    out(h[i], t, OK, 0);
  }
  for (int i = 0; i < NTABLES; i++)
    assert_int_equal(throttle_try_enter(h[i % 2], tables[i], LIVE, &t, NULL),
                     THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(h[0], "ws2/orders", LIVE, &t, NULL), 0);
  out(h[0], t, OK, 0);
}

/* ---- the learned cap --------------------------------------------------- */

/* One admission of key on host, reported with outcome, by a process of
 * its own. */
struct one {
  struct ct_fx *c;
  int host;
  const char *key;
  throttle_outcome_t outcome;
};

static int one_main(void *p) {
  struct one *o = p;
  throttle_t *h = ct_child_open(o->c, o->host);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, o->key, LIVE, HANG_MS, &t) == 0);
  TH_CHILD_CHECK(throttle_leave(h, t, o->outcome,
                                o->outcome == LOCKED ? R_MS : 0) == 0);
  throttle_close(h);
  return 0;
}

static void one_on(struct ct_fx *c, int host, const char *key,
                   throttle_outcome_t outcome) {
  struct one o = {c, host, key, outcome};
  th_reap_ok(c->fx, th_spawn(c->fx, one_main, &o), HANG_MS);
}

/* Rule: the learned cap starts at 1 and rises by one per success granted
 * at the cap (none below it), whichever host reports; a refusal with k
 * others in flight sets it to k (not halved) and records the failed
 * raise and its Retry-After, also when the refused one was granted first
 * (a later grant reached the server first); one with nobody else in
 * flight is somebody else's lock and teaches nothing; a fixed cap wins
 * and keeps what was learned. */
static void case_learned_cap(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  out(a, in(a, "lc", LIVE), OK, 0);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_AUTO), 1);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 2);
  one_on(c, 1, "lc", OK); /* alone, below the cap of 2 */
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 2);
  throttle_ticket_t *t[3];
  t[0] = in(a, "lc", LIVE);
  one_on(c, 1, "lc", OK); /* second: at the cap */
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 3);
  t[1] = in(a, "lc", LIVE);
  t[2] = in(a, "lc", LIVE); /* three at the cap of 3 */
  for (int i = 2; i >= 0; i--)
    out(a, t[i], OK, 0);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 4);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_GOOD), 3);
  for (int i = 0; i < 3; i++)
    t[i] = in(a, "lc", LIVE);
  one_on(c, 1, "lc", LOCKED); /* the fourth, refused: 3 others in flight */
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_GOOD), 3);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_FAIL), 4);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_FAILS), 1);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_RETRY_AFTER_MS), R_MS);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_NEXT_RAISE_MS),
                   20 * R_MS * 2);
  for (int i = 0; i < 3; i++)
    out(a, t[i], OK, 0);
  /* alone: learns nothing */
  one_on(c, 1, "lc", LOCKED);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 3);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_FAILS), 1);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_LOCKED), 2);
  /* a fixed cap wins and keeps what was learned for auto */
  assert_int_equal(throttle_set_max_parallel(a, "lc", 7), 0);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 7);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(throttle_set_max_parallel(a, "lc", 0), 0);
  assert_int_equal(field(a, "lc", THROTTLE_FIELD_CAP), 3);
  /* granted first, refused: the one granted after it is in flight */
  warm(a, "lc2");
  assert_int_equal(field(a, "lc2", THROTTLE_FIELD_CAP), 2);
  throttle_ticket_t *first = in(a, "lc2", LIVE), *second = in(b1, "lc2", LIVE);
  out(a, first, LOCKED, R_MS);
  assert_int_equal(field(b1, "lc2", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(field(b1, "lc2", THROTTLE_FIELD_CAP_FAIL), 2);
  assert_int_equal(field(b1, "lc2", THROTTLE_FIELD_CAP_FAILS), 1);
  out(b1, second, OK, 0);
}

/* n admissions of key at once, left last first: n at the cap when n is
 * the cap. */
static void burst(throttle_t *h, const char *key, int n) {
  throttle_ticket_t *t[8];
  assert_true(n <= 8);
  for (int i = 0; i < n; i++)
    t[i] = in(h, key, LIVE);
  for (int i = n - 1; i >= 0; i--)
    out(h, t[i], OK, 0);
}

/* Rule: auto:MAX bounds the learned cap: slow start stops at MAX, a cap
 * learned above it comes down at once; refusals still lower it. */
static void case_learned_cap_bound(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_set_max_parallel_auto(b1, "lb2", 2), 0);
  assert_int_equal(field(a, "lb2", THROTTLE_FIELD_CAP_MAX), 2);
  burst(a, "lb2", 1);
  burst(a, "lb2", 2); /* at the cap of 2: no raise past MAX */
  assert_int_equal(field(a, "lb2", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(field(a, "lb2", THROTTLE_FIELD_CAP_NEXT_RAISE_MS), -1);
  throttle_ticket_t *t[2] = {in(a, "lb2", LIVE), in(a, "lb2", LIVE)}, *x;
  assert_int_equal(throttle_try_enter(b1, "lb2", LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(a, t[1], OK, 0);
  out(a, t[0], OK, 0);
  assert_int_equal(field(a, "lb2", THROTTLE_FIELD_CAP), 2);
  /* learned 3 without a bound, then bounded to 2: down at once */
  assert_int_equal(throttle_set_max_parallel(a, "lb3", 0), 0);
  for (int n = 1; n <= 3; n++)
    burst(a, "lb3", n);
  assert_int_equal(field(a, "lb3", THROTTLE_FIELD_CAP), 4);
  assert_int_equal(throttle_set_max_parallel_auto(b1, "lb3", 2), 0);
  assert_int_equal(field(a, "lb3", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(throttle_set_max_parallel_auto(a, "lb3", 33),
                   THROTTLE_EINVAL);
}

/* ---- cancel, pause, resume, clear --------------------------------------- */

/* Rule: cancel ends every current waiter of the key, on every host, with
 * ECANCELED; a caller that arrives later waits as usual. */
static void case_cancel_ends_current_waiters(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "cn", &t);
  struct board *b = board_new();
  struct kid k[3];
  pid_t pid[3];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, "cn", KID_ENTER);
    k[i].timeout_ms = THROTTLE_FOREVER;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, "cn", THROTTLE_FIELD_WAITING_LIVE, i + 1);
  }
  assert_int_equal(throttle_cancel(ct_open(c, 1), "cn"), 0);
  reap_all(c, pid, 2);
  assert_int_equal(b->rc[0], THROTTLE_ECANCELED);
  assert_int_equal(b->rc[1], THROTTLE_ECANCELED);
  assert_int_equal(field(a, "cn", THROTTLE_FIELD_CANCELED), 2);
  assert_int_equal(field(a, "cn", THROTTLE_FIELD_WAITING_LIVE), 0);
  k[2] = kid_of(c, b, 2, "cn", KID_ENTER);
  pid[2] = th_spawn(c->fx, kid_main, &k[2]);
  wait_field(a, "cn", THROTTLE_FIELD_WAITING_LIVE, 1);
  out(a, t, OK, 0);
  th_reap_ok(c->fx, pid[2], HANG_MS);
  assert_int_equal(b->rc[2], 0);
}

/* Rule: pause holds new admissions (those in flight finish and leave);
 * resume from any host releases the waiters. */
static void case_pause_resume(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  throttle_ticket_t *held = in(a, "pz", LIVE), *t = NULL;
  assert_int_equal(throttle_pause(b1, "pz"), 0);
  assert_int_equal(field(a, "pz", THROTTLE_FIELD_PAUSED), 1);
  struct board *b = board_new();
  struct kid k = kid_of(c, b, 1, "pz", KID_ENTER);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_field(a, "pz", THROTTLE_FIELD_WAITING_LIVE, 1);
  assert_int_equal(throttle_try_enter(a, "pz", LIVE, &t, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(a, held, OK, 0);
  assert_int_equal(field(a, "pz", THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(field(a, "pz", THROTTLE_FIELD_WAITING_LIVE), 1);
  assert_int_equal(throttle_resume(a, "pz"), 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[1], 0);
  assert_int_equal(field(b1, "pz", THROTTLE_FIELD_PAUSED), 0);
  board_free(b);
}

/* Rule: a clear drops the back-off and wakes its sleepers at once, on
 * every host; the counters stay; reset clears every key; a key never
 * seen is ENOKEY. */
static void case_clear_and_reset_wake_sleepers(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_backoff(a, "cl", TH_LONG_MS), 0);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, "cl", i == 0 ? KID_WAIT : KID_ENTER);
    k[i].timeout_ms = THROTTLE_FOREVER;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
  }
  wait_field(a, "cl", THROTTLE_FIELD_WAITING_LIVE, 1);
  th_wait_sleeping(pid[0], 2000);
  assert_int_equal(throttle_clear(b1, "cl"), 0);
  reap_all(c, pid, 2);
  assert_int_equal(b->rc[0], 0);
  assert_int_equal(b->rc[1], 0);
  assert_int_equal(th_remaining(a, "cl"), 0);
  assert_int_equal(field(a, "cl", THROTTLE_FIELD_PUBLISHES), 1);
  assert_int_equal(field(a, "cl", THROTTLE_FIELD_CLEARS), 1);
  assert_int_equal(throttle_backoff(a, "r1", TH_LONG_MS), 0);
  assert_int_equal(throttle_backoff(b1, "r2", TH_LONG_MS), 0);
  b->rc[0] = -1000;
  k[0] = kid_of(c, b, 0, "r2", KID_WAIT);
  k[0].timeout_ms = THROTTLE_FOREVER;
  pid[0] = th_spawn(c->fx, kid_main, &k[0]);
  th_wait_sleeping(pid[0], 2000);
  assert_int_equal(throttle_reset(b1), 0);
  th_reap_ok(c->fx, pid[0], HANG_MS); /* woken: not a minute later */
  assert_int_equal(b->rc[0], 0);
  assert_int_equal(th_remaining(a, "r1"), 0);
  assert_int_equal(th_remaining(a, "r2"), 0);
  assert_int_equal(throttle_clear(a, "never-seen"), THROTTLE_ENOKEY);
  board_free(b);
}

/* Rule: a requeued admission keeps its place ahead of everyone who
 * arrived after it. */
static void case_requeue_keeps_place(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "rq", &t);
  struct board *b = board_new();
  struct kid k = kid_of(c, b, 1, "rq", KID_ENTER);
  pid_t pid = th_spawn(c->fx, kid_main, &k);
  wait_field(a, "rq", THROTTLE_FIELD_WAITING_LIVE, 1);
  assert_int_equal(
      throttle_requeue(a, &t, THROTTLE_OUTCOME_FAILED, 0, HANG_MS), 0);
  assert_non_null(t);
  assert_int_equal(atomic_load(&b->admitted), 0);
  out(a, t, OK, 0);
  th_reap_ok(c->fx, pid, HANG_MS);
  assert_int_equal(b->rc[1], 0);
  board_free(b);
}

/* Rule: the try_enter hint is the time left for a back-off, 0 for a
 * wait on a slot. */
static void case_try_enter_hint(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  throttle_ticket_t *t = NULL, *u = NULL;
  uint64_t hint = 0;
  assert_int_equal(throttle_backoff(b1, "hint", TH_LONG_MS), 0);
  assert_int_equal(throttle_try_enter(a, "hint", LIVE, &t, &hint),
                   THROTTLE_EWOULDBLOCK);
  assert_null(t);
  assert_true(hint > TH_LONG_MS - 10000 && hint <= TH_LONG_MS);
  assert_int_equal(throttle_set_max_parallel(a, "slot", 1), 0);
  assert_int_equal(throttle_try_enter(b1, "slot", LIVE, &u, NULL), 0);
  hint = 1;
  assert_int_equal(throttle_try_enter(a, "slot", LIVE, &t, &hint),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(hint, 0);
  out(b1, u, OK, 0);
}

/* Rule: a process's own maximum delay bounds only what it honours, never
 * what it stores for the others; what anyone may store is bounded by the
 * shared maximum (the segment's, 15 min by default), whatever the
 * reader's own maximum. */
static void case_own_max_delay_bounds_only_itself(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  /* the second host's segment made with the defaults, as the first's: its
   * maximum is what a publisher there may store (the creator's), and the
   * process below is not its creator on either backend */
  (void)ct_open(c, 1);
  throttle_config_t *cfg = c->be->config(c, 1);
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_max_delay(cfg, 1000), 0);
  throttle_t *small = ct_open_cfg(cfg);
  assert_int_equal(throttle_backoff(small, "md", TH_LONG_MS), 0);
  uint64_t left = th_remaining(a, "md");
  if (left <= TH_LONG_MS - 10000)
    fail_msg("a publisher with a max delay of 1 s stored %llu ms of its "
             "%llu for the others",
             (unsigned long long)left, (unsigned long long)TH_LONG_MS);
  assert_true(th_remaining(small, "md") <= 1000);
  cfg = c->be->config(c, 1);
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_max_delay(cfg, 7200000), 0);
  throttle_t *big = ct_open_cfg(cfg);
  assert_int_equal(throttle_backoff(a, "mx", 3600000), 0); /* an hour */
  left = th_remaining(big, "mx");
  assert_true(left > 900000 - 10000 && left <= 900000);
}

/* Rule (I3 on scopes): nothing known of a scope yet, its first request
 * goes alone (a probe); the others, on every key beneath and every host,
 * follow its answer. */
static void case_cold_scope_first_request_alone(struct ct_fx *c) {
  throttle_t *h[2] = {ct_open(c, 0), ct_open(c, 1)};
  throttle_ticket_t *t = NULL, *u = NULL;
  assert_int_equal(throttle_try_enter(h[0], "cold/a", LIVE, &t, NULL), 0);
  assert_int_equal(throttle_ticket_is_probe(t), 1);
  assert_int_equal(throttle_try_enter(h[1], "cold/b", LIVE, &u, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(h[0], t, OK, 0);
  assert_int_equal(throttle_try_enter(h[1], "cold/b", LIVE, &u, NULL), 0);
  assert_int_equal(throttle_ticket_is_probe(u), 0);
  assert_int_equal(throttle_try_enter(h[0], "cold/c", LIVE, &t, NULL), 0);
  out(h[1], u, OK, 0);
  out(h[0], t, OK, 0);
}

/* Rule: a pool's places go first come, first served across its keys,
 * live before backfill, whichever host waits. */
static void case_pool_fifo_live_first(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0);
  warm(a, "pf/x");
  assert_int_equal(throttle_set_max_parallel(a, "pf", 1), 0);
  throttle_ticket_t *t = in(a, "pf/a", LIVE);
  struct board *b = board_new();
  static const char *const keys[] = {"pf/b", "pf/c", "pf/d"};
  struct kid k[3];
  pid_t pid[3];
  for (int i = 0; i < 3; i++) {
    k[i] = kid_of(c, b, i, keys[i], KID_ENTER);
    k[i].cls = i == 0 ? BACKFILL : LIVE;
    k[i].host = (i + 1) % 2;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, keys[i],
               i == 0 ? THROTTLE_FIELD_WAITING_BACKFILL
                      : THROTTLE_FIELD_WAITING_LIVE,
               1);
  }
  out(a, t, OK, 0);
  reap_all(c, pid, 3);
  assert_int_equal(b->rank[1], 0); /* live, in arrival order */
  assert_int_equal(b->rank[2], 1);
  assert_int_equal(b->rank[0], 2); /* backfill, arrived first */
  assert_true(atomic_load(&b->max_in_flight) <= 1);
  board_free(b);
}

/* Rule: a cap set on a scope counts the admissions already in flight
 * beneath it, on every host: none more until they are under it.  (At
 * once on the segment; on Redis at the holders' next heartbeat, every
 * THROTTLE_LIVENESS_MS / 4: CHANGELOG, "Pools", hence the wait.) */
static void case_pool_new_cap_counts_in_flight(struct ct_fx *c) {
  use_short_liveness();
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  warm(b1, "nc/a");
  throttle_ticket_t *t[2], *x = NULL;
  t[0] = in(b1, "nc/a", LIVE);
  t[1] = in(b1, "nc/b", LIVE);
  assert_int_equal(throttle_set_max_parallel(a, "nc", 1), 0);
  wait_field(a, "nc", THROTTLE_FIELD_IN_FLIGHT, 2);
  assert_int_equal(throttle_try_enter(a, "nc/c", LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK);
  out(b1, t[0], OK, 0);
  assert_int_equal(throttle_try_enter(a, "nc/c", LIVE, &x, NULL),
                   THROTTLE_EWOULDBLOCK); /* 1 in flight: at the cap */
  out(b1, t[1], OK, 0);
  assert_int_equal(throttle_try_enter(a, "nc/c", LIVE, &x, NULL), 0);
  out(a, x, OK, 0);
}

/* Rule: an admission held past its lease by a live holder is taken back;
 * the holder's late report frees nothing (its slot went to another) and
 * only publishes (ESTALE). */
static void case_stale_report_frees_nothing(struct ct_fx *c) {
  throttle_config_t *cfg = c->be->config(c, 0);
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_lease(cfg, 200), 0);
  throttle_t *a = ct_open_cfg(cfg), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_set_max_parallel(b1, "st", 1), 0);
  throttle_ticket_t *ta = in(a, "st", LIVE), *tb = in(b1, "st", LIVE);
  assert_true(field(b1, "st", THROTTLE_FIELD_RECLAIMS) >= 1);
  assert_int_equal(throttle_leave(a, ta, LOCKED, TH_LONG_MS),
                   THROTTLE_ESTALE);
  assert_int_equal(field(b1, "st", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_true(th_remaining(b1, "st") > TH_LONG_MS - 10000);
  out(b1, tb, OK, 0);
  assert_int_equal(field(b1, "st", THROTTLE_FIELD_IN_FLIGHT), 0);
}

/* Rule: a snapshot lists the holders and the waiters of every host, the
 * waiters in arrival order with their pid and class. */
static void case_info_lists_waiters_in_order(struct ct_fx *c) {
  throttle_ticket_t *t = NULL;
  throttle_t *a = th_hold_only_slot(c->fx, "inf", &t);
  struct board *b = board_new();
  struct kid k[2];
  pid_t pid[2];
  for (int i = 0; i < 2; i++) {
    k[i] = kid_of(c, b, i, "inf", KID_ENTER);
    k[i].cls = i == 0 ? BACKFILL : LIVE;
    k[i].host = 1 - i;
    pid[i] = th_spawn(c->fx, kid_main, &k[i]);
    wait_field(a, "inf",
               i == 0 ? THROTTLE_FIELD_WAITING_BACKFILL
                      : THROTTLE_FIELD_WAITING_LIVE,
               1);
  }
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(ct_open(c, 1), "inf", &info), 0);
  int64_t hpid = 0;
  throttle_class_t cls = BACKFILL;
  assert_int_equal(throttle_info_holder(info, 0, &hpid, NULL, &cls, NULL), 0);
  assert_int_equal(hpid, getpid());
  assert_int_equal(cls, LIVE);
  assert_int_equal(throttle_info_holder(info, 1, NULL, NULL, NULL, NULL),
                   THROTTLE_ENOKEY);
  for (int i = 0; i < 2; i++) {
    int64_t wpid = 0;
    assert_int_equal(throttle_info_waiter(info, (size_t)i, &wpid, NULL, &cls),
                     0);
    assert_int_equal(wpid, pid[i]);
    assert_int_equal(cls, k[i].cls);
  }
  assert_int_equal(throttle_info_waiter(info, 2, NULL, NULL, NULL),
                   THROTTLE_ENOKEY);
  throttle_info_free(info);
  out(a, t, OK, 0);
  reap_all(c, pid, 2);
  board_free(b);
}

/* Rule (throttle.h, throttle_try_enter): the hint is how long to wait,
 * 0 only when the wait is for a slot; a rate's refusal waits for a
 * time. */
static void case_try_enter_hint_counts_rate(struct ct_fx *c) {
  throttle_t *a = ct_open(c, 0), *b1 = ct_open(c, 1);
  assert_int_equal(throttle_set_rate(b1, "rh", 1, 60000), 0);
  throttle_ticket_t *t = NULL;
  uint64_t hint = 0;
  assert_int_equal(throttle_try_enter(a, "rh", LIVE, &t, NULL), 0);
  out(a, t, OK, 0);
  assert_int_equal(throttle_try_enter(b1, "rh", LIVE, &t, &hint),
                   THROTTLE_EWOULDBLOCK);
  if (hint == 0 || hint > 60000)
    fail_msg("rate 1/min refused with a hint of %llu ms",
             (unsigned long long)hint);
}

/* ---- the table -------------------------------------------------------- */

#define CASE(f, ...) {"test_contract_" #f, case_##f, {__VA_ARGS__}}

static const struct ct_case cases[] = {
    CASE(never_early_across_hosts),
    CASE(later_backoff_holds_sleepers),
    CASE(outcome_classes_publish),
    CASE(publish_level_per_handle),
    CASE(one_probe_per_episode),
    CASE(only_ok_ends_an_episode),
    CASE(scope_one_probe),
    CASE(scope_backoff_probe_holds_past_cold_bound),
    CASE(wait_honours_pause_and_probe),
    CASE(dead_probe_replaced),
    CASE(waiting_holds_no_slot),
    CASE(interrupt_gives_place_back),
    CASE(cap_holds_across_hosts),
    CASE(fifo_across_hosts),
    CASE(live_before_backfill),
    CASE(backfill_share),
    CASE(key_rate),
    CASE(dead_holder_reclaimed),
    CASE(dead_waiter_skipped),
    CASE(fail_open_when_backend_cut),
    CASE(hostile_not_before_bounded),
    CASE(scope_backoff_holds_every_key),
    CASE(scope_pause_holds_every_key),
    CASE(scope_cancel_reaches_every_key),
    CASE(deepest_scope_honoured),
    CASE(pool_caps_the_sum),
    CASE(pool_rate_is_a_budget),
    CASE(pool_place_of_dead_holder_reclaimed),
    CASE(pool_backfill_share),
    CASE(learned_cap),
    CASE(learned_cap_bound),
    CASE(cancel_ends_current_waiters),
    CASE(pause_resume),
    CASE(clear_and_reset_wake_sleepers),
    /* README, "Across hosts", "Not mirrored": throttle_requeue() on Redis
     * reports and queues again at the back (Redis keeps no place across a
     * report). */
    CASE(requeue_keeps_place,
         [CT_REDIS] = "requeue keeps no place on Redis (README: Across "
                      "hosts, Not mirrored)"),
    CASE(try_enter_hint),
    CASE(own_max_delay_bounds_only_itself),
    CASE(cold_scope_first_request_alone),
    CASE(pool_fifo_live_first),
    CASE(pool_new_cap_counts_in_flight),
    CASE(stale_report_frees_nothing),
    CASE(info_lists_waiters_in_order),
    CASE(try_enter_hint_counts_rate),
};

#define NCASES (sizeof cases / sizeof cases[0])

/* ---- the runner --------------------------------------------------------- */

/* A case skipped as "fails: ..." (a bug left open), run anyway when
 * CONTRACT_RUN_FAILING is set: to see whether a fix closes it. */
static const char *skip_reason(const struct ct_case *cs,
                               const struct ct_backend *be) {
  const char *why = cs->skip[be->id];
  if (why != NULL && strncmp(why, "fails:", 6) == 0 &&
      getenv("CONTRACT_RUN_FAILING") != NULL)
    return NULL;
  return why;
}

static int ct_setup(void **state) {
  struct ct_fx *c = calloc(1, sizeof *c);
  if (c == NULL)
    return -1;
  c->cs = *state;
  c->be = the_backend;
  *state = c;
  nopened = 0;
  if (skip_reason(c->cs, c->be) != NULL)
    return 0;
  void *st = NULL;
  if (th_setup(&st) != 0)
    return -1;
  c->fx = st;
  c->host[0] = c->fx->cfg;
  if (c->be->start(c) != 0) {
    fprintf(stderr, "%s: the %s backend did not start\n", c->cs->name,
            c->be->name);
    c->be->stop(c);
    th_teardown(&st);
    free(c);
    *state = NULL;
    return -1;
  }
  return 0;
}

static int ct_teardown(void **state) {
  struct ct_fx *c = *state;
  if (c == NULL)
    return 0;
  for (int i = 0; i < nopened; i++)
    throttle_close(opened[i]);
  nopened = 0;
  if (c->fx != NULL) {
    void *st = c->fx;
    th_teardown(&st); /* children killed and reaped, segments unlinked */
    c->be->stop(c);
  }
  unsetenv("THROTTLE_LIVENESS_MS");
  free(c);
  *state = NULL;
  return 0;
}

static void ct_run(void **state) {
  struct ct_fx *c = *state;
  const char *why = skip_reason(c->cs, c->be);
  if (why != NULL) {
    printf("[  SKIP    ] %s on %s: %s\n", c->cs->name, c->be->name, why);
    skip();
  }
  c->cs->fn(c);
}

int ct_main(const struct ct_backend *be) {
  the_backend = be;
  static struct CMUnitTest tests[NCASES];
  for (size_t i = 0; i < NCASES; i++)
    tests[i] = (struct CMUnitTest){cases[i].name, ct_run, ct_setup,
                                   ct_teardown, (void *)&cases[i]};
  /* CONTRACT_CASE=pattern runs only the matching cases (cmocka's filter:
   * '*' and '?'), for looping one case */
  const char *only = getenv("CONTRACT_CASE");
  if (only != NULL && only[0] != '\0')
    cmocka_set_test_filter(only);
  return cmocka_run_group_tests_name(be->name, tests, NULL, NULL);
}
