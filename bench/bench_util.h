/* SPDX-License-Identifier: MIT */
/*
 * bench_util.h — what the benchmarks share: the monotonic clock in ns, the
 * median of a sample, the cost of one clock_gettime() (the baseline every
 * ratio is taken against), and opening a segment without the fail-open
 * fallback (a benchmark of private memory would measure the wrong thing).
 * Header-only and static inline: each benchmark is one translation unit
 * and the Makefile builds bench/bench_*.c alone.
 */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include "throttle.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[n / 2];
}

/* ns per clock_gettime(id), over iters calls. */
static inline double bench_time_clock(clockid_t id, int iters) {
  struct timespec ts;
  double t0 = bench_now_ns();
  for (int i = 0; i < iters; i++) {
    clock_gettime(id, &ts);
    __asm__ volatile(""
                     :
                     : "g"(ts.tv_nsec)
                     : "memory"); /* the result is used */
  }
  return (bench_now_ns() - t0) / iters;
}

/* Open segment seg with THROTTLE_NO_FALLBACK | flags; NULL (after saying
 * why on stderr) when it cannot be opened shared. */
static inline throttle_t *bench_open(const char *prog, const char *seg,
                                     unsigned flags) {
  throttle_config_t *cfg = throttle_config_new();
  throttle_t *h = NULL;
  int rc = cfg ? throttle_config_set_segment(cfg, seg) : THROTTLE_ENOMEM;
  if (rc == 0)
    rc = throttle_config_set_flags(cfg, THROTTLE_NO_FALLBACK | flags);
  if (rc == 0)
    rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  if (rc == 0 && !throttle_is_shared(h))
    rc = THROTTLE_ESHM;
  if (rc != 0) {
    fprintf(stderr, "%s: open %s: %s (%s)\n", prog, seg, throttle_strerror(rc),
            h ? throttle_errmsg(h) : "");
    throttle_close(h);
    return NULL;
  }
  return h;
}

#endif
