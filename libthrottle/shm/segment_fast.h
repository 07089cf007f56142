/* SPDX-License-Identifier: MIT */
/*
 * segment_fast.h — the segment's lock-free open-key check, inlined into
 * the public throttle_remaining() and throttle_wait() (api/backoff.c) when
 * the segment serves alone: the hot path, which a call through the table
 * of operations (backend.h) would make measurably slower.  A key this
 * thread's guesses do not answer for goes on through h->ops
 * (throttle__seg_remaining, throttle__seg_wait: segment_backoff.c).
 *
 * No lock, no write to shared memory, no clock for a key that is open:
 * the record is found by this thread's guesses checked against it with
 * the seqlock (table.c), and one atomic word is read.
 */
#ifndef THROTTLE_SEGMENT_FAST_H
#define THROTTLE_SEGMENT_FAST_H

#include "internal.h"

/* The latest not-before of key and its scopes from what this thread's
 * guesses know of each (true), with no lock and no full lookup; false
 * when a level is not among them (then the caller checks the key's syntax
 * and looks it up).  Known levels were checked when first seen.  When
 * every scope is open (passed or none) and not held by the gate, and the
 * key has a record, that is noted as the scopes-open mark under gen (as
 * a wait that found them so notes it): the next call reads the key
 * alone. */
static inline bool guessed_nb(const throttle_t *h, const char *key, size_t len,
                              uint32_t gen, uint64_t *most) {
  *most = 0;
  bool open = true; /* every scope passed and not held, so far */
  uint64_t now = 0;
  for (size_t p = 0, q = 0; q < len; p = q + 1) {
    size_t s = throttle__scope_next(key, len, p);
    q = s ? s : len;
    uint32_t idx, seq;
    int f = throttle__find_nolock(h, key, q, &idx, &seq, true);
    if (f == THROTTLE__NOT_GUESSED)
      return false;
    if (f == 0) {
      if (q == len)
        open = false; /* no record of the key to note the mark on */
      continue;
    }
    const struct throttle__rec *r = &h->recs[idx];
    uint64_t v = atomic_load_explicit(&r->not_before, memory_order_acquire);
    int held = q < len ? throttle__gate_held(r) : 0;
    if (!throttle__seq_still(h, seq))
      return false;
    if (v != 0 && now == 0)
      now = throttle__now_ns();
    if (v != 0 &&
        v > throttle__sat_add(now, throttle__seg_max_ns(h)))
      return false; /* throttle__read_nb pulls it in under the mutex */
    if (q < len && (held || v > now))
      open = false;
    if (v > *most)
      *most = v;
    if (q == len && p > 0 && open) /* the key, beneath scopes */
      throttle__guess_note_scopes(h, key, len, idx, gen);
  }
  return true;
}

/* The open-key check without the mutex: 1 when key is absent or open and
 * not held by the gate (*idx its record, UINT32_MAX when absent), 0 when
 * it needs a closer look.  Inlined: it is the whole hot path. */
static inline __attribute__((always_inline)) int
peek_open(const throttle_t *h, const char *key, size_t len, uint32_t *idx) {
  uint32_t i, seq;
  *idx = UINT32_MAX;
  /* this thread's guesses alone: they know only keys checked before */
  int f = throttle__find_nolock(h, key, len, &i, &seq, true);
  if (f <= 0)
    return f == 0;
  const struct throttle__rec *r = &h->recs[i];
  uint64_t v = atomic_load_explicit(&r->not_before, memory_order_acquire);
  int held = throttle__gate_held(r);
  if (!throttle__seq_still(h, seq))
    return 0;
  *idx = i;
  return v == 0 && !held;
}

/* Every scope of key absent, as this thread's guesses know (an absent key
 * beneath them is then open). */
static inline bool scopes_guessed_absent(const throttle_t *h, const char *key,
                                  size_t len) {
  for (size_t p = 0; (p = throttle__scope_next(key, len, p)) != 0; p++) {
    uint32_t idx, seq;
    if (throttle__find_nolock(h, key, p, &idx, &seq, true) != 0)
      return false;
  }
  return true;
}

/* throttle_remaining() from the guesses alone: true and *ms set, or false
 * (then the table's remaining answers).  A key whose scopes this thread
 * saw open under the current sgen is read alone (one lookup, as wait's
 * open-key check). */
static inline __attribute__((always_inline)) bool
throttle__seg_remaining_guessed(const throttle_t *h, const char *key,
                                size_t len, uint64_t *ms) {
  /* read before the look whose result it may vouch for */
  uint32_t gen = atomic_load_explicit(&h->hdr->sgen, memory_order_acquire);
  uint64_t most;
  if (throttle__scope_next(key, len, 0) != 0) {
    uint32_t idx, seq;
    if (throttle__find_nolock(h, key, len, &idx, &seq, true) == 1) {
      most = atomic_load_explicit(&h->recs[idx].not_before,
                                  memory_order_acquire);
      if (throttle__seq_still(h, seq) &&
          throttle__guess_scopes_open(h, key, len, idx, gen)) {
        if (most == 0) {
          *ms = 0;
          return true;
        }
        uint64_t now = throttle__now_ns();
        if (most <= throttle__sat_add(now, throttle__seg_max_ns(h))) {
          *ms = throttle__ms_left(h, most, now);
          return true;
        }
      }
    }
  }
  if (!guessed_nb(h, key, len, gen, &most))
    return false;
  *ms = most == 0 ? 0 : throttle__ms_left(h, most, throttle__now_ns());
  return true;
}

/* throttle_wait() from the guesses alone: true when every level of key is
 * open and not held by the gate (the call returns 0 at once), false when
 * it needs the table's wait.  No clock, no lock, no full lookup. */
static inline __attribute__((always_inline)) bool
throttle__seg_wait_guessed(throttle_t *h, const char *key, size_t len) {
  /* read before the look whose result it may vouch for */
  uint32_t gen = atomic_load_explicit(&h->hdr->sgen, memory_order_acquire);
  uint32_t idx;
  if (peek_open(h, key, len, &idx) &&
      (throttle__scope_next(key, len, 0) == 0 ||
       (idx != UINT32_MAX
            ? throttle__guess_scopes_open(h, key, len, idx, gen)
            : scopes_guessed_absent(h, key, len)))) {
    throttle__clear_msg(h); /* the hot path: one lookup */
    return true;
  }
  return false;
}

#endif
