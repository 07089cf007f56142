/* SPDX-License-Identifier: MIT */
/*
 * scope.c — keys as paths.  A key's scopes are its prefixes at '/': for
 * "hotdata:ws1/orders" the scope "hotdata:ws1".  A scope is an ordinary
 * record (its own not-before, pause, cancel generation, lock episode), so
 * throttle_backoff(), throttle_pause() and throttle_cancel() on a scope
 * need nothing new; what this file owns is how a scope reaches the keys
 * beneath it:
 *
 *  - the gate of a key also consults its scopes (throttle__scope_gate_locked,
 *    called by grant_locked): a scope's not-before, pause or probe holds
 *    every key beneath;
 *  - after a scope's not-before passes, ONE admission beneath it goes as the
 *    scope's probe: it takes a holding slot in the scope's record (so the
 *    scope's lease and dead-holder reclaim apply to it unchanged) and the
 *    scope's probe ticket; its leave answers for the scope
 *    (throttle__scope_report_locked);
 *  - a cold scope (throttle__scope_enter_locked): a scope that the
 *    caller's 429 and 503 are published on (the default: the root scope)
 *    and that no answer has come back to yet gets its record, in an
 *    episode with no not-before, so ONE first admission beneath goes as
 *    its probe and the others follow its answer.  Without it, before
 *    anything is known each table's first writer goes at once, and a
 *    workspace answering 429 refuses one per table instead of one.  Any
 *    answer from beneath marks the scope answered (REC_ANSWERED) for good;
 *    an answer not published on the scope (OK, a table's LOCKED, a
 *    permanent 4xx) ends its episode, a failure or an abandon passes the
 *    probe to the next.  The cost: at a cold scope's start the other keys
 *    beneath wait one request's latency, at most THROTTLE__COLD_HOLD_NS
 *    (1 s) after the first request's grant, once per scope per segment.
 *    The bound is there because nothing is known yet: without it a long
 *    first load would hold its siblings for as long, and a caller that
 *    holds one table's admission while it enters another (nested work, a
 *    batch that takes its places first) would wait for itself forever.
 *    The same bound holds throttle_wait() on the keys beneath
 *    (throttle__scope_probe_holds_locked: one rule for every waiting call).
 *    Past the bound the keys go as if no scope had a record; the first
 *    answer still ends the episode (or, a 429, starts one with a
 *    not-before).  What the bound gives up: a first refusal slower than
 *    1 s lets the first wave go before its Retry-After is known.
 *    Rejected: no bound (the self-wait above), and the per-key first wave
 *    (the refusals the scope exists to prevent).  A handle that
 *    publishes 429 and 503 on the key creates no such record: its tables
 *    stay independent, as before.  Only into a free record: a scope must
 *    not evict the key being admitted;
 *  - which record a transient answer is published on (throttle__publish_key):
 *    LOCKED on the key, 429 and 503 on the root scope, unless the handle
 *    says otherwise (throttle_set_publish_level);
 *  - operator changes on a scope (resume, cancel, clear) reach the waiters
 *    of every key beneath (throttle__scope_below_locked);
 *  - pools: a scope with a fixed cap or a rate bounds the sum of the
 *    admissions beneath it.  A grant on a key first asks every pool above
 *    it (throttle__scope_pool_allows_locked: a free place, backfill within
 *    the pool's share, the pool's rate, and no older eligible waiter of
 *    another key beneath, live first), then takes a holding slot in each
 *    capped pool (throttle__scope_take_locked), all under the one segment
 *    mutex: atomic, no lock order, no place held while waiting.  A leave
 *    frees those places and wakes the keys beneath, so the oldest eligible
 *    waiter of any of them takes the place: eligible, it could go but for
 *    the pool (could_go: not held by its own key or a scope between, and
 *    not gone, judged by the reap's evidence: someone_ahead).  A cap set
 *    on a scope gives the holders already beneath their places
 *    (throttle__scope_pool_set_locked).  A pool's places are its
 *    record's slots, hence at most THROTTLE__SLOTS (a larger cap on a
 *    scope is refused by the setter).  After a crash inside a grant, the
 *    repair gives a live holder the pool places it lacks
 *    (throttle__scope_repair_locked).
 *
 * Rejected: copying a scope's not-before into every record beneath on
 * publish (a key created later would miss it, and a publish would cost a
 * table walk); a scope field in each record pointing at its parent (records
 * are evicted and reused, so the pointer would need its own validation);
 * a separate table of scopes (a second lookup structure to repair after a
 * crash).  The open-key path looks at a key's scopes only when the
 * segment's sgen changed since this thread saw them open (table.c's
 * guesses; bench/bench_backoff.c measures it against clock_gettime), and
 * so does an admission (quiet scopes, below; bench/bench_admit.c).
 * Rejected for pools: a queue of the pool's waiters in shared memory (a
 * second FIFO to repair after a crash; the waiters' own slots and tickets
 * already order them, at the cost of a walk of the table per grant of a
 * pooled key); taking the places level by level (a place held while
 * waiting for the next, and lock-order deadlocks).
 */
#include "internal.h"

#include <string.h>

/* internal.h's helpers on a record, by the short names used here */
static inline size_t klen(const struct throttle__rec *r) {
  return throttle__rec_klen(r);
}

static inline bool below(const struct throttle__rec *r, const char *scope,
                         size_t len) {
  return throttle__rec_below(r, scope, len);
}

/* The scope's record, or NULL when the scope was never named. */
static struct throttle__rec *scope_rec(throttle_t *h, const char *key,
                                       size_t len) {
  return throttle__find_locked(h, key, len, throttle__hash(h->seed, key, len));
}

/* Does s hold a slot with this ticket (a place, or its probe)? */
static bool holds_place(const struct throttle__rec *s, uint64_t ticket) {
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (s->slot[i].state == THROTTLE__SLOT_HOLDING &&
        s->slot[i].ticket == ticket)
      return true;
  return false;
}

/* Does the scope's probe still hold the keys beneath?  Its holding slot is
 * in the scope's own record; the dead-holder reclaim and the lease of
 * gate_enter.c free it.  A cold scope's first request (no answer yet, see the
 * header) holds them at most THROTTLE__COLD_HOLD_NS after its grant;
 * *next is then when that hold ends. */
static bool probe_out(struct throttle__rec *s, uint64_t now, uint64_t *next) {
  if (s->probe_ticket == 0)
    return false;
  throttle__reap_locked(s, now);
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    const struct throttle__slot *q = &s->slot[i];
    if (q->state != THROTTLE__SLOT_HOLDING || q->ticket != s->probe_ticket)
      continue;
    if (s->flags & THROTTLE__REC_ANSWERED)
      return true;
    uint64_t until = q->since_ns + THROTTLE__COLD_HOLD_NS;
    if (until <= now)
      return false; /* the cold hold is over: the keys go, episode kept */
    if (until < *next)
      *next = until;
    return true;
  }
  __atomic_store_n(&s->probe_ticket, 0, __ATOMIC_RELEASE);
  return false;
}

bool throttle__scope_probe_holds_locked(struct throttle__rec *s, uint64_t now,
                                        uint64_t *next) {
  return (s->flags & THROTTLE__REC_EPISODE) && probe_out(s, now, next);
}

bool throttle__scope_probe_of_locked(throttle_t *h,
                                     const struct throttle__rec *r,
                                     uint64_t ticket) {
  for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
       p++) {
    const struct throttle__rec *s = scope_rec(h, r->key, p);
    if (s != NULL && ticket != 0 && s->probe_ticket == ticket)
      return true;
  }
  return false;
}

int throttle__scope_gate_locked(throttle_t *h, const struct throttle__rec *r,
                                uint64_t now, uint64_t *next) {
  int verdict = THROTTLE__SCOPE_OPEN;
  for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
       p++) {
    struct throttle__rec *s = scope_rec(h, r->key, p);
    if (s == NULL)
      continue;
    if (s->flags & THROTTLE__REC_PAUSED)
      return THROTTLE__SCOPE_HELD;
    uint64_t nb = throttle__clamp_nb_locked(h, s, now);
    if (nb > now) {
      *next = nb;
      return THROTTLE__SCOPE_HELD;
    }
    if (s->flags & THROTTLE__REC_EPISODE) {
      if (probe_out(s, now, next))
        return THROTTLE__SCOPE_HELD;
      if (s->probe_ticket == 0)
        verdict = THROTTLE__SCOPE_PROBE;
    }
  }
  return verdict;
}

uint64_t throttle__scope_nb_locked(throttle_t *h, const char *key, size_t len,
                                   uint64_t now) {
  uint64_t nb = 0;
  for (size_t p = 0; (p = throttle__scope_next(key, len, p)) != 0; p++) {
    struct throttle__rec *s = scope_rec(h, key, p);
    uint64_t v = s != NULL ? throttle__clamp_nb_locked(h, s, now) : 0;
    if (v > nb)
      nb = v;
  }
  return nb;
}

/* A holding slot in scope s standing for the admission held on a key
 * beneath (its probe, or its place in s's pool), with the holder's
 * identity, so s's lease and dead-holder reclaim judge it as the key's
 * would.  NULL when s has no free slot. */
static struct throttle__slot *place(struct throttle__rec *s,
                                    const struct throttle__slot *held) {
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    struct throttle__slot *q = &s->slot[i];
    if (q->state != THROTTLE__SLOT_FREE)
      continue;
    q->since_ns = held->since_ns; /* the times first, the state last */
    q->since_mono_ns = held->since_mono_ns;
    q->pid = held->pid;
    q->start = held->start;
    q->pidns = held->pidns;
    q->lease_ms = held->lease_ms;
    q->ticket = held->ticket;
    q->cls = held->cls;
    q->probe = 0;
    q->concurrent = 1;
    q->state = THROTTLE__SLOT_HOLDING;
    return q;
  }
  return NULL;
}

/* A scope with a cap or a rate bounds the sum of the keys beneath it. */
static bool is_pool(const struct throttle__rec *s) {
  return s->fixed_cap != 0 || s->rate_n != 0;
}

void throttle__scope_take_locked(throttle_t *h, const struct throttle__rec *r,
                                 const struct throttle__slot *held,
                                 bool probe) {
  for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
       p++) {
    struct throttle__rec *s = scope_rec(h, r->key, p);
    if (s == NULL)
      continue;
    bool probes = probe && (s->flags & THROTTLE__REC_EPISODE) &&
                  s->probe_ticket == 0;
    if (!probes && !is_pool(s))
      continue;
    throttle__rate_take(s, held->since_ns); /* the pool's budget */
    if (!probes && s->fixed_cap == 0)
      continue; /* a rate alone holds no place */
    /* One place per scope: a pool's place is also its probe's.  A scope
     * with no free slot is neither probed nor counted (fail open rather
     * than hold its keys forever; pool_allows() saw a free one). */
    struct throttle__slot *q = place(s, held);
    if (q == NULL || !probes)
      continue;
    q->probe = 1;
    __atomic_store_n(&s->probe_ticket, held->ticket, __ATOMIC_RELEASE);
    throttle__scope_touch(h);
    if (s->probes < UINT64_MAX)
      s->probes++;
  }
}

/* ---- repair -------------------------------------------------------------- */

/* A grant is one critical section: the key's slot, then a place in every
 * pool above (grant_locked, then throttle__scope_take_locked).  A process
 * killed between the two, while granting another process's waiter (a
 * leave hands the key's slot on), left a live holder with no place: the
 * pool would admit one more until it left.  The repair after the crash
 * (the mutex's EOWNERDEAD) gives every holder beneath a capped pool the
 * place it lacks there.  Not repaired: a rate's token not taken (one
 * admission early in the pool's budget, once per crash), and the reverse
 * cut, a leave killed between freeing the key's slot and its places (the
 * place cannot be told from an admission on the scope itself, and it is
 * reclaimed with its holder's death or lease: fewer admitted, never
 * more). */
/* Every holder of r without a place in the capped pool s takes one. */
static void give_places(struct throttle__rec *s, const struct throttle__rec *r) {
  for (uint32_t j = 0; j < THROTTLE__SLOTS; j++)
    if (r->slot[j].state == THROTTLE__SLOT_HOLDING &&
        !holds_place(s, r->slot[j].ticket))
      place(s, &r->slot[j]);
}

void throttle__scope_repair_locked(throttle_t *h) {
  for (uint32_t i = 0; i < h->capacity; i++) {
    const struct throttle__rec *r = &h->recs[i];
    if (r->state != THROTTLE__REC_USED)
      continue;
    for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
         p++) {
      struct throttle__rec *s = scope_rec(h, r->key, p);
      if (s != NULL && s != r && s->fixed_cap != 0)
        give_places(s, r);
    }
  }
}

/* held, on r, takes a place in every capped pool above r as a grant's
 * would, and nothing else (no token of a rate, no probe): an admission
 * the backend across hosts made, kept in the segment (segment_ops.c). */
void throttle__scope_place_locked(throttle_t *h, const struct throttle__rec *r,
                                  const struct throttle__slot *held) {
  for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
       p++) {
    struct throttle__rec *s = scope_rec(h, r->key, p);
    if (s != NULL && s != r && s->fixed_cap != 0 &&
        !holds_place(s, held->ticket))
      (void)place(s, held);
  }
}

/* A scope that became a pool, or whose cap changed, counts what is
 * already in flight beneath it: a holder admitted while the scope was no
 * pool took no place there, and the cap would admit that many more beside
 * it (4 in flight, a new cap of 2, and 4 more admitted).  Its leave frees
 * the place as any other's (throttle__scope_report_locked: by ticket). */
void throttle__scope_pool_set_locked(throttle_t *h, struct throttle__rec *s) {
  size_t len = klen(s);
  if (s->fixed_cap == 0 || len == 0)
    return;
  for (uint32_t i = 0; i < h->capacity; i++) {
    const struct throttle__rec *r = &h->recs[i];
    if (r != s && below(r, s->key, len))
      give_places(s, r);
  }
}

/* ---- pools ------------------------------------------------------------- */

/* Does the pool s hold a waiter of class cls for its own places: full,
 * backfill beyond its share, or its rate spent? */
static bool pool_full(throttle_t *h, struct throttle__rec *s, int cls,
                      uint64_t now, uint64_t *next) {
  throttle__bound_rate(h, s, now);
  uint64_t ready;
  if (!throttle__rate_allows(s, now, &ready)) {
    if (ready < *next)
      *next = ready;
    return true;
  }
  if (s->fixed_cap == 0)
    return false;
  uint32_t cap = throttle__cap_of(s);
  return throttle__count_slots(s, THROTTLE__SLOT_HOLDING, -1) >= cap ||
         throttle__count_slots(s, THROTTLE__SLOT_FREE, -1) == 0 ||
         (cls == THROTTLE_CLASS_BACKFILL &&
          throttle__count_slots(s, THROTTLE__SLOT_HOLDING,
                                THROTTLE_CLASS_BACKFILL) >=
              throttle__backfill_cap(s, cap));
}

/* Could a waiter of class cls on r go now but for the pool of the scope
 * of length plen above it: r's own gate (pause, not-before, probe, cap,
 * backfill share, rate) and every scope between the pool and r (pause,
 * not-before, probe out, a nested pool that is full) let it?  A waiter
 * held by a reason of its own must not hold the pool's turn: it would
 * keep every other key beneath waiting for as long as its reason lasts
 * (a paused sub-scope: until the resume). */
static bool could_go(throttle_t *h, struct throttle__rec *r, size_t plen,
                     int cls, uint64_t now) {
  uint64_t ignored = UINT64_MAX, ready;
  if ((r->flags & THROTTLE__REC_PAUSED) ||
      throttle__clamp_nb_locked(h, r, now) > now ||
      ((r->flags & THROTTLE__REC_EPISODE) && r->probe_ticket != 0))
    return false;
  throttle__bound_rate(h, r, now);
  if (!throttle__rate_allows(r, now, &ready))
    return false;
  uint32_t cap = throttle__cap_of(r);
  if (throttle__count_slots(r, THROTTLE__SLOT_HOLDING, -1) >= cap ||
      (cls != THROTTLE_CLASS_LIVE &&
       throttle__count_slots(r, THROTTLE__SLOT_HOLDING, cls) >=
           throttle__backfill_cap(r, cap)))
    return false;
  size_t len = klen(r);
  for (size_t p = plen + 1; (p = throttle__scope_next(r->key, len, p)) != 0;
       p++) {
    struct throttle__rec *m = scope_rec(h, r->key, p);
    if (m == NULL)
      continue;
    if ((m->flags & THROTTLE__REC_PAUSED) ||
        throttle__clamp_nb_locked(h, m, now) > now ||
        ((m->flags & THROTTLE__REC_EPISODE) && probe_out(m, now, &ignored)) ||
        (is_pool(m) && pool_full(h, m, cls, now, &ignored)))
      return false;
  }
  return true;
}

/* A waiter of another key beneath s that goes before w: live before
 * backfill, then the older ticket, among those who could go (could_go).
 * Judged by evidence: before a key's waiters count, the key is reaped
 * (gate_rec.c), so a waiter whose process is gone, or that has not
 * looked at its gate within its lease (one that cannot be judged), is
 * dropped instead of holding the turn: nothing else would ever take it,
 * and every key beneath would wait behind it. */
static bool someone_ahead(throttle_t *h, struct throttle__rec *s,
                          const struct throttle__rec *own,
                          const struct throttle__slot *w, uint64_t now) {
  size_t slen = klen(s);
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r == own || !below(r, s->key, slen))
      continue;
    bool reaped = false;
    int can[2] = {-1, -1}; /* per class: unknown, no, yes */
    for (uint32_t j = 0; j < THROTTLE__SLOTS; j++) {
      const struct throttle__slot *o = &r->slot[j];
      if (o->state != THROTTLE__SLOT_WAITING ||
          o->cls > THROTTLE_CLASS_BACKFILL ||
          !(o->cls < w->cls || (o->cls == w->cls && o->ticket < w->ticket)))
        continue;
      if (!reaped) {
        reaped = true;
        throttle__reap_locked(r, now);
        if (o->state != THROTTLE__SLOT_WAITING)
          continue; /* it was gone */
      }
      if (can[o->cls] < 0)
        can[o->cls] = could_go(h, r, slen, o->cls, now);
      if (can[o->cls])
        return true;
    }
  }
  return false;
}

bool throttle__scope_pool_allows_locked(throttle_t *h,
                                        const struct throttle__rec *r,
                                        const struct throttle__slot *w,
                                        uint64_t now, uint64_t *next) {
  for (size_t p = 0; (p = throttle__scope_next(r->key, klen(r), p)) != 0;
       p++) {
    struct throttle__rec *s = scope_rec(h, r->key, p);
    if (s == NULL || !is_pool(s))
      continue;
    throttle__reap_locked(s, now); /* places of dead holders */
    if (pool_full(h, s, w->cls, now, next))
      return false;
    if (someone_ahead(h, s, r, w, now))
      return false;
  }
  return true;
}

/* Did the server answer (as opposed to a failure that says nothing of the
 * scope, or a caller that gave up)? */
static bool answered(throttle_outcome_t o) {
  return o == THROTTLE_OUTCOME_OK || o == THROTTLE_OUTCOME_LOCKED ||
         o == THROTTLE_OUTCOME_RATE_LIMITED ||
         o == THROTTLE_OUTCOME_UNAVAILABLE ||
         o == THROTTLE_OUTCOME_PERMANENT;
}

void throttle__scope_report_locked(throttle_t *h, const char *key,
                                   size_t len, uint64_t ticket,
                                   throttle_outcome_t outcome) {
  bool answer = answered(outcome);
  for (size_t p = 0; (p = throttle__scope_next(key, len, p)) != 0; p++) {
    struct throttle__rec *s = scope_rec(h, key, p);
    if (s == NULL)
      continue;
    if (answer && !(s->flags & THROTTLE__REC_ANSWERED))
      throttle__rec_flags(s, THROTTLE__REC_ANSWERED, true);
    if (ticket == 0)
      continue;
    bool freed = false;
    for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
      if (s->slot[i].state == THROTTLE__SLOT_HOLDING &&
          s->slot[i].ticket == ticket) {
        s->slot[i].state = THROTTLE__SLOT_FREE;
        s->slot[i].ticket = 0;
        s->slot[i].probe = 0;
        s->slot[i].pid = 0;
        atomic_fetch_add_explicit(&s->slot[i].word, 1, memory_order_release);
        freed = true;
      }
    bool probe = s->probe_ticket == ticket;
    if (probe) {
      __atomic_store_n(&s->probe_ticket, 0, __ATOMIC_RELEASE);
      /* Any answer not published on s says s is open: a table's LOCKED
       * is the table's, and the workspace served the request.  Not when
       * s has a not-before again (another answer refused meanwhile): the
       * episode then waits for it, or its passing would let all go. */
      uint64_t now = throttle__now_ns();
      bool here = outcome != THROTTLE_OUTCOME_OK &&
                  outcome != THROTTLE_OUTCOME_PERMANENT &&
                  throttle__publish_len(h, key, len, outcome) == p;
      if (answer && !here && throttle__clamp_nb_locked(h, s, now) <= now)
        throttle__rec_flags(s, THROTTLE__REC_EPISODE, false);
    }
    if (!probe && !freed)
      continue;
    /* the probe's answer, or a pool place handed on: the keys beneath look
     * again, and the oldest eligible waiter of any of them takes it */
    throttle__wake_rec(s);
    throttle__scope_below_locked(h, s, false);
  }
}

/* ---- quiet scopes: the open-key path ---------------------------------- */

/* Most admissions are of a key whose scopes are all quiet: absent, or
 * answered and holding nothing (no pause, no not-before, no episode, no
 * probe out, no cap or rate).  Then the cold-scope rule, the scope gate,
 * the pools and the scope's report have nothing to do, and each would
 * have looked every scope up (a hash and an index walk): five or six per
 * uncontended admission, most of its time.  Quiet is a property of the
 * records that only a change that bumps hdr->sgen can end (a publish, a
 * pause or another setting, a probe sent out, a cold scope's episode, an
 * insert, an eviction, a repair; time passing only opens a not-before
 * further, and an answer or a clear only opens), so a thread remembers
 * it per record under the sgen it saw it with and the segment's seed,
 * which tells two segments apart.  Only quiet is remembered: a held scope
 * opens with time alone.  A wrong memory (sgen is shared memory, I8)
 * only skips the scopes for an admission, as if they had no record.
 * Rejected: a flag in the record (one more shared word to validate, and
 * to clear on every change of every scope above it). */
#define QUIET_WAYS 8 /* a direct-mapped memory, by record index */
#define QUIET_SHIFT 28  /* the bits above the record index (< 2^20) */
/* 16 bytes a way: the library's thread-local state must fit glibc's
 * static TLS surplus when it is dlopen'ed (internal.h). */
static THROTTLE__TLS struct quiet {
  uint64_t seed;
  uint32_t gen;  /* hdr->sgen when seen */
  uint32_t what; /* record index | bits << QUIET_SHIFT; 0 bits: nothing */
} quiet_seen[QUIET_WAYS];
_Static_assert(THROTTLE__MAX_CAPACITY <= 1u << QUIET_SHIFT,
               "a record index fits below the quiet bits");

__attribute__((noinline)) static unsigned
quiet_look(throttle_t *h, const struct throttle__rec *r, uint64_t now) {
  unsigned bits = THROTTLE__QUIET | THROTTLE__QUIET_ABSENT | THROTTLE__QUIET_ALL;
  size_t len = klen(r);
  bool first = true;
  for (size_t p = 0; (p = throttle__scope_next(r->key, len, p)) != 0; p++) {
    struct throttle__rec *s = scope_rec(h, r->key, p);
    bool was_first = first;
    first = false;
    if (s == NULL) {
      bits &= ~(unsigned)THROTTLE__QUIET_ALL;
      continue;
    }
    bits &= ~(unsigned)THROTTLE__QUIET_ABSENT;
    if (was_first)
      bits |= THROTTLE__QUIET_ROOT;
    uint16_t f = __atomic_load_n(&s->flags, __ATOMIC_RELAXED);
    if ((f & (THROTTLE__REC_EPISODE | THROTTLE__REC_PAUSED |
              THROTTLE__REC_ANSWERED)) != THROTTLE__REC_ANSWERED ||
        s->probe_ticket != 0 || is_pool(s) ||
        throttle__clamp_nb_locked(h, s, now) > now)
      return 0;
  }
  return bits;
}

unsigned throttle__scopes_quiet_bits(throttle_t *h,
                                     const struct throttle__rec *r,
                                     uint64_t now) {
  uint32_t idx = (uint32_t)(r - h->recs);
  uint32_t gen = atomic_load_explicit(&h->hdr->sgen, memory_order_relaxed);
  struct quiet *m = &quiet_seen[idx % QUIET_WAYS];
  uint32_t bits = m->what >> QUIET_SHIFT;
  if (bits != 0 && m->gen == gen &&
      (m->what & ((1u << QUIET_SHIFT) - 1)) == idx && m->seed == h->seed)
    return bits;
  bits = quiet_look(h, r, now);
  if (bits != 0)
    *m = (struct quiet){.seed = h->seed,
                        .gen = gen,
                        .what = idx | bits << QUIET_SHIFT};
  return bits;
}

/* ---- a cold scope ------------------------------------------------------ */

void throttle__scope_enter_locked(throttle_t *h, const char *key, size_t len,
                                  uint64_t now) {
  static const throttle_outcome_t scoped[] = {THROTTLE_OUTCOME_RATE_LIMITED,
                                              THROTTLE_OUTCOME_UNAVAILABLE};
  uint32_t done = (uint32_t)len;
  for (size_t i = 0; i < sizeof scoped / sizeof scoped[0]; i++) {
    uint32_t p = throttle__publish_len(h, key, len, scoped[i]);
    if (p >= len || p == done)
      continue; /* published on the key: today's per-key behaviour */
    done = p;
    struct throttle__rec *s = scope_rec(h, key, p);
    if (s != NULL && (s->flags & (THROTTLE__REC_ANSWERED |
                                  THROTTLE__REC_EPISODE)))
      continue; /* known, or its one probe is already the rule */
    /* Only into a free record, and only with room left for the key's own:
     * evicting a key for a scope could take the key this admission is
     * for, and a scope in its episode is not evicted for the key either
     * (fail open: the keys go as before). */
    if (s == NULL &&
        (h->hdr->used + (scope_rec(h, key, len) == NULL ? 2u : 1u) >
             h->capacity ||
         throttle__insert_locked(h, key, p, throttle__hash(h->seed, key, p),
                                 now, &s) != 0))
      continue;
    /* An episode with no not-before: the gate sends one probe beneath */
    throttle__rec_flags(s, THROTTLE__REC_EPISODE, true);
    throttle__scope_touch(h);
  }
}

uint32_t throttle__scope_below_key_locked(throttle_t *h, const char *key,
                                          size_t len, bool cancel) {
  uint32_t n = 0;
  if (len == 0 || len > THROTTLE__KEY_MAX)
    return 0;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (!below(r, key, len))
      continue;
    if (cancel)
      throttle__cancel_locked(r);
    throttle__wake_rec(r);
    n++;
  }
  return n;
}

void throttle__scope_below_locked(throttle_t *h, struct throttle__rec *s,
                                  bool cancel) {
  /* s's own key, copied: a record beneath is never s, but its bytes are
   * shared memory and read once (klen) */
  char key[THROTTLE__KEY_MAX + 1];
  size_t len = klen(s);
  memcpy(key, s->key, len);
  (void)throttle__scope_below_key_locked(h, key, len, cancel);
}

uint32_t throttle__publish_len(const throttle_t *h, const char *key,
                               size_t len, throttle_outcome_t outcome) {
  int level;
  unsigned o = (unsigned)outcome;
  if (o < 4 && (h->publish_set & (1u << o)))
    level = h->publish_level[o];
  else
    level = outcome == THROTTLE_OUTCOME_LOCKED ? THROTTLE_LEVEL_KEY
                                               : THROTTLE_LEVEL_ROOT;
  if (level == THROTTLE_LEVEL_KEY)
    return (uint32_t)len;
  /* level n: the prefix of n components; a key with fewer scopes than
   * that publishes on itself, and ROOT on a key without scopes is the key */
  int n = 0;
  for (size_t p = 0; (p = throttle__scope_next(key, len, p)) != 0; p++)
    if (level == THROTTLE_LEVEL_ROOT || ++n == level)
      return (uint32_t)p;
  return (uint32_t)len;
}

int throttle__publish_at_locked(throttle_t *h, const char *key, size_t len,
                                uint32_t plen, uint64_t delay_ns,
                                uint64_t now) {
  struct throttle__rec *s;
  int rc = throttle__insert_locked(h, key, plen,
                                   throttle__hash(h->seed, key, plen), now, &s);
  if (rc != 0 && plen < len &&
      throttle__insert_locked(h, key, len, throttle__hash(h->seed, key, len),
                              now, &s) == 0)
    rc = 0; /* on the key: never early for it, at least */
  if (rc == 0)
    throttle__publish_locked(h, s, now, delay_ns);
  return rc;
}

int throttle__scope_publish_locked(throttle_t *h, const char *key,
                                   size_t len, throttle_outcome_t outcome,
                                   uint64_t delay_ns, uint64_t now) {
  uint32_t plen = throttle__publish_len(h, key, len, outcome);
  return plen < len ? throttle__publish_at_locked(h, key, len, plen,
                                                  delay_ns, now)
                    : 0;
}

THROTTLE_EXTERN int throttle_set_publish_level(throttle_t *h,
                                               throttle_outcome_t outcome,
                                               int level) {
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (outcome != THROTTLE_OUTCOME_LOCKED &&
      outcome != THROTTLE_OUTCOME_RATE_LIMITED &&
      outcome != THROTTLE_OUTCOME_UNAVAILABLE)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "only LOCKED, RATE_LIMITED and UNAVAILABLE publish");
  if (level < THROTTLE_LEVEL_ROOT || level > (int)THROTTLE__KEY_MAX)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "publish level %d: KEY (0), ROOT (-1) or 1..%u",
                          level, THROTTLE__KEY_MAX);
  h->publish_level[outcome] = (int16_t)level;
  h->publish_set |= (uint8_t)(1u << outcome);
  throttle__clear_msg(h);
  return 0;
}
