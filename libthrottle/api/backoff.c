/* SPDX-License-Identifier: MIT */
/*
 * backoff.c — the public calls of the per-key not-before: publish, peek,
 * wait, clear, reset, and the snapshots that throttlectl prints.
 *
 * Each checks its arguments, refuses a write on a read-only handle, and
 * hands the call to the handle's backend (h->ops, chosen at open: the
 * host's segment, shm/segment_backoff.c, or a backend across hosts in
 * front of it, backend.c).  The one exception is the hot path: when the
 * segment serves alone, remaining and wait first try the segment's
 * lock-free open-key check, inlined (shm/segment_fast.h).
 */
#include "backend.h"
#include "shm/segment_fast.h"

THROTTLE_EXTERN int throttle_backoff(throttle_t *h, const char *key,
                                     uint64_t delay_ms) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "publish a back-off");
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  return h->ops->backoff(h, key, len, delay_ms);
}

THROTTLE_EXTERN int throttle_remaining(throttle_t *h, const char *key,
                                       uint64_t *ms) {
  size_t len;
  if (h == NULL || ms == NULL)
    return THROTTLE_EINVAL;
  int rc = throttle__key_len(h, key, &len);
  if (rc != 0)
    return rc;
  /* the hot path, inlined: the segment alone, a key this thread knows */
  if (h->be == NULL && throttle__seg_remaining_guessed(h, key, len, ms))
    return 0;
  return h->ops->remaining(h, key, len, ms);
}

THROTTLE_EXTERN int throttle_wait(throttle_t *h, const char *key,
                                  uint64_t timeout_ms) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  int rc = throttle__key_len(h, key, &len);
  if (rc != 0)
    return rc;
  if (h->be == NULL && throttle__seg_wait_guessed(h, key, len))
    return 0; /* the hot path, inlined (as above) */
  return h->ops->wait(h, key, len, timeout_ms);
}

THROTTLE_EXTERN int throttle_clear(throttle_t *h, const char *key) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "clear a back-off");
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  return h->ops->clear(h, key, len);
}

THROTTLE_EXTERN int throttle_reset(throttle_t *h) {
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "reset the back-offs");
  return h->ops->reset(h);
}

THROTTLE_EXTERN const char *throttle_field_name(throttle_field_t f) {
  switch (f) {
#define XX(name, json, desc)                                                   \
  case THROTTLE_FIELD_##name:                                                  \
    return json;
    THROTTLE_FIELD_MAP(XX)
#undef XX
  default:
    return NULL;
  }
}

THROTTLE_EXTERN const char *throttle_info_key(const throttle_info_t *info) {
  return info != NULL ? info->key : "";
}

THROTTLE_EXTERN int64_t throttle_info_get(const throttle_info_t *info,
                                          throttle_field_t f) {
  if (info == NULL || (int)f < 0 || f >= THROTTLE_FIELD_COUNT_)
    return 0;
  return info->field[f];
}

THROTTLE_EXTERN void throttle_info_free(throttle_info_t *info) {
  throttle__free(info);
}

THROTTLE_EXTERN int throttle_info(throttle_t *h, const char *key,
                                  throttle_info_t **out) {
  size_t len;
  if (h == NULL || out == NULL)
    return THROTTLE_EINVAL;
  *out = NULL;
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  return h->ops->info(h, key, len, out);
}

THROTTLE_EXTERN int throttle_foreach(throttle_t *h,
                                     int (*fn)(const throttle_info_t *, void *),
                                     void *arg) {
  if (h == NULL || fn == NULL)
    return THROTTLE_EINVAL;
  return h->ops->foreach(h, fn, arg);
}

THROTTLE_EXTERN int throttle_stats(throttle_t *h, uint32_t *capacity,
                                   uint32_t *used, uint64_t *evictions,
                                   uint64_t *repairs) {
  if (h == NULL)
    return THROTTLE_EINVAL;
  return h->ops->stats(h, capacity, used, evictions, repairs);
}
