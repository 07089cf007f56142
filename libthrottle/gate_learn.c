/*
 * gate_learn.c — the learned ("auto") cap of a key: how many admissions
 * at once the server takes, learned from the outcomes reported on leave.
 *
 * The cap starts at 1 and, until a lock signal is seen, grows by one per
 * success (slow start: the first contact with a locked table costs one
 * refused request, not one per process).  A LOCKED answer while other
 * holders were in flight halves it (floor 1) and remembers that point;
 * past it the cap grows by one only after 64 * cap successes, and that
 * interval doubles with each raise that fails again, so probing for more
 * room costs a refused request (and one back-off) every few hundred
 * successes at most.  A fixed cap (throttle_set_max_parallel) turns it off.
 */
#include "internal.h"

void throttle__learn_locked(struct throttle__rec *r, throttle_outcome_t outcome,
                            uint32_t others, uint32_t concurrent) {
  if (r->fixed_cap != 0)
    return;
  if (r->auto_cap < 1 || r->auto_cap > THROTTLE__SLOTS)
    r->auto_cap = 1;
  if (r->auto_fails >
      THROTTLE__MAX_AUTO_FAILS) /* shared memory: a shift count below */
    r->auto_fails = THROTTLE__MAX_AUTO_FAILS;
  if (outcome == THROTTLE_OUTCOME_OK) {
    /* Only a success at the cap says anything about a larger one: a fleet
     * that never fills its cap must not grow it without bound. */
    if (concurrent < r->auto_cap)
      return;
    if (r->auto_cap > r->auto_ssthresh)
      r->auto_fails = 0; /* the raised cap has been used without a refusal */
    r->auto_oks++;
    uint64_t need =
        r->auto_ssthresh == 0 ? 1 : (uint64_t)64 * r->auto_cap << r->auto_fails;
    if (r->auto_oks >= need && r->auto_cap < THROTTLE__SLOTS) {
      r->auto_cap++;
      r->auto_oks = 0;
    }
  } else if (outcome == THROTTLE_OUTCOME_LOCKED && others > 0) {
    /* Our own fleet holds the lock: too many at once. */
    if (r->auto_ssthresh != 0 && r->auto_cap > r->auto_ssthresh &&
        r->auto_fails < THROTTLE__MAX_AUTO_FAILS)
      r->auto_fails++;
    r->auto_cap = r->auto_cap / 2 > 1 ? r->auto_cap / 2 : 1;
    r->auto_ssthresh = r->auto_cap;
    r->auto_oks = 0;
  }
}
