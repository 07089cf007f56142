/* SPDX-License-Identifier: MIT */
/*
 * http_internal.h — what the http layer's files share (prefix throttle__):
 * the policy's layout and the parsing helpers the perform loop reuses.
 * Nothing here is installed.
 */
#ifndef THROTTLE_HTTP_INTERNAL_H
#define THROTTLE_HTTP_INTERNAL_H

#include "throttle_curl.h"

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define THROTTLE__LOCKED_CODES_MAX 64u
#define THROTTLE__CODE_MAX 255u
#define THROTTLE__MSG_MAX 512u

struct throttle_curl_policy {
  unsigned retries;
  uint64_t deadline_ms; /* THROTTLE_FOREVER: none */
  throttle_class_t cls;
  uint64_t default_delay_ms;
  uint64_t backoff_base_ms;
  uint64_t backoff_cap_ms;
  char **locked; /* nlocked NUL-terminated codes */
  size_t nlocked;
  curl_write_callback sink;
  void *sink_data;
  curl_seek_callback rewind;
  void *rewind_data;
  throttle_curl_log_fn log;
  void *log_data;
};

/* Allocation goes through the core's hooks, which the tests can make fail
 * (internal.h, fault.c); in release builds they are the libc calls. */
#ifdef THROTTLE_TESTING
void *throttle__malloc(size_t n);
void *throttle__calloc(size_t n, size_t size);
char *throttle__strdup(const char *s);
void throttle__free(void *p);
#else
#define throttle__malloc(n) malloc(n)
#define throttle__calloc(n, size) calloc((n), (size))
#define throttle__strdup(s) strdup(s)
#define throttle__free(p) free(p)
#endif

/* http_perform.c: the jitter's random source, per thread, seeded again
 * in a process forked from the one that seeded it. */
uint64_t throttle__http_random(void);

/* http_policy.c: the policy used when the caller passes NULL. */
const throttle_curl_policy_t *throttle__curl_policy_default(void);

/* http_parse.c */

/* An HTTP-date (the three forms of throttle_parse_retry_after()) as
 * seconds since the epoch in *t; now only resolves two-digit years.
 * Dates before 1970 give *t = 0.  Returns 0 or THROTTLE_EINVAL. */
int throttle__http_date(const char *value, size_t len, time_t now, time_t *t);

/* The largest delay, in ms, among the values of one Retry-After field
 * that may be a list ("12, 12", or a date among numbers): every element
 * throttle_parse_retry_after() reads is a value the server sent, and the
 * largest is the one that is never early; unreadable elements are
 * skipped.  Stores it in *ms when larger than *ms (start from 0, and
 * pass the same *ms for each field line of a repeated header); returns
 * how many elements were read. */
int throttle__retry_after_max(const char *value, time_t now, uint64_t *ms);

/* throttle_classify(), also returning the body's error.message (truncated,
 * NUL-terminated; "" when none) when msg is not NULL. */
int throttle__classify(const throttle_curl_policy_t *policy, long status,
                       const char *body, size_t len,
                       throttle_outcome_t *outcome, char *code,
                       size_t code_len, char *msg, size_t msg_len);

#endif
