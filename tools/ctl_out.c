/* SPDX-License-Identifier: MIT */
/*
 * ctl_out.c — throttlectl's output helpers: messages on stderr, short human
 * durations and rates, keys made safe for a terminal, JSON strings, and
 * aligned text tables.  Shared by every printer (see ctl.h).
 */
#include "ctl.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- messages --------------------------------------------------------- */

/* Every message goes through ctl_text_put(): messages carry keys, segment
 * names, the library's messages and servers' words, and any of them may
 * hold bytes that would drive the terminal. */
void ctl_say(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  /* va_start is just above (a known false positive of
   * clang-analyzer-valist.Uninitialized). */
  int n = vsnprintf(line, sizeof line, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
  va_end(ap);
  if (n < 0)
    return;
  size_t len = (size_t)n;
  char *big = len >= sizeof line ? malloc(len + 1) : NULL;
  if (big != NULL) {
    va_start(ap, fmt);
    vsnprintf(big, len + 1, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
    va_end(ap);
  } else if (len >= sizeof line) {
    len = sizeof line - 1; /* no memory: the message cut */
  }
  fputs(PROG ": ", stderr);
  ctl_text_put(stderr, big != NULL ? big : line, len, false);
  fputc('\n', stderr);
  free(big);
}

/* The segment, the library's message (which often names the segment
 * already), and the exit status for it. */
int ctl_lib_fail(struct ctx *c, int rc) {
  const char *msg = throttle_errmsg(c->h);
  if (*msg == 0)
    msg = throttle_strerror(rc);
  if (strstr(msg, c->segname) != NULL)
    ctl_say("%s", msg);
  else
    ctl_say("%s: %s", c->segname, msg);
  return ctl_exit_for(rc);
}

int ctl_exit_for(int rc) {
  switch (rc) {
  case 0:
    return XIT_OK;
  case THROTTLE_EKEY:
    return XIT_USAGE;
  case THROTTLE_ETIMEDOUT:     /* a deadline the caller set */
  case THROTTLE_ELOCKTIMEOUT:  /* another process holds the segment mutex */
  case THROTTLE_EINITTIMEOUT:  /* another process is creating the segment */
  case THROTTLE_EWOULDBLOCK:
    return XIT_TEMP;
  default:
    return XIT_FAIL;
  }
}

/* ---- durations, rates, classes ---------------------------------------- */

static uint64_t div_round(uint64_t a, uint64_t b, bool up) {
  return up ? a / b + (a % b != 0) : a / b;
}

/* up rounds up (for time still to wait: never shows less than is left, so
 * "0.0s" never appears for a closed key). */
const char *ctl_human_ms(int64_t v, bool up, char *buf, size_t len) {
  uint64_t ms = v < 0 ? 0 : (uint64_t)v, t;
  if (ms < 1000) {
    snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
  }
  if (ms < 60000) {
    if ((t = div_round(ms, 100, up)) < 600) {
      snprintf(buf, len, "%llu.%llus", (unsigned long long)(t / 10),
               (unsigned long long)(t % 10));
      return buf;
    }
    ms = 60000;
  }
  if (ms < 3600000) {
    if ((t = div_round(ms, 1000, up)) < 3600) {
      snprintf(buf, len, "%llum%02llus", (unsigned long long)(t / 60),
               (unsigned long long)(t % 60));
      return buf;
    }
    ms = 3600000;
  }
  if (ms < 86400000) {
    if ((t = div_round(ms, 60000, up)) < 1440) {
      snprintf(buf, len, "%lluh%02llum", (unsigned long long)(t / 60),
               (unsigned long long)(t % 60));
      return buf;
    }
    ms = 86400000;
  }
  t = div_round(ms, 3600000, up);
  snprintf(buf, len, "%llud%02lluh", (unsigned long long)(t / 24),
           (unsigned long long)(t % 24));
  return buf;
}

/* The largest unit that divides the period exactly, so that the text reads
 * back through --rate as the same rate. */
const char *ctl_rate_text(int64_t n, int64_t period_ms, char *buf, size_t len) {
  static const struct {
    int64_t ms;
    const char *unit;
  } units[] = {{3600000, "h"}, {60000, "m"}, {1000, "s"}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (period_ms > 0 && period_ms % units[i].ms == 0) {
      snprintf(buf, len, "%lld/%lld%s", (long long)n,
               (long long)(period_ms / units[i].ms), units[i].unit);
      return buf;
    }
  snprintf(buf, len, "%lld/%lldms", (long long)n, (long long)period_ms);
  return buf;
}

const char *ctl_class_name(throttle_class_t cls) {
  switch (cls) {
  case THROTTLE_CLASS_LIVE:
    return "live";
  case THROTTLE_CLASS_BACKFILL:
    return "backfill";
  }
  return "unknown";
}

/* ---- strings ---------------------------------------------------------- */

/* ---- text for a terminal ---------------------------------------------- */

/* JSON output is exact; this is for eyes.  A key, a segment name, a server's
 * error code or body may hold bytes that a terminal obeys (ESC ] 0; retitles
 * it, ESC [ 2J clears it, and 0x9b is a one-byte CSI on terminals that take
 * C1 controls raw or UTF-8-encoded), or that are not UTF-8.  One function
 * decides what passes: valid UTF-8 except controls (C0 but, with lines, LF
 * and TAB; DEL; C1 as U+0080-U+009F) and the bidirectional overrides that
 * reorder what is shown (U+202A-U+202E, U+2066-U+2069).  Those are shown as
 * \uXXXX; bytes that are not valid UTF-8 as \xHH.  A backslash passes as
 * it is: this is for reading, not for reading back.
 *
 * Writes the representation of the sequence at p (n > 0 bytes left) to
 * out (at least 8 bytes), NUL-terminated; returns the bytes consumed. */
static size_t text_one(const unsigned char *p, size_t n, bool lines,
                       char *out) {
  unsigned c = p[0];
  if (c < 0x80) {
    if ((c < 0x20 && !(lines && (c == '\n' || c == '\t'))) || c == 0x7f)
      snprintf(out, 8, "\\x%02x", c);
    else
      snprintf(out, 8, "%c", (char)c);
    return 1;
  }
  /* The length of the sequence and the range of its second byte (no
   * overlong forms, no surrogates, nothing past U+10FFFF). */
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4                         ? 4
                                                                : 0;
  unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
  unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
  bool ok = len > 0 && len <= n && p[1] >= lo && p[1] <= hi;
  for (size_t i = 2; ok && i < len; i++)
    ok = (p[i] & 0xc0) == 0x80;
  if (!ok) {
    snprintf(out, 8, "\\x%02x", c);
    return 1;
  }
  unsigned cp = c & (0x7f >> len);
  for (size_t i = 1; i < len; i++)
    cp = cp << 6 | (p[i] & 0x3f);
  if (cp <= 0x9f || (cp >= 0x202a && cp <= 0x202e) ||
      (cp >= 0x2066 && cp <= 0x2069)) {
    snprintf(out, 8, "\\u%04x", cp);
  } else {
    memcpy(out, p, len);
    out[len] = 0;
  }
  return len;
}

void ctl_text_put(FILE *f, const char *s, size_t n, bool lines) {
  const unsigned char *p = (const unsigned char *)s;
  char one[8];
  for (size_t i = 0; i < n;) {
    i += text_one(p + i, n - i, lines, one);
    fputs(one, f);
  }
}

char *ctl_key_text(const char *key, char *out, size_t len) {
  const unsigned char *p = (const unsigned char *)key;
  size_t n = 0, left = strlen(key);
  char one[8];
  while (left > 0) {
    size_t used = text_one(p, left, false, one), k = strlen(one);
    if (n + k >= len)
      break;
    memcpy(out + n, one, k);
    n += k;
    p += used;
    left -= used;
  }
  out[n] = 0;
  return out;
}

/* Columns a string takes on a UTF-8 terminal, near enough: one per byte
 * that does not continue a multi-byte sequence. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    w += (*p & 0xc0) != 0x80;
  return w;
}

/* Length of the well-formed UTF-8 sequence at p (1 to 4), or 0 when the
 * bytes there are not one: no overlong forms, no surrogates, nothing past
 * U+10FFFF (RFC 3629). */
static size_t utf8_seq(const unsigned char *p) {
  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    return (p[1] & 0xc0) == 0x80 ? 2 : 0;
  if (p[0] >= 0xe0 && p[0] <= 0xef) {
    unsigned lo = p[0] == 0xe0 ? 0xa0 : 0x80, hi = p[0] == 0xed ? 0x9f : 0xbf;
    return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
  }
  if (p[0] >= 0xf0 && p[0] <= 0xf4) {
    unsigned lo = p[0] == 0xf0 ? 0x90 : 0x80, hi = p[0] == 0xf4 ? 0x8f : 0xbf;
    return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 &&
                   (p[3] & 0xc0) == 0x80
               ? 4
               : 0;
  }
  return 0;
}

int ctl_utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = utf8_seq(p);
    if (n == 0)
      return 0;
    p += n;
  }
  return 1;
}

/* JSON text must be UTF-8 (RFC 8259): a byte that does not belong to a
 * well-formed sequence is written as U+FFFD, and ctl_json_key() adds the
 * exact bytes in base64 next to it.  Rejected: each raw byte as the code
 * point of the same number, which reads back as a different, valid key
 * (0xff would become U+00FF). */
void ctl_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = utf8_seq(p);
    if (n == 0) {
      fputs("\\ufffd", f);
      p++;
    } else if (*p == '"' || *p == '\\') {
      fputc('\\', f);
      fputc(*p++, f);
    } else if (*p < 0x20 || *p == 0x7f) {
      fprintf(f, "\\u%04x", *p++);
    } else {
      fwrite(p, 1, n, f);
      p += n;
    }
  }
  fputc('"', f);
}

static void base64(FILE *f, const unsigned char *s, size_t n) {
  static const char tab[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t)s[i + 1] << 8;
    if (i + 2 < n)
      v |= s[i + 2];
    fputc(tab[(v >> 18) & 63], f);
    fputc(tab[(v >> 12) & 63], f);
    fputc(i + 1 < n ? tab[(v >> 6) & 63] : '=', f);
    fputc(i + 2 < n ? tab[v & 63] : '=', f);
  }
}

void ctl_json_key(FILE *f, const char *key) {
  fputs("\"key\":", f);
  ctl_json_string(f, key);
  if (!ctl_utf8_valid(key)) {
    fputs(",\"key_base64\":\"", f);
    base64(f, (const unsigned char *)key, strlen(key));
    fputc('"', f);
  }
}

void ctl_warn_clamped(const char *what, const char *given, const char *used) {
  ctl_say("warning: %s %s is out of range; %s", what, given, used);
}

/* ---- tables ----------------------------------------------------------- */

int ctl_table_add(struct ctl_table *t, char *const *row) {
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    char **cells = realloc(t->cells, cap * (size_t)t->ncols * sizeof *cells);
    if (cells == NULL)
      return -1;
    t->cells = cells;
    t->cap = cap;
  }
  char **dst = &t->cells[t->nrows * (size_t)t->ncols];
  for (int i = 0; i < t->ncols; i++) {
    dst[i] = strdup(row[i]);
    if (dst[i] == NULL) {
      while (i-- > 0)
        free(dst[i]);
      return -1;
    }
  }
  t->nrows++;
  return 0;
}

/* Each line starts with indent (may be NULL). */
void ctl_table_print(FILE *f, const struct ctl_table *t, const char *indent) {
  size_t *w = calloc((size_t)t->ncols, sizeof *w);
  if (w == NULL)
    return;
  for (size_t r = 0; r < t->nrows; r++)
    for (int i = 0; i < t->ncols; i++) {
      size_t n = text_width(t->cells[r * (size_t)t->ncols + i]);
      if (n > w[i])
        w[i] = n;
    }
  for (size_t r = 0; r < t->nrows; r++) {
    char *const *row = &t->cells[r * (size_t)t->ncols];
    /* Empty cells at the end of a row are left out: no trailing blanks. */
    int end = t->ncols;
    while (end > 1 && *row[end - 1] == 0)
      end--;
    if (indent != NULL)
      fputs(indent, f);
    for (int i = 0; i < end; i++) {
      const char *s = row[i];
      size_t pad = w[i] - text_width(s);
      bool last = i == end - 1;
      if (i > 0)
        fputs("  ", f);
      if (t->right[i])
        fprintf(f, "%*s", (int)pad, "");
      fputs(s, f);
      if (!t->right[i] && !last)
        fprintf(f, "%*s", (int)pad, "");
    }
    fputc('\n', f);
  }
  free(w);
}

void ctl_table_free(struct ctl_table *t) {
  for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
    free(t->cells[i]);
  free(t->cells);
}

/* ---- processes -------------------------------------------------------- */

/* /proc/PID/comm, the name the kernel keeps (at most 15 bytes, set by the
 * process itself, so shown through ctl_key_text()). */
const char *ctl_comm(int64_t pid, char *buf, size_t len) {
  char path[64], raw[32];
  buf[0] = 0;
  if (pid <= 0 || pid > INT32_MAX)
    return buf;
  snprintf(path, sizeof path, "/proc/%lld/comm", (long long)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return buf;
  ssize_t n = read(fd, raw, sizeof raw - 1);
  close(fd);
  if (n <= 0)
    return buf;
  raw[n] = 0;
  raw[strcspn(raw, "\n")] = 0;
  return ctl_key_text(raw, buf, len);
}

/* ---- the backend ------------------------------------------------------ */

static bool told_down; /* ctl_backend_text() said the backend is down */

void ctl_backend_warn(const throttle_t *h) {
  int up = 1;
  if (h == NULL || told_down ||
      throttle_backend_status(h, &up, NULL, NULL) != 0 || up)
    return;
  fprintf(stderr,
          PROG ": backend %s is unreachable: this host's segment %s served "
               "instead, for this host only\n",
          throttle_backend(h), throttle_segment_name(h));
}

void ctl_backend_text(FILE *f, const throttle_t *h) {
  if (strcmp(throttle_backend(h), "shm") == 0)
    return;
  int up = 1;
  uint64_t down_ms = 0, served = 0;
  (void)throttle_backend_status(h, &up, &down_ms, &served);
  if (up) {
    fprintf(f, "backend %s: up; keys across hosts (this host's segment "
               "serves while it is away)\n",
            throttle_backend(h));
    return;
  }
  char t[32];
  told_down = true;
  fprintf(f, "backend %s: UNREACHABLE for %s; this host's segment served "
             "%llu call%s meanwhile, for this host only\n",
          throttle_backend(h), ctl_human_ms((int64_t)down_ms, false, t, sizeof t),
          (unsigned long long)served, served == 1 ? "" : "s");
}

void ctl_backend_json(FILE *f, const throttle_t *h) {
  int up = 1;
  uint64_t down_ms = 0, served = 0;
  (void)throttle_backend_status(h, &up, &down_ms, &served);
  fputs(",\"backend\":", f);
  ctl_json_string(f, throttle_backend(h));
  fprintf(f, ",\"backend_up\":%s,\"backend_down_ms\":%llu,"
             "\"backend_served_meanwhile\":%llu",
          up ? "true" : "false", (unsigned long long)down_ms,
          (unsigned long long)served);
}
