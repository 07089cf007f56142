/* SPDX-License-Identifier: MIT */
/*
 * gate_info.c — what the gate shows of a key: the admission fields of a
 * snapshot (in flight, cap, waiters, probe, settings, counters) and its
 * holders, read under the mutex by throttle_info() and throttle_foreach()
 * (segment_backoff.c) and handed out with no lock held.
 */
#include "internal.h"

/* A holder or a waiter of this host, as its slot says (probe: the caller's). */
static void party(struct throttle__party *o, const struct throttle__slot *s,
                  bool probe, uint64_t now) {
  o->pid = s->pid;
  o->host[0] = 0; /* this host's */
  o->cls = s->cls;
  o->probe = probe;
  o->age_ms = s->since_ns < now ? (now - s->since_ns) / THROTTLE__NS_PER_MS : 0;
}

void throttle__gate_snapshot(const struct throttle__rec *r, uint64_t now,
                             throttle_info_t *out) {
  int64_t *f = out->field;
  f[THROTTLE_FIELD_IN_FLIGHT] = throttle__count_slots(r, THROTTLE__SLOT_HOLDING, -1);
  f[THROTTLE_FIELD_CAP] = throttle__cap_of(r);
  f[THROTTLE_FIELD_CAP_AUTO] = r->fixed_cap == 0;
  /* Every waiter: those in slots, and those beyond them (counted by
   * class, gate_enter.c; listed below only in slots, where their pid is). */
  uint32_t ovf = throttle__ovf_stale(r, now) ? 0 : r->ovf_waiters;
  uint32_t ovf_bf = r->ovf_bf <= ovf ? r->ovf_bf : ovf;
  f[THROTTLE_FIELD_WAITING_LIVE] =
      (int64_t)throttle__count_slots(r, THROTTLE__SLOT_WAITING,
                                     THROTTLE_CLASS_LIVE) +
      (ovf - ovf_bf);
  f[THROTTLE_FIELD_WAITING_BACKFILL] =
      (int64_t)throttle__count_slots(r, THROTTLE__SLOT_WAITING,
                                     THROTTLE_CLASS_BACKFILL) +
      ovf_bf;
  f[THROTTLE_FIELD_PROBE_OUT] = r->probe_ticket != 0;
  f[THROTTLE_FIELD_LOCK_EPISODE] = (r->flags & THROTTLE__REC_EPISODE) != 0;
  f[THROTTLE_FIELD_PAUSED] = (r->flags & THROTTLE__REC_PAUSED) != 0;
  f[THROTTLE_FIELD_RATE_N] = r->rate_n;
  f[THROTTLE_FIELD_RATE_PERIOD_MS] =
      (int64_t)(r->rate_period_ns / THROTTLE__NS_PER_MS);
  f[THROTTLE_FIELD_BACKFILL_SHARE_PERMILLE] = throttle__share_of(r);
#define CLAMP64(v) ((v) > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)(v))
  f[THROTTLE_FIELD_ADMITTED] = CLAMP64(r->admitted);
  f[THROTTLE_FIELD_LOCKED] = CLAMP64(r->locked);
  f[THROTTLE_FIELD_PROBES] = CLAMP64(r->probes);
  f[THROTTLE_FIELD_RECLAIMS] = CLAMP64(r->reclaims);
  f[THROTTLE_FIELD_CANCELED] = CLAMP64(r->canceled);
  f[THROTTLE_FIELD_PERMANENT] = CLAMP64(r->permanent);
  uint64_t next = throttle__learn_next_raise_ns(r);
  f[THROTTLE_FIELD_CAP_GOOD] = r->auto_good;
  f[THROTTLE_FIELD_CAP_FAIL] = r->auto_fail_cap;
  f[THROTTLE_FIELD_CAP_FAILS] = r->auto_fails;
  f[THROTTLE_FIELD_CAP_MAX] = r->auto_max;
  f[THROTTLE_FIELD_CAP_RETRY_AFTER_MS] = r->auto_ra_ms;
  f[THROTTLE_FIELD_CAP_WORK_MS] = CLAMP64(r->auto_work_ns / THROTTLE__NS_PER_MS);
  f[THROTTLE_FIELD_CAP_NEXT_RAISE_MS] =
      next == UINT64_MAX ? -1 : CLAMP64(next / THROTTLE__NS_PER_MS);
  f[THROTTLE_FIELD_CAP_LEARNED_AGO_MS] =
      r->auto_learned_ns == 0 ? -1
      : r->auto_learned_ns < now
          ? CLAMP64((now - r->auto_learned_ns) / THROTTLE__NS_PER_MS)
          : 0;
#undef CLAMP64
  out->nholders = 0;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    const struct throttle__slot *s = &r->slot[i];
    if (s->state != THROTTLE__SLOT_HOLDING)
      continue;
    party(&out->holder[out->nholders++], s,
          r->probe_ticket != 0 && s->ticket == r->probe_ticket, now);
  }
  /* The waiters in arrival order (their tickets): at most 32, sorted by
   * insertion. */
  uint64_t tickets[THROTTLE__SLOTS] = {0};
  out->nwaiters = 0;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    const struct throttle__slot *s = &r->slot[i];
    if (s->state != THROTTLE__SLOT_WAITING)
      continue;
    uint32_t k = out->nwaiters++;
    while (k > 0 && tickets[k - 1] > s->ticket) {
      tickets[k] = tickets[k - 1];
      out->waiter[k] = out->waiter[k - 1];
      k--;
    }
    tickets[k] = s->ticket;
    party(&out->waiter[k], s, false, now);
  }
  throttle__info_unlisted(out);
}

/* Entry i of a snapshot's holders or waiters, as the public calls hand
 * it out (any out pointer may be NULL). */
static int read_party(const struct throttle__party *v, uint32_t n, size_t i,
                      int64_t *pid, int64_t *age_ms, throttle_class_t *cls) {
  if (i >= n)
    return THROTTLE_ENOKEY;
  if (pid)
    *pid = v[i].pid;
  if (age_ms)
    *age_ms = (int64_t)v[i].age_ms;
  if (cls)
    *cls = (throttle_class_t)v[i].cls;
  return 0;
}

THROTTLE_EXTERN int throttle_info_waiter(const throttle_info_t *info,
                                         size_t i, int64_t *pid,
                                         int64_t *age_ms,
                                         throttle_class_t *cls) {
  if (info == NULL)
    return THROTTLE_EINVAL;
  return read_party(info->waiter, info->nwaiters, i, pid, age_ms, cls);
}

THROTTLE_EXTERN const char *
throttle_info_waiter_host(const throttle_info_t *info, size_t i) {
  if (info == NULL || i >= info->nwaiters)
    return NULL;
  return info->waiter[i].host;
}

THROTTLE_EXTERN const char *
throttle_info_holder_host(const throttle_info_t *info, size_t i) {
  if (info == NULL || i >= info->nholders)
    return NULL;
  return info->holder[i].host;
}

THROTTLE_EXTERN int throttle_info_holder(const throttle_info_t *info,
                                         size_t i, int64_t *pid,
                                         int64_t *age_ms,
                                         throttle_class_t *cls, int *probe) {
  if (info == NULL)
    return THROTTLE_EINVAL;
  int rc = read_party(info->holder, info->nholders, i, pid, age_ms, cls);
  if (rc == 0 && probe)
    *probe = info->holder[i].probe;
  return rc;
}
