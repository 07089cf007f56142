/* SPDX-License-Identifier: MIT */
/*
 * segment_ops.c — the segment's own halves of the calls that more than
 * one entry point shares, and that backend.c heals and falls back with
 * when a backend (Redis) serves: a key's not-before read, its ms left and
 * when it was published, its back-off dropped, its callers counted, a
 * key's record found or made under the mutex, the settings a backend told
 * mirrored into the segment, a record's refusal copied into a snapshot.
 * Below backend.c and the segment's operations (segment_backoff.c,
 * gate_enter.c, segment_settings.c); above the table, the gate's records
 * and the scopes.
 */
#include "backend.h"

/* The key's not-before as a lock-free reader sees it: 0 when the key is
 * absent or open.  Falls back to the mutex when the table keeps changing
 * under it (or a writer left the sequence odd).  *epoch (may be NULL) is the
 * record's futex word, read before the not-before and validated with it:
 * read after the check, both could belong to another key that took over
 * the record meanwhile. */
int throttle__read_nb(throttle_t *h, const char *key, size_t len, uint64_t *nb,
                      struct throttle__rec **rec, uint32_t *epoch) {
  uint32_t e = 0;
  for (int t = 0; t < THROTTLE__NOLOCK_TRIES; t++) {
    uint32_t idx, seq;
    int f = throttle__find_nolock(h, key, len, &idx, &seq, false);
    if (f == 0) {
      *nb = 0;
      *rec = NULL;
      return 0;
    }
    if (f < 0)
      continue;
    struct throttle__rec *r = &h->recs[idx];
    e = atomic_load_explicit(&r->epoch, memory_order_acquire);
    uint64_t v = atomic_load_explicit(&r->not_before, memory_order_acquire);
    if (!throttle__seq_still(h, seq))
      continue;
    /* Further out than the segment's maximum delay: only a writer that
     * ignored the clamp puts it there.  Pull the stored value in under the
     * mutex, or a waiter would sleep one maximum delay after another
     * towards it.  (Beyond this process's own maximum only, it is left
     * alone: the callers honour their own maximum of what they read.) */
    if (v != 0 &&
        v > throttle__sat_add(throttle__now_ns(), throttle__seg_max_ns(h)))
      break;
    *nb = v;
    *rec = r;
    if (epoch != NULL)
      *epoch = e;
    return 0;
  }
  int rc = throttle__lock(h);
  if (rc != 0)
    return rc;
  struct throttle__rec *r =
      throttle__find_locked(h, key, len, throttle__hash(h->seed, key, len));
  if (r != NULL)
    e = atomic_load_explicit(&r->epoch, memory_order_relaxed);
  *nb = r ? throttle__clamp_nb_locked(h, r, throttle__now_ns()) : 0;
  *rec = r;
  if (epoch != NULL)
    *epoch = e;
  throttle__unlock(h);
  return 0;
}

/* ms until the segment's own not-before for key passes (0: open, absent,
 * or unreadable): what this host knows, for a backend that may have lost
 * it (backend.c). */
uint64_t throttle__segment_remaining(throttle_t *h, const char *key) {
  size_t len;
  uint64_t nb;
  struct throttle__rec *r;
  if (throttle__check_key(h, key, &len) != 0 ||
      throttle__read_nb(h, key, len, &nb, &r, NULL) != 0 || nb == 0)
    return 0;
  return throttle__ms_left(h, nb, throttle__now_ns());
}

/* How long ago (ms) the segment's back-off of key was published, as its
 * record tells (the not-before less the last delay); 0 when none. */
uint64_t throttle__segment_published_ago(throttle_t *h, const char *key) {
  size_t len;
  if (throttle__check_key(h, key, &len) != 0 || throttle__lock_brief(h) != 0)
    return 0;
  uint64_t now = throttle__now_ns(), ago = 0;
  struct throttle__rec *r =
      throttle__find_locked(h, key, len, throttle__hash(h->seed, key, len));
  if (r != NULL) {
    uint64_t nb = atomic_load_explicit(&r->not_before, memory_order_relaxed);
    uint64_t d = throttle__sat_mul_ms(r->last_delay_ms);
    uint64_t pub = nb > d ? nb - d : 0;
    ago = nb != 0 && now > pub ? (now - pub) / THROTTLE__NS_PER_MS : 0;
  }
  throttle__unlock(h);
  return ago;
}

/* The segment's copy of key's back-off dropped: the backend had it cleared
 * after it was published, so healing must not bring it back. */
void throttle__segment_forget(throttle_t *h, const char *key) {
  size_t len;
  if (throttle__check_key(h, key, &len) == 0)
    (void)throttle__segment_clear(h, key, len);
}

/* How many callers of key has the segment admitted or queued that are
 * still there (reaped of the dead first)?  Only during and just after a
 * backend outage: while the backend serves, the segment's gate for a key
 * is empty.  Taken under the mutex: one lookup, no system call. */
uint32_t throttle__segment_count(throttle_t *h, const char *key) {
  size_t len;
  if (throttle__check_key(h, key, &len) != 0 || throttle__lock_brief(h) != 0)
    return 0;
  uint32_t n = 0;
  struct throttle__rec *r =
      throttle__find_locked(h, key, len, throttle__hash(h->seed, key, len));
  if (r != NULL) {
    throttle__reap_locked(r, throttle__now_ns());
    for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
      const struct throttle__slot *s = &r->slot[i];
      /* not the backend's own admissions kept here: it counts those */
      n += s->state == THROTTLE__SLOT_WAITING ||
           (s->state == THROTTLE__SLOT_HOLDING &&
            s->probe != THROTTLE__SLOT_BY_BACKEND);
    }
  }
  throttle__unlock(h);
  return n;
}

/* throttle__lock_record() (below), with the mutex taken by lock. */
static int record_under(throttle_t *h, int (*lock)(throttle_t *),
                        const char *key, size_t len, uint64_t *now,
                        struct throttle__rec **r) {
  uint64_t hash = throttle__hash(h->seed, key, len);
  int rc = lock(h);
  if (rc != 0)
    return rc;
  *now = throttle__now_ns();
  if ((rc = throttle__insert_locked(h, key, len, hash, *now, r)) != 0)
    throttle__unlock(h);
  return rc;
}

/* An admission the backend across hosts made, kept in the segment as a
 * holder of this process (slot->probe THROTTLE__SLOT_BY_BACKEND), with a
 * place in each capped pool above it as a grant here would take: should
 * the backend go away while it is held, the segment counts it against
 * the key's cap and the pools' instead of admitting one more caller of
 * this host beside it.  Its process's death or its lease frees it as any
 * holder's.  Not counted by throttle__segment_count (the backend knows
 * it), never the key's probe.  Best effort: a key the table has no room
 * for, or whose 32 slots are all in use, or a mutex not had at once
 * (throttle__lock_brief), is not kept (t->ticket 0). */
void throttle__segment_hold_backend(throttle_t *h, throttle_ticket_t *t) {
  t->ticket = 0;
  t->slot = UINT32_MAX;
  uint64_t now;
  struct throttle__rec *r;
  if (record_under(h, throttle__lock_brief, t->key, t->len, &now, &r) != 0)
    return;
  throttle__reap_locked(r, now);
  struct throttle__slot *s = NULL;
  uint32_t holders = 1;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++) {
    if (r->slot[i].state == THROTTLE__SLOT_HOLDING)
      holders++;
    else if (s == NULL && r->slot[i].state == THROTTLE__SLOT_FREE)
      s = &r->slot[i];
  }
  if (s != NULL) {
    struct throttle__self_id self = throttle__self_id();
    s->since_ns = now; /* the times first, the state last */
    s->since_mono_ns = throttle__mono_at(now);
    s->cls = (uint8_t)t->cls;
    s->pid = throttle__pid();
    s->start = self.start;
    s->pidns = self.pidns;
    s->lease_ms = h->lease_ms;
    s->ticket = throttle__next_ticket_locked(h, r);
    s->probe = THROTTLE__SLOT_BY_BACKEND;
    s->concurrent = (uint8_t)(holders < UINT8_MAX ? holders : UINT8_MAX);
    s->state = THROTTLE__SLOT_HOLDING;
    t->slot = (uint32_t)(s - r->slot);
    t->ticket = s->ticket;
    t->rec = (uint32_t)(r - h->recs);
    if (throttle__scope_next(t->key, t->len, 0) != 0)
      throttle__scope_place_locked(h, r, s);
  }
  throttle__unlock(h);
}

/* The backend's admission t left: its copy in the segment freed (and its
 * pool places), and what the gate allows now granted to the segment's
 * own waiters (those of an outage).  The mutex is waited for as any
 * call's (a copy left held would hold a slot through the next outage);
 * out of reach, the copy is left to the lease. */
void throttle__segment_release_backend(throttle_t *h,
                                       const throttle_ticket_t *t) {
  if (t->ticket == 0 || t->slot >= THROTTLE__SLOTS || throttle__lock(h) != 0)
    return;
  struct throttle__rec *r = throttle__rec_at_locked(h, t->rec, t->key, t->len);
  if (r == NULL)
    r = throttle__find_locked(h, t->key, t->len,
                              throttle__hash(h->seed, t->key, t->len));
  struct throttle__wake w;
  w.n = 0;
  if (r != NULL && r->slot[t->slot].state == THROTTLE__SLOT_HOLDING &&
      r->slot[t->slot].ticket == t->ticket) {
    uint64_t next;
    throttle__free_slot(r, &r->slot[t->slot]);
    throttle__grant_locked(h, r, throttle__now_ns(), &w, &next, NULL);
  }
  if (throttle__scope_next(t->key, t->len, 0) != 0)
    throttle__scope_report_locked(h, t->key, t->len, t->ticket,
                                  THROTTLE_OUTCOME_ABANDONED);
  throttle__unlock(h);
  throttle__wake_all(&w);
}

/* Open key in the segment; THROTTLE_ENOKEY (no message) when it has no
 * record there. */
int throttle__segment_clear(throttle_t *h, const char *key, size_t len) {
  uint64_t hash = throttle__hash(h->seed, key, len);
  int rc = throttle__lock(h);
  if (rc != 0)
    return rc;
  struct throttle__rec *r = throttle__find_locked(h, key, len, hash);
  if (r != NULL) {
    throttle__open_locked(r);
    r->last_use_ns = throttle__now_ns();
    /* Woken under the mutex: throttle__wake_rec reads the record's slots,
     * which another thread may rewrite (evict, reuse) once it is released.
     * A wake does not sleep; with no sleepers it is one system call. */
    throttle__wake_rec(r);
    throttle__scope_below_locked(h, r, false); /* a scope: its keys too */
  }
  /* A scope without a record of its own has no back-off to drop; its
   * keys are still woken, and it is no unknown key. */
  bool beneath = r == NULL && throttle__scope_below_key_locked(h, key, len,
                                                               false) != 0;
  throttle__unlock(h);
  return r != NULL || beneath ? 0 : THROTTLE_ENOKEY;
}

int throttle__lock_record(throttle_t *h, const char *key, size_t len,
                          uint64_t *now, struct throttle__rec **r) {
  return record_under(h, throttle__lock, key, len, now, r);
}

/* The settings of record r, as a backend tells them (backend.h); false
 * when it has none. */
static bool settings_of(const struct throttle__rec *r,
                        struct throttle__be_settings *s) {
  bool paused = (r->flags & THROTTLE__REC_PAUSED) != 0;
  bool share = (r->flags & THROTTLE__REC_SHARE_SET) != 0;
  if (r->fixed_cap == 0 && r->auto_max == 0 && !paused && r->rate_n == 0 &&
      !share)
    return false;
  s->known = 1;
  s->fixed_cap = r->fixed_cap <= THROTTLE__SLOTS ? r->fixed_cap : THROTTLE__SLOTS;
  s->auto_max = r->auto_max <= THROTTLE__SLOTS ? r->auto_max : THROTTLE__SLOTS;
  s->paused = paused;
  s->rate_n = r->rate_period_ns != 0 ? r->rate_n : 0;
  s->rate_period_ms = s->rate_n != 0 ? r->rate_period_ns / THROTTLE__NS_PER_MS : 0;
  if (s->rate_n != 0 && s->rate_period_ms == 0)
    s->rate_n = 0; /* a period under 1 ms: no rate a backend keeps */
  s->share_set = share;
  s->share_permille = share && r->share_permille <= 1000 ? r->share_permille
                      : share ? 1000 : 0;
  return true;
}

/* params segment_settings (backend.h): the records of key and of its
 * scopes, under the mutex (one lookup each, no system call).  A record
 * counts when it was used within within_ms: each enter's answer renews
 * the use (throttle__segment_mirror), so one older than that (a key with
 * no traffic through this host for the backend's idle TTL) may hold what
 * the backend was told to drop since; it is not sent back. */
int throttle__segment_settings(throttle_t *h, const char *key,
                               uint64_t within_ms,
                               struct throttle__be_settings *out) {
  size_t len;
  if (h->ro_src != NULL || throttle__check_key(h, key, &len) != 0 ||
      throttle__lock_brief(h) != 0)
    return 0;
  uint64_t now = throttle__now_ns();
  uint64_t within = within_ms <= UINT64_MAX / THROTTLE__NS_PER_MS
                        ? within_ms * THROTTLE__NS_PER_MS
                        : UINT64_MAX;
  int n = 0;
  size_t i = 1, end = throttle__scope_next(key, len, 0);
  for (;;) {
    size_t l = end != 0 ? end : len; /* the scopes first, then the key */
    struct throttle__rec *r =
        throttle__find_locked(h, key, l, throttle__hash(h->seed, key, l));
    struct throttle__be_settings *s = &out[end != 0 ? i : 0];
    if (r != NULL && r->last_use_ns <= now && now - r->last_use_ns < within &&
        settings_of(r, s))
      n++;
    if (end == 0)
      break;
    end = ++i < THROTTLE__BE_NSETTINGS ? throttle__scope_next(key, len, end + 1)
                                       : 0;
  }
  throttle__unlock(h);
  return n;
}

void throttle__segment_mirror(throttle_t *h, const char *key,
                              const struct throttle__be_settings *s) {
  size_t len;
  if (!s->known || h->ro_src != NULL || throttle__check_key(h, key, &len) != 0)
    return;
  bool any = s->fixed_cap != 0 || s->auto_max != 0 || s->paused ||
             s->rate_n != 0 || s->share_set;
  uint64_t hash = throttle__hash(h->seed, key, len);
  if (throttle__lock_brief(h) != 0)
    return;
  uint64_t now = throttle__now_ns();
  struct throttle__rec *r = throttle__find_locked(h, key, len, hash);
  if (r == NULL && any && throttle__insert_locked(h, key, len, hash, now, &r) != 0)
    r = NULL; /* no room: the segment keeps what it had */
  if (r != NULL) {
    r->last_use_ns = now; /* a use: throttle__segment_settings */
    bool changed = false;
    uint32_t cap = s->fixed_cap <= THROTTLE__SLOTS ? s->fixed_cap : THROTTLE__SLOTS;
    uint32_t max = s->auto_max <= THROTTLE__SLOTS ? s->auto_max : THROTTLE__SLOTS;
    uint64_t ms = s->rate_period_ms <= UINT64_C(86400000) * 366
                      ? s->rate_period_ms
                      : UINT64_C(86400000) * 366;
    uint64_t period = s->rate_n ? ms * THROTTLE__NS_PER_MS : 0;
    uint32_t share = s->share_permille <= 1000 ? s->share_permille : 1000;
    if (r->fixed_cap != cap || r->auto_max != max) {
      r->fixed_cap = cap;
      r->auto_max = max;
      throttle__learn_bound_locked(r, now);
      changed = true;
    }
    if (((r->flags & THROTTLE__REC_PAUSED) != 0) != (s->paused != 0)) {
      throttle__rec_flags(r, THROTTLE__REC_PAUSED, s->paused != 0);
      changed = true;
    }
    if (r->rate_n != s->rate_n || r->rate_period_ns != period) {
      r->rate_n = s->rate_n;
      r->rate_period_ns = period;
      r->rate_tat_ns = 0;
      changed = true;
    }
    if (((r->flags & THROTTLE__REC_SHARE_SET) != 0) != (s->share_set != 0) ||
        (s->share_set && r->share_permille != share)) {
      r->share_permille = s->share_set ? share : 0;
      throttle__rec_flags(r, THROTTLE__REC_SHARE_SET, s->share_set != 0);
      changed = true;
    }
    if (changed) { /* as with_key() does for a setting made here */
      throttle__wake_rec(r);
      throttle__scope_below_locked(h, r, false);
      throttle__scope_touch(h);
    }
  }
  throttle__unlock(h);
}

/* A field of the record, read once and bounded (it may lack its NUL). */
#define CLEAN_FIELD(dst, src)                                                  \
  throttle__clean_text((dst), sizeof(dst), (src), strnlen((src), sizeof(src)))

void throttle__refusal_copy(struct throttle__refusal *dst,
                            const struct throttle__refusal *src) {
  struct throttle__refusal r;
  memcpy(&r, src, sizeof r); /* once: a writer may change it meanwhile */
  memset(dst, 0, sizeof *dst);
  if (r.wall_ns == 0 || r.status < 100 || r.status > 999)
    return; /* none, or not one the library wrote */
  dst->wall_ns = r.wall_ns;
  dst->pid = r.pid;
  dst->status = r.status;
  CLEAN_FIELD(dst->code, r.code);
  CLEAN_FIELD(dst->msg, r.msg);
  CLEAN_FIELD(dst->ra, r.ra);
  CLEAN_FIELD(dst->host, r.host);
}

void throttle__refusal_merge(throttle_t *h, throttle_info_t *info) {
  memset(&info->refusal, 0, sizeof info->refusal);
  size_t len = strnlen(info->key, sizeof info->key);
  if (h->hdr == NULL || len == 0 || len > THROTTLE__KEY_MAX ||
      throttle__lock_brief(h) != 0)
    return; /* no segment to ask: none noted */
  struct throttle__rec *r = throttle__find_locked(
      h, info->key, len, throttle__hash(h->seed, info->key, len));
  if (r != NULL)
    throttle__refusal_copy(&info->refusal, &r->refusal);
  throttle__unlock(h);
}
