/* SPDX-License-Identifier: MIT */
/*
 * torture.c — kill -9 at random instants, thousands of times (I1, I5, I6).
 *
 *   torture [--kills N] [--workers W] [--keys K] [--transient T]
 *           [--witnesses V] [--seed S] [--capacity C]
 *
 * W worker processes (default 8) run random operations on K fixed keys
 * (default 4) whose caps are 1, 2, 3 and "auto" in turn, and on T transient
 * keys (default 48) in a table with room for only half of them, so keys
 * are inserted and evicted all the time: enter/leave with
 * every outcome, try_enter, backoff, wait, remaining, clear,
 * set_max_parallel, info, foreach, cancel, pause+resume, and bursts of the
 * quick ones that take the mutex, so that kills land inside the critical
 * section often (the repairs figure counts them).  The parent SIGKILLs a
 * random worker every 1 to 5 ms and starts a fresh one in its place, until
 * N kills (default 2000; 200 for a quick run).  A quarter of the victims
 * are also armed with a named crash point (after-lock, mid-update,
 * gate-mid-grant, gate-mid-leave, table-mid-insert, table-mid-evict) and
 * die there on their own, which random kills only rarely hit.  The first V
 * workers (default 2) are witnesses, never killed: a victim lives some 30 ms,
 * too short for any bound to catch it hanging, so it is the witnesses, working
 * through everything the victims leave behind (dead holders, dead probes, a
 * mutex to repair), that show whether a crash blocks anyone beyond a bounded
 * time (I6).  Checked by the workers and the parent, outside the library's own
 * bookkeeping (in an anonymous shared mapping the library never sees):
 *
 *   hangs           an operation ran past its bound: an enter or wait with
 *                   timeout T must return within T + 2 s, anything else
 *                   within 3 s (the parent watches each worker's "current
 *                   operation deadline").
 *   cap_violations  more live holders of a fixed-cap key than its cap.  The
 *                   holders are a bitmask per key, one bit per worker: set
 *                   after enter returns, cleared before leave, cleared by the
 *                   parent when it reaps a killed worker.  A dead holder's
 *                   bit is gone while the library may still count its slot,
 *                   and the bit of a holder that died but is not reaped yet
 *                   (a zombie, which the library rightly takes for dead) is
 *                   not counted, so the mask never overstates.  Also the
 *                   library's own
 *                   in_flight against its cap (throttle_info).
 *   early           a key admitted, waited for, or reported open before the
 *                   latest not-before published for it (I1).  Publishers
 *                   record now + delay after a successful back-off or
 *                   LOCKED-style leave; a clear starts a new generation, and
 *                   no check spans a clear (see struct key).
 *   unreclaimed     at the end every worker is killed at once; a key with
 *                   a slot still taken (holder, waiter or canceled waiter)
 *                   half a lease later was not reclaimed by death
 *                   detection.
 *
 * --capacity C sets the table's size instead (at least the fixed keys that
 * have a cap, which are never evicted): with C = 1 or 2 every insert
 * evicts, or reaps the keys of killed holders to make room, or finds the
 * table full, all while workers die inside those paths.
 *
 * At the end the segment must still open shared, list its keys and answer
 * stats.  The last line carries the figures; the exit status is 0 only when
 * every count above (and unexpected errors and crashes) is 0.
 */
#include "helpers.h"
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 64
#define MAX_FIXED 16
#define MAX_TRANSIENT 64
#define MAX_KEYS (MAX_FIXED + MAX_TRANSIENT)
#define NS_PER_MS UINT64_C(1000000)
#define SLACK_NS (2000 * NS_PER_MS) /* enter/wait: timeout + this */
#define BOUND_NS (3000 * NS_PER_MS) /* every other operation */
#define TOL_NS NS_PER_MS            /* early-check tolerance */
#define LEASE_MS 2000u
#define LOCK_TIMEOUT_MS 1000u
#define MAX_DELAY_MS 10000u

enum op {
  OP_IDLE,
  OP_OPEN,
  OP_ENTER,
  OP_TRY,
  OP_HOLD,
  OP_LEAVE,
  OP_BACKOFF,
  OP_WAIT,
  OP_REMAINING,
  OP_CLEAR,
  OP_SETCAP,
  OP_INFO,
  OP_FOREACH,
  OP_CANCEL,
  OP_PAUSE,
  OP_STATS,
  OP_CLOSE,
  OP_COUNT_
};
static const char *const op_name[OP_COUNT_] = {"idle",
                                               "open",
                                               "enter",
                                               "try_enter",
                                               "hold",
                                               "leave",
                                               "backoff",
                                               "wait",
                                               "remaining",
                                               "clear",
                                               "set_max_parallel",
                                               "info",
                                               "foreach",
                                               "cancel",
                                               "pause+resume",
                                               "stats",
                                               "close"};

/* One worker's state as the parent sees it. */
struct worker {
  _Atomic int pid;
  _Atomic uint64_t deadline; /* CLOCK_MONOTONIC ns; 0 = between operations */
  _Atomic int op, key;
  _Atomic int paused_key; /* -1, or the key it paused and must resume */
  _Atomic int killing;    /* the parent sent SIGKILL */
  _Atomic int armed;      /* 1 + index into crash_points, 0 = unarmed */
};

/* One key.  The not-before bookkeeping is a generation and a packed word:
 * pub = (generation & 0xffff) << 48 | (max published not-before - base).
 * A clearer sets its bit in `clearing`, bumps `gen`, clears, moves `pub` to
 * the new generation with nothing published, and drops its bit.  A
 * publisher records only if no clear was in progress and the generation did
 * not move across its call; a checker checks only under the same condition.
 * So every recorded not-before was published after the last clear that
 * could have wiped it, and every check sees only such records. */
struct key {
  char name[32];
  int cap;        /* 0 = auto */
  bool transient; /* comes and goes: inserted, evicted, inserted again */
  bool evictable; /* transient, or auto (a key with no setting is idle) */
  _Atomic uint64_t holders;  /* bit w: worker w holds it */
  _Atomic uint64_t clearing; /* bit w: worker w is clearing it */
  _Atomic uint32_t gen;
  _Atomic uint64_t pub;
};

struct shared {
  _Atomic int stop;
  uint64_t base_ns; /* CLOCK_BOOTTIME at start */
  _Atomic uint64_t ops;
  _Atomic uint64_t hangs, cap_violations, early, errors;
  _Atomic uint64_t admissions, nb_checks, publishes_recorded;
  struct worker w[MAX_WORKERS];
  struct key k[MAX_KEYS];
};

static struct shared *S;
static int nworkers = 8, nwitnesses = 2;
static int nkeys = 4;   /* fixed keys: [0, nkeys), each with its cap */
static int ntrans = 48; /* transient keys: [nkeys, nall), in a small table */
static int nall = 52;
static int nkept = 3; /* keys never evicted: the fixed ones with a cap */
static throttle_config_t *cfg;
static char segname[64];

#define NB_MASK ((UINT64_C(1) << 48) - 1)

/* ---- small things -------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static unsigned rnd(uint64_t *s, unsigned n) {
  return (unsigned)(rng_next(s) % n);
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static void sleep_us(unsigned us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static void bump(_Atomic uint64_t *c) { atomic_fetch_add(c, 1); }

/* ---- a worker's bookkeeping ---------------------------------------------- */

static int me; /* worker index, in a worker */

static void op_begin(enum op op, int key, uint64_t bound_ns) {
  atomic_store(&S->w[me].op, op);
  atomic_store(&S->w[me].key, key);
  atomic_store(&S->w[me].deadline, mono_ns() + bound_ns);
}

static void op_end(void) {
  atomic_store(&S->w[me].deadline, 0);
  atomic_store(&S->w[me].op, OP_IDLE);
  bump(&S->ops);
}

static void unexpected(const char *what, int k, int rc, throttle_t *h) {
  /* A key without settings may have been evicted (ENOKEY), and a table of
   * pending keys has no room for one more (EFULL): answers, not faults. */
  if (k >= 0 && S->k[k].evictable &&
      (rc == THROTTLE_ENOKEY || rc == THROTTLE_EFULL))
    return;
  bump(&S->errors);
  fprintf(stderr, "torture: worker %d (pid %d): %s(%s): %s: %s\n", me,
          (int)getpid(), what, k >= 0 ? S->k[k].name : "-",
          throttle_err_name(rc), throttle_errmsg(h));
}

/* What a checker may rely on: the latest not-before recorded for key k in
 * the current generation, or valid = false while a clear is in progress. */
struct snap {
  bool valid;
  uint32_t gen;
  uint64_t nb; /* CLOCK_BOOTTIME ns, 0 = none recorded */
};

static struct snap snap_take(int k) {
  struct key *K = &S->k[k];
  struct snap s = {false, 0, 0};
  if (atomic_load(&K->clearing) != 0)
    return s;
  s.gen = atomic_load(&K->gen);
  uint64_t p = atomic_load(&K->pub);
  if ((uint32_t)(p >> 48) != (s.gen & 0xffff))
    return s;
  s.valid = true;
  s.nb = (p & NB_MASK) ? S->base_ns + (p & NB_MASK) : 0;
  return s;
}

/* The snapshot still stands after a call: no clear started meanwhile. */
static bool snap_still(int k, const struct snap *s) {
  return s->valid && atomic_load(&S->k[k].gen) == s->gen &&
         atomic_load(&S->k[k].clearing) == 0;
}

/* A successful publish of now + delay, where `before` was read before the
 * call: the library's not-before is now >= before + delay. */
static void record_publish(int k, const struct snap *s, uint64_t before,
                           uint64_t delay_ms) {
  if (!snap_still(k, s))
    return;
  uint64_t rel = before + delay_ms * NS_PER_MS - S->base_ns;
  struct key *K = &S->k[k];
  uint64_t cur = atomic_load(&K->pub);
  for (;;) {
    if ((uint32_t)(cur >> 48) != (s->gen & 0xffff) || (cur & NB_MASK) >= rel)
      return;
    uint64_t want = ((uint64_t)(s->gen & 0xffff) << 48) | rel;
    if (atomic_compare_exchange_weak(&K->pub, &cur, want)) {
      bump(&S->publishes_recorded);
      return;
    }
  }
}

static void flag_early(int k, const char *what, uint64_t nb, uint64_t t,
                       uint64_t extra) {
  bump(&S->early);
  fprintf(stderr,
          "torture: EARLY: worker %d %s(%s) at %.3f ms before the recorded "
          "not-before (extra %" PRIu64 ")\n",
          me, what, S->k[k].name, (double)(nb - t) / 1e6, extra);
}

/* An admission (or an open wait) ending at `after` must not precede the
 * not-before recorded before the call. */
static void check_not_early(int k, const struct snap *s, uint64_t after,
                            const char *what) {
  if (!snap_still(k, s) || s->nb == 0)
    return;
  bump(&S->nb_checks);
  if (after + TOL_NS < s->nb)
    flag_early(k, what, s->nb, after, 0);
}

/* throttle_remaining() = ms, returned at `after`. */
static void check_remaining(int k, const struct snap *s, uint64_t after,
                            uint64_t ms) {
  if (!snap_still(k, s) || s->nb <= after)
    return;
  bump(&S->nb_checks);
  if (ms * NS_PER_MS + TOL_NS < s->nb - after)
    flag_early(k, "remaining", s->nb, after + ms * NS_PER_MS, ms);
}

/* A worker that has died but is not yet reaped (a zombie: a victim that
 * died at its crash point waits for the parent's next reap) still has its
 * bit set, but the library rightly counts it dead: it sends nothing. */
static bool worker_dead(int w) {
  int pid = atomic_load(&S->w[w].pid);
  if (pid <= 0)
    return true;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p != NULL && (p[2] == 'Z' || p[2] == 'X');
}

static void hold_begin(int k) {
  uint64_t bit = UINT64_C(1) << me;
  uint64_t v = atomic_fetch_or(&S->k[k].holders, bit);
  if (v & bit) {
    fprintf(stderr, "torture: worker %d: already marked as a holder of %s\n",
            me, S->k[k].name);
    bump(&S->errors);
  }
  v |= bit;
  int n = __builtin_popcountll(v);
  if (S->k[k].cap > 0 && n > S->k[k].cap)
    for (int w = 0; w < MAX_WORKERS; w++)
      if (w != me && (v & (UINT64_C(1) << w)) && worker_dead(w))
        n--;
  if (S->k[k].cap > 0 && n > S->k[k].cap) {
    bump(&S->cap_violations);
    fprintf(stderr,
            "torture: CAP: worker %d admitted to %s with %d live holders "
            "(cap %d, mask 0x%" PRIx64 ")\n",
            me, S->k[k].name, n, S->k[k].cap, v);
  }
}

static void hold_end(int k) {
  atomic_fetch_and(&S->k[k].holders, ~(UINT64_C(1) << me));
}

/* ---- a worker's operations ----------------------------------------------- */

static uint64_t rnd_delay_ms(uint64_t *rs) { return 1 + rnd(rs, 20); }

static void do_leave(throttle_t *h, int k, throttle_ticket_t *t, uint64_t *rs) {
  unsigned p = rnd(rs, 100);
  throttle_outcome_t out;
  if (p < 55)
    out = THROTTLE_OUTCOME_OK;
  else if (p < 75)
    out = THROTTLE_OUTCOME_LOCKED;
  else if (p < 80)
    out = THROTTLE_OUTCOME_RATE_LIMITED;
  else if (p < 85)
    out = THROTTLE_OUTCOME_UNAVAILABLE;
  else if (p < 90)
    out = THROTTLE_OUTCOME_PERMANENT;
  else if (p < 95)
    out = THROTTLE_OUTCOME_FAILED;
  else
    out = THROTTLE_OUTCOME_ABANDONED;
  bool publishes = out == THROTTLE_OUTCOME_LOCKED ||
                   out == THROTTLE_OUTCOME_RATE_LIMITED ||
                   out == THROTTLE_OUTCOME_UNAVAILABLE;
  uint64_t delay = publishes ? rnd_delay_ms(rs) : 0;
  hold_end(k);
  op_begin(OP_LEAVE, k, BOUND_NS);
  struct snap s = snap_take(k);
  uint64_t before = th_now_ns();
  int rc = throttle_leave(h, t, out, delay);
  if (rc != 0)
    unexpected("leave", k, rc, h);
  else if (publishes)
    record_publish(k, &s, before, delay);
  op_end();
}

/* enter or try_enter, then hold a moment, then leave. */
static void do_admission(throttle_t *h, int k, bool try, uint64_t *rs) {
  throttle_class_t cls =
      rnd(rs, 4) == 0 ? THROTTLE_CLASS_BACKFILL : THROTTLE_CLASS_LIVE;
  uint64_t timeout = rnd(rs, 10) == 0 ? 300 : rnd(rs, 50);
  op_begin(try ? OP_TRY : OP_ENTER, k,
           try ? BOUND_NS : timeout * NS_PER_MS + SLACK_NS);
  struct snap s = snap_take(k);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  int rc = try ? throttle_try_enter(h, S->k[k].name, cls, &t, &wait_ms)
               : throttle_enter(h, S->k[k].name, cls, timeout, &t);
  uint64_t after = th_now_ns();
  op_end();
  if (rc != 0) {
    if (rc != (try ? THROTTLE_EWOULDBLOCK : THROTTLE_ETIMEDOUT) &&
        rc != THROTTLE_ECANCELED)
      unexpected(try ? "try_enter" : "enter", k, rc, h);
    return;
  }
  bump(&S->admissions);
  hold_begin(k);
  check_not_early(k, &s, after, try ? "try_enter" : "enter");
  op_begin(OP_HOLD, k, BOUND_NS);
  if (rnd(rs, 3) == 0) {
    struct snap s2 = snap_take(k);
    uint64_t ms = 0;
    rc = throttle_remaining(h, S->k[k].name, &ms);
    if (rc != 0)
      unexpected("remaining", k, rc, h);
    else
      check_remaining(k, &s2, th_now_ns(), ms);
  }
  if (rnd(rs, 2) == 0)
    sleep_us(rnd(rs, 1000));
  op_end();
  do_leave(h, k, t, rs);
}

static void do_clear(throttle_t *h, int k) {
  struct key *K = &S->k[k];
  uint64_t bit = UINT64_C(1) << me;
  op_begin(OP_CLEAR, k, BOUND_NS);
  atomic_fetch_or(&K->clearing, bit);
  atomic_fetch_add(&K->gen, 1);
  int rc = throttle_clear(h, K->name);
  if (rc != 0)
    unexpected("clear", k, rc, h);
  /* Move pub to the current generation, nothing recorded. */
  uint64_t cur = atomic_load(&K->pub);
  for (;;) {
    uint32_t g = atomic_load(&K->gen) & 0xffff;
    if ((uint32_t)(cur >> 48) == g)
      break;
    if (atomic_compare_exchange_weak(&K->pub, &cur, (uint64_t)g << 48))
      break;
  }
  atomic_fetch_and(&K->clearing, ~bit);
  op_end();
}

static int count_key(const throttle_info_t *info, void *arg) {
  (void)info;
  (*(int *)arg)++;
  return 0;
}

static void check_info(throttle_t *h, int k) {
  throttle_info_t *info = NULL;
  op_begin(OP_INFO, k, BOUND_NS);
  int rc = throttle_info(h, S->k[k].name, &info);
  op_end();
  if (rc != 0) {
    unexpected("info", k, rc, h);
    return;
  }
  int64_t in = throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT);
  int64_t cap = throttle_info_get(info, THROTTLE_FIELD_CAP);
  if (S->k[k].cap > 0 && (cap != S->k[k].cap || in > cap)) {
    bump(&S->cap_violations);
    fprintf(stderr,
            "torture: CAP: %s: library in_flight %" PRId64 " cap %" PRId64
            " (fixed %d)\n",
            S->k[k].name, in, cap, S->k[k].cap);
  }
  throttle_info_free(info);
}

/* One random operation on key k; p (0..999) picks which. */
static void one_op(throttle_t *h, int k, unsigned p, uint64_t *rsp) {
  uint64_t rs = *rsp;
  const char *key = S->k[k].name;
  int rc;
  if (p < 300) {
    do_admission(h, k, false, &rs);
  } else if (p < 400) {
    do_admission(h, k, true, &rs);
  } else if (p < 480) {
    uint64_t d = rnd_delay_ms(&rs);
    op_begin(OP_BACKOFF, k, BOUND_NS);
    struct snap s = snap_take(k);
    uint64_t before = th_now_ns();
    rc = throttle_backoff(h, key, d);
    if (rc != 0)
      unexpected("backoff", k, rc, h);
    else
      record_publish(k, &s, before, d);
    op_end();
  } else if (p < 580) {
    uint64_t timeout = rnd(&rs, 50);
    op_begin(OP_WAIT, k, timeout * NS_PER_MS + SLACK_NS);
    struct snap s = snap_take(k);
    rc = throttle_wait(h, key, timeout);
    uint64_t after = th_now_ns();
    if (rc == 0)
      check_not_early(k, &s, after, "wait");
    else if (rc != THROTTLE_ETIMEDOUT)
      unexpected("wait", k, rc, h);
    op_end();
  } else if (p < 730) {
    op_begin(OP_REMAINING, k, BOUND_NS);
    struct snap s = snap_take(k);
    uint64_t ms = 0;
    rc = throttle_remaining(h, key, &ms);
    uint64_t after = th_now_ns();
    if (rc != 0)
      unexpected("remaining", k, rc, h);
    else
      check_remaining(k, &s, after, ms);
    op_end();
  } else if (p < 760) {
    do_clear(h, k);
  } else if (p < 790 && S->k[k].transient) {
    check_info(h, k); /* a cap would keep it from ever being evicted */
  } else if (p < 790) {
    op_begin(OP_SETCAP, k, BOUND_NS);
    rc = throttle_set_max_parallel(h, key, (uint32_t)S->k[k].cap);
    if (rc != 0)
      unexpected("set_max_parallel", k, rc, h);
    op_end();
  } else if (p < 870) {
    check_info(h, k);
  } else if (p < 900) {
    int n = 0;
    op_begin(OP_FOREACH, -1, BOUND_NS);
    rc = throttle_foreach(h, count_key, &n);
    if (rc != 0 || n < nkept) {
      if (rc == 0)
        fprintf(stderr, "torture: foreach listed %d keys\n", n);
      unexpected("foreach", -1, rc, h);
    }
    op_end();
  } else if (p < 915) {
    op_begin(OP_CANCEL, k, BOUND_NS);
    rc = throttle_cancel(h, key);
    if (rc != 0)
      unexpected("cancel", k, rc, h);
    op_end();
  } else if (p < 922) {
    op_begin(OP_PAUSE, k, BOUND_NS);
    atomic_store(&S->w[me].paused_key, k);
    rc = throttle_pause(h, key);
    if (rc != 0)
      unexpected("pause", k, rc, h);
    sleep_us(1000 + rnd(&rs, 2000));
    rc = throttle_resume(h, key);
    if (rc != 0)
      unexpected("resume", k, rc, h);
    atomic_store(&S->w[me].paused_key, -1);
    op_end();
  } else if (p < 940) {
    uint64_t repairs;
    op_begin(OP_STATS, -1, BOUND_NS);
    rc = throttle_stats(h, NULL, NULL, NULL, &repairs);
    if (rc != 0)
      unexpected("stats", -1, rc, h);
    op_end();
  } else if (rnd(&rs, 4) == 0) {
    sleep_us(rnd(&rs, 1000));
  }
  *rsp = rs;
}

/* The operations that take the mutex and return at once: run back to back,
 * they put a kill inside the critical section far more often. */
static const unsigned fast_ops[] = {350, 350, 400, 400, 400, 600,
                                    600, 760, 790, 790, 930, 730};

/* Half the time a fixed key, half the time a transient one. */
static int pick_key(uint64_t *rs) {
  if (ntrans > 0 && rnd(rs, 2) == 0)
    return nkeys + (int)rnd(rs, (unsigned)ntrans);
  return (int)rnd(rs, (unsigned)nkeys);
}

static int worker_main(uint64_t seed) {
  signal(SIGINT, SIG_IGN); /* the parent decides when workers end */
  uint64_t rs = seed;
  op_begin(OP_OPEN, -1, BOUND_NS);
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  if (rc != 0 || !throttle_is_shared(h)) {
    unexpected("open", -1, rc, h);
    throttle_close(h);
    return 1;
  }
  op_end();
  while (!atomic_load(&S->stop)) {
    if (rnd(&rs, 8) == 0) {
      unsigned n = 10 + rnd(&rs, 200);
      for (unsigned i = 0; i < n && !atomic_load(&S->stop); i++)
        one_op(h, pick_key(&rs),
               fast_ops[rnd(&rs, sizeof fast_ops / sizeof fast_ops[0])], &rs);
    } else {
      one_op(h, pick_key(&rs), rnd(&rs, 1000), &rs);
    }
  }
  op_begin(OP_CLOSE, -1, BOUND_NS);
  throttle_close(h);
  op_end();
  return 0;
}

/* ---- the parent ---------------------------------------------------------- */

static uint64_t crashes, restarts;
static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

/* A quarter of the victims are armed: they die by SIGKILL at one of these
 * named points (THROTTLE_CRASH_AT, compiled into the test build), which
 * random kills only rarely hit — inside the mutex, half-way through an
 * update, between granting a slot and waking its holder, between freeing
 * a slot and handing it over, half-way through inserting or evicting a
 * key. */
static const char *const crash_points[] = {
    "after-lock",     "mid-update",       "gate-mid-grant",
    "gate-mid-leave", "table-mid-insert", "table-mid-evict"};
#define NCRASH_POINTS (int)(sizeof crash_points / sizeof crash_points[0])
static uint64_t crashpoint_deaths;

static void spawn(int w, uint64_t seed) {
  fflush(stdout);
  fflush(stderr);
  atomic_store(&S->w[w].deadline, 0);
  atomic_store(&S->w[w].paused_key, -1);
  atomic_store(&S->w[w].killing, 0);
  int armed = w >= nwitnesses && seed % 4 == 0
                  ? 1 + (int)((seed >> 8) % NCRASH_POINTS)
                  : 0;
  atomic_store(&S->w[w].armed, armed);
  pid_t pid = fork();
  if (pid < 0) {
    perror("torture: fork");
    exit(2);
  }
  if (pid == 0) {
    me = w;
    if (armed && setenv("THROTTLE_CRASH_AT", crash_points[armed - 1], 1) != 0)
      _exit(3);
    _exit(worker_main(seed));
  }
  atomic_store(&S->w[w].pid, pid);
}

/* The parent's own handle, for resuming keys a dead worker left paused and
 * for the final checks. */
static throttle_t *ph;

/* Worker w is gone (status st): undo what it can no longer undo. */
static void buried(int w, int st) {
  uint64_t bit = UINT64_C(1) << w;
  bool killed = atomic_load(&S->w[w].killing);
  bool armed = atomic_load(&S->w[w].armed) != 0;
  bool sigkill = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
  if (armed && sigkill && !killed)
    crashpoint_deaths++;
  if (!((killed || armed) && sigkill) &&
      !(WIFEXITED(st) && WEXITSTATUS(st) == 0 && atomic_load(&S->stop))) {
    crashes++;
    fprintf(stderr, "torture: worker %d (pid %d) ended on its own: %s %d\n", w,
            atomic_load(&S->w[w].pid),
            WIFSIGNALED(st) ? "signal" : "exit status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  }
  for (int k = 0; k < nall; k++) {
    struct key *K = &S->k[k];
    atomic_fetch_and(&K->holders, ~bit);
    if (atomic_load(&K->clearing) & bit) {
      /* Its clear may or may not have happened: forget what was recorded. */
      uint32_t g = atomic_fetch_add(&K->gen, 1) + 1;
      atomic_store(&K->pub, (uint64_t)(g & 0xffff) << 48);
      atomic_fetch_and(&K->clearing, ~bit);
    }
  }
  int pk = atomic_load(&S->w[w].paused_key);
  if (pk >= 0) {
    int rc = throttle_resume(ph, S->k[pk].name);
    if (rc != 0 && rc != THROTTLE_ENOKEY)
      fprintf(stderr, "torture: resume(%s): %s\n", S->k[pk].name,
              throttle_err_name(rc));
  }
  atomic_store(&S->w[w].pid, 0);
  atomic_store(&S->w[w].deadline, 0);
}

static int worker_of(pid_t pid) {
  for (int w = 0; w < nworkers; w++)
    if (atomic_load(&S->w[w].pid) == pid)
      return w;
  return -1;
}

/* Reap whatever has ended; returns how many. */
static int reap_any(void) {
  int n = 0, st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    int w = worker_of(pid);
    if (w >= 0) {
      buried(w, st);
      n++;
    }
  }
  return n;
}

static void dump_key(throttle_t *h, int k) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, S->k[k].name, &info);
  if (rc != 0) {
    fprintf(stderr, "torture:   %s: info: %s\n", S->k[k].name,
            throttle_err_name(rc));
    return;
  }
  fprintf(stderr, "torture:   %s:", S->k[k].name);
  for (int f = 0; f < THROTTLE_FIELD_COUNT_; f++)
    fprintf(stderr, " %s=%" PRId64, throttle_field_name((throttle_field_t)f),
            throttle_info_get(info, (throttle_field_t)f));
  fprintf(stderr, "\n");
  int64_t pid, age;
  throttle_class_t cls;
  int probe;
  for (size_t i = 0;
       throttle_info_holder(info, i, &pid, &age, &cls, &probe) == 0; i++)
    fprintf(stderr,
            "torture:     holder pid %" PRId64 " age %" PRId64
            " ms class %d probe %d\n",
            pid, age, (int)cls, probe);
  throttle_info_free(info);
}

/* Any worker past its operation's bound hangs: count it, show it, end it. */
static void check_hangs(uint64_t *rs) {
  uint64_t now = mono_ns();
  for (int w = 0; w < nworkers; w++) {
    uint64_t d = atomic_load(&S->w[w].deadline);
    int pid = atomic_load(&S->w[w].pid);
    if (d == 0 || pid == 0 || now <= d)
      continue;
    if (!atomic_compare_exchange_strong(&S->w[w].deadline, &d, 0))
      continue; /* it just finished */
    int op = atomic_load(&S->w[w].op), k = atomic_load(&S->w[w].key);
    bump(&S->hangs);
    fprintf(stderr,
            "torture: HANG: worker %d (pid %d) in %s(%s) past its "
            "bound\n",
            w, pid, op >= 0 && op < OP_COUNT_ ? op_name[op] : "?",
            k >= 0 && k < nall ? S->k[k].name : "-");
    if (k >= 0 && k < nall)
      dump_key(ph, k);
    atomic_store(&S->w[w].killing, 1);
    kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
    buried(w, st);
    if (!atomic_load(&S->stop)) {
      spawn(w, rng_next(rs));
      restarts++;
    }
  }
}

/* Slots of key k that are not free (holders, waiters, canceled waiters),
 * read from the record itself: the info fields leave canceled ones out.
 * Only the parent is left when this runs, so nothing changes under it. */
static int busy_slots(int k) {
  const char *key = S->k[k].name;
  size_t len = strlen(key);
  for (uint32_t i = 0; i < ph->capacity; i++) {
    const struct throttle__rec *r = &ph->recs[i];
    if (r->state != THROTTLE__REC_USED || r->key_len != len ||
        memcmp(r->key, key, len) != 0)
      continue;
    int n = 0;
    for (uint32_t j = 0; j < THROTTLE__SLOTS; j++)
      n += r->slot[j].state != THROTTLE__SLOT_FREE;
    return n;
  }
  return -1; /* not in the table */
}

/* (c): every slot a dead process held or waited in comes back, by death
 * detection rather than by its lease: all within half the lease of the
 * moment every worker was killed.  Entering a key makes the library look
 * for dead participants. */
static uint64_t reclaim_all(uint64_t killed_at) {
  uint64_t deadline = killed_at + (uint64_t)LEASE_MS / 2 * NS_PER_MS;
  bool clean[MAX_KEYS] = {false};
  int left = nall;
  while (left > 0 && mono_ns() < deadline) {
    for (int k = 0; k < nall; k++) {
      if (clean[k])
        continue;
      if (S->k[k].evictable && busy_slots(k) < 0) {
        clean[k] = true; /* evicted, so nothing held */
        left--;
        continue;
      }
      throttle_ticket_t *t = NULL;
      uint64_t t0 = mono_ns();
      if (throttle_enter(ph, S->k[k].name, THROTTLE_CLASS_LIVE, 100, &t) == 0)
        throttle_leave(ph, t, THROTTLE_OUTCOME_OK, 0);
      if (mono_ns() - t0 > 100 * NS_PER_MS + SLACK_NS) {
        bump(&S->hangs);
        fprintf(stderr,
                "torture: HANG: the final enter+leave of %s took "
                "%.0f ms (timeout 100 ms)\n",
                S->k[k].name, (double)(mono_ns() - t0) / 1e6);
      }
      if (busy_slots(k) == 0) {
        clean[k] = true;
        left--;
      }
    }
    sleep_us(10 * 1000);
  }
  for (int k = 0; k < nall; k++)
    if (!clean[k]) {
      fprintf(stderr,
              "torture: UNRECLAIMED: %s: %d slots still taken %.0f ms "
              "after every worker died\n",
              S->k[k].name, busy_slots(k),
              (double)(mono_ns() - killed_at) / 1e6);
      dump_key(ph, k);
    }
  return (uint64_t)left;
}

/* (e): the table itself, after everyone died and the last repair ran
 * (th_table_faults: every record found by its key, counts and free list
 * right, nothing left half done), and no key with a cap lost. */
static void validate_table(void) {
  char why[256];
  int n = th_table_faults(ph, why, sizeof why);
  if (n != 0) {
    bump(&S->errors);
    fprintf(stderr, "torture: TABLE: %d faults, the first: %s\n", n, why);
  }
  for (int k = 0; k < nkeys; k++) {
    if (S->k[k].evictable)
      continue;
    throttle_info_t *info = NULL;
    if (throttle_info(ph, S->k[k].name, &info) != 0) {
      bump(&S->errors);
      fprintf(stderr, "torture: TABLE: %s is gone\n", S->k[k].name);
    }
    throttle_info_free(info);
  }
}

static void usage(void) {
  fprintf(stderr,
          "usage: torture [--kills N] [--workers 2..%d] [--keys 1..%d] "
          "[--transient 0..%d] [--witnesses W] [--seed S] "
          "[--capacity C]\n",
          MAX_WORKERS, MAX_FIXED, MAX_TRANSIENT);
  exit(64);
}

static void cleanup(void) {
  if (segname[0])
    throttle_unlink(segname);
}

int main(int argc, char **argv) {
  uint64_t kills_wanted = 2000;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
  uint32_t want_capacity = 0;
  for (int i = 1; i < argc; i += 2) { /* --option value */
    char *end = NULL;
    if (i + 1 >= argc)
      usage();
    unsigned long long v = strtoull(argv[i + 1], &end, 0);
    if (end == argv[i + 1] || *end != 0)
      usage();
    if (strcmp(argv[i], "--kills") == 0)
      kills_wanted = v;
    else if (strcmp(argv[i], "--workers") == 0 && v >= 1 && v <= MAX_WORKERS)
      nworkers = (int)v;
    else if (strcmp(argv[i], "--keys") == 0 && v >= 1 && v <= MAX_FIXED)
      nkeys = (int)v;
    else if (strcmp(argv[i], "--transient") == 0 && v <= MAX_TRANSIENT)
      ntrans = (int)v;
    else if (strcmp(argv[i], "--witnesses") == 0 && v < MAX_WORKERS)
      nwitnesses = (int)v;
    else if (strcmp(argv[i], "--seed") == 0)
      seed = v;
    else if (strcmp(argv[i], "--capacity") == 0 && v >= 1 && v <= 1024)
      want_capacity = (uint32_t)v;
    else
      usage();
  }
  if (nwitnesses >= nworkers)
    usage();
  nall = nkeys + ntrans;
  /* Room for the fixed keys and half the transient ones: new keys keep
   * evicting idle ones, and now and then find none to evict (EFULL). */
  uint32_t capacity = (uint32_t)(nkeys + (ntrans + 1) / 2);
  if (capacity < 8)
    capacity = 8;
  if (want_capacity != 0) { /* the keys with a fixed cap must fit */
    int kept = 0;
    for (int k = 0; k < nkeys; k++)
      kept += k % 4 != 3;
    if (want_capacity < (uint32_t)kept)
      usage();
    capacity = want_capacity;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf(
      "torture: seed=%" PRIu64
      " workers=%d witnesses=%d keys=%d transient=%d capacity=%u kills=%" PRIu64
      "\n",
      seed, nworkers, nwitnesses, nkeys, ntrans, capacity, kills_wanted);
  uint64_t rs = seed;

  S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
           -1, 0);
  if (S == MAP_FAILED) {
    perror("torture: mmap");
    return 2;
  }
  memset(S, 0, sizeof *S);
  S->base_ns = th_now_ns();

  snprintf(segname, sizeof segname, "/torture-%ld", (long)getpid());
  throttle_unlink(segname);
  atexit(cleanup);
  cfg = throttle_config_new();
  if (cfg == NULL || throttle_config_set_segment(cfg, segname) != 0 ||
      throttle_config_set_capacity(cfg, capacity) != 0 ||
      throttle_config_set_lock_timeout(cfg, LOCK_TIMEOUT_MS) != 0 ||
      throttle_config_set_lease(cfg, LEASE_MS) != 0 ||
      throttle_config_set_max_delay(cfg, MAX_DELAY_MS) != 0 ||
      throttle_config_set_flags(cfg, THROTTLE_NO_FALLBACK) != 0) {
    fprintf(stderr, "torture: config failed\n");
    return 2;
  }
  int rc = throttle_open(cfg, &ph);
  if (rc != 0) {
    fprintf(stderr, "torture: open %s: %s: %s\n", segname,
            throttle_err_name(rc), throttle_errmsg(NULL));
    return 2;
  }
  static const int caps[] = {1, 2, 3, 0};
  nkept = 0;
  for (int k = 0; k < nkeys; k++) {
    snprintf(S->k[k].name, sizeof S->k[k].name, "torture:k%d", k);
    S->k[k].cap = caps[k % 4];
    S->k[k].evictable = S->k[k].cap == 0;
    nkept += !S->k[k].evictable;
    rc = throttle_set_max_parallel(ph, S->k[k].name, (uint32_t)S->k[k].cap);
    if (rc != 0) {
      fprintf(stderr, "torture: set_max_parallel: %s\n", throttle_err_name(rc));
      return 2;
    }
  }
  for (int k = nkeys; k < nall; k++) {
    snprintf(S->k[k].name, sizeof S->k[k].name, "torture:t%d", k - nkeys);
    S->k[k].transient = true;
    S->k[k].evictable = true;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  uint64_t t0 = mono_ns();
  for (int w = 0; w < nworkers; w++)
    spawn(w, rng_next(&rs));

  uint64_t kills = 0;
  while (kills < kills_wanted && !interrupted) {
    uint64_t until = mono_ns() + (1 + rnd(&rs, 5)) * NS_PER_MS;
    while (mono_ns() < until) {
      sleep_us(250);
      check_hangs(&rs);
    }
    reap_any(); /* workers that ended on their own */
    for (int w = 0; w < nworkers; w++)
      if (atomic_load(&S->w[w].pid) == 0) {
        spawn(w, rng_next(&rs));
        restarts++;
      }
    int w = nwitnesses + (int)rnd(&rs, (unsigned)(nworkers - nwitnesses));
    pid_t pid = atomic_load(&S->w[w].pid);
    atomic_store(&S->w[w].killing, 1);
    kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
    buried(w, st);
    kills++;
    spawn(w, rng_next(&rs));
  }

  /* The whole fleet dies at once. */
  atomic_store(&S->stop, 1);
  check_hangs(&rs);
  for (int w = 0; w < nworkers; w++) {
    pid_t pid = atomic_load(&S->w[w].pid);
    if (pid == 0)
      continue;
    atomic_store(&S->w[w].killing, 1);
    kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
    buried(w, st);
  }
  uint64_t killed_at = mono_ns();
  for (int k = 0; k < nall; k++)
    throttle_resume(ph, S->k[k].name);
  uint64_t unreclaimed = reclaim_all(killed_at);
  validate_table();

  /* (e) the segment is still what it should be. */
  throttle_config_t *c2 = throttle_config_new();
  throttle_t *h2 = NULL;
  uint64_t repairs = 0, evictions = 0;
  int n = 0;
  if (c2 == NULL || throttle_config_set_segment(c2, segname) != 0 ||
      throttle_config_set_flags(c2, THROTTLE_NO_FALLBACK |
                                        THROTTLE_NO_CREATE) != 0 ||
      (rc = throttle_open(c2, &h2)) != 0 || !throttle_is_shared(h2)) {
    fprintf(stderr, "torture: the segment does not reopen: %s: %s\n",
            throttle_err_name(rc), throttle_errmsg(NULL));
    bump(&S->errors);
  } else {
    if ((rc = throttle_foreach(h2, count_key, &n)) != 0 || n > nall) {
      fprintf(stderr, "torture: foreach: %s, %d keys (at most %d)\n",
              throttle_err_name(rc), n, nall);
      bump(&S->errors);
    }
    if ((rc = throttle_stats(h2, NULL, NULL, &evictions, &repairs)) != 0) {
      fprintf(stderr, "torture: stats: %s\n", throttle_err_name(rc));
      bump(&S->errors);
    }
    for (int k = 0; k < nkeys; k++) {
      uint64_t ms = UINT64_MAX;
      if (throttle_remaining(h2, S->k[k].name, &ms) != 0 || ms > MAX_DELAY_MS) {
        fprintf(stderr, "torture: %s: remaining %" PRIu64 " ms\n", S->k[k].name,
                ms);
        bump(&S->errors);
      }
    }
  }
  throttle_close(h2);
  throttle_config_free(c2);
  throttle_close(ph);
  throttle_config_free(cfg);

  double secs = (double)(mono_ns() - t0) / 1e9;
  uint64_t hangs = atomic_load(&S->hangs);
  uint64_t capv = atomic_load(&S->cap_violations);
  uint64_t early = atomic_load(&S->early);
  uint64_t errors = atomic_load(&S->errors);
  printf("torture: admissions=%" PRIu64 " publishes_recorded=%" PRIu64
         " not_before_checks=%" PRIu64 " crashpoint_deaths=%" PRIu64
         " restarts=%" PRIu64 " evictions=%" PRIu64 "\n",
         (uint64_t)atomic_load(&S->admissions),
         (uint64_t)atomic_load(&S->publishes_recorded),
         (uint64_t)atomic_load(&S->nb_checks), crashpoint_deaths, restarts,
         evictions);
  if (errors || crashes || interrupted)
    printf("torture: unexpected_errors=%" PRIu64 " crashes=%" PRIu64 "%s\n",
           errors, crashes, interrupted ? " interrupted" : "");
  printf("torture: kills=%" PRIu64 " ops=%" PRIu64 " hangs=%" PRIu64
         " cap_violations=%" PRIu64 " early=%" PRIu64 " unreclaimed=%" PRIu64
         " repairs=%" PRIu64 " seconds=%.1f seed=%" PRIu64 "\n",
         kills, (uint64_t)atomic_load(&S->ops), hangs, capv, early, unreclaimed,
         repairs, secs, seed);
  return hangs || capv || early || unreclaimed || errors || crashes ||
                 interrupted
             ? 1
             : 0;
}
