/* SPDX-License-Identifier: MIT */
/*
 * internal.h — the shared-memory layout and the functions the library's
 * files share (prefix throttle__).  Nothing here is installed.
 *
 * Layout of a segment (all offsets, no pointers):
 *
 *   [0, header_size)                 struct throttle__hdr
 *   [header_size, +nbuckets*8)       hash index: uint64 buckets
 *   [records_off, +capacity*recsize) struct throttle__rec[capacity]
 *
 * A bucket is 0 (empty), THROTTLE__TOMB (deleted) or (hash32 << 32 | idx+1).
 * The records are the truth; the index and the free list are derived and are
 * rebuilt from the records by the repair after a crash.
 */
#ifndef THROTTLE_INTERNAL_H
#define THROTTLE_INTERNAL_H

#include "throttle.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define THROTTLE__MAGIC UINT64_C(0x5448524f54544c31) /* "THROTTL1" */
#define THROTTLE__LAYOUT 6u
#define THROTTLE__KEY_MAX 255u
#define THROTTLE__CACHELINE 64
#define THROTTLE__MAX_PROBE 64u       /* bound on any index walk */
#define THROTTLE__TOMB UINT64_MAX
#define THROTTLE__MAX_CAPACITY 1048576u
#define THROTTLE__DEFAULT_CAPACITY 4096u
#define THROTTLE__DEFAULT_MAX_DELAY_MS UINT64_C(900000)
#define THROTTLE__DEFAULT_LOCK_TIMEOUT_MS 2000u
#define THROTTLE__JITTER_MAX_NS UINT64_C(25000000)
#define THROTTLE__NS_PER_MS UINT64_C(1000000)
#define THROTTLE__POLL_NS (250 * THROTTLE__NS_PER_MS) /* sleepers re-check */
/* how long a cold scope's first request holds the keys beneath (scope.c) */
#define THROTTLE__COLD_HOLD_NS (1000 * THROTTLE__NS_PER_MS)

enum { THROTTLE__REC_FREE = 0, THROTTLE__REC_USED = 0x55534544u /* "USED" */ };

/* Header.  The first line identifies the segment and never changes after
 * the magic is written; the mutex and the table bookkeeping each get their
 * own cache line so lock traffic does not bounce the identity line that
 * every lock-free reader touches. */
struct throttle__hdr {
  _Atomic uint64_t magic; /* written last, with release ordering */
  uint32_t layout;
  uint32_t header_size;
  uint64_t fingerprint;
  uint64_t total_size;
  uint32_t capacity;
  uint32_t nbuckets; /* power of two, >= 2 * capacity */
  uint32_t record_size;
  uint32_t records_off;
  uint64_t seed;
  uint64_t created_ns;
  uint32_t creator_pid;
  uint32_t flags;

  _Alignas(THROTTLE__CACHELINE) pthread_mutex_t mutex;

  /* Bumped to odd before and to even after any change of which record holds
   * which key (insert, evict, index rebuild), so lock-free readers can tell
   * that what they read was stable. */
  _Alignas(THROTTLE__CACHELINE) _Atomic uint32_t tseq;
  /* Bumped after any change that can make an open key's scope hold it (a
   * publish, a pause or any other setting, a probe sent out, a cold
   * scope's episode, and any insert, evict or repair): a reader that saw
   * every scope of a key open under this value knows they still are
   * (table.c's guesses keep that, and scope.c's quiet scopes). */
  _Atomic uint32_t sgen;
  uint32_t used;
  uint32_t free_head; /* record index + 1, 0 = none */
  uint32_t tombstones;
  uint64_t evictions;
  uint64_t repairs;
  /* Admission tickets: one sequence for the whole segment, never reset,
   * so a ticket names one admission for the segment's lifetime (a
   * per-key count restarted when a key was evicted and reused, and a
   * stale ticket then matched a new holder's slot). */
  uint64_t next_ticket;
  /* The fleet's maximum delay: the most a publisher may store, set by the
   * creator (its max delay) and changed with throttle_set_segment_max_delay.
   * A process's own max delay bounds only what it honours (I1); read
   * without the mutex, bounded on every read (throttle__seg_max_ns). */
  _Atomic uint64_t max_delay_ns;
};

/* Participants of one key: holders and waiters.  Callers beyond
 * THROTTLE__SLOTS participants wait on the record's epoch with their
 * arrival ticket until a slot frees (see gate_enter.c); caps are therefore at
 * most THROTTLE__SLOTS. */
#define THROTTLE__SLOTS 32u
#define THROTTLE__DEFAULT_LEASE_MS UINT64_C(600000)
enum {
  THROTTLE__SLOT_FREE = 0,
  THROTTLE__SLOT_WAITING = 1,
  THROTTLE__SLOT_HOLDING = 2,
  THROTTLE__SLOT_CANCELED = 3,
};

/* slot->probe of a holder: granted by the segment in turn (0), as the
 * probe of a lock episode (1), or admitted by a backend across hosts and
 * kept here as held by its process (2: api/backend.c, segment_ops.c). */
#define THROTTLE__SLOT_BY_BACKEND 2

struct throttle__slot {
  _Atomic uint32_t word; /* futex: bumped when the slot is granted/canceled */
  uint8_t state;         /* THROTTLE__SLOT_* */
  uint8_t cls;           /* throttle_class_t */
  uint8_t probe;         /* how it was granted (above) */
  uint8_t concurrent;    /* holders (with it) when it was granted */
  uint32_t pid;
  uint32_t lease_ms; /* how long a grant may be held before reclaim */
  uint64_t start;    /* process start time (clock ticks), against pid reuse */
  uint64_t pidns;    /* inode of the holder's PID namespace, 0 = unknown */
  uint64_t ticket;   /* segment-wide arrival number: FIFO order, identity */
  uint64_t since_ns; /* arrival (waiting) or grant (holding) time */
  uint64_t since_mono_ns; /* the grant on CLOCK_MONOTONIC: the lease's clock */
};

/* What the server said when it last refused a key (throttle_note_refusal,
 * refusal.c): kept as text that is valid UTF-8 without control bytes,
 * cut to these sizes (NUL included), and judged so again when read (I8). */
#define THROTTLE__REFUSAL_CODE 64
#define THROTTLE__REFUSAL_MSG 200
#define THROTTLE__REFUSAL_RA 64
#define THROTTLE__REFUSAL_HOST 64
struct throttle__refusal {
  uint64_t wall_ns; /* CLOCK_REALTIME of the note; 0 = none */
  uint32_t pid;     /* of the process that noted it */
  uint16_t status;  /* HTTP status, 100..999 */
  uint16_t pad_;
  char code[THROTTLE__REFUSAL_CODE];   /* error.code, "" when none */
  char msg[THROTTLE__REFUSAL_MSG];     /* error.message, "" when none */
  char ra[THROTTLE__REFUSAL_RA];       /* the Retry-After field as sent */
  char host[THROTTLE__REFUSAL_HOST];   /* the noting process's host name */
};

/* One key.  Line 0 holds what the lock-free path reads. */
struct throttle__rec {
  /* Read without the mutex (written with atomic stores under it): */
  _Atomic uint64_t not_before; /* ns on the throttle clock; 0 = open */
  _Atomic uint32_t epoch;      /* futex word: bumped when waiters must look */
  uint16_t flags;              /* THROTTLE__REC_* */
  uint16_t key_len;
  uint64_t probe_ticket; /* 0 = no probe out */
  /* Written and read under the mutex only, from here on: */
  uint32_t state; /* THROTTLE__REC_FREE / _USED */
  uint32_t hash;  /* low half of the key's hash */
  /* The key follows at once, so a lookup of a key up to 32 bytes touches
   * one cache line of the record (the not-before is in it too). */
  char key[THROTTLE__KEY_MAX + 1];
  uint32_t next_free; /* free list link, record index + 1 */
  uint32_t last_pid;
  uint64_t last_use_ns;
  /* counters (saturating) */
  uint64_t publishes;
  uint64_t waits;
  uint64_t waited_ns;
  uint64_t last_delay_ms;
  uint64_t clears;

  /* Admission (gate_enter.c).  Settings: */
  uint32_t fixed_cap;     /* 0 = auto */
  uint32_t share_permille; /* backfill share, 0..1000; see REC_SHARE_SET */
  uint32_t rate_n;        /* 0 = no rate */
  uint32_t cancel_gen;    /* bumped by throttle_cancel */
  uint64_t rate_period_ns;
  /* State: */
  uint64_t rate_tat_ns; /* GCRA theoretical arrival time */
  uint64_t last_reap_ns;
  /* The learned cap (gate_learn.c; docs/LEARNED-CAP.md).  Each field is
   * bounded where it is read (throttle__learn_bound_locked). */
  uint32_t auto_cap;      /* learned cap, 1..bound */
  uint32_t auto_good;     /* largest cap used in full, no refusal; 0 none */
  uint32_t auto_fail_cap; /* the cap whose raise was refused last; 0 none */
  uint32_t auto_fails;    /* failed raises since the last good one */
  uint32_t auto_max;      /* bound of auto:MAX; 0 = THROTTLE__SLOTS */
  uint32_t auto_ra_ms;    /* Retry-After of the refusal that taught the cap */
  uint64_t auto_work_ns;  /* work at the cap since learned or raised */
  uint64_t auto_learned_ns; /* when a refusal last set the cap; 0 = never */
  uint32_t ovf_waiters;   /* callers waiting beyond the slots: a count
                             for the snapshot's waiters and a hint for
                             the wakes (a crashed one leaves it high until
                             the reap finds it stale: ovf_free_ns) */
  uint32_t ovf_bf;        /* of those, of class backfill */
  uint32_t ovf_gen;       /* bumped when the reap drops a stale count: a
                             caller counted in another generation counts
                             itself again at its next look (gate_enter.c) */
  /* Callers about to sleep on a slot word of this key: counted under the
   * mutex before they unlock, uncounted after the sleep.  A grant wakes
   * the slot's futex only when it is non-zero (gate_enter.c), so an uncontended
   * admission makes no system call.  A crashed sleeper leaves it high,
   * costing wakes, never a lost one. */
  _Atomic uint32_t sleepers;
  /* Since when a slot has been free while callers beyond the slots are
   * counted (0: not so).  They look at least every THROTTLE__POLL_NS and
   * take a free slot when they do, so a slot free for longer than a few
   * of those says the count is of callers that are gone (gate_rec.c). */
  uint64_t ovf_free_ns;
  /* Counters: */
  uint64_t admitted;
  uint64_t locked;
  uint64_t probes;
  uint64_t reclaims;
  uint64_t canceled;
  uint64_t permanent;
  struct throttle__refusal refusal; /* the last one, as noted */
  struct throttle__slot slot[THROTTLE__SLOTS];
} __attribute__((aligned(THROTTLE__CACHELINE)));

/* rec->flags */
enum {
  THROTTLE__REC_EPISODE = 1u << 0,   /* back-off published, no probe OK yet */
  THROTTLE__REC_PAUSED = 1u << 1,
  THROTTLE__REC_SHARE_SET = 1u << 2, /* share_permille is explicit */
  /* A scope an answer has come back to from beneath (scope.c: until then
   * one admission beneath goes first). */
  THROTTLE__REC_ANSWERED = 1u << 3,
};

/* Lock-free: 1 paused, 2 probe out, 0 neither.  A torn read only makes a
 * waiter look again (it re-checks after every wake).  Inline: it is on the
 * hot path of throttle_wait(). */
static inline int throttle__gate_held(const struct throttle__rec *r) {
  uint16_t flags = __atomic_load_n(&r->flags, __ATOMIC_ACQUIRE);
  if (flags & THROTTLE__REC_PAUSED)
    return 1;
  if ((flags & THROTTLE__REC_EPISODE) &&
      __atomic_load_n(&r->probe_ticket, __ATOMIC_ACQUIRE) != 0)
    return 2;
  return 0;
}

/* The key's cap now: fixed, else learned; 1..THROTTLE__SLOTS whatever the
 * record says. */
static inline uint32_t throttle__cap_of(const struct throttle__rec *r) {
  uint32_t c = r->fixed_cap ? r->fixed_cap : r->auto_cap;
  if (r->fixed_cap == 0 && r->auto_max >= 1 && c > r->auto_max)
    c = r->auto_max; /* auto:MAX bounds the learned cap */
  if (c < 1)
    c = 1;
  if (c > THROTTLE__SLOTS)
    c = THROTTLE__SLOTS;
  return c;
}

/* Backfill's share of the cap in thousandths (1000 unless set). */
static inline uint32_t throttle__share_of(const struct throttle__rec *r) {
  if (!(r->flags & THROTTLE__REC_SHARE_SET))
    return 1000;
  return r->share_permille > 1000 ? 1000 : r->share_permille;
}

/* Most backfill holders for a cap (share of it, at least 1 unless 0). */
static inline uint32_t throttle__backfill_cap(const struct throttle__rec *r,
                                              uint32_t cap) {
  uint32_t share = throttle__share_of(r);
  if (share == 0)
    return 0;
  uint32_t n = (uint32_t)(((uint64_t)cap * share) / 1000);
  return n < 1 ? 1 : n;
}

/* GCRA with burst n: an admission at `now` conforms when
 * tat - (n - 1) * T <= now, T = period / n.  *ready is when it will. */
uint64_t throttle__sat_add(uint64_t a, uint64_t b); /* clock.c */
static inline bool throttle__rate_allows(const struct throttle__rec *r,
                                         uint64_t now, uint64_t *ready) {
  if (r->rate_n == 0)
    return true;
  uint64_t T = r->rate_period_ns / r->rate_n;
  uint64_t tau = T * (r->rate_n - 1);
  uint64_t earliest = r->rate_tat_ns > tau ? r->rate_tat_ns - tau : 0;
  if (earliest <= now)
    return true;
  *ready = earliest;
  return false;
}

static inline void throttle__rate_take(struct throttle__rec *r,
                                       uint64_t now) {
  if (r->rate_n == 0)
    return;
  uint64_t T = r->rate_period_ns / r->rate_n;
  uint64_t base = r->rate_tat_ns > now ? r->rate_tat_ns : now;
  r->rate_tat_ns = throttle__sat_add(base, T);
}

/* Are the callers counted beyond the slots (ovf_waiters) gone?  While
 * they are counted and a slot is free, a live one takes it at its next
 * look (at most THROTTLE__POLL_NS away), so a slot free for a few of
 * those since ovf_free_ns says the count is of callers that died waiting
 * beyond the slots.  Read-only: the snapshot shows them gone, the reap
 * drops them (gate_rec.c). */
#define THROTTLE__OVF_STALE_NS (4 * THROTTLE__POLL_NS)
static inline bool throttle__ovf_stale(const struct throttle__rec *r,
                                       uint64_t now) {
  if (r->ovf_waiters == 0 || r->ovf_free_ns == 0 || r->ovf_free_ns > now ||
      now - r->ovf_free_ns <= THROTTLE__OVF_STALE_NS)
    return false;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state == THROTTLE__SLOT_FREE)
      return true;
  return false;
}

/* Participant slots in state (and of class cls, unless cls < 0). */
static inline uint32_t throttle__count_slots(const struct throttle__rec *r,
                                             int state, int cls) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < THROTTLE__SLOTS; i++)
    if (r->slot[i].state == state && (cls < 0 || r->slot[i].cls == cls))
      n++;
  return n;
}

/* flags and probe_ticket are read without the mutex (throttle_wait), so
 * their writers, who hold it, store atomically. */
static inline void throttle__rec_flags(struct throttle__rec *r, uint16_t bit,
                                       bool on) {
  if (on)
    __atomic_fetch_or(&r->flags, bit, __ATOMIC_RELEASE);
  else
    __atomic_fetch_and(&r->flags, (uint16_t)~bit, __ATOMIC_RELEASE);
}

struct throttle_config {
  char *segment;
  char *backend; /* URL, or NULL: $THROTTLE_BACKEND (backend.c) */
  uint32_t capacity;
  uint64_t max_delay_ms;
  uint32_t lock_timeout_ms;
  uint64_t lease_ms;
  unsigned flags;
  unsigned set; /* which fields were set explicitly */
  int (*intr)(void *arg); /* throttle_config_set_interrupt */
  void *intr_arg;
  uint32_t intr_period_ms;
};

struct throttle__ops; /* backend.h */

/* The back-off a LOCKED answer publishes without a Retry-After. */
#define THROTTLE__LOCK_DELAY_MS 5000u
/* The outcomes that publish a back-off. */
static inline bool throttle__outcome_publishes(throttle_outcome_t o) {
  return o == THROTTLE_OUTCOME_LOCKED || o == THROTTLE_OUTCOME_RATE_LIMITED ||
         o == THROTTLE_OUTCOME_UNAVAILABLE;
}

/* An admission (throttle_enter): made by throttle__ticket_new
 * (shm/gate_enter.c), served by the handle's backend (backend.h). */
struct throttle_ticket {
  throttle_t *h;
  throttle_class_t cls;
  uint64_t hash; /* of the key, once hash_ok (ticket_hash) */
  bool hash_ok;
  uint64_t ticket;
  uint32_t slot;
  uint32_t rec; /* the key's record when admitted (a hint, checked again) */
  int probe;
  /* Granted by its own enter while every scope of the key was quiet
   * (scope.c), under hdr->sgen == quiet_gen: then it holds no place in
   * any scope, and while sgen is unchanged its leave has nothing to
   * report to them. */
  bool quiet;
  uint32_t quiet_gen;
  size_t len;
  void *be; /* the backend's admission (backend.h), or NULL */
  char key[THROTTLE__KEY_MAX + 1];
};

struct throttle {
  char name[256];
  int shared;
  void *base;
  size_t size;
  struct throttle__hdr *hdr;
  _Atomic uint64_t *buckets;
  struct throttle__rec *recs;
  uint32_t capacity; /* validated copies of header fields */
  uint32_t bucket_mask;
  uint64_t seed;
  uint64_t max_delay_ns;
  uint32_t lock_timeout_ms;
  uint32_t lease_ms;
  unsigned flags;
  int (*intr)(void *arg); /* the caller's interrupt check, or NULL */
  void *intr_arg;
  uint64_t intr_period_ns;
  char open_msg[512]; /* why the handle fell back, or "" */
  /* THROTTLE_READONLY: the segment mapped PROT_READ; base is then a
   * private copy refreshed under ro_lock by throttle__lock (segment.c). */
  const void *ro_src;
  pthread_mutex_t ro_lock;
  /* The process whose ro_lock this is (its pid), or, with bit 32 set, the
   * process making it afresh: a forked child's copy may be held by a
   * thread the child does not have (segment.c, ro_lock). */
  _Atomic uint64_t ro_owner;
  /* CLOCK_MONOTONIC ns before which throttle__lock_brief tries once. */
  _Atomic uint64_t brief_skip_until;
  struct throttle__be *be; /* a backend across hosts, or NULL (backend.c) */
  /* the table of operations the public calls go through (backend.h):
   * &throttle__segment_ops, or &throttle__remote_ops while be is open */
  const struct throttle__ops *ops;
  /* throttle_set_publish_level(): per outcome (LOCKED, RATE_LIMITED,
   * UNAVAILABLE), where its back-off goes; bit o of publish_set says
   * publish_level[o] was set (scope.c has the defaults). */
  int16_t publish_level[4];
  uint8_t publish_set;
};

struct throttle_info {
  char key[THROTTLE__KEY_MAX + 1];
  int64_t field[THROTTLE_FIELD_COUNT_];
  uint32_t nholders, nwaiters;
  struct throttle__party {
    uint32_t pid;
    uint8_t cls;
    uint8_t probe;
    uint64_t age_ms; /* since the grant (holder) or the arrival (waiter) */
    char host[64];   /* "" on the segment */
  } holder[THROTTLE__SLOTS], waiter[THROTTLE__SLOTS]; /* waiters: FIFO */
  struct throttle__refusal refusal; /* wall_ns 0: none noted */
};

/* Thread-local state of the library.  Initial-exec: a plain %fs-relative
 * access instead of a __tls_get_addr call per use on the hot path (the
 * library is linked at start-up or dlopen'ed with glibc's static TLS
 * surplus, which these few hundred bytes fit). */
#define THROTTLE__TLS __thread __attribute__((tls_model("initial-exec")))

/* error.c */
int throttle__fail(const throttle_t *h, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void throttle__clear_msg(const throttle_t *h);
void throttle__orphan_msg(const throttle_t *h);

/* clock.c */
uint64_t throttle__now_ns(void);
/* clock_gettime() of the kernel's clock, past an interposed C library's
 * (a faked clock, clock.c): for a deadline the kernel will measure. */
int throttle__clock_gettime(clockid_t c, struct timespec *ts);
uint64_t throttle__mono_ns(void);
/* CLOCK_MONOTONIC when the throttle clock read now (just read by the
 * caller): never earlier than the true reading, at most a suspend of up
 * to a second later.  Cheaper than throttle__mono_ns() (clock.c). */
uint64_t throttle__mono_at(uint64_t now);
/* The throttle clock to within a tick, never ahead of throttle__now_ns(),
 * at a tenth of its cost: for stamps that decide nothing (clock.c). */
uint64_t throttle__now_coarse_ns(void);
/* 0, or EINTR when a signal cut the sleep short. */
int throttle__futex_wait(_Atomic uint32_t *word, uint32_t expect,
                         uint64_t rel_ns);
/* Every sleep of the library: throttle__futex_wait() cut into slices of the
 * handle's interrupt period, calling its check between them.  0 (woken,
 * timed out, or returned early: callers re-check), or THROTTLE_EINTR when
 * the check asked to stop (the caller then gives back what it holds). */
int throttle__sleep(const throttle_t *h, _Atomic uint32_t *word,
                    uint32_t expect, uint64_t rel_ns);
void throttle__futex_wake(_Atomic uint32_t *word);
uint64_t throttle__random(void);
uint64_t throttle__sat_add(uint64_t a, uint64_t b);

/* handle.c: THROTTLE_EREADONLY with a message naming what was refused. */
int throttle__readonly_fail(const throttle_t *h, const char *what);

/* segment.c */
int throttle__segment_open(throttle_t *h, const throttle_config_t *cfg);
int throttle__segment_private(throttle_t *h, uint32_t capacity);
void throttle__segment_close(throttle_t *h);
int throttle__lock(throttle_t *h);
/* The mutex for a copy kept beside a backend across hosts: a few ms at
 * most, one try for a second after that failed; no message (segment.c). */
int throttle__lock_brief(throttle_t *h);
void throttle__unlock(throttle_t *h);
uint64_t throttle__fingerprint(void);
int throttle__validate_header(const struct throttle__hdr *hdr, uint64_t size,
                              char *why, size_t whylen);
void throttle__crashpoint(const char *name);

/* table.c */
/* A key's check (include/throttle.h, Conventions): 0, or THROTTLE_EKEY
 * with the reason as h's message; *len its length.  Every entry point
 * makes it before it looks anything up, so this thread's guesses only
 * ever hold checked keys: the open-key path checks the length, asks the
 * guesses alone (throttle__find_nolock with guessed_only), and checks the
 * syntax (key_syntax, after key_len) only when they do not know the key. */
int throttle__check_key(const throttle_t *h, const char *key, size_t *len);
int throttle__key_len(const throttle_t *h, const char *key, size_t *len);
int throttle__key_syntax(const throttle_t *h, const char *key, size_t len);
uint64_t throttle__hash(uint64_t seed, const char *key, size_t len);
/* Lock-free lookup: 1 found (*idx, *seq set), 0 absent, -1 unstable; with
 * guessed_only, THROTTLE__NOT_GUESSED unless this thread's guesses answer
 * (then the key passed throttle__check_key before, unless a writer outside
 * the library put other bytes in the record a guess names: then a bad key
 * skips only its syntax check, and is looked up as any key, I8). */
#define THROTTLE__NOT_GUESSED (-2)
int throttle__find_nolock(const throttle_t *h, const char *key, size_t len,
                          uint32_t *idx, uint32_t *seq, bool guessed_only);
bool throttle__seq_still(const throttle_t *h, uint32_t seq);
/* The latest not-before of the records holding key, by a scan of them all
 * without the mutex or the index (for a caller failing open). */
uint64_t throttle__scan_nb_nolock(const throttle_t *h, const char *key,
                                  size_t len);
/* This thread saw every scope of key, found at record idx, open under
 * hdr->sgen == gen (noted by throttle__guess_note_scopes after a look).
 * Lock-free; only a hint for the open-key path: any publish, pause,
 * probe, insert, evict or repair since changes sgen. */
bool throttle__guess_scopes_open(const throttle_t *h, const char *key,
                                 size_t len, uint32_t idx, uint32_t gen);
void throttle__guess_note_scopes(const throttle_t *h, const char *key,
                                 size_t len, uint32_t idx, uint32_t gen);
struct throttle__rec *throttle__find_locked(throttle_t *h, const char *key,
                                            size_t len, uint64_t hash);
/* The record at idx if it holds key (an index kept from an earlier
 * lookup, checked again), else NULL. */
struct throttle__rec *throttle__rec_at_locked(throttle_t *h, uint32_t idx,
                                              const char *key, size_t len);
int throttle__insert_locked(throttle_t *h, const char *key, size_t len,
                            uint64_t hash, uint64_t now,
                            struct throttle__rec **out);
/* segment_ops.c: the mutex taken and key's record found or made (len as
 * throttle__check_key measured it): 0 with the mutex held, *now read
 * under it and *r set; an error with the mutex released. */
int throttle__lock_record(throttle_t *h, const char *key, size_t len,
                          uint64_t *now, struct throttle__rec **r);
void throttle__init_table(throttle_t *h);
/* The index and free list rebuilt from the records (mutex held, sequence
 * odd). */
void throttle__rebuild_locked(throttle_t *h);
/* repair.c: everything made whole after a crash in the critical section. */
void throttle__repair_locked(throttle_t *h);
/* gate_rec.c: the not-before, pulled in (and stored so) when beyond the
 * segment's maximum delay. */
uint64_t throttle__clamp_nb_locked(throttle_t *h, struct throttle__rec *r,
                                   uint64_t now);
/* The segment's maximum delay, bounded (shared memory is input). */
uint64_t throttle__seg_max_ns(const throttle_t *h);
#define THROTTLE__MAX_MAX_DELAY_MS (UINT64_C(7) * 24 * 3600 * 1000)

/* segment_ops.c: the key's not-before as a lock-free reader sees it (0:
 * absent or open), *rec its record (NULL: absent), *epoch (may be NULL)
 * the record's futex word read with it; the mutex when the table keeps
 * changing under the reader. */
#define THROTTLE__NOLOCK_TRIES 8
int throttle__read_nb(throttle_t *h, const char *key, size_t len, uint64_t *nb,
                      struct throttle__rec **rec, uint32_t *epoch);
/* segment_ops.c: key's back-off dropped in the segment, its waiters woken
 * (a scope's keys too); THROTTLE_ENOKEY (no message) when it has no
 * record there. */
int throttle__segment_clear(throttle_t *h, const char *key, size_t len);

static inline uint64_t throttle__sat_mul_ms(uint64_t ms) {
  return ms > UINT64_MAX / THROTTLE__NS_PER_MS ? UINT64_MAX
                                               : ms * THROTTLE__NS_PER_MS;
}

/* ms until nb, rounded up; 0 when open.  A reading beyond this process's
 * maximum delay is treated as that maximum (its own choice, or a writer
 * that ignored the clamp). */
static inline uint64_t throttle__ms_left(const throttle_t *h, uint64_t nb,
                                         uint64_t now) {
  if (nb <= now)
    return 0;
  uint64_t d = nb - now;
  if (d > h->max_delay_ns)
    d = h->max_delay_ns;
  return (d + THROTTLE__NS_PER_MS - 1) / THROTTLE__NS_PER_MS;
}
/* gate_rec.c: may r be evicted: no slot in use, and nothing else eviction
 * would lose (a not-before, a setting, a lock episode or probe)? */
bool throttle__rec_idle(const throttle_t *h, const struct throttle__rec *r,
                        uint64_t now);

/* segment_backoff.c */
/* The latest not-before of key and its scopes, read without the mutex and
 * bounded by the segment's maximum delay (0: none readable). */
uint64_t throttle__nb_nolock(const throttle_t *h, const char *key,
                             size_t len);
/* throttle_enter() when the mutex is out of reach or the key finds no room
 * (lock_rc): wait out the not-before readable without the mutex, then
 * return lock_rc (fail open), or THROTTLE_EWOULDBLOCK / ETIMEDOUT / EINTR
 * as that wait ends. */
int throttle__honour_nb_unlocked(throttle_t *h, const char *key, size_t len,
                                 int lock_rc, int nowait, uint64_t deadline,
                                 uint64_t *wait_ms);

/* gate_live.c */
/* getpid() without a system call: cached in a page the kernel zeroes in a
 * forked child (MADV_WIPEONFORK), so a child asks again. */
uint32_t throttle__pid(void);
struct throttle__self_id {
  uint64_t start; /* process start time in clock ticks, 0 = unknown */
  uint64_t pidns; /* inode of /proc/self/ns/pid, 0 = unknown */
};
/* This process's identity as recorded in the slots it takes (cached per
 * pid, so a forked child looks again). */
struct throttle__self_id throttle__self_id(void);
/* false only on evidence that the slot's process is gone. */
bool throttle__holder_alive(const struct throttle__slot *s);

/* gate_learn.c */
#define THROTTLE__MAX_AUTO_FAILS 10u
/* One admission's report, as the learner sees it. */
struct throttle__learn_in {
  throttle_outcome_t outcome;
  uint32_t concurrent;     /* holders (with it) when it was granted */
  uint32_t others;         /* holders besides it when it reports */
  uint64_t hold_ns;        /* grant to report */
  uint64_t retry_after_ms; /* as reported, 0 = none given */
  uint64_t max_delay_ms;   /* the most a Retry-After may mean */
  uint64_t now;            /* throttle clock */
};
/* Learn the auto cap from one outcome (the rules: gate_learn.c). */
void throttle__learn_locked(struct throttle__rec *r,
                            const struct throttle__learn_in *in);
/* Bound every learned field (I8): shared memory is input. */
void throttle__learn_bound_locked(struct throttle__rec *r, uint64_t now);
/* The learner's bound: auto_max, else THROTTLE__SLOTS. */
uint32_t throttle__learn_bound(const struct throttle__rec *r);
/* Work still needed before the next raise, in ns: 0 in slow start,
 * UINT64_MAX never (fixed cap, or at the bound). */
uint64_t throttle__learn_next_raise_ns(const struct throttle__rec *r);

/* gate_rec.c: the record as a gate, under the mutex (the grant itself:
 * gate_grant.c). */
static inline void throttle__sat_inc(uint64_t *c) {
  if (*c < UINT64_MAX)
    (*c)++;
}

/* Every writer of a slot word holds the mutex (futex waiters only read
 * it), so a load and a store do what an atomic add would, without the
 * locked instruction: two of those per uncontended admission. */
static inline void throttle__slot_bump(struct throttle__slot *s) {
  atomic_store_explicit(
      &s->word, atomic_load_explicit(&s->word, memory_order_relaxed) + 1,
      memory_order_release);
}

void throttle__free_slot(struct throttle__rec *r, struct throttle__slot *s);
/* The segment's next ticket (FIFO order and identity of a slot). */
uint64_t throttle__next_ticket_locked(throttle_t *h, struct throttle__rec *r);

/* Slots granted under the mutex, woken after it.  Only slot[0..n) is
 * ever read. */
struct throttle__wake {
  struct throttle__slot *slot[THROTTLE__SLOTS];
  uint32_t n;
};
void throttle__wake_all(struct throttle__wake *w);

/* Who is in a key's slots, read in one pass: the grant looked at the 32
 * slots up to six times per grant (the probe, the holders, the backfill
 * holders, the oldest live and backfill waiters, again after each grant),
 * and that was most of an uncontended admission's time.  The masks are
 * the caller's own copy, kept in step with what it changes, never stored:
 * a mask in shared memory would be one more derived word to trust (I8)
 * and to repair after a crash. */
struct throttle__roster {
  uint32_t hold;    /* holding slots */
  uint32_t hold_bf; /* holding slots of class backfill */
  uint32_t wait[2]; /* waiting slots by class (live, backfill) */
  uint32_t free;    /* free slots */
  bool probe_held;  /* a holding slot carries the probe ticket */
};
void throttle__roster_read(const struct throttle__rec *r,
                           struct throttle__roster *ro);
/* Slot i changed from what *ro read to state (of class cls): the
 * caller's copy kept in step, so it need not read the slots again. */
static inline void throttle__roster_set(struct throttle__roster *ro,
                                        uint32_t i, int state, int cls) {
  uint32_t bit = UINT32_C(1) << i;
  ro->hold &= ~bit;
  ro->hold_bf &= ~bit;
  ro->wait[0] &= ~bit;
  ro->wait[1] &= ~bit;
  ro->free &= ~bit;
  if (state == THROTTLE__SLOT_FREE)
    ro->free |= bit;
  else if (state == THROTTLE__SLOT_WAITING && cls <= THROTTLE_CLASS_BACKFILL)
    ro->wait[cls == THROTTLE_CLASS_BACKFILL] |= bit;
  else if (state == THROTTLE__SLOT_HOLDING)
    ro->hold |= bit, ro->hold_bf |= cls == THROTTLE_CLASS_BACKFILL ? bit : 0;
}
/* The slots in a mask: a loop per slot, as few are in use (the compiler's
 * popcount is a library call without -mpopcnt). */
static inline uint32_t throttle__bits(uint32_t mask) {
  uint32_t n = 0;
  for (; mask != 0; mask &= mask - 1)
    n++;
  return n;
}
/* Reclaim the slots of dead holders and lapsed leases of r, at most every
 * 50 ms unless force; true when it looked (slots may have changed). */
bool throttle__reap(struct throttle__rec *r, uint64_t now, bool force);
/* Grant what the gate allows now into *w; *next = when time alone could
 * open it (UINT64_MAX if never).  pre: the caller's roster of r read under
 * this mutex hold and kept in step (used and changed), or NULL. */
void throttle__grant_locked(throttle_t *h, struct throttle__rec *r,
                            uint64_t now, struct throttle__wake *w,
                            uint64_t *next, struct throttle__roster *pre);

/* gate_rec.c (throttle__gate_snapshot: gate_info.c) */
/* A conforming GCRA state never runs more than one period ahead of now
 * (the rate's fields bounded: shared memory is input). */
void throttle__bound_rate(throttle_t *h, struct throttle__rec *r, uint64_t now);
void throttle__gate_repair_locked(throttle_t *h, struct throttle__rec *r);
void throttle__gate_snapshot(const struct throttle__rec *r, uint64_t now,
                             throttle_info_t *out);
/* text.c: src as valid UTF-8 without control bytes (a space for each,
 * '?' for a byte that is not UTF-8), cut to fit size with a "..." mark;
 * returns its length.  The refusal of a record as a snapshot shows it
 * (judged again), and a backend's snapshot completed from this host's
 * segment. */
size_t throttle__clean_text(char *dst, size_t size, const char *src,
                            size_t len);
/* segment_ops.c: a record's refusal copied (judged again); a backend's
 * snapshot completed with what this host's segment was told. */
void throttle__refusal_copy(struct throttle__refusal *dst,
                            const struct throttle__refusal *src);
void throttle__refusal_merge(throttle_t *h, throttle_info_t *info);
/* The waiters a snapshot counts but does not list (from its counts and
 * its list: every backend's snapshot ends with it; inline, as the Redis
 * module sees no symbol of the core). */
static inline void throttle__info_unlisted(throttle_info_t *out) {
  int64_t *f = out->field;
  int64_t all =
      f[THROTTLE_FIELD_WAITING_LIVE] + f[THROTTLE_FIELD_WAITING_BACKFILL];
  f[THROTTLE_FIELD_WAITERS_UNLISTED] =
      all > (int64_t)out->nwaiters ? all - (int64_t)out->nwaiters : 0;
}
void throttle__publish_locked(throttle_t *h, struct throttle__rec *r,
                              uint64_t now, uint64_t delay_ns);
void throttle__open_locked(struct throttle__rec *r);
void throttle__cancel_locked(struct throttle__rec *r);
void throttle__wake_rec(struct throttle__rec *r);
void throttle__reap_locked(struct throttle__rec *r, uint64_t now);
bool throttle__reap_idle_locked(const throttle_t *h, struct throttle__rec *r,
                                uint64_t now);

/* scope.c */
/* The end of the next scope of key at or after from (a '/' past the first
 * byte), or 0 when there is none. */
static inline size_t throttle__scope_next(const char *key, size_t len,
                                          size_t from) {
  if (from == 0)
    from = 1; /* a leading '/' names no scope */
  if (from >= len)
    return 0;
  const char *s = memchr(key + from, '/', len - from);
  return s != NULL ? (size_t)(s - key) : 0;
}
/* A record's key length, read once: it is shared memory (I8), and one a
 * writer outside the library damaged reads as 0 (no key, no scopes), never
 * as a length past the key buffer. */
static inline size_t throttle__rec_klen(const struct throttle__rec *r) {
  size_t n = __atomic_load_n(&r->key_len, __ATOMIC_RELAXED);
  return n <= THROTTLE__KEY_MAX ? n : 0;
}
/* Is r a key beneath the scope (its first len bytes)? */
static inline bool throttle__rec_below(const struct throttle__rec *r,
                                       const char *scope, size_t len) {
  return len <= THROTTLE__KEY_MAX && r->state == THROTTLE__REC_USED &&
         throttle__rec_klen(r) > len && r->key[len] == '/' &&
         memcmp(r->key, scope, len) == 0;
}
enum {
  THROTTLE__SCOPE_OPEN = 0,  /* no scope holds r */
  THROTTLE__SCOPE_HELD = 1,  /* paused, not-before (*next), or probe out */
  THROTTLE__SCOPE_PROBE = 2, /* a scope's episode: grant one, as its probe */
};
int throttle__scope_gate_locked(throttle_t *h, const struct throttle__rec *r,
                                uint64_t now, uint64_t *next);
/* Does scope s's probe hold the keys beneath now: the rule of the scope
 * gate, for every waiting call (throttle_wait too), a cold scope's first
 * request at most THROTTLE__COLD_HOLD_NS (*next: when that hold ends)? */
bool throttle__scope_probe_holds_locked(struct throttle__rec *s, uint64_t now,
                                        uint64_t *next);
/* Is ticket the probe of a scope of r's key (granted as its probe)? */
bool throttle__scope_probe_of_locked(throttle_t *h,
                                     const struct throttle__rec *r,
                                     uint64_t ticket);
/* held on r takes a place in every capped pool over r, and nothing else
 * (a backend's admission kept in the segment). */
void throttle__scope_place_locked(throttle_t *h, const struct throttle__rec *r,
                                  const struct throttle__slot *held);
/* held was just granted on r: it takes a place in every pool over r (a
 * scope with a cap) and, with probe (after THROTTLE__SCOPE_PROBE), becomes
 * the probe of every scope of r in an episode with no probe out. */
void throttle__scope_take_locked(throttle_t *h, const struct throttle__rec *r,
                                 const struct throttle__slot *held,
                                 bool probe);
/* May waiter w of r be granted as far as the pools over r go: a place free
 * at every capped scope (backfill within its share there), its rate
 * allowing one more (else *next = when it will), and no waiter
 * of another key beneath that goes first (live before backfill, then
 * arrival) and whose own key could go now. */
bool throttle__scope_pool_allows_locked(throttle_t *h,
                                        const struct throttle__rec *r,
                                        const struct throttle__slot *w,
                                        uint64_t now, uint64_t *next);
/* The admission ticket left with outcome: if it probed a scope of key,
 * free its place there, end the episode on OK, wake the keys beneath. */
void throttle__scope_report_locked(throttle_t *h, const char *key,
                                   size_t len, uint64_t ticket,
                                   throttle_outcome_t outcome);
/* Before an admission of key: a scope its 429 or 503 would be published
 * on (this handle's levels) that no answer has come back to yet gets its
 * record, in an episode with nothing to wait for, so that one admission
 * beneath goes first for the whole scope (scope.c says why). */
void throttle__scope_enter_locked(throttle_t *h, const char *key, size_t len,
                                  uint64_t now);
/* Is every scope of r's key quiet: absent, or answered and holding
 * nothing (no pause, not-before, episode, probe, cap or rate)?  Then the
 * scope gate, the pools and the cold-scope rule have nothing to do for r.
 * 0 when not; else THROTTLE__QUIET and what else is known (this thread's
 * memory, under hdr->sgen; scope.c). */
enum {
  THROTTLE__QUIET = 1u << 0,
  THROTTLE__QUIET_ABSENT = 1u << 1, /* no scope of the key has a record */
  THROTTLE__QUIET_ROOT = 1u << 2,   /* the first scope has one (answered) */
  THROTTLE__QUIET_ALL = 1u << 3,    /* every scope has one (answered) */
};
unsigned throttle__scopes_quiet_bits(throttle_t *h,
                                     const struct throttle__rec *r,
                                     uint64_t now);
static inline bool throttle__scopes_quiet(throttle_t *h,
                                          const struct throttle__rec *r,
                                          uint64_t now) {
  return throttle__scopes_quiet_bits(h, r, now) != 0;
}
/* Would throttle__scope_enter_locked() do nothing for a key with these
 * quiet bits, for h?  Every scope h's 429 and 503 go to has an answer:
 * the first scope, unless h routed them elsewhere (then all are asked
 * for). */
static inline bool throttle__scope_enter_idle(const throttle_t *h,
                                              unsigned quiet) {
  unsigned routed = 1u << THROTTLE_OUTCOME_RATE_LIMITED |
                    1u << THROTTLE_OUTCOME_UNAVAILABLE;
  return (quiet & THROTTLE__QUIET_ALL) ||
         ((quiet & THROTTLE__QUIET_ROOT) && !(h->publish_set & routed));
}
/* The latest not-before (clamped) of the scopes of key, 0 if none. */
uint64_t throttle__scope_nb_locked(throttle_t *h, const char *key, size_t len,
                                   uint64_t now);
/* After a crash in the critical section (repair.c): every holder
 * beneath a capped pool takes the place there that a grant cut short did
 * not (scope.c). */
void throttle__scope_repair_locked(throttle_t *h);
/* s's cap was just set: every holder beneath takes the place it lacks. */
void throttle__scope_pool_set_locked(throttle_t *h, struct throttle__rec *s);
/* gate_learn.c: r was just inserted (table.c): start its learned cap from
 * its siblings'. */
void throttle__scope_seed_locked(throttle_t *h, struct throttle__rec *r,
                                 uint64_t now);
/* Wake (and with cancel, cancel) the waiters of every key beneath s. */
void throttle__scope_below_locked(throttle_t *h, struct throttle__rec *s,
                                  bool cancel);
/* The same beneath the scope key[0, len), whether or not it has a record
 * (a command on a scope reaches every key beneath it): how many keys. */
uint32_t throttle__scope_below_key_locked(throttle_t *h, const char *key,
                                          size_t len, bool cancel);
/* Publish outcome's back-off on the scope of key the handle routes it to
 * (nothing when that is the key itself: the caller publishes there), as
 * throttle__publish_at_locked() does; 0, or why nothing was stored. */
int throttle__scope_publish_locked(throttle_t *h, const char *key,
                                   size_t len, throttle_outcome_t outcome,
                                   uint64_t delay_ns, uint64_t now);
/* Publish a back-off on key's prefix of plen bytes (the key itself when
 * plen is its length).  A scope with no record and no room for one (every
 * record in use, none evictable) has it stored on the key instead: never
 * early for the key, and the other keys beneath learn it from their own
 * answers.  0 when stored, else THROTTLE_EFULL (or what the insert said):
 * a back-off stored nowhere is never reported as published. */
int throttle__publish_at_locked(throttle_t *h, const char *key, size_t len,
                                uint32_t plen, uint64_t delay_ns,
                                uint64_t now);
/* After a change that can make a scope hold (see hdr->sgen). */
static inline void throttle__scope_touch(throttle_t *h) {
  atomic_fetch_add_explicit(&h->hdr->sgen, 1, memory_order_release);
}
/* How much of key an outcome's back-off is published on (its length). */
uint32_t throttle__publish_len(const throttle_t *h, const char *key,
                               size_t len, throttle_outcome_t outcome);

#ifdef THROTTLE_TESTING
#define THROTTLE__CRASHPOINT(name) throttle__crashpoint(name)
#else
#define THROTTLE__CRASHPOINT(name) ((void)0)
#endif

/* ---- fault injection (fault.c) -----------------------------------------
 *
 * Test builds can make the Nth call of a kind fail, as SQLite's tests do,
 * to check the error and the state after each failure.  Every allocation
 * of the library and every system call whose failure it handles goes
 * through a hook; in release builds the hooks are the plain calls (macros:
 * no code, no symbols).  Each kind fails with the errno in brackets unless
 * throttle__fault_errno() says otherwise. */
enum throttle__fault_kind {
  THROTTLE__FAULT_ALLOC,      /* malloc, calloc, realloc, strdup [ENOMEM] */
  THROTTLE__FAULT_SHM_OPEN,   /* [EMFILE] */
  THROTTLE__FAULT_FCHMOD,     /* [EPERM] */
  THROTTLE__FAULT_FLOCK,      /* taking the init lock [ENOLCK] */
  THROTTLE__FAULT_FSTAT,      /* [EIO] */
  THROTTLE__FAULT_FTRUNCATE,  /* [EIO] */
  THROTTLE__FAULT_FALLOCATE,  /* posix_fallocate [ENOSPC] */
  THROTTLE__FAULT_MMAP,       /* shared and private mappings [ENOMEM] */
  THROTTLE__FAULT_MUTEX_INIT, /* pthread_mutex_init [EAGAIN] */
  THROTTLE__FAULT_LOCK,       /* taking the segment mutex [ETIMEDOUT]; the
                                 mutex is then not held, so EOWNERDEAD must
                                 never be injected */
  THROTTLE__FAULT_CLOCK,      /* clock_gettime [EINVAL] */
  THROTTLE__FAULT_FUTEX,      /* a wait returns at once, a wake is lost
                                 [EINTR] */
  THROTTLE__FAULT_KINDS_
};

#ifdef THROTTLE_TESTING
/* Fail the nth call of kind counted from now (1 = the next one); n = 0
 * disarms it.  Arming resets the kind's counters. */
void throttle__fault_arm(int kind, unsigned long n);
/* Fail every call from the nth on, not only the nth. */
void throttle__fault_persist(int kind, bool on);
/* The errno a failing call of kind reports (0: the kind's default). */
void throttle__fault_errno(int kind, int err);
/* Calls of kind since it was armed, and how many of them failed. */
unsigned long throttle__fault_calls(int kind);
unsigned long throttle__fault_hits(int kind);
/* Disarm every kind and reset the counters (not the live allocations). */
void throttle__fault_reset(void);
/* Allocations made through the hooks and not yet freed. */
long throttle__fault_live(void);
const char *throttle__fault_name(int kind);
/* The hook: 0 to go on with the real call, or the errno to fail with
 * (errno is then set to it). */
int throttle__fault(int kind);

void *throttle__malloc(size_t n);
void *throttle__calloc(size_t n, size_t size);
void *throttle__realloc(void *p, size_t n);
char *throttle__strdup(const char *s);
void throttle__free(void *p);

/* The call, or fail (kind's errno set) when the test says so. */
#define THROTTLE__FAULT(kind) throttle__fault(THROTTLE__FAULT_##kind)
#define THROTTLE__SYS(kind, fail, call)                                        \
  (THROTTLE__FAULT(kind) ? (fail) : (call))
#else
#define THROTTLE__FAULT(kind) 0
#define THROTTLE__SYS(kind, fail, call) (call)
#define throttle__malloc(n) malloc(n)
#define throttle__calloc(n, size) calloc((n), (size))
#define throttle__realloc(p, n) realloc((p), (n))
#define throttle__strdup(s) strdup(s)
#define throttle__free(p) free(p)
#endif

#endif
