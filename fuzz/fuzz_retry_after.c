/* SPDX-License-Identifier: MIT */
/*
 * fuzz_retry_after.c — throttle_parse_retry_after() on arbitrary bytes.
 *
 * Input: 8 bytes of `now` (little-endian int64), then the field value (a
 * NUL-terminated copy is parsed, so the value ends at its first NUL).  An
 * input shorter than 8 bytes is all value, with now = 784111777 (the
 * "Sun, 06 Nov 1994 08:49:37 GMT" of RFC 9110's examples).
 *
 * A misread Retry-After becomes every process's not-before, so besides
 * "no crash" the harness checks what the header promises:
 *   - the result is 0 or THROTTLE_EINVAL, and *ms is untouched on error;
 *   - blank values, signs and anything starting with a digit that is not
 *     all digits are refused; all digits parse as delta-seconds, to the
 *     value computed here (saturating at UINT64_MAX);
 *   - a date gives whole seconds (ms % 1000 == 0, or UINT64_MAX) and, but
 *     for a two-digit year resolved against a now after 2514, is no later
 *     than 9999-12-31 23:59:59;
 *   - surrounding spaces and tabs, and the case of letters, change nothing;
 *   - a date that is not in the RFC 850 form (whose century depends on
 *     now) parses whatever now is, and, where curl_getdate() reads the same
 *     text, to the same instant.
 */
#include "throttle_curl.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL UINT64_C(0xdeadbeefcafef00d)
#define YEAR_9999_END INT64_C(253402300799) /* 9999-12-31T23:59:59Z */

#include "fuzz_check.h"

static int ows(char c) { return c == ' ' || c == '\t'; }

struct parsed {
  int rc;
  uint64_t ms;
};

static struct parsed parse(const char *v, time_t now) {
  struct parsed p = {0, SENTINEL};
  p.rc = throttle_parse_retry_after(v, now, &p.ms);
  return p;
}

/* Where the value is all digits: their value, in ms, saturating. */
static uint64_t digits_ms(const char *s, size_t n) {
  uint64_t sec = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (sec > (UINT64_MAX - d) / 10)
      return UINT64_MAX;
    sec = sec * 10 + d;
  }
  return sec > UINT64_MAX / 1000 ? UINT64_MAX : sec * 1000;
}

static void check_one(const char *v, time_t now) {
  struct parsed p = parse(v, now);
  CHECK(p.rc == 0 || p.rc == THROTTLE_EINVAL, "rc %d for \"%s\"", p.rc, v);
  if (p.rc != 0)
    CHECK(p.ms == SENTINEL, "ms written on error for \"%s\"", v);

  /* The trimmed value. */
  const char *s = v, *e = v + strlen(v);
  while (s < e && ows(*s))
    s++;
  while (e > s && ows(e[-1]))
    e--;
  size_t n = (size_t)(e - s);
  if (n == 0) {
    CHECK(p.rc == THROTTLE_EINVAL, "blank value accepted: \"%s\"", v);
    return;
  }
  if (*s == '+' || *s == '-')
    CHECK(p.rc == THROTTLE_EINVAL, "signed value accepted: \"%s\"", v);
  if (*s >= '0' && *s <= '9') {
    size_t k = 0;
    while (k < n && s[k] >= '0' && s[k] <= '9')
      k++;
    if (k == n) {
      CHECK(p.rc == 0, "delta-seconds refused: \"%s\"", v);
      CHECK(p.ms == digits_ms(s, n), "\"%s\" gave %llu ms", v,
            (unsigned long long)p.ms);
    } else {
      CHECK(p.rc == THROTTLE_EINVAL, "digits then junk accepted: \"%s\"", v);
    }
  } else if (p.rc == 0) {
    CHECK(p.ms % 1000 == 0 || p.ms == UINT64_MAX, "date \"%s\": %llu ms", v,
          (unsigned long long)p.ms);
    /* A two-digit year (RFC 850, or an IMF-fixdate written with one) is
     * resolved against now: only for a now before 2514 is it sure to stay
     * within four digits.  Past that, a four-digit year is in the past and
     * gives 0, which the bound below allows anyway. */
    if (now >= 0 && now < (INT64_C(1) << 34)) {
      uint64_t max = now >= YEAR_9999_END
                         ? 0
                         : (uint64_t)(YEAR_9999_END - now) * 1000;
      CHECK(p.ms <= max, "date \"%s\" is %llu ms away (now %lld)", v,
            (unsigned long long)p.ms, (long long)now);
    }
  }

  /* Surrounding whitespace is not part of the value. */
  size_t len = strlen(v);
  char *padded = malloc(len + 5);
  if (padded != NULL) {
    memcpy(padded, " \t", 2);
    memcpy(padded + 2, v, len);
    memcpy(padded + 2 + len, "\t ", 3);
    struct parsed q = parse(padded, now);
    CHECK(q.rc == p.rc && q.ms == p.ms, "padding changed \"%s\"", v);
    free(padded);
  }
  /* Names are matched without regard to case. */
  char *upper = strdup(v);
  if (upper != NULL) {
    for (char *c = upper; *c; c++)
      if (*c >= 'a' && *c <= 'z')
        *c = (char)(*c - 32);
    struct parsed q = parse(upper, now);
    CHECK(q.rc == p.rc && q.ms == p.ms, "case changed \"%s\"", v);
    free(upper);
  }
}

/* A year of two digits before the time of day ("06 Nov 70 08:49:37"):
 * its century depends on now (RFC 9110 section 5.6.7), as in RFC 850's
 * form, while curl_getdate() reads it with a fixed pivot. */
static int two_digit_year(const char *v) {
  for (size_t i = 0; v[i] != 0 && v[i + 1] != 0; i++) {
    if ((i > 0 && !ows(v[i - 1]) && v[i - 1] != ',') ||
        !(v[i] >= '0' && v[i] <= '9') || !(v[i + 1] >= '0' && v[i + 1] <= '9'))
      continue;
    size_t j = i + 2;
    if (!ows(v[j]))
      continue;
    while (ows(v[j]))
      j++;
    size_t k = j;
    while (v[k] >= '0' && v[k] <= '9')
      k++;
    if (k > j && v[k] == ':')
      return 1;
  }
  return 0;
}

/* Dates whose meaning does not depend on now. */
static void check_date(const char *v, time_t now) {
  const char *s = v;
  while (ows(*s))
    s++;
  if ((*s >= '0' && *s <= '9') || strchr(v, '-') != NULL || two_digit_year(v))
    return; /* delta-seconds, or possibly a two-digit year (RFC 850) */
  struct parsed p = parse(v, now);
  struct parsed at0 = parse(v, 0);
  CHECK(p.rc == at0.rc, "\"%s\" parses at now=0 but not at %lld, or back", v,
        (long long)now);
  if (at0.rc != 0 || at0.ms == 0 || at0.ms == UINT64_MAX)
    return;
  /* With now = 0 the result is the instant itself (dates before 1970 give
   * 0 and are skipped above). */
  time_t t = (time_t)(at0.ms / 1000);
  time_t c = curl_getdate(v, NULL);
  CHECK(c == -1 || c == t, "\"%s\": %lld here, %lld by curl_getdate", v,
        (long long)t, (long long)c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  time_t now = 784111777;
  if (size >= 8) {
    int64_t v;
    memcpy(&v, data, 8);
    now = (time_t)v;
    data += 8;
    size -= 8;
  }
  char *value = malloc(size + 1);
  if (value == NULL)
    return 0;
  memcpy(value, data, size);
  value[size] = 0;

  CHECK(throttle_parse_retry_after(NULL, now, &(uint64_t){0}) ==
            THROTTLE_EINVAL,
        "NULL value");
  CHECK(throttle_parse_retry_after(value, now, NULL) == THROTTLE_EINVAL,
        "NULL ms");

  check_one(value, now);
  /* A now within the next few centuries, where two-digit years and the
   * clock arithmetic behave as they will in practice. */
  time_t sane = (time_t)((uint64_t)now % (UINT64_C(1) << 34));
  if (sane != now)
    check_one(value, sane);
  check_date(value, sane);

  free(value);
  return 0;
}
