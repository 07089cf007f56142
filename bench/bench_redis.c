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
 *
 * Each round measures PING right before the operation; the figure is the
 * median of the per-round ratios, so a noisy neighbour moves both sides.
 * Anchor: redis-cell's rate check is about one round trip.
 */
#include "throttle.h"
#include "redis_helpers.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 11
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
  static const char *const cmds[] = {"evalsha", "eval", "blpop", "script"};
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

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("bench_redis: skipped, redis-server is not installed\n");
    return 0;
  }
  struct th_redis R = {0};
  if (th_redis_start(&R) != 0) {
    fprintf(stderr, "bench_redis: redis-server did not start\n");
    return 1;
  }
  th_redis_use_module(argv[0]);
  char seg[64];
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
  struct timeval tv = {2, 0};
  redisContext *c = redisConnectUnixWithTimeout(R.sock, tv);
  if (c == NULL || c->err) {
    fprintf(stderr, "bench_redis: connect failed\n");
    return 1;
  }
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
  redisFree(c);
  throttle_close(h);
  throttle_unlink(seg);
  th_redis_cleanup(&R);
  return 0;
}
