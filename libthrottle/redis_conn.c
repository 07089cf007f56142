/* SPDX-License-Identifier: MIT */
/*
 * redis_conn.c — the Redis backend's connections: the URL, a small pool of
 * hiredis connections with connect and command timeouts, EVALSHA with the
 * NOSCRIPT fallback, the key names, and the "down" state that sends callers
 * to the host's segment for a while after a failure.
 *
 * A connection that failed in any way is freed, never reused: after a
 * timeout its reply may still arrive and would answer the next command.
 * After a failure the segment serves for RDS_RETRY_MS, then the next call
 * tries Redis again (one connect timeout at most), so a dead server costs
 * each process one timeout per second, not one per call.  Rejected: a
 * health-check thread (a process that makes no calls needs no answer).
 */
#include "redis.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int parse_uint(const char *s, size_t n, unsigned long max,
                      unsigned long *out) {
  if (n == 0 || n > 10)
    return -1;
  unsigned long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (unsigned long)(s[i] - '0');
  }
  if (v > max)
    return -1;
  *out = v;
  return 0;
}

/* redis://[:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH[?db=N] */
int rds_parse_url(struct rds *r, const char *url, char *msg, size_t len) {
  unsigned long v;
  r->port = 6379;
  r->db = 0;
  if (strlen(url) >= sizeof r->url)
    goto bad;
  snprintf(r->url, sizeof r->url, "%s", url);
  if (strncmp(url, "unix://", 7) == 0) {
    const char *path = url + 7;
    const char *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    if (path[0] != '/' || n >= sizeof r->path || n < 2)
      goto bad;
    memcpy(r->path, path, n);
    r->path[n] = 0;
    if (q != NULL) {
      if (strncmp(q, "?db=", 4) != 0 ||
          parse_uint(q + 4, strlen(q + 4), 1000000, &v) != 0)
        goto bad;
      r->db = (int)v;
    }
    return 0;
  }
  if (strncmp(url, "redis://", 8) != 0)
    goto bad;
  const char *p = url + 8;
  const char *at = strchr(p, '@');
  if (at != NULL) {
    if (p[0] != ':' || (size_t)(at - p - 1) >= sizeof r->password)
      goto bad;
    memcpy(r->password, p + 1, (size_t)(at - p - 1));
    r->password[at - p - 1] = 0;
    p = at + 1;
  }
  const char *slash = strchr(p, '/');
  const char *end = slash ? slash : p + strlen(p);
  const char *colon = memchr(p, ':', (size_t)(end - p));
  const char *hend = colon ? colon : end;
  if (hend == p || (size_t)(hend - p) >= sizeof r->host)
    goto bad;
  memcpy(r->host, p, (size_t)(hend - p));
  r->host[hend - p] = 0;
  if (colon != NULL) {
    if (parse_uint(colon + 1, (size_t)(end - colon - 1), 65535, &v) != 0 ||
        v == 0)
      goto bad;
    r->port = (int)v;
  }
  if (slash != NULL && slash[1] != 0) {
    if (parse_uint(slash + 1, strlen(slash + 1), 1000000, &v) != 0)
      goto bad;
    r->db = (int)v;
  }
  return 0;
bad:
  snprintf(msg, len,
           "THROTTLE_BACKEND: '%.200s' is not redis://[:PASSWORD@]HOST[:PORT]"
           "[/DB], unix:///PATH[?db=N] or shm",
           url);
  return THROTTLE_EINVAL;
}

/* ---- key names --------------------------------------------------------- */

static size_t enc(char *out, size_t len, const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c <= ' ' || c >= 0x7f || c == '{' || c == '}' || c == '%' ||
        c == ':') {
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = 0;
  return o;
}

/* thr1:{ROOT}:kind:KEY; for kind "q" the prefix of the key's waiters'
 * wake-up lists, thr1:{ROOT}:q:KEY: (a waiter's id follows). */
void rds_key(char *out, size_t len, const char *kind, const char *key) {
  char root[THROTTLE__KEY_MAX * 3 + 1], k[THROTTLE__KEY_MAX * 3 + 1];
  const char *slash = strchr(key, '/');
  enc(root, sizeof root, key, slash ? (size_t)(slash - key) : strlen(key));
  enc(k, sizeof k, key, strlen(key));
  snprintf(out, len, "thr1:{%s}:%s:%s%s", root, kind, k,
           strcmp(kind, "q") == 0 ? ":" : "");
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

redisReply *rds_command(redisContext *c, int argc, const char **argv) {
  return cmd(c, argc, argv);
}

static int ok_reply(redisContext *c, redisReply *rep, const char *what) {
  if (rep == NULL) {
    rds_msg("%s: %s", what, c->errstr[0] ? c->errstr : "no reply");
    return -1;
  }
  int bad = rep->type == REDIS_REPLY_ERROR;
  if (bad)
    rds_msg("%s: %s", what, rep->str);
  freeReplyObject(rep);
  return bad ? -1 : 0;
}

static redisContext *connect_one(struct rds *r) {
  struct timeval tv = tv_ms(r->timeout_ms);
  redisContext *c = r->path[0]
                        ? redisConnectUnixWithTimeout(r->path, tv)
                        : redisConnectWithTimeout(r->host, r->port, tv);
  if (c == NULL) {
    rds_msg("connect: out of memory");
    return NULL;
  }
  if (c->err) {
    rds_msg("connect: %s", c->errstr);
    redisFree(c);
    return NULL;
  }
  if (redisSetTimeout(c, tv) != REDIS_OK) {
    rds_msg("setting the command timeout: %s", c->errstr);
    redisFree(c);
    return NULL;
  }
  char db[16];
  snprintf(db, sizeof db, "%d", r->db);
  const char *auth[] = {"AUTH", r->password};
  const char *sel[] = {"SELECT", db};
  if ((r->password[0] && ok_reply(c, cmd(c, 2, auth), "AUTH") != 0) ||
      (r->db != 0 && ok_reply(c, cmd(c, 2, sel), "SELECT") != 0)) {
    redisFree(c);
    return NULL;
  }
  return c;
}

/* A connection, or NULL (message set) while Redis is down. */
redisContext *rds_get(struct rds *r) {
  redisContext *c = NULL;
  pthread_mutex_lock(&r->mu);
  if (r->pid != getpid()) {
    /* A forked child: the parent's sockets are not ours to talk on. */
    for (int i = 0; i < r->npool; i++)
      redisFree(r->pool[i]);
    r->npool = 0;
    r->pid = getpid();
  }
  if (rds_mono_ms() < r->down_until) {
    pthread_mutex_unlock(&r->mu);
    rds_msg("%s: unreachable; this host's segment serves until it is back",
            r->url);
    return NULL;
  }
  if (r->npool > 0)
    c = r->pool[--r->npool];
  pthread_mutex_unlock(&r->mu);
  if (c == NULL && (c = connect_one(r)) == NULL) {
    char why[512];
    snprintf(why, sizeof why, "%.400s", msgbuf);
    rds_msg("%s: %s; this host's segment serves until it is back", r->url,
            why);
    pthread_mutex_lock(&r->mu);
    r->down_until = rds_mono_ms() + RDS_RETRY_MS;
    pthread_mutex_unlock(&r->mu);
  }
  return c;
}

/* Give c back (ok) or drop it (after any failure). */
void rds_put(struct rds *r, redisContext *c, int ok) {
  if (c == NULL)
    return;
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

/* A failed call: drop c, mark Redis down for a while, say why once. */
int rds_down(struct rds *r, redisContext *c, const char *what) {
  char why[256];
  if (c != NULL && c->err == REDIS_ERR_IO &&
      (errno == EAGAIN || strstr(c->errstr, "temporarily unavailable")))
    snprintf(why, sizeof why, "no answer within %u ms", r->timeout_ms);
  else
    snprintf(why, sizeof why, "%.200s",
             c != NULL && c->err ? c->errstr : msgbuf);
  rds_put(r, c, 0);
  pthread_mutex_lock(&r->mu);
  r->down_until = rds_mono_ms() + RDS_RETRY_MS;
  pthread_mutex_unlock(&r->mu);
  rds_msg("%s: %s: %s; this host's segment serves until it is back", r->url,
          what, why);
  return THROTTLE__BE_DOWN;
}

/* ---- scripts ----------------------------------------------------------- */

#define NKEYS 5
#define NCOMMON 4
/* scopes passed to a script: all of them (deeper keys are refused) */
#define NSCOPES_MAX THROTTLE_KEY_MAX_SCOPES
#define KEYNAME_MAX (THROTTLE__KEY_MAX * 6 + 64)

/* One script call: EVALSHA, and EVAL when the server does not know the
 * script (after a restart or a failover).  NULL on a connection failure
 * (c->err set) or a script error (message set).  KEYS: the key's state
 * hash, waiters, waiter records, watchers and beneath hash (common.lua),
 * then each scope's state hash and beneath hash, root first: all under
 * the key's root hash tag, so one script reads and writes them all. */
typedef char rds_keyname[KEYNAME_MAX];
static redisReply *eval_keys(struct rds *r, redisContext *c,
                             enum rds_script s, const char *key, int argc,
                             const char **argv, rds_keyname *keys);

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
  char qp[KEYNAME_MAX], ttl[24], maxd[24], nkeys[8];
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
  snprintf(maxd, sizeof maxd, "%llu", (unsigned long long)r->max_delay_ms);
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
  redisReply *rep = r->sha[s][0] ? cmd(c, n, av) : NULL;
  if (r->sha[s][0] && rep == NULL)
    return NULL;
  if (rep == NULL || (rep->type == REDIS_REPLY_ERROR &&
                      strncmp(rep->str, "NOSCRIPT", 8) == 0)) {
    if (rep != NULL)
      freeReplyObject(rep);
    const char *load[] = {"SCRIPT", "LOAD", rds_scripts[s]};
    redisReply *l = cmd(c, 3, load);
    if (l == NULL)
      return NULL;
    if (l->type == REDIS_REPLY_STRING && l->len == 40) {
      pthread_mutex_lock(&r->mu);
      memcpy(r->sha[s], l->str, 41);
      pthread_mutex_unlock(&r->mu);
    }
    freeReplyObject(l);
    av[0] = "EVAL";
    av[1] = rds_scripts[s];
    rep = cmd(c, n, av);
    if (rep == NULL)
      return NULL;
  }
  if (rep->type == REDIS_REPLY_ERROR) {
    rds_msg("script error: %s", rep->str);
    freeReplyObject(rep);
    return NULL;
  }
  return rep;
}

/* Block on one waiter's list for at most ms (at least RDS_MIN_SLEEP_MS);
 * the command timeout is stretched past the BLPOP's own for this call. */
redisReply *rds_blpop(struct rds *r, redisContext *c, const char *key,
                      const char *id, uint64_t ms) {
  char q[THROTTLE__KEY_MAX * 6 + 96], secs[32];
  rds_key(q, sizeof q, "q", key);
  size_t n = strlen(q);
  snprintf(q + n, sizeof q - n, "%s", id);
  if (ms < RDS_MIN_SLEEP_MS)
    ms = RDS_MIN_SLEEP_MS;
  snprintf(secs, sizeof secs, "%llu.%03llu", (unsigned long long)(ms / 1000),
           (unsigned long long)(ms % 1000));
  redisSetTimeout(c, tv_ms(ms + r->timeout_ms));
  const char *av[] = {"BLPOP", q, secs};
  redisReply *rep = cmd(c, 3, av);
  if (rep != NULL)
    redisSetTimeout(c, tv_ms(r->timeout_ms));
  return rep;
}
