/* SPDX-License-Identifier: MIT */
/*
 * gate_enter.c — the segment backend's admission (throttle__segment_ops
 * enter, leave and requeue; the public calls are api/gate.c): a key's
 * record as a gate.  One probe per lock
 * episode, a FIFO concurrency cap (fixed or learned), live before backfill,
 * a GCRA rate, pause and cancel, and reclaiming the slots of dead holders.
 *
 * Each key has THROTTLE__SLOTS participant slots (holders and waiters).  A
 * caller registers in a slot with an arrival ticket, and sleeps on the
 * slot's own futex word.  Whoever changes what the gate allows (a leaving
 * holder above all) runs the grant (gate_grant.c), which turns the oldest
 * eligible waiters' slots into holders and bumps their words; the waker
 * wakes them after unlocking.  Waiting therefore holds no slot that counts
 * against the cap and no mutex (I4), and a slot goes to the next waiter
 * without polling.
 * Time-driven openings (a not-before passing, a rate token, a lease lapsing)
 * have no waker: each waiter sleeps at most until the next such instant
 * (plus jitter) and then runs the grant itself.
 *
 * Slots are identified by a ticket from one sequence for the whole segment
 * that never restarts, so a ticket names one admission for the segment's
 * lifetime: a stale ticket (lease lapsed, left before, a forked copy)
 * matches nothing, and a forked child can release its parent's admission.
 *
 * Dead holders (gate_live.c, gate_rec.c).  A holder is reclaimed at the
 * next look (at most every 50 ms per key, only when someone waits) once
 * there is evidence it died; one that cannot be judged (another PID
 * namespace, /proc hidden) and a live but hung one are reclaimed when
 * their lease lapses.
 *
 * Waiting (throttle__sleep) is cut into slices when the caller set an
 * interrupt check; an interrupted caller gives back its place, or a slot
 * granted meanwhile, before it returns.  Every time-like field read is
 * bounded first (gate_rec.c): shared memory is input.
 *
 * A transient answer retried with throttle_requeue() keeps its slot, as a
 * waiting slot with its arrival ticket: the oldest waiter, so it probes
 * first when the back-off passes (a leave and a new enter would queue it
 * behind later arrivals).
 *
 * Also here: tickets.  Publishing (the lock episode before the not-before,
 * so a crash between them is safe), cancel, the time bounds, repair and
 * reaping are in gate_rec.c, the grant in gate_grant.c; the snapshot
 * fields in gate_info.c.
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
 * futex only when the key counts sleepers (see throttle__grant_locked for
 * why no wake is lost); every wake still changes its word first.  It is
 * also cheap (bench/bench_admit.c: a few clock_gettime()s): one clock
 * reading per enter (the lease's CLOCK_MONOTONIC start is derived from it,
 * throttle__mono_at), and none for a leave that decides nothing by the
 * time (no waiter to grant, no work at the cap to count: timed_leave),
 * which stamps the key's last use from the coarse clock; one pass over
 * the slots per call (struct
 * throttle__roster), not one per question; the leave finds the record at
 * the index the enter found it (checked against its key), and the enter
 * at the index this thread last found the key (rec_guess); the scope
 * calls (the cold-scope rule, the scope gate, the pools, the report) are
 * skipped while this thread knows that every scope of the key is quiet,
 * absent or answered and holding nothing (throttle__scopes_quiet, under
 * the segment's sgen), and the leave of an admission granted so skips
 * them while sgen is unchanged (ticket.quiet); a thread reuses the
 * ticket its last leave gave back (ticket_alloc).  Rejected: occupancy masks kept in the
 * record (a derived word that a crash or a writer outside the library
 * makes disagree with the slots, hiding a holder from the cap).
 *
 * Beyond THROTTLE__SLOTS participants, a caller takes its arrival ticket at
 * once and sleeps on the record's epoch, which throttle__free_slot() bumps
 * and wakes while such callers are counted; when it registers, the ticket
 * it arrived with keeps its place in the FIFO order.  Rejected: a queue of
 * overflow callers in shared memory (unbounded, and a dead one would block
 * it).
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POLL_NS THROTTLE__POLL_NS
#define DEFAULT_LOCK_DELAY_MS THROTTLE__LOCK_DELAY_MS

/* One spare ticket per thread: an admission's ticket is the one its
 * thread's last leave gave back, not a malloc() and a free() per pair
 * (about half a clock reading).  A thread's spare is freed when the thread
 * exits (a key destructor); the main thread's stays reachable until the
 * process ends.  Test builds allocate every ticket (fault.c counts and
 * fails allocations one by one; a parked spare would hide both); the
 * release build is what the shell and Python tests and the benchmarks
 * run.  Rejected: a spare per handle (threads share handles: an atomic
 * exchange each way costs what malloc does). */
#ifndef THROTTLE_TESTING
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_key_ok;
static THROTTLE__TLS throttle_ticket_t *spare;
static THROTTLE__TLS bool spare_armed; /* the key's destructor will run */

static void spare_drop(void *unused) {
  (void)unused;
  throttle__free(spare);
  spare = NULL;
  spare_armed = false;
}

static void spare_init(void) {
  spare_key_ok = pthread_key_create(&spare_key, spare_drop) == 0;
}

/* The library unloaded (dlclose): no destructor may point into it. */
__attribute__((destructor)) static void spare_fini(void) {
  if (spare_key_ok)
    pthread_key_delete(spare_key);
  spare_key_ok = false;
}

static throttle_ticket_t *ticket_alloc(void) {
  throttle_ticket_t *t = spare;
  if (t == NULL)
    return throttle__malloc(sizeof *t);
  spare = NULL;
  return t;
}

static void ticket_free(throttle_ticket_t *t) {
  if (t != NULL && spare == NULL) {
    if (!spare_armed) {
      pthread_once(&spare_once, spare_init);
      spare_armed =
          spare_key_ok && pthread_setspecific(spare_key, &spare_key) == 0;
    }
    if (spare_armed) {
      spare = t;
      return;
    }
  }
  throttle__free(t);
}
#else
static throttle_ticket_t *ticket_alloc(void) {
  return throttle__malloc(sizeof(throttle_ticket_t));
}

static void ticket_free(throttle_ticket_t *t) { throttle__free(t); }
#endif

static uint64_t ticket_hash(const throttle_t *h, throttle_ticket_t *t) {
  if (!t->hash_ok) {
    t->hash = throttle__hash(h->seed, t->key, t->len);
    t->hash_ok = true;
  }
  return t->hash;
}

/* Where this thread last found the key passed at this address: a hint
 * that spares an admission the key's hash and index walk, checked against
 * the record's key before use (throttle__rec_at_locked), so a wrong one
 * costs the lookup it would have made anyway.  Per thread, by the caller's
 * key pointer (loaders pass the same buffer again and again), and tied to
 * the segment by its random seed. */
#define REC_GUESSES 8
static THROTTLE__TLS struct rec_guess {
  const char *key;
  uint64_t seed;
  uint32_t idx;
} rec_guesses[REC_GUESSES];

static struct rec_guess *rec_guess_slot(const char *key) {
  return &rec_guesses[((uintptr_t)key >> 3) % REC_GUESSES];
}

static uint32_t rec_guess(const throttle_t *h, const char *key) {
  const struct rec_guess *g = rec_guess_slot(key);
  return g->key == key && g->seed == h->seed ? g->idx : UINT32_MAX;
}

static void rec_note(const throttle_t *h, const char *key, uint32_t idx) {
  *rec_guess_slot(key) = (struct rec_guess){key, h->seed, idx};
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

/* Waiting beyond the slots: counted (by class) in the record's
 * generation of that count, which the reap renews when it finds the count
 * stale (gate_rec.c); a caller counted in another one counts itself
 * again, so the count is exact once the gone are dropped. */
struct ovf {
  bool on;
  bool bf;
  uint32_t gen;
};

static void ovf_count(struct throttle__rec *r, struct ovf *o, bool bf) {
  if (o->on && o->gen == r->ovf_gen)
    return;
  o->on = true;
  o->bf = bf;
  o->gen = r->ovf_gen;
  if (r->ovf_waiters < UINT32_MAX)
    r->ovf_waiters++;
  if (bf && r->ovf_bf < UINT32_MAX)
    r->ovf_bf++;
}

/* No longer waiting beyond the slots (registered, or giving up). */
static void ovf_done(struct throttle__rec *r, struct ovf *o) {
  if (o->on && o->gen == r->ovf_gen) {
    if (r->ovf_waiters > 0)
      r->ovf_waiters--;
    if (o->bf && r->ovf_bf > 0)
      r->ovf_bf--;
  }
  o->on = false;
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
  size_t len = t->len;
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
  struct ovf ovf = {0}; /* counted in r->ovf_waiters: beyond the slots */
  t->quiet = false;
  struct throttle__wake w;
  w.n = 0; /* only n: zeroing the 32 pointers cost a quarter of a leave */
  for (;;) {
    if ((rc = throttle__lock(h)) != 0) {
      char key[THROTTLE__KEY_MAX + 1]; /* t may be freed before its use */
      memcpy(key, t->key, len + 1);
      if (registered) {
        /* A slot left waiting would be granted later and then hold the
         * cap until its lease lapsed, the live process being ours.  Try
         * once more to give it back (the leave takes the mutex again); if
         * the mutex is still out of reach, the lease is all there is. */
        char why[512];
        snprintf(why, sizeof why, "%s", throttle_errmsg(h));
        throttle__seg_leave(h, t, THROTTLE_OUTCOME_ABANDONED, 0, 0); /* frees t */
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
    struct throttle__rec *r;
    r = throttle__rec_at_locked(h, t->rec, t->key, len);
    unsigned quiet = r != NULL ? throttle__scopes_quiet_bits(h, r, now) : 0;
    if (!gen_taken && !throttle__scope_enter_idle(h, quiet)) {
      /* before the key's insert, which it could evict */
      throttle__scope_enter_locked(h, t->key, len, now);
      r = throttle__rec_at_locked(h, t->rec, t->key, len);
      quiet = 0; /* looked again below, for the record the key has then */
    }
    rc = r != NULL ? 0
                   : throttle__insert_locked(h, t->key, len, ticket_hash(h, t),
                                             now, &r);
    if (rc != 0) {
      throttle__unlock(h);
      /* No room for the key (EFULL): the caller fails open, but its
       * scopes' records may still say "not before" (a 429 on the
       * workspace), and those it honours first, as with the mutex out of
       * reach. */
      rc = throttle__honour_nb_unlocked(h, t->key, len, rc, nowait, deadline,
                                        wait_ms);
      break;
    }
    r->last_use_ns = now;
    t->rec = (uint32_t)(r - h->recs);
    struct throttle__slot *s = registered ? my_slot(r, t) : NULL;
    /* One read of the slots serves the free-slot search and the grant
     * below, unless a reap in between may have changed them. */
    struct throttle__roster ro;
    bool ro_ok = false;
    if (registered && s == NULL) {
      registered = false; /* reclaimed under us (lease, or a bad writer) */
    }
    if (!registered && gen_taken && r->cancel_gen != cancel_gen) {
      ovf_done(r, &ovf);
      /* Canceled since we arrived, while we had no slot (more callers
       * than slots) or lost ours: a cancel ends every caller waiting at
       * its moment, not only those it found in a slot. */
      throttle__sat_inc(&r->canceled);
      throttle__unlock(h);
      rc = throttle__fail(h, THROTTLE_ECANCELED, "%s: canceled", t->key);
      break;
    }
    if (!registered) {
      if (!gen_taken) {
        cancel_gen = r->cancel_gen;
        gen_taken = true;
      }
      throttle__roster_read(r, &ro);
      ro_ok = true;
      if (ro.free != 0) {
        s = &r->slot[__builtin_ctz(ro.free)];
      } else if (throttle__reap(r, now, false)) {
        ro_ok = false;
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
        s->ticket =
            t->ticket != 0 ? t->ticket : throttle__next_ticket_locked(h, r);
        s->since_ns = now;
        s->since_mono_ns = 0; /* the lease's clock starts at the grant */
        s->probe = 0;
        t->slot = (uint32_t)(s - r->slot);
        t->ticket = s->ticket;
        if (ro_ok)
          throttle__roster_set(&ro, t->slot, THROTTLE__SLOT_WAITING, cls);
        registered = true;
        if (ovf.on)
          r->ovf_free_ns = 0; /* the free slot it waited for is taken */
        ovf_done(r, &ovf);
      } else {
        ovf_count(r, &ovf, cls == THROTTLE_CLASS_BACKFILL);
        if (t->ticket == 0)
          t->ticket = throttle__next_ticket_locked(h, r);
      }
    }
    if (s != NULL && s->state == THROTTLE__SLOT_CANCELED) {
      throttle__free_slot(r, s);
      throttle__sat_inc(&r->canceled);
      throttle__unlock(h);
      rc = throttle__fail(h, THROTTLE_ECANCELED, "%s: canceled", t->key);
      break;
    }
    uint64_t next;
    if (s != NULL && s->state == THROTTLE__SLOT_WAITING) {
      if (throttle__reap(r, now, false))
        ro_ok = false;
      if (quiet == 0)
        quiet = throttle__scopes_quiet_bits(h, r, now);
      uint32_t gen = atomic_load_explicit(&h->hdr->sgen, memory_order_relaxed);
      throttle__grant_locked(h, r, now, &w, &next, ro_ok ? &ro : NULL);
      if (quiet && s->state == THROTTLE__SLOT_HOLDING) {
        t->quiet = true; /* granted here, by a grant that took no place */
        t->quiet_gen = gen;
      }
    } else {
      next = UINT64_MAX;
    }
    if (s != NULL && s->state == THROTTLE__SLOT_WAITING)
      /* still waiting: the waiter's lease runs from this look (reap) */
      s->since_mono_ns = throttle__mono_at(now);
    if (s != NULL && s->state == THROTTLE__SLOT_HOLDING && interrupted) {
      /* Granted while the caller was already told to stop: hand the slot
       * on as an abandoned admission would (a probe's turn passes to the
       * next waiter). */
      throttle__unlock(h);
      throttle__wake_all(&w);
      throttle__seg_leave(h, t, THROTTLE_OUTCOME_ABANDONED, 0, 0); /* frees t */
      t = NULL;
      rc = throttle__fail(h, THROTTLE_EINTR, "interrupted by the caller");
      break;
    }
    if (s != NULL && s->state == THROTTLE__SLOT_HOLDING) {
      /* the probe of its key's episode, or of a scope's (a cold scope's
       * first request, the first after a scope's back-off): its answer is
       * the one the others wait for */
      t->probe = r->probe_ticket == s->ticket ||
                 (!t->quiet && !(quiet & THROTTLE__QUIET_ABSENT) &&
                  throttle__scope_probe_of_locked(h, r, s->ticket));
      s->lease_ms = h->lease_ms;
      throttle__unlock(h);
      throttle__wake_all(&w);
      *out = t;
      throttle__clear_msg(h);
      return 0;
    }
    /* Not admitted (yet).  A not-before beyond the deadline cannot be
     * waited out: say so now rather than sleep to the deadline.  Clamped:
     * throttle__grant_locked() returns before clamping for a paused key, and a
     * stored not-before past the maximum delay would become the hint.
     * The hint, and giving up at once, count this process's own maximum
     * too (it never lets the gate admit it early; see throttle.h), and
     * the not-befores of the key's scopes, which hold it as its own does. */
    uint64_t nb = throttle__clamp_nb_locked(h, r, now);
    if (!(quiet & THROTTLE__QUIET)) {
      uint64_t snb = throttle__scope_nb_locked(h, t->key, len, now);
      if (snb > nb)
        nb = snb;
    }
    if (nb > throttle__sat_add(now, h->max_delay_ns))
      nb = throttle__sat_add(now, h->max_delay_ns);
    /* The hint is the later of the not-befores and, unless the key's cap
     * (or its backfill share) is full, the next instant at which time
     * alone could open the gate for us (a rate's next token, a pool's, a
     * cold hold's end: the grant above said), read before our place is
     * given back below (the grant after it sees the queue without us).
     * A wait for a slot is no time: 0. */
    uint64_t hint_at = nb;
    struct throttle__roster fr;
    throttle__roster_read(r, &fr);
    bool slot_bound = throttle__bits(fr.hold) >= throttle__cap_of(r) ||
                      (cls == THROTTLE_CLASS_BACKFILL &&
                       throttle__bits(fr.hold_bf) >=
                           throttle__backfill_cap(r, throttle__cap_of(r)));
    if (!slot_bound && next != UINT64_MAX && next > hint_at)
      hint_at = next < throttle__sat_add(now, h->max_delay_ns)
                    ? next
                    : throttle__sat_add(now, h->max_delay_ns);
    if (nowait || interrupted || now >= deadline ||
        (nb > now && nb > deadline)) {
      ovf_done(r, &ovf);
      if (s != NULL)
        throttle__free_slot(r, s);
      /* our leaving may unblock others */
      throttle__grant_locked(h, r, now, &w, &next, NULL);
      throttle__unlock(h);
      throttle__wake_all(&w);
      if (wait_ms != NULL)
        *wait_ms = hint_at > now ? (hint_at - now + THROTTLE__NS_PER_MS - 1) /
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
    /* Counted while the mutex is held (see throttle__grant_locked).  The
     * pointer stays valid after unlocking (the segment stays mapped); the
     * record cannot be reused while our slot waits in it, and if a bad
     * writer made it so, a count off by one costs a wake too many, or a
     * waiter's wake (it re-checks within POLL_NS): late, never early. */
    _Atomic uint32_t *sleepers = s != NULL ? &r->sleepers : NULL;
    if (sleepers != NULL)
      atomic_fetch_add_explicit(sleepers, 1, memory_order_acq_rel);
    throttle__unlock(h);
    throttle__wake_all(&w);
    /* Sleep until granted, or until time alone may open the gate (with
     * jitter, so the sleepers of one key do not all take the mutex in the
     * same instant), or the re-check bound, or the deadline. */
    /* beyond the slots too: throttle__free_slot() wakes the epoch */
    uint64_t until = now + POLL_NS;
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

throttle_ticket_t *throttle__ticket_new(throttle_t *h, const char *key,
                                       size_t len, throttle_class_t cls) {
  /* Not calloc: zeroing the whole key buffer costs more than the rest of
   * the ticket; every field is set here. */
  throttle_ticket_t *t = ticket_alloc();
  if (t == NULL)
    return NULL;
  t->h = h;
  t->cls = cls;
  t->ticket = 0;
  t->probe = 0;
  t->len = len;
  memcpy(t->key, key, len);
  t->key[len] = '\0';
  t->hash_ok = false;
  t->slot = UINT32_MAX;
  t->rec = rec_guess(h, key);
  t->be = NULL;
  return t;
}

int throttle__seg_enter(throttle_t *h, const char *key, throttle_ticket_t *t,
                     uint64_t timeout_ms, int nowait, throttle_ticket_t **out,
                     uint64_t *wait_ms) {
  int rc = enter_wait(h, t, timeout_ms, nowait, false, out, wait_ms);
  if (rc == 0)
    rec_note(h, key, (*out)->rec);
  return rc;
}

static uint64_t delay_ns(uint64_t retry_after_ms) {
  uint64_t ms = retry_after_ms ? retry_after_ms : DEFAULT_LOCK_DELAY_MS;
  return ms > UINT64_MAX / THROTTLE__NS_PER_MS ? UINT64_MAX
                                               : ms * THROTTLE__NS_PER_MS;
}

static bool publishes(throttle_outcome_t outcome) {
  return throttle__outcome_publishes(outcome);
}

/* Does this leave decide anything by the time: a grant (waiters), or the
 * learner's work at the cap (an OK at the cap)?  A publish and a requeue
 * read the clock before.  Otherwise the time is only the key's last use,
 * and the coarse clock does (a tenth of a clock reading, a sixth of an
 * uncontended pair).  Any doubt (a learned field out of bounds) reads it. */
static bool timed_leave(const struct throttle__rec *r,
                        const struct throttle__slot *s, bool held,
                        const struct throttle__roster *ro,
                        throttle_outcome_t outcome) {
  if ((ro->wait[0] | ro->wait[1]) != 0)
    return true;
  if (outcome != THROTTLE_OUTCOME_OK || s == NULL || !held ||
      r->fixed_cap != 0)
    return false;
  return r->auto_cap == 0 || r->auto_cap > throttle__learn_bound(r) ||
         s->concurrent >= r->auto_cap;
}

/* Report t's outcome under the mutex: the probe's answer, counters, the
 * back-off, the learned cap; then free t's slot, or (requeue) turn it back
 * into a waiting slot that keeps its arrival ticket, hence its place at the
 * head of the queue.  Grants what the gate allows now into *w.  Returns
 * false when t's admission was already taken back (stale: nothing but the
 * back-off is changed). */
static bool report_locked(throttle_t *h, struct throttle__rec *r,
                          throttle_ticket_t *t, throttle_outcome_t outcome,
                          uint64_t retry_after_ms, bool requeue,
                          uint64_t *nowp, struct throttle__wake *w) {
  struct throttle__slot *s = my_slot(r, t);
  bool probe =
      s != NULL && r->probe_ticket != 0 && s->ticket == r->probe_ticket;
  /* One read of the slots for the learner's count and the grant below. */
  struct throttle__roster ro;
  throttle__roster_read(r, &ro);
  bool held = s != NULL && (ro.hold >> t->slot & 1);
  if (*nowp == 0)
    *nowp = timed_leave(r, s, held, &ro, outcome) ? throttle__now_ns()
                                                  : throttle__now_coarse_ns();
  uint64_t now = *nowp;
  struct throttle__learn_in learn = {
      .outcome = outcome,
      .concurrent = s != NULL && held ? s->concurrent : 0,
      .others = throttle__bits(ro.hold) - (held ? 1 : 0),
      .hold_ns = s != NULL && now > s->since_ns ? now - s->since_ns : 0,
      .retry_after_ms = retry_after_ms,
      .max_delay_ms = h->max_delay_ns / THROTTLE__NS_PER_MS,
      .now = now,
  };
  if (s != NULL && requeue && held) {
    s->state = THROTTLE__SLOT_WAITING; /* the same ticket: the oldest */
    s->probe = 0;
    s->since_ns = now;
    s->since_mono_ns = 0; /* a waiter's lease starts at its next look */
    throttle__roster_set(&ro, t->slot, THROTTLE__SLOT_WAITING, s->cls);
  } else if (s != NULL) {
    throttle__free_slot(r, s);
    throttle__roster_set(&ro, t->slot, THROTTLE__SLOT_FREE, 0);
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
    throttle__sat_inc(&r->locked);
  if (outcome == THROTTLE_OUTCOME_PERMANENT)
    throttle__sat_inc(&r->permanent);
  if (publishes(outcome) &&
      throttle__publish_len(h, t->key, t->len, outcome) == t->len)
    throttle__publish_locked(h, r, now, delay_ns(retry_after_ms));
  if (s != NULL) /* a stale report says nothing of the cap now */
    throttle__learn_locked(r, &learn);
  r->last_use_ns = now;
  THROTTLE__CRASHPOINT("gate-mid-leave"); /* slot freed, not handed over */
  uint64_t next;
  throttle__grant_locked(h, r, now, w, &next, &ro);
  return s != NULL;
}

/* A back-off reported through the backend, recorded in the segment too
 * (as throttle_backoff() does), on the record the backend published it
 * on (the key, or a scope of it): if the backend goes away, this host's
 * processes still honour it. */
void throttle__segment_mirror_publish(throttle_t *h,
                                      const throttle_ticket_t *t,
                                      uint32_t plen, uint64_t ms) {
  if (throttle__lock_brief(h) != 0)
    return; /* the backend has it */
  uint64_t now = throttle__now_ns();
  (void)throttle__publish_at_locked(h, t->key, t->len, plen,
                                    ms > UINT64_MAX / THROTTLE__NS_PER_MS
                                        ? UINT64_MAX
                                        : ms * THROTTLE__NS_PER_MS,
                                    now); /* the backend has it: a copy */
  throttle__unlock(h);
}

/* leave and requeue: report under the mutex (the public call has checked
 * h and t, and turned an unknown outcome into ABANDONED, bad_outcome set,
 * requeue cleared).  t is freed unless requeued (then *requeued is set). */
static int report(throttle_t *h, throttle_ticket_t *t,
                  throttle_outcome_t outcome, uint64_t retry_after_ms,
                  bool requeue, int bad_outcome, bool *requeued) {
  *requeued = false;
  int rc = throttle__lock(h);
  if (rc != 0) {
    throttle__free(t);
    return rc; /* the slot lapses with its lease */
  }
  /* Read now when the back-off or a requeued slot needs it, else by
   * report_locked() (timed_leave) once it has seen the slots. */
  uint64_t now = publishes(outcome) || requeue ? throttle__now_ns() : 0;
  if (publishes(outcome))
    rc = throttle__scope_publish_locked(h, t->key, t->len, outcome,
                                        delay_ns(retry_after_ms), now);
  /* The record the enter found, when it still holds the key: no hash
   * walk on the way out. */
  struct throttle__rec *r = throttle__rec_at_locked(h, t->rec, t->key, t->len);
  if (r == NULL)
    r = throttle__find_locked(h, t->key, t->len, ticket_hash(h, t));
  if (r == NULL && publishes(outcome)) {
    int irc = throttle__insert_locked(h, t->key, t->len, ticket_hash(h, t),
                                      now, &r);
    if (rc == 0)
      rc = irc;
  }
  struct throttle__wake w;
  w.n = 0; /* only n: zeroing the 32 pointers cost a quarter of a leave */
  bool stale = r == NULL ||
               !report_locked(h, r, t, outcome, retry_after_ms, requeue, &now,
                              &w);
  /* Nothing for the scopes to hear when the admission took no place in
   * them and they are as quiet as at its grant (every one answered), or
   * when none has a record. */
  bool quiet = t->quiet && atomic_load_explicit(&h->hdr->sgen,
                                                memory_order_relaxed) ==
                               t->quiet_gen;
  if (!quiet && (r == NULL || !(throttle__scopes_quiet_bits(h, r, now) &
                                THROTTLE__QUIET_ABSENT)))
    throttle__scope_report_locked(h, t->key, t->len, t->ticket, outcome);
  throttle__unlock(h);
  throttle__wake_all(&w);
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
  ticket_free(t);
  return rc;
}

int throttle__seg_leave(throttle_t *h, throttle_ticket_t *t,
                     throttle_outcome_t outcome, uint64_t retry_after_ms,
                     int bad_outcome) {
  bool requeued;
  return report(h, t, outcome, retry_after_ms, false, bad_outcome, &requeued);
}

int throttle__seg_requeue(throttle_t *h, throttle_ticket_t *t,
                       throttle_outcome_t outcome, uint64_t retry_after_ms,
                       int bad_outcome, uint64_t timeout_ms,
                       throttle_ticket_t **ticket) {
  bool requeued;
  int rc = report(h, t, outcome, retry_after_ms, !bad_outcome, bad_outcome,
                  &requeued);
  if (!requeued)
    return rc;
  return enter_wait(h, t, timeout_ms, 0, true, ticket, NULL);
}
