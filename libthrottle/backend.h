/* SPDX-License-Identifier: MIT */
/*
 * backend.h — the tables of operations between the public entry points
 * and the backends.
 *
 * One table per backend (struct throttle__ops, below), chosen at open and
 * kept in h->ops: the public entry points (api/) check their arguments,
 * refuse a change on a read-only handle, and call through it.  The host's
 * shared-memory segment is one backend (throttle__segment_ops, shm/); a
 * backend across hosts is another (throttle__remote_ops, api/backend.c),
 * which asks its module and, when the module cannot be reached, calls the
 * segment's table: downward only, the segment never calls back up.
 *
 * A backend across hosts is a module (today: Redis,
 * libthrottle-redis.so.1) implementing struct throttle__backend: the core
 * (libc + pthreads only) dlopen()s it when THROTTLE_BACKEND or
 * throttle_config_set_backend() names one, looks up the one symbol
 * THROTTLE__BACKEND_SYMBOL in it, and from then on the remote table asks
 * it first.  A backend carries the storage and the waking of a key's gate
 * across hosts; the rules (who is admitted, when a probe goes, how a cap
 * is learned) are the segment's (shm/gate_enter.c and the gate_*.c beside
 * it), and a backend that must run them atomically on its server says in
 * its own header which of them it mirrors (redis.h).
 *
 * Each function of a module's table returns what the public function it
 * stands for returns (0 or a THROTTLE_E* code), or THROTTLE__BE_DOWN: the
 * backend cannot be reached now, and the core serves the call from the
 * host's segment, so an outage of the backend narrows the contracts to one
 * host (I7) instead of stopping the fleet.  A message for throttle_errmsg() is left in the
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

#define THROTTLE__BACKEND_ABI 6u
#define THROTTLE__BACKEND_SYMBOL "throttle_backend_v1"
#define THROTTLE__BE_DOWN 1 /* positive: never a public return value */

struct throttle__be_settings;

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
  /* What this host's segment keeps of the settings of key (out[0]) and of
   * each of its scopes (out[1..], root first), for each name it used
   * within within_ms and that has any (known 1 there; out has
   * THROTTLE__BE_NSETTINGS entries, zeroed by the caller): asked at each
   * enter, so that a backend that lost its state (an empty restart) puts
   * them back.  Returns how many are known. */
  int (*segment_settings)(void *arg, const char *key, uint64_t within_ms,
                          struct throttle__be_settings *out);
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
  /* t: made by throttle__ticket_new for key (the caller's pointer, which
   * the segment's per-thread guess is keyed by); *out = t on success, else
   * t is freed. */
  int (*enter)(throttle_t *h, const char *key, throttle_ticket_t *t,
               uint64_t timeout_ms, int nowait, throttle_ticket_t **out,
               uint64_t *wait_ms);
  /* t is h's; an unknown outcome arrives as ABANDONED with bad_outcome
   * set (reported after the slot is given back).  Frees t, unless
   * requeue puts it back in *ticket. */
  int (*leave)(throttle_t *h, throttle_ticket_t *t, throttle_outcome_t outcome,
               uint64_t retry_after_ms, int bad_outcome);
  int (*requeue)(throttle_t *h, throttle_ticket_t *t,
                 throttle_outcome_t outcome, uint64_t retry_after_ms,
                 int bad_outcome, uint64_t timeout_ms,
                 throttle_ticket_t **ticket);
  /* what: a THROTTLE__BE_* kind, a and b as set() above says. */
  int (*set)(throttle_t *h, const char *key, size_t len, int what,
             uint64_t a, uint64_t b);
  /* The segment's own (the remote table passes them on): the segment's
   * maximum delay (ms checked), and a refusal's note (cleaned, stamped),
   * which only this host's segment keeps (refusal.c). */
  int (*set_max_delay)(throttle_t *h, uint64_t ms);
  int (*note_refusal)(throttle_t *h, const char *key, size_t len,
                      const struct throttle__refusal *n);
  int (*stats)(throttle_t *h, uint32_t *capacity, uint32_t *used,
               uint64_t *evictions, uint64_t *repairs);
};
extern const struct throttle__ops throttle__segment_ops; /* shm/segment_table.c */
extern const struct throttle__ops throttle__remote_ops;  /* api/backend.c */

/* The segment's operations (shm/segment_backoff.c, shm/gate_enter.c,
 * shm/segment_settings.c), as throttle__segment_ops holds them. */
int throttle__seg_backoff(throttle_t *h, const char *key, size_t len,
                          uint64_t delay_ms);
int throttle__seg_remaining(throttle_t *h, const char *key, size_t len,
                            uint64_t *ms);
int throttle__seg_wait(throttle_t *h, const char *key, size_t len,
                       uint64_t timeout_ms);
int throttle__seg_clear(throttle_t *h, const char *key, size_t len);
int throttle__seg_reset(throttle_t *h);
int throttle__seg_info(throttle_t *h, const char *key, size_t len,
                       throttle_info_t **out);
int throttle__seg_foreach(throttle_t *h,
                          int (*fn)(const throttle_info_t *, void *),
                          void *arg);
int throttle__seg_enter(throttle_t *h, const char *key, throttle_ticket_t *t,
                        uint64_t timeout_ms, int nowait,
                        throttle_ticket_t **out, uint64_t *wait_ms);
int throttle__seg_leave(throttle_t *h, throttle_ticket_t *t,
                        throttle_outcome_t outcome, uint64_t retry_after_ms,
                        int bad_outcome);
int throttle__seg_requeue(throttle_t *h, throttle_ticket_t *t,
                          throttle_outcome_t outcome, uint64_t retry_after_ms,
                          int bad_outcome, uint64_t timeout_ms,
                          throttle_ticket_t **ticket);
int throttle__seg_set(throttle_t *h, const char *key, size_t len, int what,
                      uint64_t a, uint64_t b);
int throttle__seg_set_max_delay(throttle_t *h, uint64_t ms);
int throttle__seg_stats(throttle_t *h, uint32_t *capacity, uint32_t *used,
                        uint64_t *evictions, uint64_t *repairs);
int throttle__seg_note_refusal(throttle_t *h, const char *key, size_t len,
                               const struct throttle__refusal *n);
/* shm/gate_enter.c: a ticket for key (len checked), or NULL (no memory). */
throttle_ticket_t *throttle__ticket_new(throttle_t *h, const char *key,
                                        size_t len, throttle_class_t cls);
/* shm/gate_enter.c: a back-off a backend's admission reported, recorded in
 * the segment too (on the key or the scope of length plen). */
void throttle__segment_mirror_publish(throttle_t *h,
                                      const throttle_ticket_t *t,
                                      uint32_t plen, uint64_t ms);

/* ---- the core's side (backend.c) -------------------------------------
 * Each wrapper validates like the public call, asks the module, and turns
 * its answer into the public one (message included); THROTTLE__BE_DOWN
 * means "serve this call from the segment" (the remote table then calls
 * throttle__segment_ops), and the first one after a working call leaves a
 * notice for throttle_errmsg(). */
struct throttle__be;

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
/* segment_ops.c: the callers of key the segment still holds or queues
 * (its own admissions, not the backend's kept there). */
uint32_t throttle__segment_count(throttle_t *h, const char *key);
/* params segment_settings, for h's segment. */
int throttle__segment_settings(throttle_t *h, const char *key,
                               uint64_t within_ms,
                               struct throttle__be_settings *out);
/* segment_ops.c: the backend's admission t kept in the segment as held by
 * this process (t's ticket and slot name it there), and freed at its
 * leave, so an outage while it is held still counts it. */
void throttle__segment_hold_backend(throttle_t *h, throttle_ticket_t *t);
void throttle__segment_release_backend(throttle_t *h,
                                       const throttle_ticket_t *t);
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
