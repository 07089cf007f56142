/* SPDX-License-Identifier: MIT */
/*
 * ctl_http.c — `http KEY [curl-like options] URL`: one HTTP request sent
 * through throttle_curl_perform(), so that it is admitted by KEY's gate,
 * its answer classified, what the server said published for every other
 * process, and a transient answer sent again.
 *
 * The options are curl's where curl has them (-X, -H, -d, --data-binary,
 * -o, -v) and mean what they mean there, so that a `curl ...` line in a
 * script becomes `throttlectl http KEY ...` with the same request on the
 * wire.  Two deliberate differences: a POST, PUT or PATCH without a body
 * is sent with "Content-Length: 0" (RFC 9110 §8.6; curl -X POST sends no
 * length and some servers answer 411), and the exit status is the
 * outcome's (0 2xx, 1 permanent, 75 still transient), not curl's.
 *
 * The body is read into memory before the segment is opened, so that a
 * file that cannot be read stops the command before it touches anything:
 * libcurl sends CURLOPT_POSTFIELDS again from the start for every attempt
 * by itself, where a streamed upload would need a read callback plus the
 * policy's rewind.  The price is memory, hence BODY_MAX; a program that
 * uploads more than that should stream with the library directly.
 *
 * --timeout bounds the whole call, as curl --max-time does: the policy's
 * deadline bounds waiting and the decision to retry, and a progress
 * callback ends a transfer still running at the deadline (libcurl calls
 * it at least about once a second), with CURLOPT_TIMEOUT_MS (SEC for each
 * transfer) as a backstop that is exact for the first one.  Without it
 * each transfer is bounded (TRANSFER_TIMEOUT_MS): a server that never
 * answers would hold the admission until its lease lapsed.  Rejected: a
 * default deadline for the whole call, which would end long but healthy
 * waits behind a lock.
 *
 * Everything printed that came from a server (codes, messages, -v lines,
 * bodies) goes through ctl_text_put() (ctl_out.c).
 *
 * Exit statuses follow `run`: 0 for a 2xx answer, 1 for a permanent one,
 * a transport error that re-sending does not mend (certificate, -o not
 * writable, a 2xx cut short) and a cancel (`throttlectl cancel` sends
 * every waiter home; a job runner that re-queued on 75 would undo it), 75
 * when still transient at the retry budget or the deadline: a transient
 * answer (lock, 429, 503, 5xx) or a transport error re-sent for
 * (connection refused, reset, timed out), so that "75: queue it again"
 * loses nothing.  A URL that is not an http(s) URL is a usage error (64).
 */
#include "ctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "throttle_curl.h"

/* Without --timeout, the longest one transfer may take (documented in
 * docs/throttlectl.md): well under the library's 10-minute lease. */
#define TRANSFER_TIMEOUT_MS 300000u

/* The most a request body may be: it is held in memory. */
#define BODY_MAX ((size_t)256 << 20)
#define RETRIES_DEFAULT 10u

/* ---- arguments -------------------------------------------------------- */

/* RFC 9110 tchar: what a method or a field name is made of. */
static bool is_tchar(unsigned char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || (ch != 0 && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool is_token(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!is_tchar((unsigned char)s[i]))
      return false;
  return true;
}

/* "Name: value", or curl's "Name:" (drop a header libcurl would send) and
 * "Name;" (send it empty).  The whole name must be a token: "X-Bad;Name: v"
 * is no "X-Bad;" with a value.  A CR or LF would start another header. */
static bool header_ok(const char *h) {
  size_t n = strcspn(h, ":");
  if (h[n] == 0) /* "Name;" */
    return n > 1 && h[n - 1] == ';' && is_token(h, n - 1);
  return is_token(h, n) && strpbrk(h, "\r\n") == NULL;
}

/* Append all of fd to *buf (*len bytes used of *cap, grown), as long as
 * *len stays at most BODY_MAX.  Returns 0, -1 with errno set, or 1 when
 * there is more than that. */
static int read_fd(int fd, char **buf, size_t *len, size_t *cap) {
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      (uint64_t)st.st_size > BODY_MAX - *len)
    return 1; /* known too big: not worth reading */
  for (;;) {
    if (*cap - *len < 65536 && *cap < BODY_MAX + 1) {
      size_t ncap = *cap < 65536 ? 131072 : *cap * 2;
      if (ncap > BODY_MAX + 1)
        ncap = BODY_MAX + 1;
      char *nb = realloc(*buf, ncap);
      if (nb == NULL)
        return -1;
      *buf = nb;
      *cap = ncap;
    }
    ssize_t k = read(fd, *buf + *len, *cap - *len);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return -1;
    if (k == 0)
      return 0;
    *len += (size_t)k;
    if (*len > BODY_MAX)
      return 1;
  }
}

/* Append one data argument to the body: DATA as it is, or @FILE's bytes
 * (@- is standard input), without CR and LF when strip (curl -d). */
static int add_data(struct ctx *c, const char *arg, bool strip, size_t *cap) {
  if (arg[0] != '@') {
    size_t n = strlen(arg);
    if (n > BODY_MAX - c->body_len)
      goto too_big;
    if (c->body_len + n + 1 > *cap) {
      char *nb = realloc(c->body, c->body_len + n + 1);
      if (nb == NULL)
        goto oom;
      c->body = nb;
      *cap = c->body_len + n + 1;
    }
    memcpy(c->body + c->body_len, arg, n);
    c->body_len += n;
    return 0;
  }
  const char *path = arg + 1;
  bool in = strcmp(path, "-") == 0;
  int fd = in ? 0 : open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ctl_say("http: %s: %s", path, strerror(errno));
    return XIT_FAIL;
  }
  size_t from = c->body_len;
  int r = read_fd(fd, &c->body, &c->body_len, cap);
  int e = errno;
  if (!in)
    close(fd);
  if (r > 0)
    goto too_big;
  if (r < 0) {
    ctl_say("http: %s: %s", in ? "standard input" : path, strerror(e));
    return XIT_FAIL;
  }
  if (strip) {
    size_t w = from;
    for (size_t i = from; i < c->body_len; i++)
      if (c->body[i] != '\r' && c->body[i] != '\n')
        c->body[w++] = c->body[i];
    c->body_len = w;
  }
  return 0;
too_big:
  ctl_say("http: the body would be more than %zu MiB, the most http sends",
          BODY_MAX >> 20);
  return XIT_FAIL;
oom:
  ctl_say("out of memory");
  return XIT_FAIL;
}

static int read_body(struct ctx *c) {
  size_t cap = 0;
  if (c->opt[OPT_DATA_BINARY] != NULL) {
    c->has_body = true;
    return add_data(c, c->opt[OPT_DATA_BINARY], false, &cap);
  }
  for (int i = 0; i < c->nlist[OPT_DATA]; i++) {
    c->has_body = true;
    if (i > 0) {
      int rc = add_data(c, "&", false, &cap);
      if (rc != 0)
        return rc;
    }
    int rc = add_data(c, c->list[OPT_DATA][i], true, &cap);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* The URL as libcurl's own parser reads it: an http or https URL with a
 * host, scheme written out.  curl itself would guess "http://" for
 * "notaurl" and fail to resolve it, a transient transport error; a URL
 * that cannot be one is the caller's mistake, told before anything is
 * sent or opened. */
static int check_url(struct ctx *c, const char *url) {
  CURLU *u = curl_url();
  if (u == NULL) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  char *scheme = NULL, *host = NULL;
  CURLUcode e = curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
  if (e == CURLUE_OK)
    e = curl_url_get(u, CURLUPART_SCHEME, &scheme, 0);
  if (e == CURLUE_OK)
    e = curl_url_get(u, CURLUPART_HOST, &host, 0);
  int rc = 0;
  char t[KEY_TEXT_MAX];
  ctl_key_text(url, t, sizeof t);
  if (e != CURLUE_OK)
    rc = ctl_usage_error(c->cmd, "'%s' is not a URL (%s); give "
                                 "http://HOST/... or https://HOST/...",
                         t, curl_url_strerror(e));
  else if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0)
    rc = ctl_usage_error(c->cmd, "'%s': scheme %s is not http or https", t,
                         scheme);
  else if (*host == 0)
    rc = ctl_usage_error(c->cmd, "'%s' has no host", t);
  curl_free(scheme);
  curl_free(host);
  curl_url_cleanup(u);
  return rc;
}

int ctl_check_http(struct ctx *c) {
  int rc = ctl_check_class(c);
  if (rc == 0)
    rc = ctl_check_retries(c, RETRIES_DEFAULT);
  if (rc != 0)
    return rc;
  if ((rc = ctl_check_max_parallel(c)) != 0 || (rc = ctl_check_timeout(c)) != 0 ||
      (rc = ctl_check_publish(c)) != 0)
    return rc;
  if (c->timeout_ms == 0)
    return ctl_usage_error(c->cmd, "--timeout must be more than 0 for http "
                                   "(it bounds the request too)");
  const char *m = c->opt[OPT_REQUEST];
  if (m != NULL && !is_token(m, strlen(m)))
    return ctl_usage_error(c->cmd, "-X: '%s' is not a method name", m);
  for (int i = 0; i < c->nlist[OPT_HEADER]; i++)
    if (!header_ok(c->list[OPT_HEADER][i]))
      return ctl_usage_error(c->cmd, "-H: '%s' is not a header ('Name: value')",
                             c->list[OPT_HEADER][i]);
  if (c->opt[OPT_DATA] != NULL && c->opt[OPT_DATA_BINARY] != NULL)
    return ctl_usage_error(c->cmd, "give -d or --data-binary, not both");
  if (c->opt[OPT_OUTPUT] != NULL && *c->opt[OPT_OUTPUT] == 0)
    return ctl_usage_error(c->cmd, "-o needs a file name");
  if (c->nargs < 2)
    return ctl_usage_error(c->cmd, "missing URL");
  if ((rc = check_url(c, c->args[1])) != 0)
    return rc;
  return read_body(c);
}

/* ---- time ------------------------------------------------------------- */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Ends a transfer still running at the deadline (--timeout). */
struct deadline {
  uint64_t at; /* now_ms() */
  bool hit;
};

static int progress(void *userdata, curl_off_t dltotal, curl_off_t dlnow,
                    curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  struct deadline *d = userdata;
  if (now_ms() < d->at)
    return 0;
  d->hit = true;
  return 1; /* CURLE_ABORTED_BY_CALLBACK */
}

/* ---- where a 2xx body goes -------------------------------------------- */

/* -o FILE.  Nothing is created before a 2xx body starts (as curl): a
 * request interrupted while it waits for admission leaves no empty file
 * behind that a re-run skipping finished parts would skip.  A regular
 * file (or a new one) is written as a temporary file beside it,
 * ".NAME.XXXXXX", renamed over FILE only when the answer was a whole 2xx:
 * an answer cut short, a failed write or a signal leaves an existing FILE
 * as it was.  Anything else that exists (a device, a FIFO, /dev/stdout) is
 * opened and written in place, since it cannot be replaced.  Before the
 * request only the checks that create nothing are made: FILE's directory
 * can be written, and an existing FILE is no directory. */
struct sink {
  const char *path; /* NULL: standard output */
  int fd;           /* -1 until a body starts */
  bool in_place;    /* FILE exists and is no regular file */
  mode_t mode;      /* of the file to create */
  char tmp[PATH_MAX];
  int err;     /* errno of a failed write, or 0 */
  bool closed; /* sink_close() ran */
};

/* The temporary file being written, for a signal's last word. */
static const char *volatile tmp_to_remove;

/* SIGINT, SIGTERM, SIGHUP while the body is written: remove the temporary
 * file, then die of the signal as before. */
static void remove_tmp_and_die(int sig) {
  const char *t = tmp_to_remove;
  if (t != NULL)
    unlink(t);
  signal(sig, SIG_DFL);
  raise(sig);
}

static void sink_guard(void) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
      signal(sigs[i], remove_tmp_and_die);
  }
}

static int sink_open(struct sink *s, const char *path) {
  s->fd = -1;
  s->tmp[0] = 0;
  s->path = path != NULL && strcmp(path, "-") != 0 ? path : NULL;
  if (s->path == NULL)
    return 0;
  mode_t um = umask(0);
  umask(um);
  s->mode = 0666 & ~um;
  struct stat st;
  const char *slash = strrchr(path, '/');
  int dlen = slash == NULL ? 1 : slash == path ? 1 : (int)(slash - path);
  int n = snprintf(s->tmp, sizeof s->tmp, "%.*s/.%s.XXXXXX", dlen,
                   slash == NULL ? "." : path, slash == NULL ? path : slash + 1);
  if (n < 0 || (size_t)n >= sizeof s->tmp) {
    ctl_say("http: cannot write %s: %s", path, strerror(ENAMETOOLONG));
    return -1;
  }
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      ctl_say("http: cannot write %s: %s", path, strerror(EISDIR));
      return -1;
    }
    s->in_place = !S_ISREG(st.st_mode);
    s->mode = st.st_mode & 07777;
  }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%.*s", dlen, slash == NULL ? "." : path);
  if (s->in_place ? access(path, W_OK) != 0 : access(dir, W_OK | X_OK) != 0) {
    ctl_say("http: cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* The first byte of a 2xx body (or a whole 2xx without one). */
static void sink_start(struct sink *s) {
  if (s->fd >= 0 || s->path == NULL || s->err != 0)
    return;
  if (s->in_place) {
    s->fd = open(s->path, O_WRONLY | O_TRUNC | O_CLOEXEC);
  } else {
    s->fd = mkostemp(s->tmp, O_CLOEXEC);
    if (s->fd >= 0) {
      tmp_to_remove = s->tmp;
      if (fchmod(s->fd, s->mode) != 0)
        s->err = errno;
    }
  }
  if (s->fd < 0)
    s->err = errno;
}

static size_t sink_write(char *ptr, size_t size, size_t nmemb, void *ud) {
  struct sink *s = ud;
  size_t n = size * nmemb;
  if (s->err != 0)
    return 0;
  if (s->path == NULL) {
    if (fwrite(ptr, 1, n, stdout) != n) {
      s->err = errno != 0 ? errno : EIO;
      return 0;
    }
    return n;
  }
  sink_start(s);
  for (size_t off = 0; off < n && s->err == 0;) {
    ssize_t k = write(s->fd, ptr + off, n - off);
    if (k < 0 && errno != EINTR)
      s->err = errno;
    else if (k > 0)
      off += (size_t)k;
  }
  return s->err == 0 ? n : 0;
}

/* After the call: a whole 2xx answer's file takes FILE's place (an empty
 * body still makes one); any other end removes the temporary file. */
static int sink_close(struct sink *s, bool ok) {
  if (s->path == NULL || s->closed)
    return 0;
  if (ok)
    sink_start(s);
  if (s->fd >= 0 && close(s->fd) != 0 && s->err == 0 && ok)
    s->err = errno;
  s->fd = -1;
  if (!s->in_place && tmp_to_remove != NULL) {
    if (ok && s->err == 0 && rename(s->tmp, s->path) != 0)
      s->err = errno;
    if (!ok || s->err != 0)
      unlink(s->tmp);
    tmp_to_remove = NULL;
  }
  s->closed = true;
  return s->err;
}

/* ---- the request ------------------------------------------------------ */

static bool has_header(const struct ctx *c, const char *name) {
  size_t n = strlen(name);
  for (int i = 0; i < c->nlist[OPT_HEADER]; i++) {
    const char *h = c->list[OPT_HEADER][i];
    if (strncasecmp(h, name, n) == 0 && (h[n] == ':' || h[n] == ';'))
      return true;
  }
  return false;
}

/* Configure easy for the request; *hdrs is for the caller to free.
 * Returns 0 or -1 (said why). */
static int setup(struct ctx *c, CURL *easy, struct curl_slist **hdrs,
                 struct deadline *dl) {
  const char *method = c->opt[OPT_REQUEST];
  CURLcode e = CURLE_OK;
#define SET(opt, val)                                                          \
  do {                                                                         \
    if (e == CURLE_OK)                                                         \
      e = curl_easy_setopt(easy, opt, val);                                    \
  } while (0)
  SET(CURLOPT_URL, c->args[1]);
#if CURL_AT_LEAST_VERSION(7, 85, 0)
  SET(CURLOPT_PROTOCOLS_STR, "http,https");
#else
  SET(CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  SET(CURLOPT_USERAGENT, PROG "/" THROTTLE_VERSION_STRING);
  SET(CURLOPT_NOSIGNAL, 1L);
  /* A POST, PUT or PATCH says how long its (empty) body is. */
  bool empty = !c->has_body && method != NULL &&
               (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
                strcmp(method, "PATCH") == 0);
  if (c->has_body || empty) {
    SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)c->body_len);
    SET(CURLOPT_POSTFIELDS, c->has_body ? c->body : "");
  }
  if (method != NULL && strcmp(method, "HEAD") == 0)
    SET(CURLOPT_NOBODY, 1L);
  else if (method != NULL)
    SET(CURLOPT_CUSTOMREQUEST, method);
  *hdrs = NULL;
  for (int i = 0; i < c->nlist[OPT_HEADER] && e == CURLE_OK; i++) {
    struct curl_slist *n = curl_slist_append(*hdrs, c->list[OPT_HEADER][i]);
    if (n == NULL)
      e = CURLE_OUT_OF_MEMORY;
    else
      *hdrs = n;
  }
  if (empty && !has_header(c, "Content-Type") && e == CURLE_OK) {
    /* No body, so no form-urlencoded type for it either. */
    struct curl_slist *n = curl_slist_append(*hdrs, "Content-Type:");
    if (n == NULL)
      e = CURLE_OUT_OF_MEMORY;
    else
      *hdrs = n;
  }
  SET(CURLOPT_HTTPHEADER, *hdrs);
  if (c->opt[OPT_COMPRESSED] != NULL)
    SET(CURLOPT_ACCEPT_ENCODING, ""); /* every coding libcurl decodes */
  if (c->opt[OPT_TIMEOUT] != NULL) {
    SET(CURLOPT_TIMEOUT_MS,
        (long)(c->timeout_ms < LONG_MAX ? c->timeout_ms : LONG_MAX));
    SET(CURLOPT_XFERINFOFUNCTION, progress);
    SET(CURLOPT_XFERINFODATA, dl);
    SET(CURLOPT_NOPROGRESS, 0L);
  } else {
    /* A server that never answers would hold the admission until its
     * lease lapses: each transfer is bounded by default. */
    SET(CURLOPT_TIMEOUT_MS, (long)TRANSFER_TIMEOUT_MS);
  }
#undef SET
  if (e != CURLE_OK) {
    ctl_say("http: cannot set up the request: %s", curl_easy_strerror(e));
    return -1;
  }
  return 0;
}

/* The library's line for each attempt, asked for with or without -v. */
struct log_state {
  struct ctx *c;
  const char *ktext;
};

/* A server's Retry-After beyond the segment's maximum delay is stored,
 * and waited for, as that maximum: said once (ctl_warn_max_delay()), at
 * the attempt that asked for it.  The library's line for that attempt is
 * the one place that tells, per attempt, what a published answer asked
 * for ("... published not-before +N ms (Retry-After)").  Rejected: the
 * result's retry_after after the call (the last answer's only, told after
 * the wait it was meant to explain) and reading Retry-After headers here
 * (which answers publish depends on the library's classification, which
 * this would repeat). */
static void note_clamp(struct log_state *s, const char *line) {
  const char *p = strstr(line, " not-before +");
  unsigned long long ms;
  int end = -1;
  if (p == NULL ||
      sscanf(p, " not-before +%llu ms (Retry-After)%n", &ms, &end) != 1 ||
      end < 0)
    return;
  char what[KEY_TEXT_MAX + 32], given[32];
  snprintf(what, sizeof what, "%s: the server's Retry-After", s->ktext);
  ctl_human_ms((int64_t)ms, true, given, sizeof given);
  (void)ctl_warn_max_delay(s->c, what, given, ms);
}

/* -v: the library's lines carry the key and the server's error code. */
static void log_line(void *userdata, const char *line) {
  struct log_state *s = userdata;
  if (s->c->opt[OPT_VERBOSE] != NULL) {
    fputs("throttle: ", stderr);
    ctl_text_put(stderr, line, strlen(line), false);
    fputc('\n', stderr);
  }
  note_clamp(s, line);
}

static int policy_setup(struct ctx *c, throttle_curl_policy_t *p,
                        struct sink *sink, struct log_state *log) {
  int rc = throttle_curl_policy_set_retries(p, c->retries);
  if (rc == 0)
    rc = throttle_curl_policy_set_class(p, c->cls);
  if (rc == 0 && c->opt[OPT_TIMEOUT] != NULL)
    rc = throttle_curl_policy_set_deadline(p, c->timeout_ms);
  if (rc == 0)
    rc = throttle_curl_policy_set_sink(p, sink_write, sink);
  if (rc == 0)
    rc = throttle_curl_policy_set_log(p, log_line, log);
  if (rc != 0)
    ctl_say("http: cannot set up the policy: %s", throttle_strerror(rc));
  return rc;
}

/* ---- reporting -------------------------------------------------------- */

/* The last answer or transport error: "409 CONFLICT: table 'x' already
 * exists", "503", "transport error: Couldn't connect to server". */
static void describe_last(const throttle_curl_result_t *r, char *buf,
                          size_t len) {
  char code[KEY_TEXT_MAX], msg[KEY_TEXT_MAX];
  long st = throttle_curl_result_http_status(r);
  if (throttle_curl_result_curl_code(r) != CURLE_OK) {
    int n = snprintf(buf, len, "transport error: %s",
                     throttle_curl_result_curl_error(r));
    if (st != 0 && n >= 0 && (size_t)n < len)
      snprintf(buf + n, len - (size_t)n, " (after HTTP %ld)", st);
  } else if (st != 0) {
    /* The server's words, made safe for a terminal. */
    ctl_key_text(throttle_curl_result_error_code(r), code, sizeof code);
    ctl_key_text(throttle_curl_result_error_message(r), msg, sizeof msg);
    snprintf(buf, len, "%ld%s%s%s%s", st, *code ? " " : "", code,
             *msg ? ": " : "", msg);
  } else {
    snprintf(buf, len, "no request sent");
  }
}

/* "1 attempt", "3 attempts; retry budget spent; retry after 1.0s": the
 * last is the server's last Retry-After, or what was left of the key's
 * back-off when the call gave up waiting for it. */
static void describe_tail(const throttle_curl_result_t *r, const char *why,
                          char *buf, size_t len) {
  unsigned n = throttle_curl_result_attempts(r);
  int k = snprintf(buf, len, "%u attempt%s", n, n == 1 ? "" : "s");
  if (why != NULL && k >= 0 && (size_t)k < len)
    k += snprintf(buf + k, len - (size_t)k, "; %s", why);
  uint64_t ra = throttle_curl_result_retry_after(r);
  char t[32];
  if (ra > 0 && k >= 0 && (size_t)k < len)
    snprintf(buf + k, len - (size_t)k, "; retry after %s",
             ctl_human_ms((int64_t)ra, true, t, sizeof t));
}

/* Why a call gave up. */
static const char *gave_up_why(const struct ctx *c,
                               const throttle_curl_result_t *r,
                               const struct deadline *dl) {
  if (dl->hit)
    return "the --timeout deadline passed during the transfer";
  if (throttle_curl_result_error(r) == THROTTLE_ETIMEDOUT)
    return "not admitted before the --timeout deadline";
  if (throttle_curl_result_attempts(r) > c->retries)
    return "retry budget spent";
  return "the next attempt would pass the --timeout deadline";
}

/* With -v, the last non-2xx body as it came (from an earlier attempt when
 * the last one failed before its answer). */
static void print_body(const char *ktext, const throttle_curl_result_t *r) {
  size_t n = 0;
  const char *b = throttle_curl_result_body(r, &n);
  char st[32] = "";
  if (n == 0)
    return;
  if (throttle_curl_result_curl_code(r) == CURLE_OK)
    snprintf(st, sizeof st, "HTTP %ld, ", throttle_curl_result_http_status(r));
  ctl_say("%s: body of the last answer (%s%zu bytes%s):", ktext, st, n,
          n >= THROTTLE_CURL_BODY_MAX ? ", cut" : "");
  ctl_text_put(stderr, b, n, true);
  if (b[n - 1] != '\n')
    fputc('\n', stderr);
}

/* The exit status for r, with a line on stderr for anything but OK. */
static int report(struct ctx *c, const char *ktext,
                  const throttle_curl_result_t *r, const struct sink *sink,
                  const struct deadline *dl) {
  char last[3 * KEY_TEXT_MAX], tail[256];
  throttle_curl_status_t st = throttle_curl_result_status(r);
  if (st != THROTTLE_CURL_OK && st != THROTTLE_CURL_ERROR &&
      c->opt[OPT_VERBOSE] != NULL)
    print_body(ktext, r);
  describe_last(r, last, sizeof last);
  switch (st) {
  case THROTTLE_CURL_OK:
    if (sink->err != 0) {
      ctl_say("%s: cannot write %s: %s", ktext,
              sink->path ? sink->path : "standard output", strerror(sink->err));
      return XIT_FAIL;
    }
    return XIT_OK;
  case THROTTLE_CURL_PERMANENT:
    describe_tail(r, NULL, tail, sizeof tail);
    ctl_say("%s: permanent: %s (%s)", ktext, last, tail);
    if (c->opt[OPT_VERBOSE] == NULL && *throttle_curl_result_error_code(r) == 0)
      ctl_say("%s: -v prints the answer's body", ktext);
    return XIT_FAIL;
  case THROTTLE_CURL_GAVE_UP:
    describe_tail(r, gave_up_why(c, r, dl), tail, sizeof tail);
    ctl_say("%s: gave up, still transient: %s (%s)", ktext, last, tail);
    return XIT_TEMP;
  case THROTTLE_CURL_TRANSPORT:
    if (dl->hit) { /* the progress callback ended it */
      describe_tail(r, NULL, tail, sizeof tail);
      ctl_say("%s: gave up, still transient: the transfer was cut at the "
              "--timeout deadline (%s)",
              ktext, tail);
      return XIT_TEMP;
    }
    if (throttle_curl_result_transient(r)) {
      /* Refused, reset, timed out: re-sent within the budget; the next
       * run may get through. */
      describe_tail(r, gave_up_why(c, r, dl), tail, sizeof tail);
      ctl_say("%s: gave up, still transient: %s (%s)", ktext, last, tail);
      return XIT_TEMP;
    }
    describe_tail(r, NULL, tail, sizeof tail);
    if (sink->err != 0)
      ctl_say("%s: failed: cannot write %s: %s (%s)", ktext,
              sink->path ? sink->path : "standard output", strerror(sink->err),
              tail);
    else
      ctl_say("%s: failed: %s (%s)", ktext, last, tail);
    return XIT_FAIL;
  case THROTTLE_CURL_CANCELED:
    describe_tail(r, NULL, tail, sizeof tail);
    ctl_say("%s: canceled while waiting for admission (%s)", ktext, tail);
    return XIT_FAIL;
  case THROTTLE_CURL_ERROR:
    break;
  }
  return ctl_lib_fail(c, throttle_curl_result_error(r));
}

/* Fail open: say so when a request went out without admission. */
static void warn_unadmitted(struct ctx *c, const char *ktext,
                            const throttle_curl_result_t *r) {
  unsigned n = throttle_curl_result_unadmitted(r);
  if (throttle_curl_result_admitted(r))
    return;
  int err = throttle_curl_result_error(r);
  ctl_say("warning: %s: %u request%s sent without admission (%s: %s); "
          "back-off held within this process only",
          ktext, n, n == 1 ? "" : "s", throttle_err_name(err),
          *throttle_errmsg(c->h) ? throttle_errmsg(c->h)
                                 : throttle_strerror(err));
}

int ctl_cmd_http(struct ctx *c) {
  const char *key = c->args[0];
  char ktext[KEY_TEXT_MAX];
  ctl_key_text(key, ktext, sizeof ktext);
  /* Saturating: a --timeout too far to reach is none, never one that
   * has passed (which would cut the first transfer at once). */
  uint64_t start = now_ms();
  struct deadline dl = {.at = c->timeout_ms >= UINT64_MAX - start
                                  ? UINT64_MAX
                                  : start + c->timeout_ms};
  struct sink sink = {.fd = -1};
  if (sink_open(&sink, c->opt[OPT_OUTPUT]) != 0)
    return XIT_FAIL;
  sink_guard();
  /* The application owns libcurl's global state. */
  CURLcode gc = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (gc != CURLE_OK) {
    ctl_say("http: cannot initialise libcurl: %s", curl_easy_strerror(gc));
    sink_close(&sink, false);
    return XIT_FAIL;
  }
  int status = XIT_FAIL;
  throttle_curl_policy_t *p = NULL;
  throttle_curl_result_t *r = NULL;
  struct curl_slist *hdrs = NULL;
  CURL *easy = curl_easy_init();
  if (easy == NULL) {
    ctl_say("http: cannot create a libcurl handle");
    goto out;
  }
  if (throttle_curl_policy_new(&p) != 0) {
    ctl_say("out of memory");
    goto out;
  }
  struct log_state log = {c, ktext};
  if (setup(c, easy, &hdrs, &dl) != 0 ||
      policy_setup(c, p, &sink, &log) != 0)
    goto out;
  if (c->opt[OPT_MAX_PARALLEL] != NULL) {
    int rc = throttle_set_max_parallel(c->h, key, c->max_parallel);
    if (rc != 0)
      ctl_say("warning: %s: cannot set the cap: %s", ktext,
              *throttle_errmsg(c->h) ? throttle_errmsg(c->h)
                                     : throttle_strerror(rc));
  }
  ctl_apply_publish(c); /* where 409, 429, 503 back-offs go */
  if (c->opt[OPT_VERBOSE] != NULL)
    ctl_say("%s: %s %s, %zu-byte body, class %s, --retries %u", ktext,
            c->opt[OPT_REQUEST] ? c->opt[OPT_REQUEST]
            : c->has_body       ? "POST"
                                : "GET",
            c->args[1], c->body_len, ctl_class_name(c->cls), c->retries);
  int rc = throttle_curl_perform(c->h, easy, key, p, &r);
  if (r == NULL) {
    ctl_say("%s: %s", ktext, throttle_strerror(rc));
    goto out;
  }
  fflush(stdout);
  bool ok = throttle_curl_result_status(r) == THROTTLE_CURL_OK;
  sink_close(&sink, ok);
  warn_unadmitted(c, ktext, r);
  status = report(c, ktext, r, &sink, &dl);
out:
  sink_close(&sink, false);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
  curl_easy_cleanup(easy);
  curl_slist_free_all(hdrs);
  curl_global_cleanup();
  return status;
}
