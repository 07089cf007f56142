/* SPDX-License-Identifier: MIT */
/*
 * env.h — reading a number from the environment, for the core (handle.c)
 * and the Redis module (redis_ops.c), which links nothing of the core (a
 * static throttlectl exports no symbols to it): hence a static inline
 * function here rather than a shared symbol.
 */
#ifndef THROTTLE_ENV_H
#define THROTTLE_ENV_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* $var, or def when unset or empty.  When it is set but not a whole
 * number within [lo, hi], def is used and a warning naming the variable,
 * its value and the range is appended to warn (len bytes, "; " between
 * warnings), for throttle_errmsg() to show after throttle_open(). */
static inline uint64_t throttle__env_number(const char *var, uint64_t def,
                                            uint64_t lo, uint64_t hi,
                                            char *warn, size_t len) {
  const char *v = getenv(var);
  if (v == NULL || *v == 0)
    return def;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno != 0 || *end != 0 || v[0] < '0' || v[0] > '9' || n < lo ||
      n > hi) {
    size_t k = strlen(warn);
    snprintf(warn + k, len - k,
             "%s%s='%.40s' is not a whole number from %llu to %llu; %llu is "
             "used",
             k > 0 ? "; " : "", var, v, (unsigned long long)lo,
             (unsigned long long)hi, (unsigned long long)def);
    return def;
  }
  return n;
}

#endif
