/* SPDX-License-Identifier: MIT */
/*
 * redis_beat.c — the Redis backend's heartbeat: one thread per handle (per
 * process, after a fork), started at the first admission or give-back,
 * that every liveness/4, on a connection of its own, refreshes the
 * liveness record of every admission this process holds (registering
 * again one Redis lost, beat.lua) and sends the give-backs of enters whose
 * caller never heard the answer (leave.lua, by the call's token).  A
 * holder that dies stops it, and its slot is reclaimed by the next grant
 * after liveness ms.  Rejected: refreshing from the caller's thread (a
 * loader blocked in a long request makes no calls).
 */
#include "redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* One round: every held admission, however many (copied under the
 * mutex, refreshed without it).  *c is the thread's own connection, kept
 * across rounds (so the first command of a round is sent on a connection
 * that sat idle, and is retried once if the server closed it). */
/* The give-backs (struct rds_giveback), under r->mu, which is dropped
 * around each call; closing: the handle's last round, which stops at the
 * first command that fails (no connection, a timeout). */
static void give_back_round(struct rds *r, redisContext **c, int closing) {
  char pid[16];
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  for (struct rds_giveback **pp = &r->giveback; *pp != NULL;) {
    struct rds_giveback g = **pp;
    if (g.pid != getpid()) { /* the parent's */
      pp = &(*pp)->next;
      continue;
    }
    pthread_mutex_unlock(&r->mu);
    int done = rds_mono_ms() > g.until, failed = 0;
    if (!done && (*c != NULL || (*c = rds_connect(r)) != NULL)) {
      char len[16];
      snprintf(len, sizeof len, "%zu", strlen(g.key));
      const char *av[] = {"-", "6", "0", pid, "", len, g.token, g.id};
      redisReply *rep = rds_eval(r, *c, RDS_LEAVE, g.key, 8, av);
      if (rep != NULL) {
        int code = rds_leave_code(rep);
        done = code >= 0 && code != 1;
        freeReplyObject(rep);
      } else {
        failed = 1;
        if ((*c)->err != 0) {
          redisFree(*c);
          *c = NULL;
        }
      }
    } else if (!done) {
      failed = 1;
    }
    pthread_mutex_lock(&r->mu);
    /* the list only grows at its head meanwhile: find the entry again */
    while (*pp != NULL && strcmp((*pp)->token, g.token) != 0)
      pp = &(*pp)->next;
    if (*pp == NULL)
      break;
    if (done) {
      struct rds_giveback *x = *pp;
      *pp = x->next;
      free(x);
    } else {
      pp = &(*pp)->next;
    }
    if (failed && closing)
      break;
  }
}

void rds_give_back_last(struct rds *r) {
  pthread_mutex_lock(&r->mu);
  if (r->giveback != NULL) {
    redisContext *c = NULL;
    give_back_round(r, &c, 1);
    if (c != NULL)
      redisFree(c);
  }
  pthread_mutex_unlock(&r->mu);
}

void rds_settings_kept(struct rds *r, const char *key, char *buf,
                       size_t len) {
  struct throttle__be_settings k[THROTTLE__BE_NSETTINGS] = {{0}};
  buf[0] = 0;
  if (r->seg_settings == NULL || r->seg_settings(r->seg_arg, key, r->ttl_ms, k) <= 0)
    return;
  int last = 0;
  for (int i = 0; i < THROTTLE__BE_NSETTINGS; i++)
    if (k[i].known)
      last = i;
  size_t n = 0;
  for (int i = 0; i <= last && n < len; i++) {
    const struct throttle__be_settings *s = &k[i];
    int w = s->known ? snprintf(buf + n, len - n, "%s%u %u %d %u %llu %d %u",
                                i ? ";" : "", s->fixed_cap, s->auto_max,
                                s->paused ? 1 : 0, s->rate_n,
                                (unsigned long long)s->rate_period_ms,
                                s->share_set ? 1 : 0, s->share_permille)
                     : snprintf(buf + n, len - n, "%s-", i ? ";" : "");
    if (w < 0 || (size_t)w >= len - n) {
      buf[0] = 0; /* never a part cut short */
      return;
    }
    n += (size_t)w;
  }
}

/* The reservations of this host's segment, kept while it holds or queues
 * callers of the key (a long request, and no new caller to look), dropped
 * once it has drained.  Under r->mu, dropped around each call. */
static void reserved_round(struct rds *r, redisContext **c) {
  char live[16];
  snprintf(live, sizeof live, "%u", r->liveness_ms);
  for (struct rds_reserved **pp = &r->reserved; *pp != NULL;) {
    char key[THROTTLE__KEY_MAX + 1];
    memcpy(key, (*pp)->key, sizeof key);
    pthread_mutex_unlock(&r->mu);
    uint32_t n = r->seg_count != NULL ? r->seg_count(r->seg_arg, key) : 0;
    int done = 0;
    if (*c != NULL || (*c = rds_connect(r)) != NULL) {
      char sn[16];
      snprintf(sn, sizeof sn, "%u", n);
      char kept[RDS_KEPT_LEN];
      rds_settings_kept(r, key, kept, sizeof kept);
      const char *av[] = {"-r", sn, r->seg_id, live, r->me, kept};
      redisReply *rep = rds_eval(r, *c, RDS_BEAT, key, kept[0] ? 6 : 5, av);
      if (rep != NULL) {
        done = n == 0;
        freeReplyObject(rep);
      } else if ((*c)->err != 0) {
        redisFree(*c);
        *c = NULL;
      }
    }
    pthread_mutex_lock(&r->mu);
    while (*pp != NULL && strcmp((*pp)->key, key) != 0)
      pp = &(*pp)->next;
    if (*pp == NULL)
      break;
    if (done) {
      struct rds_reserved *x = *pp;
      *pp = x->next;
      free(x);
    } else {
      pp = &(*pp)->next;
    }
  }
}

static void beat_round(struct rds *r, redisContext **c) {
  if (r->giveback != NULL)
    give_back_round(r, c, 0);
  if (r->reserved != NULL)
    reserved_round(r, c);
  size_t n = 0;
  pid_t me = getpid();
  for (struct rds_ticket *t = r->held; t != NULL; t = t->next)
    n++;
  struct beat_one {
    char fence[32];
    char key[THROTTLE__KEY_MAX + 1];
    char cls[4], held[24];
    int gone;
  } *v = n ? calloc(n, sizeof *v) : NULL;
  if (v == NULL)
    return; /* nothing held, or no memory: the next round tries */
  size_t i = 0;
  uint64_t now = rds_mono_ms();
  for (struct rds_ticket *t = r->held; t != NULL; t = t->next) {
    if (t->lapsed || t->pid != me)
      continue; /* taken back, or the parent's: nothing to keep alive */
    memcpy(v[i].fence, t->fence, sizeof v[i].fence);
    memcpy(v[i].key, t->key, sizeof v[i].key);
    snprintf(v[i].cls, sizeof v[i].cls, "%d", t->cls);
    snprintf(v[i].held, sizeof v[i].held, "%llu",
             (unsigned long long)(now - t->since_ms));
    i++;
  }
  n = i;
  pthread_mutex_unlock(&r->mu);
  if (*c != NULL)
    rds_idle(*c);
  char lease[16], live[16], pid[16];
  snprintf(lease, sizeof lease, "%u", r->lease_ms);
  snprintf(live, sizeof live, "%u", r->liveness_ms);
  snprintf(pid, sizeof pid, "%d", (int)getpid());
  for (i = 0; i < n; i++) {
    if (*c == NULL && (*c = rds_connect(r)) == NULL)
      break; /* Redis down: try again at the next beat */
    char kept[RDS_KEPT_LEN];
    rds_settings_kept(r, v[i].key, kept, sizeof kept);
    const char *av[] = {v[i].fence, v[i].cls, lease, live,
                        r->me,      pid,      v[i].held, kept};
    redisReply *rep =
        rds_eval(r, *c, RDS_BEAT, v[i].key, kept[0] ? 8 : 7, av);
    if (rep == NULL) {
      if ((*c)->err != 0) {
        redisFree(*c);
        *c = NULL;
      }
      continue;
    }
    if (rep->type == REDIS_REPLY_INTEGER)
      v[i].gone = rep->integer == 0;
    freeReplyObject(rep);
  }
  pthread_mutex_lock(&r->mu);
  for (i = 0; i < n; i++)
    if (v[i].gone)
      for (struct rds_ticket *t = r->held; t != NULL; t = t->next)
        if (strcmp(t->fence, v[i].fence) == 0)
          t->lapsed = 1;
  free(v);
}

static void *beat_main(void *arg) {
  struct rds *r = arg;
  redisContext *c = NULL;
  pthread_mutex_lock(&r->mu);
  while (!r->stopping) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)r->liveness_ms / 4 * 1000000;
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_cond_timedwait(&r->beat_cv, &r->mu, &ts);
    if (r->stopping)
      break;
    beat_round(r, &c);
  }
  pthread_mutex_unlock(&r->mu);
  if (c != NULL)
    redisFree(c);
  return NULL;
}

/* A forked child has no heartbeat (redis_ops.c fork_child clears the
 * flag): it starts its own, which beats the child's admissions and sends
 * its give-backs only (the parent's, copied into the child, stay the
 * parent's: beaten by the child they would outlive a parent that died). */
static void start_beat_locked(struct rds *r) {
  if (!r->beat_running && !r->stopping &&
      pthread_create(&r->beat, NULL, beat_main, r) == 0)
    r->beat_running = 1;
}

void rds_hold(struct rds *r, struct rds_ticket *t) {
  pthread_mutex_lock(&r->mu);
  t->next = r->held;
  r->held = t;
  start_beat_locked(r);
  pthread_mutex_unlock(&r->mu);
}

/* The enter with this token may have queued or been admitted without its
 * caller hearing it: given back from the heartbeat thread, for as long as
 * a waiter or holder record of it could live (liveness: nobody refreshes
 * it). */
void rds_give_back(struct rds *r, const char *key, const char *token,
                   const char *id) {
  struct rds_giveback *g = calloc(1, sizeof *g);
  if (g == NULL)
    return; /* then liveness reclaims it, as before */
  snprintf(g->token, sizeof g->token, "%s", token);
  snprintf(g->id, sizeof g->id, "%s", id);
  snprintf(g->key, sizeof g->key, "%s", key);
  g->until = rds_mono_ms() + r->liveness_ms;
  g->pid = getpid();
  pthread_mutex_lock(&r->mu);
  g->next = r->giveback;
  r->giveback = g;
  start_beat_locked(r);
  pthread_mutex_unlock(&r->mu);
}

void rds_unhold(struct rds *r, struct rds_ticket *t) {
  pthread_mutex_lock(&r->mu);
  for (struct rds_ticket **pp = &r->held; *pp != NULL; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      break;
    }
  pthread_mutex_unlock(&r->mu);
}


void rds_reserved(struct rds *r, const char *key) {
  pthread_mutex_lock(&r->mu);
  struct rds_reserved *x = r->reserved;
  while (x != NULL && strcmp(x->key, key) != 0)
    x = x->next;
  if (x == NULL && (x = calloc(1, sizeof *x)) != NULL) {
    snprintf(x->key, sizeof x->key, "%s", key);
    x->next = r->reserved;
    r->reserved = x;
  }
  start_beat_locked(r);
  pthread_mutex_unlock(&r->mu);
}
