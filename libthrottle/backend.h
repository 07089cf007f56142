/* SPDX-License-Identifier: MIT */
/*
 * backend.h — the seam between the core and a backend other than the
 * host's shared-memory segment (today: Redis, libthrottle-redis.so.1).
 *
 * The core (libc + pthreads only) dlopen()s a backend module when
 * THROTTLE_BACKEND or throttle_config_set_backend() names one, looks up
 * the one symbol THROTTLE__BACKEND_SYMBOL in it, and from then on every
 * public entry point asks the table below first.  A backend carries the
 * storage and the waking of a key's gate across hosts; the rules (who is
 * admitted, when a probe goes, how a cap is learned) are gate.c's, and a
 * backend that must run them atomically on its server says in its own
 * header which of them it mirrors (redis.h).
 *
 * Every function returns what the public function it stands for returns
 * (0 or a THROTTLE_E* code), or THROTTLE__BE_DOWN: the backend cannot be
 * reached now, and the core serves the call from the host's segment, so
 * an outage of the backend narrows the contracts to one host (I7) instead
 * of stopping the fleet.  A message for throttle_errmsg() is left in the
 * buffer the module's errmsg() returns (per thread).
 *
 * The module is built from this tree: THROTTLE__BACKEND_ABI changes with
 * any change of this table or of struct throttle_info, and a module of
 * another ABI is refused at open.  Rejected: linking hiredis into the
 * core (every user would pull it in, I7's "libc + pthreads" would go), and
 * a home-made network protocol (operators already run Redis).
 */
#ifndef THROTTLE_BACKEND_H
#define THROTTLE_BACKEND_H

#include "internal.h"

#define THROTTLE__BACKEND_ABI 5u
#define THROTTLE__BACKEND_SYMBOL "throttle_backend_v1"
#define THROTTLE__BE_DOWN 1 /* positive: never a public return value */

/* What the core hands a backend at open. */
struct throttle__be_params {
  const char *url;        /* as the user gave it */
  uint64_t max_delay_ms;  /* this process's maximum delay: what it honours */
  uint32_t lease_ms;      /* this process's lease */
  uint32_t info_size;     /* sizeof(throttle_info_t), checked by the module */
  /* throttle_config_set_interrupt(): asked at least every intr_period_ms
   * while a call waits; non-zero ends the wait with THROTTLE_EINTR. */
  int (*intr)(void *arg);
  void *intr_arg;
  uint64_t intr_period_ms;
  /* How many callers of key this host's segment still holds or queues
   * (admitted there while the backend was away), asked at each look of an
   * enter: the backend counts them as this host's until the segment has
   * drained (segment_name tells this host's segment from another's). */
  uint32_t (*segment_count)(void *arg, const char *key);
  void *segment_arg;
  const char *segment_name;
  /* The most any publish from this host may store: the host segment's
   * maximum delay at open (a process's own maximum bounds only what it
   * honours, never what it writes for the others). */
  uint64_t store_max_ms;
};

/* Setting kinds for set(). */
enum {
  THROTTLE__BE_CAP,    /* a = n (0 = auto) */
  THROTTLE__BE_RATE,   /* a = n, b = period ms */
  THROTTLE__BE_SHARE,  /* a = permille */
  THROTTLE__BE_PAUSE,
  THROTTLE__BE_RESUME, /* THROTTLE_ENOKEY for an unknown key */
  THROTTLE__BE_CANCEL, /* THROTTLE_ENOKEY for an unknown key */
  THROTTLE__BE_CAP_AUTO, /* a = auto:MAX bound (0 = none): learned, <= a */
};

/* What a backend knows of a key's own settings, or of one of its scopes'
 * (a pool's cap, rate and share, a scope's pause), told with each enter's
 * answer and mirrored in the host's segment (shm/segment_ops.c
 * throttle__segment_mirror), so that they hold on this host while the
 * backend is away.  known 0: nothing told.  enter() fills an array of
 * THROTTLE__BE_NSETTINGS: the key's at 0, then each scope's, root first. */
#define THROTTLE__BE_NSETTINGS (1 + THROTTLE_KEY_MAX_SCOPES)
struct throttle__be_settings {
  int known;
  uint32_t fixed_cap; /* 0 = auto */
  uint32_t auto_max;  /* auto:MAX bound, 0 = none */
  int paused;
  uint32_t rate_n; /* 0 = no rate */
  uint64_t rate_period_ms;
  int share_set;
  uint32_t share_permille;
};

struct throttle__backend {
  uint32_t abi; /* THROTTLE__BACKEND_ABI */
  const char *name;
  /* 0 and *be set, or an error (bad URL: THROTTLE_EINVAL) with a message
   * in msg.  Reachability is not checked here: an unreachable server only
   * means THROTTLE__BE_DOWN from the calls. */
  /* msg: why it failed; on success "" or a warning (a variable of its
   * environment it could not use), which throttle_open() passes on. */
  int (*open)(const struct throttle__be_params *p, void **be, char *msg,
              size_t msglen);
  void (*close)(void *be);
  const char *(*errmsg)(void *be);
  /* heal_age_ms >= 0: what this host's segment knows, published again
   * (backend.c heal()), published that long ago by this host's clock: a
   * not-before the backend already has (give or take a round trip) is left
   * alone and nothing is counted, and THROTTLE_ESTALE says the key was
   * cleared since (the host drops its copy).  -1: a plain publish. */
  int (*backoff)(void *be, const char *key, uint64_t delay_ms,
                 int64_t heal_age_ms);
  int (*remaining)(void *be, const char *key, uint64_t *ms_left);
  int (*wait)(void *be, const char *key, uint64_t timeout_ms);
  /* nowait: throttle_try_enter (EWOULDBLOCK, *wait_ms); *tk is the
   * backend's ticket, *probe whether it is the probe.  cold: the lengths
   * of the names a 429 and a 503 would be published on (the cold-scope
   * rule, scope.c throttle__scope_enter_locked).  set: an array of
   * THROTTLE__BE_NSETTINGS, zeroed by the caller. */
  int (*enter)(void *be, const char *key, int cls, uint64_t timeout_ms,
               int nowait, void **tk, int *probe, uint64_t *wait_ms,
               const uint32_t cold[2], struct throttle__be_settings *set);
  /* Frees tk whatever it returns.  pub_len: where a back-off the outcome
   * publishes goes, as the length of its name (the key's own length, or
   * one of its scopes', scope.c throttle__publish_len). */
  int (*leave)(void *be, void *tk, int outcome, uint64_t retry_after_ms,
               uint32_t pub_len);
  int (*set)(void *be, const char *key, int what, uint64_t a, uint64_t b);
  /* key NULL: every key (throttle_reset). */
  int (*clear)(void *be, const char *key);
  int (*info)(void *be, const char *key, throttle_info_t *out);
  int (*foreach)(void *be, int (*fn)(const throttle_info_t *, void *),
                 void *arg);
  /* A standing warning about how the backend is set up (Redis may evict
   * keys, blocking commands are refused), for throttle_errmsg() between
   * errors: copied into buf (len bytes, "" when none); returns a number
   * that changes whenever the warning does. */
  unsigned (*notice)(void *be, char *buf, size_t len);
};

/* ---- one table per backend, chosen at open -----------------------------
 * The public entry points (api/) check their arguments, refuse a change on
 * a read-only handle, and call h->ops.  Two tables exist:
 *   throttle__segment_ops (shm/): the host's segment serves the call;
 *   throttle__remote_ops (api/backend.c): a backend across hosts (the
 *     module above) answers, and on THROTTLE__BE_DOWN the call goes to
 *     throttle__segment_ops (downward: the segment never calls back).
 * key has been checked for its length (len) and, unless the operation says
 * so, its syntax; remaining and wait check the syntax themselves, after
 * the segment's lock-free guesses (which know only checked keys). */
struct throttle__ops {
  const char *name;
  int (*backoff)(throttle_t *h, const char *key, size_t len,
                 uint64_t delay_ms);
  int (*remaining)(throttle_t *h, const char *key, size_t len, uint64_t *ms);
  int (*wait)(throttle_t *h, const char *key, size_t len, uint64_t timeout_ms);
  int (*clear)(throttle_t *h, const char *key, size_t len);
  int (*reset)(throttle_t *h);
  int (*info)(throttle_t *h, const char *key, size_t len,
              throttle_info_t **out);
  int (*foreach)(throttle_t *h, int (*fn)(const throttle_info_t *, void *),
                 void *arg);
};
extern const struct throttle__ops throttle__segment_ops;
extern const struct throttle__ops throttle__remote_ops;

/* ---- the core's side (backend.c) -------------------------------------
 * Each wrapper validates like the public call, asks the backend, and turns
 * its answer into the public one (message included); THROTTLE__BE_DOWN
 * means "serve this call from the segment", and the first one after a
 * working call leaves a notice for throttle_errmsg(). */
struct throttle__be;

/* At the top of a public entry point: let the backend answer, unless it
 * is down (then the segment does). */
#define THROTTLE__BE_TRY(h, call)                                              \
  do {                                                                         \
    if ((h) != NULL)                                                           \
      THROTTLE__BE_TRY_NONNULL(h, call);                                       \
  } while (0)
/* The same step for an entry point that has already returned on a NULL h
 * (and used it since): testing h again there reads, to cppcheck, as a
 * NULL check after a dereference. */
#define THROTTLE__BE_TRY_NONNULL(h, call)                                      \
  do {                                                                         \
    if ((h)->be != NULL) {                                                     \
      int brc_ = (call);                                                       \
      if (brc_ != THROTTLE__BE_DOWN)                                           \
        return brc_;                                                           \
    }                                                                          \
  } while (0)
int throttle__be_open(throttle_t *h, const throttle_config_t *cfg);
/* segment_ops.c: the segment's own ms left for key (0 = open). */
uint64_t throttle__segment_remaining(throttle_t *h, const char *key);
/* segment_ops.c: how long ago the segment's back-off of key was published
 * (ms, 0 = none), and the copy dropped (cleared on the backend since). */
uint64_t throttle__segment_published_ago(throttle_t *h, const char *key);
void throttle__segment_forget(throttle_t *h, const char *key);
/* segment_ops.c: what the backend told of key's settings, written into the
 * segment where it differs (waking the key's waiters then). */
void throttle__segment_mirror(throttle_t *h, const char *key,
                              const struct throttle__be_settings *s);
/* segment_ops.c: the callers of key the segment still holds or queues. */
uint32_t throttle__segment_count(throttle_t *h, const char *key);
void throttle__be_close(throttle_t *h);
int throttle__be_backoff(throttle_t *h, const char *key, uint64_t delay_ms);
int throttle__be_remaining(throttle_t *h, const char *key, uint64_t *ms);
/* wait and enter: on THROTTLE__BE_DOWN, *timeout_ms is what is left of
 * it for the segment (the time the backend took is spent). */
int throttle__be_wait(throttle_t *h, const char *key, uint64_t *timeout_ms);
int throttle__be_enter(throttle_t *h, const char *key, int cls,
                       uint64_t *timeout_ms, int nowait, void **tk,
                       int *probe, uint64_t *wait_ms);
int throttle__be_leave(throttle_t *h, void *tk, int outcome,
                       uint64_t retry_after_ms, uint32_t pub_len);
int throttle__be_set(throttle_t *h, const char *key, int what, uint64_t a,
                     uint64_t b);
int throttle__be_clear(throttle_t *h, const char *key);
int throttle__be_info(throttle_t *h, const char *key, throttle_info_t **out);
int throttle__be_foreach(throttle_t *h,
                         int (*fn)(const throttle_info_t *, void *),
                         void *arg);

#endif
