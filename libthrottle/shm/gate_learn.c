/* SPDX-License-Identifier: MIT */
/*
 * gate_learn.c — the learned ("auto") cap of a key: how many admissions
 * at once the server takes, learned from the outcomes reported on leave.
 * The design, with the figures behind it, is docs/LEARNED-CAP.md.
 *
 * The rules (all under the mutex, in the report of a leave, only while no
 * fixed cap is set; k = the admissions of the key in flight besides this
 * one when it was granted, or when it reports if more: an admission
 * granted after this one may reach the server first, and then it is the
 * one the server admitted.  Either way k < the cap, so a refusal with
 * others in flight always lowers it):
 *
 * 1. LOCKED with k >= 1: the server admitted k at once and refused the
 *    next, a hard limit, not congestion: the cap becomes k (floor 1), not
 *    k / 2 (halving is for a shared path whose capacity moves; a table's
 *    write concurrency does not move between two requests).  The refusal's
 *    Retry-After R is kept with it.  A refusal while the cap was above the
 *    known-good level is a failed raise: counted (the doubling below) and
 *    the refused cap remembered; later refusals of the same burst only
 *    lower the cap further.
 * 2. LOCKED with k = 0: somebody else's lock (an external hold, another
 *    host): nothing is learned.
 * 3. OK granted at the cap: its hold time / cap is added to the work done
 *    at the cap (at full occupancy that sums to the key's busy time).  A
 *    raised cap used in full this way becomes the known-good cap.
 * 4. Raise, after rule 3: before any refusal (slow start) at once, by one;
 *    after one, only when the work since then reaches 20 x R x 2^fails.
 *    A failed raise idles the whole key for R (I1: never early), so this
 *    keeps the time lost to exploring under about 5 % of the busy time, and
 *    a large R keeps the learner at its known-good cap far longer.
 * 5. Other outcomes say nothing of the table's write concurrency (a 429 or
 *    503 is the workspace's signal): no change.
 *
 * Cold start.  Before the first refusal nothing tells a serialised table
 * from a parallel one, and R is unknown.  Slow start explores at once:
 * a table that admits 4 is found in well under a second, at the price of
 * one R on a serialised table (a 5 s Retry-After costs a short fleet 5 s
 * the first time).  Rejected: pricing slow start with a prior R (it keeps
 * a parallel table at cap 1 for 20 R of work).  The price is paid once per
 * key: the learned state lives in the segment, so later fleets start warm.
 *
 * Bounds.  `auto:MAX` (auto_max) bounds slow start and raises; a fixed cap
 * (throttle_set_max_parallel) turns the learner off and keeps what it
 * learned for a return to auto.  Every field is bounded before use (I8):
 * R against the 7-day ceiling, so 20 x R x 2^10 ns fits 64 bits.
 */
#include "internal.h"

#define NEED_FACTOR 20u /* work per R before a raise: ~5 % spent exploring */

uint32_t throttle__learn_bound(const struct throttle__rec *r) {
  return r->auto_max >= 1 && r->auto_max <= THROTTLE__SLOTS ? r->auto_max
                                                            : THROTTLE__SLOTS;
}

void throttle__learn_bound_locked(struct throttle__rec *r, uint64_t now) {
  if (r->auto_max > THROTTLE__SLOTS)
    r->auto_max = 0;
  uint32_t bound = throttle__learn_bound(r);
  if (r->auto_cap < 1 || r->auto_cap > THROTTLE__SLOTS)
    r->auto_cap = 1;
  if (r->auto_cap > bound) /* a bound set after the cap was learned */
    r->auto_cap = bound;
  if (r->auto_good > THROTTLE__SLOTS)
    r->auto_good = 0;
  if (r->auto_good > bound)
    r->auto_good = bound;
  if (r->auto_fail_cap > THROTTLE__SLOTS)
    r->auto_fail_cap = 0;
  if (r->auto_fails > THROTTLE__MAX_AUTO_FAILS) /* a shift count below */
    r->auto_fails = THROTTLE__MAX_AUTO_FAILS;
  if (r->auto_ra_ms > THROTTLE__MAX_MAX_DELAY_MS)
    r->auto_ra_ms = (uint32_t)THROTTLE__MAX_MAX_DELAY_MS;
  if (r->auto_learned_ns > now)
    r->auto_learned_ns = now;
}

/* 20 x R x 2^fails, in ns.  Bounded here too: a snapshot reads the
 * record without repairing it. */
static uint64_t need_ns(const struct throttle__rec *r) {
  uint64_t ra = r->auto_ra_ms < THROTTLE__MAX_MAX_DELAY_MS
                    ? r->auto_ra_ms
                    : THROTTLE__MAX_MAX_DELAY_MS;
  uint32_t fails = r->auto_fails < THROTTLE__MAX_AUTO_FAILS
                       ? r->auto_fails
                       : THROTTLE__MAX_AUTO_FAILS;
  return (uint64_t)NEED_FACTOR * ra * THROTTLE__NS_PER_MS << fails;
}

uint64_t throttle__learn_next_raise_ns(const struct throttle__rec *r) {
  if (r->fixed_cap != 0 || r->auto_cap >= throttle__learn_bound(r))
    return UINT64_MAX;
  if (r->auto_learned_ns == 0)
    return 0;
  uint64_t need = need_ns(r);
  return r->auto_work_ns >= need ? 0 : need - r->auto_work_ns;
}

static void learn_refusal(struct throttle__rec *r,
                          const struct throttle__learn_in *in, uint32_t k,
                          uint32_t bound) {
  uint32_t to = k < bound ? k : bound;
  if (r->auto_cap > r->auto_good) { /* a raise (or slow start) refused */
    r->auto_fail_cap = r->auto_cap;
    if (r->auto_fails < THROTTLE__MAX_AUTO_FAILS)
      r->auto_fails++;
  } else if (to > r->auto_cap) {
    to = r->auto_cap; /* the same burst: a refusal only ever lowers it */
  }
  r->auto_cap = to;
  r->auto_good = to;
  uint64_t ra = in->retry_after_ms ? in->retry_after_ms : 5000;
  uint64_t max = in->max_delay_ms < THROTTLE__MAX_MAX_DELAY_MS
                     ? in->max_delay_ms
                     : THROTTLE__MAX_MAX_DELAY_MS;
  r->auto_ra_ms = (uint32_t)(ra < max ? ra : max);
  r->auto_work_ns = 0;
  r->auto_learned_ns = in->now ? in->now : 1;
}

void throttle__learn_locked(struct throttle__rec *r,
                            const struct throttle__learn_in *in) {
  throttle__learn_bound_locked(r, in->now);
  if (r->fixed_cap != 0)
    return;
  uint32_t bound = throttle__learn_bound(r);
  uint32_t k = in->concurrent > 0 ? in->concurrent - 1 : 0;
  if (in->others > k && in->others < THROTTLE__SLOTS)
    k = in->others;
  if (in->outcome == THROTTLE_OUTCOME_LOCKED) {
    if (k >= 1)
      learn_refusal(r, in, k, bound);
    return;
  }
  /* Only a success at the cap says anything about a larger one: a fleet
   * that never fills its cap must not grow it without bound. */
  if (in->outcome != THROTTLE_OUTCOME_OK || in->concurrent < r->auto_cap)
    return;
  r->auto_work_ns =
      throttle__sat_add(r->auto_work_ns, in->hold_ns / r->auto_cap);
  if (r->auto_cap > r->auto_good) { /* the raised cap held: price from here */
    r->auto_good = r->auto_cap;
    r->auto_fails = 0;
    r->auto_work_ns = 0;
  }
  if (r->auto_cap >= bound)
    return;
  if (r->auto_learned_ns == 0)
    r->auto_cap++;
  else if (r->auto_work_ns >= need_ns(r))
    r->auto_cap = r->auto_good + 1;
}

/* ---- a new key's learned cap ------------------------------------------ */

/* A key new to a scope starts from what its siblings learned: the learned
 * state of the key beneath the same scope whose cap a refusal set last, so
 * a new table of a workspace does not explore from 1 what the others
 * found.  From then on it learns alone (a table's lock is the table's).
 * Rejected: the siblings' largest cap (one parallel table would send a
 * serialised one into refusals); seeding at every admission (a key that
 * has learned must not be overwritten by a sibling). */
void throttle__scope_seed_locked(throttle_t *h, struct throttle__rec *r,
                                 uint64_t now) {
  const char *slash = memrchr(r->key, '/', throttle__rec_klen(r));
  if (slash == NULL || slash == r->key)
    return;
  size_t plen = (size_t)(slash - r->key);
  const struct throttle__rec *best = NULL;
  for (uint32_t i = 0; i < h->capacity; i++) {
    const struct throttle__rec *o = &h->recs[i];
    if (o != r && o->auto_learned_ns != 0 &&
        throttle__rec_below(o, r->key, plen) &&
        (best == NULL || o->auto_learned_ns > best->auto_learned_ns))
      best = o;
  }
  if (best == NULL)
    return;
  r->auto_cap = best->auto_cap;
  r->auto_good = best->auto_good;
  r->auto_fail_cap = best->auto_fail_cap;
  r->auto_ra_ms = best->auto_ra_ms;
  r->auto_learned_ns = now; /* its own work at the cap counts from now */
  throttle__learn_bound_locked(r, now); /* shared memory is input */
}
