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
#include "rng.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#if !CURL_AT_LEAST_VERSION(7, 84, 0)
#error "libthrottle-curl needs libcurl 7.84 or later (curl_easy_header)"
#endif

/* A local wait asked for by a Retry-After on an answer that is not
 * published (408, 5xx) is honoured up to this much: the core's default
 * maximum delay.  Published delays are clamped by the core itself. */
#define MAX_LOCAL_WAIT_MS UINT64_C(900000)

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

/* Per thread, like the core's (rng.h). */
static uint64_t random64(void) {
  static __thread uint64_t s;
  return throttle__rng_next(&s);
}

/* Full jitter: uniform in [0, min(cap, base * 2^k)]. */
static uint64_t full_jitter(const throttle_curl_policy_t *p, unsigned k) {
  uint64_t top = p->backoff_base_ms;
  for (unsigned i = 0; i < k && top < p->backoff_cap_ms; i++)
    top = top > UINT64_MAX / 2 ? UINT64_MAX : top * 2;
  if (top > p->backoff_cap_ms)
    top = p->backoff_cap_ms;
  return random64() % (top + 1);
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
 * does not shorten or stretch them. */
static int retry_after(CURL *easy, uint64_t *ms) {
  const char *ra, *date;
  if (header_value(easy, "Retry-After", &ra) != 1)
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
  return throttle_parse_retry_after(ra, now, ms) == 0;
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

/* What to do after a transient attempt: give up at the budget or when the
 * local wait would end past the deadline; otherwise wait and go again. */
static enum step next_or_give_up(const throttle_curl_policy_t *p,
                                 throttle_curl_result_t *r, uint64_t start,
                                 uint64_t deadline, uint64_t wait_ms) {
  if (r->attempts > p->retries) {
    say(p, "giving up: %u attempts, retry budget %u spent", r->attempts,
        p->retries);
    finish(r, THROTTLE_CURL_GAVE_UP, start);
    return STEP_DONE;
  }
  if (wait_ms > 0) {
    uint64_t now = mono_ms();
    if (deadline != UINT64_MAX && (now >= deadline || deadline - now < wait_ms)) {
      say(p, "giving up: a %llu ms back-off would pass the deadline",
          (unsigned long long)wait_ms);
      finish(r, THROTTLE_CURL_GAVE_UP, start);
      return STEP_DONE;
    }
    say(p, "backing off locally for %llu ms", (unsigned long long)wait_ms);
    sleep_ms(wait_ms);
  }
  return STEP_AGAIN;
}

/* One attempt: send, classify, leave.  ticket is NULL for an attempt sent
 * without admission (fail open): its back-off is then slept here instead
 * of published.  *local is the count of consecutive failures that back
 * off locally. */
static enum step attempt(throttle_t *h, CURL *easy,
                         const throttle_curl_policy_t *p,
                         throttle_ticket_t *ticket, struct tee *t,
                         throttle_curl_result_t *r, unsigned *local,
                         uint64_t start, uint64_t deadline) {
  unsigned n = ++r->attempts;
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, tee_write);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, t);
  CURLcode cc = curl_easy_perform(easy);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  r->curl_code = cc;
  r->http_status = status;

  /* CURLE_HTTP_RETURNED_ERROR (CURLOPT_FAILONERROR, turned off above, set
   * again by a callback) is still an answer, only without its body. */
  if (cc != CURLE_OK && !(cc == CURLE_HTTP_RETURNED_ERROR && status >= 100)) {
    /* A status that arrived before the failure decides whether the
     * request may have been done: a 2xx or a permanent status is final. */
    throttle_outcome_t by_status = THROTTLE_OUTCOME_FAILED;
    if (status >= 100 && status <= 999)
      throttle__classify(p, status, NULL, 0, &by_status, NULL, 0, NULL, 0);
    int again = transient_curl(cc) && by_status != THROTTLE_OUTCOME_OK &&
                by_status != THROTTLE_OUTCOME_PERMANENT;
    r->outcome = THROTTLE_OUTCOME_FAILED;
    report(h, ticket, THROTTLE_OUTCOME_FAILED, 0);
    t->len = 0;
    say(p, "attempt %u: transport error %d: %s (HTTP status %ld)%s", n,
        (int)cc, curl_easy_strerror(cc), status,
        again ? "" : ", not retried");
    if (!again) {
      finish(r, THROTTLE_CURL_TRANSPORT, start);
      return STEP_DONE;
    }
    return next_or_give_up(p, r, start, deadline, full_jitter(p, (*local)++));
  }

  throttle_outcome_t o;
  throttle__classify(p, status, t->buf, t->buf != NULL ? t->len : 0, &o,
                     r->code, sizeof r->code, r->message, sizeof r->message);
  r->curl_code = CURLE_OK;
  r->outcome = o;
  uint64_t ra = 0;
  int have_ra = retry_after(easy, &ra);
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
  int lrc = report(h, ticket, o, publish);
  if (o == THROTTLE_OUTCOME_OK) {
    r->code[0] = r->message[0] = 0;
    take_body(r, t); /* empty: a 2xx body went to the sink */
  } else {
    take_body(r, t);
  }
  if (publish)
    say(p, "attempt %u: HTTP %ld%s%s -> %s; %s not-before +%llu ms (%s)", n,
        status, r->code[0] ? " " : "", r->code, outcome_name(o),
        ticket != NULL ? "published" : "unadmitted, so only this process's",
        (unsigned long long)publish,
        have_ra ? "Retry-After" : "no usable Retry-After: default");
  else
    say(p, "attempt %u: HTTP %ld%s%s -> %s", n, status,
        r->code[0] ? " " : "", r->code, outcome_name(o));
  if (lrc != 0)
    say(p, "attempt %u: reporting the outcome failed: %s: %s", n,
        throttle_strerror(lrc), throttle_errmsg(h));

  switch (o) {
  case THROTTLE_OUTCOME_OK:
    finish(r, THROTTLE_CURL_OK, start);
    return STEP_DONE;
  case THROTTLE_OUTCOME_PERMANENT:
    finish(r, THROTTLE_CURL_PERMANENT, start);
    return STEP_DONE;
  case THROTTLE_OUTCOME_FAILED: {
    uint64_t wait = have_ra ? (ra < MAX_LOCAL_WAIT_MS ? ra : MAX_LOCAL_WAIT_MS)
                            : full_jitter(p, *local);
    (*local)++;
    return next_or_give_up(p, r, start, deadline, wait);
  }
  default:
    /* Published: the next throttle_enter() waits for the not-before.  Sent
     * without admission there is nobody to publish to that would make
     * this process wait, so it waits here, as long as the server said. */
    *local = 0;
    return next_or_give_up(p, r, start, deadline,
                           ticket != NULL ? 0
                           : publish < MAX_LOCAL_WAIT_MS ? publish
                                                         : MAX_LOCAL_WAIT_MS);
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
  uint64_t deadline = p->deadline_ms == THROTTLE_FOREVER
                          ? UINT64_MAX
                          : start + p->deadline_ms;
  struct tee t = {.easy = easy, .p = p};
  /* Every answer is classified from its status and body, so libcurl must
   * not turn a 409 into an error and drop the body. */
  curl_easy_setopt(easy, CURLOPT_FAILONERROR, 0L);
  unsigned local = 0;
  int rc = 0;
  /* A segment that timed out its mutex or is corrupt is not asked again
   * during this call: each throttle_enter() would cost the lock timeout
   * and fail the same way.  A full table is asked again at each attempt,
   * since idle keys become evictable as their back-offs pass. */
  int skip_segment = 0;
  if (!r->shared)
    say(p, "no shared segment: back-off holds within this process only (%s)",
        throttle_errmsg(h));

  for (;;) {
    uint64_t now = mono_ms(), timeout = THROTTLE_FOREVER;
    if (deadline != UINT64_MAX)
      timeout = deadline > now ? deadline - now : 0;
    throttle_ticket_t *ticket = NULL;
    int erc = timeout == 0  ? THROTTLE_ETIMEDOUT
              : skip_segment ? r->error
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
      if (!skip_segment)
        say(p, "attempt %u: admission failed: %s: %s; sending without "
               "admission, back-off held within this process",
            r->attempts + 1, throttle_err_name(erc), throttle_errmsg(h));
      else
        say(p, "attempt %u: sending without admission (%s)", r->attempts + 1,
            throttle_err_name(erc));
      r->error = erc;
      r->unadmitted++;
      skip_segment =
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
    if (attempt(h, easy, p, ticket, &t, r, &local, start, deadline) ==
        STEP_DONE)
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
  return r != NULL && (r->status == THROTTLE_CURL_GAVE_UP ||
                       r->status == THROTTLE_CURL_CANCELED);
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
