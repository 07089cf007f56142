/* SPDX-License-Identifier: MIT */
/*
 * test_http_parse.c — Retry-After parsing, answer classification and the
 * policy setters of the http layer.  Deterministic: every date is read
 * against an explicit `now`.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "http/http_internal.h"
#include "throttle_curl.h"

/* 784111777 = Sun, 06 Nov 1994 08:49:37 GMT, the RFC's example. */
#define T1994 ((time_t)784111777)
#define T2025 ((time_t)1735689600) /* Wed, 01 Jan 2025 00:00:00 GMT */
#define NONE UINT64_C(0xdeadbeefdeadbeef)

struct ra_case {
  const char *value;
  time_t now;
  int rc;
  uint64_t ms; /* expected on success; on failure *ms must stay NONE */
};

static void check_ra(const struct ra_case *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t ms = NONE;
    int rc = throttle_parse_retry_after(c[i].value, c[i].now, &ms);
    if (rc != c[i].rc || ms != (c[i].rc == 0 ? c[i].ms : NONE))
      fail_msg("Retry-After \"%s\" now=%lld: rc %d ms %llu, want rc %d ms "
               "%llu",
               c[i].value ? c[i].value : "(null)", (long long)c[i].now, rc,
               (unsigned long long)ms, c[i].rc,
               (unsigned long long)(c[i].rc == 0 ? c[i].ms : NONE));
  }
}

#define N(a) (sizeof(a) / sizeof((a)[0]))
#define EINV THROTTLE_EINVAL

static void test_retry_after_delta_seconds(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {"0", 0, 0, 0},
      {"5", 0, 0, 5000},
      {"007", 0, 0, 7000},
      {"120", T1994, 0, 120000},
      {"18446744073709551", 0, 0, UINT64_C(18446744073709551000)},
      {"18446744073709552", 0, 0, UINT64_MAX},    /* ms overflow */
      {"18446744073709551615", 0, 0, UINT64_MAX}, /* 2^64 - 1 s */
      {"18446744073709551616", 0, 0, UINT64_MAX}, /* 2^64 s */
      {"99999999999999999999999999", 0, 0, UINT64_MAX},
  };
  check_ra(cases, N(cases));
}

static void test_retry_after_delta_huge_saturates(void **state) {
  (void)state;
  size_t n = 10 * 1024;
  char *s = malloc(n + 1);
  assert_non_null(s);
  memset(s, '9', n);
  s[n] = 0;
  uint64_t ms = 0;
  assert_int_equal(throttle_parse_retry_after(s, 0, &ms), 0);
  assert_true(ms == UINT64_MAX);
  s[0] = '0'; /* leading zero, still huge */
  assert_int_equal(throttle_parse_retry_after(s, 0, &ms), 0);
  assert_true(ms == UINT64_MAX);
  memset(s, '0', n - 1); /* 000...09 */
  ms = 0;
  assert_int_equal(throttle_parse_retry_after(s, 0, &ms), 0);
  assert_true(ms == 9000);
  s[n / 2] = 'x';
  ms = NONE;
  assert_int_equal(throttle_parse_retry_after(s, 0, &ms), EINV);
  assert_true(ms == NONE);
  free(s);
}

/* Leading and trailing spaces and tabs are the field's OWS: ignored. */
static void test_retry_after_whitespace_trimmed(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {" 5", 0, 0, 5000},
      {"5 ", 0, 0, 5000},
      {"\t5\t", 0, 0, 5000},
      {"  Sun, 06 Nov 1994 08:49:37 GMT \t", T1994 - 1, 0, 1000},
      {"5 6", 0, EINV, 0},
      {"5\n", 0, EINV, 0}, /* only SP and HTAB are OWS */
      {"\r5", 0, EINV, 0},
      {"   ", 0, EINV, 0},
      {"\t", 0, EINV, 0},
  };
  check_ra(cases, N(cases));
}

static void test_retry_after_rejects_junk(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {"", 0, EINV, 0},     {"-1", 0, EINV, 0},  {"+5", 0, EINV, 0},
      {"1.5", 0, EINV, 0},  {"5, 6", 0, EINV, 0}, {"5,6", 0, EINV, 0},
      {"abc", 0, EINV, 0},  {"5s", 0, EINV, 0},  {"0x10", 0, EINV, 0},
      {"1e3", 0, EINV, 0},  {"five", 0, EINV, 0}, {"5;q=1", 0, EINV, 0},
  };
  check_ra(cases, N(cases));
  uint64_t ms = NONE;
  assert_int_equal(throttle_parse_retry_after(NULL, 0, &ms), EINV);
  assert_true(ms == NONE);
  assert_int_equal(throttle_parse_retry_after("5", 0, NULL), EINV);
}

/* The three forms of RFC 9110 §5.6.7, each in the future, now, and past. */
static void test_retry_after_http_date_forms(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {"Sun, 06 Nov 1994 08:49:37 GMT", T1994 - 120, 0, 120000},
      {"Sun, 06 Nov 1994 08:49:37 GMT", T1994, 0, 0},
      {"Sun, 06 Nov 1994 08:49:37 GMT", T1994 + 3600, 0, 0},
      {"Sunday, 06-Nov-94 08:49:37 GMT", T1994 - 120, 0, 120000},
      {"Sunday, 06-Nov-94 08:49:37 GMT", T1994, 0, 0},
      {"Sunday, 06-Nov-94 08:49:37 GMT", T1994 + 1, 0, 0},
      {"Sun Nov  6 08:49:37 1994", T1994 - 120, 0, 120000},
      {"Sun Nov  6 08:49:37 1994", T1994, 0, 0},
      {"Sun Nov  6 08:49:37 1994", T1994 + 86400, 0, 0},
      /* tolerated variations */
      {"Sun Nov 6 08:49:37 1994", T1994 - 1, 0, 1000},
      {"Sun Nov 06 08:49:37 1994", T1994 - 1, 0, 1000},
      {"Sun, 6 Nov 1994 08:49:37 GMT", T1994 - 1, 0, 1000},
      {"sun, 06 nov 1994 08:49:37 gmt", T1994 - 1, 0, 1000},
      {"SUNDAY, 06-NOV-94 08:49:37 GMT", T1994 - 1, 0, 1000},
      {"Sunday, 06 Nov 1994 08:49:37 GMT", T1994 - 1, 0, 1000},
      {"Sun, 06-Nov-94 08:49:37 GMT", T1994 - 1, 0, 1000},
      {"Sun,\t06  Nov\t1994 08:49:37   GMT", T1994 - 1, 0, 1000},
      /* the weekday is not checked against the date */
      {"Mon, 06 Nov 1994 08:49:37 GMT", T1994 - 1, 0, 1000},
      /* leap second and leap day */
      {"Sun, 06 Nov 1994 08:49:60 GMT", T1994, 0, 23000},
      {"Thu, 29 Feb 2024 00:00:00 GMT", 1709164800 - 5, 0, 5000},
      /* far future, far past */
      {"Fri, 31 Dec 9999 23:59:59 GMT", 0, 0, UINT64_C(253402300799000)},
      {"Thu, 01 Jan 1970 00:00:00 GMT", 1000, 0, 0},
      {"Thu, 01 Jan 1970 00:00:01 GMT", 0, 0, 1000},
      {"Wed, 31 Dec 1969 23:59:59 GMT", 0, 0, 0},
      {"Mon, 01 Jan 1900 00:00:00 GMT", T1994, 0, 0},
  };
  check_ra(cases, N(cases));
}

/* RFC 9110: a two-digit year more than 50 years ahead is in the past. */
static void test_retry_after_rfc850_two_digit_year(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      /* 26 -> 2026, one year after now */
      {"Thursday, 01-Jan-26 00:00:00 GMT", T2025, 0,
       (UINT64_C(1767225600) - UINT64_C(1735689600)) * 1000},
      /* 75 -> 2075, exactly 50 years ahead: still the future */
      {"Tuesday, 01-Jan-75 00:00:00 GMT", T2025, 0,
       (UINT64_C(3313526400) - UINT64_C(1735689600)) * 1000},
      /* 76 -> 1976, the past */
      {"Thursday, 01-Jan-76 00:00:00 GMT", T2025, 0, 0},
      /* 94 -> 1994 when now is 1994 */
      {"Sunday, 06-Nov-94 08:49:38 GMT", T1994, 0, 1000},
  };
  check_ra(cases, N(cases));
}

/* Dates curl_getdate() alone would take, and broken dates: refused. */
static void test_retry_after_rejects_bad_dates(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {"Sun, 06 Nov 1994", 0, EINV, 0},              /* no time */
      {"Sun, 06 Nov 1994 08:49:37", 0, EINV, 0},     /* no zone */
      {"Sun, 06 Nov 1994 08:49:37 PST", 0, EINV, 0}, /* not GMT */
      {"Sun, 06 Nov 1994 08:49:37 GMT junk", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:49:37 GMT,", 0, EINV, 0},
      {"06 Nov 1994 08:49:37 GMT", 0, EINV, 0}, /* no weekday */
      {"Nov 1994 08:49:37", 0, EINV, 0},
      {"1994-11-06T08:49:37Z", 0, EINV, 0},
      {"Sun Nov  6 08:49:37 94", 0, EINV, 0},
      {"Sun Nov  6 08:49:37 1994 GMT", 0, EINV, 0},
      {"Xyz, 06 Nov 1994 08:49:37 GMT", 0, EINV, 0},
      {"Sun, 06 Foo 1994 08:49:37 GMT", 0, EINV, 0},
      {"Sun, 32 Nov 1994 08:49:37 GMT", 0, EINV, 0},
      {"Sun, 00 Nov 1994 08:49:37 GMT", 0, EINV, 0},
      {"Sun, 006 Nov 1994 08:49:37 GMT", 0, EINV, 0},
      {"Fri, 30 Feb 2024 00:00:00 GMT", 0, EINV, 0},
      {"Wed, 29 Feb 2023 00:00:00 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 24:00:00 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:60:00 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:49:61 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 8:49:37 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:49 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT", 0,
       EINV, 0},
      {"Sun 06 Nov 1994 08:49:37 GMT", 0, EINV, 0},
      {"Sun", 0, EINV, 0},
      {"Sun,", 0, EINV, 0},
      /* a three-digit year could be 1994 or 2094 or 994: refused */
      {"Sun, 06 Nov 994 08:49:37 GMT", 0, EINV, 0},
      {"Sunday, 06-Nov-994 08:49:37 GMT", 0, EINV, 0},
      {"Sun, 06 Nov 1994 08:49:37 +0100", 0, EINV, 0}, /* not GMT */
      {"Sun, 06 Nov 1994 08:49:37 -", 0, EINV, 0},
  };
  check_ra(cases, N(cases));
}

/* Dates outside the three strict forms that nobody could read two ways:
 * the RFC 850 shape with a four-digit year (common in the wild), an
 * IMF-fixdate with a two-digit year, and GMT spelt UTC or +0000.  Refusing
 * them published the default 5 s where the server meant a minute. */
#define NOV6_1994 784111777 /* Sun, 06 Nov 1994 08:49:37 GMT */
static void test_retry_after_accepts_unambiguous_dates(void **state) {
  (void)state;
  static const struct ra_case cases[] = {
      {"Sunday, 06-Nov-1994 08:49:37 GMT", NOV6_1994 - 60, 0, 60000},
      {"Sun, 06-Nov-1994 08:49:37 GMT", NOV6_1994 - 60, 0, 60000},
      {"Thu, 19-Apr-2007 16:00:00 GMT", 1176998400 - 1200, 0, 1200000},
      {"Sun, 06 Nov 94 08:49:37 GMT", NOV6_1994 - 60, 0, 60000},
      {"Sun, 06 Nov 1994 08:49:37 UTC", NOV6_1994 - 60, 0, 60000},
      {"Sun, 06 Nov 1994 08:49:37 +0000", NOV6_1994 - 60, 0, 60000},
      {"Sun, 06 Nov 1994 08:49:37 -0000", NOV6_1994 - 60, 0, 60000},
  };
  check_ra(cases, N(cases));
}

/* One Retry-After field may be a list, or sent twice (each line is one
 * call): the largest value read is kept, unreadable elements skipped, and
 * a date's own comma does not split it. */
static void test_retry_after_list_takes_largest(void **state) {
  (void)state;
  static const struct {
    const char *value;
    int n;
    uint64_t ms;
  } cases[] = {
      {"12, 12", 2, 12000},
      {"3, 12", 2, 12000},
      {"12,3", 2, 12000},
      {"junk, 7", 1, 7000},
      {"Sun, 06 Nov 1994 08:50:37 GMT, 5", 2, 60000},
      {"5, Sun, 06 Nov 1994 08:50:37 GMT", 2, 60000},
      {"Sun Nov  6 08:50:37 1994, 1", 2, 60000},
      {"0", 1, 0},
      {"junk", 0, 0},
      {"", 0, 0},
  };
  for (size_t i = 0; i < N(cases); i++) {
    uint64_t ms = 0;
    int n = throttle__retry_after_max(cases[i].value, NOV6_1994, &ms);
    if (n != cases[i].n || ms != cases[i].ms)
      fail_msg("\"%s\": %d values, %llu ms; want %d, %llu", cases[i].value, n,
               (unsigned long long)ms, cases[i].n,
               (unsigned long long)cases[i].ms);
  }
  /* a second header line that is smaller does not lower the first */
  uint64_t ms = 0;
  assert_int_equal(throttle__retry_after_max("12", 0, &ms), 1);
  assert_int_equal(throttle__retry_after_max("3", 0, &ms), 1);
  assert_int_equal(ms, 12000);
}

/* ---- classification ----------------------------------------------------- */

static const char LOCKED_BODY[] =
    "{\"error\":{\"code\":\"RESOURCE_LOCKED\","
    "\"message\":\"table 'orders' is locked by another operation\"}}";
static const char CONFLICT_BODY[] =
    "{\"error\":{\"code\":\"CONFLICT\",\"message\":\"table 'orders' already "
    "exists\"}}";

struct cl_case {
  long status;
  const char *body;
  throttle_outcome_t want;
  const char *code;
};

static void check_cl(const throttle_curl_policy_t *p, const struct cl_case *c,
                     size_t n) {
  for (size_t i = 0; i < n; i++) {
    throttle_outcome_t o = (throttle_outcome_t)-1;
    char code[64] = "junk";
    const char *b = c[i].body;
    int rc = throttle_classify(p, c[i].status, b, b ? strlen(b) : 0, &o, code,
                               sizeof code);
    if (rc != 0 || o != c[i].want || strcmp(code, c[i].code) != 0)
      fail_msg("classify %ld %s: rc %d outcome %d code \"%s\", want %d \"%s\"",
               c[i].status, b ? b : "(null)", rc, (int)o, code, (int)c[i].want,
               c[i].code);
  }
}

static void test_classify_status_table(void **state) {
  (void)state;
  static const struct cl_case cases[] = {
      {200, "", THROTTLE_OUTCOME_OK, ""},
      {201, "{\"loaded\":1}", THROTTLE_OUTCOME_OK, ""},
      {204, NULL, THROTTLE_OUTCOME_OK, ""},
      {299, NULL, THROTTLE_OUTCOME_OK, ""},
      {200, LOCKED_BODY, THROTTLE_OUTCOME_OK, ""}, /* 2xx bodies unread */
      {429, "{\"error\":{\"code\":\"OVERLOADED\"}}",
       THROTTLE_OUTCOME_RATE_LIMITED, "OVERLOADED"},
      {429, NULL, THROTTLE_OUTCOME_RATE_LIMITED, ""},
      {503, "{\"error\":{\"code\":\"SERVICE_UNAVAILABLE\"}}",
       THROTTLE_OUTCOME_UNAVAILABLE, "SERVICE_UNAVAILABLE"},
      {503, "{\"error\":{\"code\":\"PERSISTENCE_UNAVAILABLE\"}}",
       THROTTLE_OUTCOME_UNAVAILABLE, "PERSISTENCE_UNAVAILABLE"},
      {503, "<html>busy</html>", THROTTLE_OUTCOME_UNAVAILABLE, ""},
      {408, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {425, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {500, "{\"error\":{\"code\":\"INTERNAL\"}}", THROTTLE_OUTCOME_FAILED,
       "INTERNAL"},
      {502, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {504, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {507, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {522, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {599, NULL, THROTTLE_OUTCOME_FAILED, ""},
      {501, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {505, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {511, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {400, "{\"error\":{\"code\":\"BAD_REQUEST\"}}",
       THROTTLE_OUTCOME_PERMANENT, "BAD_REQUEST"},
      {401, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {403, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {404, "{\"error\":{\"code\":\"NOT_FOUND\"}}", THROTTLE_OUTCOME_PERMANENT,
       "NOT_FOUND"},
      /* a lock code on another status is not a lock */
      {400, LOCKED_BODY, THROTTLE_OUTCOME_PERMANENT, "RESOURCE_LOCKED"},
      {423, LOCKED_BODY, THROTTLE_OUTCOME_PERMANENT, "RESOURCE_LOCKED"},
      {100, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {199, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {301, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {304, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {600, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {999, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
  };
  check_cl(NULL, cases, N(cases));
}

static void test_classify_409_bodies(void **state) {
  (void)state;
  static const struct cl_case cases[] = {
      {409, LOCKED_BODY, THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
      {409, " \r\n\t" "{\"error\":{\"code\":\"RESOURCE_LOCKED\"}} \n",
       THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
      {409, "{\"x\":[1,2,{\"y\":null}],\"error\":{\"message\":\"m\","
            "\"code\":\"RESOURCE_LOCKED\",\"extra\":{}}}",
       THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
      {409, CONFLICT_BODY, THROTTLE_OUTCOME_PERMANENT, "CONFLICT"},
      {409, "{\"error\":{\"code\":\"resource_locked\"}}",
       THROTTLE_OUTCOME_PERMANENT, "resource_locked"}, /* case matters */
      {409, "{\"error\":{\"code\":\"RESOURCE_LOCKED \"}}",
       THROTTLE_OUTCOME_PERMANENT, "RESOURCE_LOCKED "},
      {409, "{\"error\":{\"code\":\"\"}}", THROTTLE_OUTCOME_PERMANENT, ""},
      /* no readable code: permanent */
      {409, "{\"code\":\"RESOURCE_LOCKED\"}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":{}}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":\"RESOURCE_LOCKED\"}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":[\"RESOURCE_LOCKED\"]}", THROTTLE_OUTCOME_PERMANENT,
       ""},
      {409, "{\"error\":null}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":{\"code\":42}}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":{\"code\":[\"RESOURCE_LOCKED\"]}}",
       THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "{\"error\":{\"code\":null}}", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "[{\"error\":{\"code\":\"RESOURCE_LOCKED\"}}]",
       THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "\"RESOURCE_LOCKED\"", THROTTLE_OUTCOME_PERMANENT, ""},
      /* not a JSON document, but naming a locked code: the read failed
       * (cut short, or the parser ran out of memory and said "syntax
       * error"), and a lock must never be called permanent for that */
      {409, "{\"error\":{\"code\":\"RESOURCE_LOCKED\"}", /* unclosed */
       THROTTLE_OUTCOME_FAILED, ""},
      {409, "{\"error\":{\"code\":\"RESOURCE_LOCKED\"}} trailing",
       THROTTLE_OUTCOME_FAILED, ""},
      {409, "{\"error\":{\"code\":\"CONFLICT\"}", THROTTLE_OUTCOME_PERMANENT,
       ""},
      /* a byte order mark before the document is skipped */
      {409, "\xef\xbb\xbf{\"error\":{\"code\":\"RESOURCE_LOCKED\"}}",
       THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
      {409, "{\"error\":{\"code\":\"RESOURCE\\u0000LOCKED\"}}",
       THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "not json", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "", THROTTLE_OUTCOME_PERMANENT, ""},
      {409, NULL, THROTTLE_OUTCOME_PERMANENT, ""},
      {409, "   ", THROTTLE_OUTCOME_PERMANENT, ""},
  };
  check_cl(NULL, cases, N(cases));
}

/* Escapes are decoded before the comparison. */
static void test_classify_409_escaped_code(void **state) {
  (void)state;
  static const struct cl_case cases[] = {
      {409, "{\"error\":{\"code\":\"RESOURCE\\u005fLOCKED\"}}",
       THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
  };
  check_cl(NULL, cases, N(cases));
}

/* A body is read up to THROTTLE_CURL_BODY_MAX bytes and no further. */
static void test_classify_large_bodies_bounded(void **state) {
  (void)state;
  size_t n = 1024 * 1024;
  char *b = malloc(n);
  assert_non_null(b);
  throttle_outcome_t o;
  char code[64];

  /* The document ends within the bound, then 1 MB of padding: read. */
  size_t head = strlen(LOCKED_BODY);
  memcpy(b, LOCKED_BODY, head);
  memset(b + head, ' ', n - head);
  assert_int_equal(throttle_classify(NULL, 409, b, n, &o, code, sizeof code), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  assert_string_equal(code, "RESOURCE_LOCKED");

  /* Garbage after the bound is never seen. */
  memset(b + THROTTLE_CURL_BODY_MAX, 'x', n - THROTTLE_CURL_BODY_MAX);
  assert_int_equal(throttle_classify(NULL, 409, b, n, &o, code, sizeof code), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  /* ... but garbage just inside it is. */
  b[THROTTLE_CURL_BODY_MAX - 1] = 'x';
  assert_int_equal(throttle_classify(NULL, 409, b, n, &o, code, sizeof code), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_FAILED); /* names the code: not final */
  assert_string_equal(code, "");

  /* Code first, but the document closes only after 1 MB: the prefix is not
   * a JSON document, so there is no readable code; it names a locked code,
   * so the 409 is transient, never permanent (the documented limit of the
   * bound). */
  const char *open = "{\"error\":{\"code\":\"RESOURCE_LOCKED\"},\"pad\":\"";
  size_t ol = strlen(open);
  memcpy(b, open, ol);
  memset(b + ol, 'a', n - ol - 2);
  memcpy(b + n - 2, "\"}", 2);
  assert_int_equal(throttle_classify(NULL, 409, b, n, &o, code, sizeof code), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_FAILED);
  /* The same document within the bound is read. */
  size_t small = 4096;
  memcpy(b + small - 2, "\"}", 2);
  assert_int_equal(
      throttle_classify(NULL, 409, b, small, &o, code, sizeof code), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  free(b);
}

static void test_classify_custom_locked_codes(void **state) {
  (void)state;
  throttle_curl_policy_t *p;
  assert_int_equal(throttle_curl_policy_new(&p), 0);
  const char *codes[] = {"TABLE_LOCKED", "ROW_LOCKED"};
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, codes, 2), 0);
  static const struct cl_case custom[] = {
      {409, "{\"error\":{\"code\":\"TABLE_LOCKED\"}}", THROTTLE_OUTCOME_LOCKED,
       "TABLE_LOCKED"},
      {409, "{\"error\":{\"code\":\"ROW_LOCKED\"}}", THROTTLE_OUTCOME_LOCKED,
       "ROW_LOCKED"},
      {409, LOCKED_BODY, THROTTLE_OUTCOME_PERMANENT, "RESOURCE_LOCKED"},
      {409, CONFLICT_BODY, THROTTLE_OUTCOME_PERMANENT, "CONFLICT"},
      {409, "{\"error\":{\"code\":\"TABLE_LOCKE\"}}",
       THROTTLE_OUTCOME_PERMANENT, "TABLE_LOCKE"},
  };
  check_cl(p, custom, N(custom));

  /* No locked codes: every 409 is permanent. */
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, NULL, 0), 0);
  static const struct cl_case none[] = {
      {409, "{\"error\":{\"code\":\"TABLE_LOCKED\"}}",
       THROTTLE_OUTCOME_PERMANENT, "TABLE_LOCKED"},
      {409, LOCKED_BODY, THROTTLE_OUTCOME_PERMANENT, "RESOURCE_LOCKED"},
  };
  check_cl(p, none, N(none));

  /* A fresh policy has the default set. */
  throttle_curl_policy_t *q;
  assert_int_equal(throttle_curl_policy_new(&q), 0);
  static const struct cl_case dflt[] = {
      {409, LOCKED_BODY, THROTTLE_OUTCOME_LOCKED, "RESOURCE_LOCKED"},
  };
  check_cl(q, dflt, N(dflt));
  throttle_curl_policy_free(q);
  throttle_curl_policy_free(p);
}

static void test_classify_code_truncated_compared_whole(void **state) {
  (void)state;
  throttle_outcome_t o;
  char code[5];
  assert_int_equal(throttle_classify(NULL, 409, LOCKED_BODY,
                                     strlen(LOCKED_BODY), &o, code,
                                     sizeof code),
                   0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  assert_string_equal(code, "RESO");
  /* No buffer at all. */
  assert_int_equal(
      throttle_classify(NULL, 409, LOCKED_BODY, strlen(LOCKED_BODY), &o, NULL,
                        0),
      0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  /* The body is a byte range, not a C string: a prefix is just a prefix. */
  assert_int_equal(throttle_classify(NULL, 409, LOCKED_BODY, 20, &o, code,
                                     sizeof code),
                   0);
  assert_int_equal(o, THROTTLE_OUTCOME_PERMANENT);
}

static void test_classify_invalid_arguments(void **state) {
  (void)state;
  throttle_outcome_t o;
  char code[8];
  long bad[] = {-1, 0, 99, 1000, 100000};
  for (size_t i = 0; i < N(bad); i++)
    assert_int_equal(throttle_classify(NULL, bad[i], "", 0, &o, code, 8), EINV);
  assert_int_equal(throttle_classify(NULL, 409, "{}", 2, NULL, code, 8), EINV);
  assert_int_equal(throttle_classify(NULL, 409, NULL, 2, &o, code, 8), EINV);
  assert_int_equal(throttle_classify(NULL, 409, "{}", 2, &o, NULL, 8), EINV);
}

/* Every allocation the JSON parser makes fails in turn (N = 1, 2, ...).
 * jansson 2.14 reports most of these as syntax errors, and one of them
 * (a failed string-buffer growth) as a successful parse of a string with a
 * byte dropped.  What the classifier still guarantees: it returns 0 or
 * THROTTLE_ENOMEM, never crashes or leaks (run under valgrind), calls a
 * 409 a lock only when the code read compares equal in full, and
 * otherwise falls back to "no code" (permanent). */
static int fail_at, allocs;
static void *failing_malloc(size_t n) {
  if (++allocs == fail_at)
    return NULL;
  return malloc(n);
}

static void test_classify_out_of_memory_never_permanent(void **state) {
  (void)state;
  json_set_alloc_funcs(failing_malloc, free);
  int clean = 0;
  for (fail_at = 1; fail_at < 1000 && !clean; fail_at++) {
    allocs = 0;
    throttle_outcome_t o = (throttle_outcome_t)-1;
    char code[32] = "junk";
    int rc = throttle_classify(NULL, 409, LOCKED_BODY, strlen(LOCKED_BODY), &o,
                               code, sizeof code);
    if (allocs < fail_at)
      clean = 1; /* nothing failed this time: the loop is done */
    assert_true(rc == 0 || rc == THROTTLE_ENOMEM);
    /* a lock read whole, or a failed read: transient, never permanent */
    if (o != THROTTLE_OUTCOME_LOCKED && o != THROTTLE_OUTCOME_FAILED)
      fail_msg("allocation %d failed: outcome %d, code \"%s\"", fail_at, (int)o,
               code);
    assert_int_equal(o == THROTTLE_OUTCOME_LOCKED,
                     strcmp(code, "RESOURCE_LOCKED") == 0);
    if (clean)
      assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  }
  json_set_alloc_funcs(malloc, free);
  assert_true(clean);
}

/* ---- policy -------------------------------------------------------------- */

static void test_policy_setters_validate(void **state) {
  (void)state;
  throttle_curl_policy_t *p;
  assert_int_equal(throttle_curl_policy_new(NULL), EINV);
  assert_int_equal(throttle_curl_policy_new(&p), 0);
  assert_non_null(p);

  assert_int_equal(throttle_curl_policy_set_retries(NULL, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_retries(p, 0), 0);
  assert_int_equal(throttle_curl_policy_set_retries(p, 1000000), 0);
  assert_int_equal(throttle_curl_policy_set_retries(p, 1000001), EINV);

  assert_int_equal(throttle_curl_policy_set_deadline(NULL, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_deadline(p, 0), EINV);
  assert_int_equal(throttle_curl_policy_set_deadline(p, 1), 0);
  assert_int_equal(throttle_curl_policy_set_deadline(p, THROTTLE_FOREVER), 0);

  assert_int_equal(throttle_curl_policy_set_class(NULL, THROTTLE_CLASS_LIVE),
                   EINV);
  assert_int_equal(throttle_curl_policy_set_class(p, THROTTLE_CLASS_BACKFILL),
                   0);
  assert_int_equal(throttle_curl_policy_set_class(p, (throttle_class_t)7),
                   EINV);

  assert_int_equal(throttle_curl_policy_set_default_delay(NULL, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_default_delay(p, 0), EINV);
  assert_int_equal(throttle_curl_policy_set_default_delay(p, 1), 0);
  assert_int_equal(
      throttle_curl_policy_set_default_delay(p, UINT64_C(604800000)), 0);
  assert_int_equal(
      throttle_curl_policy_set_default_delay(p, UINT64_C(604800001)), EINV);

  assert_int_equal(throttle_curl_policy_set_local_backoff(NULL, 1, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_local_backoff(p, 0, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_local_backoff(p, 10, 9), EINV);
  assert_int_equal(throttle_curl_policy_set_local_backoff(p, 10, 10), 0);
  assert_int_equal(
      throttle_curl_policy_set_local_backoff(p, 1, UINT64_C(604800001)), EINV);

  assert_int_equal(throttle_curl_policy_set_sink(NULL, NULL, NULL), EINV);
  assert_int_equal(throttle_curl_policy_set_sink(p, NULL, stdout), 0);
  assert_int_equal(throttle_curl_policy_set_rewind(NULL, NULL, NULL), EINV);
  assert_int_equal(throttle_curl_policy_set_rewind(p, NULL, NULL), 0);
  assert_int_equal(throttle_curl_policy_set_log(NULL, NULL, NULL), EINV);
  assert_int_equal(throttle_curl_policy_set_log(p, NULL, NULL), 0);
  assert_int_equal(throttle_curl_policy_set_log_file(NULL, stderr), EINV);
  assert_int_equal(throttle_curl_policy_set_log_file(p, stderr), 0);
  assert_int_equal(throttle_curl_policy_set_log_file(p, NULL), 0);

  throttle_curl_policy_free(p);
  throttle_curl_policy_free(NULL);
}

static void test_policy_locked_codes_validate(void **state) {
  (void)state;
  throttle_curl_policy_t *p;
  assert_int_equal(throttle_curl_policy_new(&p), 0);
  const char *good[] = {"A"};
  const char *empty[] = {"TABLE_LOCKED", ""};
  const char *null[] = {"TABLE_LOCKED", NULL};
  char longcode[257];
  memset(longcode, 'L', 256);
  longcode[256] = 0;
  const char *toolong[] = {longcode};
  assert_int_equal(throttle_curl_policy_set_locked_codes(NULL, good, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, NULL, 1), EINV);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, empty, 2), EINV);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, null, 2), EINV);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, toolong, 1), EINV);
  longcode[255] = 0; /* 255 bytes: the most allowed */
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, toolong, 1), 0);
  const char *many[65];
  for (size_t i = 0; i < 65; i++)
    many[i] = "X";
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, many, 65), EINV);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, many, 64), 0);
  /* A refused set leaves the previous one in force. */
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, good, 1), 0);
  assert_int_equal(throttle_curl_policy_set_locked_codes(p, empty, 2), EINV);
  throttle_outcome_t o;
  const char *a = "{\"error\":{\"code\":\"A\"}}";
  assert_int_equal(throttle_classify(p, 409, a, strlen(a), &o, NULL, 0), 0);
  assert_int_equal(o, THROTTLE_OUTCOME_LOCKED);
  throttle_curl_policy_free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_retry_after_delta_seconds),
      cmocka_unit_test(test_retry_after_delta_huge_saturates),
      cmocka_unit_test(test_retry_after_whitespace_trimmed),
      cmocka_unit_test(test_retry_after_rejects_junk),
      cmocka_unit_test(test_retry_after_http_date_forms),
      cmocka_unit_test(test_retry_after_rfc850_two_digit_year),
      cmocka_unit_test(test_retry_after_rejects_bad_dates),
      cmocka_unit_test(test_retry_after_accepts_unambiguous_dates),
      cmocka_unit_test(test_retry_after_list_takes_largest),
      cmocka_unit_test(test_classify_status_table),
      cmocka_unit_test(test_classify_409_bodies),
      cmocka_unit_test(test_classify_409_escaped_code),
      cmocka_unit_test(test_classify_large_bodies_bounded),
      cmocka_unit_test(test_classify_custom_locked_codes),
      cmocka_unit_test(test_classify_code_truncated_compared_whole),
      cmocka_unit_test(test_classify_invalid_arguments),
      cmocka_unit_test(test_classify_out_of_memory_never_permanent),
      cmocka_unit_test(test_policy_setters_validate),
      cmocka_unit_test(test_policy_locked_codes_validate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
