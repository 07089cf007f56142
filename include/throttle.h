/* SPDX-License-Identifier: MIT */
/*
 * throttle.h — share "come back later" between the processes of one host.
 *
 * libthrottle keeps, in a POSIX shared-memory segment guarded by a robust
 * process-shared mutex, a "not before" time per key (for example one table
 * of an HTTP API).  A process that is told "retry after 5 s" publishes it
 * with throttle_backoff(); every other process that links libthrottle and
 * opens the same segment sees it and waits with throttle_wait(), or peeks
 * with throttle_remaining().
 *
 * Conventions
 *   - Every function that can fail returns an int: 0 on success, a negative
 *     THROTTLE_E* code otherwise.  Codes are never renumbered; new ones are
 *     only ever added.  throttle_strerror() and throttle_err_name() describe
 *     them; throttle_errmsg() gives the message, with context, of the last
 *     failure on a handle in the calling thread.
 *   - Keys are byte strings of 1 to 255 bytes without a NUL byte, passed as
 *     NUL-terminated C strings (e.g. "hotdata:ws1/orders").  A key is a path
 *     of names joined by '/' (see Scopes): no name is empty (no leading or
 *     trailing '/', no "//"), no byte is a control character (below 0x20,
 *     or 0x7f), and a key has at most THROTTLE_KEY_MAX_SCOPES scopes (that
 *     many '/').  Every function refuses any other key with THROTTLE_EKEY,
 *     on every backend; throttle_check_key() says whether one is valid.
 *   - Times are milliseconds in the API, nanoseconds in shared memory, on
 *     CLOCK_BOOTTIME (libthrottle(3) says why).
 *   - A throttle_t may be shared by the threads of a process.
 *
 * Caveats
 *   - Crashes.  A process killed while it holds the segment mutex leaves it
 *     to the next locker, which repairs and validates the table (the mutex is
 *     robust).  Nobody waits longer than the lock timeout for a dead owner.
 *   - Stale admissions.  Each holder of an admission is recorded with its
 *     pid, its process start time (from /proc/PID/stat) and its PID
 *     namespace, so a dead holder's slot is reclaimed at the next look by
 *     any waiter (within about 300 ms) and a reused pid is not mistaken for
 *     it; a zombie counts as dead.  Dead needs evidence: a holder that
 *     cannot be judged is alive until its lease lapses.  That is the case
 *     for a holder in another PID namespace (containers that share IPC and
 *     /dev/shm but not their PIDs: each container's dead holders then cost
 *     the others up to one lease, so keep the lease short there, or give
 *     each container its own THROTTLE_SEGMENT), and for a caller that
 *     cannot read /proc (hidepid, /proc not mounted).  A holder that is
 *     alive but hung keeps its slot until its lease lapses
 *     (throttle_config_set_lease, default 10 min).  Lock
 *     bytes per slot (OFD locks) were rejected: they are inherited across
 *     fork(), so a child would keep a dead parent's slot alive.
 *   - Stale or damaged segments.  A segment written by another layout, by
 *     another user, or damaged beyond repair is refused with a specific error
 *     (THROTTLE_EMAGIC, THROTTLE_EVERSION, THROTTLE_EFINGERPRINT, THROTTLE_ESIZE,
 *     THROTTLE_EOWNER, THROTTLE_EMODE, THROTTLE_ECORRUPT).  Remove it with
 *     `throttlectl rm` (or throttle_unlink()); the next opener recreates it.
 *     Removing a segment that is in use detaches nobody: processes that have
 *     it mapped keep using the old one until they reopen.
 *   - Fail open.  If the segment cannot be used, throttle_open() still hands
 *     back a working handle backed by process-private memory: back-off then
 *     holds within the process only.  The throttle never becomes the outage.
 *   - Trust.  Any process of the same user can write the segment.  Every field
 *     read from it is validated; a hostile writer can delay a key by at most
 *     the configured maximum delay and cannot crash or hang a reader.
 *   - fork().  Loaders fork (multiprocessing's fork start method, pools,
 *     xargs), so each object is defined across it:
 *       Handles: a child may go on using a throttle_t it inherited (the
 *       mapping is shared, not copied) and must throttle_close() its copy;
 *       or open its own.  Configurations are plain memory, copied.
 *       Tickets: an admission is one slot, whichever process holds the
 *       ticket.  A child may throttle_leave() an inherited ticket; that
 *       releases the slot, and the copy left in the parent is then stale
 *       (its throttle_leave() frees nothing and returns THROTTLE_ESTALE).
 *       Leave each admission once, in one process.  The slot is judged
 *       alive by the process that entered: if that one exits while a child
 *       still works under its ticket, the slot is reclaimed as dead.
 *       Waits: fork() copies only the calling thread, so a wait in another
 *       thread does not exist in the child; the parent's queue place stays
 *       the parent's.  Jitter is reseeded in the child, so forked waiters
 *       do not wake in step.
 *       Python multiprocessing with the fork start method gives each worker
 *       the parent's handle under these rules; with spawn or forkserver
 *       each worker opens its own.
 *       What a child may do with an inherited handle, by backend
 *       (throttle_backend()):
 *         The host segment: all of the above; the child's calls work on
 *         the one shared segment, and its throttle_close() unmaps its own
 *         mapping only.  A handle that failed open (process-private
 *         memory) is copied: the child's back-offs are its own.  A
 *         read-only handle (THROTTLE_READONLY) works in the child whatever
 *         the parent's other threads were reading through it at the fork.
 *         Redis: the same calls and the same ticket rules, and the child's
 *         copy is the child's own.  It has no heartbeat thread and uses
 *         none of the parent's connections: its first call opens its own
 *         (the parent's pooled ones are closed in the child without a word
 *         sent, and no connection passes to a program it execs), and
 *         its first admission starts a heartbeat of its own, which keeps
 *         the child's admissions alive for as long as the child holds
 *         them, as the parent's does for the parent's.  An admission the
 *         child inherited stays the parent's: only the parent's heartbeat
 *         keeps it alive (so it is reclaimed after THROTTLE_LIVENESS_MS
 *         once the parent is gone), and a child's throttle_leave() of it
 *         releases it as on the segment (the parent's copy is then
 *         THROTTLE_ESTALE).  throttle_close() in a child returns at once,
 *         whether or not the child made calls and whatever the parent's
 *         threads were doing at the fork; a child may as well exit or
 *         exec without closing.  While Redis is unreachable the child is
 *         served by the host segment, under the segment's rules.
 *   - docs/FAILURE-MODEL.md lists every fault and what an operator does;
 *     libthrottle(3), throttle_curl(3) and throttlectl(1) are the manual.
 */
#ifndef THROTTLE_H
#define THROTTLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(THROTTLE_BUILDING) && defined(__GNUC__)
#define THROTTLE_EXTERN __attribute__((visibility("default")))
#else
#define THROTTLE_EXTERN
#endif

/* ---- Versions -------------------------------------------------------- */

#define THROTTLE_VERSION_MAJOR 1
#define THROTTLE_VERSION_MINOR 1
#define THROTTLE_VERSION_PATCH 0
#define THROTTLE_VERSION_STRING "1.1.0"
/* 0xMMmmpp, comparable with THROTTLE_AT_LEAST_VERSION(). */
#define THROTTLE_VERSION_NUM                                                   \
  ((THROTTLE_VERSION_MAJOR << 16) | (THROTTLE_VERSION_MINOR << 8) |            \
   THROTTLE_VERSION_PATCH)
#define THROTTLE_AT_LEAST_VERSION(x, y, z)                                     \
  (THROTTLE_VERSION_NUM >= (((x) << 16) | ((y) << 8) | (z)))

/* The version of the library actually loaded, as THROTTLE_VERSION_NUM. */
THROTTLE_EXTERN unsigned throttle_version(void);
/* The same as a string, e.g. "1.0.0". */
THROTTLE_EXTERN const char *throttle_version_string(void);

/* ---- Errors ---------------------------------------------------------- */

/* XX(name, value, description).  Append only; never renumber. */
#define THROTTLE_ERRNO_MAP(XX)                                                 \
  XX(OK, 0, "success")                                                         \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(EKEY, -3,                                                                 \
     "invalid key: 1 to 255 bytes, names joined by '/', no control byte")      \
  XX(ESHM, -4, "cannot open or create the shared-memory segment")              \
  XX(ENOSPC, -5, "no space left to reserve the segment")                       \
  XX(EMAGIC, -6, "not a libthrottle segment (bad magic)")                      \
  XX(EVERSION, -7, "segment layout version mismatch")                          \
  XX(EFINGERPRINT, -8, "segment layout fingerprint mismatch")                  \
  XX(ESIZE, -9, "segment size does not match its header")                      \
  XX(EOWNER, -10, "segment owned by another user")                             \
  XX(EMODE, -11, "segment is writable by group or others")                     \
  XX(EINITTIMEOUT, -12, "timed out waiting for the segment to be initialised") \
  XX(ELOCKTIMEOUT, -13, "timed out taking the segment mutex")                  \
  XX(ECORRUPT, -14, "segment is corrupt and cannot be repaired")               \
  XX(EFULL, -15, "key table is full")                                          \
  XX(ENOKEY, -16, "no such key")                                               \
  XX(ETIMEDOUT, -17, "timed out")                                              \
  XX(EWOULDBLOCK, -18, "the call would have to wait")                          \
  XX(ECANCELED, -19, "canceled")                                               \
  XX(ESYS, -20, "system call failed")                                          \
  XX(ESYMLINK, -21, "segment path is a symbolic link")                        \
  XX(EINTR, -22, "interrupted by the caller")                                 \
  XX(ESTALE, -23, "the admission was already taken back")    \
  XX(EREADONLY, -24, "the handle is read-only")                               \
  XX(EBACKEND, -25, "the backend module cannot be loaded")

typedef enum {
#define THROTTLE_XX_(name, value, desc) THROTTLE_##name = value,
  THROTTLE_ERRNO_MAP(THROTTLE_XX_)
#undef THROTTLE_XX_
} throttle_errno_t;

/* A static description of a THROTTLE_E* code ("unknown error" otherwise). */
THROTTLE_EXTERN const char *throttle_strerror(int err);
/* The code's name, e.g. "THROTTLE_EFULL" ("THROTTLE_UNKNOWN" otherwise). */
THROTTLE_EXTERN const char *throttle_err_name(int err);

/* ---- Configuration --------------------------------------------------- */

typedef struct throttle_config throttle_config_t;

/* Defaults; the environment (THROTTLE_SEGMENT, THROTTLE_KEYS,
 * THROTTLE_MAX_DELAY_MS) is read by throttle_open() for anything the config
 * leaves unset.  Returns NULL when out of memory. */
THROTTLE_EXTERN throttle_config_t *throttle_config_new(void);
THROTTLE_EXTERN void throttle_config_free(throttle_config_t *cfg);

/* Segment name, a POSIX shm name such as "/myapp-throttle" (a leading '/'
 * is added when missing).  Default: $THROTTLE_SEGMENT, else
 * "/libthrottle-v<layout>-<uid>".
 * Errors: THROTTLE_EINVAL (NULL, empty, longer than 200 bytes, or a '/'
 * after the first byte), THROTTLE_ENOMEM. */
THROTTLE_EXTERN int throttle_config_set_segment(throttle_config_t *cfg,
                                                const char *name);

/* Key capacity used when this process creates the segment (ignored when
 * attaching to an existing one).  Default $THROTTLE_KEYS, else 4096.
 * Errors: THROTTLE_EINVAL (0 or more than 1048576). */
THROTTLE_EXTERN int throttle_config_set_capacity(throttle_config_t *cfg,
                                                 uint32_t keys);

/* Largest delay this process honours: throttle_wait() and
 * throttle_remaining() treat a longer not-before as this long (counted from
 * the start of the wait).  throttle_enter() follows the gate all processes
 * share, bounded by the segment's maximum (its throttle_try_enter() hint
 * counts this process's maximum too); bound its wait with its timeout.
 * It never changes what is stored for the others (a loosely configured
 * process cannot shorten their waits).  When
 * this process creates the segment, it is also the segment's maximum, the
 * most any publisher may store (see throttle_set_segment_max_delay()).
 * Default $THROTTLE_MAX_DELAY_MS, else 900000 (15 min).
 * Errors: THROTTLE_EINVAL (0 or more than 7 days). */
THROTTLE_EXTERN int throttle_config_set_max_delay(throttle_config_t *cfg,
                                                  uint64_t ms);

/* How long to wait for the segment mutex, and for another process to finish
 * creating the segment.  Default 2000 ms.  Errors: THROTTLE_EINVAL (0). */
THROTTLE_EXTERN int throttle_config_set_lock_timeout(throttle_config_t *cfg,
                                                     uint32_t ms);

/* How long an admission may be held before it is taken back from a holder
 * that is alive but hung (dead holders are reclaimed at once, whatever the
 * lease).  Set it above your longest request.  Measured on
 * CLOCK_MONOTONIC, which stops while the host is suspended: a suspend does
 * not make every holder's lease lapse at once on resume.  Default $THROTTLE_LEASE_MS,
 * else 600000 (10 min).  Errors: THROTTLE_EINVAL (0 or more than one
 * day). */
THROTTLE_EXTERN int throttle_config_set_lease(throttle_config_t *cfg,
                                              uint32_t ms);

/* Make every wait of the library interruptible by the caller, e.g. by a
 * language binding that must react to Ctrl-C.  While a call waits (the
 * back-off and gate waits of throttle_wait(), the not-before, slot, probe,
 * rate and pause waits of throttle_enter()), it calls check(arg) at least
 * every period_ms, at once when a signal interrupts its sleep (EINTR), and
 * once before it first sleeps.  A nonzero return abandons the wait: the
 * call gives back whatever it had taken (its queue place, or a slot
 * granted in the meantime, which goes to the next waiter as if abandoned)
 * and returns THROTTLE_EINTR.  check runs in the waiting thread with no
 * lock of the library held, so it may call the library itself; it must
 * not longjmp out.  Handles opened from cfg keep the hook; check = NULL
 * removes it (period_ms is then ignored).
 *
 * Not covered: the segment mutex and the creation lock, which are only
 * ever held for microseconds and whose waits are bounded by the lock
 * timeout (throttle_config_set_lock_timeout), and throttle_try_enter(),
 * which never waits.
 * Errors: THROTTLE_EINVAL (cfg NULL, or period_ms 0 or above 60000 with a
 * check). */
THROTTLE_EXTERN int throttle_config_set_interrupt(throttle_config_t *cfg,
                                                  int (*check)(void *arg),
                                                  void *arg,
                                                  uint32_t period_ms);

/* Flags for throttle_config_set_flags(). */
enum {
  /* Accept (and create) a segment readable and writable by the owner's
   * group (mode 0660), for loaders that run as different users of one
   * group.  Without it, a group- or other-writable segment is refused. */
  THROTTLE_GROUP_SHARED = 1u << 0,
  /* Do not fall back to process-private memory: throttle_open() fails and
   * sets *out to NULL when the segment cannot be used. */
  THROTTLE_NO_FALLBACK = 1u << 1,
  /* Attach only; never create the segment (THROTTLE_ESHM if it is absent). */
  THROTTLE_NO_CREATE = 1u << 2,
  /* Inspect only: open the segment read-only (O_RDONLY, PROT_READ), so
   * that anyone allowed to read it (its owner, root, a user its mode lets
   * read) can look at it without writing a byte, not even its mutex; owner
   * and mode are therefore not checked.  Implies THROTTLE_NO_CREATE.  The
   * reading calls (throttle_remaining, throttle_info, throttle_foreach,
   * throttle_stats) work on a private copy taken at each call.  The key
   * settings calls (throttle_set_*, pause, resume, cancel), publishing,
   * clearing and admitting (throttle_backoff, throttle_clear,
   * throttle_reset, throttle_enter, throttle_try_enter) fail with
   * THROTTLE_EREADONLY; throttle_wait only reads, so it works.  An
   * absent segment is THROTTLE_ESHM; one it may not read, THROTTLE_EOWNER. */
  THROTTLE_READONLY = 1u << 3,
};
THROTTLE_EXTERN int throttle_config_set_flags(throttle_config_t *cfg,
                                              unsigned flags);

/* Share keys across hosts: "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]"
 * (HOST a name, an address or [IPv6]),
 * "unix://[[USER]:PASSWORD@]/PATH/redis.sock[?db=N]", or "shm" (the host's
 * segment alone, the default).  Not supported, and refused by
 * throttle_open(): "rediss://" (no TLS in this build), a Redis Cluster.  Default: $THROTTLE_BACKEND, else "shm".  A Redis backend
 * is the module libthrottle-redis.so.1 (hiredis), loaded by throttle_open()
 * only when asked for, from $THROTTLE_BACKEND_MODULE, the directory of
 * libthrottle or its libthrottle/ subdirectory, or the loader's search
 * path.  The segment stays open: while
 * Redis is unreachable, calls are served there (for this host's processes)
 * and throttle_errmsg() says so; they go back to Redis when it answers.
 * Redis is then the only clock (see README, "Across hosts").
 * Errors: THROTTLE_EINVAL (NULL, empty or longer than 500 bytes; a URL of
 * an unknown form is refused by throttle_open()), THROTTLE_ENOMEM. */
THROTTLE_EXTERN int throttle_config_set_backend(throttle_config_t *cfg,
                                                const char *url);

/* ---- Handles --------------------------------------------------------- */

typedef struct throttle throttle_t;

/* Open (creating if needed) the segment described by cfg (NULL: defaults
 * plus environment) and return a handle in *out.
 *
 * Fail open: when the segment cannot be used, the error is returned but
 * *out is still a working handle on process-private memory (unless
 * THROTTLE_NO_FALLBACK), throttle_is_shared() is 0 for it, and
 * throttle_errmsg() names the cause and the fix.  Callers may log and carry
 * on, or close it and refuse to run.  Either way, close it.
 *
 * Errors: THROTTLE_EINVAL (out is NULL), THROTTLE_ENOMEM (*out is NULL),
 * THROTTLE_ESHM, THROTTLE_ENOSPC, THROTTLE_ESYMLINK, THROTTLE_EMAGIC,
 * THROTTLE_EVERSION, THROTTLE_EFINGERPRINT, THROTTLE_ESIZE, THROTTLE_EOWNER,
 * THROTTLE_EMODE, THROTTLE_EINITTIMEOUT, THROTTLE_ESYS; and for a backend
 * (throttle_config_set_backend): THROTTLE_EINVAL (a URL of no known form),
 * THROTTLE_EBACKEND (the module is missing or foreign); the handle then
 * works on the segment alone, unless THROTTLE_NO_FALLBACK. */
THROTTLE_EXTERN int throttle_open(const throttle_config_t *cfg,
                                  throttle_t **out);

/* Unmap and free.  Nothing in the segment is changed.  NULL is a no-op. */
THROTTLE_EXTERN void throttle_close(throttle_t *h);

/* 1 when h uses the shared segment, 0 when it fell back to private memory. */
THROTTLE_EXTERN int throttle_is_shared(const throttle_t *h);

/* The segment name h uses (or tried to use). */
THROTTLE_EXTERN const char *throttle_segment_name(const throttle_t *h);

/* The backend h shares keys through: "shm" (the segment alone), or the
 * URL given to throttle_config_set_backend() / $THROTTLE_BACKEND with any
 * password replaced by "***".  Never NULL. */
THROTTLE_EXTERN const char *throttle_backend(const throttle_t *h);

/* The backend's health as h last met it: *up is 1 when h's last call
 * reached it (always for "shm"), 0 when that call was served by this
 * host's segment because the backend was unreachable; then *down_ms (may
 * be NULL) is how long ago h first found it so, and *served (may be NULL)
 * how many calls the segment served for h since; both 0 while up.  A
 * handle that has made no call yet reads up.
 * Errors: THROTTLE_EINVAL (h or up NULL). */
THROTTLE_EXTERN int throttle_backend_status(const throttle_t *h, int *up,
                                            uint64_t *down_ms,
                                            uint64_t *served);

/* A human message with context for the last failing call on h in this
 * thread; if there was none, the reason h fell back to private memory
 * (e.g. "THROTTLE_EMAGIC: /name: magic is ...; remove it (throttlectl rm)"),
 * or warnings about environment variables it could not use (each with its
 * value, range and the value used instead, the backend module's too) and
 * about the backend's setup (a Redis that may evict keys, blocking
 * commands refused); otherwise "".
 * throttle_errmsg(NULL) gives the message of a throttle_open() that failed
 * in this thread without a handle (THROTTLE_NO_FALLBACK, or THROTTLE_ENOMEM
 * when not even the private fallback could be made).  Never
 * NULL.  Valid until the next call in this thread. */
THROTTLE_EXTERN const char *throttle_errmsg(const throttle_t *h);

/* Remove the named segment (NULL: $THROTTLE_SEGMENT, else the default
 * name).  Processes that have it open keep their mapping.
 * Errors: THROTTLE_EINVAL (an invalid name, or segment_name NULL and
 * $THROTTLE_SEGMENT set but invalid: the default is never removed in its
 * place), THROTTLE_ENOKEY (no such segment), THROTTLE_ESHM. */
THROTTLE_EXTERN int throttle_unlink(const char *segment_name);

/* ---- Back-off -------------------------------------------------------- */

/* Publish "key: not before now + delay_ms".  The not-before only ever moves
 * later: it becomes max(current, now + min(delay_ms, the segment's maximum
 * delay)).  Wakes
 * nobody early; waiters re-arm for the new time.
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_EFULL (every key has a
 * back-off, a lock episode less than one maximum delay old (a back-off
 * passed, no probe answered yet), a setting or holders pending, so none
 * can be evicted: the caller honours
 * its own delay, e.g. by sleeping it), THROTTLE_ELOCKTIMEOUT,
 * THROTTLE_ECORRUPT.  With a backend across hosts (throttle_backend())
 * that took the back-off, these three come only while the backend is
 * unreachable: the host segment's copy is then a copy, and one that finds
 * no room or no mutex is no error. */
THROTTLE_EXTERN int throttle_backoff(throttle_t *h, const char *key,
                                     uint64_t delay_ms);

/* Non-blocking peek at the back-off: *ms_left = milliseconds until key's
 * not-before passes (0 = passed; a key never seen is open).  Rounds up, so
 * 0 means really passed.  Pause, probe and cap are not counted: see
 * throttle_try_enter() for "may I send now".
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_remaining(throttle_t *h, const char *key,
                                       uint64_t *ms_left);

/* Block until key is open, then return 0.  If it had to sleep, it sleeps
 * past the not-before by a small random jitter (up to 25 ms) so that
 * sleepers do not wake in the same instant.  Holds no lock while asleep.
 * A back-off extended meanwhile makes it sleep on; a clear wakes it at once.
 * It also waits while the key is paused, and while the probe of a lock
 * episode admitted by throttle_enter() is out (until its answer).  A
 * scope's probe holds it as it holds an admission: the first request of a
 * cold scope at most 1 s after its grant, so a holder of one key that
 * waits on a sibling never waits for itself.
 *
 * throttle_wait() does not itself probe: callers that only wait and publish
 * all go when the not-before passes.  For one probe per lock episode (I3),
 * and for caps, use throttle_enter()/throttle_leave().
 *
 * timeout_ms: UINT64_MAX waits as long as it takes; otherwise, when the key
 * would open after the deadline, it returns THROTTLE_ETIMEDOUT at once
 * (or as soon as a longer back-off is published while it sleeps).
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_ETIMEDOUT,
 * THROTTLE_ELOCKTIMEOUT, THROTTLE_EINTR (throttle_config_set_interrupt). */
THROTTLE_EXTERN int throttle_wait(throttle_t *h, const char *key,
                                  uint64_t timeout_ms);
#define THROTTLE_FOREVER UINT64_MAX

/* Drop key's back-off (it opens now) and wake its waiters.  Counters stay.
 * On a scope the waiters of every key beneath are woken too, whether or
 * not the scope has a record of its own (THROTTLE_ENOKEY only when there
 * is neither the key nor any key beneath it).
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_ENOKEY,
 * THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_clear(throttle_t *h, const char *key);

/* Drop every key's back-off and wake every waiter.
 * Errors: THROTTLE_EINVAL, THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_reset(throttle_t *h);

/* ---- Admission -------------------------------------------------------- */

/* Work classes.  Waiting live callers are admitted before waiting backfill
 * callers; backfill may hold at most its share of the key's cap. */
typedef enum {
  THROTTLE_CLASS_LIVE = 0,
  THROTTLE_CLASS_BACKFILL = 1,
} throttle_class_t;

/* What happened to an admitted request, reported to throttle_leave(). */
typedef enum {
  THROTTLE_OUTCOME_OK = 0,           /* success: ends a lock episode */
  THROTTLE_OUTCOME_LOCKED = 1,       /* 409 RESOURCE_LOCKED: publishes back-off */
  THROTTLE_OUTCOME_RATE_LIMITED = 2, /* 429: publishes back-off */
  THROTTLE_OUTCOME_UNAVAILABLE = 3,  /* 503: publishes back-off */
  THROTTLE_OUTCOME_PERMANENT = 4,    /* e.g. 409 CONFLICT: never retried */
  THROTTLE_OUTCOME_FAILED = 5,       /* other transient failure, not published */
  THROTTLE_OUTCOME_ABANDONED = 6,    /* the caller gave up before an answer */
} throttle_outcome_t;

/* An admission, from throttle_enter() to throttle_leave().  Opaque. */
typedef struct throttle_ticket throttle_ticket_t;

/* Block until a request for key may be sent: the not-before has passed (I1),
 * no probe of a lock episode is out (only one caller probes after a
 * back-off), the key's cap has a free slot (granted first come, first
 * served, live before backfill), its rate allows it and it is not paused.
 * Holds nothing while it waits.  On success *ticket is the admission; pass
 * it to throttle_leave() exactly once.
 *
 * timeout_ms: THROTTLE_FOREVER, or a bound on the whole wait; when the
 * not-before lies beyond it, THROTTLE_ETIMEDOUT comes at once.
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_ETIMEDOUT,
 * THROTTLE_ECANCELED (throttle_cancel() on the key), THROTTLE_ENOMEM,
 * THROTTLE_EFULL, THROTTLE_ELOCKTIMEOUT, THROTTLE_EINTR (the interrupt
 * check of throttle_config_set_interrupt() said stop; the queue place is
 * given back).  On THROTTLE_EFULL,
 * THROTTLE_ELOCKTIMEOUT and THROTTLE_ECORRUPT the segment is what failed,
 * not the key: fail open (send anyway, honouring Retry-After yourself).
 * Before it returns THROTTLE_EFULL, THROTTLE_ELOCKTIMEOUT or
 * THROTTLE_ECORRUPT it waits out
 * the latest not-before of the key and of every scope above it, as far as
 * it can read them without the mutex, so
 * failing open is never early (THROTTLE_ETIMEDOUT if that lies past the
 * timeout). */
THROTTLE_EXTERN int throttle_enter(throttle_t *h, const char *key,
                                   throttle_class_t cls, uint64_t timeout_ms,
                                   throttle_ticket_t **ticket);

/* Non-blocking throttle_enter(): admits at once or returns
 * THROTTLE_EWOULDBLOCK with *wait_ms set to a hint of how long to wait
 * (0 when the wait is for a slot rather than a time).  wait_ms may be NULL.
 * Errors: as throttle_enter(), with THROTTLE_EWOULDBLOCK for ETIMEDOUT. */
THROTTLE_EXTERN int throttle_try_enter(throttle_t *h, const char *key,
                                       throttle_class_t cls,
                                       throttle_ticket_t **ticket,
                                       uint64_t *wait_ms);

/* 1 if the ticket was admitted as the probe of a lock episode: of its
 * key's, or of a scope's (the first admission beneath after a scope's
 * back-off, or the first request of a cold scope).  The others beneath
 * wait for a probe's answer, the caller too: a probe of a scope's
 * back-off that enters (or waits on) another key beneath it before it
 * leaves waits for itself until its lease lapses, so report the probe
 * first (a cold scope's first request holds the others 1 s at most). */
THROTTLE_EXTERN int throttle_ticket_is_probe(const throttle_ticket_t *ticket);

/* Report the outcome, free the slot (handing it to the oldest waiter) and
 * free the ticket.  For LOCKED, RATE_LIMITED and UNAVAILABLE, retry_after_ms
 * is published as a back-off (0 means the default of 5000 ms), on the key
 * or one of its scopes (throttle_set_publish_level()); a scope with no
 * record and no room for one in a full table has it published on the key
 * instead.
 * Tickets are unique for the segment's lifetime: a ticket whose admission
 * was already taken back (its lease lapsed, or the same admission was left
 * before, e.g. by a forked copy) matches no slot, frees nothing and
 * returns THROTTLE_ESTALE; a back-off it reports is still published (the
 * server's answer holds whoever asked).
 * Errors: THROTTLE_EINVAL (NULL or unknown outcome; the ticket is still
 * freed), THROTTLE_ESTALE, THROTTLE_ELOCKTIMEOUT (the slot is then
 * reclaimed by its lease), THROTTLE_EFULL (the back-off could be stored
 * nowhere, the table being full of keys in use; the slot is still given
 * back: honour Retry-After yourself). */
THROTTLE_EXTERN int throttle_leave(throttle_t *h, throttle_ticket_t *ticket,
                                   throttle_outcome_t outcome,
                                   uint64_t retry_after_ms);

/* Report a transient outcome and wait to send again, keeping the caller's
 * place: like throttle_leave() (the back-off is published, the probe
 * answered, the cap learned), but the admission's slot goes back into the
 * queue with its original arrival, so it is the oldest waiter, ahead of
 * everyone who arrived after it (a LOCKED retry that left and entered again
 * would queue behind them).  Then it waits as throttle_enter() does, with
 * timeout_ms; on success *ticket is the admission again (the same ticket),
 * to be left or requeued once more.  On any error *ticket is NULL and the
 * place is given back.  Meant for LOCKED, RATE_LIMITED, UNAVAILABLE and
 * FAILED; any outcome is accepted.
 * Errors: as throttle_leave() (THROTTLE_ESTALE when the admission was
 * already taken back: nothing is requeued) and as throttle_enter(). */
THROTTLE_EXTERN int throttle_requeue(throttle_t *h, throttle_ticket_t **ticket,
                                     throttle_outcome_t outcome,
                                     uint64_t retry_after_ms,
                                     uint64_t timeout_ms);

/* ---- Scopes: keys are paths ------------------------------------------
 *
 * A key's scopes are its prefixes at '/': "hotdata:ws1/orders" lies
 * beneath the scope "hotdata:ws1" (its root scope).  A scope is named like
 * any key: throttle_backoff(), throttle_pause(), throttle_resume(),
 * throttle_cancel() and throttle_clear() on a scope reach every key beneath
 * it, and throttle_wait() / throttle_enter() on a key honour the key and
 * all its scopes (I1 on scopes).  When a scope's back-off passes, one
 * admission beneath it goes as the scope's probe; the others, on every key
 * beneath, wait for its answer (I3 on scopes).
 *
 * A scope with a cap (throttle_set_max_parallel()) or a rate
 * (throttle_set_rate()) is a pool: it bounds the SUM of the admissions of
 * every key beneath it.  An admission takes its place at the key and at
 * every pool above it at once; places go first come, first served across
 * the keys of a pool, live before backfill (throttle_set_backfill_share()
 * on the scope bounds backfill's part of the pool); a leave hands its
 * place to the oldest eligible waiter of any key beneath.  Eligible: it
 * could go but for the pool.  A waiter held by a reason of its own (a
 * pause, a back-off or a probe out on its key or on a scope between it and
 * the pool, its key's cap or rate, a nested pool that is full) does not
 * hold the pool's turn, and neither does a waiter that is gone (dead, or,
 * when it cannot be judged, silent at its gate past its lease).  The rate
 * of a pool is a budget for all its keys.  Each key keeps its own cap.  A
 * cap set on a scope (a new pool, or a lowered cap) counts the admissions
 * already in flight beneath it: none more is granted until they are under
 * it (on Redis from each holder's next heartbeat, within a quarter of the
 * liveness: a script cannot name the keys beneath a scope).
 *
 * Where a transient answer is published, per outcome: THROTTLE_LEVEL_KEY
 * (the key itself), THROTTLE_LEVEL_ROOT (its root scope; the key when it
 * has no scope), or n >= 1 (its prefix of n components; the key when it has
 * fewer scopes).  Defaults: LOCKED on the key (a table's lock is the
 * table's); RATE_LIMITED (429) and UNAVAILABLE (503) on the root scope (the
 * workspace or server is what is overloaded).  Per handle, not shared.
 * Errors: THROTTLE_EINVAL (h NULL, another outcome, level out of range). */
#define THROTTLE_LEVEL_KEY 0
#define THROTTLE_LEVEL_ROOT (-1)
THROTTLE_EXTERN int throttle_set_publish_level(throttle_t *h,
                                               throttle_outcome_t outcome,
                                               int level);

/* The most scopes a key may have (that many '/'): "a/b/c" has two, "a" and
 * "a/b".  A deeper key is refused with THROTTLE_EKEY everywhere, so that
 * every scope of a key is honoured on every backend (the Redis backend
 * hands each one to its scripts). */
#define THROTTLE_KEY_MAX_SCOPES 16

/* 0 when key is valid (see Conventions: 1 to 255 bytes, names joined by
 * '/', none empty, no control byte, at most THROTTLE_KEY_MAX_SCOPES
 * scopes), else THROTTLE_EKEY, with the reason in throttle_errmsg(NULL).
 * The check every function makes of its key, for a caller that wants to
 * refuse a bad key before it opens a handle (throttlectl does). */
THROTTLE_EXTERN int throttle_check_key(const char *key);

/* Key settings, kept in the segment and shared by every process. */

/* Cap concurrent admissions to n (1..32: a key tracks 32 participants), or
 * 0 for "auto": learned from outcomes (the default; any auto:MAX bound is
 * dropped).  A fixed n wins over the learner, which keeps what it learned
 * for a return to auto.  Errors: THROTTLE_EINVAL, THROTTLE_EKEY,
 * THROTTLE_EFULL, THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_set_max_parallel(throttle_t *h, const char *key,
                                              uint32_t n);

/* Learn the cap ("auto"), never above max (1..32; 0 = no bound but the
 * 32 participants, as throttle_set_max_parallel(h, key, 0)).  A cap
 * learned above max comes down at once.  What the learner knows is kept
 * across throttle_set_max_parallel() calls; a bound keeps the key from
 * eviction, as a fixed cap does.  The same on every backend.  Errors: as
 * throttle_set_max_parallel() (THROTTLE_EINVAL for max above 32). */
THROTTLE_EXTERN int throttle_set_max_parallel_auto(throttle_t *h,
                                                   const char *key,
                                                   uint32_t max);

/* At most n admissions per period_ms, with a burst of n (GCRA); n = 0 turns
 * the rate off.  Errors: as throttle_set_max_parallel(). */
THROTTLE_EXTERN int throttle_set_rate(throttle_t *h, const char *key,
                                      uint32_t n, uint64_t period_ms);

/* Backfill may hold at most share (0.0 to 1.0) of the key's cap at once
 * (at least one slot when share > 0).  Default 1.0.
 * Errors: as throttle_set_max_parallel(). */
THROTTLE_EXTERN int throttle_set_backfill_share(throttle_t *h,
                                                const char *key,
                                                double share);

/* Hold new admissions of key (in-flight ones finish) / release them.
 * Errors: as throttle_set_max_parallel(). */
THROTTLE_EXTERN int throttle_pause(throttle_t *h, const char *key);
THROTTLE_EXTERN int throttle_resume(throttle_t *h, const char *key);

/* End every current waiter of key at once with THROTTLE_ECANCELED.  Later
 * callers are not affected.  On a scope, every waiter of every key beneath
 * it too, whether or not the scope has a record of its own (keys that
 * publish their 429 and 503 on themselves leave it none); resume on such
 * a scope wakes them.  THROTTLE_ENOKEY only when there is neither the key
 * nor any key beneath it.  Errors: THROTTLE_EINVAL, THROTTLE_EKEY,
 * THROTTLE_ENOKEY, THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_cancel(throttle_t *h, const char *key);

/* The segment's maximum delay: the longest not-before any publisher may
 * store, for every process.  Set by the creator (its max delay), changed
 * here (e.g. by `throttlectl`).  Each process still honours at most its own
 * maximum (throttle_config_set_max_delay()).
 * Errors: THROTTLE_EINVAL (h NULL, ms 0 or more than 7 days),
 * THROTTLE_ELOCKTIMEOUT, THROTTLE_ECORRUPT. */
THROTTLE_EXTERN int throttle_set_segment_max_delay(throttle_t *h,
                                                   uint64_t ms);
/* *ms = the segment's maximum delay.  Errors: THROTTLE_EINVAL. */
THROTTLE_EXTERN int throttle_segment_max_delay(throttle_t *h, uint64_t *ms);

/* ---- Inspection ------------------------------------------------------ */

/* A snapshot of one key, copied under the mutex.  Read it with the
 * accessors below; the fields only ever grow, so their numbers are stable. */
typedef struct throttle_info throttle_info_t;

/* XX(name, json_name, description) */
#define THROTTLE_FIELD_MAP(XX)                                                 \
  XX(REMAINING_MS, "remaining_ms", "ms until the key opens (0 = open)")        \
  XX(PUBLISHES, "publishes", "back-offs published")                            \
  XX(WAITS, "waits", "calls that had to sleep")                                \
  XX(WAITED_MS, "waited_ms", "total time slept by those calls")                \
  XX(LAST_DELAY_MS, "last_delay_ms", "last delay published")                  \
  XX(LAST_PUBLISHER_PID, "last_publisher_pid", "pid of the last publisher")    \
  XX(IDLE_MS, "idle_ms", "ms since the key was last used")                     \
  XX(CLEARS, "clears", "times the back-off was cleared")                      \
  XX(IN_FLIGHT, "in_flight", "admissions held now")                           \
  XX(CAP, "cap", "concurrent admissions allowed now")                         \
  XX(CAP_AUTO, "cap_auto", "1 when the cap is learned, 0 when fixed")         \
  XX(WAITING_LIVE, "waiting_live", "live callers waiting")                    \
  XX(WAITING_BACKFILL, "waiting_backfill", "backfill callers waiting")        \
  XX(PROBE_OUT, "probe_out", "1 while the probe of a lock episode is out")    \
  XX(LOCK_EPISODE, "lock_episode", "1 from a back-off until a probe succeeds") \
  XX(PAUSED, "paused", "1 while new admissions are held")                     \
  XX(RATE_N, "rate_n", "rate: admissions per period (0 = no rate)")           \
  XX(RATE_PERIOD_MS, "rate_period_ms", "rate: the period")                    \
  XX(BACKFILL_SHARE_PERMILLE, "backfill_share_permille",                      \
     "most of the cap backfill may hold, in thousandths")                     \
  XX(ADMITTED, "admitted", "admissions granted")                              \
  XX(LOCKED, "locked", "LOCKED outcomes reported")                            \
  XX(PROBES, "probes", "probes admitted")                                     \
  XX(RECLAIMS, "reclaims", "slots reclaimed from dead or hung holders")       \
  XX(CANCELED, "canceled", "waiters ended by cancel")                         \
  XX(PERMANENT, "permanent", "PERMANENT outcomes reported")                  \
  XX(CAP_GOOD, "cap_good", "learned: largest cap used with no refusal")      \
  XX(CAP_FAIL, "cap_fail", "learned: the cap whose raise was refused (0 none)") \
  XX(CAP_FAILS, "cap_fails", "learned: failed raises since the last good one") \
  XX(CAP_MAX, "cap_max", "auto:MAX bound of the learner (0 = none)")         \
  XX(CAP_RETRY_AFTER_MS, "cap_retry_after_ms",                               \
     "learned: Retry-After of the refusal that set the cap")                 \
  XX(CAP_WORK_MS, "cap_work_ms", "learned: work at the cap since then")      \
  XX(CAP_NEXT_RAISE_MS, "cap_next_raise_ms",                                 \
     "work still due before the next raise (0 now, -1 never)")               \
  XX(CAP_LEARNED_AGO_MS, "cap_learned_ago_ms",                               \
     "ms since a refusal last set the cap (-1 never: slow start)")           \
  XX(WAITERS_UNLISTED, "waiters_unlisted",                                   \
     "waiters counted but not listed (throttle_info_waiter: the first 32)")

typedef enum {
#define THROTTLE_XX_(name, json, desc) THROTTLE_FIELD_##name,
  THROTTLE_FIELD_MAP(THROTTLE_XX_)
#undef THROTTLE_XX_
  THROTTLE_FIELD_COUNT_ /* not a field; grows with the list */
} throttle_field_t;

/* The field's stable JSON name, or NULL for an unknown field. */
THROTTLE_EXTERN const char *throttle_field_name(throttle_field_t f);
/* The key of a snapshot (NUL-terminated) and its length. */
THROTTLE_EXTERN const char *throttle_info_key(const throttle_info_t *info);
/* A field's value; 0 for an unknown field. */
THROTTLE_EXTERN int64_t throttle_info_get(const throttle_info_t *info,
                                          throttle_field_t f);

/* Holder i (0-based) of a snapshot: its pid, how long it has held, its
 * class and whether it is the probe.  Any out pointer may be NULL.
 * Returns 0, or THROTTLE_ENOKEY when i is past the last holder. */
THROTTLE_EXTERN int throttle_info_holder(const throttle_info_t *info,
                                         size_t i, int64_t *pid,
                                         int64_t *age_ms,
                                         throttle_class_t *cls, int *probe);

/* The host name of holder i of a snapshot (the hosts of a backend across
 * hosts; "" on the segment, where every holder is of this host), or NULL
 * when i is past the last holder. */
THROTTLE_EXTERN const char *throttle_info_holder_host(
    const throttle_info_t *info, size_t i);

/* Waiter i (0-based, in arrival order) of a snapshot: its pid, how long
 * it has waited, its class; and its host (as for holders).  At most the
 * first 32 waiters are listed, and on the segment only those in the key's
 * participant slots (the callers beyond them are counted, not recorded);
 * the waiting_* fields count them all, and THROTTLE_FIELD_WAITERS_UNLISTED
 * says how many the list leaves out.  A caller killed while it waited
 * beyond the slots is counted until a slot has stayed free for a second
 * (a live one takes it sooner).
 * Returns 0, THROTTLE_EINVAL for a NULL info, or THROTTLE_ENOKEY when i
 * is past the last waiter; the host function NULL for either. */
THROTTLE_EXTERN int throttle_info_waiter(const throttle_info_t *info,
                                         size_t i, int64_t *pid,
                                         int64_t *age_ms,
                                         throttle_class_t *cls);
THROTTLE_EXTERN const char *throttle_info_waiter_host(
    const throttle_info_t *info, size_t i);

/* What the server said when it last refused the snapshot's key, as noted
 * by throttle_note_refusal(): its HTTP status, error.code, message and
 * Retry-After field ("" for each it did not send), when it was noted
 * (*at_ms: ms since the Unix epoch, by the noting host's clock), by which
 * process and on which host.  The strings are valid UTF-8 without control
 * bytes and live as long as the snapshot.  Any out pointer may be NULL.
 * Returns 0, THROTTLE_EINVAL for a NULL info, or THROTTLE_ENOKEY when none
 * was noted (then *http_status 0 and the strings ""). */
THROTTLE_EXTERN int throttle_info_refusal(const throttle_info_t *info,
                                          int *http_status, const char **code,
                                          const char **message,
                                          const char **retry_after,
                                          int64_t *at_ms, int64_t *pid,
                                          const char **host);

/* Keep what the server said when it refused key (an answer whose back-off
 * was published, or is about to be): http_status (100-999), its
 * error.code, its message and its Retry-After field as sent, each NULL or
 * "" when it sent none.  The words replace the key's last ones, with this
 * process's pid, its host name and the wall-clock time; they decide
 * nothing, and `throttlectl show`, `watch` and `metrics` show them.  Each
 * string is kept as valid UTF-8 without control bytes (a space for each
 * control, '?' for a byte that is not UTF-8) and cut, with a "..." mark,
 * to 63 bytes (code, Retry-After, host) or 199 (message).  The http layer
 * (throttle_curl_perform) notes every refusal it publishes.  With a
 * backend the words are kept in this host's segment, and a snapshot of the
 * key on this host shows them.
 * Errors: THROTTLE_EINVAL (NULL h, a status out of range), THROTTLE_EKEY,
 * THROTTLE_EREADONLY, THROTTLE_EFULL, THROTTLE_ELOCKTIMEOUT,
 * THROTTLE_ECORRUPT, THROTTLE_ESYS (no wall clock). */
THROTTLE_EXTERN int throttle_note_refusal(throttle_t *h, const char *key,
                                          int http_status, const char *code,
                                          const char *message,
                                          const char *retry_after);

/* Snapshot one key into *out (free it with throttle_info_free).
 * Errors: THROTTLE_EINVAL, THROTTLE_EKEY, THROTTLE_ENOKEY, THROTTLE_ENOMEM,
 * THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_info(throttle_t *h, const char *key,
                                  throttle_info_t **out);
THROTTLE_EXTERN void throttle_info_free(throttle_info_t *info);

/* Snapshot every key (copied under the mutex at once), then call fn on each
 * with no lock held, in key order.  Stops early and returns fn's value when
 * it is non-zero.  Errors: THROTTLE_EINVAL, THROTTLE_ENOMEM,
 * THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_foreach(throttle_t *h,
                                     int (*fn)(const throttle_info_t *info,
                                               void *arg),
                                     void *arg);

/* Segment-wide figures for `throttlectl ls`. */
/* *capacity: key capacity; *used: keys in the table; *evictions: keys
 * evicted to make room; *repairs: times a dead mutex owner was repaired
 * after.  Any pointer may be NULL.  Errors: THROTTLE_EINVAL,
 * THROTTLE_ELOCKTIMEOUT. */
THROTTLE_EXTERN int throttle_stats(throttle_t *h, uint32_t *capacity,
                                   uint32_t *used, uint64_t *evictions,
                                   uint64_t *repairs);

#ifdef __cplusplus
}
#endif
#endif /* THROTTLE_H */
