/*
 * clock.c — the one clock every process on the host shares, futex waits on
 * words in shared memory, and a cheap per-thread random source for jitter.
 *
 * Why CLOCK_BOOTTIME.  A not-before is published by one process and read by
 * others, so it needs a clock that is the same in every process of the host:
 * CLOCK_MONOTONIC and CLOCK_BOOTTIME both are (CLOCK_REALTIME is not
 * monotonic and jumps with NTP or an operator).  They differ only across a
 * suspend: MONOTONIC stops, BOOTTIME keeps counting.  A server's Retry-After
 * is real elapsed time, so after a laptop or VM resumes from a 10-minute
 * suspend a 5 s back-off must be over; with MONOTONIC it would still have 5 s
 * to run.  Both are read through the vDSO without a system call; `make bench`
 * measures the two side by side (on the development machine they cost the
 * same within noise), so correctness decides.
 *
 * Futexes take relative timeouts measured on CLOCK_MONOTONIC; every sleep is
 * therefore followed by a fresh reading of the throttle clock, never trusted
 * to have lasted exactly as asked.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t throttle__now_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0)
    clock_gettime(CLOCK_MONOTONIC, &ts); /* kernels before 2.6.39 only */
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

uint64_t throttle__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

uint64_t throttle__sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Shared (not FUTEX_PRIVATE) waits: the word lives in a MAP_SHARED segment
 * and the waker is usually another process. */
void throttle__futex_wait(_Atomic uint32_t *word, uint32_t expect,
                          uint64_t rel_ns) {
  struct timespec ts;
  if (rel_ns > UINT64_C(86400) * 1000000000u)
    rel_ns = UINT64_C(86400) * 1000000000u;
  ts.tv_sec = (time_t)(rel_ns / 1000000000u);
  ts.tv_nsec = (long)(rel_ns % 1000000000u);
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

void throttle__futex_wake(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* xorshift64*, seeded per thread from getrandom (or time and pid). */
uint64_t throttle__random(void) {
  static THROTTLE__TLS uint64_t s;
  if (s == 0) {
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s)
      s = throttle__mono_ns() ^ ((uint64_t)getpid() << 32);
    if (s == 0)
      s = UINT64_C(0x9e3779b97f4a7c15);
  }
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return s * UINT64_C(0x2545f4914f6cdd1d);
}
