/* SPDX-License-Identifier: MIT */
/*
 * rng.h — xorshift64*, the cheap random source behind jitter, reseeded
 * after fork().  Shared as an inline function because the http layer is a
 * library of its own that sees only the core's public API, not its hidden
 * functions.  Not for secrets.
 */
#ifndef THROTTLE_RNG_H
#define THROTTLE_RNG_H

#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Next value of the generator whose state is *s.  The state is seeded on
 * first use, from getrandom (or, without it, from the clock, the pid and
 * the state's address), and seeded again in a process forked after that:
 * fork() copies the state, and forked waiters drawing the same jitter
 * would wake in the same instant, the herd jitter exists to prevent.  The
 * seeding process is remembered per thread and per file that includes
 * this header, so each file keeps one state per thread (as clock.c and the
 * http layer do).  Rejected: pthread_atfork() (a handler per state to
 * register, and the http layer cannot reach the core's), and mixing the
 * pid into every step (an affine map, with a fixed point).  getpid() is a
 * system call in current glibc, paid once per draw, on a path that is about
 * to sleep anyway.  Not for secrets. */
static inline uint64_t throttle__rng_next(uint64_t *s) {
  static __thread pid_t seeded_by;
  pid_t me = getpid();
  if (*s == 0 || seeded_by != me) {
    seeded_by = me;
    if (getrandom(s, sizeof *s, GRND_NONBLOCK) != (ssize_t)sizeof *s) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      *s ^= (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
            ((uint64_t)me << 32) ^ (uint64_t)(uintptr_t)s;
    }
    if (*s == 0)
      *s = UINT64_C(0x9e3779b97f4a7c15);
  }
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * UINT64_C(0x2545f4914f6cdd1d);
}

#endif
