/* SPDX-License-Identifier: MIT */
/*
 * bench_redis.c — what an admission costs on the Redis backend, measured
 * against one PING to the same throw-away redis-server in the same run
 * (a unix socket, so the figures are the floor a network only raises).
 *
 *   round trips   client commands Redis counted (INFO commandstats) per
 *                 uncontended throttle_enter() + throttle_leave(); goal <= 2
 *   enter         one uncontended throttle_enter() as a ratio to one PING;
 *                 goal <= 3 x PING
 *   enter+leave   the pair, as a ratio to one PING
 *   server cost   Redis CPU per enter and per leave script (INFO
 *                 commandstats, usec per call of FCALL and EVALSHA
 *                 together: the module calls its Functions library where
 *                 the server has one, EVALSHA otherwise) as a ratio to a
 *                 minimal script (HGETALL + HSET of one hash) run in the
 *                 same server the same way: a minimal function by FCALL
 *                 when the module used FCALL, else a minimal EVALSHA
 *                 script (both are printed); goal <= 5 x each.  In
 *                 each of BATCHES batches the minimal script runs BATCH
 *                 times, then BATCH enters and their leaves, each run
 *                 measured after an unmeasured run of the same calls;
 *                 printed: the medians of the batches and the quartiles
 *                 of the batches' ratios
 *   per look      Redis CPU per look of a waiting caller (usec per script
 *                 call while 20, 200 and 800 callers wait on a held key of
 *                 cap 1, the median of LOOK_BATCHES windows, each
 *                 measured right after a run of the minimal script: the
 *                 ratios printed are the medians of the windows'); goal:
 *                 flat in the number of waiters
 *   reserved look  the same per look of a host whose segment holds
 *                 RESERVED callers (admitted there while Redis was
 *                 away, kept in Redis as that host's reservations), as a
 *                 ratio to a look at a key of cap 1 held by one caller,
 *                 in alternating windows; goal: about 1 (a look reads
 *                 the key's hash whole, and the reservations are one
 *                 field of it however many)
 *
 * Each round measures PING right before the operation; the figure is the
 * median of the per-round ratios, so a noisy neighbour moves both sides.
 * Anchor: redis-cell's rate check is about one round trip.
 */
#include "throttle.h"
#include "redis_helpers.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 11
#define BATCHES 101 /* of the server-cost figures */
#define BATCH 50    /* calls of each script in a batch */
#define LOOK_BATCHES 21 /* windows of a per-look figure */
#define ITERS 2000

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static double ping_ns(redisContext *c) {
  double t0 = now_ns();
  for (int i = 0; i < ITERS; i++) {
    redisReply *r = redisCommand(c, "PING");
    if (r == NULL) {
      fprintf(stderr, "bench_redis: PING failed\n");
      exit(1);
    }
    freeReplyObject(r);
  }
  return (now_ns() - t0) / ITERS;
}

/* Client commands counted by the server so far (scripts' own calls are
 * not client commands and are left out). */
static long long client_calls(redisContext *c) {
  static const char *const cmds[] = {"fcall",  "function", "evalsha",
                                     "eval",   "blpop",    "script"};
  redisReply *r = redisCommand(c, "INFO commandstats");
  long long n = 0;
  if (r == NULL || r->type != REDIS_REPLY_STRING) {
    fprintf(stderr, "bench_redis: INFO failed\n");
    exit(1);
  }
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmds[i]);
    const char *p = strstr(r->str, pat);
    if (p != NULL)
      n += atoll(p + strlen(pat));
  }
  freeReplyObject(r);
  return n;
}

/* The calls and usec so far of one command (INFO commandstats), added to
 * *calls and *usec. */
static void add_stats(const char *info, const char *cmd, double *calls,
                      double *usec) {
  char pat[64];
  snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
  const char *p = strstr(info, pat);
  if (p != NULL) {
    *calls += atof(p + strlen(pat));
    const char *u = strstr(p, "usec=");
    if (u != NULL)
      *usec += atof(u + 5);
  }
}

/* Script calls (FCALL and EVALSHA) and their usec so far. */
static void script_stats(redisContext *c, double *calls, double *usec) {
  redisReply *r = redisCommand(c, "INFO commandstats");
  if (r == NULL || r->type != REDIS_REPLY_STRING) {
    fprintf(stderr, "bench_redis: INFO failed\n");
    exit(1);
  }
  *calls = *usec = 0;
  add_stats(r->str, "fcall", calls, usec);
  add_stats(r->str, "evalsha", calls, usec);
  freeReplyObject(r);
}

/* FCALL calls so far (did the module use its Functions library?). */
static double fcalls(redisContext *c) {
  redisReply *r = redisCommand(c, "INFO commandstats");
  if (r == NULL || r->type != REDIS_REPLY_STRING) {
    fprintf(stderr, "bench_redis: INFO failed\n");
    exit(1);
  }
  double calls = 0, usec = 0;
  add_stats(r->str, "fcall", &calls, &usec);
  freeReplyObject(r);
  return calls;
}

/* Server usec per script call since the last call (state in *c0, *u0). */
static double per_call(redisContext *c, double *c0, double *u0) {
  double c1, u1;
  script_stats(c, &c1, &u1);
  double v = c1 > *c0 ? (u1 - *u0) / (c1 - *c0) : 0;
  *c0 = c1;
  *u0 = u1;
  return v;
}

static void die(throttle_t *h, const char *what, int rc);

/* The minimal script: one hash read whole and one field written, by
 * EVALSHA (fn 0) or as a function of a library by FCALL (fn 1); loaded
 * by minimal_load() (the script's SHA1 or the library's name into out),
 * run by minimal_us(). */
#define MINIMAL_BODY                                                         \
  "local a = redis.call('HGETALL', KEYS[1]) "                               \
  "redis.call('HSET', KEYS[1], 'n', ARGV[1]) return #a"
static void minimal_load(redisContext *c, int fn, char out[41]) {
  redisReply *r =
      fn ? redisCommand(c, "FUNCTION LOAD REPLACE %s",
                        "#!lua name=bench_minimal\n"
                        "redis.register_function('bench_minimal', "
                        "function(KEYS, ARGV) " MINIMAL_BODY " end)")
         : redisCommand(c, "SCRIPT LOAD %s", MINIMAL_BODY);
  if (r == NULL || r->type != REDIS_REPLY_STRING) {
    fprintf(stderr, "bench_redis: loading the minimal script failed\n");
    exit(1);
  }
  snprintf(out, 41, "%s", r->str);
  freeReplyObject(r);
}

/* Server usec per call of n calls of the minimal script. */
static double minimal_us(redisContext *c, int fn, const char *sha, int n) {
  double c0, u0;
  script_stats(c, &c0, &u0);
  for (int i = 0; i < n; i++) {
    redisReply *r =
        fn ? redisCommand(c, "FCALL bench_minimal 1 bench:minimal %d", i)
           : redisCommand(c, "EVALSHA %s 1 bench:minimal %d", sha, i);
    if (r == NULL || r->type != REDIS_REPLY_INTEGER) {
      fprintf(stderr, "bench_redis: the minimal script failed\n");
      exit(1);
    }
    freeReplyObject(r);
  }
  return per_call(c, &c0, &u0);
}

/* How the minimal script is called: FCALL or EVALSHA, and its SHA1. */
struct minimal {
  int fn;
  const char *sha;
};

/* Server usec per call of BATCH calls of the minimal script, measured
 * after BATCH that are not (what it costs after its own kind, not the
 * garbage or the cold caches another script left it). */
static double minimal_warm_us(redisContext *c, const struct minimal *m) {
  minimal_us(c, m->fn, m->sha, BATCH);
  return minimal_us(c, m->fn, m->sha, BATCH);
}

#define HELD 300 /* keys the enter and leave batches take in turn */

/* Server usec per enter script and per leave script: n uncontended
 * admissions of keys beneath one scope (bench:ws/t<i>, i from first on,
 * modulo HELD), then their leaves. */
static void enter_leave_us(throttle_t *h, redisContext *c, int first, int n,
                           double *enter, double *leave) {
  static throttle_ticket_t *tk[HELD];
  double c0, u0;
  script_stats(c, &c0, &u0);
  for (int i = 0; i < n; i++) {
    char key[64];
    snprintf(key, sizeof key, "bench:ws/t%d", (first + i) % HELD);
    int rc = throttle_enter(h, key, THROTTLE_CLASS_LIVE, 10000, &tk[i]);
    if (rc != 0)
      die(h, "enter", rc);
  }
  *enter = per_call(c, &c0, &u0);
  for (int i = 0; i < n; i++) {
    int rc = throttle_leave(h, tk[i], THROTTLE_OUTCOME_OK, 0);
    if (rc != 0)
      die(h, "leave", rc);
  }
  *leave = per_call(c, &c0, &u0);
}

/* BATCH looks at key that do not wait (throttle_try_enter), each refused. */
static void looks(throttle_t *h, const char *key) {
  for (int i = 0; i < BATCH; i++) {
    throttle_ticket_t *t = NULL;
    int rc = throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL);
    if (rc != THROTTLE_EWOULDBLOCK)
      die(h, key, rc);
  }
}

static void *waiter(void *arg) {
  throttle_t *h = arg;
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, "bench:look", THROTTLE_CLASS_LIVE,
                          THROTTLE_FOREVER, &t);
  if (rc == 0)
    throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
  return NULL;
}

/* Server usec per look while n callers wait on a held key of cap 1: the
 * median of LOOK_BATCHES windows, each of BATCH looks that do not wait
 * (throttle_try_enter) and the waiters' own looks in it, all the script
 * calls of the window; *ratio: the median of the windows' ratios to the
 * minimal script (m) measured right before each (minimal_warm_us). */
static double look_us(throttle_t *h, redisContext *c, const struct minimal *m,
                      int n, double *ratio) {
  throttle_ticket_t *held = NULL;
  int rc = throttle_set_max_parallel(h, "bench:look", 1);
  if (rc == 0)
    rc = throttle_enter(h, "bench:look", THROTTLE_CLASS_LIVE, 10000, &held);
  if (rc != 0)
    die(h, "look setup", rc);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 * 1024);
  for (int i = 0; i < n; i++)
    if (th == NULL || pthread_create(&th[i], &at, waiter, h) != 0) {
      fprintf(stderr, "bench_redis: cannot start %d waiters\n", n);
      exit(1);
    }
  pthread_attr_destroy(&at);
  for (int tries = 0;; tries++) {
    throttle_info_t *info = NULL;
    int64_t w = 0;
    if (throttle_info(h, "bench:look", &info) == 0) {
      w = throttle_info_get(info, THROTTLE_FIELD_WAITING_LIVE);
      throttle_info_free(info);
    }
    if (w >= n)
      break;
    if (tries > 6000) { /* some fell back to the segment (a timeout) */
      fprintf(stderr,
              "bench_redis: %lld of %d waiting in Redis; measured so\n",
              (long long)w, n);
      break;
    }
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
  double c0, u0, win[LOOK_BATCHES], rat[LOOK_BATCHES];
  for (int b = 0; b < LOOK_BATCHES; b++) {
    double base = minimal_warm_us(c, m);
    script_stats(c, &c0, &u0);
    looks(h, "bench:look");
    win[b] = per_call(c, &c0, &u0);
    rat[b] = win[b] / base;
  }
  *ratio = median(rat, LOOK_BATCHES);
  double us = median(win, LOOK_BATCHES);
  if ((rc = throttle_cancel(h, "bench:look")) != 0)
    die(h, "cancel", rc);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  free(th);
  if ((rc = throttle_leave(h, held, THROTTLE_OUTCOME_OK, 0)) != 0)
    die(h, "leave", rc);
  return us;
}

/* The throw-away server (main starts it). */
static struct th_redis R;

#define RESERVED 32 /* callers a host's segment holds (a key's most) */

/* Server usec per look of a batch of looks at key (looks()), after one
 * batch unmeasured. */
static double try_us(throttle_t *h, redisContext *c, const char *key) {
  double c0, u0;
  looks(h, key);
  script_stats(c, &c0, &u0);
  looks(h, key);
  return per_call(c, &c0, &u0);
}

static redisContext *connect_server(void);

/* The look of a host that rejoins Redis while its segment holds RESERVED
 * callers of bench:rsv (cap RESERVED): Redis is stopped, the segment
 * admits them, Redis comes back empty; against looks at bench:one, of
 * cap 1 and held through Redis, in alternating windows.  Returns the
 * median of the windows' ratios; *rsv_us and *one_us the medians of
 * their figures.  Last in the run: *c is connected again. */
static double reserved_look(throttle_t *h, redisContext **c, double *rsv_us,
                            double *one_us) {
  throttle_ticket_t *t[RESERVED], *one = NULL;
  int rc = throttle_set_max_parallel(h, "bench:rsv", RESERVED);
  if (rc == 0) /* the cap mirrored in the host's segment */
    rc = throttle_enter(h, "bench:rsv", THROTTLE_CLASS_LIVE, 10000, &t[0]);
  if (rc == 0)
    rc = throttle_leave(h, t[0], THROTTLE_OUTCOME_OK, 0);
  if (rc != 0)
    die(h, "reserved setup", rc);
  redisFree(*c);
  th_redis_stop(&R, 1);
  for (int i = 0; i < RESERVED; i++)
    if ((rc = throttle_try_enter(h, "bench:rsv", THROTTLE_CLASS_LIVE, &t[i],
                                 NULL)) != 0)
      die(h, "segment admission", rc);
  if (th_redis_start(&R) != 0) {
    fprintf(stderr, "bench_redis: redis-server did not start again\n");
    exit(1);
  }
  *c = connect_server();
  struct timespec ts = {1, 300 * 1000000}; /* past the host's retry pause */
  nanosleep(&ts, NULL);
  rc = throttle_set_max_parallel(h, "bench:one", 1);
  if (rc == 0)
    rc = throttle_enter(h, "bench:one", THROTTLE_CLASS_LIVE, 10000, &one);
  if (rc != 0)
    die(h, "bench:one", rc);
  try_us(h, *c, "bench:rsv"); /* Redis asked again: the reservations made */
  throttle_info_t *info = NULL;
  if (throttle_info(h, "bench:rsv", &info) != 0 ||
      throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT) != RESERVED) {
    fprintf(stderr, "bench_redis: the reservations are not in Redis\n");
    exit(1);
  }
  throttle_info_free(info);
  double r[LOOK_BATCHES], a[LOOK_BATCHES], b[LOOK_BATCHES];
  for (int i = 0; i < LOOK_BATCHES; i++) {
    b[i] = try_us(h, *c, "bench:one");
    a[i] = try_us(h, *c, "bench:rsv");
    r[i] = a[i] / b[i];
  }
  for (int i = 0; i < RESERVED; i++)
    if ((rc = throttle_leave(h, t[i], THROTTLE_OUTCOME_OK, 0)) != 0)
      die(h, "segment leave", rc);
  if ((rc = throttle_leave(h, one, THROTTLE_OUTCOME_OK, 0)) != 0)
    die(h, "leave", rc);
  *rsv_us = median(a, LOOK_BATCHES);
  *one_us = median(b, LOOK_BATCHES);
  return median(r, LOOK_BATCHES);
}

static void die(throttle_t *h, const char *what, int rc) {
  fprintf(stderr, "bench_redis: %s: %s (%s)\n", what, throttle_err_name(rc),
          throttle_errmsg(h));
  exit(1);
}

static double enter_ns(throttle_t *h, int with_leave) {
  double t = 0;
  for (int i = 0; i < ITERS; i++) {
    throttle_ticket_t *tk = NULL;
    double t0 = now_ns();
    int rc = throttle_enter(h, "bench:ws/orders", THROTTLE_CLASS_LIVE, 10000,
                            &tk);
    if (rc != 0)
      die(h, "enter", rc);
    if (!with_leave)
      t += now_ns() - t0;
    rc = throttle_leave(h, tk, THROTTLE_OUTCOME_OK, 0);
    if (rc != 0)
      die(h, "leave", rc);
    if (with_leave)
      t += now_ns() - t0;
  }
  return t / ITERS;
}

/* The segment and the server go whatever way the run ends (die() exits). */
static char seg[64];
static void stop_server(void) {
  if (seg[0] != 0)
    throttle_unlink(seg);
  th_redis_cleanup(&R);
}

static redisContext *connect_server(void) {
  struct timeval tv = {2, 0};
  redisContext *c = redisConnectUnixWithTimeout(R.sock, tv);
  if (c == NULL || c->err) {
    fprintf(stderr, "bench_redis: connect failed\n");
    exit(1);
  }
  return c;
}

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("bench_redis: skipped, redis-server is not installed\n");
    return 0;
  }
  atexit(stop_server);
  if (th_redis_start(&R) != 0) {
    fprintf(stderr, "bench_redis: redis-server did not start\n");
    return 1;
  }
  th_redis_use_module(argv[0]);
  /* no heartbeat round inside the measured windows */
  setenv("THROTTLE_LIVENESS_MS", "3600000", 1);
  snprintf(seg, sizeof seg, "/thr-bench-redis-%d", (int)getpid());
  throttle_config_t *cfg = throttle_config_new();
  throttle_t *h = NULL;
  if (cfg == NULL || throttle_config_set_segment(cfg, seg) != 0 ||
      throttle_config_set_backend(cfg, R.url) != 0)
    return 1;
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  if (rc != 0)
    die(h, "open", rc);
  redisContext *c = connect_server();
  /* warm up: connections made, scripts loaded */
  enter_ns(h, 1);

  long long before = client_calls(c);
  enter_ns(h, 1);
  double trips = (double)(client_calls(c) - before) / ITERS;

  double r_enter[ROUNDS], r_pair[ROUNDS], ping[ROUNDS], pair[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    ping[i] = ping_ns(c);
    r_enter[i] = enter_ns(h, 0) / ping[i];
    double p2 = ping_ns(c);
    pair[i] = enter_ns(h, 1);
    r_pair[i] = pair[i] / p2;
  }
  double m_ping = median(ping, ROUNDS);
  printf("redis backend (unix socket, %d rounds of %d):\n", ROUNDS, ITERS);
  printf("  PING                       %8.1f us (median)\n", m_ping / 1000);
  printf("  enter+leave                %8.1f us (median)\n",
         median(pair, ROUNDS) / 1000);
  printf("  round trips / enter+leave  %8.2f  (goal <= 2)\n", trips);
  printf("  enter / PING               %8.2f x (goal <= 3)\n",
         median(r_enter, ROUNDS));
  printf("  enter+leave / PING         %8.2f x\n", median(r_pair, ROUNDS));

  /* the baseline called the way the module calls its scripts */
  int fn = fcalls(c) > 0;
  char sha[41]; /* EVALSHA's (FUNCTION LOAD's answer is a name) */
  minimal_load(c, 0, sha);
  double m_eval = minimal_us(c, 0, sha, ITERS), m_fn = 0;
  if (fn) {
    char name[41];
    minimal_load(c, 1, name);
    m_fn = minimal_us(c, 1, sha, ITERS);
  }
  const struct minimal m = {fn, sha};
  /* the keys made (as in a load, the batches find them) */
  double e0, l0;
  enter_leave_us(h, c, 0, HELD, &e0, &l0);
  /* Batches, each of a run of the minimal script and of a run of enters
   * and their leaves, each run after one of the same calls that is not
   * measured (as minimal_warm_us runs the minimal script).  A batch's
   * ratios are of figures measured a few milliseconds apart, and the
   * medians of the batches are printed (a batch that a noisy neighbour
   * slowed moves none of them). */
  static double mr[BATCHES], er[BATCHES], lr[BATCHES], rer[BATCHES],
      rlr[BATCHES];
  for (int i = 0; i < BATCHES; i++) {
    mr[i] = minimal_warm_us(c, &m);
    enter_leave_us(h, c, 2 * i * BATCH, BATCH, &e0, &l0);
    enter_leave_us(h, c, (2 * i + 1) * BATCH, BATCH, &er[i], &lr[i]);
    rer[i] = er[i] / mr[i];
    rlr[i] = lr[i] / mr[i];
  }
  double base = median(mr, BATCHES), e_us = median(er, BATCHES),
         l_us = median(lr, BATCHES);
  double e_x = median(rer, BATCHES), l_x = median(rlr, BATCHES);
  printf("  scripts called by          %s\n",
         fn ? "FCALL (Functions library)" : "EVALSHA");
  printf("  minimal script, EVALSHA    %8.2f us\n", m_eval);
  if (fn)
    printf("  minimal function, FCALL    %8.2f us\n", m_fn);
  printf("  minimal script (server)    %8.2f us (median of %d batches of %d)\n",
         base, BATCHES, BATCH);
  /* median() sorted the ratios: the quartiles are at n/4 and 3n/4 */
  printf("  enter script (server)      %8.2f us = %5.1f x minimal "
         "(quartiles %.1f-%.1f; goal <= 5)\n",
         e_us, e_x, rer[BATCHES / 4], rer[3 * BATCHES / 4]);
  printf("  leave script (server)      %8.2f us = %5.1f x minimal "
         "(quartiles %.1f-%.1f; goal <= 5)\n",
         l_us, l_x, rlr[BATCHES / 4], rlr[3 * BATCHES / 4]);
  static const int waiting[] = {20, 200, 800};
  double first = 0;
  for (size_t i = 0; i < sizeof waiting / sizeof *waiting; i++) {
    double x = 0, us = look_us(h, c, &m, waiting[i], &x);
    if (i == 0)
      first = x;
    printf("  look, %3d waiting (server) %8.2f us = %5.1f x minimal, %4.2f x "
           "at %d\n",
           waiting[i], us, x, x / first, waiting[0]);
  }
  double rsv_us = 0, one_us = 0, rx = reserved_look(h, &c, &rsv_us, &one_us);
  printf("  look, %d reserved (server) %7.2f us = %4.2f x a look at one "
         "holder (%.2f us; goal about 1)\n",
         RESERVED, rsv_us, rx, one_us);
  redisFree(c);
  throttle_close(h);
  return 0;
}
