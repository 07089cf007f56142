/*
 * rng.h — xorshift64*, the cheap random source behind jitter.  Shared as an
 * inline function because the http layer is a library of its own that sees
 * only the core's public API, not its hidden functions.  Not for secrets.
 */
#ifndef THROTTLE_RNG_H
#define THROTTLE_RNG_H

#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Next value of the generator whose state is *s (0 = not seeded yet: seed
 * it from getrandom, or from the clock, the pid and the state's address). */
static inline uint64_t throttle__rng_next(uint64_t *s) {
  if (*s == 0) {
    if (getrandom(s, sizeof *s, GRND_NONBLOCK) != (ssize_t)sizeof *s) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      *s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
           ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)s;
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
