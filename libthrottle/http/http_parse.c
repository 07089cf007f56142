/* SPDX-License-Identifier: MIT */
/*
 * http_parse.c — reading what a server said: Retry-After (delta-seconds and
 * the three HTTP-date forms), the error.code of a JSON error body, and the
 * classification of an answer into a throttle_outcome_t.
 *
 * Nothing here allocates except jansson while it parses a body, and nothing
 * depends on the local time zone or locale.
 */
#include "http_internal.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* ---- small scanners ---------------------------------------------------- */

static int is_ows(char c) { return c == ' ' || c == '\t'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c + 32) : c; }

/* A cursor over [p, end). */
struct cur {
  const char *p, *end;
};

/* One or more spaces or tabs. */
static int skip_ws(struct cur *c) {
  if (c->p >= c->end || !is_ows(*c->p))
    return 0;
  while (c->p < c->end && is_ows(*c->p))
    c->p++;
  return 1;
}

static int expect(struct cur *c, char ch) {
  if (c->p >= c->end || *c->p != ch)
    return 0;
  c->p++;
  return 1;
}

/* min..max digits as an int. */
static int number(struct cur *c, int min, int max, int *val) {
  int n = 0, v = 0;
  while (c->p < c->end && is_digit(*c->p) && n < max) {
    v = v * 10 + (*c->p - '0');
    c->p++;
    n++;
  }
  if (n < min || (c->p < c->end && is_digit(*c->p)))
    return 0;
  *val = v;
  return 1;
}

/* A run of letters equal (ignoring case) to one of names[0..n); its index. */
static int word(struct cur *c, const char *const *names, int n, int *idx) {
  const char *s = c->p;
  while (c->p < c->end && is_alpha(*c->p))
    c->p++;
  size_t len = (size_t)(c->p - s);
  for (int i = 0; i < n; i++) {
    if (strlen(names[i]) != len)
      continue;
    size_t k = 0;
    while (k < len && lower(s[k]) == names[i][k])
      k++;
    if (k == len) {
      *idx = i;
      return 1;
    }
  }
  return 0;
}

static const char *const day_names[] = {
    "mon",    "tue",     "wed",       "thu",      "fri",    "sat",
    "sun",    "monday",  "tuesday",   "wednesday", "thursday",
    "friday", "saturday", "sunday"};
static const char *const month_names[] = {"jan", "feb", "mar", "apr",
                                          "may", "jun", "jul", "aug",
                                          "sep", "oct", "nov", "dec"};


/* "hh:mm:ss" */
static int clock_time(struct cur *c, int *hh, int *mm, int *ss) {
  return number(c, 2, 2, hh) && expect(c, ':') && number(c, 2, 2, mm) &&
         expect(c, ':') && number(c, 2, 2, ss) && *hh <= 23 && *mm <= 59 &&
         *ss <= 60;
}

static int days_in_month(int month /* 0-11 */, int year) {
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return days[month] + (month == 1 && leap);
}

/* RFC 9110 §5.6.7: a two-digit year more than 50 years in the future is
 * the most recent past year with the same last two digits. */
static int full_year(int yy, time_t now) {
  struct tm tm;
  /* long long: gmtime_r() accepts years up to INT_MAX + 1900, where
   * tm_year + 1900 would overflow an int. */
  long long cur = 1970;
  if (gmtime_r(&now, &tm) != NULL)
    cur = (long long)tm.tm_year + 1900;
  long long y = cur - cur % 100 + yy;
  if (y > cur + 50)
    y -= 100;
  else if (y + 100 <= cur + 50)
    y += 100;
  return y > INT_MAX ? INT_MAX : y < INT_MIN ? INT_MIN : (int)y;
}

/* "GMT", and the spellings of the same zone no reader could take for
 * another: "UTC", "UT", "Z", "+0000", "-0000". */
static int zone_utc(struct cur *c) {
  static const char *const names[] = {"gmt", "utc", "ut", "z"};
  int idx;
  if (c->p < c->end && (*c->p == '+' || *c->p == '-')) {
    c->p++;
    int off;
    return number(c, 4, 4, &off) && off == 0;
  }
  return word(c, names, 4, &idx);
}

/* A year of two or four digits (a two-digit one read as RFC 9110 says);
 * one or three digits could be read more than one way and are refused. */
static int year_of(struct cur *c, time_t now, int *year) {
  const char *s = c->p;
  if (!number(c, 2, 4, year) || c->p - s == 3)
    return 0;
  if (c->p - s == 2)
    *year = full_year(*year, now);
  return 1;
}

int throttle__http_date(const char *value, size_t len, time_t now, time_t *t) {
  struct cur c = {value, value + len};
  int wd, day, mon, year, hh, mm, ss;
  if (!word(&c, day_names, 14, &wd))
    return THROTTLE_EINVAL;
  if (expect(&c, ',')) {
    /* IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT" or
     * RFC 850 "Sunday, 06-Nov-94 08:49:37 GMT", each also with the other's
     * year ("Thu, 19-Apr-2007 16:00:00 GMT", common in the wild, and
     * RFC 1123's predecessor "Sun, 06 Nov 94 ..."): the year's digits
     * say which it is, so neither can be misread. */
    if (!skip_ws(&c) || !number(&c, 1, 2, &day))
      return THROTTLE_EINVAL;
    if (expect(&c, '-')) {
      if (!word(&c, month_names, 12, &mon) || !expect(&c, '-') ||
          !year_of(&c, now, &year))
        return THROTTLE_EINVAL;
    } else if (!skip_ws(&c) || !word(&c, month_names, 12, &mon) ||
               !skip_ws(&c) || !year_of(&c, now, &year)) {
      return THROTTLE_EINVAL;
    }
    if (!skip_ws(&c) || !clock_time(&c, &hh, &mm, &ss) || !skip_ws(&c) ||
        !zone_utc(&c))
      return THROTTLE_EINVAL;
  } else {
    /* asctime "Sun Nov  6 08:49:37 1994" */
    if (!skip_ws(&c) || !word(&c, month_names, 12, &mon) || !skip_ws(&c) ||
        !number(&c, 1, 2, &day) || !skip_ws(&c) ||
        !clock_time(&c, &hh, &mm, &ss) || !skip_ws(&c) ||
        !number(&c, 4, 4, &year))
      return THROTTLE_EINVAL;
  }
  if (c.p != c.end || day < 1 || day > days_in_month(mon, year))
    return THROTTLE_EINVAL;
  if (year < 1970) {
    *t = 0;
    return 0;
  }
  /* curl_getdate() reads a 4-digit year as written (it treats years below
   * 100 as two-digit ones, hence the check above) and an explicit GMT as
   * GMT.  It returns -1 on failure, which after the checks above cannot
   * happen for a real date: its one valid -1, 1969-12-31 23:59:59, is
   * handled above. */
  char norm[48];
  snprintf(norm, sizeof norm, "%02d %s %04d %02d:%02d:%02d GMT", day,
           month_names[mon], year, hh, mm, ss);
  time_t v = curl_getdate(norm, NULL);
  if (v == (time_t)-1)
    return THROTTLE_EINVAL;
  *t = v;
  return 0;
}

/* ---- Retry-After --------------------------------------------------------- */

THROTTLE_EXTERN int throttle_parse_retry_after(const char *value, time_t now,
                                               uint64_t *ms) {
  if (value == NULL || ms == NULL)
    return THROTTLE_EINVAL;
  const char *s = value, *e = value + strlen(value);
  while (s < e && is_ows(*s))
    s++;
  while (e > s && is_ows(e[-1]))
    e--;
  if (s == e)
    return THROTTLE_EINVAL;

  if (is_digit(*s)) {
    /* delta-seconds = 1*DIGIT; saturate rather than fail on huge values. */
    uint64_t sec = 0;
    for (const char *p = s; p < e; p++) {
      if (!is_digit(*p))
        return THROTTLE_EINVAL;
      unsigned d = (unsigned)(*p - '0');
      sec = sec > (UINT64_MAX - d) / 10 ? UINT64_MAX : sec * 10 + d;
    }
    *ms = sec > UINT64_MAX / 1000 ? UINT64_MAX : sec * 1000;
    return 0;
  }

  time_t t;
  if (throttle__http_date(s, (size_t)(e - s), now, &t) != 0)
    return THROTTLE_EINVAL;
  if (t <= now) {
    *ms = 0;
    return 0;
  }
  /* t > now: the difference of two time_t fits in uint64_t. */
  uint64_t sec = (uint64_t)t - (uint64_t)now;
  *ms = sec > UINT64_MAX / 1000 ? UINT64_MAX : sec * 1000;
  return 0;
}

/* One element of a Retry-After list, [s, e): the element alone, or, when
 * it is only a weekday name, with the next element too (the comma of an
 * IMF-fixdate or RFC 850 date).  Returns the end of what was used, and
 * whether it was a value in *ok. */
static const char *list_element(const char *s, const char *e, time_t now,
                                uint64_t *ms, int *ok) {
  const char *comma = memchr(s, ',', (size_t)(e - s));
  const char *end = comma != NULL ? comma : e;
  char one[128];
  *ok = 0;
  for (int join = 0; join < 2; join++) {
    size_t n = (size_t)(end - s);
    if (n < sizeof one) {
      memcpy(one, s, n);
      one[n] = 0;
      if (throttle_parse_retry_after(one, now, ms) == 0) {
        *ok = 1;
        return end;
      }
    }
    /* "Sun" then " 06 Nov 1994 08:49:37 GMT": try them as one date. */
    if (end == e)
      break;
    const char *next = memchr(end + 1, ',', (size_t)(e - end - 1));
    end = next != NULL ? next : e;
  }
  return comma != NULL ? comma : e;
}

int throttle__retry_after_max(const char *value, time_t now, uint64_t *ms) {
  int n = 0;
  const char *s = value, *e = value + strlen(value);
  while (s < e) {
    int ok;
    uint64_t v;
    const char *end = list_element(s, e, now, &v, &ok);
    if (ok) {
      n++;
      if (v > *ms)
        *ms = v;
    }
    s = end < e ? end + 1 : e;
  }
  return n;
}

/* ---- error bodies ------------------------------------------------------- */

static void copy_out(char *dst, size_t cap, const char *src, size_t len) {
  if (dst == NULL || cap == 0)
    return;
  if (len >= cap)
    len = cap - 1;
  memcpy(dst, src, len);
  dst[len] = 0;
}

static int is_locked_code(const throttle_curl_policy_t *p, const char *code,
                          size_t len) {
  for (size_t i = 0; i < p->nlocked; i++)
    if (strlen(p->locked[i]) == len && memcmp(p->locked[i], code, len) == 0)
      return 1;
  return 0;
}

/* Read error.code (and error.message) from the first THROTTLE_CURL_BODY_MAX
 * bytes of body.  Sets *code / *code_len to point into *doc (which the
 * caller frees) or leaves them NULL / 0.  Returns THROTTLE_ENOMEM when the
 * parser said it ran out of memory, THROTTLE_EINVAL when it failed
 * otherwise (a syntax error, or memory it reported as one), else 0 (a
 * body without a code is not an error). */
static int read_error(const char *body, size_t len, json_t **doc,
                      const char **code, size_t *code_len, const char **msg,
                      size_t *msg_len) {
  *doc = NULL;
  *code = *msg = NULL;
  *code_len = *msg_len = 0;
  if (len == 0)
    return 0;
  if (len > THROTTLE_CURL_BODY_MAX)
    len = THROTTLE_CURL_BODY_MAX;
  /* A UTF-8 byte order mark is not JSON (RFC 8259 §8.1 lets a parser
   * ignore it) but some servers send one: skip it. */
  if (len >= 3 && memcmp(body, "\xef\xbb\xbf", 3) == 0) {
    body += 3;
    len -= 3;
  }
  /* Cheap refusal of what cannot be an object, before the parser runs. */
  size_t i = 0;
  while (i < len && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' ||
                     body[i] == '\n'))
    i++;
  if (i == len || body[i] != '{')
    return 0;
  /* jansson leaves jerr unset on some allocation failures. */
  json_error_t jerr;
  memset(&jerr, 0, sizeof jerr);
  json_t *root = json_loadb(body, len, 0, &jerr);
  if (root == NULL)
    return json_error_code(&jerr) == json_error_out_of_memory
               ? THROTTLE_ENOMEM
               : THROTTLE_EINVAL;
  *doc = root;
  json_t *err = json_object_get(root, "error");
  if (!json_is_object(err))
    return 0;
  json_t *c = json_object_get(err, "code");
  if (json_is_string(c)) {
    *code = json_string_value(c);
    *code_len = json_string_length(c);
  }
  json_t *m = json_object_get(err, "message");
  if (json_is_string(m)) {
    *msg = json_string_value(m);
    *msg_len = json_string_length(m);
  }
  return 0;
}

/* A parser that runs out of memory may say "syntax error" (jansson 2.14
 * does, for most of its allocations) or even return a string with a byte
 * dropped, so a failed or damaged read cannot be told from a body without
 * a locked code by the parser's word.  These two checks read the raw bytes
 * instead, allocating nothing. */

/* The first THROTTLE_CURL_BODY_MAX bytes of body hold "str" (n bytes
 * between double quotes), byte for byte. */
static int has_quoted(const char *body, size_t len, const char *str, size_t n) {
  if (len > THROTTLE_CURL_BODY_MAX)
    len = THROTTLE_CURL_BODY_MAX;
  for (size_t at = 0; at + n + 2 <= len; at++) {
    const char *q = memchr(body + at, '"', len - at - n - 1);
    if (q == NULL)
      return 0;
    at = (size_t)(q - body);
    if (memcmp(q + 1, str, n) == 0 && q[n + 1] == '"')
      return 1;
  }
  return 0;
}

/* The body names one of the locked codes as a JSON string. */
static int names_locked_code(const throttle_curl_policy_t *p, const char *body,
                             size_t len) {
  for (size_t i = 0; i < p->nlocked; i++)
    if (has_quoted(body, len, p->locked[i], strlen(p->locked[i])))
      return 1;
  return 0;
}

/* The code read appears in the body as a whole JSON string, so no byte of
 * it was lost.  A code with a byte JSON would escape cannot be checked
 * this way and is taken as read. */
static int read_whole(const char *body, size_t len, const char *code,
                      size_t clen) {
  for (size_t i = 0; i < clen; i++)
    if ((unsigned char)code[i] < 0x20 || code[i] == '"' || code[i] == '\\' ||
        (unsigned char)code[i] >= 0x80)
      return 1;
  return has_quoted(body, len, code, clen);
}

/* ---- classification ----------------------------------------------------- */

static throttle_outcome_t by_status(long status) {
  if (status >= 200 && status <= 299)
    return THROTTLE_OUTCOME_OK;
  switch (status) {
  case 429:
    return THROTTLE_OUTCOME_RATE_LIMITED;
  case 503:
    return THROTTLE_OUTCOME_UNAVAILABLE;
  case 408: /* Request Timeout: the server gave up waiting for the request */
  case 425: /* Too Early */
    return THROTTLE_OUTCOME_FAILED;
  case 501: /* Not Implemented */
  case 505: /* HTTP Version Not Supported */
  case 506: /* Variant Also Negotiates */
  case 508: /* Loop Detected */
  case 510: /* Not Extended */
  case 511: /* Network Authentication Required */
    return THROTTLE_OUTCOME_PERMANENT;
  }
  if (status >= 500 && status <= 599)
    return THROTTLE_OUTCOME_FAILED;
  return THROTTLE_OUTCOME_PERMANENT; /* 1xx, 3xx, other 4xx, 600-999 */
}

int throttle__classify(const throttle_curl_policy_t *policy, long status,
                       const char *body, size_t len,
                       throttle_outcome_t *outcome, char *code,
                       size_t code_len, char *msg, size_t msg_len) {
  if (outcome == NULL || status < 100 || status > 999 ||
      (body == NULL && len > 0) || (code == NULL && code_len > 0) ||
      (msg == NULL && msg_len > 0))
    return THROTTLE_EINVAL;
  if (policy == NULL)
    policy = throttle__curl_policy_default();
  copy_out(code, code_len, "", 0);
  copy_out(msg, msg_len, "", 0);
  throttle_outcome_t o = by_status(status);
  int rc = 0;
  if (o != THROTTLE_OUTCOME_OK) {
    json_t *doc;
    const char *c, *m;
    size_t clen, mlen;
    int rrc = read_error(body, len, &doc, &c, &clen, &m, &mlen);
    rc = rrc == THROTTLE_ENOMEM ? rrc : 0;
    if (status == 409) {
      if (c != NULL && is_locked_code(policy, c, clen))
        o = THROTTLE_OUTCOME_LOCKED;
      else if ((rrc != 0 || (c != NULL && !read_whole(body, len, c, clen))) &&
               names_locked_code(policy, body, len))
        o = THROTTLE_OUTCOME_FAILED;
      else
        o = THROTTLE_OUTCOME_PERMANENT;
    }
    if (c != NULL)
      copy_out(code, code_len, c, clen);
    if (m != NULL)
      copy_out(msg, msg_len, m, mlen);
    json_decref(doc);
  }
  *outcome = o;
  return rc;
}

THROTTLE_EXTERN int throttle_classify(const throttle_curl_policy_t *policy,
                                      long status, const char *body,
                                      size_t len, throttle_outcome_t *outcome,
                                      char *code, size_t code_len) {
  return throttle__classify(policy, status, body, len, outcome, code,
                            code_len, NULL, 0);
}
