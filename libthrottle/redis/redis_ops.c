/* SPDX-License-Identifier: MIT */
/*
 * redis_ops.c — the Redis backend's operations (backend.h's table): each is
 * one script call (libthrottle/redis/) plus, for the calls that wait, bounded
 * BLPOPs on the caller's own list (the heartbeat: redis_beat.c).
 *
 * Waiting: the script answers "wait" with the time until the gate may open
 * by time alone, relative to Redis's clock; the caller sleeps on its own
 * list for that long plus jitter (at most RDS_MAX_SLEEP_MS), so a grant,
 * clear, resume or cancel wakes it at once, and a lost push costs one
 * re-check.  Each re-check refreshes the waiter's liveness record, so a
 * waiter that died is dropped within the liveness bound.
 */
#include "redis.h"
#include "core/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))


/* fork().  fork() copies the calling thread only, so a child's copy of
 * every open handle holds state of threads it does not have:
 *   - the mutex, which another thread of the parent may hold (a pool
 *     call, the heartbeat): fork takes each handle's mutex first (in the
 *     list's order, after the list's own) and gives them back in the
 *     parent and in the child, so the copy is unlocked;
 *   - the heartbeat: the flag that it runs, and its condition variable,
 *     on which the parent's thread may sleep at the fork.  The child has
 *     no heartbeat: its first admission or give-back starts one of its own
 *     (redis_beat.c), which beats only the child's admissions.  The
 *     condition variable is made new (glibc records its sleepers in it; a
 *     destroy, a wait or a signal would count one that does not exist:
 *     the child's close waited for it forever);
 *   - the connections: the pool's are the parent's sockets, never talked
 *     on by the child; its first call drops them (rds_get, by r->pid) and
 *     opens its own, its close frees them (which sends nothing).
 * Nothing here allocates or frees: a child that only execs or exits pays
 * nothing, whatever allocator it runs.  The module is never unloaded
 * (backend.c), so the handlers stay valid.  Rejected: refusing a child's
 * use of an inherited handle (loaders fork workers after opening, and a
 * segment handle may be used so: the same rules on both backends). */
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rds *reg_head;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void beat_cv_init(struct rds *r) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->beat_cv, &ca);
  pthread_condattr_destroy(&ca);
}

static void fork_prepare(void) {
  pthread_mutex_lock(&reg_mu);
  for (struct rds *r = reg_head; r != NULL; r = r->reg_next)
    pthread_mutex_lock(&r->mu);
}

static void fork_parent(void) {
  for (struct rds *r = reg_head; r != NULL; r = r->reg_next)
    pthread_mutex_unlock(&r->mu);
  pthread_mutex_unlock(&reg_mu);
}

static void fork_child(void) {
  for (struct rds *r = reg_head; r != NULL; r = r->reg_next) {
    r->beat_running = 0;
    beat_cv_init(r);
    pthread_mutex_unlock(&r->mu);
  }
  pthread_mutex_unlock(&reg_mu);
}

static void reg_init(void) {
  (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void reg_add(struct rds *r) {
  pthread_once(&reg_once, reg_init);
  pthread_mutex_lock(&reg_mu);
  r->reg_next = reg_head;
  reg_head = r;
  pthread_mutex_unlock(&reg_mu);
}

static void reg_remove(struct rds *r) {
  pthread_mutex_lock(&reg_mu);
  for (struct rds **p = &reg_head; *p != NULL; p = &(*p)->reg_next)
    if (*p == r) {
      *p = r->reg_next;
      break;
    }
  pthread_mutex_unlock(&reg_mu);
}

static void rds_close(void *be);

static int rds_open(const struct throttle__be_params *p, void **out,
                    char *msg, size_t len) {
  if (p->info_size != sizeof(throttle_info_t)) {
    snprintf(msg, len, "backend module built for another libthrottle");
    return THROTTLE_EINVAL;
  }
  struct rds *r = calloc(1, sizeof *r);
  if (r == NULL) {
    snprintf(msg, len, "out of memory");
    return THROTTLE_ENOMEM;
  }
  int rc = rds_parse_url(r, p->url, msg, len);
  if (rc != 0) {
    free(r);
    return rc;
  }
  char warn[256] = "";
  r->timeout_ms = (uint32_t)throttle__env_number("THROTTLE_REDIS_TIMEOUT_MS",
                                   RDS_DEFAULT_TIMEOUT_MS, 1, 60000, warn,
                                   sizeof warn);
  r->liveness_ms = (uint32_t)throttle__env_number("THROTTLE_LIVENESS_MS",
                                    RDS_DEFAULT_LIVENESS_MS, 100, 3600000,
                                    warn, sizeof warn);
  r->ttl_ms = throttle__env_number("THROTTLE_REDIS_TTL_MS", RDS_DEFAULT_TTL_MS, 1000,
                     UINT64_C(86400000) * 366, warn, sizeof warn);
  r->max_delay_ms = p->max_delay_ms;
  r->store_max_ms = p->store_max_ms != 0 ? p->store_max_ms : p->max_delay_ms;
  r->lease_ms = p->lease_ms;
  r->intr = p->intr;
  r->intr_arg = p->intr_arg;
  r->intr_period_ms = p->intr_period_ms ? p->intr_period_ms : 1;
  if (gethostname(r->me, sizeof r->me - 1) != 0 || r->me[0] == 0)
    snprintf(r->me, sizeof r->me, "unknown");
  for (char *c = r->me; *c; c++)
    if (*c == ' ')
      *c = '_';
  r->seg_count = p->segment_count;
  r->seg_settings = p->segment_settings;
  r->seg_arg = p->segment_arg;
  snprintf(r->seg_id, sizeof r->seg_id, "%s@%.90s", r->me,
           p->segment_name != NULL ? p->segment_name : "");
  for (char *c = r->seg_id; *c; c++)
    if (*c <= ' ' || *c == 0x7f)
      *c = '_';
  pthread_mutex_init(&r->mu, NULL);
  beat_cv_init(r);
  r->pid = getpid();
  reg_add(r);
  rc = rds_check_server(r, msg, len);
  if (rc != 0) {
    rds_close(r);
    return rc;
  }
  *out = r;
  snprintf(msg, len, "%s", warn);
  return 0;
}

static void rds_close(void *be) {
  struct rds *r = be;
  if (r == NULL)
    return;
  reg_remove(r);
  pthread_mutex_lock(&r->mu);
  int running = r->beat_running; /* this process's own (fork_child) */
  r->stopping = 1;
  pthread_cond_broadcast(&r->beat_cv);
  pthread_mutex_unlock(&r->mu);
  if (running)
    pthread_join(r->beat, NULL);
  rds_give_back_last(r);
  /* In a forked child too: the contexts are this process's memory, and
   * freeing one closes only this process's copy of the socket (hiredis
   * sends nothing on close), so the parent's connection is untouched. */
  rds_pool_free(r);
  while (r->held != NULL) {
    struct rds_ticket *t = r->held;
    r->held = t->next;
    free(t);
  }
  while (r->giveback != NULL) {
    struct rds_giveback *g = r->giveback;
    r->giveback = g->next;
    free(g);
  }
  while (r->reserved != NULL) {
    struct rds_reserved *x = r->reserved;
    r->reserved = x->next;
    free(x);
  }
  /* In a forked child too: fork_child made it new, without the parent's
   * sleeper (for which glibc's destroy would wait forever). */
  pthread_cond_destroy(&r->beat_cv);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

static const char *rds_errmsg(void *be) {
  (void)be;
  return rds_lastmsg();
}

static unsigned notice(void *be, char *buf, size_t len) {
  return rds_notice(be, buf, len);
}

/* ---- calls ----------------------------------------------------------- */

static int64_t elem_int(const redisReply *rep, size_t i) {
  if (rep->type != REDIS_REPLY_ARRAY || i >= rep->elements)
    return 0;
  const redisReply *e = rep->element[i];
  if (e->type == REDIS_REPLY_INTEGER)
    return (int64_t)e->integer;
  if (e->type == REDIS_REPLY_STRING)
    return strtoll(e->str, NULL, 10);
  return 0;
}

static void elem_str(const redisReply *rep, size_t i, char *out,
                     size_t len) {
  out[0] = 0;
  if (rep->type == REDIS_REPLY_ARRAY && i < rep->elements &&
      rep->element[i]->type == REDIS_REPLY_STRING)
    snprintf(out, len, "%s", rep->element[i]->str);
  else if (rep->type == REDIS_REPLY_ARRAY && i < rep->elements &&
           rep->element[i]->type == REDIS_REPLY_INTEGER)
    snprintf(out, len, "%lld", rep->element[i]->integer);
}

/* enter.lua's answer: "enter STATUS ID PROBE HINT", then the settings
 * (settings_of).  0 when it parses, status 0 to 4. */
struct enter_ans {
  int st, probe;
  long long hint;
  char id[32];
  const char *settings; /* in the reply: ";KEY'S;SCOPE'S..." */
};
static int enter_ans(const redisReply *rep, struct enter_ans *a) {
  int end = 0;
  if (rep->type != REDIS_REPLY_STRING ||
      sscanf(rep->str, "enter %d %31s %d %lld%n", &a->st, a->id, &a->probe,
             &a->hint, &end) != 4 ||
      a->st < 0 || a->st > 4)
    return -1;
  a->settings = rep->str + end;
  return 0;
}

/* A script's reply, checked for the shape the script returns (a server
 * that answers anything must not admit anyone): want 0 an integer, n > 0
 * an array of at least n elements whose first is an integer, INFO_SHAPE
 * the info script's (the integer -1, or an array of at least the fields),
 * LEAVE_SHAPE that script's string (rds_leave_code; enter's: eval_enter).
 * NULL on any failure; a wrong shape fails c (rds_bad_reply). */
#define INFO_SHAPE (-1)
#define LEAVE_SHAPE (-2)
static redisReply *eval_as(struct rds *r, redisContext *c, enum rds_script s,
                           const char *key, int argc, const char **argv,
                           int want) {
  static const char *const names[RDS_NSCRIPTS] = {"enter", "leave", "peek",
                                                  "set",   "info",  "beat"};
  redisReply *rep = rds_eval(r, c, s, key, argc, argv);
  if (rep == NULL)
    return NULL;
  int ok;
  if (want == 0)
    ok = rep->type == REDIS_REPLY_INTEGER;
  else if (want == LEAVE_SHAPE)
    ok = rds_leave_code(rep) >= 0;
  else if (want == INFO_SHAPE)
    ok = rep->type == REDIS_REPLY_INTEGER ||
         (rep->type == REDIS_REPLY_ARRAY &&
          rep->elements > (size_t)THROTTLE_FIELD_CAP_LEARNED_AGO_MS);
  else
    ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= (size_t)want &&
         rep->element[0]->type == REDIS_REPLY_INTEGER;
  if (ok)
    return rep;
  rds_bad_reply(c, names[s], rep);
  freeReplyObject(rep);
  return NULL;
}

/* The enter script, its answer parsed into *a (once: a->settings points
 * into the reply); NULL on any failure, as eval_as. */
static redisReply *eval_enter(struct rds *r, redisContext *c, const char *key,
                              int argc, const char **argv,
                              struct enter_ans *a) {
  redisReply *rep = rds_eval(r, c, RDS_ENTER, key, argc, argv);
  if (rep == NULL || enter_ans(rep, a) == 0)
    return rep;
  rds_bad_reply(c, "enter", rep);
  freeReplyObject(rep);
  return NULL;
}

/* One script call on a pooled connection.  *rep is the reply, or the call
 * returns THROTTLE__BE_DOWN. */
static int call(struct rds *r, enum rds_script s, const char *key, int argc,
                const char **argv, int want, redisReply **rep) {
  redisContext *c = rds_get(r);
  if (c == NULL)
    return THROTTLE__BE_DOWN;
  *rep = eval_as(r, c, s, key, argc, argv, want);
  if (*rep == NULL)
    return rds_down(r, c, "script call");
  rds_put(r, c, 1);
  return 0;
}

static int rds_backoff(void *be, const char *key, uint64_t delay_ms,
                       int64_t heal_age_ms) {
  struct rds *r = be;
  char ms[24], pid[16], len[24], age[24];
  /* The leave script with fence 0 (no admission) and 'pub' (or 'heal'):
   * it publishes and frees nothing. */
  snprintf(ms, sizeof ms, "%llu", (unsigned long long)delay_ms);
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  snprintf(len, sizeof len, "%zu", strlen(key));
  snprintf(age, sizeof age, "%lld", (long long)heal_age_ms);
  const char *av[] = {"0", "1", ms, pid, heal_age_ms >= 0 ? "heal" : "pub",
                      len, age};
  redisReply *rep;
  int rc = call(r, RDS_LEAVE, key, 7, av, LEAVE_SHAPE, &rep);
  if (rc == 0) {
    if (heal_age_ms >= 0 && rds_leave_code(rep) == 3) {
      rds_msg("%s: cleared since this host was told", key);
      rc = THROTTLE_ESTALE;
    }
    freeReplyObject(rep);
  }
  return rc;
}

static int peek(struct rds *r, redisContext *c, const char *key,
                const char *wid, uint64_t *left, int *held, char *id,
                size_t idlen) {
  char live[16];
  snprintf(live, sizeof live, "%u", r->liveness_ms);
  const char *av[] = {wid, live};
  redisReply *rep = eval_as(r, c, RDS_PEEK, key, 2, av, 3);
  if (rep == NULL)
    return -1;
  int64_t l = elem_int(rep, 0);
  *left = l > 0 ? (uint64_t)l : 0;
  *held = (int)elem_int(rep, 1);
  if (id != NULL)
    elem_str(rep, 2, id, idlen);
  freeReplyObject(rep);
  return 0;
}

static int rds_remaining(void *be, const char *key, uint64_t *ms_left) {
  struct rds *r = be;
  redisContext *c = rds_get(r);
  if (c == NULL)
    return THROTTLE__BE_DOWN;
  int held;
  if (peek(r, c, key, "-", ms_left, &held, NULL, 0) != 0)
    return rds_down(r, c, "remaining");
  rds_put(r, c, 1);
  return 0;
}

/* A wait's next sleep, cut to the interrupt period; 1 when the caller's
 * interrupt check says stop. */
static int sleep_slice(const struct rds *r, uint64_t *ms) {
  if (r->intr == NULL)
    return 0;
  if (r->intr(r->intr_arg) != 0)
    return 1;
  if (*ms > r->intr_period_ms)
    *ms = r->intr_period_ms;
  return 0;
}

static uint64_t jitter_ms(uint64_t max) {
  static __thread unsigned seed;
  if (seed == 0)
    seed = (unsigned)getpid() ^ (unsigned)rds_mono_ms() ^
           (unsigned)(uintptr_t)&seed;
  return (uint64_t)rand_r(&seed) % (max + 1);
}

#define RDS_AGAIN 2 /* failed(): Redis is up, *cp is a new connection */

/* A command of a waiting call failed: past the caller's deadline that is
 * its timeout (the connection dropped, Redis not marked down: a slow
 * answer is not an outage).  A command that timed out before it is
 * evidence of nothing yet: Redis may be stalled, or only loaded (many
 * callers arriving at once).  Sent to the segment, the caller could be
 * admitted there beside a holder only Redis knows; so a new connection
 * is greeted first, given up to RDS_ALIVE_MS until probe_by: answered,
 * Redis is up, and the call goes on there (RDS_AGAIN, *cp the new
 * connection); not answered, it is down (rds_down()), or the caller's
 * time is up.  Any other failure is rds_down(). */
static int failed(struct rds *r, redisContext **cp, const char *what,
                  const char *key, uint64_t deadline, uint64_t probe_by,
                  uint64_t timeout_ms) {
  redisContext *c = *cp;
  *cp = NULL;
  if (c != NULL && c->err != 0 && !rds_past(deadline) && rds_timed_out(c)) {
    rds_put(r, c, 0);
    if ((*cp = rds_connect_by(r, probe_by)) != NULL) {
      rds_msg("%s: Redis answers late (no answer within %u ms; a new "
              "connection's PING was answered): going on there",
              key, r->timeout_ms);
      return RDS_AGAIN;
    }
    if (!rds_past(deadline))
      return rds_down(r, NULL, what);
    c = NULL;
  }
  if (c == NULL || (c->err != 0 && rds_past(deadline))) {
    rds_put(r, c, 0);
    rds_msg("%s: not answered by Redis within the %llu ms timeout", key,
            (unsigned long long)timeout_ms);
    return THROTTLE_ETIMEDOUT;
  }
  return rds_down(r, c, what);
}

static int rds_wait(void *be, const char *key, uint64_t timeout_ms) {
  struct rds *r = be;
  uint64_t start = rds_mono_ms();
  uint64_t deadline = timeout_ms == THROTTLE_FOREVER ? UINT64_MAX
                                                      : start + timeout_ms;
  uint64_t jitter = jitter_ms(THROTTLE__JITTER_MAX_NS / THROTTLE__NS_PER_MS);
  char id[32] = "0";
  int slept = 0;
  redisContext *c = rds_get_by(r, deadline);
  if (c == NULL)
    return THROTTLE__BE_DOWN;
  rds_deadline(r, c, deadline);
  for (;;) {
    uint64_t left;
    int held;
    char nid[32];
    if (peek(r, c, key, id, &left, &held, nid, sizeof nid) != 0) {
      int rc = failed(r, &c, "wait", key, deadline, deadline, timeout_ms);
      if (rc != RDS_AGAIN)
        return rc;
      rds_deadline(r, c, deadline);
      rds_slow();
      continue;
    }
    snprintf(id, sizeof id, "%s", nid);
    if (left == 0 && held == 0)
      break;
    uint64_t now = rds_mono_ms();
    if (left > 0 && (deadline == UINT64_MAX ? 0 : now + left > deadline)) {
      rds_put(r, c, 1);
      rds_msg("%s: opens in %llu ms, after the %llu ms timeout", key,
              (unsigned long long)left, (unsigned long long)timeout_ms);
      return THROTTLE_ETIMEDOUT;
    }
    if (left == 0 && now >= deadline) {
      rds_put(r, c, 1);
      rds_msg("%s: %s past the timeout", key,
              held == 1 ? "paused" : "probe still out");
      return THROTTLE_ETIMEDOUT;
    }
    uint64_t sleep = left > 0 ? left + jitter : RDS_MAX_SLEEP_MS;
    if (sleep > RDS_MAX_SLEEP_MS)
      sleep = RDS_MAX_SLEEP_MS;
    if (deadline != UINT64_MAX && now + sleep > deadline)
      sleep = deadline > now ? deadline - now : 0;
    slept = 1;
    if (sleep_slice(r, &sleep)) {
      rds_put(r, c, 1);
      rds_msg("%s: interrupted by the caller", key);
      return THROTTLE_EINTR;
    }
    if (rds_blpop(r, c, key, id, sleep, deadline) != 0) {
      int rc = failed(r, &c, "wait", key, deadline, deadline, timeout_ms);
      if (rc != RDS_AGAIN)
        return rc;
      rds_deadline(r, c, deadline);
      rds_slow();
    }
  }
  if (slept) {
    char ms[24];
    snprintf(ms, sizeof ms, "%llu",
             (unsigned long long)(rds_mono_ms() - start));
    const char *av[] = {"wait", ms, "0"};
    redisReply *rep = eval_as(r, c, RDS_SET, key, 3, av, 0);
    if (rep != NULL)
      freeReplyObject(rep);
    else {
      rds_put(r, c, 0);
      return 0; /* counters are best effort; the wait itself succeeded */
    }
  }
  rds_put(r, c, 1);
  return 0;
}

/* One key's or scope's settings as enter.lua tells them, bounded: the
 * hash is input (I8).  The text after them, or NULL when they do not
 * parse. */
static const char *settings_one(const char *str,
                                struct throttle__be_settings *set) {
  unsigned long long v[7];
  int end = 0;
  if (sscanf(str, "%llu %llu %llu %llu %llu %llu %llu%n", &v[0], &v[1],
             &v[2], &v[3], &v[4], &v[5], &v[6], &end) != 7)
    return NULL;
  set->known = 1;
  set->fixed_cap = v[0] <= THROTTLE__SLOTS ? (uint32_t)v[0] : THROTTLE__SLOTS;
  set->auto_max = v[1] <= THROTTLE__SLOTS ? (uint32_t)v[1] : THROTTLE__SLOTS;
  set->paused = v[2] == 1;
  set->rate_n = v[3] <= UINT32_MAX && v[4] > 0 ? (uint32_t)v[3] : 0;
  set->rate_period_ms = set->rate_n ? v[4] : 0;
  set->share_set = v[5] == 1;
  set->share_permille = v[6] <= 1000 ? (uint32_t)v[6] : 1000;
  return str + end;
}

/* The settings an enter reply carries (enter.lua), ";" before each: the
 * key's, then each scope's, root first, as set[] wants them (backend.h). */
static void settings_of(const char *p, struct throttle__be_settings *set) {
  for (int i = 0; i < THROTTLE__BE_NSETTINGS && *p == ';'; i++)
    if ((p = settings_one(p + 1, &set[i])) == NULL)
      return;
}

/* An enter's token: 64 random bits, and a counter of this process's
 * calls (never the same twice here; across hosts a clash is 2^-64). */
static void new_token(char *token, size_t len) {
  static _Atomic unsigned calls;
  uint64_t rnd = 0;
  if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd)
    rnd = ((uint64_t)getpid() << 32) ^ rds_mono_ms() ^ (uintptr_t)&rnd;
  snprintf(token, len, "%016llx.%x", (unsigned long long)rnd,
           atomic_fetch_add(&calls, 1));
}

static int rds_enter(void *be, const char *key, int cls, uint64_t timeout_ms,
                     int nowait, void **tk, int *probe, uint64_t *wait_ms,
                     const uint32_t cold[2], struct throttle__be_settings *set) {
  struct rds *r = be;
  uint64_t start = rds_mono_ms();
  uint64_t deadline = timeout_ms == THROTTLE_FOREVER ? UINT64_MAX
                                                      : start + timeout_ms;
  char id[32] = "0", scls[4], lease[16], live[16], pid[16], left[24];
  char c429[16], c503[16];
  snprintf(c429, sizeof c429, "%u", cold[0]);
  snprintf(c503, sizeof c503, "%u", cold[1]);
  snprintf(scls, sizeof scls, "%d", cls);
  snprintf(lease, sizeof lease, "%u", r->lease_ms);
  snprintf(live, sizeof live, "%u", r->liveness_ms);
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  char token[48];
  new_token(token, sizeof token);
  char kept[RDS_KEPT_LEN];
  rds_settings_kept(r, key, kept, sizeof kept);
  /* a try_enter waits for evidence that Redis is up one command timeout */
  uint64_t probe_by = nowait ? start + r->timeout_ms : deadline;
  redisContext *c = rds_get_by(r, probe_by);
  if (c == NULL)
    return THROTTLE__BE_DOWN;
  if (!nowait) /* a look that does not wait gets the command timeout */
    rds_deadline(r, c, deadline);
  for (;;) {
    uint64_t now = rds_mono_ms();
    if (nowait) /* enter.lua: 'n', a look that does not wait */
      snprintf(left, sizeof left, "n");
    else if (deadline == UINT64_MAX)
      snprintf(left, sizeof left, "-1");
    else
      snprintf(left, sizeof left, "%llu",
               (unsigned long long)(deadline > now ? deadline - now : 0));
    char rsv[16];
    uint32_t nrsv = r->seg_count != NULL ? r->seg_count(r->seg_arg, key) : 0;
    snprintf(rsv, sizeof rsv, "%u", nrsv);
    if (nrsv > 0)
      rds_reserved(r, key); /* the heartbeat keeps them while it drains */
    const char *av[] = {id,   scls, lease, live,  r->me,     pid, left,
                        c429, c503, token, rsv, r->seg_id, kept};
    struct enter_ans a;
    redisReply *rep =
        eval_enter(r, c, key, kept[0] != 0 ? 13 : 12, av, &a);
    if (rep == NULL) {
      /* what it did, if it ran (id "0": an arrival, its number unknown) */
      rds_give_back(r, key, token, id);
      int rc = failed(r, &c, "enter", key, nowait ? UINT64_MAX : deadline,
                      probe_by, timeout_ms);
      if (rc != RDS_AGAIN)
        return rc;
      if (nowait) {
        rds_put(r, c, 1);
        rds_msg("%s: not admitted now (Redis answers late)", key);
        return THROTTLE_EWOULDBLOCK;
      }
      rds_deadline(r, c, deadline);
      rds_slow();
      new_token(token, sizeof token); /* the old one's are given back */
      snprintf(id, sizeof id, "0");
      continue;
    }
    settings_of(a.settings, set);
    int st = a.st, is_probe = a.probe;
    int64_t hint = a.hint;
    snprintf(id, sizeof id, "%s", a.id);
    freeReplyObject(rep);
    if (st == 0) {
      rds_put(r, c, 1);
      struct rds_ticket *t = calloc(1, sizeof *t);
      if (t == NULL) {
        /* Give the slot straight back rather than hold it to its lapse. */
        const char *lv[] = {id, "6", "0", pid};
        redisReply *x;
        if (call(r, RDS_LEAVE, key, 4, lv, LEAVE_SHAPE, &x) == 0)
          freeReplyObject(x);
        rds_msg("out of memory");
        return THROTTLE_ENOMEM;
      }
      snprintf(t->fence, sizeof t->fence, "%s", id);
      snprintf(t->key, sizeof t->key, "%s", key);
      t->cls = cls;
      t->pid = getpid();
      t->since_ms = rds_mono_ms();
      rds_hold(r, t);
      *tk = t;
      *probe = is_probe;
      return 0;
    }
    if (st == 2) {
      rds_put(r, c, 1);
      rds_msg("%s: canceled", key);
      return THROTTLE_ECANCELED;
    }
    if (st == 4) {
      rds_put(r, c, 1);
      if (wait_ms != NULL)
        *wait_ms = hint > 0 ? (uint64_t)hint : 0;
      if (nowait) {
        rds_msg("%s: not admitted now", key);
        return THROTTLE_EWOULDBLOCK;
      }
      rds_msg("%s: not admitted within %llu ms", key,
              (unsigned long long)timeout_ms);
      return THROTTLE_ETIMEDOUT;
    }
    if (st == 3) {
      snprintf(id, sizeof id, "0"); /* dropped (Redis lost it): arrive again */
      continue;
    }
    /* st == 1: wait for a push, or until time alone may open the gate. */
    uint64_t sleep = RDS_MAX_SLEEP_MS;
    if (hint >= 0 && (uint64_t)hint + 5 < sleep)
      sleep = (uint64_t)hint + 1 + jitter_ms(5);
    now = rds_mono_ms();
    if (deadline != UINT64_MAX && now + sleep > deadline)
      sleep = deadline > now ? deadline - now : 0;
    if (sleep_slice(r, &sleep)) {
      /* Give the queue place back at once (a nowait look removes it; if
       * the slot came meanwhile, hand it back). */
      const char *qv[] = {id,    scls, lease, live, r->me,
                          pid,   "n",  c429,  c503, token};
      struct enter_ans q;
      rep = eval_enter(r, c, key, 10, qv, &q);
      if (rep == NULL) {
        rds_give_back(r, key, token, id);
        return rds_down(r, c, "enter");
      }
      int granted = q.st == 0;
      freeReplyObject(rep);
      if (granted) {
        const char *lv[] = {id, "6", "0", pid};
        if ((rep = eval_as(r, c, RDS_LEAVE, key, 4, lv, LEAVE_SHAPE)) == NULL) {
          rds_give_back(r, key, token, id);
          return rds_down(r, c, "enter");
        }
        freeReplyObject(rep);
      }
      rds_put(r, c, 1);
      rds_msg("%s: interrupted by the caller", key);
      return THROTTLE_EINTR;
    }
    if (rds_blpop(r, c, key, id, sleep, deadline) != 0) {
      int rc = failed(r, &c, "enter", key, deadline, probe_by, timeout_ms);
      if (rc == RDS_AGAIN) { /* its place stands: look again */
        rds_deadline(r, c, deadline);
        rds_slow();
        continue;
      }
      rds_give_back(r, key, token, id); /* its queue place, or a grant meanwhile */
      return rc;
    }
  }
}

static int rds_leave(void *be, void *tk, int outcome, uint64_t retry_after_ms,
                     uint32_t pub_len) {
  struct rds *r = be;
  struct rds_ticket *t = tk;
  rds_unhold(r, t);
  char out[8], ms[24], pid[16], at[16];
  snprintf(out, sizeof out, "%d", outcome);
  snprintf(ms, sizeof ms, "%llu", (unsigned long long)retry_after_ms);
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  snprintf(at, sizeof at, "%u", pub_len);
  const char *av[] = {t->fence, out, ms, pid, "", at};
  redisReply *rep;
  int rc = call(r, RDS_LEAVE, t->key, 6, av, LEAVE_SHAPE, &rep);
  if (rc == 0) {
    if (rds_leave_code(rep) == 1) {
      rds_msg("%s: the admission had been taken back (lease or liveness "
              "lapsed); its report only published",
              t->key);
      rc = THROTTLE_ESTALE;
    }
    freeReplyObject(rep);
  }
  free(t);
  return rc;
}

/* The set script: a setting, a clear, or the wait counters. */
static int set_call(struct rds *r, const char *key, const char *what,
                    uint64_t a, uint64_t b) {
  char sa[24], sb[24];
  snprintf(sa, sizeof sa, "%llu", (unsigned long long)a);
  snprintf(sb, sizeof sb, "%llu", (unsigned long long)b);
  const char *av[] = {what, sa, sb};
  redisReply *rep;
  int rc = call(r, RDS_SET, key, 3, av, 0, &rep);
  if (rc != 0)
    return rc;
  if (rep->type == REDIS_REPLY_INTEGER && rep->integer < 0) {
    rds_msg("%s: no such key", key);
    rc = THROTTLE_ENOKEY;
  }
  freeReplyObject(rep);
  return rc;
}

static int rds_set(void *be, const char *key, int what, uint64_t a,
                   uint64_t b) {
  static const char *const names[] = {"cap",   "rate",   "share", "pause",
                                      "resume", "cancel", "auto"};
  if (what < 0 || what > THROTTLE__BE_CAP_AUTO)
    return THROTTLE_EINVAL;
  return set_call(be, key, names[what], a, b);
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* Every key name stored in Redis (SCAN; one node).  *names is NULL when
 * there are none. */
static int scan_keys(struct rds *r, char ***names, size_t *n) {
  redisContext *c = rds_get(r);
  if (c == NULL)
    return THROTTLE__BE_DOWN;
  char cursor[32] = "0";
  char **v = NULL;
  size_t len = 0, cap = 0;
  int rc = 0;
  do {
    const char *av[] = {"SCAN", cursor, "MATCH", "thr1:*:k:*", "COUNT",
                        "1000"};
    redisReply *rep = rds_command(r, c, 6, av);
    if (rep == NULL || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_ARRAY) {
      if (rep != NULL) {
        rds_bad_reply(c, "SCAN", rep);
        freeReplyObject(rep);
      }
      free_names(v, len);
      return rds_down(r, c, "scan");
    }
    snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
    redisReply *ks = rep->element[1];
    for (size_t i = 0; i < ks->elements && rc == 0; i++) {
      if (ks->element[i]->type != REDIS_REPLY_STRING)
        continue;
      const char *hv[] = {"HGET", ks->element[i]->str, "key"};
      redisReply *k = rds_command(r, c, 3, hv);
      if (k != NULL && k->type == REDIS_REPLY_STRING) {
        if (len == cap) {
          cap = cap ? cap * 2 : 64;
          char **nv = realloc(v, cap * sizeof *nv);
          if (nv == NULL)
            rc = THROTTLE_ENOMEM;
          else
            v = nv;
        }
        if (rc == 0 && (v[len] = strdup(k->str)) != NULL)
          len++;
      }
      if (k != NULL)
        freeReplyObject(k);
    }
    freeReplyObject(rep);
  } while (rc == 0 && strcmp(cursor, "0") != 0);
  rds_put(r, c, 1);
  if (rc != 0) {
    free_names(v, len);
    rds_msg("out of memory");
    return rc;
  }
  *names = v;
  *n = len;
  return 0;
}

static int rds_clear(void *be, const char *key) {
  if (key != NULL)
    return set_call(be, key, "clear", 0, 0);
  char **names = NULL;
  size_t n = 0;
  int rc = scan_keys(be, &names, &n);
  if (rc != 0)
    return rc;
  for (size_t i = 0; i < n; i++) {
    int one = rc == 0 ? rds_clear(be, names[i]) : 0;
    if (one != 0 && one != THROTTLE_ENOKEY)
      rc = one;
    free(names[i]);
  }
  free(names);
  return rc;
}

static int rds_info(void *be, const char *key, throttle_info_t *out) {
  redisReply *rep;
  int rc = call(be, RDS_INFO, key, 0, NULL, INFO_SHAPE, &rep);
  if (rc != 0)
    return rc;
  if (rep->type != REDIS_REPLY_ARRAY) {
    freeReplyObject(rep);
    rds_msg("%s: no such key", key);
    return THROTTLE_ENOKEY;
  }
  memset(out, 0, sizeof *out);
  snprintf(out->key, sizeof out->key, "%s", key);
  size_t nf = (size_t)THROTTLE_FIELD_CAP_LEARNED_AGO_MS + 1;
  for (size_t i = 0; i < nf; i++)
    out->field[i] = elem_int(rep, i);
  for (size_t i = nf; i < rep->elements; i++) {
    unsigned long long pid, age;
    unsigned cls, probe;
    char line[512];
    int off = 0;
    elem_str(rep, i, line, sizeof line);
    if (line[0] == 'w' && line[1] == ' ') { /* a waiter, in arrival order */
      if (out->nwaiters >= THROTTLE__SLOTS ||
          sscanf(line + 2, "%llu %llu %u %n", &pid, &age, &cls, &off) < 3)
        continue;
      uint32_t k = out->nwaiters++;
      snprintf(out->waiter[k].host, sizeof out->waiter[k].host, "%s",
               line + 2 + off);
      out->waiter[k].pid = (uint32_t)pid;
      out->waiter[k].age_ms = age;
      out->waiter[k].cls = (uint8_t)(cls != 0);
      continue;
    }
    if (out->nholders >= THROTTLE__SLOTS ||
        sscanf(line, "%llu %llu %u %u %n", &pid, &age, &cls, &probe, &off) <
            4)
      continue;
    uint32_t k = out->nholders++;
    snprintf(out->holder[k].host, sizeof out->holder[k].host, "%s",
             line + off);
    out->holder[k].pid = (uint32_t)pid;
    out->holder[k].age_ms = age;
    out->holder[k].cls = (uint8_t)cls;
    out->holder[k].probe = (uint8_t)probe;
  }
  freeReplyObject(rep);
  throttle__info_unlisted(out);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int rds_foreach(void *be, int (*fn)(const throttle_info_t *, void *),
                       void *arg) {
  char **names = NULL;
  size_t n = 0;
  int rc = scan_keys(be, &names, &n);
  if (rc != 0)
    return rc;
  if (n > 1)
    qsort(names, n, sizeof *names, by_name);
  throttle_info_t *info = malloc(sizeof *info);
  if (info == NULL)
    rc = THROTTLE_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    if (rc == 0) {
      int one = rds_info(be, names[i], info);
      if (one == 0)
        rc = fn(info, arg);
      else if (one != THROTTLE_ENOKEY)
        rc = one; /* gone meanwhile: skipped */
    }
    free(names[i]);
  }
  free(names);
  free(info);
  return rc;
}

EXPORT const struct throttle__backend throttle_backend_v1 = {
    .abi = THROTTLE__BACKEND_ABI,
    .name = "redis",
    .open = rds_open,
    .close = rds_close,
    .errmsg = rds_errmsg,
    .backoff = rds_backoff,
    .remaining = rds_remaining,
    .wait = rds_wait,
    .enter = rds_enter,
    .leave = rds_leave,
    .set = rds_set,
    .clear = rds_clear,
    .info = rds_info,
    .foreach = rds_foreach,
    .notice = notice,
};
