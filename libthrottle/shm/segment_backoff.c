/* SPDX-License-Identifier: MIT */
/*
 * segment_backoff.c — the segment backend's half of the per-key
 * not-before: publish, peek, wait, clear, reset and the snapshots, as the
 * operations of throttle__segment_ops (backend.h) that the public entry
 * points (api/backoff.c) call once they have checked their arguments.
 *
 * The hot path (a check on an open key) takes no lock and writes nothing to
 * shared memory: it finds the record with a seqlock-checked lookup and reads
 * one atomic word.  A not-before of 0 means "open" without even reading the
 * clock, so the common case costs a per-thread guess checked against the
 * record (table.c), or on a miss a hash and a probe.  Everything that
 * changes a record takes the mutex, and nothing sleeps with it held.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void sat_inc(uint64_t *c, uint64_t by) { *c = throttle__sat_add(*c, by); }

static int64_t to_i64(uint64_t v) {
  return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
}

/* One record's not-before as read without the mutex (0: absent, open, or
 * the table kept changing under us), bounded by the segment's maximum
 * delay: shared memory is input (I8). */
static uint64_t level_nb_nolock(const throttle_t *h, const char *key,
                                size_t len) {
  uint64_t v = 0;
  int t = 0;
  for (; t < THROTTLE__NOLOCK_TRIES; t++) {
    uint32_t idx, seq;
    int f = throttle__find_nolock(h, key, len, &idx, &seq, false);
    if (f == 0)
      return 0;
    if (f < 0)
      continue;
    v = atomic_load_explicit(&h->recs[idx].not_before, memory_order_acquire);
    if (throttle__seq_still(h, seq))
      break;
  }
  /* Never stable (a writer stopped inside a change of the table, the
   * mutex with it): the records themselves still say. */
  if (t == THROTTLE__NOLOCK_TRIES)
    v = throttle__scan_nb_nolock(h, key, len);
  uint64_t limit =
      throttle__sat_add(throttle__now_ns(), throttle__seg_max_ns(h));
  return v > limit ? limit : v;
}

/* The latest not-before of the key and of every scope above it, as read
 * without the mutex: what a caller that cannot take the mutex still
 * honours before it fails open (a 429 is published on the root scope, so
 * the scopes' are the common back-off). */
uint64_t throttle__nb_nolock(const throttle_t *h, const char *key,
                             size_t len) {
  uint64_t most = 0;
  for (size_t p = 0, q = 0; q < len; p = q + 1) {
    size_t s = throttle__scope_next(key, len, p);
    q = s ? s : len;
    uint64_t v = level_nb_nolock(h, key, q);
    if (v > most)
      most = v;
  }
  return most;
}

/* The mutex is out of reach, or the table has no room for the key
 * (lock_rc): the caller will fail open and send anyway, but not before the
 * not-before it can still read without the mutex (I1 holds even then).
 * Returns lock_rc after that wait, or THROTTLE_EWOULDBLOCK /
 * THROTTLE_ETIMEDOUT / THROTTLE_EINTR as the wait itself ends. */
int throttle__honour_nb_unlocked(throttle_t *h, const char *key, size_t len,
                                 int lock_rc, int nowait, uint64_t deadline,
                                 uint64_t *wait_ms) {
  if (lock_rc != THROTTLE_ELOCKTIMEOUT && lock_rc != THROTTLE_ECORRUPT &&
      lock_rc != THROTTLE_EFULL)
    return lock_rc;
  char why[512];
  snprintf(why, sizeof why, "%s", throttle_errmsg(h));
  _Atomic uint32_t word = 0; /* nobody wakes it: a timed sleep */
  for (;;) {
    uint64_t nb = throttle__nb_nolock(h, key, len), now = throttle__now_ns();
    if (nb > throttle__sat_add(now, h->max_delay_ns)) /* what it honours */
      nb = throttle__sat_add(now, h->max_delay_ns);
    if (nb <= now)
      return throttle__fail(h, lock_rc, "%s", why);
    if (nowait || nb > deadline) {
      if (wait_ms != NULL)
        *wait_ms = (nb - now + THROTTLE__NS_PER_MS - 1) / THROTTLE__NS_PER_MS;
      return throttle__fail(h, nowait ? THROTTLE_EWOULDBLOCK
                                      : THROTTLE_ETIMEDOUT,
                            "%s: not before its back-off (%s)", key, why);
    }
    if (throttle__sleep(h, &word, 0, nb - now) != 0)
      return throttle__fail(h, THROTTLE_EINTR, "%s: interrupted", key);
  }
}

/* The segment's own publish (the public call has checked the key and
 * refused a read-only handle). */
int throttle__seg_backoff(throttle_t *h, const char *key, size_t len,
                       uint64_t delay_ms) {
  uint64_t delay = throttle__sat_mul_ms(delay_ms); /* bounded when published */
  uint64_t now;
  struct throttle__rec *r;
  int rc = throttle__lock_record(h, key, len, &now, &r);
  if (rc != 0)
    return rc;
  THROTTLE__CRASHPOINT("mid-update");
  throttle__publish_locked(h, r, now, delay);
  throttle__unlock(h);
  throttle__clear_msg(h);
  return 0;
}

/* The key's length is known and within bounds; its syntax is checked
 * here (the public call has tried this thread's guesses first when the
 * segment serves alone, segment_fast.h; a backend in front of it reads
 * the segment under the mutex). */
int throttle__seg_remaining(throttle_t *h, const char *key, size_t len,
                            uint64_t *ms) {
  int rc;
  uint64_t most;
  if ((rc = throttle__key_syntax(h, key, len)) != 0)
    return rc;
  /* the latest of the key's and its scopes' */
  most = 0;
  for (size_t p = 0, q = 0; q < len; p = q + 1) {
    size_t s = throttle__scope_next(key, len, p);
    q = s ? s : len;
    uint64_t nb;
    struct throttle__rec *r;
    if ((rc = throttle__read_nb(h, key, q, &nb, &r, NULL)) != 0)
      return rc;
    if (nb > most)
      most = nb;
  }
  *ms = most == 0 ? 0 : throttle__ms_left(h, most, throttle__now_ns());
  return 0;
}

static void count_wait(throttle_t *h, const char *key, size_t len,
                       uint64_t slept_ns) {
  uint64_t hash = throttle__hash(h->seed, key, len);
  if (throttle__lock(h) != 0)
    return; /* counters are best effort; the wait itself succeeded */
  struct throttle__rec *r = throttle__find_locked(h, key, len, hash);
  if (r != NULL) {
    sat_inc(&r->waits, 1);
    sat_inc(&r->waited_ns, slept_ns);
    r->last_use_ns = throttle__now_ns();
  }
  throttle__unlock(h);
}

/* Held by the gate although the time has come: the key is paused, or the
 * probe of a lock episode is out (enter/leave users; see gate_enter.c).  Sleep
 * for its answer like an admission would, re-checking for a dead probe.
 * A scope's probe holds its keys as the admission's scope gate says
 * (scope.c: a cold scope's first request at most THROTTLE__COLD_HOLD_NS,
 * so a caller that holds one table never waits for itself on another):
 * 1 when that hold is over, the level open for this wait. */
static int wait_gate(throttle_t *h, const char *key, size_t len, bool scope,
                     struct throttle__rec *r, uint32_t epoch, uint64_t now,
                     uint64_t deadline) {
  uint64_t until = now + THROTTLE__POLL_NS;
  if (throttle__lock(h) == 0) {
    struct throttle__rec *lr =
        throttle__find_locked(h, key, len, throttle__hash(h->seed, key, len));
    if (lr != NULL)
      throttle__reap_locked(lr, now);
    bool open = lr != NULL && scope && throttle__gate_held(lr) == 2 &&
                !throttle__scope_probe_holds_locked(lr, now, &until);
    throttle__unlock(h);
    if (open)
      return 1;
  }
  if (now >= deadline)
    return throttle__fail(h, THROTTLE_ETIMEDOUT,
                          "%s: %s past the timeout", key,
                          throttle__gate_held(r) == 1 ? "paused"
                                                      : "probe still out");
  if (until > deadline)
    until = deadline;
  if (until > now && throttle__sleep(h, &r->epoch, epoch, until - now) != 0)
    return throttle__fail(h, THROTTLE_EINTR, "%s: wait interrupted", key);
  return 0;
}

/* 0 when the level opened, 1 when it is open by the cold-scope bound
 * without a sleep in this call (nothing waited for), or the error. */
static int wait_slow(throttle_t *h, const char *key, size_t len, bool scope,
                     uint64_t timeout_ms) __attribute__((noinline));

/* As throttle__seg_remaining: the key's length known, its syntax checked
 * here, the guesses tried by the public call (segment_fast.h). */
int throttle__seg_wait(throttle_t *h, const char *key, size_t len,
                       uint64_t timeout_ms) {
  int rc;
  /* The key and each of its scopes (scope.c), root first.  A level
   * waited for may let another close meanwhile: look at all again. */
  /* read before the look whose result it may vouch for */
  uint32_t gen = atomic_load_explicit(&h->hdr->sgen, memory_order_acquire);
  if ((rc = throttle__key_syntax(h, key, len)) != 0)
    return rc;
  uint64_t nb, start = 0;
  struct throttle__rec *r = NULL;
  bool bounded = false;
  for (bool waited = true; waited;) {
    waited = false;
    size_t p = 0, l;
    do {
      size_t q = throttle__scope_next(key, len, p);
      l = q ? q : len;
      p = q + 1;
      if ((rc = throttle__read_nb(h, key, l, &nb, &r, NULL)) != 0)
        return rc;
      if (r == NULL || (nb == 0 && !throttle__gate_held(r)))
        continue;
      uint64_t now = throttle__now_ns();
      if (nb <= now && !throttle__gate_held(r))
        continue; /* passed: nothing waited for, nothing to look at again */
      if (start != 0 && now - start >= h->max_delay_ns) {
        bounded = true; /* open for this call, not for the mark below */
        continue; /* this process's own maximum, from the start of the call */
      }
      if (start == 0)
        start = now;
      uint64_t spent = (now - start) / THROTTLE__NS_PER_MS;
      if ((rc = wait_slow(h, key, l, l < len,
                          timeout_ms == THROTTLE_FOREVER ? timeout_ms
                          : spent < timeout_ms           ? timeout_ms - spent
                                                         : 0)) < 0)
        return rc;
      if (rc == 0)
        waited = true;
    } while (l < len);
    if (!waited && !bounded && r != NULL) /* r: the key's own, looked at last */
      throttle__guess_note_scopes(h, key, len, (uint32_t)(r - h->recs), gen);
  }
  throttle__clear_msg(h);
  return 0;
}

static int wait_slow(throttle_t *h, const char *key, size_t len, bool scope,
                     uint64_t timeout_ms) {
  int rc;
  uint64_t start = 0, deadline = UINT64_MAX, jitter = 0, own_until = 0;
  int slept = 0;
  bool asleep = false, bound = false; /* slept; open by the cold bound */
  for (;;) {
    uint64_t nb;
    struct throttle__rec *r;
    /* The epoch is read before the not-before: a clear that lands between
     * the two changes the epoch, and the futex wait then returns at once. */
    uint32_t epoch = 0;
    if ((rc = throttle__read_nb(h, key, len, &nb, &r, &epoch)) != 0)
      return rc;
    if (r == NULL)
      break; /* never seen: open */
    int held = throttle__gate_held(r);
    if (nb == 0 && !held)
      break; /* open (or cleared): no clock needed */
    uint64_t now = throttle__now_ns();
    if (!slept) {
      if (nb <= now && !held)
        break;
      start = now;
      if (timeout_ms != THROTTLE_FOREVER)
        deadline = throttle__sat_add(now, throttle__sat_mul_ms(timeout_ms));
      jitter = throttle__random() % (THROTTLE__JITTER_MAX_NS + 1);
      /* This process's own maximum delay counts from the start of its
       * wait (counted from each look, it would never run out). */
      own_until = throttle__sat_add(now, h->max_delay_ns);
    }
    if (nb > own_until)
      nb = own_until;
    if (nb > deadline) {
      if (slept)
        count_wait(h, key, len, now - start);
      return throttle__fail(h, THROTTLE_ETIMEDOUT,
                            "%s: opens in %llu ms, after the %llu ms timeout",
                            key,
                            (unsigned long long)throttle__ms_left(h, nb, now),
                            (unsigned long long)timeout_ms);
    }
    /* Cleared (0) opens at once; a passing not-before opens after the
     * jitter. */
    uint64_t target = nb == 0 ? 0 : throttle__sat_add(nb, jitter);
    if (target > deadline)
      target = deadline;
    slept = 1;
    if (now < target) {
      asleep = true;
      if (throttle__sleep(h, &r->epoch, epoch, target - now) != 0) {
        count_wait(h, key, len, throttle__now_ns() - start);
        return throttle__fail(h, THROTTLE_EINTR, "%s: wait interrupted", key);
      }
      continue;
    }
    if (!held)
      break;
    if ((rc = wait_gate(h, key, len, scope, r, epoch, now, deadline)) == 1) {
      bound = true;
      break;
    }
    if (rc != 0) {
      count_wait(h, key, len, now - start);
      return rc;
    }
    asleep = true;
  }
  if (asleep)
    count_wait(h, key, len, throttle__now_ns() - start);
  throttle__clear_msg(h);
  return bound && !asleep ? 1 : 0;
}

int throttle__seg_clear(throttle_t *h, const char *key, size_t len) {
  int rc = throttle__segment_clear(h, key, len);
  if (rc == THROTTLE_ENOKEY)
    return throttle__fail(h, THROTTLE_ENOKEY, "%s: no such key", key);
  if (rc != 0)
    return rc;
  throttle__clear_msg(h);
  return 0;
}

int throttle__seg_reset(throttle_t *h) {
  int rc = throttle__lock(h);
  if (rc != 0)
    return rc;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state == THROTTLE__REC_USED &&
        (atomic_load_explicit(&r->not_before, memory_order_relaxed) != 0 ||
         (r->flags & THROTTLE__REC_EPISODE))) {
      throttle__open_locked(r);
      /* Under the mutex, as in throttle_clear(); only the keys that
       * changed have anything new for their waiters. */
      throttle__wake_rec(r);
    }
  }
  throttle__unlock(h);
  throttle__clear_msg(h);
  return 0;
}

/* ---- snapshots -------------------------------------------------------- */

static void snapshot(const throttle_t *h, const struct throttle__rec *r,
                     uint64_t now, throttle_info_t *out) {
  /* Shared memory a writer may change under us even with the mutex held:
   * read the length once and bound it. */
  size_t klen = __atomic_load_n(&r->key_len, __ATOMIC_RELAXED);
  if (klen > THROTTLE__KEY_MAX)
    klen = THROTTLE__KEY_MAX;
  memcpy(out->key, r->key, klen);
  out->key[klen] = 0;
  uint64_t nb = atomic_load_explicit(&r->not_before, memory_order_relaxed);
  int64_t *f = out->field;
  f[THROTTLE_FIELD_REMAINING_MS] = (int64_t)throttle__ms_left(h, nb, now);
  f[THROTTLE_FIELD_PUBLISHES] = to_i64(r->publishes);
  f[THROTTLE_FIELD_WAITS] = to_i64(r->waits);
  f[THROTTLE_FIELD_WAITED_MS] = to_i64(r->waited_ns / THROTTLE__NS_PER_MS);
  f[THROTTLE_FIELD_LAST_DELAY_MS] = to_i64(r->last_delay_ms);
  f[THROTTLE_FIELD_LAST_PUBLISHER_PID] = (int64_t)r->last_pid;
  f[THROTTLE_FIELD_IDLE_MS] =
      r->last_use_ns < now
          ? (int64_t)((now - r->last_use_ns) / THROTTLE__NS_PER_MS)
          : 0;
  f[THROTTLE_FIELD_CLEARS] = to_i64(r->clears);
  throttle__gate_snapshot(r, now, out);
  throttle__refusal_copy(&out->refusal, &r->refusal);
}

int throttle__seg_info(throttle_t *h, const char *key, size_t len,
                    throttle_info_t **out) {
  int rc;
  throttle_info_t *info = throttle__malloc(sizeof *info);
  if (info == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  uint64_t hash = throttle__hash(h->seed, key, len);
  if ((rc = throttle__lock(h)) != 0) {
    throttle__free(info);
    return rc;
  }
  struct throttle__rec *r = throttle__find_locked(h, key, len, hash);
  if (r != NULL)
    snapshot(h, r, throttle__now_ns(), info);
  throttle__unlock(h);
  if (r == NULL) {
    throttle__free(info);
    return throttle__fail(h, THROTTLE_ENOKEY, "%s: no such key", key);
  }
  *out = info;
  return 0;
}

static int by_key(const void *a, const void *b) {
  return strcmp(((const throttle_info_t *)a)->key,
                ((const throttle_info_t *)b)->key);
}

int throttle__seg_foreach(throttle_t *h,
                       int (*fn)(const throttle_info_t *, void *), void *arg) {
  /* Allocate before locking (never malloc with the mutex held), sized by
   * the keys in use plus room to grow; if more arrived meanwhile, retry
   * with a larger buffer.  A full table costs capacity snapshots, an
   * almost empty one almost nothing. */
  size_t room = (size_t)atomic_load_explicit(
                    (_Atomic uint32_t *)&h->hdr->used, memory_order_relaxed) +
                64;
  throttle_info_t *all = NULL;
  size_t n;
  int rc;
  for (;;) {
    if (room > h->capacity)
      room = h->capacity;
    throttle_info_t *grown = throttle__realloc(all, room * sizeof *all);
    if (grown == NULL) {
      throttle__free(all);
      return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
    }
    all = grown;
    if ((rc = throttle__lock(h)) != 0) {
      throttle__free(all);
      return rc;
    }
    /* used is shared memory: past the capacity it is garbage, and the
     * scan below is bounded by room anyway. */
    if (h->hdr->used <= room || room >= h->capacity)
      break;
    room = (size_t)h->hdr->used + 64;
    throttle__unlock(h);
  }
  uint64_t now = throttle__now_ns();
  n = 0;
  /* Only well-formed keys (as the rebuild in table.c judges them): a key
   * with a NUL in it would be reported cut short, as "" or as another key. */
  for (uint32_t i = 0; i < h->capacity && n < room; i++)
    if (h->recs[i].state == THROTTLE__REC_USED &&
        h->recs[i].key_len >= 1 && h->recs[i].key_len <= THROTTLE__KEY_MAX &&
        memchr(h->recs[i].key, 0, h->recs[i].key_len) == NULL)
      snapshot(h, &h->recs[i], now, &all[n++]);
  throttle__unlock(h);
  qsort(all, n, sizeof *all, by_key);
  rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = fn(&all[i], arg);
  throttle__free(all);
  return rc;
}

/* The segment's table: its capacity, the keys in use, what it evicted and
 * repaired (throttle_stats: the host's segment whatever the backend). */
int throttle__seg_stats(throttle_t *h, uint32_t *capacity, uint32_t *used,
                        uint64_t *evictions, uint64_t *repairs) {
  int rc = throttle__lock(h);
  if (rc != 0)
    return rc;
  if (capacity)
    *capacity = h->capacity;
  if (used) /* shared memory is input: never more than the capacity */
    *used = h->hdr->used <= h->capacity ? h->hdr->used : h->capacity;
  if (evictions)
    *evictions = h->hdr->evictions;
  if (repairs)
    *repairs = h->hdr->repairs;
  throttle__unlock(h);
  return 0;
}
