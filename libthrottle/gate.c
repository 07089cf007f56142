/* SPDX-License-Identifier: MIT */
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
 * Slots are identified by a ticket from one sequence for the whole segment
 * that never restarts, so a ticket names one admission for the segment's
 * lifetime: a stale ticket (lease lapsed, left before, a forked copy)
 * matches nothing, and a forked child can release its parent's admission.
 *
 * Dead holders (gate_live.c).  A holder is reclaimed at the next look (at
 * most every REAP_NS per key, only when someone is waiting) once there is
 * evidence it died; one that cannot be judged (another PID namespace,
 * /proc hidden) and a live but hung one are reclaimed when their lease
 * lapses.
 *
 * Waiting (throttle__sleep) is cut into slices when the caller set an
 * interrupt check; an interrupted caller gives back its place, or a slot
 * granted meanwhile, before it returns.  Every time-like field read here
 * is bounded first (bound_rate, bound_slot_times): shared memory is input.
 *
 * A transient answer retried with throttle_requeue() keeps its slot, as a
 * waiting slot with its arrival ticket: the oldest waiter, so it probes
 * first when the back-off passes (a leave and a new enter would queue it
 * behind later arrivals).
 *
 * Also here: publishing (the lock episode before the not-before, so a crash
 * between them is safe) and cancel.  The snapshot fields are in
 * gate_info.c.
 *
 * The learned cap (gate_learn.c, which states its rules and why): a LOCKED
 * answer with k others in flight sets the cap to k; a raise is tried only
 * after 20 x Retry-After of work at the cap (doubling per failed raise).
 * Cold start explores at once by slow start: a table admitting 4 is found
 * within the first fleet, while a serialised table with a long Retry-After
 * pays one R the first time and reaches its goal only warm (the learned
 * cap survives in the segment).  Chosen over a priced slow start, which
 * would keep a parallel table at cap 1 for 20 R of work.
 *
 * An uncontended enter + leave makes no system call: the pid is cached
 * (throttle__pid, refreshed in a forked child), and a grant wakes a slot's
 * futex only when the key counts sleepers (see grant_locked for why no
 * wake is lost); every wake still changes its word first.
 *
 * Beyond THROTTLE__SLOTS participants, a caller takes its arrival ticket at
 * once and sleeps on the record's epoch, which free_slot() bumps and wakes
 * while such callers are counted; when it registers, the ticket it arrived
 * with keeps its place in the FIFO order.  Rejected: a queue of overflow
 * callers in shared memory (unbounded, and a dead one would block it).
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REAP_NS (50 * THROTTLE__NS_PER_MS)
#define POLL_NS THROTTLE__POLL_NS
#define DEFAULT_LOCK_DELAY_MS 5000u

struct throttle_ticket {
  throttle_t *h;
  throttle_class_t cls;
  uint64_t hash;
  uint64_t ticket;
  uint32_t slot;
  int probe;
  size_t len;
  void *be; /* the backend's admission (backend.h), or NULL */
  char key[THROTTLE__KEY_MAX + 1];
};

/* ---- helpers on a record -------------------------------------------- */

static void sat_inc(uint64_t *c) {
  if (*c < UINT64_MAX)
    (*c)++;
}

static void bump(struct throttle__slot *s) {
  atomic_fetch_add_explicit(&s->word, 1, memory_order_release);
}

static void free_slot(struct throttle__rec *r, struct throttle__slot *s) {
  s->state = THROTTLE__SLOT_FREE;
  s->probe = 0;
  s->ticket = 0;
  s->pid = 0;
  bump(s);
  if (r->ovf_waiters != 0) { /* a caller beyond the slots may register */
    atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
    throttle__futex_wake(&r->epoch);
  }
}

bool throttle__rec_idle(const struct throttle__rec *r, uint64_t now) {
  if (atomic_load_explicit(&r->not_before, memory_order_relaxed) > now)
    return false;
  if (r->fixed_cap || r->auto_max || r->rate_n ||
      (r->flags & (THROTTLE__REC_PAUSED | THROTTLE__REC_SHARE_SET)))
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
  throttle__scope_touch(h); /* after the not-before (scope.c) */
  sat_inc(&r->publishes);
  r->last_delay_ms = delay_ns / THROTTLE__NS_PER_MS;
  r->last_pid = throttle__pid();
  r->last_use_ns = now;
}

/* ---- time read from shared memory (I8) ------------------------------- */

/* Every time-like field is bounded where it is read and at repair, so that
 * one bad word delays a key by at most the segment's maximum delay (or a
 * slot by the longest lease), never forever.  Stored back, so every reader
 * sees the same bounded value. */
#define LEASE_MAX_MS 86400000u                                /* one day */
#define RATE_PERIOD_MAX_NS (UINT64_C(366) * 86400000 * THROTTLE__NS_PER_MS)

static void bound_slot_times(struct throttle__slot *s, uint64_t now,
                             uint64_t mono) {
  if (s->lease_ms == 0 || s->lease_ms > LEASE_MAX_MS)
    s->lease_ms = LEASE_MAX_MS;
  if (s->since_ns > now) /* a grant in the future would never lapse */
    s->since_ns = now;
  if (s->since_mono_ns > mono)
    s->since_mono_ns = mono;
}

/* A conforming GCRA state never runs more than one period ahead of now. */
void throttle__bound_rate(throttle_t *h, struct throttle__rec *r, uint64_t now) {
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
  uint64_t now = throttle__now_ns(), mono = throttle__mono_ns();
  throttle__bound_rate(h, r, now);
  bool probe_found = false;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *s = &r->slot[i];
    bound_slot_times(s, now, mono);
    if (s->state > THROTTLE__SLOT_CANCELED || s->cls > THROTTLE_CLASS_BACKFILL ||
        (s->state != THROTTLE__SLOT_FREE && (s->pid == 0 || s->ticket == 0))) {
      free_slot(r, s);
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
  throttle__learn_bound_locked(r, now);
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

/* Reclaim slots of dead holders and waiters, and of holders past their
 * lease.  Reading /proc costs microseconds, so it runs at most every
 * REAP_NS per key, and only when somebody is waiting for the gate. */
static void reap_locked(struct throttle__rec *r, uint64_t now, bool force);

void throttle__reap_locked(struct throttle__rec *r, uint64_t now) {
  reap_locked(r, now, false);
}

/* For eviction: a key that would be idle but for slots (no back-off, no
 * setting an operator made) is reaped now, whoever waits; true when that
 * leaves it idle (its only participants were dead or past their lease). */
bool throttle__reap_idle_locked(struct throttle__rec *r, uint64_t now) {
  if (atomic_load_explicit(&r->not_before, memory_order_relaxed) > now ||
      r->fixed_cap || r->auto_max || r->rate_n ||
      (r->flags & (THROTTLE__REC_PAUSED | THROTTLE__REC_SHARE_SET)))
    return false;
  reap_locked(r, now, true);
  return throttle__rec_idle(r, now);
}

static void reap_locked(struct throttle__rec *r, uint64_t now, bool force) {
  if (!force && now - r->last_reap_ns < REAP_NS && r->last_reap_ns <= now)
    return;
  r->last_reap_ns = now;
  /* Leases run on CLOCK_MONOTONIC, which stops while the host is
   * suspended: a lease bounds how long a running holder may take, and a
   * holder frozen with the whole host has not run.  On the throttle clock
   * (CLOCK_BOOTTIME, right for a server's Retry-After) a suspend longer
   * than the lease would reclaim every holder at once on resume, while
   * they go on sending: the cap exceeded for the rest of their requests. */
  uint64_t mono = throttle__mono_ns();
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *s = &r->slot[i];
    if (s->state == THROTTLE__SLOT_FREE)
      continue;
    bound_slot_times(s, now, mono);
    bool lapsed = s->state == THROTTLE__SLOT_HOLDING &&
                  mono - s->since_mono_ns >
                      (uint64_t)s->lease_ms * THROTTLE__NS_PER_MS;
    if (!lapsed && throttle__holder_alive(s))
      continue;
    if (s->state == THROTTLE__SLOT_HOLDING) {
      sat_inc(&r->reclaims);
      if (s->ticket == r->probe_ticket) {
        /* the next waiter probes */
        __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
        atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
      }
    }
    free_slot(r, s);
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
  int scope = throttle__scope_gate_locked(h, r, now, next);
  if (scope == THROTTLE__SCOPE_HELD)
    return;
  if (r->probe_ticket != 0) {
    bool out = false;
    for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
      if (r->slot[i].state == THROTTLE__SLOT_HOLDING &&
          r->slot[i].ticket == r->probe_ticket)
        out = true;
    if (!out)
      __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
  }
  throttle__bound_rate(h, r, now);
  uint32_t cap = throttle__cap_of(r);
  uint32_t holders = throttle__count_slots(r, THROTTLE__SLOT_HOLDING, -1);
  uint32_t bf_holders =
      throttle__count_slots(r, THROTTLE__SLOT_HOLDING, THROTTLE_CLASS_BACKFILL);
  uint32_t bf_cap = throttle__backfill_cap(r, cap);
  while (holders < cap) {
    if ((r->flags & THROTTLE__REC_EPISODE) && r->probe_ticket != 0)
      return; /* the probe is out: everyone else waits for its answer */
    struct throttle__slot *s = oldest(r, THROTTLE_CLASS_LIVE);
    if (s == NULL && bf_holders < bf_cap)
      s = oldest(r, THROTTLE_CLASS_BACKFILL);
    if (s == NULL || !throttle__scope_pool_allows_locked(h, r, s, now, next))
      return;
    uint64_t ready;
    if (!throttle__rate_allows(r, now, &ready)) {
      *next = ready;
      return;
    }
    throttle__rate_take(r, now);
    /* The grant times first: a crash after the state changes must not
     * leave a holder timed by the slot's previous occupant (its lease
     * would lapse at once and the slot be taken from a live holder). */
    s->since_ns = now;
    s->since_mono_ns = throttle__mono_ns();
    s->state = THROTTLE__SLOT_HOLDING;
    THROTTLE__CRASHPOINT("gate-mid-grant"); /* holder, not yet woken */
    holders++;
    s->concurrent = (uint8_t)holders;
    if (s->cls == THROTTLE_CLASS_BACKFILL)
      bf_holders++;
    s->probe = 0;
    sat_inc(&r->admitted);
    if (r->flags & THROTTLE__REC_EPISODE) {
      s->probe = 1;
      __atomic_store_n(&r->probe_ticket, s->ticket, __ATOMIC_RELEASE);
      throttle__scope_touch(h); /* r may be a scope: its keys are held */
      sat_inc(&r->probes);
    }
    bump(s);
    /* Decided under the mutex, after the bump: a waiter counts itself in
     * sleepers under the mutex before it unlocks to sleep, so either it is
     * counted here or it read the bumped word (and will not sleep on the
     * old one).  An uncontended grant of the caller's own slot wakes
     * nobody: no system call. */
    if (w != NULL && w->n < THROTTLE__SLOTS &&
        atomic_load_explicit(&r->sleepers, memory_order_acquire) != 0)
      w->slot[w->n++] = s;
    throttle__scope_take_locked(h, r, s, scope == THROTTLE__SCOPE_PROBE);
    if (scope == THROTTLE__SCOPE_PROBE)
      return; /* alone until the scope's answer */
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

/* No longer waiting beyond the slots (registered, or giving up). */
static void ovf_done(struct throttle__rec *r, bool *ovf) {
  if (*ovf && r->ovf_waiters > 0)
    r->ovf_waiters--;
  *ovf = false;
}

static uint64_t deadline_after(uint64_t now, uint64_t timeout_ms) {
  if (timeout_ms == THROTTLE_FOREVER)
    return UINT64_MAX;
  return throttle__sat_add(now, timeout_ms > UINT64_MAX / THROTTLE__NS_PER_MS
                                    ? UINT64_MAX
                                    : timeout_ms * THROTTLE__NS_PER_MS);
}

/* Wait until t is admitted (its slot holding), from scratch or, when
 * registered, from the waiting slot t already has (a requeue).  On success
 * *out = t; otherwise t is freed and its place given back. */
static int enter_wait(throttle_t *h, throttle_ticket_t *t, uint64_t timeout_ms,
                      int nowait, bool registered, throttle_ticket_t **out,
                      uint64_t *wait_ms) {
  char key[THROTTLE__KEY_MAX + 1]; /* t may be freed before the last use */
  size_t len = t->len;
  memcpy(key, t->key, len + 1);
  throttle_class_t cls = t->cls;
  int rc;
  /* From the first reading under the mutex (one clock read fewer on the
   * uncontended path), or from a reading of its own if the mutex is out
   * of reach first. */
  uint64_t deadline = 0;
  bool deadline_set = false;
  struct throttle__self_id self = throttle__self_id();
  uint32_t cancel_gen = 0;
  bool gen_taken = false, interrupted = false;
  bool ovf = false; /* counted in r->ovf_waiters: waiting beyond the slots */
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
      if (!deadline_set)
        deadline = deadline_after(throttle__now_ns(), timeout_ms);
      rc = throttle__honour_nb_unlocked(h, key, len, rc, nowait, deadline,
                                        wait_ms);
      break;
    }
    uint64_t now = throttle__now_ns();
    if (!deadline_set) {
      deadline = deadline_after(now, timeout_ms);
      deadline_set = true;
    }
    if (!gen_taken) /* before the key's insert, which it could evict */
      throttle__scope_enter_locked(h, key, len, now);
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
      ovf_done(r, &ovf);
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
        s->pid = throttle__pid();
        s->start = self.start;
        s->pidns = self.pidns;
        s->lease_ms = h->lease_ms;
        /* the ticket of the first arrival, if it had to wait beyond the
         * slots: its place in the queue is when it came */
        s->ticket = t->ticket != 0 ? t->ticket : next_ticket_locked(h, r);
        s->since_ns = now;
        s->since_mono_ns = 0; /* the lease's clock starts at the grant */
        s->probe = 0;
        t->slot = (uint32_t)(s - r->slot);
        t->ticket = s->ticket;
        registered = true;
        ovf_done(r, &ovf);
      } else if (!ovf) {
        ovf = true;
        if (r->ovf_waiters < UINT32_MAX)
          r->ovf_waiters++;
        if (t->ticket == 0)
          t->ticket = next_ticket_locked(h, r);
      }
    }
    if (s != NULL && s->state == THROTTLE__SLOT_CANCELED) {
      free_slot(r, s);
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
     * stored not-before past the maximum delay would become the hint.
     * The hint, and giving up at once, count this process's own maximum
     * too (it never lets the gate admit it early; see throttle.h). */
    uint64_t nb = throttle__clamp_nb_locked(h, r, now);
    if (nb > throttle__sat_add(now, h->max_delay_ns))
      nb = throttle__sat_add(now, h->max_delay_ns);
    if (nowait || interrupted || now >= deadline ||
        (nb > now && nb > deadline)) {
      ovf_done(r, &ovf);
      if (s != NULL)
        free_slot(r, s);
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
    /* Counted while the mutex is held (see grant_locked).  The pointer
     * stays valid after unlocking (the segment stays mapped); the record
     * cannot be reused while our slot waits in it, and if a bad writer
     * made it so, a count off by one costs a wake too many, or a waiter's
     * wake (it re-checks within POLL_NS): late, never early. */
    _Atomic uint32_t *sleepers = s != NULL ? &r->sleepers : NULL;
    if (sleepers != NULL)
      atomic_fetch_add_explicit(sleepers, 1, memory_order_acq_rel);
    throttle__unlock(h);
    wake_all(&w);
    /* Sleep until granted, or until time alone may open the gate (with
     * jitter, so the sleepers of one key do not all take the mutex in the
     * same instant), or the re-check bound, or the deadline. */
    uint64_t until = now + POLL_NS; /* beyond the slots too: free_slot()
                                       wakes the epoch */
    if (next != UINT64_MAX && next < until)
      until = throttle__sat_add(
          next, throttle__random() % (THROTTLE__JITTER_MAX_NS / 5 + 1));
    if (until > deadline)
      until = deadline;
    if (until > now && throttle__sleep(h, word, seen, until - now) != 0)
      interrupted = true; /* give back the place under the mutex, above */
    if (sleepers != NULL)
      atomic_fetch_sub_explicit(sleepers, 1, memory_order_acq_rel);
  }
  throttle__free(t);
  return rc;
}

static int do_enter(throttle_t *h, const char *key, throttle_class_t cls,
                    uint64_t timeout_ms, int nowait,
                    throttle_ticket_t **out, uint64_t *wait_ms) {
  if (h == NULL || out == NULL ||
      (cls != THROTTLE_CLASS_LIVE && cls != THROTTLE_CLASS_BACKFILL))
    return THROTTLE_EINVAL;
  *out = NULL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "admit a request");
  size_t len;
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  /* Not calloc: zeroing the whole key buffer costs more than the rest of
   * the ticket; every field is set here. */
  throttle_ticket_t *t = throttle__malloc(sizeof *t);
  if (t == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  t->h = h;
  t->cls = cls;
  t->ticket = 0;
  t->probe = 0;
  t->len = len;
  memcpy(t->key, key, len);
  t->key[len] = '\0';
  t->hash = throttle__hash(h->seed, key, len);
  t->slot = UINT32_MAX;
  t->be = NULL;
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
    t->be = NULL; /* the segment admits this one */
  }
  return enter_wait(h, t, timeout_ms, nowait, false, out, wait_ms);
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

static uint64_t delay_ns(uint64_t retry_after_ms) {
  uint64_t ms = retry_after_ms ? retry_after_ms : DEFAULT_LOCK_DELAY_MS;
  return ms > UINT64_MAX / THROTTLE__NS_PER_MS ? UINT64_MAX
                                               : ms * THROTTLE__NS_PER_MS;
}

static bool publishes(throttle_outcome_t outcome) {
  return outcome == THROTTLE_OUTCOME_LOCKED ||
         outcome == THROTTLE_OUTCOME_RATE_LIMITED ||
         outcome == THROTTLE_OUTCOME_UNAVAILABLE;
}

/* Report t's outcome under the mutex: the probe's answer, counters, the
 * back-off, the learned cap; then free t's slot, or (requeue) turn it back
 * into a waiting slot that keeps its arrival ticket, hence its place at the
 * head of the queue.  Grants what the gate allows now into *w.  Returns
 * false when t's admission was already taken back (stale: nothing but the
 * back-off is changed). */
static bool report_locked(throttle_t *h, struct throttle__rec *r,
                          throttle_ticket_t *t, throttle_outcome_t outcome,
                          uint64_t retry_after_ms, bool requeue, uint64_t now,
                          struct wake *w) {
  struct throttle__slot *s = my_slot(r, t);
  bool probe =
      s != NULL && r->probe_ticket != 0 && s->ticket == r->probe_ticket;
  struct throttle__learn_in learn = {
      .outcome = outcome,
      .concurrent = s != NULL && s->state == THROTTLE__SLOT_HOLDING
                        ? s->concurrent
                        : 0,
      .others = throttle__count_slots(r, THROTTLE__SLOT_HOLDING, -1) -
                (s != NULL && s->state == THROTTLE__SLOT_HOLDING ? 1 : 0),
      .hold_ns = s != NULL && now > s->since_ns ? now - s->since_ns : 0,
      .retry_after_ms = retry_after_ms,
      .max_delay_ms = h->max_delay_ns / THROTTLE__NS_PER_MS,
      .now = now,
  };
  if (s != NULL && requeue && s->state == THROTTLE__SLOT_HOLDING) {
    s->state = THROTTLE__SLOT_WAITING; /* the same ticket: the oldest */
    s->probe = 0;
    s->since_ns = now;
  } else if (s != NULL) {
    free_slot(r, s);
  }
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
  if (publishes(outcome) &&
      throttle__publish_len(h, t->key, t->len, outcome) == t->len)
    throttle__publish_locked(h, r, now, delay_ns(retry_after_ms));
  if (s != NULL) /* a stale report says nothing of the cap now */
    throttle__learn_locked(r, &learn);
  r->last_use_ns = now;
  THROTTLE__CRASHPOINT("gate-mid-leave"); /* slot freed, not handed over */
  uint64_t next;
  grant_locked(h, r, now, w, &next);
  return s != NULL;
}

/* A back-off reported through the backend, recorded in the segment too
 * (as throttle_backoff() does): if the backend goes away, this host's
 * processes still honour it. */
static void mirror_publish(throttle_t *h, const throttle_ticket_t *t,
                           uint64_t ms) {
  if (throttle__lock(h) != 0)
    return;
  uint64_t now = throttle__now_ns();
  struct throttle__rec *r;
  if (throttle__insert_locked(h, t->key, t->len, t->hash, now, &r) == 0)
    throttle__publish_locked(h, r, now,
                             ms > UINT64_MAX / THROTTLE__NS_PER_MS
                                 ? UINT64_MAX
                                 : ms * THROTTLE__NS_PER_MS);
  throttle__unlock(h);
}

/* The report of a backend's admission: the backend frees it (also when it
 * is down: then its liveness lapses), the segment records the back-off. */
static int report_backend(throttle_t *h, throttle_ticket_t *t,
                          throttle_outcome_t outcome,
                          uint64_t retry_after_ms, int bad_outcome) {
  int rc = throttle__be_leave(h, t->be, outcome, retry_after_ms);
  if (publishes(outcome))
    mirror_publish(h, t,
                   retry_after_ms ? retry_after_ms : DEFAULT_LOCK_DELAY_MS);
  throttle__free(t);
  if (rc == THROTTLE__BE_DOWN)
    rc = 0;
  if (rc == 0 && bad_outcome)
    rc = throttle__fail(h, THROTTLE_EINVAL,
                        "unknown outcome; the slot was given back as "
                        "abandoned");
  return rc;
}

/* throttle_leave() and throttle_requeue(): report under the mutex.  t is
 * freed unless requeued (then *requeued is set). */
static int report(throttle_t *h, throttle_ticket_t *t,
                  throttle_outcome_t outcome, uint64_t retry_after_ms,
                  bool requeue, bool *requeued) {
  *requeued = false;
  if (h == NULL || t == NULL || t->h != h) {
    throttle__free(t);
    return THROTTLE_EINVAL;
  }
  int bad_outcome = (unsigned)outcome > THROTTLE_OUTCOME_ABANDONED;
  if (bad_outcome) { /* still give the slot back, as abandoned */
    outcome = THROTTLE_OUTCOME_ABANDONED;
    retry_after_ms = 0;
    requeue = false;
  }
  if (t->be != NULL)
    return report_backend(h, t, outcome, retry_after_ms, bad_outcome);
  int rc = throttle__lock(h);
  if (rc != 0) {
    throttle__free(t);
    return rc; /* the slot lapses with its lease */
  }
  uint64_t now = throttle__now_ns();
  if (publishes(outcome))
    throttle__scope_publish_locked(h, t->key, t->len, outcome,
                                   delay_ns(retry_after_ms), now);
  struct throttle__rec *r = throttle__find_locked(h, t->key, t->len, t->hash);
  if (r == NULL && publishes(outcome))
    rc = throttle__insert_locked(h, t->key, t->len, t->hash, now, &r);
  struct wake w = {.n = 0};
  bool stale = r == NULL ||
               !report_locked(h, r, t, outcome, retry_after_ms, requeue, now,
                              &w);
  throttle__scope_report_locked(h, t->key, t->len, t->ticket, outcome);
  throttle__unlock(h);
  wake_all(&w);
  if (rc == 0 && bad_outcome)
    rc = throttle__fail(h, THROTTLE_EINVAL,
                        "unknown outcome; the slot was given back as "
                        "abandoned");
  else if (rc == 0 && stale)
    rc = throttle__fail(h, THROTTLE_ESTALE,
                        "%.255s: the admission was already taken back (its "
                        "lease lapsed, or it was left before); no slot was "
                        "touched%s",
                        t->key,
                        publishes(outcome) ? ", the back-off was published"
                                           : "");
  else if (rc == 0)
    throttle__clear_msg(h);
  if (rc == 0 && requeue) {
    *requeued = true;
    return 0;
  }
  throttle__free(t);
  return rc;
}

THROTTLE_EXTERN int throttle_leave(throttle_t *h, throttle_ticket_t *t,
                                   throttle_outcome_t outcome,
                                   uint64_t retry_after_ms) {
  bool requeued;
  return report(h, t, outcome, retry_after_ms, false, &requeued);
}

THROTTLE_EXTERN int throttle_requeue(throttle_t *h, throttle_ticket_t **ticket,
                                     throttle_outcome_t outcome,
                                     uint64_t retry_after_ms,
                                     uint64_t timeout_ms) {
  if (ticket == NULL)
    return THROTTLE_EINVAL;
  throttle_ticket_t *t = *ticket;
  *ticket = NULL;
  if (t != NULL && t->h == h && h != NULL && t->be != NULL) {
    /* On a backend the report frees the place; the caller queues again
     * (at the back: the backend keeps no place across a report). */
    char key[THROTTLE__KEY_MAX + 1];
    throttle_class_t cls = t->cls;
    memcpy(key, t->key, t->len);
    key[t->len] = 0;
    int rc = throttle_leave(h, t, outcome, retry_after_ms);
    if (rc != 0)
      return rc;
    return throttle_enter(h, key, cls, timeout_ms, ticket);
  }
  bool requeued;
  int rc = report(h, t, outcome, retry_after_ms, true, &requeued);
  if (!requeued)
    return rc;
  return enter_wait(h, t, timeout_ms, 0, true, ticket, NULL);
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
