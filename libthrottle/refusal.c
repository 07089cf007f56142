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

/* Length of the well-formed UTF-8 sequence at p (at most n bytes), and
 * its code point; 0 when the bytes there are not one (overlong forms,
 * surrogates and values past U+10FFFF included). */
static size_t utf8_seq(const unsigned char *p, size_t n, uint32_t *cp) {
  unsigned c = p[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c >= 0xc2 && c <= 0xdf)
    len = 2, v = c & 0x1f, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef)
    len = 3, v = c & 0x0f, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4)
    len = 4, v = c & 0x07, min = 0x10000;
  else
    return 0;
  if (len > n)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xc0) != 0x80)
      return 0;
    v = (v << 6) | (p[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
    return 0;
  *cp = v;
  return len;
}

/* Would this code point move a terminal's cursor or change what follows:
 * C0, DEL, C1, and the bidirectional embeddings, overrides and isolates. */
static bool unsafe_cp(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

size_t throttle__clean_text(char *dst, size_t size, const char *src,
                            size_t len) {
  static const char cut[] = "...";
  if (size == 0)
    return 0;
  size_t n = 0;
  const unsigned char *p = (const unsigned char *)src;
  size_t i = 0;
  while (src != NULL && i < len) {
    uint32_t cp;
    size_t l = utf8_seq(p + i, len - i, &cp);
    const char *put = (const char *)p + i;
    size_t plen = l;
    if (l == 0) { /* not UTF-8: one byte, shown as '?' */
      put = "?";
      plen = 1;
      l = 1;
    } else if (unsafe_cp(cp)) { /* a line break or a control: a space */
      put = " ";
      plen = 1;
    }
    /* Room for this sequence, and for the mark of a cut if more follows. */
    size_t need = plen + (i + l < len ? sizeof cut - 1 : 0);
    if (n + need > size - 1) {
      if (n + (sizeof cut - 1) > size - 1) /* a tiny buffer: no mark */
        break;
      memcpy(dst + n, cut, sizeof cut - 1);
      n += sizeof cut - 1;
      break;
    }
    memcpy(dst + n, put, plen);
    n += plen;
    i += l;
  }
  dst[n] = 0;
  return n;
}

/* A field of the record, read once and bounded (it may lack its NUL). */
#define CLEAN_FIELD(dst, src)                                                  \
  throttle__clean_text((dst), sizeof(dst), (src), strnlen((src), sizeof(src)))

void throttle__refusal_copy(struct throttle__refusal *dst,
                            const struct throttle__refusal *src) {
  struct throttle__refusal r;
  memcpy(&r, src, sizeof r); /* once: a writer may change it meanwhile */
  memset(dst, 0, sizeof *dst);
  if (r.wall_ns == 0 || r.status < 100 || r.status > 999)
    return; /* none, or not one the library wrote */
  dst->wall_ns = r.wall_ns;
  dst->pid = r.pid;
  dst->status = r.status;
  CLEAN_FIELD(dst->code, r.code);
  CLEAN_FIELD(dst->msg, r.msg);
  CLEAN_FIELD(dst->ra, r.ra);
  CLEAN_FIELD(dst->host, r.host);
}

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

  uint64_t now;
  struct throttle__rec *r;
  if ((rc = throttle__lock_record(h, key, len, &now, &r)) != 0)
    return rc;
  memcpy(&r->refusal, &n, sizeof n);
  r->last_use_ns = now;
  throttle__unlock(h);
  throttle__clear_msg(h);
  return 0;
}

void throttle__refusal_merge(throttle_t *h, throttle_info_t *info) {
  memset(&info->refusal, 0, sizeof info->refusal);
  size_t len = strnlen(info->key, sizeof info->key);
  if (h->hdr == NULL || len == 0 || len > THROTTLE__KEY_MAX ||
      throttle__lock(h) != 0)
    return; /* no segment to ask: none noted */
  struct throttle__rec *r = throttle__find_locked(
      h, info->key, len, throttle__hash(h->seed, info->key, len));
  if (r != NULL)
    throttle__refusal_copy(&info->refusal, &r->refusal);
  throttle__unlock(h);
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
