/* SPDX-License-Identifier: MIT */
/*
 * gate_grant.c — the grant, under the mutex: it turns the oldest eligible
 * waiters of a key into holders, as its cap, rate, pause, probe and scopes
 * allow (gate_enter.c has the why of the whole gate: slots, tickets, waking, the
 * learned cap; gate_rec.c the helpers on a record it uses).
 *
 * The grant reads a key's 32 slots once into masks (struct
 * throttle__roster) and keeps them in step with its own grants; callers
 * that just read them pass theirs.  It skips scope.c while this thread
 * knows that no scope of the key can hold, pool or probe it
 * (throttle__scopes_quiet, scope.c).
 * Rejected: occupancy masks kept in the record (a derived word that a
 * crash or a writer outside the library makes disagree with the slots,
 * hiding a holder from the cap).
 */
#include "internal.h"

/* The oldest slot among mask (lowest ticket, then lowest index), or NULL. */
static struct throttle__slot *oldest(struct throttle__rec *r, uint32_t mask) {
  struct throttle__slot *best = NULL;
  for (; mask != 0; mask &= mask - 1) {
    struct throttle__slot *s = &r->slot[__builtin_ctz(mask)];
    if (best == NULL || s->ticket < best->ticket)
      best = s;
  }
  return best;
}

/* Grant as many waiters as the gate allows now, oldest first, live before
 * backfill.  *next is set to the next instant at which time alone could
 * open the gate (UINT64_MAX if none).  pre: the caller's roster of r, read
 * under this mutex hold and kept in step since (used and changed in place:
 * a copy of what was just stored field by field stalls the load), or NULL
 * to read one. */
void throttle__grant_locked(throttle_t *h, struct throttle__rec *r,
                            uint64_t now, struct throttle__wake *w,
                            uint64_t *next, struct throttle__roster *pre) {
  *next = UINT64_MAX;
  struct throttle__roster own;
  if (pre == NULL)
    throttle__roster_read(r, &own);
  struct throttle__roster *ro = pre != NULL ? pre : &own;
  if (r->probe_ticket != 0 && !ro->probe_held)
    __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELEASE);
  if ((ro->wait[THROTTLE_CLASS_LIVE] | ro->wait[THROTTLE_CLASS_BACKFILL]) == 0)
    return; /* nobody to grant: the leave of the only holder stops here */
  if (r->flags & THROTTLE__REC_PAUSED)
    return;
  uint64_t nb = throttle__clamp_nb_locked(h, r, now);
  if (nb > now) {
    *next = nb;
    return;
  }
  bool scoped = !throttle__scopes_quiet(h, r, now);
  int scope = scoped ? throttle__scope_gate_locked(h, r, now, next)
                     : THROTTLE__SCOPE_OPEN;
  if (scope == THROTTLE__SCOPE_HELD)
    return;
  throttle__bound_rate(h, r, now);
  uint32_t cap = throttle__cap_of(r);
  uint32_t holders = throttle__bits(ro->hold);
  uint32_t bf_holders = throttle__bits(ro->hold_bf);
  uint32_t bf_cap = throttle__backfill_cap(r, cap);
  while (holders < cap) {
    if ((r->flags & THROTTLE__REC_EPISODE) && r->probe_ticket != 0)
      return; /* the probe is out: everyone else waits for its answer */
    struct throttle__slot *s = oldest(r, ro->wait[THROTTLE_CLASS_LIVE]);
    if (s == NULL && bf_holders < bf_cap)
      s = oldest(r, ro->wait[THROTTLE_CLASS_BACKFILL]);
    if (s == NULL ||
        (scoped && !throttle__scope_pool_allows_locked(h, r, s, now, next)))
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
    s->since_mono_ns = throttle__mono_at(now);
    s->state = THROTTLE__SLOT_HOLDING;
    THROTTLE__CRASHPOINT("gate-mid-grant"); /* holder, not yet woken */
    throttle__roster_set(ro, (uint32_t)(s - r->slot), THROTTLE__SLOT_HOLDING,
                         s->cls);
    holders++;
    s->concurrent = (uint8_t)holders;
    if (s->cls == THROTTLE_CLASS_BACKFILL)
      bf_holders++;
    s->probe = 0;
    throttle__sat_inc(&r->admitted);
    if (r->flags & THROTTLE__REC_EPISODE) {
      s->probe = 1;
      __atomic_store_n(&r->probe_ticket, s->ticket, __ATOMIC_RELEASE);
      throttle__scope_touch(h); /* r may be a scope: its keys are held */
      throttle__sat_inc(&r->probes);
    }
    throttle__slot_bump(s);
    /* Decided under the mutex, after the bump: a waiter counts itself in
     * sleepers under the mutex before it unlocks to sleep, so either it is
     * counted here or it read the bumped word (and will not sleep on the
     * old one).  An uncontended grant of the caller's own slot wakes
     * nobody: no system call. */
    if (w != NULL && w->n < THROTTLE__SLOTS &&
        atomic_load_explicit(&r->sleepers, memory_order_acquire) != 0)
      w->slot[w->n++] = s;
    if (scoped)
      throttle__scope_take_locked(h, r, s, scope == THROTTLE__SCOPE_PROBE);
    if (scope == THROTTLE__SCOPE_PROBE)
      return; /* alone until the scope's answer */
  }
}
