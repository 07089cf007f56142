/* SPDX-License-Identifier: MIT */
/*
 * redis.h — libthrottle-redis.so.1: the contracts across hosts on Redis,
 * loaded by the core through backend.h when THROTTLE_BACKEND names
 * redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (HOST a name, an address or
 * [IPv6]) or unix://[[USER]:PASSWORD@]/PATH[?db=N].  One Redis (a primary,
 * with replicas if wanted): a Cluster is refused (see Keys).
 *
 * Which gate rules the scripts mirror (the .lua files in libthrottle/redis/; the one
 * place that lists them).  Each operation is one Lua script (see
 * Scripts), so a rule that needs several reads and writes runs
 * atomically on the server:
 *   - not-before only moves later: max(current, now + min(delay, the
 *     caller's host segment's max delay)); a reader clamps a stored value
 *     to its own max delay without rewriting it (gate_enter.c publish / table.c
 *     clamp).
 *   - one probe per lock episode: a back-off opens an episode; while its
 *     probe holds a slot nobody else is admitted; an OK from the probe ends
 *     it; a reclaimed probe lets the next waiter probe (gate_enter.c grant).
 *   - FIFO cap, live before backfill, backfill share of the cap (at least
 *     one slot when the share is > 0), GCRA rate with burst n, pause
 *     (gate_enter.c grant_locked, rate_allows, backfill_cap).
 *   - the learned cap (gate_learn.c, docs/LEARNED-CAP.md): a LOCKED
 *     with k >= 1 others in flight sets the cap to min(k, bound), keeps
 *     its Retry-After R and counts a failed raise; a LOCKED with k = 0
 *     and other outcomes teach nothing; an OK granted at the cap adds
 *     hold / cap to the work, makes a raised cap good, and raises it by
 *     one in slow start, else to good + 1 once the work reaches
 *     20 * R * 2^fails; auto:MAX bounds it, a fixed cap stops it and
 *     keeps what it learned (common.lua learn; hold times and the learned
 *     time on Redis's clock); a key new to a scope starts from what the
 *     last refusal of a key beneath it taught (gate_learn.c
 *     throttle__scope_seed_locked; see seed_* below).
 *   - cancel ends the current waiters only; later callers are unaffected.
 *   - scopes (scope.c): a key's gate also honours each of its scopes (its
 *     prefixes at '/'): a scope's not-before (clamped to the caller's max
 *     delay), its pause, and after its not-before one probe for the whole
 *     scope, whose answer ends the scope's episode unless the answer was
 *     published on that scope; a 429 or 503 is published where the
 *     handle's publish level says (the leave script is told the length of
 *     the name); a scope's resume, cancel, clear, setting or back-off wakes
 *     the waiters and watchers of every key beneath, and its cancel ends
 *     those that arrived before it.  The cold-scope rule: a scope this
 *     caller's 429 or 503 would go to, never answered, opens an episode
 *     with no not-before, and its first request holds the keys beneath
 *     at most 1 s after its grant (the enter script is told both
 *     lengths).
 *   - pools: a scope with a fixed cap or a rate bounds the sum of the
 *     admissions beneath it; a grant takes a place at every pool above at
 *     once, in the script that grants it; FIFO across the keys of a pool,
 *     live before backfill, among waiters whose own key and every scope
 *     between it and the pool would let them go (as each last saw it:
 *     common.lua hold_depth; a waiter whose liveness lapsed counts no
 *     more); a leave frees the places and wakes the waiters beneath, and
 *     the oldest eligible one takes the place.  Places of dead holders
 *     are reclaimed by the holder's liveness and lease, as its slot is
 *     (the heartbeat refreshes the places with the slot).  A cap set on a
 *     scope counts the holders already beneath it at their next heartbeat
 *     (a quarter of the liveness), which gives each its place: the setter
 *     cannot name those keys, a script sees only the keys it is given.
 *     Rejected: a pool queue of its own (a second FIFO to keep in step
 *     with the keys' queues; the beneath hash already holds each
 *     waiter's class and arrival), and reading the other keys' state to
 *     judge their waiters' eligibility (keys the script was not given).
 * What differs, and why: Redis is the only clock (scripts read TIME and
 * return relative delays; clients sleep on their own monotonic clock);
 * dead holders are told by a liveness record each holder refreshes (a
 * pid means nothing on another host), not by /proc; admissions are fenced
 * by numbers that never repeat, and a report with a fence that no longer
 * holds a slot can only push the not-before later.
 *
 * Keys.  All keys of one root scope (the key up to its first '/') share
 * one hash tag, thr1:{ROOT}:..., so one script touches a table and the
 * scopes and pools above it atomically: a script's KEYS are the key's own
 * five and, root first, each scope's k and b keys (rds_eval computes them;
 * at most 16 scopes deep).  The tag would keep them in one slot of a
 * Cluster, but a Cluster is refused (rds_check_server at open, by INFO,
 * or where INFO is refused by a CROSSSLOT probe; MOVED, ASK, CROSSSLOT or
 * CLUSTERDOWN later): following redirections needs a
 * slot map from CLUSTER SLOTS, which hiredis 0.14 does not keep, and an
 * empty root ('{}') is no tag at all there.
 * ROOT and the key are percent-encoded ('{', '}', '%', ':', space and
 * non-printing bytes), so braces in a name cannot move the tag.
 *   thr1:{R}:k:KEY   hash: not-before (Redis ms), episode, probe, settings,
 *                    learned cap (auto_* fields, common.lua), counters,
 *                    the fence counter, and the holders as fields
 *                    h:FENCE -> class probe concurrent since live_until
 *                    lease_until lease liveness host pid token (one key:
 *                    an uncontended admission is one read and one write
 *                    of it); born (Redis us when the hash was made: a
 *                    holder with a lower fence is one Redis lost, which
 *                    its heartbeat registers again) and cleared (Redis ms
 *                    of the last clear: a host's copy published before it
 *                    is not healed back).  For a scope (a key up to its last '/'), also
 *                    what the last refusal beneath it taught (seed_*),
 *                    copied by a key new to it; a hash holding only
 *                    those is no key.
 *   thr1:{R}:w:KEY   waiters in arrival order within their class (zset,
 *                    score = id, + 2^52 for backfill: the oldest of a
 *                    class is one range lookup, O(log N) per look)
 *   thr1:{R}:wi:KEY  waiter records: id -> class live_until ... state
 *                    token (the enter call's: a caller whose command
 *                    failed gives back by it what the command did), and
 *                    t:TOKEN -> id for an arrival until its next look,
 *                    so that the give-back of an arrival whose caller
 *                    never heard its number finds it in one read
 *   thr1:{R}:x:KEY   throttle_wait() watchers (zset, score = live_until)
 *   thr1:{R}:q:KEY:ID  one waiter's wake-up list (BLPOP'ed, bounded)
 *   thr1:{R}:b:KEY   when KEY is a scope: the waiters and watchers of the
 *                    keys beneath it (hash: their list -> class, arrival,
 *                    live_until, eligible, the cancel generation at their
 *                    arrival), for wake-ups, cancel and a pool's FIFO
 * A scope's record is an ordinary k hash; a holder's place in a scope (its
 * probe, or its place in a pool) is a holder field of it, h:KEY#FENCE.
 * Every key has a TTL (a day past its not-before and leases by default),
 * so idle keys disappear; a k hash with settings an operator made (a cap,
 * auto:MAX, a rate, a share, a pause) has none until they are unset
 * (common.lua kept(): field exp -1), as a segment never evicts a record
 * with settings.
 *
 * Scripts.  The .lua files are built (Makefile) into two forms of the
 * same code: a Redis Functions library (Redis 7: common.lua's helpers
 * defined once when the library loads, one function per operation, each
 * calling common.lua's begin() first, which sets up the call's state;
 * enter and leave first try their lean path, which decides the common
 * case from the replies alone and makes the same writes),
 * named libthrottle_DIGEST after a digest of its text, its functions
 * thr_DIGEST_OP, so that two versions of the module share a server
 * without calling each other's; and one script per operation, common.lua
 * in front of it, for EVALSHA.  A call is FCALL; "Function not found" (a
 * restart empty, a failover to a server without it, FUNCTION FLUSH) loads
 * the library (FUNCTION LOAD REPLACE) and calls again, once.  A server
 * without Functions ("unknown command": before 7, a proxy) or a user who
 * may not use them (NOPERM) gets EVALSHA, with EVAL on NOSCRIPT, for the
 * handle's life (redis_conn.c eval_keys).  Why: a script called by
 * EVALSHA runs its whole text at each call, and making common.lua's
 * hundred helpers anew was about a quarter of an admission's cost on the
 * server (bench/bench_redis.c).
 *
 * Faults (docs/FAILURE-MODEL.md, Across hosts): an error reply is that
 * call's diagnostic, not an outage; a connection the server closed while
 * idle is opened again once; every reply's shape is checked; BLPOP
 * refused means polling every RDS_POLL_MS, said as a standing notice, as
 * is an eviction policy other than noeviction (read at open); a waiting
 * call's commands end by its deadline; an enter's answer carries the key's
 * settings and its scopes', which the core mirrors in the host's segment.
 *
 * Rejected: pub/sub for wake-ups (a message sent while a subscriber
 * reconnects is lost; a list survives it, and a lost push costs one
 * re-check at the bounded BLPOP timeout, never a hang); client clocks in
 * scores; a second connection per waiter for BLPOP (the pool lends one).
 */
#ifndef THROTTLE_REDIS_H
#define THROTTLE_REDIS_H

#include "backend.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <string.h>

#define RDS_POOL_MAX 8
#define RDS_DEFAULT_TIMEOUT_MS 250u
#define RDS_DEFAULT_LIVENESS_MS 10000u
#define RDS_DEFAULT_TTL_MS UINT64_C(86400000)
#define RDS_RETRY_MS 1000u /* after a failure, the segment serves this long */
#define RDS_MAX_SLEEP_MS 1000u /* no waiter polls more than about 1/s */
#define RDS_MIN_SLEEP_MS 10u   /* never a zero or sub-ms BLPOP timeout */
/* An admission whose command timed out is sent to the segment only when
 * a new connection's PING is not answered within this either: a Redis
 * that answers late (loaded) is no outage (redis_ops.c failed()). */
#define RDS_ALIVE_MS 1000u

enum rds_script {
  RDS_ENTER, RDS_LEAVE, RDS_PEEK, RDS_SET, RDS_INFO, RDS_BEAT, RDS_NSCRIPTS
};

struct rds_ticket {
  struct rds_ticket *next; /* in the handle's list of held tickets */
  char fence[32];
  int lapsed; /* the heartbeat found it gone */
  int cls;
  pid_t pid;         /* the holder: a forked child beats only its own */
  uint64_t since_ms; /* monotonic, at the grant */
  char key[THROTTLE__KEY_MAX + 1];
};

/* An enter whose caller did not hear the answer (its command failed; it
 * may run later): what it did is given back by its token (leave.lua),
 * from the heartbeat thread, until found or until `until`; id is the
 * waiter's number when the caller had one ("0": an arrival). */
struct rds_giveback {
  struct rds_giveback *next;
  char token[48];
  char id[32];
  pid_t pid;      /* whose: a forked child sends only its own */
  uint64_t until; /* monotonic ms */
  char key[THROTTLE__KEY_MAX + 1];
};

/* A key whose reservations (this host's segment's callers, enter.lua)
 * the heartbeat keeps until the segment has drained. */
struct rds_reserved {
  struct rds_reserved *next;
  char key[THROTTLE__KEY_MAX + 1];
};

struct rds {
  /* where */
  char url[512];   /* as given: never printed (it may hold a password) */
  char shown[512]; /* the URL with the password masked, for messages */
  char host[256];  /* a name, or an address (IPv6 without brackets) */
  char path[256]; /* unix socket, or "" */
  int port;
  int db;
  char user[128];     /* ACL user, or "" (AUTH PASSWORD alone) */
  char password[128];
  /* how */
  uint32_t timeout_ms;  /* connect and command */
  uint32_t liveness_ms; /* a dead holder is reclaimed within this */
  uint64_t ttl_ms;
  uint64_t max_delay_ms; /* what this process honours */
  uint64_t store_max_ms; /* what a publish may store (the segment's max) */
  uint32_t lease_ms;
  int (*intr)(void *arg); /* the caller's interrupt check, or NULL */
  void *intr_arg;
  uint64_t intr_period_ms;
  char me[300]; /* hostname, for info and listings */
  /* this host's segment: how many callers of a key it still holds or
   * queues, and its name (hostname@segment: its reservations in Redis) */
  uint32_t (*seg_count)(void *arg, const char *key);
  /* and the settings it keeps of a key and its scopes (backend.h) */
  int (*seg_settings)(void *arg, const char *key, uint64_t within_ms,
                      struct throttle__be_settings *out);
  void *seg_arg;
  char seg_id[400];
  /* connections */
  pthread_mutex_t mu;
  redisContext *pool[RDS_POOL_MAX];
  int npool;
  pid_t pid; /* owner of the pool: a forked child starts afresh */
  char sha[RDS_NSCRIPTS][41]; /* EVALSHA's, once loaded */
  _Atomic int eval_only; /* no Functions to be had: EVALSHA (redis_conn.c) */
  /* FCALLs in a row that ended with the server closing the connection (a
   * proxy that drops one on a command it does not know: redis_conn.c) */
  _Atomic int fcall_closed;
  uint64_t down_until; /* monotonic ms; the segment serves until then */
  char down_why[512];  /* what failed then, for the calls until then */
  int cluster;         /* a Cluster node: refused for good (see below) */
  /* Standing warnings (backend.h notice), under mu: the eviction policy
   * read at open, and blocking commands refused (waiters poll until
   * poll_until, then try BLPOP again). */
  char warn_policy[768];
  char warn_block[768];
  _Atomic unsigned notice_gen;
  _Atomic uint64_t poll_until; /* monotonic ms */
  /* held admissions, kept alive by the heartbeat thread */
  struct rds_ticket *held;
  struct rds_giveback *giveback;
  struct rds_reserved *reserved;
  pthread_t beat;
  pthread_cond_t beat_cv;
  int beat_running, stopping; /* this process's thread: cleared at fork */
  struct rds *reg_next; /* in the module's list of open handles (fork) */
};

#define RDS_POLL_MS 250u /* a waiter's look when BLPOP is refused */
#define RDS_BLOCK_RETRY_MS 60000u /* then BLPOP is tried again after this */

/* redis_url.c */
int rds_parse_url(struct rds *r, const char *url, char *msg, size_t len);
void rds_key(char *out, size_t len, const char *kind, const char *key);

/* redis_conn.c */
uint64_t rds_mono_ms(void);
void rds_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *rds_lastmsg(void);
/* A new connection, greeted (AUTH, SELECT, PING), or NULL (message set).
 * The greeting gets the command timeout; with rds_connect_by, for an
 * admission that needs to know whether Redis is up or only busy, up to
 * RDS_ALIVE_MS, cut to deadline (rds_mono_ms; 0: the command timeout). */
redisContext *rds_connect(struct rds *r);
redisContext *rds_connect_by(struct rds *r, uint64_t deadline);
/* At open: a Cluster is refused (THROTTLE_EBACKEND, message in msg), the
 * eviction policy read; the connection goes to the pool. */
int rds_check_server(struct rds *r, char *msg, size_t len);
redisContext *rds_get(struct rds *r);
/* rds_get, a new connection greeted as rds_connect_by's */
redisContext *rds_get_by(struct rds *r, uint64_t deadline);
/* c's last command got no answer within its timeout (no EOF, no reset):
 * Redis may be stalled, or only busy. */
int rds_timed_out(const redisContext *c);
/* The calling thread's call found Redis slow, not down: until rds_put()
 * of its connection (set by rds_deadline), its commands get up to
 * RDS_ALIVE_MS, cut to the deadline. */
void rds_slow(void);
/* The next command on c is its first since it sat idle (the pool, the
 * heartbeat's own): a connection the server closed meanwhile is opened
 * again and the command sent once more (redis_conn.c). */
void rds_idle(redisContext *c);
/* redisCommandArgv() without SIGPIPE, with the idle retry above. */
redisReply *rds_command(struct rds *r, redisContext *c, int argc,
                        const char **argv);
/* The caller's deadline (monotonic ms, UINT64_MAX none) for the commands
 * of this thread until the next rds_put(): none waits past it. */
void rds_deadline(struct rds *r, redisContext *c, uint64_t deadline);
int rds_past(uint64_t deadline);
void rds_put(struct rds *r, redisContext *c, int ok);
void rds_pool_free(struct rds *r);
/* NULL: a connection failure (c->err set) or an error reply (c->err 0,
 * message set; the connection is still good). */
redisReply *rds_eval(struct rds *r, redisContext *c, enum rds_script s,
                     const char *key, int argc, const char **argv);
/* 0 woken or timed out, -1 a connection failure. */
int rds_blpop(struct rds *r, redisContext *c, const char *key, const char *id,
              uint64_t ms, uint64_t deadline);
/* The leave script's answer (leave.lua): the bulk string "leave N", N 0
 * to 3; -1 for any other reply. */
static inline int rds_leave_code(const redisReply *rep) {
  if (rep->type != REDIS_REPLY_STRING || rep->len != 7 ||
      memcmp(rep->str, "leave ", 6) != 0 || rep->str[6] < '0' ||
      rep->str[6] > '3')
    return -1;
  return rep->str[6] - '0';
}
/* A reply of the wrong shape: c is failed with a message (a server that
 * answers anything must not admit anyone). */
void rds_bad_reply(redisContext *c, const char *what,
                   const redisReply *rep);
int rds_down(struct rds *r, redisContext *c, const char *what);
/* backend.h notice: the standing warnings, joined. */
unsigned rds_notice(struct rds *r, char *buf, size_t len);

/* redis_beat.c: the heartbeat (started when needed), and the lists it
 * works through. */
void rds_hold(struct rds *r, struct rds_ticket *t);
void rds_unhold(struct rds *r, struct rds_ticket *t);
void rds_give_back(struct rds *r, const char *key, const char *token,
                   const char *id);
/* The give-backs still pending, sent once more by a handle that closes
 * (its heartbeat stopped): each at most a command timeout, stopping at the
 * first that fails; what is left waits for the liveness bound. */
void rds_give_back_last(struct rds *r);
void rds_reserved(struct rds *r, const char *key);
/* What this host's segment keeps of the settings of key and its scopes,
 * for a script to put back in a hash Redis lost (enter.lua ARGV 17,
 * beat.lua ARGV 12, or 10 after '-r'): as the script tells settings, '-'
 * for a name with none, ';' between, the key first; "" when there are
 * none.  Asked for the names this host used within the idle TTL: a key
 * idle for that long in Redis may have lapsed there for want of settings,
 * dropped on purpose. */
void rds_settings_kept(struct rds *r, const char *key, char *buf,
                       size_t len);
#define RDS_KEPT_LEN (THROTTLE__BE_NSETTINGS * 80)

/* redis_lua.c (generated from the .lua files in libthrottle/redis/) */
extern const char *const rds_scripts[RDS_NSCRIPTS];
extern const char *const rds_functions[RDS_NSCRIPTS];
extern const char rds_library[];

#endif
