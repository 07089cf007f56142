/* SPDX-License-Identifier: MIT */
/*
 * settings.c — the public calls of the per-key settings (the cap, the
 * rate, the backfill share, pause/resume, cancel) and of the segment's
 * maximum delay.  Each checks its arguments, refuses a change on a
 * read-only handle, and hands the call to the handle's backend (h->ops,
 * backend.h): shm/segment_settings.c keeps them in the segment, a backend
 * across hosts in front of it is backend.c.
 */
#include "backend.h"

/* A setting of key: what is a THROTTLE__BE_* kind (backend.h). */
static int set_key(throttle_t *h, const char *key, int what, uint64_t a,
                   uint64_t b) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "change a key's settings");
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  return h->ops->set(h, key, len, what, a, b);
}

/* Both cap setters: n at most THROTTLE__SLOTS. */
static int set_cap_checked(throttle_t *h, const char *key, uint32_t n,
                           const char *what, int kind) {
  if (n > THROTTLE__SLOTS)
    return h ? throttle__fail(h, THROTTLE_EINVAL, "max parallel %s%u: at most %u",
                              what, n, THROTTLE__SLOTS)
             : THROTTLE_EINVAL;
  return set_key(h, key, kind, n, 0);
}

THROTTLE_EXTERN int throttle_set_max_parallel_auto(throttle_t *h,
                                                   const char *key,
                                                   uint32_t max) {
  return set_cap_checked(h, key, max, "auto:", THROTTLE__BE_CAP_AUTO);
}

THROTTLE_EXTERN int throttle_set_max_parallel(throttle_t *h, const char *key,
                                              uint32_t n) {
  return set_cap_checked(h, key, n, "", THROTTLE__BE_CAP);
}

THROTTLE_EXTERN int throttle_set_rate(throttle_t *h, const char *key,
                                      uint32_t n, uint64_t period_ms) {
  if (n != 0 && (period_ms == 0 || period_ms > UINT64_C(86400000) * 366))
    return h ? throttle__fail(h, THROTTLE_EINVAL,
                              "rate period must be 1 ms to a year")
             : THROTTLE_EINVAL;
  return set_key(h, key, THROTTLE__BE_RATE, n, period_ms);
}

THROTTLE_EXTERN int throttle_set_backfill_share(throttle_t *h,
                                                const char *key,
                                                double share) {
  if (!(share >= 0.0 && share <= 1.0))
    return h ? throttle__fail(h, THROTTLE_EINVAL,
                              "backfill share must be within 0 and 1")
             : THROTTLE_EINVAL;
  uint32_t permille = (uint32_t)(share * 1000.0 + 0.5);
  return set_key(h, key, THROTTLE__BE_SHARE, permille, 0);
}

THROTTLE_EXTERN int throttle_pause(throttle_t *h, const char *key) {
  return set_key(h, key, THROTTLE__BE_PAUSE, 0, 0);
}

THROTTLE_EXTERN int throttle_resume(throttle_t *h, const char *key) {
  return set_key(h, key, THROTTLE__BE_RESUME, 0, 0);
}

THROTTLE_EXTERN int throttle_cancel(throttle_t *h, const char *key) {
  return set_key(h, key, THROTTLE__BE_CANCEL, 0, 0);
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
  return h->ops->set_max_delay(h, ms);
}

THROTTLE_EXTERN int throttle_segment_max_delay(throttle_t *h, uint64_t *ms) {
  if (h == NULL || ms == NULL)
    return THROTTLE_EINVAL;
  *ms = throttle__seg_max_ns(h) / THROTTLE__NS_PER_MS;
  return 0;
}
