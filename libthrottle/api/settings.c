/* SPDX-License-Identifier: MIT */
/*
 * settings.c — per-key settings an operator or a program makes, kept in the
 * segment so every process obeys them: the cap, the rate, the backfill
 * share, pause/resume, and cancel.  Each change wakes the key's waiters so
 * they look at the gate again (gate.c).
 */
#include "backend.h"

/* Find or create key, apply fn under the mutex, then let waiters re-check. */
static int with_key(throttle_t *h, const char *key, bool create,
                    void (*fn)(struct throttle__rec *, const void *),
                    const void *arg, bool cancel_below) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "change a key's settings");
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
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

/* Both cap setters: n at most THROTTLE__SLOTS, then fn under the mutex. */
static int set_cap_checked(throttle_t *h, const char *key, uint32_t n,
                           const char *what,
                           void (*fn)(struct throttle__rec *, const void *)) {
  if (n > THROTTLE__SLOTS)
    return h ? throttle__fail(h, THROTTLE_EINVAL, "max parallel %s%u: at most %u",
                              what, n, THROTTLE__SLOTS)
             : THROTTLE_EINVAL;
  THROTTLE__BE_TRY(h, throttle__be_set(h, key,
                                        fn == set_cap ? THROTTLE__BE_CAP
                                                      : THROTTLE__BE_CAP_AUTO,
                                        n, 0));
  return with_key(h, key, true, fn, &n, false);
}

THROTTLE_EXTERN int throttle_set_max_parallel_auto(throttle_t *h,
                                                   const char *key,
                                                   uint32_t max) {
  return set_cap_checked(h, key, max, "auto:", set_auto_max);
}

THROTTLE_EXTERN int throttle_set_max_parallel(throttle_t *h, const char *key,
                                              uint32_t n) {
  return set_cap_checked(h, key, n, "", set_cap);
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

THROTTLE_EXTERN int throttle_set_rate(throttle_t *h, const char *key,
                                      uint32_t n, uint64_t period_ms) {
  if (n != 0 && (period_ms == 0 || period_ms > UINT64_C(86400000) * 366))
    return h ? throttle__fail(h, THROTTLE_EINVAL,
                              "rate period must be 1 ms to a year")
             : THROTTLE_EINVAL;
  THROTTLE__BE_TRY(h, throttle__be_set(h, key, THROTTLE__BE_RATE, n, period_ms));
  struct rate_arg a = {n, period_ms * THROTTLE__NS_PER_MS};
  return with_key(h, key, true, set_rate, &a, false);
}

static void set_share(struct throttle__rec *r, const void *arg) {
  r->share_permille = *(const uint32_t *)arg;
  throttle__rec_flags(r, THROTTLE__REC_SHARE_SET, true);
}

THROTTLE_EXTERN int throttle_set_backfill_share(throttle_t *h,
                                                const char *key,
                                                double share) {
  if (!(share >= 0.0 && share <= 1.0))
    return h ? throttle__fail(h, THROTTLE_EINVAL,
                              "backfill share must be within 0 and 1")
             : THROTTLE_EINVAL;
  uint32_t permille = (uint32_t)(share * 1000.0 + 0.5);
  THROTTLE__BE_TRY(h, throttle__be_set(h, key, THROTTLE__BE_SHARE, permille, 0));
  return with_key(h, key, true, set_share, &permille, false);
}

static void set_paused(struct throttle__rec *r, const void *arg) {
  if (*(const int *)arg)
    throttle__rec_flags(r, THROTTLE__REC_PAUSED, true);
  else
    throttle__rec_flags(r, THROTTLE__REC_PAUSED, false);
}

THROTTLE_EXTERN int throttle_pause(throttle_t *h, const char *key) {
  int on = 1;
  THROTTLE__BE_TRY(h, throttle__be_set(h, key, THROTTLE__BE_PAUSE, 0, 0));
  return with_key(h, key, true, set_paused, &on, false);
}

THROTTLE_EXTERN int throttle_resume(throttle_t *h, const char *key) {
  int on = 0;
  THROTTLE__BE_TRY(h, throttle__be_set(h, key, THROTTLE__BE_RESUME, 0, 0));
  return with_key(h, key, false, set_paused, &on, false);
}

static void do_cancel(struct throttle__rec *r, const void *arg) {
  (void)arg;
  throttle__cancel_locked(r);
}

THROTTLE_EXTERN int throttle_cancel(throttle_t *h, const char *key) {
  if (h != NULL && h->be != NULL && h->ro_src == NULL) {
    /* Across hosts, and this host's own waiters in the segment too (queued
     * there while the backend was away): a cancel ends every current
     * waiter wherever it waits. */
    int brc = throttle__be_set(h, key, THROTTLE__BE_CANCEL, 0, 0);
    if (brc != THROTTLE__BE_DOWN) {
      if (brc == 0 || brc == THROTTLE_ENOKEY) {
        int rc = with_key(h, key, false, do_cancel, NULL, true);
        if (brc == 0 || rc == 0) {
          throttle__clear_msg(h);
          return 0;
        }
      }
      return brc;
    }
  }
  return with_key(h, key, false, do_cancel, NULL, true);
}


/* ---- segment-wide settings ---------------------------------------------- */

THROTTLE_EXTERN int throttle_set_segment_max_delay(throttle_t *h,
                                                   uint64_t ms) {
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "change the segment's maximum delay");
  if (ms == 0 || ms > THROTTLE__MAX_MAX_DELAY_MS)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "maximum delay %llu ms: must be 1 ms to 7 days",
                          (unsigned long long)ms);
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

THROTTLE_EXTERN int throttle_segment_max_delay(throttle_t *h, uint64_t *ms) {
  if (h == NULL || ms == NULL)
    return THROTTLE_EINVAL;
  *ms = throttle__seg_max_ns(h) / THROTTLE__NS_PER_MS;
  return 0;
}
