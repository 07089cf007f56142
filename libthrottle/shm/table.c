/* SPDX-License-Identifier: MIT */
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

/* ---- key syntax ---------------------------------------------------------
 *
 * A key is a path of names joined by '/' (its scopes are its prefixes at
 * '/', scope.c): 1 to THROTTLE__KEY_MAX bytes, no control byte (below 0x20,
 * or 0x7f), no empty name (no leading or trailing '/', no "//"), at most
 * THROTTLE_KEY_MAX_SCOPES scopes (the Redis backend passes every scope of a
 * key to its scripts, and a key deeper than that would lose its deepest
 * there while the segment held them: refused on both instead).  Checked
 * here for every entry point (throttlectl and the Python binding call the
 * same functions), on every call: eight bytes a step, since the open-key
 * check is the hot path. */

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "a key's byte i is bits 8i..8i+7 of its word");
#define ONES UINT64_C(0x0101010101010101)
#define LOWS UINT64_C(0x7f7f7f7f7f7f7f7f)

/* 0x80 in each byte of t that is zero, exactly (no carry between bytes). */
static inline uint64_t zero_bytes(uint64_t t) {
  return ~(((t & LOWS) + LOWS) | t | LOWS);
}

/* What the word w (its low k bytes are key bytes, k 1..8) holds: *bad gets
 * a control byte or a "//" (with the byte before the word: *slash_before,
 * then the word's last byte); the number of '/' is returned. */
static inline unsigned scan_word(uint64_t w, unsigned k, uint64_t *bad,
                                 uint64_t *slash_before) {
  uint64_t valid = k == 8 ? ~UINT64_C(0) : (UINT64_C(1) << (8 * k)) - 1;
  uint64_t ctl = zero_bytes(w & (ONES * 0xe0)) | zero_bytes(w ^ (ONES * 0x7f));
  uint64_t sl = zero_bytes(w ^ (ONES * '/')) & valid;
  *bad |= (ctl & valid) | (sl & (sl << 8)) | (sl & *slash_before);
  *slash_before = (sl >> (8 * (k - 1))) & 0x80;
  return (unsigned)(((sl >> 7) * ONES) >> 56); /* the bytes' sum */
}

/* Can key (no C0 control byte, no 0x7f) be quoted in a message that may
 * reach a terminal?  Only when it is UTF-8 without a C1 control
 * (U+0080..U+009F: U+009B is a CSI to some terminals, as is a raw 0x9b
 * byte to an 8-bit one). */
static bool key_printable(const unsigned char *k, size_t len) {
  for (size_t i = 0; i < len;) {
    unsigned char c = k[i];
    size_t n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2
                            : c >= 0xe0 && c <= 0xef ? 3
                            : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (n == 0 || i + n > len || (c == 0xc2 && k[i + 1] < 0xa0))
      return false;
    for (size_t j = 1; j < n; j++)
      if ((k[i + j] & 0xc0) != 0x80)
        return false;
    i += n;
  }
  return true;
}

/* Why key (len bytes, known bad) is refused.  The control bytes first:
 * only a key without any (C0, DEL or C1) is quoted in the message (which
 * may reach a terminal). */
static int key_refused(const throttle_t *h, const char *key, size_t len,
                       unsigned scopes) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)key[i];
    if (c < 0x20 || c == 0x7f)
      return throttle__fail(h, THROTTLE_EKEY,
                            "key has a control byte (0x%02x) at byte %zu; "
                            "keys are printable",
                            c, i);
  }
  /* "key \"...\" " when it can be shown, else "key " */
  bool show = key_printable((const unsigned char *)key, len);
  int qlen = show ? (int)len : 0;
  const char *q = show ? "\"" : "", *sp = show ? "\" " : "";
  for (size_t i = 0; i < len; i++) {
    if (key[i] == '/' && (i == 0 || i + 1 == len || key[i + 1] == '/'))
      return throttle__fail(
          h, THROTTLE_EKEY,
          "key %s%.*s%shas an empty name at byte %zu: keys are paths of "
          "names joined by '/' (no leading, trailing or double '/')",
          q, qlen, key, sp, i == 0 || i + 1 == len ? i : i + 1);
  }
  return throttle__fail(h, THROTTLE_EKEY,
                        "key %s%.*s%shas %u scopes; at most %d "
                        "(THROTTLE_KEY_MAX_SCOPES)",
                        q, qlen, key, sp, scopes, THROTTLE_KEY_MAX_SCOPES);
}

int throttle__key_len(const throttle_t *h, const char *key, size_t *len) {
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

int throttle__key_syntax(const throttle_t *h, const char *key, size_t n) {
  uint64_t bad = 0, before = 0, w;
  unsigned slashes = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    memcpy(&w, key + i, 8);
    slashes += scan_word(w, 8, &bad, &before);
  }
  if (i < n) { /* the tail: the last 8 bytes (or all), shifted down */
    unsigned k = (unsigned)(n - i);
    if (n >= 8) {
      memcpy(&w, key + n - 8, 8);
      w >>= 8 * (8 - k);
    } else {
      w = 0;
      for (size_t j = n; j > 0; j--)
        w = (w << 8) | (unsigned char)key[j - 1];
    }
    slashes += scan_word(w, k, &bad, &before);
  }
  if (bad != 0 || key[0] == '/' || key[n - 1] == '/' ||
      slashes > THROTTLE_KEY_MAX_SCOPES)
    return key_refused(h, key, n, slashes);
  return 0;
}

int throttle__check_key(const throttle_t *h, const char *key, size_t *len) {
  int rc = throttle__key_len(h, key, len);
  return rc != 0 ? rc : throttle__key_syntax(h, key, *len);
}

THROTTLE_EXTERN int throttle_check_key(const char *key) {
  size_t len = 0;
  int rc = throttle__check_key(NULL, key, &len);
  if (rc == 0)
    throttle__clear_msg(NULL);
  return rc;
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
  for (size_t k = len; k > i; k--) /* the tail, without a memcpy call */
    w = (w << 8) | (unsigned char)key[k - 1];
  return mix(h ^ w);
}

static uint64_t bucket_word(uint64_t hash, uint32_t idx) {
  return (hash << 32) | ((uint64_t)idx + 1);
}

/* Do len bytes at a and b match?  Also called by the lock-free lookup, on
 * a record that may be changing under it (the sequence check then discards
 * the answer): hence no memcmp call for a thread sanitizer to intercept and
 * flag, and no instrumentation of these intended races.  Eight bytes a step
 * (a fixed-size memcpy compiles to one load): this is the hot path. */
__attribute__((no_sanitize("thread"))) static inline int
bytes_match(const char *x, const char *y, size_t len) {
  uint64_t a, b;
  if (len < 8) {
    for (size_t i = 0; i < len; i++)
      if (x[i] != y[i])
        return 0;
    return 1;
  }
  for (size_t i = 0; i + 8 <= len; i += 8) {
    memcpy(&a, x + i, 8);
    memcpy(&b, y + i, 8);
    if (a != b)
      return 0;
  }
  /* the last 8 bytes, overlapping what was compared: no tail loop */
  memcpy(&a, x + len - 8, 8);
  memcpy(&b, y + len - 8, 8);
  return a == b;
}

__attribute__((no_sanitize("thread"))) static int
key_matches(const struct throttle__rec *r, const char *key, size_t len) {
  return r->key_len == len && bytes_match(r->key, key, len);
}

/* Zero a record except its futex word, which must keep moving for sleepers.
 * The words before `state` are read without the mutex (a lock-free reader
 * may still look at a record being recycled, and then discards what it
 * read): they are cleared with atomic stores, since plain ones there would
 * be data races. */
static void wipe_rec(struct throttle__rec *r) {
  _Static_assert(offsetof(struct throttle__rec, not_before) <
                         offsetof(struct throttle__rec, state) &&
                     offsetof(struct throttle__rec, probe_ticket) <
                         offsetof(struct throttle__rec, state) &&
                     offsetof(struct throttle__rec, key_len) <
                         offsetof(struct throttle__rec, state),
                 "the lock-free words come first");
  atomic_store_explicit(&r->not_before, 0, memory_order_relaxed);
  __atomic_store_n(&r->flags, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&r->key_len, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&r->probe_ticket, 0, __ATOMIC_RELAXED);
  memset((char *)r + offsetof(struct throttle__rec, state), 0,
         sizeof *r - offsetof(struct throttle__rec, state));
}

/* A per-thread guess of where a key lives, found by the address of the
 * caller's key string: loaders ask about the same few keys again and again,
 * usually from the same buffer.  The address only chooses where to look; a
 * guess is only a hint: it is used after checking, under an unchanged even
 * sequence, that the record it names holds this very key (its bytes), so a
 * stale or wrong guess costs one miss, never a wrong answer.  It saves the
 * hash and the probe walk on the hot path. */
#define GUESS_SETS 16 /* two ways each: 32 x 8 bytes of TLS per thread */
struct guess {
  uint32_t idx; /* a record index + 1 (0: none), with GUESS_SCOPES: see seq */
  uint32_t seq; /* with GUESS_SCOPES in idx: the key's scopes were open
                   under hdr->sgen == seq */
};
#define GUESS_SCOPES 0x40000000u /* beyond any record index */
static THROTTLE__TLS struct guess guess[GUESS_SETS][2];

/* A negative guess: a key's scopes (scope.c) are looked up on every check
 * of the key, and are usually never named; without it each check of an
 * open key paid a hash and a walk for its absent scope.  An absent key has
 * no record to check a guess against, so the guess keeps the key's bytes
 * (keys up to ABSENT_COPY bytes; longer ones are looked up each time) and
 * is used only for the same bytes: one buffer holds many keys in turn (a
 * loop over table names, a binding's runtime reusing a string's address).
 * Its way is chosen by the bytes, not the address, so one scope named by
 * many buffers (every table's key) takes one.  Valid only while the
 * table's sequence is the one it was seen under: any insert, evict or
 * rebuild changes it. */
#define ABSENT_WAYS 6
#define ABSENT_COPY 72 /* 6 x 80 bytes of TLS per thread */
static THROTTLE__TLS struct absent {
  uint32_t seq; /* tseq when seen absent */
  uint32_t len; /* 0: nothing */
  char key[ABSENT_COPY];
} absent[ABSENT_WAYS];

/* Every guess is about one segment: the one whose random seed this is.
 * A thread that turns to another segment forgets them all (a handle's
 * address is no identity: a closed handle's is handed to the next one
 * opened, and a segment made afresh under the same name counts its
 * sequences from the start again).  A thread that alternates between two
 * segments pays lookups for it; one segment per process is the rule.
 * (The library's thread-local state must fit glibc's static TLS surplus
 * when it is dlopen'ed: internal.h.) */
static THROTTLE__TLS uint64_t guess_seed; /* 0 at first: all empty then */

static inline void guess_bind(const throttle_t *h) {
  if (__builtin_expect(guess_seed == h->seed, 1))
    return;
  memset(guess, 0, sizeof guess);
  memset(absent, 0, sizeof absent);
  guess_seed = h->seed;
}

static struct guess *guess_set(const char *key, size_t len) {
  uint64_t x = ((uint64_t)(uintptr_t)key ^ len) * UINT64_C(0x9e3779b97f4a7c15);
  return guess[x >> 60]; /* top 4 bits: 0..15 */
}

/* The length and the first and last bytes: what tells apart the names a
 * loader asks about (table names of one length differ at the end). */
static struct absent *absent_way(const char *key, size_t len) {
  uint32_t x = (uint32_t)len * 0x9e37u + (unsigned char)key[0] * 0x79b9u +
               (unsigned char)key[len - 1] * 0x7f4bu;
  return &absent[((x & 0xffffu) * ABSENT_WAYS) >> 16];
}

/* A guess that names a record holding this key, or UINT32_MAX. */
__attribute__((no_sanitize("thread"))) static uint32_t
try_guess(const throttle_t *h, const struct guess *g, const char *key,
          size_t len) {
  uint32_t idx = (g->idx & ~GUESS_SCOPES) - 1; /* none: UINT32_MAX */
  if (idx >= h->capacity)
    return UINT32_MAX;
  const struct throttle__rec *r = &h->recs[idx];
  return r->state == THROTTLE__REC_USED && key_matches(r, key, len)
             ? idx
             : UINT32_MAX;
}

/* The records may change under us; the sequence check tells. The race is
 * intended (a seqlock), hence no thread-sanitizer instrumentation here. */
__attribute__((no_sanitize("thread"))) int
throttle__find_nolock(const throttle_t *h, const char *key, size_t len,
                      uint32_t *idx, uint32_t *seq, bool guessed_only) {
  uint32_t s = atomic_load_explicit(&h->hdr->tseq, memory_order_acquire);
  if (s & 1)
    return guessed_only ? THROTTLE__NOT_GUESSED : -1;
  guess_bind(h);
  int found = 0;
  struct guess *set = guess_set(key, len);
  uint32_t gi = try_guess(h, &set[0], key, len);
  if (gi == UINT32_MAX)
    gi = try_guess(h, &set[1], key, len);
  struct absent *a = NULL;
  if (gi != UINT32_MAX) {
    *idx = gi;
    found = 1;
  } else if ((a = absent_way(key, len))->len == len && a->seq == s &&
             bytes_match(a->key, key, len)) {
    *seq = s; /* absent under this very sequence: still absent */
    return 0;
  } else if (guessed_only) {
    return THROTTLE__NOT_GUESSED;
  }
  if (!found) {
    uint64_t hash = throttle__hash(h->seed, key, len);
    uint32_t tag = (uint32_t)hash;
    uint32_t pos = (uint32_t)(hash >> 32) & h->bucket_mask;
    for (uint32_t i = 0; i < THROTTLE__MAX_PROBE; i++) {
      uint64_t b = atomic_load_explicit(
          &h->buckets[(pos + i) & h->bucket_mask], memory_order_acquire);
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
        set[1] = set[0]; /* the newest guess first, the older kept */
        set[0] = (struct guess){ri + 1, s};
        break;
      }
    }
  }
  *seq = s;
  atomic_thread_fence(memory_order_acquire);
  if (atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed) != s)
    return -1;
  if (!found && len <= ABSENT_COPY) { /* seen absent under s */
    a = absent_way(key, len);
    memcpy(a->key, key, len);
    a->len = (uint32_t)len;
    a->seq = s;
  }
  return found;
}

/* The claim is tied to the record the lookup just validated (its bytes):
 * the caller's buffer may hold another key now, but then it is not found
 * at idx, or an insert (which changes sgen) put it there. */
bool throttle__guess_scopes_open(const throttle_t *h, const char *key,
                                 size_t len, uint32_t idx, uint32_t gen) {
  (void)h; /* bound by the lookup that found idx */
  const struct guess *set = guess_set(key, len);
  for (int w = 0; w < 2; w++)
    if (set[w].idx == ((idx + 1) | GUESS_SCOPES) && set[w].seq == gen)
      return true;
  return false;
}

void throttle__guess_note_scopes(const throttle_t *h, const char *key,
                                 size_t len, uint32_t idx, uint32_t gen) {
  guess_bind(h); /* the look that found idx bound them; cheap */
  struct guess *set = guess_set(key, len);
  for (int w = 0; w < 2; w++)
    if ((set[w].idx & ~GUESS_SCOPES) == idx + 1) {
      set[w].idx = (idx + 1) | GUESS_SCOPES;
      set[w].seq = gen;
    }
}

/* Every record that holds key, read without the mutex and without the
 * index (a writer stopped between the two bumps of the sequence leaves
 * every lock-free lookup unstable, yet the not-befores stay readable): the
 * latest not-before among them, unbounded (the caller bounds it).  A torn
 * read can only name a wrong not-before, which the bound keeps within one
 * maximum delay (I8).  O(capacity): for a caller that is failing open. */
__attribute__((no_sanitize("thread"))) uint64_t
throttle__scan_nb_nolock(const throttle_t *h, const char *key, size_t len) {
  uint64_t most = 0;
  for (uint32_t i = 0; i < h->capacity; i++) {
    const struct throttle__rec *r = &h->recs[i];
    if (r->state != THROTTLE__REC_USED || !key_matches(r, key, len))
      continue;
    uint64_t v = atomic_load_explicit(&r->not_before, memory_order_acquire);
    if (v > most)
      most = v;
  }
  return most;
}

bool throttle__seq_still(const throttle_t *h, uint32_t seq) {
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed) == seq;
}

/* The bucket holding key, or -1; *rec (may be NULL) gets the record index
 * it names, as checked: the bucket is shared memory, and read again it
 * could name anything. */
static int32_t find_bucket_locked(throttle_t *h, const char *key, size_t len,
                                  uint64_t hash, uint32_t *rec) {
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
        key_matches(&h->recs[ri], key, len)) {
      if (rec != NULL)
        *rec = ri;
      return (int32_t)bi;
    }
  }
  return -1;
}

struct throttle__rec *throttle__find_locked(throttle_t *h, const char *key,
                                            size_t len, uint64_t hash) {
  uint32_t ri;
  if (find_bucket_locked(h, key, len, hash, &ri) < 0)
    return NULL;
  return &h->recs[ri];
}

/* The record at idx if it holds key, else NULL: the index a caller kept
 * from an earlier lookup (a ticket's), checked as a bucket's would be,
 * since the record may have been evicted and reused meanwhile. */
struct throttle__rec *throttle__rec_at_locked(throttle_t *h, uint32_t idx,
                                              const char *key, size_t len) {
  if (idx >= h->capacity)
    return NULL;
  struct throttle__rec *r = &h->recs[idx];
  return r->state == THROTTLE__REC_USED && key_matches(r, key, len) ? r
                                                                    : NULL;
}

static void seq_begin(throttle_t *h) {
  atomic_fetch_add_explicit(&h->hdr->tseq, 1, memory_order_acq_rel);
  atomic_thread_fence(memory_order_release);
}

static void seq_end(throttle_t *h) {
  atomic_fetch_add_explicit(&h->hdr->tseq, 1, memory_order_release);
  throttle__scope_touch(h); /* what a key's scopes are may have changed */
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
    /* key_len read once: a writer may change it under the mutex. */
    size_t kl = __atomic_load_n(&r->key_len, __ATOMIC_RELAXED);
    int ok = r->state == THROTTLE__REC_USED && kl >= 1 &&
             kl <= THROTTLE__KEY_MAX && memchr(r->key, 0, kl) == NULL;
    if (ok) {
      r->key[kl] = 0;
      uint64_t hash = throttle__hash(h->seed, r->key, kl);
      r->hash = (uint32_t)hash;
      uint32_t ki = i;
      /* (A bucket naming this very record, written into the index while
       * it is rebuilt, is not a second copy of the key.) */
      int32_t bi = find_bucket_locked(h, r->key, kl, hash, &ki);
      if (bi >= 0 && ki != i) {
        /* The same key twice (a writer died mid-insert, or a bad writer):
         * keep one, with the later not-before of the two (never early). */
        struct throttle__rec *keep = &h->recs[ki];
        uint64_t nb =
            atomic_load_explicit(&r->not_before, memory_order_relaxed);
        if (nb > atomic_load_explicit(&keep->not_before, memory_order_relaxed))
          atomic_store_explicit(&keep->not_before, nb, memory_order_relaxed);
        ok = 0;
      } else if (bi < 0 && place_bucket(h, hash, i) != 0) {
        /* No room in the index (only garbage written into it meanwhile can
         * do that): keep the record, holders and all, unindexed; the next
         * insert of its key finds it by its scan. */
      }
    }
    if (ok) {
      h->hdr->used++;
    } else {
      wipe_rec(r);
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

/* The index and the free list rebuilt from the records, for the repair
 * after a crash (repair.c): with the mutex held and the sequence odd. */
void throttle__rebuild_locked(throttle_t *h) { rebuild_locked(h); }


/* Full table: a linear scan for the least recently used idle key.  It runs
 * only when a new key arrives at a full table, so its O(capacity) cost is
 * paid by that insert alone; an approximate (sampled) LRU was rejected
 * because the contract promises the least recently used. */
#define REAP_TRIES 8

/* No idle key: keys whose only participants are dead (or past their
 * lease) would otherwise never be reaped when nobody waits on them, and
 * could fill the table.  The least recently used of the keys held only by
 * slots are reaped, up to REAP_TRIES of them (reading /proc costs
 * microseconds a slot, so the work under the mutex stays bounded), and the
 * first that comes out idle is the victim. */
static uint32_t reap_victim_locked(throttle_t *h, uint64_t now) {
  uint32_t tried[REAP_TRIES] = {0};
  for (int n = 0; n < REAP_TRIES; n++) {
    uint32_t best = UINT32_MAX;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t i = 0; i < h->capacity; i++) {
      const struct throttle__rec *r = &h->recs[i];
      if (r->state != THROTTLE__REC_USED || r->last_use_ns >= oldest ||
          atomic_load_explicit(&r->not_before, memory_order_relaxed) > now)
        continue;
      bool seen = false;
      for (int k = 0; k < n && !seen; k++)
        seen = tried[k] == i;
      if (!seen) {
        oldest = r->last_use_ns;
        best = i;
      }
    }
    if (best == UINT32_MAX)
      return UINT32_MAX;
    if (throttle__reap_idle_locked(h, &h->recs[best], now))
      return best;
    tried[n] = best;
  }
  return UINT32_MAX;
}

static int evict_one_locked(throttle_t *h, uint64_t now) {
  uint32_t victim = UINT32_MAX;
  uint64_t oldest = UINT64_MAX;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state == THROTTLE__REC_USED && throttle__rec_idle(h, r, now) &&
        r->last_use_ns < oldest) {
      oldest = r->last_use_ns;
      victim = i;
    }
  }
  if (victim == UINT32_MAX)
    victim = reap_victim_locked(h, now);
  if (victim == UINT32_MAX)
    return -1;
  struct throttle__rec *r = &h->recs[victim];
  /* key_len is shared memory: hashing a damaged one would read past the
   * record (and the mapping).  Such a record has no findable bucket; a
   * stale one pointing at it matches no key and goes at the next rebuild. */
  int32_t bi = -1;
  size_t kl = __atomic_load_n(&r->key_len, __ATOMIC_RELAXED); /* once */
  if (kl >= 1 && kl <= THROTTLE__KEY_MAX)
    bi = find_bucket_locked(h, r->key, kl, throttle__hash(h->seed, r->key, kl),
                            NULL);
  if (bi >= 0) {
    atomic_store_explicit(&h->buckets[bi], THROTTLE__TOMB,
                          memory_order_release);
    h->hdr->tombstones++;
  }
  THROTTLE__CRASHPOINT("table-mid-evict"); /* unfindable, not yet free */
  wipe_rec(r);
  /* Keep the futex word moving so a sleeper on the old key re-checks. */
  atomic_fetch_add_explicit(&r->epoch, 1, memory_order_release);
  r->next_free = h->hdr->free_head;
  h->hdr->free_head = victim + 1;
  if (h->hdr->used > 0)
    h->hdr->used--;
  if (h->hdr->evictions < UINT64_MAX)
    h->hdr->evictions++;
  return 0;
}

/* Does a free-list head (record index + 1) name a free record? */
static bool free_at(const throttle_t *h, uint32_t fi) {
  return fi != 0 && fi <= h->capacity &&
         h->recs[fi - 1].state == THROTTLE__REC_FREE;
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
  /* The index said "absent", but the records are the truth: a damaged
   * bucket (I8) must not make a second record for a key, which would
   * count its holders apart and admit over its cap (I5).  So a miss scans
   * the records once: O(capacity), paid only when a key is new to the
   * table.  A key found this way is indexed again. */
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *c = &h->recs[i];
    if (c->state == THROTTLE__REC_USED && key_matches(c, key, len)) {
      c->hash = (uint32_t)hash;
      if (place_bucket(h, hash, i) != 0)
        rebuild_locked(h);
      seq_end(h);
      *out = c;
      return 0;
    }
  }
  int rc = 0;
  if (h->hdr->tombstones > (h->bucket_mask + 1) / 4)
    rebuild_locked(h);
  /* free_head is shared memory that a hostile writer may change at any
   * instant, even under the mutex (I8): it is read once per use and
   * checked before it indexes anything. */
  uint32_t fi = __atomic_load_n(&h->hdr->free_head, __ATOMIC_RELAXED);
  if (!free_at(h, fi)) {
    if (fi != 0) /* damaged free list: rebuild before trusting it */
      rebuild_locked(h);
    fi = __atomic_load_n(&h->hdr->free_head, __ATOMIC_RELAXED);
    if (fi == 0 && evict_one_locked(h, now) != 0) {
      rc = throttle__fail(h, THROTTLE_EFULL,
                          "%s: all %u keys are in use (a back-off, a lock "
                          "episode, a setting or a holder); raise "
                          "THROTTLE_KEYS (and throttlectl rm) or wait",
                          h->name, h->capacity);
      goto out;
    }
    /* Checked as the first read was: a head written again since the
     * rebuild could name a record in use, which would be wiped under its
     * holders and its key made anew beside them (I5). */
    fi = __atomic_load_n(&h->hdr->free_head, __ATOMIC_RELAXED);
    if (!free_at(h, fi)) {
      rc = throttle__fail(h, THROTTLE_ECORRUPT,
                          "%s: the free list changed under the mutex "
                          "(a writer outside the library)",
                          h->name);
      goto out;
    }
  }
  uint32_t idx = fi - 1;
  r = &h->recs[idx];
  h->hdr->free_head = r->next_free <= h->capacity ? r->next_free : 0;
  wipe_rec(r);
  memcpy(r->key, key, len);
  r->key_len = (uint16_t)len;
  r->hash = (uint32_t)hash;
  r->last_use_ns = now;
  r->state = THROTTLE__REC_USED;
  THROTTLE__CRASHPOINT("table-mid-insert"); /* in use, no bucket yet */
  if (place_bucket(h, hash, idx) != 0) {
    rebuild_locked(h); /* sweeps tombstones, places r too */
    if (find_bucket_locked(h, key, len, hash, NULL) < 0) {
      wipe_rec(r);
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
  throttle__scope_seed_locked(h, r, now); /* what its siblings learned */
  *out = r;
out:
  seq_end(h);
  return rc;
}
