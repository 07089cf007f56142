/* SPDX-License-Identifier: MIT */
/*
 * ctl_duration.c — the one duration syntax of throttlectl, for every
 * argument that is a length of time (backoff's RETRY_AFTER, --timeout,
 * --interval, max-delay, the PERIOD of --rate, CMD's Retry-After file):
 *
 *   duration = number                 seconds ("5", "0.25")
 *            | 1*(number unit)        "250ms", "1.5s", "5m", "1h30m", "2d"
 *   number   = 1*DIGIT ["." 1*DIGIT]
 *   unit     = "ms" | "s" | "m" | "h" | "d"   (largest first, each once)
 *
 * A bare number is seconds because that is what Retry-After and the
 * earlier releases took.  The total is rounded up to a whole millisecond
 * (a wait is never made shorter than asked) and saturates at UINT64_MAX
 * milliseconds; the callers bound it.  Nothing else is accepted: no sign,
 * exponent, space or other unit, and each refusal says what was wrong and
 * where.
 *
 * Pure (libc only, no allocation, no global state) so that tests and the
 * fuzz target (fuzz/fuzz_duration.c) call it directly.  Rejected:
 * strtod() (locale-dependent decimal point, accepts exponents, hex, "inf"
 * and leading spaces, and rounds).
 */
#include "ctl.h"

#include <stdarg.h>
#include <string.h>

static const struct {
  const char *name;
  unsigned __int128 ns; /* per unit */
} units[] = {
    {"d", (unsigned __int128)86400 * 1000000000u},
    {"h", (unsigned __int128)3600 * 1000000000u},
    {"m", (unsigned __int128)60 * 1000000000u},
    {"s", 1000000000u},
    {"ms", 1000000u},
};
#define NUNITS (sizeof units / sizeof units[0])
#define SAT_NS ((unsigned __int128)UINT64_MAX * 1000000u) /* UINT64_MAX ms */

static int refuse(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t len, const char *fmt, ...) {
  if (why != NULL && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    /* A known false positive of clang-analyzer-valist.Uninitialized, as in
     * throttlectl.c's ctl_usage_error(). */
    vsnprintf(why, len, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
  }
  return -1;
}

static bool digit(char ch) { return ch >= '0' && ch <= '9'; }

int ctl_parse_duration(const char *s, uint64_t *ms, char *why, size_t len) {
  if (s == NULL || *s == 0)
    return refuse(why, len, "empty");
  unsigned __int128 total = 0; /* ns, saturated at SAT_NS */
  size_t last = 0;             /* units[] index after the last unit seen */
  const char *p = s;
  while (*p != 0) {
    const char *num = p; /* for messages */
    if (*p == '-')
      return refuse(why, len, "no negative durations");
    if (*p == ' ' || *p == '\t')
      return refuse(why, len, "no spaces");
    if (*p == '+')
      return refuse(why, len, "no sign");
    if (*p == '.')
      return refuse(why, len, "a digit must come before '.' (0.5, not .5)");
    if (!digit(*p))
      return refuse(why, len, "'%.16s' where a number must be", p);
    unsigned __int128 whole = 0, frac = 0, scale = 1;
    bool big = false, more = false; /* more: non-zero digits past 1e-18 */
    for (; digit(*p); p++) {
      if (whole <= SAT_NS)
        whole = whole * 10 + (unsigned)(*p - '0');
      else
        big = true;
    }
    if (*p == '.') {
      p++;
      if (!digit(*p))
        return refuse(why, len, "a digit must follow '.' (1.5, not 1.)");
      for (int n = 0; digit(*p); p++, n++) {
        if (n < 18) {
          frac = frac * 10 + (unsigned)(*p - '0');
          scale *= 10;
        } else if (*p != '0') {
          more = true;
        }
      }
    }
    size_t u = NUNITS;
    if (*p == 0 && last == 0) {
      u = 3; /* the whole argument is one number: seconds */
    } else {
      /* A unit is all the letters there ("ms" is not "m" then "s"). */
      for (size_t i = 0; i < NUNITS; i++) {
        size_t k = strlen(units[i].name);
        if (strncmp(p, units[i].name, k) == 0 && !(p[k] >= 'a' && p[k] <= 'z'))
          u = i;
      }
      if (u == NUNITS) {
        size_t k = 0;
        while (p[k] >= 'a' && p[k] <= 'z')
          k++;
        if (*p == ' ' || *p == '\t')
          return refuse(why, len, "no spaces");
        if (k == 0)
          return refuse(why, len, "'%.*s' needs a unit (ms, s, m, h or d)",
                        (int)(p - num), num);
        return refuse(why, len, "unknown unit '%.*s' (ms, s, m, h or d)",
                      (int)(k > 16 ? 16 : k), p);
      }
      if (u < last)
        return refuse(why, len, "units go largest first, each once (1h30m, "
                                "not 30m1h or 1m1m)");
      p += strlen(units[u].name);
      last = u + 1;
    }
    unsigned __int128 ns;
    if (big || whole > SAT_NS / units[u].ns) {
      ns = SAT_NS;
    } else {
      /* frac / scale of a unit, rounded up: frac < scale <= 1e18 and
       * units[u].ns < 2^47, so the product fits in 128 bits. */
      unsigned __int128 f = frac * units[u].ns;
      ns = whole * units[u].ns + f / scale + (f % scale != 0 || more);
    }
    total = total + ns > SAT_NS ? SAT_NS : total + ns;
  }
  unsigned __int128 m = total / 1000000u + (total % 1000000u != 0);
  *ms = m >= UINT64_MAX ? UINT64_MAX : (uint64_t)m;
  return 0;
}
