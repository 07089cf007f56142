/*
 * gate.c — admission: a key's record as a gate.  One probe per lock
 * episode, a FIFO concurrency cap (fixed or learned), live before backfill,
 * a GCRA rate, pause and cancel, and reclaiming the slots of dead holders.
 *
 * Each key has THROTTLE__SLOTS participant slots (holders and waiters).  A
 * caller registers in a slot with an arrival ticket, and sleeps on the
 * slot's own futex word.  Whoever changes what the gate allows (a leaving
 * holder above all) runs grant_locked(), which turns the oldest eligible
 * waiters' slots into holders and bumps their words; the waker wakes them
 * after unlocking.  Waiting therefore holds no slot that counts against the
 * cap and no mutex (I4), and a slot goes to the next waiter without polling.
 * Time-driven openings (a not-before passing, a rate token, a lease lapsing)
 * have no waker: each waiter sleeps at most until the next such instant
 * (plus jitter) and then runs grant_locked() itself.
 *
 * Dead holders.  A slot records pid and the process's start time (field 22
 * of /proc/PID/stat), so a reused pid is not mistaken for the holder.  A
 * holder whose process is gone (or a zombie) is reclaimed at the next look
 * (at most every REAP_NS per key, only when someone is waiting); a live but
 * hung holder is reclaimed when its lease lapses.  Rejected: OFD locks per
 * slot (reliable death detection, but inherited across fork(), so a child
 * would keep a dead parent's slot alive and cannot tell its parent's slots
 * from its own), and pid alone (pid reuse).
 *
 * The learned cap ("auto") starts at 1 and, until a lock signal is seen,
 * grows by one per success (slow start: the first contact with a locked
 * table costs one refused request, not one per process).  A LOCKED answer
 * while other holders were in flight halves it (floor 1) and remembers that
 * point; past it the cap grows by one only after 64 * cap successes, and
 * that interval doubles with each raise that fails again, so probing for
 * more room costs a refused request (and one back-off) every few hundred
 * successes at most.
 */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REAP_NS (50 * THROTTLE__NS_PER_MS)
#define POLL_NS THROTTLE__POLL_NS
#define DEFAULT_LOCK_DELAY_MS 5000u
#define MAX_AUTO_FAILS 10u

struct throttle_ticket {
  throttle_t *h;
  uint64_t hash;
  uint64_t ticket;
  uint32_t slot;
  int probe;
  size_t len;
  void *be; /* the backend's admission (backend.h), or NULL */
  char key[THROTTLE__KEY_MAX + 1];
};

/* ---- processes ------------------------------------------------------- */

/* What /proc says of a process: a zombie (dead to us: a killed child its
 * parent has not reaped yet), missing (no entry: gone, or hidden from us by
 * hidepid or a /proc of another PID namespace), alive with its start time
 * in clock ticks since boot, or unknown (unreadable, e.g. out of file
 * descriptors). */
enum { PROC_ZOMBIE, PROC_MISSING, PROC_ALIVE, PROC_UNKNOWN };

static int proc_start(pid_t pid, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT || errno == ESRCH ? PROC_MISSING : PROC_UNKNOWN;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int e = errno;
  close(fd);
  if (n <= 0)
    return n < 0 && e == ESRCH ? PROC_MISSING : PROC_UNKNOWN;
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (p == NULL || p[1] != ' ')
    return PROC_UNKNOWN;
  char state = p[2];
  if (state == 'Z' || state == 'X' || state == 'x')
    return PROC_ZOMBIE;
  /* Field 3 is the state; the start time is field 22. */
  p += 2;
  for (int field = 3; field < 22 && p != NULL; field++) {
    p = strchr(p, ' ');
    if (p != NULL)
      p++;
  }
  if (p == NULL)
    return PROC_UNKNOWN;
  *start = strtoull(p, NULL, 10);
  return PROC_ALIVE;
}

/* This process's start time and PID namespace (the inode of
 * /proc/self/ns/pid), 0 when /proc could not tell.  Cached per pid, so a
 * forked child looks again. */
struct self_id {
  uint64_t start;
  uint64_t pidns;
};

static struct self_id my_id(void) {
  static _Atomic int64_t cached_pid;
  static _Atomic uint64_t cached_start, cached_ns;
  pid_t me = getpid();
  if (atomic_load(&cached_pid) != me) {
    uint64_t st = 0;
    if (proc_start(me, &st) != PROC_ALIVE)
      st = 0;
    struct stat sb;
    uint64_t ns = stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino
                                                      : 0;
    atomic_store(&cached_start, st);
    atomic_store(&cached_ns, ns);
    atomic_store(&cached_pid, me);
  }
  return (struct self_id){atomic_load(&cached_start), atomic_load(&cached_ns)};
}

/* Dead only on evidence: a live holder's slot must never be taken because
 * it could not be seen (that would admit over the cap, I5).  Evidence is
 * judged only within one PID namespace, known on both sides: a pid of
 * another namespace names some other process here (two containers of a
 * pod share IPC and /dev/shm but not their PIDs), so such a holder, or one
 * whose namespace is unknown, lives until its lease lapses.  Within the
 * namespace: kill() saying ESRCH, a zombie, or another start time on the
 * pid (reused).  A missing /proc entry of a process kill() still finds
 * is hidden (hidepid, another /proc), not dead; if it really just died,
 * the next look sees ESRCH. */
static bool holder_alive(const struct throttle__slot *s) {
  struct self_id me = my_id();
  if (s->pidns == 0 || me.pidns == 0 || s->pidns != me.pidns)
    return true;
  if (s->pid == (uint32_t)getpid())
    return true;
  if (s->pid == 0 || s->pid > INT32_MAX)
    return false;
  if (kill((pid_t)s->pid, 0) != 0 && errno == ESRCH)
    return false;
  uint64_t st = 0;
  switch (proc_start((pid_t)s->pid, &st)) {
  case PROC_ZOMBIE:
    return false;
  case PROC_ALIVE: /* another process now wears the pid? */
    return s->start == 0 || st == s->start;
  default:
    return true;
  }
}

/* ---- helpers on a record -------------------------------------------- */

static void sat_inc(uint64_t *c) {
  if (*c < UINT64_MAX)
    (*c)++;
}

static void bump(struct throttle__slot *s) {
  atomic_fetch_add_explicit(&s->word, 1, memory_order_release);
}

static uint32_t cap_of(const struct throttle__rec *r) {
  uint32_t c = r->fixed_cap ? r->fixed_cap : r->auto_cap;
  if (c < 1)
    c = 1;
  if (c > THROTTLE__SLOTS)
    c = THROTTLE__SLOTS;
  return c;
}

static uint32_t share_of(const struct throttle__rec *r) {
  if (!(r->flags & THROTTLE__REC_SHARE_SET))
    return 1000;
  return r->share_permille > 1000 ? 1000 : r->share_permille;
}

static uint32_t backfill_cap(const struct throttle__rec *r, uint32_t cap) {
  uint32_t share = share_of(r);
  if (share == 0)
    return 0;
  uint32_t n = (uint32_t)(((uint64_t)cap * share) / 1000);
  return n < 1 ? 1 : n;
}

static void free_slot(struct throttle__slot *s) {
  s->state = THROTTLE__SLOT_FREE;
  s->probe = 0;
  s->ticket = 0;
  s->pid = 0;
  bump(s);
}

bool throttle__rec_idle(const struct throttle__rec *r, uint64_t now) {
  if (atomic_load_explicit(&r->not_before, memory_order_relaxed) > now)
    return false;
  if (r->fixed_cap || r->rate_n || (r->flags & (THROTTLE__REC_PAUSED |
                                                THROTTLE__REC_SHARE_SET)))
    return false; /* settings an operator made: never evicted */
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state != THROTTLE__SLOT_FREE)
      return false;
  return true;
}

void throttle__open_locked(struct throttle__rec *r) {
  atomic_store_explicit(&r->not_before, 0, memory_order_release);
  atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
  throttle__rec_flags(r, THROTTLE__REC_EPISODE, false);
  __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
  sat_inc(&r->clears);
}

/* Every wake changes the word it wakes on: a waiter that read its word
 * under the mutex and is between unlocking and futex_wait() would
 * otherwise miss the wake (the kernel compares the word, unchanged) and
 * sleep until its re-check, up to POLL_NS late for a resume, a clear or a
 * raised cap. */
void throttle__wake_rec(struct throttle__rec *r) {
  atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
  throttle__futex_wake(&r->epoch);
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state != THROTTLE__SLOT_FREE) {
      bump(&r->slot[i]);
      throttle__futex_wake(&r->slot[i].word);
    }
}

void throttle__publish_locked(throttle_t *h, struct throttle__rec *r,
                              uint64_t now, uint64_t delay_ns) {
  uint64_t seg_max = throttle__seg_max_ns(h);
  if (delay_ns > seg_max) /* the fleet's bound, not this process's own */
    delay_ns = seg_max;
  uint64_t cur = throttle__clamp_nb_locked(h, r, now);
  uint64_t want = throttle__sat_add(now, delay_ns);
  /* The episode first, the not-before second: a crash between the two
   * leaves an episode on an open key (the next caller probes alone), never
   * a not-before without an episode (when it passed, every waiter would go
   * at once: a herd). */
  throttle__rec_flags(r, THROTTLE__REC_EPISODE, true);
  THROTTLE__CRASHPOINT("gate-mid-publish");
  if (want > cur)
    atomic_store_explicit(&r->not_before, want, memory_order_release);
  sat_inc(&r->publishes);
  r->last_delay_ms = delay_ns / THROTTLE__NS_PER_MS;
  r->last_pid = (uint32_t)getpid();
  r->last_use_ns = now;
}

/* ---- time read from shared memory (I8) ------------------------------- */

/* Every time-like field is bounded where it is read and at repair, so that
 * one bad word delays a key by at most the segment's maximum delay (or a
 * slot by the longest lease), never forever.  Stored back, so every reader
 * sees the same bounded value. */
#define LEASE_MAX_MS 86400000u                                /* one day */
#define RATE_PERIOD_MAX_NS (UINT64_C(366) * 86400000 * THROTTLE__NS_PER_MS)

static void bound_slot_times(struct throttle__slot *s, uint64_t now) {
  if (s->lease_ms == 0 || s->lease_ms > LEASE_MAX_MS)
    s->lease_ms = LEASE_MAX_MS;
  if (s->since_ns > now) /* a grant in the future would never lapse */
    s->since_ns = now;
}

/* A conforming GCRA state never runs more than one period ahead of now. */
static void bound_rate(throttle_t *h, struct throttle__rec *r, uint64_t now) {
  if (r->rate_n != 0 && r->rate_period_ns == 0)
    r->rate_n = 0; /* no period: no rate (the setter never writes this) */
  if (r->rate_n == 0)
    return;
  if (r->rate_period_ns > RATE_PERIOD_MAX_NS)
    r->rate_period_ns = RATE_PERIOD_MAX_NS;
  uint64_t ahead = r->rate_period_ns;
  uint64_t max = throttle__seg_max_ns(h);
  if (ahead > max)
    ahead = max;
  uint64_t limit = throttle__sat_add(now, ahead);
  if (r->rate_tat_ns > limit)
    r->rate_tat_ns = limit;
}

/* After a crash inside the critical section: make every slot and setting
 * something the code below can trust. */
void throttle__gate_repair_locked(throttle_t *h, struct throttle__rec *r) {
  uint64_t now = throttle__now_ns();
  bound_rate(h, r, now);
  bool probe_found = false;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *s = &r->slot[i];
    bound_slot_times(s, now);
    if (s->state > THROTTLE__SLOT_CANCELED || s->cls > THROTTLE_CLASS_BACKFILL ||
        (s->state != THROTTLE__SLOT_FREE && (s->pid == 0 || s->ticket == 0))) {
      free_slot(s);
      continue;
    }
    if (s->state == THROTTLE__SLOT_HOLDING && r->probe_ticket != 0 &&
        s->ticket == r->probe_ticket)
      probe_found = true;
  }
  if (!probe_found)
    __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
  if (r->fixed_cap > THROTTLE__SLOTS)
    r->fixed_cap = THROTTLE__SLOTS;
  if (r->auto_cap < 1 || r->auto_cap > THROTTLE__SLOTS)
    r->auto_cap = 1;
  if (r->auto_fails > MAX_AUTO_FAILS)
    r->auto_fails = MAX_AUTO_FAILS;
}

/* ---- granting -------------------------------------------------------- */

struct wake {
  struct throttle__slot *slot[THROTTLE__SLOTS];
  uint32_t n;
};

static void wake_all(struct wake *w) {
  for (uint32_t i = 0; i < w->n; i++)
    throttle__futex_wake(&w->slot[i]->word);
  w->n = 0;
}

/* GCRA with burst n: an admission at `now` conforms when
 * tat - (n - 1) * T <= now, T = period / n.  *ready is when it will. */
static bool rate_allows(const struct throttle__rec *r, uint64_t now,
                        uint64_t *ready) {
  if (r->rate_n == 0)
    return true;
  uint64_t T = r->rate_period_ns / r->rate_n;
  uint64_t tau = T * (r->rate_n - 1);
  uint64_t earliest = r->rate_tat_ns > tau ? r->rate_tat_ns - tau : 0;
  if (earliest <= now)
    return true;
  *ready = earliest;
  return false;
}

static void rate_take(struct throttle__rec *r, uint64_t now) {
  if (r->rate_n == 0)
    return;
  uint64_t T = r->rate_period_ns / r->rate_n;
  uint64_t base = r->rate_tat_ns > now ? r->rate_tat_ns : now;
  r->rate_tat_ns = throttle__sat_add(base, T);
}

/* Reclaim slots of dead holders and waiters, and of holders past their
 * lease.  Reading /proc costs microseconds, so it runs at most every
 * REAP_NS per key, and only when somebody is waiting for the gate. */
static void reap_locked(struct throttle__rec *r, uint64_t now, bool force);

void throttle__reap_locked(struct throttle__rec *r, uint64_t now) {
  reap_locked(r, now, false);
}

static void reap_locked(struct throttle__rec *r, uint64_t now, bool force) {
  if (!force && now - r->last_reap_ns < REAP_NS && r->last_reap_ns <= now)
    return;
  r->last_reap_ns = now;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *s = &r->slot[i];
    if (s->state == THROTTLE__SLOT_FREE)
      continue;
    bound_slot_times(s, now);
    bool lapsed = s->state == THROTTLE__SLOT_HOLDING &&
                  now - s->since_ns >
                      (uint64_t)s->lease_ms * THROTTLE__NS_PER_MS &&
                  s->since_ns <= now;
    if (!lapsed && holder_alive(s))
      continue;
    if (s->state == THROTTLE__SLOT_HOLDING) {
      sat_inc(&r->reclaims);
      if (s->ticket == r->probe_ticket) {
        /* the next waiter probes */
        __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
        atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
      }
    }
    free_slot(s);
  }
}

/* Oldest waiting slot of class cls, or NULL. */
static struct throttle__slot *oldest(struct throttle__rec *r,
                                     throttle_class_t cls) {
  struct throttle__slot *best = NULL;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *s = &r->slot[i];
    if (s->state == THROTTLE__SLOT_WAITING && s->cls == cls &&
        (best == NULL || s->ticket < best->ticket))
      best = s;
  }
  return best;
}

static uint32_t count(const struct throttle__rec *r, int state, int cls) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state == state && (cls < 0 || r->slot[i].cls == cls))
      n++;
  return n;
}

/* Grant as many waiters as the gate allows now, oldest first, live before
 * backfill.  *next is set to the next instant at which time alone could
 * open the gate (UINT64_MAX if none). */
static void grant_locked(throttle_t *h, struct throttle__rec *r, uint64_t now,
                         struct wake *w, uint64_t *next) {
  *next = UINT64_MAX;
  if (r->flags & THROTTLE__REC_PAUSED)
    return;
  uint64_t nb = throttle__clamp_nb_locked(h, r, now);
  if (nb > now) {
    *next = nb;
    return;
  }
  if (r->probe_ticket != 0) {
    bool out = false;
    for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
      if (r->slot[i].state == THROTTLE__SLOT_HOLDING &&
          r->slot[i].ticket == r->probe_ticket)
        out = true;
    if (!out)
      __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
  }
  bound_rate(h, r, now);
  uint32_t cap = cap_of(r);
  uint32_t holders = count(r, THROTTLE__SLOT_HOLDING, -1);
  uint32_t bf_holders =
      count(r, THROTTLE__SLOT_HOLDING, THROTTLE_CLASS_BACKFILL);
  uint32_t bf_cap = backfill_cap(r, cap);
  while (holders < cap) {
    if ((r->flags & THROTTLE__REC_EPISODE) && r->probe_ticket != 0)
      return; /* the probe is out: everyone else waits for its answer */
    struct throttle__slot *s = oldest(r, THROTTLE_CLASS_LIVE);
    if (s == NULL && bf_holders < bf_cap)
      s = oldest(r, THROTTLE_CLASS_BACKFILL);
    if (s == NULL)
      return;
    uint64_t ready;
    if (!rate_allows(r, now, &ready)) {
      *next = ready;
      return;
    }
    rate_take(r, now);
    s->state = THROTTLE__SLOT_HOLDING;
    THROTTLE__CRASHPOINT("gate-mid-grant"); /* holder, not yet woken */
    s->since_ns = now;
    holders++;
    s->concurrent = (uint8_t)holders;
    if (s->cls == THROTTLE_CLASS_BACKFILL)
      bf_holders++;
    s->probe = 0;
    sat_inc(&r->admitted);
    if (r->flags & THROTTLE__REC_EPISODE) {
      s->probe = 1;
      __atomic_store_n(&r->probe_ticket, s->ticket, __ATOMIC_RELEASE);
      sat_inc(&r->probes);
    }
    bump(s);
    if (w != NULL && w->n < THROTTLE__SLOTS)
      w->slot[w->n++] = s;
  }
}

/* ---- learning the cap ------------------------------------------------ */

static void learn_locked(struct throttle__rec *r, throttle_outcome_t outcome,
                         uint32_t others, uint32_t concurrent) {
  if (r->fixed_cap != 0)
    return;
  if (r->auto_cap < 1 || r->auto_cap > THROTTLE__SLOTS)
    r->auto_cap = 1;
  if (r->auto_fails > MAX_AUTO_FAILS) /* shared memory: a shift count below */
    r->auto_fails = MAX_AUTO_FAILS;
  if (outcome == THROTTLE_OUTCOME_OK) {
    /* Only a success at the cap says anything about a larger one: a fleet
     * that never fills its cap must not grow it without bound. */
    if (concurrent < r->auto_cap)
      return;
    if (r->auto_cap > r->auto_ssthresh)
      r->auto_fails = 0; /* the raised cap has been used without a refusal */
    r->auto_oks++;
    uint64_t need = r->auto_ssthresh == 0
                        ? 1
                        : (uint64_t)64 * r->auto_cap << r->auto_fails;
    if (r->auto_oks >= need && r->auto_cap < THROTTLE__SLOTS) {
      r->auto_cap++;
      r->auto_oks = 0;
    }
  } else if (outcome == THROTTLE_OUTCOME_LOCKED && others > 0) {
    /* Our own fleet holds the lock: too many at once. */
    if (r->auto_ssthresh != 0 && r->auto_cap > r->auto_ssthresh &&
        r->auto_fails < MAX_AUTO_FAILS)
      r->auto_fails++;
    r->auto_cap = r->auto_cap / 2 > 1 ? r->auto_cap / 2 : 1;
    r->auto_ssthresh = r->auto_cap;
    r->auto_oks = 0;
  }
}

/* ---- enter / leave --------------------------------------------------- */

/* The slot of ticket t, or NULL when it is no longer there (reclaimed by
 * its lease, or canceled and freed).  The ticket number alone identifies
 * it: tickets never repeat within a segment, so no other admission can
 * match, and the pid is deliberately not compared, so that a forked child
 * can release its parent's admission (see fork in throttle.h). */
static struct throttle__slot *my_slot(struct throttle__rec *r,
                                      const throttle_ticket_t *t) {
  if (t->slot >= THROTTLE__SLOTS)
    return NULL;
  struct throttle__slot *s = &r->slot[t->slot];
  if (s->state == THROTTLE__SLOT_FREE || s->ticket != t->ticket)
    return NULL;
  return s;
}

/* The next ticket of the segment.  A counter far beyond any real use (2^62
 * admissions) was written by a bad writer: start again above the tickets
 * of this key, which keeps its FIFO order and its identities distinct. */
static uint64_t next_ticket_locked(throttle_t *h, struct throttle__rec *r) {
  uint64_t n = h->hdr->next_ticket + 1;
  if (n == 0 || n > (UINT64_C(1) << 62)) {
    n = 1;
    for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
      if (r->slot[i].state != THROTTLE__SLOT_FREE &&
          r->slot[i].ticket >= n && r->slot[i].ticket < (UINT64_C(1) << 62))
        n = r->slot[i].ticket + 1;
  }
  h->hdr->next_ticket = n;
  return n;
}

static int do_enter(throttle_t *h, const char *key, throttle_class_t cls,
                    uint64_t timeout_ms, int nowait,
                    throttle_ticket_t **out, uint64_t *wait_ms) {
  if (h == NULL || out == NULL ||
      (cls != THROTTLE_CLASS_LIVE && cls != THROTTLE_CLASS_BACKFILL))
    return THROTTLE_EINVAL;
  *out = NULL;
  size_t len;
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  throttle_ticket_t *t = throttle__calloc(1, sizeof *t);
  if (t == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  t->h = h;
  t->len = len;
  memcpy(t->key, key, len);
  t->hash = throttle__hash(h->seed, key, len);
  t->slot = UINT32_MAX;
  if (h->be != NULL) {
    rc = throttle__be_enter(h, key, cls, timeout_ms, nowait, &t->be,
                            &t->probe, wait_ms);
    if (rc == 0) {
      *out = t;
      return 0;
    }
    if (rc != THROTTLE__BE_DOWN) {
      throttle__free(t);
      return rc;
    }
  }
  uint64_t start = throttle__now_ns();
  uint64_t deadline =
      timeout_ms == THROTTLE_FOREVER
          ? UINT64_MAX
          : throttle__sat_add(start, timeout_ms > UINT64_MAX / 1000000
                                         ? UINT64_MAX
                                         : timeout_ms * THROTTLE__NS_PER_MS);
  struct self_id self = my_id();
  uint32_t cancel_gen = 0;
  bool registered = false, gen_taken = false, interrupted = false;
  struct wake w = {.n = 0};
  for (;;) {
    if ((rc = throttle__lock(h)) != 0) {
      if (registered) {
        /* A slot left waiting would be granted later and then hold the
         * cap until its lease lapsed, the live process being ours.  Try
         * once more to give it back (the leave takes the mutex again); if
         * the mutex is still out of reach, the lease is all there is. */
        char why[512];
        snprintf(why, sizeof why, "%s", throttle_errmsg(h));
        throttle_leave(h, t, THROTTLE_OUTCOME_ABANDONED, 0); /* frees t */
        t = NULL;
        throttle__fail(h, rc, "%s", why);
      }
      break;
    }
    uint64_t now = throttle__now_ns();
    struct throttle__rec *r;
    rc = throttle__insert_locked(h, key, len, t->hash, now, &r);
    if (rc != 0) {
      throttle__unlock(h);
      break;
    }
    r->last_use_ns = now;
    struct throttle__slot *s = registered ? my_slot(r, t) : NULL;
    if (registered && s == NULL) {
      registered = false; /* reclaimed under us (lease, or a bad writer) */
    }
    if (!registered && gen_taken && r->cancel_gen != cancel_gen) {
      /* Canceled since we arrived, while we had no slot (more callers
       * than slots) or lost ours: a cancel ends every caller waiting at
       * its moment, not only those it found in a slot. */
      sat_inc(&r->canceled);
      throttle__unlock(h);
      rc = throttle__fail(h, THROTTLE_ECANCELED, "%s: canceled", t->key);
      break;
    }
    if (!registered) {
      if (!gen_taken) {
        cancel_gen = r->cancel_gen;
        gen_taken = true;
      }
      for (uint32_t i = 0; i < THROTTLE__SLOTS && s == NULL; i++)
        if (r->slot[i].state == THROTTLE__SLOT_FREE)
          s = &r->slot[i];
      if (s == NULL) {
        reap_locked(r, now, false);
        for (uint32_t i = 0; i < THROTTLE__SLOTS && s == NULL; i++)
          if (r->slot[i].state == THROTTLE__SLOT_FREE)
            s = &r->slot[i];
      }
      if (s != NULL) {
        s->state = THROTTLE__SLOT_WAITING;
        s->cls = (uint8_t)cls;
        s->pid = (uint32_t)getpid();
        s->start = self.start;
        s->pidns = self.pidns;
        s->lease_ms = h->lease_ms;
        s->ticket = next_ticket_locked(h, r);
        s->since_ns = now;
        s->probe = 0;
        t->slot = (uint32_t)(s - r->slot);
        t->ticket = s->ticket;
        registered = true;
      }
    }
    if (s != NULL && s->state == THROTTLE__SLOT_CANCELED) {
      free_slot(s);
      sat_inc(&r->canceled);
      throttle__unlock(h);
      rc = throttle__fail(h, THROTTLE_ECANCELED, "%s: canceled", t->key);
      break;
    }
    uint64_t next;
    if (s != NULL && s->state == THROTTLE__SLOT_WAITING) {
      reap_locked(r, now, false);
      grant_locked(h, r, now, &w, &next);
    } else {
      next = UINT64_MAX;
    }
    if (s != NULL && s->state == THROTTLE__SLOT_HOLDING && interrupted) {
      /* Granted while the caller was already told to stop: hand the slot
       * on as an abandoned admission would (a probe's turn passes to the
       * next waiter). */
      throttle__unlock(h);
      wake_all(&w);
      throttle_leave(h, t, THROTTLE_OUTCOME_ABANDONED, 0); /* frees t */
      t = NULL;
      rc = throttle__fail(h, THROTTLE_EINTR, "interrupted by the caller");
      break;
    }
    if (s != NULL && s->state == THROTTLE__SLOT_HOLDING) {
      t->probe = r->probe_ticket == s->ticket;
      s->lease_ms = h->lease_ms;
      throttle__unlock(h);
      wake_all(&w);
      *out = t;
      throttle__clear_msg(h);
      return 0;
    }
    /* Not admitted (yet).  A not-before beyond the deadline cannot be
     * waited out: say so now rather than sleep to the deadline.  Clamped:
     * grant_locked() returns before clamping for a paused key, and a
     * stored not-before past the maximum delay would become the hint. */
    uint64_t nb = throttle__clamp_nb_locked(h, r, now);
    if (nowait || interrupted || now >= deadline ||
        (nb > now && nb > deadline)) {
      if (s != NULL)
        free_slot(s);
      grant_locked(h, r, now, &w, &next); /* our leaving may unblock others */
      throttle__unlock(h);
      wake_all(&w);
      if (wait_ms != NULL)
        *wait_ms = nb > now ? (nb - now + THROTTLE__NS_PER_MS - 1) /
                                  THROTTLE__NS_PER_MS
                            : 0;
      if (nowait)
        rc = throttle__fail(h, THROTTLE_EWOULDBLOCK, "%s: not admitted now",
                            t->key);
      else if (interrupted)
        rc = throttle__fail(h, THROTTLE_EINTR,
                            "%s: interrupted by the caller; its place in "
                            "the queue was given back",
                            t->key);
      else
        rc = throttle__fail(h, THROTTLE_ETIMEDOUT,
                            "%s: not admitted within %llu ms", t->key,
                            (unsigned long long)timeout_ms);
      break;
    }
    _Atomic uint32_t *word = s != NULL ? &s->word : &r->epoch;
    uint32_t seen = atomic_load_explicit(word, memory_order_acquire);
    throttle__unlock(h);
    wake_all(&w);
    /* Sleep until granted, or until time alone may open the gate (with
     * jitter, so the sleepers of one key do not all take the mutex in the
     * same instant), or the re-check bound, or the deadline. */
    uint64_t until = now + POLL_NS;
    if (s == NULL)
      until = now + 20 * THROTTLE__NS_PER_MS; /* no slot: poll */
    if (next != UINT64_MAX && next < until)
      until = throttle__sat_add(
          next, throttle__random() % (THROTTLE__JITTER_MAX_NS / 5 + 1));
    if (until > deadline)
      until = deadline;
    if (until > now && throttle__sleep(h, word, seen, until - now) != 0)
      interrupted = true; /* give back the place under the mutex, above */
  }
  throttle__free(t);
  return rc;
}

THROTTLE_EXTERN int throttle_enter(throttle_t *h, const char *key,
                                   throttle_class_t cls, uint64_t timeout_ms,
                                   throttle_ticket_t **ticket) {
  return do_enter(h, key, cls, timeout_ms, 0, ticket, NULL);
}

THROTTLE_EXTERN int throttle_try_enter(throttle_t *h, const char *key,
                                       throttle_class_t cls,
                                       throttle_ticket_t **ticket,
                                       uint64_t *wait_ms) {
  if (wait_ms != NULL)
    *wait_ms = 0;
  return do_enter(h, key, cls, 0, 1, ticket, wait_ms);
}

THROTTLE_EXTERN int throttle_ticket_is_probe(const throttle_ticket_t *t) {
  return t != NULL && t->probe;
}

THROTTLE_EXTERN int throttle_leave(throttle_t *h, throttle_ticket_t *t,
                                   throttle_outcome_t outcome,
                                   uint64_t retry_after_ms) {
  if (h == NULL || t == NULL || t->h != h) {
    throttle__free(t);
    return THROTTLE_EINVAL;
  }
  int bad_outcome = (unsigned)outcome > THROTTLE_OUTCOME_ABANDONED;
  if (bad_outcome) { /* still give the slot back, as abandoned */
    outcome = THROTTLE_OUTCOME_ABANDONED;
    retry_after_ms = 0;
  }
  if (t->be != NULL) {
    /* Down: the admission lapses in the backend's own time.  Either way a
     * published back-off goes on below into this host's segment. */
    int brc = throttle__be_leave(h, t->be, outcome, retry_after_ms);
    t->be = NULL;
    /* A published back-off goes into the segment too (as in
     * throttle_backoff()); the ticket holds no slot of it. */
    bool pub = outcome == THROTTLE_OUTCOME_LOCKED ||
               outcome == THROTTLE_OUTCOME_RATE_LIMITED ||
               outcome == THROTTLE_OUTCOME_UNAVAILABLE;
    if (brc != THROTTLE__BE_DOWN && (brc != 0 || !pub)) {
      throttle__free(t);
      return brc;
    }
  }
  int rc = throttle__lock(h);
  if (rc != 0) {
    throttle__free(t);
    return rc; /* the slot lapses with its lease */
  }
  uint64_t now = throttle__now_ns();
  struct throttle__rec *r = throttle__find_locked(h, t->key, t->len, t->hash);
  bool publish = outcome == THROTTLE_OUTCOME_LOCKED ||
                 outcome == THROTTLE_OUTCOME_RATE_LIMITED ||
                 outcome == THROTTLE_OUTCOME_UNAVAILABLE;
  if (r == NULL && publish)
    rc = throttle__insert_locked(h, t->key, t->len, t->hash, now, &r);
  struct wake w = {.n = 0};
  bool stale = true; /* no slot of this admission is left */
  if (r != NULL) {
    struct throttle__slot *s = my_slot(r, t);
    stale = s == NULL;
    bool probe = s != NULL && r->probe_ticket != 0 &&
                 s->ticket == r->probe_ticket;
    uint32_t concurrent = s != NULL ? s->concurrent : 0;
    uint32_t others = count(r, THROTTLE__SLOT_HOLDING, -1);
    if (s != NULL && s->state == THROTTLE__SLOT_HOLDING && others > 0)
      others--;
    if (s != NULL)
      free_slot(s);
    if (probe) {
      __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
      /* throttle_wait() callers sleep on the epoch for the probe's answer */
      atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
      throttle__futex_wake(&r->epoch);
    }
    if (outcome == THROTTLE_OUTCOME_OK && probe)
      /* the lock is free */
      throttle__rec_flags(r, THROTTLE__REC_EPISODE, false);
    if (outcome == THROTTLE_OUTCOME_LOCKED)
      sat_inc(&r->locked);
    if (outcome == THROTTLE_OUTCOME_PERMANENT)
      sat_inc(&r->permanent);
    if (publish) {
      uint64_t ms = retry_after_ms ? retry_after_ms : DEFAULT_LOCK_DELAY_MS;
      throttle__publish_locked(
          h, r, now,
          ms > UINT64_MAX / THROTTLE__NS_PER_MS ? UINT64_MAX
                                                : ms * THROTTLE__NS_PER_MS);
    }
    if (!stale) /* a stale report says nothing of the cap now */
      learn_locked(r, outcome, others, concurrent);
    r->last_use_ns = now;
    THROTTLE__CRASHPOINT("gate-mid-leave"); /* slot freed, not handed over */
    uint64_t next;
    grant_locked(h, r, now, &w, &next);
  }
  throttle__unlock(h);
  wake_all(&w);
  char key_copy[THROTTLE__KEY_MAX + 1];
  memcpy(key_copy, t->key, t->len + 1);
  throttle__free(t);
  if (rc == 0 && bad_outcome)
    rc = throttle__fail(h, THROTTLE_EINVAL,
                        "unknown outcome; the slot was given back as "
                        "abandoned");
  else if (rc == 0 && stale)
    rc = throttle__fail(h, THROTTLE_ESTALE,
                        "%.255s: the admission was already taken back (its "
                        "lease lapsed, or it was left before); no slot was "
                        "touched%s",
                        key_copy, publish ? ", the back-off was published" : "");
  else if (rc == 0)
    throttle__clear_msg(h);
  return rc;
}

/* Wake every waiter of r with THROTTLE_ECANCELED (see settings.c). */
void throttle__cancel_locked(struct throttle__rec *r) {
  r->cancel_gen++;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state == THROTTLE__SLOT_WAITING) {
      r->slot[i].state = THROTTLE__SLOT_CANCELED;
      bump(&r->slot[i]);
    }
  atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
}

/* ---- snapshots ------------------------------------------------------- */

void throttle__gate_snapshot(const struct throttle__rec *r, uint64_t now,
                             throttle_info_t *out) {
  int64_t *f = out->field;
  f[THROTTLE_FIELD_IN_FLIGHT] = count(r, THROTTLE__SLOT_HOLDING, -1);
  f[THROTTLE_FIELD_CAP] = cap_of(r);
  f[THROTTLE_FIELD_CAP_AUTO] = r->fixed_cap == 0;
  f[THROTTLE_FIELD_WAITING_LIVE] =
      count(r, THROTTLE__SLOT_WAITING, THROTTLE_CLASS_LIVE);
  f[THROTTLE_FIELD_WAITING_BACKFILL] =
      count(r, THROTTLE__SLOT_WAITING, THROTTLE_CLASS_BACKFILL);
  f[THROTTLE_FIELD_PROBE_OUT] = r->probe_ticket != 0;
  f[THROTTLE_FIELD_LOCK_EPISODE] = (r->flags & THROTTLE__REC_EPISODE) != 0;
  f[THROTTLE_FIELD_PAUSED] = (r->flags & THROTTLE__REC_PAUSED) != 0;
  f[THROTTLE_FIELD_RATE_N] = r->rate_n;
  f[THROTTLE_FIELD_RATE_PERIOD_MS] =
      (int64_t)(r->rate_period_ns / THROTTLE__NS_PER_MS);
  f[THROTTLE_FIELD_BACKFILL_SHARE_PERMILLE] = share_of(r);
#define CLAMP64(v) ((v) > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)(v))
  f[THROTTLE_FIELD_ADMITTED] = CLAMP64(r->admitted);
  f[THROTTLE_FIELD_LOCKED] = CLAMP64(r->locked);
  f[THROTTLE_FIELD_PROBES] = CLAMP64(r->probes);
  f[THROTTLE_FIELD_RECLAIMS] = CLAMP64(r->reclaims);
  f[THROTTLE_FIELD_CANCELED] = CLAMP64(r->canceled);
  f[THROTTLE_FIELD_PERMANENT] = CLAMP64(r->permanent);
#undef CLAMP64
  out->nholders = 0;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    const struct throttle__slot *s = &r->slot[i];
    if (s->state != THROTTLE__SLOT_HOLDING)
      continue;
    uint32_t k = out->nholders++;
    out->holder[k].pid = s->pid;
    out->holder[k].host[0] = 0; /* this host's */
    out->holder[k].cls = s->cls;
    out->holder[k].probe = r->probe_ticket != 0 && s->ticket == r->probe_ticket;
    out->holder[k].age_ms =
        s->since_ns < now ? (now - s->since_ns) / THROTTLE__NS_PER_MS : 0;
  }
}

THROTTLE_EXTERN const char *
throttle_info_holder_host(const throttle_info_t *info, size_t i) {
  if (info == NULL || i >= info->nholders)
    return NULL;
  return info->holder[i].host;
}

THROTTLE_EXTERN int throttle_info_holder(const throttle_info_t *info,
                                         size_t i, int64_t *pid,
                                         int64_t *age_ms,
                                         throttle_class_t *cls, int *probe) {
  if (info == NULL)
    return THROTTLE_EINVAL;
  if (i >= info->nholders)
    return THROTTLE_ENOKEY;
  if (pid)
    *pid = info->holder[i].pid;
  if (age_ms)
    *age_ms = (int64_t)info->holder[i].age_ms;
  if (cls)
    *cls = (throttle_class_t)info->holder[i].cls;
  if (probe)
    *probe = info->holder[i].probe;
  return 0;
}
