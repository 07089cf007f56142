/* SPDX-License-Identifier: MIT */
/*
 * redis_conn.c — the Redis backend's connections: the URL, a small pool of
 * hiredis connections with connect and command timeouts, the script calls
 * (FCALL of the module's Functions library, loaded when the server lacks
 * it; EVALSHA with the NOSCRIPT fallback where Functions are not to be
 * had), the key names, and the "down" state that sends callers to the
 * host's segment for a while after a failure.
 *
 * A connection that failed in any way is freed, never reused: after a
 * timeout its reply may still arrive and would answer the next command.
 * After a failure the segment serves for RDS_RETRY_MS, then the next call
 * tries Redis again (one connect timeout at most), so a dead server costs
 * each process one timeout per second, not one per call.  Rejected: a
 * health-check thread (a process that makes no calls needs no answer).
 */
#include "redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static __thread char msgbuf[768];

void rds_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  /* va_start above: the analyser loses it across the TLS buffer */
  vsnprintf(msgbuf, sizeof msgbuf, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
  va_end(ap);
}

const char *rds_lastmsg(void) { return msgbuf; }

uint64_t rds_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- connections ------------------------------------------------------- */

static struct timeval tv_ms(uint64_t ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* hiredis write()s to its socket: a server gone away would raise SIGPIPE
 * and kill a caller that never asked for Redis.  The signal is blocked in
 * this thread for the call, and one it raised is taken off the pending
 * set before the mask is restored (as libcurl does); a SIGPIPE already
 * pending for another reason is left alone. */
static redisReply *cmd(redisContext *c, int argc, const char **argv) {
  sigset_t pipe, old, pending;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  sigpending(&pending);
  int was_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  redisReply *rep = redisCommandArgv(c, argc, argv, NULL);
  if (!was_pending) {
    struct timespec zero = {0, 0};
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE))
      while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
        ;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rep;
}

void rds_bad_reply(redisContext *c, const char *what,
                   const redisReply *rep) {
  static const char *const types[] = {"?",      "string", "array", "integer",
                                      "nil",    "status", "error"};
  int t = rep != NULL ? rep->type : 0;
  c->err = REDIS_ERR_PROTOCOL;
  snprintf(c->errstr, sizeof c->errstr,
           "unexpected reply to %s (%s%s%.40s): not a Redis server, or a "
           "proxy that changes replies",
           what, t >= 1 && t <= 6 ? types[t] : "?",
           rep != NULL && (t == REDIS_REPLY_STATUS || t == REDIS_REPLY_ERROR ||
                           t == REDIS_REPLY_STRING)
               ? " "
               : "",
           rep != NULL && (t == REDIS_REPLY_STATUS || t == REDIS_REPLY_ERROR ||
                           t == REDIS_REPLY_STRING)
               ? rep->str
               : "");
}

/* A reply that must be the status word want: 0, or -1 with the reason in
 * the message buffer (an error reply named as Redis gave it: NOAUTH,
 * WRONGPASS, NOPERM...) or in c (a wrong shape). */
static int status_reply(redisContext *c, redisReply *rep, const char *what,
                        const char *want) {
  if (rep == NULL) {
    rds_msg("%s: %s", what, c->errstr[0] ? c->errstr : "no reply");
    return -1;
  }
  int rc = 0;
  if (rep->type == REDIS_REPLY_ERROR) {
    if (strncmp(rep->str, "NOAUTH", 6) == 0)
      rds_msg("Redis wants a password (%.100s): give it in the URL, "
              "redis://[USER]:PASSWORD@HOST or unix://[USER]:PASSWORD@/PATH",
              rep->str);
    else
      rds_msg("%s refused: %.200s", what, rep->str);
    rc = -1;
  } else if (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, want) != 0) {
    rds_bad_reply(c, what, rep);
    rds_msg("%s", c->errstr);
    rc = -1;
  }
  freeReplyObject(rep);
  return rc;
}

/* AUTH ([USER] PASSWORD), SELECT and a PING on a new connection: a Redis
 * that wants a password says NOAUTH to the PING, and a server that is no
 * Redis (or a proxy that answers for it) fails the PING's shape. */
static int greet(struct rds *r, redisContext *c) {
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  const char *auth1[] = {"AUTH", r->password};
  const char *auth2[] = {"AUTH", r->user, r->password};
  const char *sel[] = {"SELECT", db};
  const char *ping[] = {"PING"};
  if (r->password[0] != 0 &&
      status_reply(c, r->user[0] ? cmd(c, 3, auth2) : cmd(c, 2, auth1),
                   "AUTH", "OK") != 0)
    return -1;
  if (r->db != 0 && status_reply(c, cmd(c, 2, sel), "SELECT", "OK") != 0)
    return -1;
  return status_reply(c, cmd(c, 1, ping), "PING", "PONG");
}

/* The host as an address, resolved within the connect timeout
 * (getaddrinfo_a): a DNS server that does not answer costs a call no more
 * than an unreachable Redis does.  A lookup that timed out and cannot be
 * canceled keeps its request (a few hundred bytes) until it completes. */
static int resolve(const struct rds *r, char *addr, size_t len) {
  unsigned char tmp[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, r->host, tmp) == 1 ||
      inet_pton(AF_INET6, r->host, tmp) == 1) {
    snprintf(addr, len, "%s", r->host);
    return 0;
  }
  struct gaicb *req = calloc(1, sizeof *req);
  struct addrinfo *hints = calloc(1, sizeof *hints);
  char *name = strdup(r->host);
  if (req == NULL || hints == NULL || name == NULL) {
    free(req);
    free(hints);
    free(name);
    rds_msg("out of memory");
    return -1;
  }
  hints->ai_family = AF_UNSPEC;
  hints->ai_socktype = SOCK_STREAM;
  req->ar_name = name;
  req->ar_request = hints;
  struct gaicb *list[1] = {req};
  if (getaddrinfo_a(GAI_NOWAIT, list, 1, NULL) != 0) {
    free(req);
    free(hints);
    free(name);
    rds_msg("cannot resolve %s", r->host);
    return -1;
  }
  struct timespec ts = {(time_t)(r->timeout_ms / 1000),
                        (long)(r->timeout_ms % 1000) * 1000000};
  const struct gaicb *const *wait = (const struct gaicb *const *)list;
  int e;
  while ((e = gai_error(req)) == EAI_INPROGRESS &&
         gai_suspend(wait, 1, &ts) == EAI_INTR)
    ; /* a signal: the remaining time is not tracked, nor worth it */
  if (e == EAI_INPROGRESS && gai_cancel(req) != EAI_CANCELED) {
    rds_msg("resolving %s: no answer within %u ms", r->host, r->timeout_ms);
    return -1; /* still running: req, hints and name stay its own */
  }
  int rc = -1;
  if (e == 0 && req->ar_result != NULL) {
    const struct addrinfo *ai = req->ar_result;
    const void *a = ai->ai_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)ai->ai_addr)
                              ->sin6_addr
                        : (const void *)&((struct sockaddr_in *)ai->ai_addr)
                              ->sin_addr;
    rc = inet_ntop(ai->ai_family, a, addr, (socklen_t)len) != NULL ? 0 : -1;
  }
  if (rc != 0)
    rds_msg("cannot resolve %s: %s", r->host,
            e == EAI_INPROGRESS ? "no answer in time" : gai_strerror(e));
  if (req->ar_result != NULL)
    freeaddrinfo(req->ar_result);
  free(req);
  free(hints);
  free(name);
  return rc;
}

/* A connection is this process's: a program it execs (throttlectl run's
 * command, a subprocess) must not hold it open or write on it.  hiredis
 * 0.14 opens its sockets without SOCK_CLOEXEC, so a thread forking and
 * exec'ing between its socket() and this call still passes one on; that
 * window is the connect's, once per connection. */
static int cloexec(redisContext *c) {
  int fl = fcntl(c->fd, F_GETFD);
  return fl < 0 || fcntl(c->fd, F_SETFD, fl | FD_CLOEXEC) != 0 ? -1 : 0;
}

redisContext *rds_connect(struct rds *r) {
  return rds_connect_by(r, 0);
}

redisContext *rds_connect_by(struct rds *r, uint64_t deadline) {
  struct timeval tv = tv_ms(r->timeout_ms);
  /* the greeting's PING is the evidence that Redis is up: given up to
   * RDS_ALIVE_MS (a busy Redis answers late), cut to the caller's deadline */
  uint64_t greet_ms = r->timeout_ms;
  if (deadline != 0) {
    uint64_t now = rds_mono_ms();
    greet_ms = deadline > now ? deadline - now : 0;
    if (greet_ms > RDS_ALIVE_MS)
      greet_ms = RDS_ALIVE_MS;
    if (greet_ms < RDS_MIN_SLEEP_MS)
      greet_ms = RDS_MIN_SLEEP_MS;
  }
  char addr[sizeof r->host];
  if (!r->path[0] && resolve(r, addr, sizeof addr) != 0)
    return NULL;
  redisContext *c = r->path[0] ? redisConnectUnixWithTimeout(r->path, tv)
                               : redisConnectWithTimeout(addr, r->port, tv);
  if (c == NULL) {
    rds_msg("connect: out of memory");
    return NULL;
  }
  if (c->err) {
    rds_msg("connect: %s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (cloexec(c) != 0) {
    rds_msg("connect: close-on-exec: %s", strerror(errno));
    redisFree(c);
    return NULL;
  }
  if (redisSetTimeout(c, tv_ms(greet_ms)) != REDIS_OK) {
    rds_msg("setting the command timeout: %s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (greet(r, c) != 0 || redisSetTimeout(c, tv) != REDIS_OK) {
    redisFree(c);
    return NULL;
  }
  return c;
}

/* The segment serves for RDS_RETRY_MS; why is said meanwhile. */
static void mark_down(struct rds *r, const char *why) {
  pthread_mutex_lock(&r->mu);
  r->down_until = rds_mono_ms() + RDS_RETRY_MS;
  snprintf(r->down_why, sizeof r->down_why, "%.*s",
           (int)sizeof r->down_why - 1, why);
  pthread_mutex_unlock(&r->mu);
}

static unsigned bump_notice(struct rds *r) {
  return atomic_fetch_add(&r->notice_gen, 1) + 1;
}

int rds_check_server(struct rds *r, char *msg, size_t len) {
  redisContext *c = rds_connect(r);
  if (c == NULL)
    return 0; /* unreachable or slow now: the calls try again, say why */
  /* A Cluster node: refused (see redis.h, Keys), before any key is
   * touched.  Where INFO is refused to the user, a Cluster still answers
   * a command on keys of two slots with CROSSSLOT (or CLUSTERDOWN),
   * before running anything: EVALSHA of a script that does not exist,
   * which a single Redis answers NOSCRIPT, and which the module may run
   * as it must run its own. */
  const char *info[] = {"INFO", "cluster"};
  redisReply *rep = cmd(c, 2, info);
  int cluster = rep != NULL && rep->type == REDIS_REPLY_STRING &&
                strstr(rep->str, "cluster_enabled:1") != NULL;
  if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
    freeReplyObject(rep);
    const char *probe[] = {"EVALSHA", "0000000000000000000000000000000000000000",
                           "2", "thr1:{a}:probe", "thr1:{b}:probe"};
    rep = cmd(c, 5, probe);
    cluster = rep != NULL && rep->type == REDIS_REPLY_ERROR &&
              (strncmp(rep->str, "CROSSSLOT", 9) == 0 ||
               strncmp(rep->str, "CLUSTERDOWN", 11) == 0);
  }
  if (rep != NULL)
    freeReplyObject(rep);
  if (cluster) {
    redisFree(c);
    snprintf(msg, len,
             "%s: a Redis Cluster node: Cluster is not supported (this "
             "module sends every key to the one server it names and keeps "
             "no slot map to follow MOVED or ASK); use a single Redis (a "
             "primary, with replicas if wanted)",
             r->shown);
    return THROTTLE_EBACKEND;
  }
  /* An evicting policy may drop a back-off or a held slot without a
   * word: said once, for as long as the handle lives. */
  const char *pol[] = {"CONFIG", "GET", "maxmemory-policy"};
  rep = cmd(c, 3, pol);
  char warn[sizeof r->warn_policy] = "";
  if (rep == NULL) {
    redisFree(c);
    return 0;
  }
  if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
      rep->element[1]->type == REDIS_REPLY_STRING) {
    if (strcmp(rep->element[1]->str, "noeviction") != 0)
      snprintf(warn, sizeof warn,
               "%.300s: maxmemory-policy is %.40s: under memory pressure Redis "
               "may evict back-offs and held slots without a word; set "
               "noeviction",
               r->shown, rep->element[1]->str);
  } else {
    snprintf(warn, sizeof warn,
             "%.300s: cannot read maxmemory-policy (%.80s): unless it is "
             "noeviction, Redis may evict back-offs and held slots",
             r->shown,
             rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
  }
  freeReplyObject(rep);
  pthread_mutex_lock(&r->mu);
  snprintf(r->warn_policy, sizeof r->warn_policy, "%s", warn);
  pthread_mutex_unlock(&r->mu);
  if (warn[0])
    bump_notice(r);
  rds_put(r, c, 1);
  return 0;
}

/* The connection the next command of this thread sends on first since it
 * sat idle (see rds_idle), and whether this thread's commands have a
 * shorter timeout than the handle's (a caller's deadline is near). */
static __thread redisContext *tl_idle;
static __thread redisContext *tl_short;
static __thread uint64_t tl_deadline;
/* this thread's call found Redis slow, not down: its commands get up to
 * RDS_ALIVE_MS (cut to the deadline), so a backlog of a few hundred ms
 * does not time them out again and again (each a new connection and an
 * arrival again: more load on a loaded Redis) */
static __thread int tl_slow;

void rds_slow(void) { tl_slow = 1; }

void rds_idle(redisContext *c) { tl_idle = c; }

/* The server (or a proxy, a load balancer) closed the connection: it
 * timed out idle, or was killed.  Not a timeout: a command that timed
 * out may still run, one closed before it was read never does. */
static int closed(const redisContext *c) {
  return c->err == REDIS_ERR_EOF ||
         (c->err == REDIS_ERR_IO &&
          (strstr(c->errstr, "reset") != NULL ||
           strstr(c->errstr, "Broken pipe") != NULL));
}

redisReply *rds_command(struct rds *r, redisContext *c, int argc,
                        const char **argv) {
  int idle = tl_idle == c;
  tl_idle = NULL;
  if (tl_short == c && (tl_deadline != UINT64_MAX || tl_slow)) {
    uint64_t now = rds_mono_ms();
    uint64_t left = tl_deadline > now ? tl_deadline - now : 0;
    uint64_t most = tl_slow && RDS_ALIVE_MS > r->timeout_ms ? RDS_ALIVE_MS
                                                             : r->timeout_ms;
    if (left < RDS_MIN_SLEEP_MS)
      left = RDS_MIN_SLEEP_MS;
    if (left < most || tl_slow)
      redisSetTimeout(c, tv_ms(left < most ? left : most));
  }
  redisReply *rep = cmd(c, argc, argv);
  if (rep == NULL && idle && closed(c)) {
    /* Once: the connection was closed while it sat unused, so the
     * command never ran; a failed reconnect is an outage as any other. */
    if (redisReconnect(c) == REDIS_OK && cloexec(c) == 0 &&
        redisSetTimeout(c, tv_ms(r->timeout_ms)) == REDIS_OK &&
        greet(r, c) == 0)
      rep = cmd(c, argc, argv);
    else if (c->err == 0) {
      c->err = REDIS_ERR_OTHER;
      snprintf(c->errstr, sizeof c->errstr, "reconnecting: %.100s",
               msgbuf);
    }
  }
  return rep;
}

void rds_deadline(struct rds *r, redisContext *c, uint64_t deadline) {
  (void)r;
  tl_short = c;
  tl_deadline = deadline;
}

int rds_past(uint64_t deadline) {
  return deadline != UINT64_MAX && rds_mono_ms() + 2 >= deadline;
}

/* A connection, or NULL (message set) while Redis is down. */
redisContext *rds_get(struct rds *r) { return rds_get_by(r, 0); }

redisContext *rds_get_by(struct rds *r, uint64_t deadline) {
  redisContext *c = NULL;
  pthread_mutex_lock(&r->mu);
  if (r->pid != getpid()) {
    /* A forked child: the parent's sockets are not ours to talk on. */
    for (int i = 0; i < r->npool; i++)
      redisFree(r->pool[i]);
    r->npool = 0;
    r->pid = getpid();
  }
  if (r->cluster) {
    pthread_mutex_unlock(&r->mu);
    rds_msg("%s: a Redis Cluster (it redirected a key to another node), "
            "which the Redis backend does not support; this host's segment "
            "serves",
            r->shown);
    return NULL;
  }
  if (rds_mono_ms() < r->down_until) {
    rds_msg("%s: %s; this host's segment serves until it is back", r->shown,
            r->down_why[0] ? r->down_why : "unreachable");
    pthread_mutex_unlock(&r->mu);
    return NULL;
  }
  if (r->npool > 0)
    c = r->pool[--r->npool];
  pthread_mutex_unlock(&r->mu);
  if (c != NULL)
    rds_idle(c);
  if (c == NULL && (c = rds_connect_by(r, deadline)) == NULL) {
    char why[512];
    snprintf(why, sizeof why, "%.400s", msgbuf);
    rds_msg("%s: %s; this host's segment serves until it is back", r->shown,
            why);
    mark_down(r, why);
  }
  return c;
}

/* Give c back (ok) or drop it (after any failure). */
void rds_put(struct rds *r, redisContext *c, int ok) {
  if (c == NULL)
    return;
  if (tl_short == c) {
    tl_short = NULL;
    tl_slow = 0;
    if (ok && c->err == 0 && redisSetTimeout(c, tv_ms(r->timeout_ms)) != 0)
      ok = 0;
  }
  if (tl_idle == c)
    tl_idle = NULL;
  if (ok && c->err == 0) {
    pthread_mutex_lock(&r->mu);
    if (r->pid == getpid() && r->npool < RDS_POOL_MAX) {
      r->pool[r->npool++] = c;
      c = NULL;
    }
    pthread_mutex_unlock(&r->mu);
  }
  if (c != NULL)
    redisFree(c);
}

void rds_pool_free(struct rds *r) {
  for (int i = 0; i < r->npool; i++)
    redisFree(r->pool[i]);
  r->npool = 0;
}

/* A failed call.  A connection failure drops c and marks Redis down for a
 * while; an error reply (a script error: c is still good) is this call's
 * diagnostic only, and the caller's other keys keep going to Redis. */
int rds_timed_out(const redisContext *c) {
  return c != NULL && c->err == REDIS_ERR_IO &&
         (errno == EAGAIN || strstr(c->errstr, "temporarily unavailable"));
}

int rds_down(struct rds *r, redisContext *c, const char *what) {
  char why[512];
  if (c != NULL && c->err == 0) {
    snprintf(why, sizeof why, "%.400s", msgbuf);
    rds_put(r, c, 1);
    rds_msg("%s: %s: %s; this host's segment serves this call", r->shown,
            what, why);
    return THROTTLE__BE_DOWN;
  }
  if (rds_timed_out(c))
    snprintf(why, sizeof why, "no answer within %u ms", r->timeout_ms);
  else
    snprintf(why, sizeof why, "%.400s",
             c != NULL && c->err ? c->errstr : msgbuf);
  rds_put(r, c, 0);
  char full[600];
  snprintf(full, sizeof full, "%s: %s", what, why);
  mark_down(r, full);
  rds_msg("%s: %s; this host's segment serves until it is back", r->shown,
          full);
  return THROTTLE__BE_DOWN;
}

/* ---- scripts ----------------------------------------------------------- */

#define NKEYS 5
#define NCOMMON 4
/* scopes passed to a script: all of them (deeper keys are refused) */
#define NSCOPES_MAX THROTTLE_KEY_MAX_SCOPES
#define KEYNAME_MAX (THROTTLE__KEY_MAX * 6 + 64)

/* One script call: FCALL of the script's function, and when the server
 * does not know it (after a restart, a failover or a FUNCTION FLUSH) the
 * library loaded and the call made again, once.  A server without
 * Functions (before Redis 7, a proxy that does not pass them: "unknown
 * command"), or a user who may not call or load them (NOPERM), gets the
 * same script by EVALSHA, with EVAL when the server does not know it,
 * for as long as the handle lives (redis.h, Scripts).  NULL on a
 * connection failure (c->err set) or a script error (message set).
 * KEYS: the key's state
 * hash, waiters, waiter records, watchers and beneath hash (common.lua),
 * then each scope's state hash and beneath hash, root first: all under
 * the key's root hash tag, so one script reads and writes them all. */
typedef char rds_keyname[KEYNAME_MAX];
static redisReply *eval_keys(struct rds *r, redisContext *c,
                             enum rds_script s, const char *key, int argc,
                             const char **argv, rds_keyname *keys);

/* The server has no Functions, or this user may not use them: an error
 * reply that names the command unknown (Redis before 7, a proxy) or not
 * permitted (an ACL written for EVALSHA). */
static int no_functions(const redisReply *rep) {
  return rep->type == REDIS_REPLY_ERROR &&
         (strncmp(rep->str, "NOPERM", 6) == 0 ||
          strncasecmp(rep->str, "ERR unknown command", 19) == 0);
}

/* FUNCTION LOAD REPLACE of the library (REPLACE: another process may have
 * loaded it since this one was told it was missing).  0 loaded, or this
 * 1: this call goes by EVAL, for good when Functions are refused
 * (no_functions), this once on another error (an OOM refusal, say: the
 * next call tries again); -1 on a connection failure or a reply of the
 * wrong shape. */
static int load_library(struct rds *r, redisContext *c) {
  const char *load[] = {"FUNCTION", "LOAD", "REPLACE", rds_library};
  redisReply *l = rds_command(r, c, 4, load);
  if (l == NULL)
    return -1;
  int rc = 0;
  if (l->type == REDIS_REPLY_ERROR) {
    if (no_functions(l))
      atomic_store(&r->eval_only, 1);
    rc = 1;
  } else if (l->type != REDIS_REPLY_STRING) {
    rds_bad_reply(c, "FUNCTION LOAD", l);
    rc = -1;
  }
  freeReplyObject(l);
  return rc;
}

/* The end of an EVALSHA or EVAL that stood in for FCALL on trial
 * (eval_keys): answered (rep), the server refuses Functions by closing the
 * connection, so the handle goes by EVALSHA; not, FCALL is tried again. */
static redisReply *eval_trial(struct rds *r, int trial, redisReply *rep) {
  if (trial) {
    if (rep != NULL)
      atomic_store(&r->eval_only, 1);
    atomic_store(&r->fcall_closed, 0);
  }
  return rep;
}

/* The key names are on the heap: up to 37 of 1.6 KB would take about 59 KB
 * of the caller's stack, more than some threads have; one allocation is
 * nothing beside a round trip. */
redisReply *rds_eval(struct rds *r, redisContext *c, enum rds_script s,
                     const char *key, int argc, const char **argv) {
  if (argc > 16)
    return NULL;
  rds_keyname *keys = malloc((NKEYS + 2 * NSCOPES_MAX) * sizeof *keys);
  if (keys == NULL) {
    rds_msg("out of memory");
    return NULL;
  }
  redisReply *rep = eval_keys(r, c, s, key, argc, argv, keys);
  free(keys);
  return rep;
}

static redisReply *eval_keys(struct rds *r, redisContext *c,
                             enum rds_script s, const char *key, int argc,
                             const char **argv, rds_keyname *keys) {
  static const char *const kinds[NKEYS] = {"k", "w", "wi", "x", "b"};
  char qp[KEYNAME_MAX], ttl[24], maxd[48], nkeys[8];
  const char *av[3 + NKEYS + 2 * NSCOPES_MAX + NCOMMON + 16];
  int nk = 0;
  for (int i = 0; i < NKEYS; i++, nk++)
    rds_key(keys[nk], sizeof keys[nk], kinds[i], key);
  size_t len = strlen(key);
  for (size_t p = 0; (p = throttle__scope_next(key, len, p)) != 0 &&
                     nk < NKEYS + 2 * NSCOPES_MAX;
       p++) {
    char scope[THROTTLE__KEY_MAX + 1];
    memcpy(scope, key, p);
    scope[p] = 0;
    rds_key(keys[nk], sizeof keys[nk], "k", scope);
    rds_key(keys[nk + 1], sizeof keys[nk + 1], "b", scope);
    nk += 2;
  }
  rds_key(qp, sizeof qp, "q", key);
  snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)r->ttl_ms);
  /* HONOUR/STORE: this caller's own maximum (what it waits out) and the
   * most it may store for the others (common.lua) */
  snprintf(maxd, sizeof maxd, "%llu/%llu", (unsigned long long)r->max_delay_ms,
           (unsigned long long)r->store_max_ms);
  snprintf(nkeys, sizeof nkeys, "%d", nk);
  int n = 0;
  av[n++] = "EVALSHA";
  av[n++] = r->sha[s];
  av[n++] = nkeys;
  for (int i = 0; i < nk; i++)
    av[n++] = keys[i];
  av[n++] = qp;
  av[n++] = ttl;
  av[n++] = maxd;
  av[n++] = key;
  for (int i = 0; i < argc; i++)
    av[n++] = argv[i];
  redisReply *rep = NULL;
  /* Two FCALLs in a row ended by the server closing the connection (what
   * twemproxy does with a command it does not know): this call tries
   * EVALSHA, and if that is answered, Functions are what the server
   * refuses, for the handle's life; if not, FCALL is tried again. */
  int eval_only = atomic_load(&r->eval_only);
  int trial = !eval_only && atomic_load(&r->fcall_closed) >= 2;
  if (!eval_only && !trial) {
    av[0] = "FCALL";
    av[1] = rds_functions[s];
    if ((rep = rds_command(r, c, n, av)) == NULL) {
      if (closed(c))
        atomic_fetch_add(&r->fcall_closed, 1);
      return NULL;
    }
    atomic_store(&r->fcall_closed, 0);
    if (rep->type == REDIS_REPLY_ERROR &&
        strncmp(rep->str, "ERR Function not found", 22) == 0) {
      freeReplyObject(rep);
      rep = NULL;
      int loaded = load_library(r, c);
      if (loaded < 0 ||
          (loaded == 0 && (rep = rds_command(r, c, n, av)) == NULL))
        return NULL;
    } else if (no_functions(rep)) {
      atomic_store(&r->eval_only, 1);
      freeReplyObject(rep);
      rep = NULL;
    }
  }
  if (rep == NULL && r->sha[s][0]) {
    av[0] = "EVALSHA";
    av[1] = r->sha[s];
    if ((rep = rds_command(r, c, n, av)) == NULL)
      return eval_trial(r, trial, NULL);
  }
  if (rep == NULL || (rep->type == REDIS_REPLY_ERROR &&
                      strncmp(rep->str, "NOSCRIPT", 8) == 0)) {
    if (rep != NULL)
      freeReplyObject(rep);
    const char *load[] = {"SCRIPT", "LOAD", rds_scripts[s]};
    redisReply *l = rds_command(r, c, 3, load);
    if (l == NULL)
      return eval_trial(r, trial, NULL);
    if (l->type == REDIS_REPLY_STRING && l->len == 40) {
      pthread_mutex_lock(&r->mu);
      memcpy(r->sha[s], l->str, 41);
      pthread_mutex_unlock(&r->mu);
    }
    freeReplyObject(l);
    av[0] = "EVAL";
    av[1] = rds_scripts[s];
    if ((rep = rds_command(r, c, n, av)) == NULL)
      return eval_trial(r, trial, NULL);
  }
  eval_trial(r, trial, rep);
  if (rep->type == REDIS_REPLY_ERROR) {
    /* A Cluster redirects (MOVED, ASK) or refuses (CROSSSLOT,
     * CLUSTERDOWN) where rds_check_server could not tell one at open (its
     * INFO refused): from now on the segment serves. */
    static const char *const cl[] = {"MOVED ", "ASK ", "CROSSSLOT",
                                     "CLUSTERDOWN"};
    for (size_t i = 0; i < sizeof cl / sizeof *cl; i++)
      if (strncmp(rep->str, cl[i], strlen(cl[i])) == 0) {
        pthread_mutex_lock(&r->mu);
        r->cluster = 1;
        pthread_mutex_unlock(&r->mu);
      }
    rds_msg("%s: script error: %.300s", key, rep->str);
    freeReplyObject(rep);
    return NULL;
  }
  return rep;
}

/* Block on one waiter's list for at most ms (at least RDS_MIN_SLEEP_MS);
 * the command timeout is stretched past the BLPOP's own for this call, up
 * to the caller's deadline.  Where blocking commands are refused (an ACL
 * without @blocking, a proxy), an error reply is no wake-up: the waiter
 * sleeps here instead, at most RDS_POLL_MS a look, and the refusal
 * becomes the handle's standing notice; BLPOP is tried again after
 * RDS_BLOCK_RETRY_MS. */
int rds_blpop(struct rds *r, redisContext *c, const char *key, const char *id,
              uint64_t ms, uint64_t deadline) {
  if (ms < RDS_MIN_SLEEP_MS)
    ms = RDS_MIN_SLEEP_MS;
  uint64_t now = rds_mono_ms();
  if (now < atomic_load(&r->poll_until)) {
    uint64_t nap = ms < RDS_POLL_MS ? ms : RDS_POLL_MS;
    struct timespec ts = {(time_t)(nap / 1000), (long)(nap % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
      ;
    return 0;
  }
  char q[THROTTLE__KEY_MAX * 6 + 96], secs[32];
  rds_key(q, sizeof q, "q", key);
  size_t n = strlen(q);
  snprintf(q + n, sizeof q - n, "%s", id);
  snprintf(secs, sizeof secs, "%llu.%03llu", (unsigned long long)(ms / 1000),
           (unsigned long long)(ms % 1000));
  uint64_t slack = tl_slow && tl_short == c && RDS_ALIVE_MS > r->timeout_ms
                      ? RDS_ALIVE_MS
                      : r->timeout_ms;
  if (deadline != UINT64_MAX && now + ms + slack > deadline + 5)
    slack = deadline + 5 > now + ms ? deadline + 5 - now - ms : 5;
  redisSetTimeout(c, tv_ms(ms + slack));
  const char *av[] = {"BLPOP", q, secs};
  redisReply *rep = cmd(c, 3, av);
  if (rep == NULL)
    return -1;
  redisSetTimeout(c, tv_ms(r->timeout_ms));
  int refused = rep->type == REDIS_REPLY_ERROR;
  if (refused) {
    pthread_mutex_lock(&r->mu);
    snprintf(r->warn_block, sizeof r->warn_block,
             "%.300s: BLPOP refused (%.100s): waiters poll every %u ms instead "
             "of blocking; allow blocking commands (+@blocking) to this user",
             r->shown, rep->str, RDS_POLL_MS);
    pthread_mutex_unlock(&r->mu);
    atomic_store(&r->poll_until, now + RDS_BLOCK_RETRY_MS);
    bump_notice(r);
  } else if (rep->type != REDIS_REPLY_NIL && rep->type != REDIS_REPLY_ARRAY) {
    rds_bad_reply(c, "BLPOP", rep);
    freeReplyObject(rep);
    return -1;
  }
  freeReplyObject(rep);
  if (refused)
    return rds_blpop(r, c, key, id, ms, deadline);
  return 0;
}

unsigned rds_notice(struct rds *r, char *buf, size_t len) {
  unsigned gen = atomic_load(&r->notice_gen);
  if (buf == NULL || len == 0)
    return gen;
  pthread_mutex_lock(&r->mu);
  const char *a = r->warn_policy, *b = r->warn_block;
  snprintf(buf, len, "%s%s%s", a, a[0] && b[0] ? "; " : "", b);
  pthread_mutex_unlock(&r->mu);
  return gen;
}
