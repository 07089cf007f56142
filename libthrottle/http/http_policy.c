/* SPDX-License-Identifier: MIT */
/*
 * http_policy.c — the throttle_curl_policy_t object: its defaults, its
 * setters, and the logging sink that writes to a FILE *.
 */
#include "http_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_RETRIES 10u
#define MAX_RETRIES 1000000u
#define DEFAULT_DELAY_MS UINT64_C(5000)
#define DEFAULT_BACKOFF_BASE_MS UINT64_C(200)
#define DEFAULT_BACKOFF_CAP_MS UINT64_C(20000)
#define MAX_DELAY_MS (UINT64_C(7) * 24 * 3600 * 1000)

static char default_code[] = "RESOURCE_LOCKED";
static char *default_codes[] = {default_code};

static const throttle_curl_policy_t default_policy = {
    .retries = DEFAULT_RETRIES,
    .deadline_ms = THROTTLE_FOREVER,
    .cls = THROTTLE_CLASS_LIVE,
    .default_delay_ms = DEFAULT_DELAY_MS,
    .backoff_base_ms = DEFAULT_BACKOFF_BASE_MS,
    .backoff_cap_ms = DEFAULT_BACKOFF_CAP_MS,
    .locked = default_codes,
    .nlocked = 1,
};

const throttle_curl_policy_t *throttle__curl_policy_default(void) {
  return &default_policy;
}

static void free_codes(char **codes, size_t n) {
  if (codes == default_codes)
    return;
  for (size_t i = 0; i < n; i++)
    throttle__free(codes[i]);
  throttle__free(codes);
}

THROTTLE_EXTERN int throttle_curl_policy_new(throttle_curl_policy_t **out) {
  if (out == NULL)
    return THROTTLE_EINVAL;
  *out = NULL;
  throttle_curl_policy_t *p = throttle__malloc(sizeof *p);
  if (p == NULL)
    return THROTTLE_ENOMEM;
  *p = default_policy; /* shares the static default code list until set */
  *out = p;
  return 0;
}

THROTTLE_EXTERN void throttle_curl_policy_free(throttle_curl_policy_t *p) {
  if (p == NULL)
    return;
  free_codes(p->locked, p->nlocked);
  throttle__free(p);
}

THROTTLE_EXTERN int throttle_curl_policy_set_retries(throttle_curl_policy_t *p,
                                                     unsigned n) {
  if (p == NULL || n > MAX_RETRIES)
    return THROTTLE_EINVAL;
  p->retries = n;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_deadline(throttle_curl_policy_t *p,
                                                      uint64_t ms) {
  if (p == NULL || ms == 0)
    return THROTTLE_EINVAL;
  p->deadline_ms = ms;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_class(throttle_curl_policy_t *p,
                                                   throttle_class_t cls) {
  if (p == NULL ||
      (cls != THROTTLE_CLASS_LIVE && cls != THROTTLE_CLASS_BACKFILL))
    return THROTTLE_EINVAL;
  p->cls = cls;
  return 0;
}

THROTTLE_EXTERN int
throttle_curl_policy_set_default_delay(throttle_curl_policy_t *p, uint64_t ms) {
  if (p == NULL || ms == 0 || ms > MAX_DELAY_MS)
    return THROTTLE_EINVAL;
  p->default_delay_ms = ms;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_local_backoff(
    throttle_curl_policy_t *p, uint64_t base_ms, uint64_t cap_ms) {
  if (p == NULL || base_ms == 0 || cap_ms < base_ms || cap_ms > MAX_DELAY_MS)
    return THROTTLE_EINVAL;
  p->backoff_base_ms = base_ms;
  p->backoff_cap_ms = cap_ms;
  return 0;
}

THROTTLE_EXTERN int
throttle_curl_policy_set_locked_codes(throttle_curl_policy_t *p,
                                      const char *const *codes, size_t n) {
  if (p == NULL || (codes == NULL && n > 0) ||
      n > THROTTLE__LOCKED_CODES_MAX)
    return THROTTLE_EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (codes[i] == NULL || codes[i][0] == 0 ||
        strnlen(codes[i], THROTTLE__CODE_MAX + 1) > THROTTLE__CODE_MAX)
      return THROTTLE_EINVAL;
  }
  /* Build the whole new set before touching the old one. */
  char **set = throttle__calloc(n > 0 ? n : 1, sizeof *set);
  if (set == NULL)
    return THROTTLE_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    set[i] = throttle__strdup(codes[i]);
    if (set[i] == NULL) {
      free_codes(set, i);
      return THROTTLE_ENOMEM;
    }
  }
  free_codes(p->locked, p->nlocked);
  p->locked = set;
  p->nlocked = n;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_sink(throttle_curl_policy_t *p,
                                                  curl_write_callback fn,
                                                  void *userdata) {
  if (p == NULL)
    return THROTTLE_EINVAL;
  p->sink = fn;
  p->sink_data = userdata;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_rewind(throttle_curl_policy_t *p,
                                                    curl_seek_callback fn,
                                                    void *userdata) {
  if (p == NULL)
    return THROTTLE_EINVAL;
  p->rewind = fn;
  p->rewind_data = userdata;
  return 0;
}

THROTTLE_EXTERN int throttle_curl_policy_set_log(throttle_curl_policy_t *p,
                                                 throttle_curl_log_fn fn,
                                                 void *userdata) {
  if (p == NULL)
    return THROTTLE_EINVAL;
  p->log = fn;
  p->log_data = userdata;
  return 0;
}

/* One fprintf per line, so lines of concurrent threads do not interleave
 * within a line (stdio locks the stream for the call).  A line carries a
 * server's error.code and the key, and the file is often a terminal:
 * control bytes (C0, DEL, C1 raw or as U+0080-U+009F) are written as
 * \xHH so that no server can drive it.  A long line is cut. */
static void log_to_file(void *userdata, const char *line) {
  char out[1024];
  size_t n = 0;
  unsigned cont = 0; /* continuation bytes still due in a sequence */
  for (const unsigned char *p = (const unsigned char *)line;
       *p != 0 && n + 9 < sizeof out; p++) {
    unsigned c = *p;
    if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) { /* UTF-8-encoded C1 */
      c = *++p;
      cont = 0;
    } else if (cont > 0 && (c & 0xc0) == 0x80) {
      cont--;
      out[n++] = (char)c;
      continue;
    } else {
      cont = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    }
    if (c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f))
      n += (size_t)snprintf(out + n, sizeof out - n, "\\x%02x", c);
    else
      out[n++] = (char)c;
  }
  out[n] = 0;
  fprintf((FILE *)userdata, "throttle: %s\n", out);
}

THROTTLE_EXTERN int throttle_curl_policy_set_log_file(throttle_curl_policy_t *p,
                                                      FILE *f) {
  if (p == NULL)
    return THROTTLE_EINVAL;
  p->log = f != NULL ? log_to_file : NULL;
  p->log_data = f;
  return 0;
}
