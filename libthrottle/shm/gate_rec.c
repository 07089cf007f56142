/* SPDX-License-Identifier: MIT */
/*
 * gate_rec.c — a key's record as a gate, under the mutex: the helpers
 * that publish, open and cancel it and wake its waiters, the bounds every
 * time-like field gets where it is read (I8) and the repair of a record
 * after a crash, and the reaping of the slots of dead holders.  Below the
 * table (which asks it whether a record is idle) and the scopes; the
 * grant itself is gate_grant.c.
 */
#include "internal.h"

#define REAP_NS (50 * THROTTLE__NS_PER_MS)
#define WAITER_LEASE_MIN_NS (4 * THROTTLE__POLL_NS)

/* ---- helpers on a record -------------------------------------------- */

void throttle__free_slot(struct throttle__rec *r, struct throttle__slot *s) {
  s->state = THROTTLE__SLOT_FREE;
  s->probe = 0;
  s->ticket = 0;
  s->pid = 0;
  throttle__slot_bump(s);
  if (r->ovf_waiters != 0) { /* a caller beyond the slots may register */
    if (r->ovf_free_ns == 0) /* free since now (throttle__ovf_stale) */
      r->ovf_free_ns = throttle__now_coarse_ns();
    atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
    throttle__futex_wake(&r->epoch);
  }
}

/* What a record holds, its slots aside, that its eviction would lose: a
 * not-before to come, settings an operator made (never evicted), or a lock
 * episode (a back-off published and no probe answered yet) or a probe
 * out: evicted, the next callers would find the key (or the scope) new
 * and all go at once (I3).  An episode holds its record until one maximum
 * delay of the segment has passed since its not-before and its last use
 * with nobody coming back for it: no herd is left to hold by then, and a
 * table must not fill up with episodes that nobody will end. */
static bool rec_holds(const throttle_t *h, const struct throttle__rec *r,
                      uint64_t now) {
  uint64_t nb = atomic_load_explicit(&r->not_before, memory_order_relaxed);
  if (nb > now)
    return true;
  if (r->fixed_cap || r->auto_max || r->rate_n ||
      (r->flags & (THROTTLE__REC_PAUSED | THROTTLE__REC_SHARE_SET)))
    return true;
  if (!(r->flags & THROTTLE__REC_EPISODE) && r->probe_ticket == 0)
    return false;
  uint64_t since = nb > r->last_use_ns ? nb : r->last_use_ns;
  if (since > now) /* shared memory is input: at most one delay from now */
    since = now;
  return now < throttle__sat_add(since, throttle__seg_max_ns(h));
}

bool throttle__rec_idle(const throttle_t *h, const struct throttle__rec *r,
                        uint64_t now) {
  if (rec_holds(h, r, now))
    return false;
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
  throttle__sat_inc(&r->clears);
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
      throttle__slot_bump(&r->slot[i]);
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
   * at once: a herd).  A back-off is the server's answer, whoever
   * publishes it: a scope published on directly (a script's backoff, not a
   * leave beneath) is answered, and its probe holds the keys beneath until
   * its own answer, not just the cold scope's bound (scope.c). */
  throttle__rec_flags(r, THROTTLE__REC_EPISODE | THROTTLE__REC_ANSWERED, true);
  THROTTLE__CRASHPOINT("gate-mid-publish");
  if (want > cur)
    atomic_store_explicit(&r->not_before, want, memory_order_release);
  throttle__scope_touch(h); /* after the not-before (scope.c) */
  throttle__sat_inc(&r->publishes);
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
      throttle__free_slot(r, s);
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
  if (r->ovf_bf > r->ovf_waiters)
    r->ovf_bf = r->ovf_waiters;
  throttle__learn_bound_locked(r, now);
}

/* The next ticket of the segment.  A counter far beyond any real use (2^62
 * admissions) was written by a bad writer: start again above the tickets
 * of this key, which keeps its FIFO order and its identities distinct. */
uint64_t throttle__next_ticket_locked(throttle_t *h, struct throttle__rec *r) {
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

/* ---- granting -------------------------------------------------------- */

void throttle__wake_all(struct throttle__wake *w) {
  for (uint32_t i = 0; i < w->n; i++)
    throttle__futex_wake(&w->slot[i]->word);
  w->n = 0;
}

/* Reclaim slots of dead holders and waiters, and of holders past their
 * lease.  Reading /proc costs microseconds, so it runs at most every
 * REAP_NS per key, and only when somebody is waiting for the gate. */
void throttle__reap_locked(struct throttle__rec *r, uint64_t now) {
  (void)throttle__reap(r, now, false);
}

/* For eviction: a key that would be idle but for slots (no back-off, no
 * setting an operator made) is reaped now, whoever waits; true when that
 * leaves it idle (its only participants were dead or past their lease). */
bool throttle__reap_idle_locked(const throttle_t *h, struct throttle__rec *r,
                                uint64_t now) {
  if (rec_holds(h, r, now))
    return false;
  (void)throttle__reap(r, now, true);
  return throttle__rec_idle(h, r, now);
}

/* The count of callers beyond the slots (gate_enter.c) is judged by evidence
 * (throttle__ovf_stale): dropped, and its generation renewed so that a
 * live caller counted before counts itself again.  ovf_free_ns is kept
 * here and by throttle__free_slot(). */
static void reap_ovf(struct throttle__rec *r, uint64_t now) {
  bool slot_free = false;
  for (uint32_t i = 0; i < THROTTLE__SLOTS && !slot_free; i++)
    slot_free = r->slot[i].state == THROTTLE__SLOT_FREE;
  if (r->ovf_waiters == 0 || !slot_free) {
    r->ovf_free_ns = 0;
  } else if (r->ovf_free_ns == 0 || r->ovf_free_ns > now) {
    r->ovf_free_ns = now;
  } else if (throttle__ovf_stale(r, now)) {
    r->ovf_gen++;
    r->ovf_waiters = 0;
    r->ovf_bf = 0;
    r->ovf_free_ns = 0;
  }
}

/* true when it looked (and may have freed slots), false when it was too
 * soon since the last look. */
bool throttle__reap(struct throttle__rec *r, uint64_t now, bool force) {
  if (!force && now - r->last_reap_ns < REAP_NS && r->last_reap_ns <= now)
    return false;
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
    /* A waiter's lease runs from its last look at the gate (gate_enter.c
     * stamps it each time it must wait on; 0: not yet), so a waiter that
     * cannot be judged and stopped looking is dropped as a holder's slot
     * is.  A live one looks again every THROTTLE__POLL_NS, hence the floor
     * of a few of those; one dropped while alive (stopped past its lease)
     * registers again with its arrival ticket, its place in the queue
     * kept. */
    uint64_t lease = (uint64_t)s->lease_ms * THROTTLE__NS_PER_MS;
    if (s->state == THROTTLE__SLOT_WAITING && lease < WAITER_LEASE_MIN_NS)
      lease = WAITER_LEASE_MIN_NS;
    bool lapsed = (s->state == THROTTLE__SLOT_HOLDING ||
                   (s->state == THROTTLE__SLOT_WAITING &&
                    s->since_mono_ns != 0)) &&
                  mono - s->since_mono_ns > lease;
    if (!lapsed && throttle__holder_alive(s))
      continue;
    if (s->state == THROTTLE__SLOT_HOLDING) {
      throttle__sat_inc(&r->reclaims);
      if (s->ticket == r->probe_ticket) {
        /* the next waiter probes */
        __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
        atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
      }
    }
    throttle__free_slot(r, s);
  }
  reap_ovf(r, now);
  return true;
}

void throttle__roster_read(const struct throttle__rec *r,
                           struct throttle__roster *ro) {
  /* Which slots are in use, without a branch per slot (the common case
   * is one or two of 32), then a closer look at those alone.  Four
   * partial masks (one chain of 32 dependent ors cost a cycle a slot),
   * and the roster stored once at the end: a caller's 16-byte read of
   * masks just stored one by one waits for the stores to drain. */
  uint32_t p0 = 0, p1 = 0, p2 = 0, p3 = 0;
#pragma GCC unroll 8
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i += 4) {
    p0 |= (uint32_t)(r->slot[i].state != THROTTLE__SLOT_FREE) << i;
    p1 |= (uint32_t)(r->slot[i + 1].state != THROTTLE__SLOT_FREE) << (i + 1);
    p2 |= (uint32_t)(r->slot[i + 2].state != THROTTLE__SLOT_FREE) << (i + 2);
    p3 |= (uint32_t)(r->slot[i + 3].state != THROTTLE__SLOT_FREE) << (i + 3);
  }
  uint32_t used = (p0 | p1) | (p2 | p3);
  uint32_t hold = 0, hold_bf = 0, wait_live = 0, wait_bf = 0, free = ~used;
  bool probe_held = false;
  uint64_t probe = r->probe_ticket;
  for (; used != 0; used &= used - 1) {
    uint32_t i = (uint32_t)__builtin_ctz(used), bit = UINT32_C(1) << i;
    const struct throttle__slot *s = &r->slot[i];
    if (s->state == THROTTLE__SLOT_HOLDING) {
      hold |= bit;
      if (s->cls == THROTTLE_CLASS_BACKFILL)
        hold_bf |= bit;
      if (probe != 0 && s->ticket == probe)
        probe_held = true;
    } else if (s->state == THROTTLE__SLOT_WAITING &&
               s->cls <= THROTTLE_CLASS_BACKFILL) {
      if (s->cls == THROTTLE_CLASS_BACKFILL)
        wait_bf |= bit;
      else
        wait_live |= bit;
    } else if (s->state == THROTTLE__SLOT_FREE) {
      free |= bit; /* changed since the first look (a bad writer) */
    }
  }
  *ro = (struct throttle__roster){.hold = hold,
                                  .hold_bf = hold_bf,
                                  .wait = {wait_live, wait_bf},
                                  .free = free,
                                  .probe_held = probe_held};
}

/* Wake every waiter of r with THROTTLE_ECANCELED (see settings.c). */
void throttle__cancel_locked(struct throttle__rec *r) {
  r->cancel_gen++;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state == THROTTLE__SLOT_WAITING) {
      r->slot[i].state = THROTTLE__SLOT_CANCELED;
      throttle__slot_bump(&r->slot[i]);
    }
  atomic_fetch_add_explicit(&r->epoch, 1, memory_order_acq_rel);
}

uint64_t throttle__seg_max_ns(const throttle_t *h) {
  uint64_t v =
      atomic_load_explicit(&h->hdr->max_delay_ns, memory_order_relaxed);
  if (v < THROTTLE__NS_PER_MS ||
      v > THROTTLE__MAX_MAX_DELAY_MS * THROTTLE__NS_PER_MS)
    return THROTTLE__DEFAULT_MAX_DELAY_MS * THROTTLE__NS_PER_MS;
  return v;
}

/* A not-before further out than the segment's maximum delay can only come
 * from a writer that ignored the clamp (or a clock that went backwards):
 * pull it in, for everyone, so it costs at most one maximum delay from now.
 * This process's own maximum plays no part: the gate decides for every
 * process (whoever runs it admits others' waiters too), and a loosely
 * configured process must not shorten what the others honour. */
uint64_t throttle__clamp_nb_locked(throttle_t *h, struct throttle__rec *r,
                                   uint64_t now) {
  uint64_t nb = atomic_load_explicit(&r->not_before, memory_order_relaxed);
  uint64_t limit = throttle__sat_add(now, throttle__seg_max_ns(h));
  if (nb > limit) {
    nb = limit;
    atomic_store_explicit(&r->not_before, nb, memory_order_release);
  }
  return nb;
}
