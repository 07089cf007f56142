/* SPDX-License-Identifier: MIT */
/*
 * segment_settings.c — the segment backend's half of the settings
 * (throttle__segment_ops set, set_max_delay, note_refusal; the public
 * calls are api/settings.c and api/refusal.c): per-key settings an operator or a program makes, kept
 * in the segment so every process obeys them: the cap, the rate, the
 * backfill share, pause/resume, and cancel.  Each change wakes the key's
 * waiters so they look at the gate again (gate_enter.c).
 */
#include "backend.h"

#include <string.h>

/* Find or create key, apply fn under the mutex, then let waiters re-check. */
static int with_key(throttle_t *h, const char *key, size_t len, bool create,
                    void (*fn)(struct throttle__rec *, const void *),
                    const void *arg, bool cancel_below) {
  int rc;
  uint64_t hash = throttle__hash(h->seed, key, len);
  if ((rc = throttle__lock(h)) != 0)
    return rc;
  uint64_t now = throttle__now_ns();
  struct throttle__rec *r = NULL;
  if (create)
    rc = throttle__insert_locked(h, key, len, hash, now, &r);
  else if ((r = throttle__find_locked(h, key, len, hash)) == NULL &&
           throttle__scope_below_key_locked(h, key, len, cancel_below) == 0)
    rc = throttle__fail(h, THROTTLE_ENOKEY, "%s: no such key", key);
  /* else a scope without a record of its own (its keys publish on
   * themselves): nothing of its own to change, and the command reached
   * every key beneath it (woken, canceled) */
  if (rc == 0 && r != NULL) {
    fn(r, arg);
    r->last_use_ns = now;
    throttle__scope_pool_set_locked(h, r); /* a pool counts what is in
                                              flight beneath it */
    /* Wake under the lock: once it is released the record may be evicted
     * and its slots rewritten. */
    throttle__wake_rec(r);
    /* A scope: every key beneath looks again (scope.c), and a cancel
     * reaches their waiters too. */
    throttle__scope_below_locked(h, r, cancel_below);
    throttle__scope_touch(h); /* a pause may hold keys beneath (scope.c) */
  }
  throttle__unlock(h);
  if (rc == 0)
    throttle__clear_msg(h);
  return rc;
}

/* A fixed cap keeps what the learner learned (a return to auto resumes
 * from it); auto (0) also drops a bound set with auto:MAX. */
static void set_cap(struct throttle__rec *r, const void *arg) {
  r->fixed_cap = *(const uint32_t *)arg;
  if (r->fixed_cap == 0)
    r->auto_max = 0;
}

/* Learned, never above max: the cap comes down at once (admissions in
 * flight above it finish; none is granted until the key is under it). */
static void set_auto_max(struct throttle__rec *r, const void *arg) {
  r->fixed_cap = 0;
  r->auto_max = *(const uint32_t *)arg;
  throttle__learn_bound_locked(r, throttle__now_ns());
}

struct rate_arg {
  uint32_t n;
  uint64_t period_ns;
};

static void set_rate(struct throttle__rec *r, const void *arg) {
  const struct rate_arg *a = arg;
  r->rate_n = a->n;
  r->rate_period_ns = a->n ? a->period_ns : 0;
  r->rate_tat_ns = 0;
}

static void set_share(struct throttle__rec *r, const void *arg) {
  r->share_permille = *(const uint32_t *)arg;
  throttle__rec_flags(r, THROTTLE__REC_SHARE_SET, true);
}

static void set_paused(struct throttle__rec *r, const void *arg) {
  if (*(const int *)arg)
    throttle__rec_flags(r, THROTTLE__REC_PAUSED, true);
  else
    throttle__rec_flags(r, THROTTLE__REC_PAUSED, false);
}

static void do_cancel(struct throttle__rec *r, const void *arg) {
  (void)arg;
  throttle__cancel_locked(r);
}

/* what: a THROTTLE__BE_* kind, with a and b as backend.h says. */
int throttle__seg_set(throttle_t *h, const char *key, size_t len, int what,
                      uint64_t a, uint64_t b) {
  uint32_t n = (uint32_t)a;
  int on = what == THROTTLE__BE_PAUSE;
  switch (what) {
  case THROTTLE__BE_CAP:
    return with_key(h, key, len, true, set_cap, &n, false);
  case THROTTLE__BE_CAP_AUTO:
    return with_key(h, key, len, true, set_auto_max, &n, false);
  case THROTTLE__BE_RATE: {
    struct rate_arg r = {n, b * THROTTLE__NS_PER_MS};
    return with_key(h, key, len, true, set_rate, &r, false);
  }
  case THROTTLE__BE_SHARE:
    return with_key(h, key, len, true, set_share, &n, false);
  case THROTTLE__BE_PAUSE:
  case THROTTLE__BE_RESUME:
    return with_key(h, key, len, on, set_paused, &on, false);
  case THROTTLE__BE_CANCEL:
    return with_key(h, key, len, false, do_cancel, NULL, true);
  default:
    return THROTTLE_EINVAL;
  }
}

/* ---- segment-wide settings ---------------------------------------------- */

/* ms: checked by the public call. */
int throttle__seg_set_max_delay(throttle_t *h, uint64_t ms) {
  int rc = throttle__lock(h);
  if (rc != 0)
    return rc;
  /* Not-befores already stored beyond a lowered maximum are pulled in by
   * their next reader (throttle__clamp_nb_locked). */
  atomic_store_explicit(&h->hdr->max_delay_ns, ms * THROTTLE__NS_PER_MS,
                        memory_order_relaxed);
  throttle__unlock(h);
  throttle__clear_msg(h);
  return 0;
}

/* ---- refusals ----------------------------------------------------------- */

/* What the server said, kept in key's record (n is cleaned and stamped by
 * the public call, api/refusal.c). */
int throttle__seg_note_refusal(throttle_t *h, const char *key, size_t len,
                               const struct throttle__refusal *n) {
  uint64_t now;
  struct throttle__rec *r;
  int rc = throttle__lock_record(h, key, len, &now, &r);
  if (rc != 0)
    return rc;
  memcpy(&r->refusal, n, sizeof *n);
  r->last_use_ns = now;
  throttle__unlock(h);
  throttle__clear_msg(h);
  return 0;
}
