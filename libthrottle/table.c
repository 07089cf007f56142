/*
 * table.c — the fixed-capacity keyed hash of per-key records: lookups with
 * and without the mutex, insertion, LRU eviction of idle keys, and the
 * rebuild that repair uses.
 *
 * The index is open addressing with linear probing over 2^k >= 2 * capacity
 * buckets, each bucket a 64-bit word holding the key's 32-bit hash tag and
 * the record index, so a probe walks one array and touches a record only
 * when the tags match.  Deletion leaves tombstones (never moving a live
 * bucket, so a lock-free reader cannot miss a key that stays); the index is
 * rebuilt when tombstones pass a quarter of the buckets or a probe would
 * exceed THROTTLE__MAX_PROBE.  Rejected: backward-shift deletion (moves live
 * entries under readers) and chaining (pointers, or index lists a hostile
 * writer can loop).
 *
 * Everything read from shared memory is checked before use: record indices
 * against the capacity, key lengths against 255, probe walks against
 * THROTTLE__MAX_PROBE.
 */
#include "internal.h"

#include <string.h>

int throttle__check_key(const throttle_t *h, const char *key, size_t *len) {
  if (key == NULL)
    return throttle__fail(h, THROTTLE_EKEY, "key is NULL");
  size_t n = strnlen(key, THROTTLE__KEY_MAX + 1);
  if (n == 0 || n > THROTTLE__KEY_MAX)
    return throttle__fail(h, THROTTLE_EKEY,
                          "key is %s bytes; keys are 1 to 255 bytes",
                          n == 0 ? "0" : "more than 255");
  *len = n;
  return 0;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= UINT64_C(0xff51afd7ed558ccd);
  x ^= x >> 33;
  x *= UINT64_C(0xc4ceb9fe1a85ec53);
  x ^= x >> 33;
  return x;
}

/* Seeded: one multiply per 8 bytes, then a murmur3 finaliser over the
 * whole state.  Keys are table names chosen by the application, not by an
 * attacker, so a keyed cryptographic hash (SipHash) would buy nothing for
 * its ~3x cost on this hot path; the random per-segment seed still keeps
 * one segment's unlucky collisions from repeating in the next. */
uint64_t throttle__hash(uint64_t seed, const char *key, size_t len) {
  uint64_t h = seed ^ (len * UINT64_C(0x9e3779b97f4a7c15));
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, key + i, 8);
    h = ((h ^ w) * UINT64_C(0xbf58476d1ce4e5b9));
    h ^= h >> 29;
  }
  uint64_t w = 0;
  memcpy(&w, key + i, len - i);
  return mix(h ^ w);
}

static uint64_t bucket_word(uint64_t hash, uint32_t idx) {
  return (hash << 32) | ((uint64_t)idx + 1);
}

static int key_matches(const struct throttle__rec *r, const char *key,
                       size_t len) {
  return r->key_len == len && memcmp(r->key, key, len) == 0;
}

/* The records may change under us; the sequence check tells. The race is
 * intended (a seqlock), hence no thread-sanitizer instrumentation here. */
__attribute__((no_sanitize("thread"))) int
throttle__find_nolock(const throttle_t *h, const char *key, size_t len,
                      uint64_t hash, uint32_t *idx, uint32_t *seq) {
  uint32_t s = atomic_load_explicit(&h->hdr->tseq, memory_order_acquire);
  if (s & 1)
    return -1;
  uint32_t tag = (uint32_t)hash;
  uint32_t pos = (uint32_t)(hash >> 32) & h->bucket_mask;
  int found = 0;
  for (uint32_t i = 0; i < THROTTLE__MAX_PROBE; i++) {
    uint64_t b = atomic_load_explicit(&h->buckets[(pos + i) & h->bucket_mask],
                                      memory_order_acquire);
    if (b == 0)
      break;
    if (b == THROTTLE__TOMB || (uint32_t)(b >> 32) != tag)
      continue;
    uint32_t ri = (uint32_t)b - 1;
    if (ri >= h->capacity)
      continue;
    if (key_matches(&h->recs[ri], key, len)) {
      *idx = ri;
      found = 1;
      break;
    }
  }
  *seq = s;
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed) != s)
    return -1;
  return found;
}

bool throttle__seq_still(const throttle_t *h, uint32_t seq) {
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed) == seq;
}

static int32_t find_bucket_locked(throttle_t *h, const char *key, size_t len,
                                  uint64_t hash) {
  uint32_t tag = (uint32_t)hash;
  uint32_t pos = (uint32_t)(hash >> 32) & h->bucket_mask;
  for (uint32_t i = 0; i < THROTTLE__MAX_PROBE; i++) {
    uint32_t bi = (pos + i) & h->bucket_mask;
    uint64_t b = atomic_load_explicit(&h->buckets[bi], memory_order_relaxed);
    if (b == 0)
      return -1;
    if (b == THROTTLE__TOMB || (uint32_t)(b >> 32) != tag)
      continue;
    uint32_t ri = (uint32_t)b - 1;
    if (ri < h->capacity && h->recs[ri].state == THROTTLE__REC_USED &&
        key_matches(&h->recs[ri], key, len))
      return (int32_t)bi;
  }
  return -1;
}

struct throttle__rec *throttle__find_locked(throttle_t *h, const char *key,
                                            size_t len, uint64_t hash) {
  int32_t bi = find_bucket_locked(h, key, len, hash);
  if (bi < 0)
    return NULL;
  uint64_t b = atomic_load_explicit(&h->buckets[bi], memory_order_relaxed);
  return &h->recs[(uint32_t)b - 1];
}

static void seq_begin(throttle_t *h) {
  atomic_fetch_add_explicit(&h->hdr->tseq, 1, memory_order_acq_rel);
  atomic_thread_fence(memory_order_release);
}

static void seq_end(throttle_t *h) {
  atomic_fetch_add_explicit(&h->hdr->tseq, 1, memory_order_release);
}

static int place_bucket(throttle_t *h, uint64_t hash, uint32_t idx) {
  uint32_t pos = (uint32_t)(hash >> 32) & h->bucket_mask;
  for (uint32_t i = 0; i < THROTTLE__MAX_PROBE; i++) {
    uint32_t bi = (pos + i) & h->bucket_mask;
    uint64_t b = atomic_load_explicit(&h->buckets[bi], memory_order_relaxed);
    if (b == 0 || b == THROTTLE__TOMB) {
      if (b == THROTTLE__TOMB && h->hdr->tombstones > 0)
        h->hdr->tombstones--;
      atomic_store_explicit(&h->buckets[bi], bucket_word(hash, idx),
                            memory_order_release);
      return 0;
    }
  }
  return -1;
}

/* Rebuild index and free list from the records: the records are the truth.
 * A record whose key is malformed, or that repeats a key already placed, is
 * freed.  Called with the mutex held and the sequence odd. */
static void rebuild_locked(throttle_t *h) {
  for (uint32_t i = 0; i <= h->bucket_mask; i++)
    atomic_store_explicit(&h->buckets[i], 0, memory_order_relaxed);
  h->hdr->tombstones = 0;
  h->hdr->used = 0;
  h->hdr->free_head = 0;
  for (uint32_t i = h->capacity; i-- > 0;) {
    struct throttle__rec *r = &h->recs[i];
    int ok = r->state == THROTTLE__REC_USED && r->key_len >= 1 &&
             r->key_len <= THROTTLE__KEY_MAX &&
             memchr(r->key, 0, r->key_len) == NULL;
    if (ok) {
      r->key[r->key_len] = 0;
      uint64_t hash = throttle__hash(h->seed, r->key, r->key_len);
      r->hash = (uint32_t)hash;
      if (find_bucket_locked(h, r->key, r->key_len, hash) >= 0 ||
          place_bucket(h, hash, i) != 0)
        ok = 0;
    }
    if (ok) {
      h->hdr->used++;
    } else {
      memset(r, 0, sizeof *r);
      r->next_free = h->hdr->free_head;
      h->hdr->free_head = i + 1;
    }
  }
}

void throttle__init_table(throttle_t *h) {
  for (uint32_t i = h->capacity; i-- > 0;) {
    h->recs[i].state = THROTTLE__REC_FREE;
    h->recs[i].next_free = h->hdr->free_head;
    h->hdr->free_head = i + 1;
  }
}

/* A not-before further out than the maximum delay can only come from a
 * writer that ignored the clamp (or a clock that went backwards): pull it in
 * so it costs at most one maximum delay from now. */
uint64_t throttle__clamp_nb_locked(throttle_t *h, struct throttle__rec *r,
                                   uint64_t now) {
  uint64_t nb = atomic_load_explicit(&r->not_before, memory_order_relaxed);
  uint64_t limit = throttle__sat_add(now, h->max_delay_ns);
  if (nb > limit) {
    nb = limit;
    atomic_store_explicit(&r->not_before, nb, memory_order_release);
  }
  return nb;
}

void throttle__repair_locked(throttle_t *h) {
  uint64_t now = throttle__now_ns();
  uint32_t s = atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed);
  atomic_store_explicit(&h->hdr->tseq, s | 1, memory_order_release);
  rebuild_locked(h);
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state != THROTTLE__REC_USED)
      continue;
    throttle__clamp_nb_locked(h, r, now);
    throttle__gate_repair_locked(h, r);
    if (r->last_use_ns > now)
      r->last_use_ns = now;
  }
  atomic_store_explicit(&h->hdr->tseq, (s | 1) + 1, memory_order_release);
}


/* Full table: a linear scan for the least recently used idle key.  It runs
 * only when a new key arrives at a full table, so its O(capacity) cost is
 * paid by that insert alone; an approximate (sampled) LRU was rejected
 * because the contract promises the least recently used. */
static int evict_one_locked(throttle_t *h, uint64_t now) {
  uint32_t victim = UINT32_MAX;
  uint64_t oldest = UINT64_MAX;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state == THROTTLE__REC_USED && throttle__rec_idle(r, now) &&
        r->last_use_ns < oldest) {
      oldest = r->last_use_ns;
      victim = i;
    }
  }
  if (victim == UINT32_MAX)
    return -1;
  struct throttle__rec *r = &h->recs[victim];
  /* key_len is shared memory: hashing a damaged one would read past the
   * record (and the mapping).  Such a record has no findable bucket; a
   * stale one pointing at it matches no key and goes at the next rebuild. */
  int32_t bi = -1;
  if (r->key_len >= 1 && r->key_len <= THROTTLE__KEY_MAX)
    bi = find_bucket_locked(h, r->key, r->key_len,
                            throttle__hash(h->seed, r->key, r->key_len));
  if (bi >= 0) {
    atomic_store_explicit(&h->buckets[bi], THROTTLE__TOMB,
                          memory_order_release);
    h->hdr->tombstones++;
  }
  uint32_t epoch = atomic_load_explicit(&r->epoch, memory_order_relaxed);
  memset(r, 0, sizeof *r);
  /* Keep the futex word moving so a sleeper on the old key re-checks. */
  atomic_store_explicit(&r->epoch, epoch + 1, memory_order_release);
  r->next_free = h->hdr->free_head;
  h->hdr->free_head = victim + 1;
  if (h->hdr->used > 0)
    h->hdr->used--;
  if (h->hdr->evictions < UINT64_MAX)
    h->hdr->evictions++;
  return 0;
}

int throttle__insert_locked(throttle_t *h, const char *key, size_t len,
                            uint64_t hash, uint64_t now,
                            struct throttle__rec **out) {
  struct throttle__rec *r = throttle__find_locked(h, key, len, hash);
  if (r != NULL) {
    *out = r;
    return 0;
  }
  seq_begin(h);
  int rc = 0;
  if (h->hdr->tombstones > (h->bucket_mask + 1) / 4)
    rebuild_locked(h);
  uint32_t fi = h->hdr->free_head;
  if (fi == 0 || fi > h->capacity ||
      h->recs[fi - 1].state != THROTTLE__REC_FREE) {
    if (fi != 0) /* damaged free list: rebuild before trusting it */
      rebuild_locked(h);
    if (h->hdr->free_head == 0 && evict_one_locked(h, now) != 0) {
      rc = throttle__fail(h, THROTTLE_EFULL,
                          "%s: all %u keys have a back-off pending; raise "
                          "THROTTLE_KEYS (and throttlectl rm) or wait",
                          h->name, h->capacity);
      goto out;
    }
    fi = h->hdr->free_head;
  }
  uint32_t idx = fi - 1;
  r = &h->recs[idx];
  h->hdr->free_head = r->next_free <= h->capacity ? r->next_free : 0;
  uint32_t epoch = atomic_load_explicit(&r->epoch, memory_order_relaxed);
  memset(r, 0, sizeof *r);
  atomic_store_explicit(&r->epoch, epoch, memory_order_relaxed);
  memcpy(r->key, key, len);
  r->key_len = (uint16_t)len;
  r->hash = (uint32_t)hash;
  r->last_use_ns = now;
  r->state = THROTTLE__REC_USED;
  if (place_bucket(h, hash, idx) != 0) {
    rebuild_locked(h); /* sweeps tombstones, places r too */
    if (find_bucket_locked(h, key, len, hash) < 0) {
      memset(r, 0, sizeof *r);
      r->next_free = h->hdr->free_head;
      h->hdr->free_head = idx + 1;
      rc = throttle__fail(h, THROTTLE_EFULL,
                          "%s: no index slot within %u probes", h->name,
                          THROTTLE__MAX_PROBE);
      goto out;
    }
  } else {
    h->hdr->used++;
  }
  *out = r;
out:
  seq_end(h);
  return rc;
}
