/* SPDX-License-Identifier: MIT */
/*
 * http_perform.c — throttle_curl_perform(): admit, send, classify, report,
 * retry; and the result object it hands back.
 *
 * This file uses only the public core API (throttle_enter/leave and
 * friends) so that libthrottle-curl.so can sit on top of libthrottle.so,
 * whose internals are hidden.  Hence its own clock, sleep and random
 * source below rather than the core's.
 */
#include "http_internal.h"
#include "core/rng.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#if !CURL_AT_LEAST_VERSION(7, 84, 0)
#error "libthrottle-curl needs libcurl 7.84 or later (curl_easy_header)"
#endif

/* A local wait asked for by a Retry-After on an answer that is not
 * published (408, 5xx) is honoured up to this much: the core's default
 * maximum delay.  Published delays are clamped by the core itself. */
#define MAX_LOCAL_WAIT_MS UINT64_C(900000)

/* What libcurl counts for an empty upload: nothing, or the last chunk of
 * a chunked one. */
#define EMPTY_UPLOAD 5

struct throttle_curl_result {
  throttle_curl_status_t status;
  unsigned attempts;
  long http_status;
  throttle_outcome_t outcome;
  uint64_t retry_after_ms;
  CURLcode curl_code;
  int error;
  int shared;
  unsigned unadmitted; /* attempts sent without admission (fail open) */
  uint64_t elapsed_ms;
  char code[THROTTLE__CODE_MAX + 1];
  char message[THROTTLE__MSG_MAX];
  char *body; /* THROTTLE_CURL_BODY_MAX + 1 bytes, or NULL */
  size_t body_len;
};

/* ---- clock, sleep, random ------------------------------------------------ */

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(uint64_t ms) {
  uint64_t end = mono_ms() + ms, now;
  while ((now = mono_ms()) < end) {
    uint64_t left = end - now;
    struct timespec ts = {(time_t)(left / 1000u),
                          (long)(left % 1000u) * 1000000L};
    nanosleep(&ts, NULL); /* EINTR: loop on the clock, not the remainder */
  }
}

/* Per thread, like the core's (rng.h), and per process: fork() copies the
 * state, and forked loaders that drew the same jitter would wake together,
 * so a state seeded by another process is seeded again. */
uint64_t throttle__http_random(void) {
  static __thread uint64_t s;
  static __thread pid_t owner;
  pid_t self = getpid();
  if (owner != self) {
    s = 0;
    owner = self;
  }
  return throttle__rng_next(&s);
}

/* Full jitter: uniform in [0, min(cap, base * 2^k)]. */
static uint64_t full_jitter(const throttle_curl_policy_t *p, unsigned k) {
  uint64_t top = p->backoff_base_ms;
  for (unsigned i = 0; i < k && top < p->backoff_cap_ms; i++)
    top = top > UINT64_MAX / 2 ? UINT64_MAX : top * 2;
  if (top > p->backoff_cap_ms)
    top = p->backoff_cap_ms;
  return throttle__http_random() % (top + 1);
}

/* ---- logging -------------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static void
say(const throttle_curl_policy_t *p, const char *fmt, ...) {
  if (p->log == NULL)
    return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  /* Initialised just above: a false positive of clang 14's valist check. */
  vsnprintf(line, sizeof line, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
  va_end(ap);
  p->log(p->log_data, line);
}

static const char *outcome_name(throttle_outcome_t o) {
  switch (o) {
  case THROTTLE_OUTCOME_OK:
    return "ok";
  case THROTTLE_OUTCOME_LOCKED:
    return "locked";
  case THROTTLE_OUTCOME_RATE_LIMITED:
    return "rate limited";
  case THROTTLE_OUTCOME_UNAVAILABLE:
    return "unavailable";
  case THROTTLE_OUTCOME_PERMANENT:
    return "permanent";
  case THROTTLE_OUTCOME_FAILED:
    return "failed";
  case THROTTLE_OUTCOME_ABANDONED:
    return "abandoned";
  }
  return "?";
}

/* ---- the body tee --------------------------------------------------------- */

struct tee {
  CURL *easy;
  const throttle_curl_policy_t *p;
  char *buf; /* the first THROTTLE_CURL_BODY_MAX bytes of a non-2xx body */
  size_t len;
  int oom; /* buf could not be allocated: the body reads as empty */
};

/* By the time libcurl hands over body bytes the status line is in, so the
 * status decides: a 2xx body goes to the application's sink, any other is
 * kept (its prefix) for classification and never reaches the sink. */
static size_t tee_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
  struct tee *t = userdata;
  size_t n = size * nmemb; /* libcurl passes size 1 */
  long status = 0;
  curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status <= 299) {
    size_t r;
    if (t->p->sink != NULL) {
      r = t->p->sink(ptr, size, nmemb, t->p->sink_data);
      if (r == CURL_WRITEFUNC_PAUSE)
        r = 0; /* pausing inside curl_easy_perform() is not supported */
    } else {
      FILE *f = t->p->sink_data != NULL ? t->p->sink_data : stdout;
      r = fwrite(ptr, size, nmemb, f);
    }
    return r;
  }
  if (t->buf == NULL && !t->oom) {
    t->buf = throttle__malloc(THROTTLE_CURL_BODY_MAX + 1);
    t->oom = t->buf == NULL;
  }
  if (t->buf != NULL && t->len < THROTTLE_CURL_BODY_MAX) {
    size_t take = n < THROTTLE_CURL_BODY_MAX - t->len
                      ? n
                      : THROTTLE_CURL_BODY_MAX - t->len;
    memcpy(t->buf + t->len, ptr, take);
    t->len += take;
  }
  return n;
}

/* ---- reading the answer's headers ---------------------------------------- */

/* "gzip" and "deflate" bodies of answers the classifier must read.  libcurl
 * decodes a body only when CURLOPT_ACCEPT_ENCODING is set, which cannot be
 * read back, while an application may ask for an encoding with its own
 * Accept-Encoding header; a compressed lock answer would then read as a
 * 409 without a code.  So the kept prefix of a non-2xx body is inflated
 * here when it is still compressed (its magic bytes say so: libcurl may
 * have decoded it already).  A body cut by THROTTLE_CURL_BODY_MAX inflates
 * as far as it goes.  Other codings (br, zstd) stay as they are: their
 * code reads as unreadable. */
static void inflate_body(CURL *easy, struct tee *t) {
  struct curl_header *h;
  if (t->buf == NULL || t->len < 2 ||
      curl_easy_header(easy, "Content-Encoding", 0, CURLH_HEADER, -1, &h) !=
          CURLHE_OK)
    return;
  const unsigned char *b = (const unsigned char *)t->buf;
  int gzip = b[0] == 0x1f && b[1] == 0x8b;
  int zlib = (b[0] & 0x0f) == 8 && ((b[0] << 8) | b[1]) % 31 == 0;
  if ((!gzip && !zlib) || (strcasestr(h->value, "gzip") == NULL &&
                           strcasestr(h->value, "deflate") == NULL))
    return;
  char *out = throttle__malloc(THROTTLE_CURL_BODY_MAX + 1);
  if (out == NULL)
    return;
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 32 + MAX_WBITS) != Z_OK) { /* 32: gzip or zlib */
    throttle__free(out);
    return;
  }
  z.next_in = (unsigned char *)t->buf;
  z.avail_in = (uInt)t->len;
  z.next_out = (unsigned char *)out;
  z.avail_out = THROTTLE_CURL_BODY_MAX;
  int zrc = inflate(&z, Z_SYNC_FLUSH);
  size_t n = THROTTLE_CURL_BODY_MAX - z.avail_out;
  inflateEnd(&z);
  if (zrc != Z_OK && zrc != Z_STREAM_END && zrc != Z_BUF_ERROR) {
    throttle__free(out);
    return;
  }
  throttle__free(t->buf);
  t->buf = out;
  t->len = n;
}

static int header_value(CURL *easy, const char *name, const char **value) {
  struct curl_header *h;
  if (curl_easy_header(easy, name, 0, CURLH_HEADER, -1, &h) != CURLHE_OK)
    return 0;
  if (h->amount > 1)
    return -1; /* several fields: no single value to trust */
  *value = h->value;
  return 1;
}

/* The answer's Retry-After in ms into *ms; 0 when there is none usable.
 * Dates are read against the answer's Date, so that a skewed local clock
 * does not shorten or stretch them.  A Retry-After sent more than once, or
 * as a list, counts with its largest readable value: publishing less than
 * any value the server sent would be early (I1). */
static int retry_after(CURL *easy, uint64_t *ms) {
  const char *date;
  struct curl_header *h;
  if (curl_easy_header(easy, "Retry-After", 0, CURLH_HEADER, -1, &h) !=
      CURLHE_OK)
    return 0;
  time_t now = time(NULL), server;
  if (header_value(easy, "Date", &date) == 1) {
    const char *s = date, *e = date + strlen(date);
    while (s < e && (*s == ' ' || *s == '\t'))
      s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
      e--;
    if (throttle__http_date(s, (size_t)(e - s), now, &server) == 0 &&
        server > 0)
      now = server;
  }
  size_t amount = h->amount;
  int found = 0;
  *ms = 0;
  for (size_t i = 0; i < amount; i++)
    if (curl_easy_header(easy, "Retry-After", i, CURLH_HEADER, -1, &h) ==
        CURLHE_OK)
      found += throttle__retry_after_max(h->value, now, ms);
  return found > 0;
}

/* Transport errors worth sending again: the network or the server's end of
 * the connection failed.  Everything else (bad URL or option, TLS
 * verification, the sink refusing data, a failed rewind, out of memory,
 * too many redirects, ...) fails the same way next time. */
static int transient_curl(CURLcode cc) {
  switch (cc) {
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_CONNECT:
  case CURLE_HTTP2:
  case CURLE_PARTIAL_FILE:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_GOT_NOTHING:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_HTTP2_STREAM:
  case CURLE_HTTP3:
  case CURLE_QUIC_CONNECT_ERROR:
  case CURLE_PROXY:
    return 1;
  default:
    return 0;
  }
}

/* Errors of throttle_enter() that say the segment failed rather than the
 * request or the key: the call then fails open (DESIGN I7) and sends
 * without admission.  The others end the call: a timeout or a cancel is
 * the answer the caller asked for, and a bad key or no memory fails the
 * same way without the throttle. */
static int segment_failed(int erc) {
  return erc != 0 && erc != THROTTLE_ETIMEDOUT && erc != THROTTLE_ECANCELED &&
         erc != THROTTLE_EINVAL && erc != THROTTLE_EKEY &&
         erc != THROTTLE_ENOMEM;
}

/* throttle_leave() for an admitted attempt; nothing for one sent without
 * admission (ticket NULL), which has no slot to free and nowhere to
 * publish. */
static int report(throttle_t *h, throttle_ticket_t *ticket,
                  throttle_outcome_t o, uint64_t retry_after_ms) {
  return ticket != NULL ? throttle_leave(h, ticket, o, retry_after_ms) : 0;
}

/* ---- the result ------------------------------------------------------------ */

static void take_body(throttle_curl_result_t *r, struct tee *t) {
  throttle__free(r->body);
  r->body = t->buf;
  r->body_len = t->buf != NULL ? t->len : 0;
  if (r->body != NULL)
    r->body[r->body_len] = 0;
  t->buf = NULL;
  t->len = 0;
  t->oom = 0;
}

static void finish(throttle_curl_result_t *r, throttle_curl_status_t st,
                   uint64_t start) {
  r->status = st;
  r->elapsed_ms = mono_ms() - start;
}

/* ---- the loop ---------------------------------------------------------------- */

enum step { STEP_DONE, STEP_AGAIN };

/* What one throttle_curl_perform() call carries from attempt to attempt. */
struct call {
  throttle_t *h;
  const char *key;
  CURL *easy;
  const throttle_curl_policy_t *p;
  struct tee *t;
  throttle_curl_result_t *r;
  uint64_t start, deadline; /* mono_ms(); deadline UINT64_MAX: none */
  unsigned local;           /* consecutive failures backing off locally */
  int skip_segment;         /* the segment is not asked again this call */
  curl_off_t uploaded;      /* most bytes an attempt uploaded */
};

/* What to do after a transient attempt: give up at the budget or when the
 * local wait would end past the deadline; otherwise wait and go again.
 * give_up is how the call ends then: GAVE_UP after an answer, TRANSPORT
 * after a transport error (a server that never answered is no "later"
 * that a caller should queue again for). */
static enum step next_or_give_up(struct call *c, uint64_t wait_ms,
                                 throttle_curl_status_t give_up) {
  const throttle_curl_policy_t *p = c->p;
  throttle_curl_result_t *r = c->r;
  if (r->attempts > p->retries) {
    say(p, "giving up: %u attempts, retry budget %u spent", r->attempts,
        p->retries);
    finish(r, give_up, c->start);
    return STEP_DONE;
  }
  if (wait_ms > 0) {
    uint64_t now = mono_ms();
    if (c->deadline != UINT64_MAX &&
        (now >= c->deadline || c->deadline - now < wait_ms)) {
      say(p, "giving up: a %llu ms back-off would pass the deadline",
          (unsigned long long)wait_ms);
      finish(r, give_up, c->start);
      return STEP_DONE;
    }
    say(p, "backing off locally for %llu ms", (unsigned long long)wait_ms);
    sleep_ms(wait_ms);
  }
  return STEP_AGAIN;
}

static uint64_t local_cap(uint64_t ms) {
  return ms < MAX_LOCAL_WAIT_MS ? ms : MAX_LOCAL_WAIT_MS;
}

/* A transfer that failed before any status arrived (or after a 2xx, or
 * one libcurl cannot mend): reported FAILED, retried with local back-off
 * when re-sending may mend it. */
static enum step transport_error(struct call *c, throttle_ticket_t *ticket,
                                 unsigned n, CURLcode cc, long status) {
  const throttle_curl_policy_t *p = c->p;
  int again = transient_curl(cc) && !(status >= 200 && status <= 299);
  c->r->outcome = THROTTLE_OUTCOME_FAILED;
  report(c->h, ticket, THROTTLE_OUTCOME_FAILED, 0);
  c->t->len = 0;
  say(p, "attempt %u: transport error %d: %s (HTTP status %ld)%s", n, (int)cc,
      curl_easy_strerror(cc), status, again ? "" : ", not retried");
  if (!again) {
    finish(c->r, THROTTLE_CURL_TRANSPORT, c->start);
    return STEP_DONE;
  }
  return next_or_give_up(c, full_jitter(p, c->local++),
                         THROTTLE_CURL_TRANSPORT);
}

/* What the server said of a refusal just published, kept beside it for
 * the operator (throttle_note_refusal): the Retry-After field as sent (its
 * first, when sent more than once).  A failure to keep it changes nothing
 * of the call: the words only explain the back-off. */
static void note_refusal(const struct call *c, long status) {
  struct curl_header *hd;
  const char *ra = NULL;
  if (curl_easy_header(c->easy, "Retry-After", 0, CURLH_HEADER, -1, &hd) ==
      CURLHE_OK)
    ra = hd->value;
  if (throttle_note_refusal(c->h, c->key, (int)status, c->r->code,
                            c->r->message, ra) != 0)
    say(c->p, "keeping what the server said failed: %s",
        throttle_errmsg(c->h));
}

/* One attempt: send, classify, leave.  ticket is NULL for an attempt sent
 * without admission (fail open): its back-off is then slept here instead
 * of published. */
static enum step attempt(struct call *c, throttle_ticket_t *ticket) {
  const throttle_curl_policy_t *p = c->p;
  throttle_curl_result_t *r = c->r;
  struct tee *t = c->t;
  unsigned n = ++r->attempts;
  curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, tee_write);
  curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, t);
  CURLcode cc = curl_easy_perform(c->easy);
  long status = 0;
  curl_off_t up = 0;
  curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(c->easy, CURLINFO_SIZE_UPLOAD_T, &up);
  r->curl_code = cc;
  r->http_status = status;
  /* A streamed upload sent again without a rewind goes out empty, and the
   * server may well accept the empty request: that must not read as ok.
   * libcurl counts what it wrote, chunked framing included, so "empty" is
   * at most the 5 bytes of an empty chunked body ("0\r\n\r\n").  Only a
   * 2xx answer to it is refused below: a server may answer an error before
   * reading a body, and that answer is classified as any other. */
  int empty_retry = n > 1 && c->uploaded > EMPTY_UPLOAD && up <= EMPTY_UPLOAD;
  if (up > c->uploaded)
    c->uploaded = up;

  /* A transfer that failed after its status and headers arrived is still
   * an answer, for what arrived of it: a 429 with Retry-After: 10 whose
   * body was cut short asked for 10 s all the same (I1, I3).  Only a 2xx
   * cut short is a transport error (the work may be done, its result is
   * not whole), and one without a status never was an answer.
   * CURLE_HTTP_RETURNED_ERROR (CURLOPT_FAILONERROR, turned off above, set
   * again by a callback) is such an answer too, only without its body. */
  if (cc != CURLE_OK && (status < 100 || status > 999 ||
                         (status >= 200 && status <= 299)))
    return transport_error(c, ticket, n, cc, status);
  if (cc != CURLE_OK)
    say(p, "attempt %u: transport error %d after HTTP %ld: %s; classifying "
           "what arrived", n, (int)cc, status, curl_easy_strerror(cc));

  inflate_body(c->easy, t);
  throttle_outcome_t o;
  int crc = throttle__classify(p, status, t->buf, t->buf != NULL ? t->len : 0,
                               &o, r->code, sizeof r->code, r->message,
                               sizeof r->message);
  uint64_t ra = 0;
  int have_ra = retry_after(c->easy, &ra);
  if (status == 409 &&
      ((o == THROTTLE_OUTCOME_PERMANENT &&
        (crc == THROTTLE_ENOMEM || (r->code[0] == 0 && have_ra))) ||
       (o == THROTTLE_OUTCOME_FAILED && have_ra))) {
    /* No code could be read (compressed in a coding not decoded here, not
     * JSON, cut short, out of memory) but the server said when to come
     * back: that is no final conflict, and what it said is published. */
    o = crc == THROTTLE_ENOMEM && !have_ra ? THROTTLE_OUTCOME_FAILED
                                           : THROTTLE_OUTCOME_LOCKED;
    say(p, "attempt %u: HTTP 409 without a readable code but with "
           "Retry-After: taken as a lock", n);
  }
  r->outcome = o;
  uint64_t publish = 0;
  if (o == THROTTLE_OUTCOME_LOCKED || o == THROTTLE_OUTCOME_RATE_LIMITED ||
      o == THROTTLE_OUTCOME_UNAVAILABLE) {
    /* throttle_leave() reads a delay of 0 as "no Retry-After: use the
     * default" (5 s), but "Retry-After: 0" means "now".  The nearest
     * delay to now that is not 0 is 1 ms: published, it still closes the
     * key long enough for one probe to go first (I3) and costs nothing. */
    publish = have_ra ? (ra > 0 ? ra : 1) : p->default_delay_ms;
    r->retry_after_ms = publish;
  } else if (o == THROTTLE_OUTCOME_FAILED && have_ra) {
    r->retry_after_ms = ra;
  }
  int lrc = report(c->h, ticket, o, publish);
  if (o == THROTTLE_OUTCOME_OK)
    r->code[0] = r->message[0] = 0;
  take_body(r, t); /* empty for a 2xx: its body went to the sink */
  /* Published only when there was a slot to report to and the report
   * worked; otherwise this process alone honours it, below. */
  int published = ticket != NULL && lrc == 0;
  if (published && publish)
    note_refusal(c, status);
  if (publish)
    say(p, "attempt %u: HTTP %ld%s%s -> %s; %s not-before +%llu ms (%s)", n,
        status, r->code[0] ? " " : "", r->code, outcome_name(o),
        published ? "published" : "not published, so only this process's",
        (unsigned long long)publish,
        have_ra ? "Retry-After" : "no usable Retry-After: default");
  else
    say(p, "attempt %u: HTTP %ld%s%s -> %s", n, status,
        r->code[0] ? " " : "", r->code, outcome_name(o));
  if (lrc != 0) {
    say(p, "attempt %u: reporting the outcome failed: %s: %s", n,
        throttle_strerror(lrc), throttle_errmsg(c->h));
    /* As when admission fails so (fail open): each further try would
     * cost the lock timeout, and the slot the failed report could not
     * free stays held until its lease lapses, so waiting for admission
     * again could wait for that. */
    if (lrc == THROTTLE_ELOCKTIMEOUT || lrc == THROTTLE_ECORRUPT) {
      c->skip_segment = 1;
      r->error = lrc;
    }
  }

  switch (o) {
  case THROTTLE_OUTCOME_OK:
    if (empty_retry) {
      say(p, "attempt %u: the upload sent 0 bytes where an earlier attempt "
             "sent %lld: it was not rewound (throttle_curl_policy_set_rewind)",
          n, (long long)c->uploaded);
      r->curl_code = CURLE_SEND_FAIL_REWIND;
      finish(r, THROTTLE_CURL_TRANSPORT, c->start);
      return STEP_DONE;
    }
    finish(r, THROTTLE_CURL_OK, c->start);
    return STEP_DONE;
  case THROTTLE_OUTCOME_PERMANENT:
    finish(r, THROTTLE_CURL_PERMANENT, c->start);
    return STEP_DONE;
  case THROTTLE_OUTCOME_FAILED: {
    uint64_t wait = have_ra ? local_cap(ra) : full_jitter(p, c->local);
    c->local++;
    return next_or_give_up(c, wait, THROTTLE_CURL_GAVE_UP);
  }
  default:
    /* Published: the next throttle_enter() waits for the not-before.  Not
     * published (sent without admission, or the report failed: a lock
     * timeout, a damaged segment) nobody would make this process wait, so
     * it waits here, as long as the server said. */
    c->local = 0;
    return next_or_give_up(c, published ? 0 : local_cap(publish),
                           THROTTLE_CURL_GAVE_UP);
  }
}

THROTTLE_EXTERN int throttle_curl_perform(throttle_t *h, CURL *easy,
                                          const char *key,
                                          const throttle_curl_policy_t *policy,
                                          throttle_curl_result_t **result) {
  if (result != NULL)
    *result = NULL;
  if (h == NULL || easy == NULL || result == NULL)
    return THROTTLE_EINVAL;
  const throttle_curl_policy_t *p =
      policy != NULL ? policy : throttle__curl_policy_default();
  throttle_curl_result_t *r = throttle__calloc(1, sizeof *r);
  if (r == NULL)
    return THROTTLE_ENOMEM;
  r->shared = throttle_is_shared(h);
  uint64_t start = mono_ms();
  /* Saturating: a deadline too far to reach is no deadline, never one in
   * the past (which would give up before the first attempt). */
  uint64_t deadline = p->deadline_ms >= UINT64_MAX - start
                          ? UINT64_MAX
                          : start + p->deadline_ms;
  struct tee t = {.easy = easy, .p = p};
  struct call c = {.h = h, .key = key, .easy = easy, .p = p, .t = &t, .r = r,
                   .start = start, .deadline = deadline};
  /* Every answer is classified from its status and body, so libcurl must
   * not turn a 409 into an error and drop the body. */
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 0L);
  int rc = 0;
  /* A segment that timed out its mutex or is corrupt is not asked again
   * during this call: each throttle_enter() would cost the lock timeout
   * and fail the same way.  A full table is asked again at each attempt,
   * since idle keys become evictable as their back-offs pass. */
  if (!r->shared)
    say(p, "no shared segment: back-off holds within this process only (%s)",
        throttle_errmsg(h));

  for (;;) {
    uint64_t now = mono_ms(), timeout = THROTTLE_FOREVER;
    if (deadline != UINT64_MAX)
      timeout = deadline > now ? deadline - now : 0;
    throttle_ticket_t *ticket = NULL;
    int erc = timeout == 0  ? THROTTLE_ETIMEDOUT
              : c.skip_segment ? r->error
                             : throttle_enter(h, key, p->cls, timeout, &ticket);
    if (erc == THROTTLE_ETIMEDOUT) {
      uint64_t left = 0;
      if (throttle_remaining(h, key, &left) == 0 && left > 0)
        r->retry_after_ms = left;
      say(p, "giving up: not admitted before the deadline");
      r->error = erc;
      finish(r, THROTTLE_CURL_GAVE_UP, start);
      break;
    }
    if (erc == THROTTLE_ECANCELED) {
      say(p, "canceled while waiting for admission");
      r->error = erc;
      finish(r, THROTTLE_CURL_CANCELED, start);
      break;
    }
    if (erc != 0 && !segment_failed(erc)) {
      say(p, "admission failed: %s: %s", throttle_strerror(erc),
          throttle_errmsg(h));
      r->error = rc = erc;
      finish(r, THROTTLE_CURL_ERROR, start);
      break;
    }
    if (erc != 0) {
      /* Fail open (I7): the throttle must never become the outage. */
      if (!c.skip_segment)
        say(p, "attempt %u: admission failed: %s: %s; sending without "
               "admission, back-off held within this process",
            r->attempts + 1, throttle_err_name(erc), throttle_errmsg(h));
      else
        say(p, "attempt %u: sending without admission (%s)", r->attempts + 1,
            throttle_err_name(erc));
      r->error = erc;
      r->unadmitted++;
      c.skip_segment =
          erc == THROTTLE_ELOCKTIMEOUT || erc == THROTTLE_ECORRUPT;
    } else {
      say(p, "attempt %u: %s admitted after %llu ms%s", r->attempts + 1, key,
          (unsigned long long)(mono_ms() - now),
          throttle_ticket_is_probe(ticket) ? " as the probe" : "");
    }
    if (r->attempts > 0 && p->rewind != NULL &&
        p->rewind(p->rewind_data, 0, SEEK_SET) != CURL_SEEKFUNC_OK) {
      report(h, ticket, THROTTLE_OUTCOME_ABANDONED, 0);
      say(p, "the upload could not be rewound; not re-sent");
      r->curl_code = CURLE_SEND_FAIL_REWIND;
      finish(r, THROTTLE_CURL_TRANSPORT, start);
      break;
    }
    if (attempt(&c, ticket) == STEP_DONE)
      break;
  }

  throttle__free(t.buf);
  /* Leave the handle writing where the application asked. */
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, p->sink);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA,
                   p->sink_data != NULL || p->sink != NULL ? p->sink_data
                                                           : (void *)stdout);
  say(p, "%s after %u attempt%s in %llu ms", throttle_curl_status_name(r->status),
      r->attempts, r->attempts == 1 ? "" : "s",
      (unsigned long long)r->elapsed_ms);
  *result = r;
  return rc;
}

/* ---- accessors ------------------------------------------------------------- */

THROTTLE_EXTERN const char *throttle_curl_status_name(throttle_curl_status_t s) {
  switch (s) {
  case THROTTLE_CURL_OK:
    return "ok";
  case THROTTLE_CURL_PERMANENT:
    return "permanent";
  case THROTTLE_CURL_GAVE_UP:
    return "gave_up";
  case THROTTLE_CURL_TRANSPORT:
    return "transport";
  case THROTTLE_CURL_CANCELED:
    return "canceled";
  case THROTTLE_CURL_ERROR:
    return "error";
  }
  return "unknown";
}

THROTTLE_EXTERN void throttle_curl_result_free(throttle_curl_result_t *r) {
  if (r == NULL)
    return;
  throttle__free(r->body);
  throttle__free(r);
}

THROTTLE_EXTERN throttle_curl_status_t
throttle_curl_result_status(const throttle_curl_result_t *r) {
  return r != NULL ? r->status : THROTTLE_CURL_OK;
}

THROTTLE_EXTERN int
throttle_curl_result_transient(const throttle_curl_result_t *r) {
  if (r == NULL)
    return 0;
  /* A transport error the loop re-sent for (the network or the server's
   * end failed) ran out of budget or time, not out of hope: a later call
   * may get through.  One it did not re-send fails the same way again. */
  if (r->status == THROTTLE_CURL_TRANSPORT)
    return transient_curl(r->curl_code) &&
           !(r->http_status >= 200 && r->http_status <= 299);
  return r->status == THROTTLE_CURL_GAVE_UP ||
         r->status == THROTTLE_CURL_CANCELED;
}

THROTTLE_EXTERN unsigned
throttle_curl_result_attempts(const throttle_curl_result_t *r) {
  return r != NULL ? r->attempts : 0;
}

THROTTLE_EXTERN long
throttle_curl_result_http_status(const throttle_curl_result_t *r) {
  return r != NULL ? r->http_status : 0;
}

THROTTLE_EXTERN throttle_outcome_t
throttle_curl_result_outcome(const throttle_curl_result_t *r) {
  return r != NULL ? r->outcome : THROTTLE_OUTCOME_OK;
}

THROTTLE_EXTERN uint64_t
throttle_curl_result_retry_after(const throttle_curl_result_t *r) {
  return r != NULL ? r->retry_after_ms : 0;
}

THROTTLE_EXTERN CURLcode
throttle_curl_result_curl_code(const throttle_curl_result_t *r) {
  return r != NULL ? r->curl_code : CURLE_OK;
}

THROTTLE_EXTERN const char *
throttle_curl_result_curl_error(const throttle_curl_result_t *r) {
  if (r == NULL || r->curl_code == CURLE_OK)
    return "";
  return curl_easy_strerror(r->curl_code);
}

THROTTLE_EXTERN const char *
throttle_curl_result_error_code(const throttle_curl_result_t *r) {
  return r != NULL ? r->code : "";
}

THROTTLE_EXTERN const char *
throttle_curl_result_error_message(const throttle_curl_result_t *r) {
  return r != NULL ? r->message : "";
}

THROTTLE_EXTERN const char *
throttle_curl_result_body(const throttle_curl_result_t *r, size_t *len) {
  if (len != NULL)
    *len = r != NULL ? r->body_len : 0;
  return r != NULL && r->body != NULL ? r->body : "";
}

THROTTLE_EXTERN int throttle_curl_result_error(const throttle_curl_result_t *r) {
  return r != NULL ? r->error : 0;
}

THROTTLE_EXTERN int
throttle_curl_result_shared(const throttle_curl_result_t *r) {
  return r != NULL ? r->shared : 0;
}

THROTTLE_EXTERN int
throttle_curl_result_admitted(const throttle_curl_result_t *r) {
  return r != NULL && r->unadmitted == 0;
}

THROTTLE_EXTERN unsigned
throttle_curl_result_unadmitted(const throttle_curl_result_t *r) {
  return r != NULL ? r->unadmitted : 0;
}

THROTTLE_EXTERN uint64_t
throttle_curl_result_elapsed(const throttle_curl_result_t *r) {
  return r != NULL ? r->elapsed_ms : 0;
}
