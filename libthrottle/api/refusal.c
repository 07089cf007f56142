/* SPDX-License-Identifier: MIT */
/*
 * refusal.c — what the server said when it last refused a key: its HTTP
 * status, error.code and message, the Retry-After field as sent, when
 * (wall clock) and by which process and host it was noted.  The http layer
 * notes it after it publishes a refusal (throttle_note_refusal), and
 * throttle_info() hands it out (throttle_info_refusal), so that an
 * operator reads the server's own words beside the back-off they caused.
 *
 * It is text from the network, kept in shared memory and shown on
 * terminals: it is stored as valid UTF-8 without control bytes, cut to a
 * fixed size, and judged the same way again when read (a writer outside
 * the library may have put anything there, I8).  It decides nothing: no
 * rule of the gate reads it.
 *
 * With a backend (Redis) the note goes to this host's segment only, and a
 * snapshot from the backend takes it from there: the refusals this host
 * was told about.  Rejected: a field of the Redis scripts' hash (another
 * round trip on every refusal and a script change, for words an operator
 * reads on the host where the refused loader runs).
 */
#include "backend.h"

#include <unistd.h>

/* The strings a caller passed, bounded before they are measured: a
 * message longer than this is cut anyway. */
#define NOTE_SCAN_MAX 65536u

static void note_text(char *dst, size_t size, const char *s) {
  throttle__clean_text(dst, size, s, s != NULL ? strnlen(s, NOTE_SCAN_MAX) : 0);
}

THROTTLE_EXTERN int throttle_note_refusal(throttle_t *h, const char *key,
                                          int http_status, const char *code,
                                          const char *message,
                                          const char *retry_after) {
  size_t len;
  if (h == NULL)
    return THROTTLE_EINVAL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "note a refusal");
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  if (http_status < 100 || http_status > 999)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "%d: not an HTTP status (100-999)", http_status);
  /* Everything that takes time or may fail, before the mutex. */
  struct throttle__refusal n;
  memset(&n, 0, sizeof n);
  struct timespec ts;
  if (throttle__clock_gettime(CLOCK_REALTIME, &ts) != 0 || ts.tv_sec <= 0)
    return throttle__fail(h, THROTTLE_ESYS, "the wall clock cannot be read");
  n.wall_ns = (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
  n.pid = (uint32_t)getpid();
  n.status = (uint16_t)http_status;
  note_text(n.code, sizeof n.code, code);
  note_text(n.msg, sizeof n.msg, message);
  note_text(n.ra, sizeof n.ra, retry_after);
  char host[256];
  if (gethostname(host, sizeof host) != 0)
    host[0] = 0;
  host[sizeof host - 1] = 0;
  note_text(n.host, sizeof n.host, host);
  return h->ops->note_refusal(h, key, len, &n);
}

THROTTLE_EXTERN int throttle_info_refusal(const throttle_info_t *info,
                                          int *http_status, const char **code,
                                          const char **message,
                                          const char **retry_after,
                                          int64_t *at_ms, int64_t *pid,
                                          const char **host) {
  const struct throttle__refusal *r = info != NULL ? &info->refusal : NULL;
  bool have = r != NULL && r->wall_ns != 0;
  if (http_status)
    *http_status = have ? r->status : 0;
  if (code)
    *code = have ? r->code : "";
  if (message)
    *message = have ? r->msg : "";
  if (retry_after)
    *retry_after = have ? r->ra : "";
  if (at_ms)
    *at_ms = have ? (int64_t)(r->wall_ns / THROTTLE__NS_PER_MS) : 0;
  if (pid)
    *pid = have ? (int64_t)r->pid : 0;
  if (host)
    *host = have ? r->host : "";
  if (info == NULL)
    return THROTTLE_EINVAL;
  return have ? 0 : THROTTLE_ENOKEY;
}
