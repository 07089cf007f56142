/* SPDX-License-Identifier: MIT */
/*
 * throttle_curl.h — libthrottle's HTTP layer: Retry-After parsing, answer
 * classification, and a libcurl perform loop that is admitted by the
 * throttle, classifies each answer, publishes what the server said and
 * retries transient answers.
 *
 * Link with -lthrottle-curl -lthrottle -lcurl -ljansson.  Needs libcurl
 * 7.84 or later (curl_easy_header()).  The application owns
 * curl_global_init() / curl_global_cleanup().
 *
 * Conventions are those of throttle.h: functions return 0 or a negative
 * THROTTLE_E* code, objects are opaque and read through accessors, and a
 * NULL object passed to a *_free() function is a no-op.
 *
 * How answers are classified (throttle_classify())
 *
 *   2xx                          THROTTLE_OUTCOME_OK
 *   409 + locked error.code      THROTTLE_OUTCOME_LOCKED        (published)
 *   409 otherwise                THROTTLE_OUTCOME_PERMANENT
 *   429                          THROTTLE_OUTCOME_RATE_LIMITED  (published)
 *   503                          THROTTLE_OUTCOME_UNAVAILABLE   (published)
 *   408, 425                     THROTTLE_OUTCOME_FAILED        (transient)
 *   500, 502, 504, 507, and any
 *   5xx not listed below         THROTTLE_OUTCOME_FAILED        (transient)
 *   501, 505, 506, 508, 510, 511 THROTTLE_OUTCOME_PERMANENT
 *   other 4xx                    THROTTLE_OUTCOME_PERMANENT
 *   1xx, 3xx, 600-999            THROTTLE_OUTCOME_PERMANENT
 *
 * "Published" is on the key for LOCKED and on the key's root scope for
 * RATE_LIMITED and UNAVAILABLE ("hotdata:ws1" for "hotdata:ws1/orders": an
 * overload is the workspace's, and every table beneath waits), unless
 * throttle_set_publish_level() on the handle says otherwise.
 *
 * "Locked" codes are {"RESOURCE_LOCKED"} unless the policy says otherwise
 * (throttle_curl_policy_set_locked_codes()).  The code is the string at
 * error.code of a JSON object body, e.g.
 *   {"error": {"code": "RESOURCE_LOCKED", "message": "..."}}.
 * Only the first 64 KiB (THROTTLE_CURL_BODY_MAX) of a body are read, after
 * a UTF-8 byte order mark if there is one; a body that is not a complete
 * JSON document within them, is not JSON, or has error / error.code of the
 * wrong type has no code.  A 409 with a readable code that is not a locked
 * one is permanent: retrying a conflict is the one thing a client must not
 * do.  A 409 is never called permanent because its code could not be read,
 * though:
 *   - a body that fails to parse (cut short, or the parser ran out of
 *     memory, which jansson often reports as a syntax error) but holds a
 *     locked code as a JSON string is THROTTLE_OUTCOME_FAILED (transient,
 *     local back-off), and so is any 409 whose parse reported
 *     THROTTLE_ENOMEM and that names no Retry-After;
 *   - throttle_curl_perform() takes a 409 without a readable code that
 *     carries a Retry-After (text/plain, a coding it cannot decode, cut
 *     short) as a lock, and inflates a gzip or deflate body that libcurl
 *     did not decode (an application may ask for an encoding with its own
 *     Accept-Encoding header, and libcurl then leaves the body encoded).
 *
 * Why the other choices:
 *   - 1xx: libcurl consumes interim answers (100 Continue) itself; a final
 *     1xx is a broken server, and resending does not mend it.
 *   - 3xx: libcurl follows redirects only with CURLOPT_FOLLOWLOCATION; an
 *     unfollowed redirect answers the same way every time.
 *   - 5xx: a server failure is worth a bounded retry (with local back-off,
 *     never published) except where the status itself says the server will
 *     never do this request (501 Not Implemented, 505 HTTP Version Not
 *     Supported, 506, 508 Loop Detected, 510, 511 Network Authentication
 *     Required).  Statuses outside RFC 9110's list (e.g. 520-524 from
 *     proxies) are treated like 500.
 *
 * Caveats
 *   - Requests are re-sent.  A transfer that fails before any status
 *     arrives (connection refused, reset, timeout) is sent again, and the
 *     server may already have acted on the first one.  Give non-idempotent
 *     requests an idempotency key.  A transfer that fails after its
 *     status arrived is re-sent only when the status alone is transient
 *     (429, 503, 408, 425, 5xx) or a lock: never after a 2xx (the server
 *     did the work).  What arrived of a cut answer counts: its status and
 *     Retry-After are classified and published as for a whole answer.
 *   - The deadline bounds waiting and the decision to retry; a transfer that
 *     has started runs until the application's own CURLOPT_TIMEOUT(_MS).
 *   - Local back-off sleeps (transport errors, 408/5xx, and every back-off
 *     of a request sent without admission) are not interrupted by
 *     throttle_cancel(); only waiting for admission is.
 *   - A body is read for its code only within its first 64 KiB: a lock
 *     answer whose JSON document does not end within them reads as a 409
 *     without a readable code (see above).  Real error bodies are far
 *     smaller.
 *   - A streamed upload (CURLOPT_READFUNCTION) re-sent without
 *     throttle_curl_policy_set_rewind() goes out empty; a 2xx answer to
 *     such an empty retry ends the call THROTTLE_CURL_TRANSPORT with
 *     CURLE_SEND_FAIL_REWIND rather than ok.
 */
#ifndef THROTTLE_CURL_H
#define THROTTLE_CURL_H

#include "throttle.h"

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of an answer's body read for classification and kept in a result. */
#define THROTTLE_CURL_BODY_MAX 65536

/* ---- Retry-After ------------------------------------------------------ */

/* Parse a Retry-After field value (RFC 9110 §10.2.3) into *ms, the number
 * of milliseconds to wait from now.
 *
 * value: the field value.  Leading and trailing spaces and tabs are
 *   ignored: they are the optional whitespace around a field value that
 *   RFC 9110 §5.5 has parsers strip, and a caller may pass a value as it
 *   came off the wire.  Then it must be exactly one of:
 *   - delta-seconds: 1*DIGIT.  Leading zeros are allowed.  Values too large
 *     for uint64_t milliseconds saturate at UINT64_MAX (any number of
 *     digits is read, in one pass, without allocating).
 *   - an HTTP-date in one of the three forms of RFC 9110 §5.6.7:
 *       IMF-fixdate  "Sun, 06 Nov 1994 08:49:37 GMT"
 *       RFC 850      "Sunday, 06-Nov-94 08:49:37 GMT"
 *       asctime      "Sun Nov  6 08:49:37 1994"
 *     Names are matched without regard to case, a run of spaces or tabs
 *     counts as one space, the weekday may be short or long in every form
 *     (it must be a day name but is not checked against the date), and a
 *     day of month may have one or two digits.  The zone must be "GMT"
 *     (asctime has none and is GMT; "UTC", "UT", "Z", "+0000" and "-0000"
 *     are read as GMT).  The date must exist (no 30 Feb); the
 *     second may be 60.  The IMF-fixdate and RFC 850 shapes take a year
 *     of two or four digits each ("Thu, 19-Apr-2007 16:00:00 GMT" is common
 *     in the wild; three digits are refused).  A two-digit year is read as
 *     RFC 9110 says: the
 *     latest year with those digits that is at most 50 years after now.
 *     Dates before 1970 are taken to be in the past.  The date is converted
 *     by curl_getdate(), which does not depend on the local time zone.
 *     curl_getdate() alone accepts far more (dates without a time, zone
 *     offsets, trailing words, 30 Feb); those are refused here, because a
 *     misread value would become every process's not-before.
 * now: the current time in seconds since the epoch (time(NULL), or better
 *   the answer's Date, which cancels clock skew between client and server);
 *   only used for HTTP-dates.  A date at or before now gives *ms = 0.
 * ms: out; milliseconds (seconds × 1000, saturating).  Not clamped here: a
 *   back-off published with throttle_backoff() or throttle_leave() is
 *   clamped to the segment's maximum delay.  Unchanged on error.
 *
 * Errors: THROTTLE_EINVAL — no usable value: value or ms is NULL, value is
 * empty or blank, has a sign ("+5", "-1"), a fraction ("1.5"), several
 * values ("5, 6"), or anything else that is neither form above (such as
 * a date without a time). */
THROTTLE_EXTERN int throttle_parse_retry_after(const char *value, time_t now,
                                               uint64_t *ms);

/* ---- Policy ------------------------------------------------------------ */

/* How throttle_classify() and throttle_curl_perform() behave.  Read-only
 * while in use, so one policy may serve many threads at once; setting it
 * while another thread uses it is a data race. */
typedef struct throttle_curl_policy throttle_curl_policy_t;

/* A new policy with the defaults named by each setter in *out.
 * Errors: THROTTLE_EINVAL (out is NULL), THROTTLE_ENOMEM (*out is NULL). */
THROTTLE_EXTERN int throttle_curl_policy_new(throttle_curl_policy_t **out);
THROTTLE_EXTERN void throttle_curl_policy_free(throttle_curl_policy_t *p);

/* Re-send a transient answer at most n times (n + 1 attempts in all).
 * Waiting for admission is not an attempt.  Default 10.
 * Errors: THROTTLE_EINVAL (p is NULL, or n > 1000000). */
THROTTLE_EXTERN int throttle_curl_policy_set_retries(throttle_curl_policy_t *p,
                                                     unsigned n);

/* Give up once ms have passed since throttle_curl_perform() started
 * (THROTTLE_FOREVER: no deadline, the default).  It bounds the wait for
 * admission and local back-off; a waiting call that would only be admitted
 * after the deadline gives up at once.
 * Any ms is honoured without overflow: one too far to reach (up to
 * UINT64_MAX - 1) is no deadline, and the request is still sent.
 * Errors: THROTTLE_EINVAL (p is NULL or ms is 0). */
THROTTLE_EXTERN int throttle_curl_policy_set_deadline(throttle_curl_policy_t *p,
                                                      uint64_t ms);

/* The class requests are admitted with.  Default THROTTLE_CLASS_LIVE.
 * Errors: THROTTLE_EINVAL (p is NULL or an unknown class). */
THROTTLE_EXTERN int throttle_curl_policy_set_class(throttle_curl_policy_t *p,
                                                   throttle_class_t cls);

/* The back-off published for a LOCKED, RATE_LIMITED or UNAVAILABLE answer
 * without a usable Retry-After.  Default 5000 ms.
 * Errors: THROTTLE_EINVAL (p is NULL, or ms is 0 or more than 7 days). */
THROTTLE_EXTERN int
throttle_curl_policy_set_default_delay(throttle_curl_policy_t *p, uint64_t ms);

/* Local back-off after a transport error or a transient answer that is not
 * published (408, 425, 5xx other than 503) and has no Retry-After: "full
 * jitter", a random sleep in [0, min(cap_ms, base_ms × 2^k)] for the k-th
 * consecutive such failure (k from 0).  Defaults 200 ms and 20000 ms.
 * Errors: THROTTLE_EINVAL (p is NULL, base_ms is 0, cap_ms < base_ms, or
 * cap_ms more than 7 days). */
THROTTLE_EXTERN int throttle_curl_policy_set_local_backoff(
    throttle_curl_policy_t *p, uint64_t base_ms, uint64_t cap_ms);

/* The error.code values that make a 409 a lock (THROTTLE_OUTCOME_LOCKED),
 * replacing the current set.  Compared exactly (case matters).  n = 0
 * makes every 409 permanent.  Default {"RESOURCE_LOCKED"}.
 * Errors: THROTTLE_EINVAL (p is NULL, codes is NULL with n > 0, n > 64, a
 * code NULL, empty or longer than 255 bytes; the set is then unchanged),
 * THROTTLE_ENOMEM (unchanged). */
THROTTLE_EXTERN int
throttle_curl_policy_set_locked_codes(throttle_curl_policy_t *p,
                                      const char *const *codes, size_t n);

/* Where the body of a 2xx answer goes.  libcurl has no getter for
 * CURLOPT_WRITEFUNCTION, so throttle_curl_perform() cannot find the
 * application's own; it installs its own and passes 2xx bodies here.
 * fn has the signature and contract of a CURLOPT_WRITEFUNCTION (return
 * anything but the size given to abort the transfer; CURL_WRITEFUNC_PAUSE
 * is not supported).  fn NULL: as libcurl's default, fwrite() to
 * (FILE *)userdata, or stdout when userdata is NULL.  Default: NULL, NULL.
 * The bodies of other answers never reach fn; see
 * throttle_curl_result_body().
 * Errors: THROTTLE_EINVAL (p is NULL). */
THROTTLE_EXTERN int throttle_curl_policy_set_sink(throttle_curl_policy_t *p,
                                                  curl_write_callback fn,
                                                  void *userdata);

/* How to rewind a streamed upload (CURLOPT_READFUNCTION) before it is sent
 * again: fn(userdata, 0, SEEK_SET) must return CURL_SEEKFUNC_OK.  libcurl
 * rewinds CURLOPT_POSTFIELDS and MIME bodies by itself, but not a read
 * callback between two curl_easy_perform() calls, and has no getter for
 * CURLOPT_SEEKFUNCTION; pass the same function and data here.  Without it,
 * an upload by read callback would be re-sent from where it stopped.
 * Default NULL (nothing to rewind).
 * Errors: THROTTLE_EINVAL (p is NULL). */
THROTTLE_EXTERN int throttle_curl_policy_set_rewind(throttle_curl_policy_t *p,
                                                    curl_seek_callback fn,
                                                    void *userdata);

/* A line of text for every attempt, answer and wait (like curl -v, for
 * diagnosis).  fn(userdata, line): line has no trailing newline and is
 * valid during the call only.  fn NULL turns logging off (the default).
 * Errors: THROTTLE_EINVAL (p is NULL). */
typedef void (*throttle_curl_log_fn)(void *userdata, const char *line);
THROTTLE_EXTERN int throttle_curl_policy_set_log(throttle_curl_policy_t *p,
                                                 throttle_curl_log_fn fn,
                                                 void *userdata);

/* The same, as lines "throttle: ...\n" written to f (NULL: off).  Lines
 * carry the key and the server's error.code; control bytes in them (C0,
 * DEL, C1 raw or UTF-8-encoded) are written as \xHH, so that a server
 * cannot drive a terminal.  A function set with
 * throttle_curl_policy_set_log() gets the line as it is.
 * Errors: THROTTLE_EINVAL (p is NULL). */
THROTTLE_EXTERN int throttle_curl_policy_set_log_file(throttle_curl_policy_t *p,
                                                      FILE *f);

/* ---- Classification ---------------------------------------------------- */

/* Classify one HTTP answer (see the table at the top of this file).
 *
 * policy: the locked codes to use; NULL for the defaults.
 * status: the HTTP status, 100 to 999.
 * body, len: the answer's body (body may be NULL when len is 0); at most
 *   THROTTLE_CURL_BODY_MAX bytes of it are read.  It is read for every
 *   status other than 2xx, to report the code.
 * outcome: out; the class.
 * code, code_len: out (may be NULL, 0); the body's error.code, truncated to
 *   code_len - 1 bytes and NUL-terminated, or "" when there is none.  The
 *   comparison with the locked codes uses the whole code.
 *
 * Errors: THROTTLE_EINVAL (outcome is NULL, status outside 100-999, body
 * NULL with len > 0, code NULL with code_len > 0), THROTTLE_ENOMEM (the
 * JSON parser reported that it ran out of memory; *outcome and code are
 * still set, as for a body without a code).  jansson 2.14 reports most
 * allocation failures as syntax errors instead: the body then has no code
 * and the call returns 0; either way a 409 is only called a lock when the
 * whole code was read and matched. */
THROTTLE_EXTERN int throttle_classify(const throttle_curl_policy_t *policy,
                                      long status, const char *body,
                                      size_t len, throttle_outcome_t *outcome,
                                      char *code, size_t code_len);

/* ---- The perform loop --------------------------------------------------- */

/* How a throttle_curl_perform() call ended. */
typedef enum {
  THROTTLE_CURL_OK = 0,        /* a 2xx answer */
  THROTTLE_CURL_PERMANENT = 1, /* a permanent answer; it was not re-sent */
  THROTTLE_CURL_GAVE_UP = 2,   /* still transient at the retry budget or the
                                  deadline (the last attempt's answer or
                                  transport error is in the result) */
  THROTTLE_CURL_TRANSPORT = 3, /* a transport error that re-sending does not
                                  mend (bad URL, certificate, the sink
                                  refused data, a 2xx cut short, ...) or
                                  did not mend within the budget or the
                                  deadline (connection refused, ...) */
  THROTTLE_CURL_CANCELED = 4,  /* throttle_cancel() on the key */
  THROTTLE_CURL_ERROR = 5,     /* the throttle failed; see
                                  throttle_curl_result_error() */
} throttle_curl_status_t;

/* "ok", "permanent", "gave_up", "transport", "canceled", "error"; "unknown"
 * otherwise. */
THROTTLE_EXTERN const char *throttle_curl_status_name(throttle_curl_status_t s);

/* What a throttle_curl_perform() call did.  Opaque; read with the
 * accessors below (each returns 0 / "" for a NULL result). */
typedef struct throttle_curl_result throttle_curl_result_t;

/* Send the request configured on easy, admitted by the throttle under key:
 *
 *   loop:
 *     throttle_enter(h, key, class, time left to the deadline)
 *     rewind the upload (after the first attempt), curl_easy_perform(easy)
 *     classify the answer (status, Retry-After, the body's error.code)
 *     throttle_leave() with the outcome and Retry-After in ms
 *     OK -> done; PERMANENT -> done;
 *     LOCKED, RATE_LIMITED, UNAVAILABLE -> published; loop (the next enter
 *       waits for the not-before, and only the probe goes first);
 *     FAILED, transport error -> local back-off (not published); loop;
 *     until the retry budget or the deadline is spent.
 *
 * Retry-After is read from the last answer's header (a date relative to
 * the answer's Date header when there is one, else to time(NULL)); sent
 * more than once, or as a list ("12, 12"), its largest readable value
 * counts, since publishing less than any value the server sent would be
 * early.  An explicit "Retry-After: 0" means "now" and is published as
 * 1 ms, the shortest back-off there is (throttle_leave() reads 0 as "use
 * the default delay").  When throttle_leave() fails for a LOCKED,
 * RATE_LIMITED or UNAVAILABLE answer (a lock timeout, a damaged segment)
 * nothing was published, so the call sleeps the delay itself, and stops
 * asking the segment as after the same errors of throttle_enter().
 *
 * A transport error (no answer: connection refused, reset, timed out) is
 * reported to throttle_leave() as THROTTLE_OUTCOME_FAILED, never
 * published, and re-sent after local back-off within the retry budget;
 * when the budget or deadline is spent on it the call ends
 * THROTTLE_CURL_TRANSPORT (not GAVE_UP: no answer came to say "later"),
 * with throttle_curl_result_transient() 1, as the network may mend.
 *
 * Fail open.  When throttle_enter() fails because of the segment rather
 * than the key (THROTTLE_EFULL, THROTTLE_ELOCKTIMEOUT, THROTTLE_ECORRUPT,
 * or any error but THROTTLE_ETIMEDOUT, THROTTLE_ECANCELED, THROTTLE_EINVAL,
 * THROTTLE_EKEY and THROTTLE_ENOMEM), the request is sent anyway, without
 * admission: nothing is published for it, and the back-off a lock, 429 or
 * 503 answer asks for (its Retry-After, else the default delay) is slept
 * in this call instead, so the request is still never re-sent earlier
 * than the server said.  Other processes do not learn of it.  After
 * THROTTLE_ELOCKTIMEOUT or THROTTLE_ECORRUPT the rest of the call does not
 * touch the segment again (each try would cost the lock timeout); after
 * any other such error each attempt asks for admission again.
 * throttle_curl_result_admitted() is then 0 and
 * throttle_curl_result_error() names the segment's error.  A handle that
 * fell back to process-private memory at throttle_open() is admitted as
 * usual, by that memory (throttle_curl_result_shared() is 0).
 *
 * easy: a configured handle (URL, method, body, headers, timeouts).  This
 *   call sets CURLOPT_WRITEFUNCTION and CURLOPT_WRITEDATA while it runs
 *   and on return leaves them set to the policy's sink; it turns
 *   CURLOPT_FAILONERROR off (with it libcurl drops the body of a 409, and
 *   a 409 without its body cannot be told to be a lock; an error answer's
 *   fate is in the result anyway).  Everything else is untouched.  Not
 *   usable by another thread meanwhile.
 * key: the throttle key, e.g. "hotdata:ws1/orders".
 * policy: NULL for the defaults.
 * result: out; always set on return except on THROTTLE_EINVAL and
 *   THROTTLE_ENOMEM, to be freed with throttle_curl_result_free().
 *
 * Returns 0 when the call came to an end the result describes (OK,
 * PERMANENT, GAVE_UP, TRANSPORT, CANCELED), including a call that failed
 * open: the request's fate is in the result, not in the return value.
 * Errors: THROTTLE_EINVAL (h, easy or result NULL; *result is NULL),
 * THROTTLE_ENOMEM (*result is NULL), and with status THROTTLE_CURL_ERROR
 * in *result, the errors of throttle_enter() that are not the segment's:
 * THROTTLE_EKEY (a bad key), THROTTLE_ENOMEM, THROTTLE_EINVAL (an unknown
 * class).  throttle_errmsg(h) then has the details. */
THROTTLE_EXTERN int throttle_curl_perform(throttle_t *h, CURL *easy,
                                          const char *key,
                                          const throttle_curl_policy_t *policy,
                                          throttle_curl_result_t **result);

THROTTLE_EXTERN void throttle_curl_result_free(throttle_curl_result_t *r);

/* How the call ended. */
THROTTLE_EXTERN throttle_curl_status_t
throttle_curl_result_status(const throttle_curl_result_t *r);

/* 1 when a later call might succeed where this one did not (GAVE_UP,
 * CANCELED, and TRANSPORT after a transport error that was re-sent for:
 * connection refused, reset, timed out, ...), 0 otherwise (OK, PERMANENT,
 * ERROR, and TRANSPORT after one that was not: bad URL, certificate, a
 * 2xx cut short, ...).  throttlectl exits 75 (EX_TEMPFAIL) on each of
 * them but CANCELED, and 1 on CANCELED: a cancel is an operator's
 * decision to stop, which a script should not retry as if the server had
 * said "later". */
THROTTLE_EXTERN int throttle_curl_result_transient(const throttle_curl_result_t *r);

/* Requests sent (0 when none was admitted). */
THROTTLE_EXTERN unsigned
throttle_curl_result_attempts(const throttle_curl_result_t *r);

/* The last answer's HTTP status; 0 when no answer arrived. */
THROTTLE_EXTERN long throttle_curl_result_http_status(const throttle_curl_result_t *r);

/* The last attempt's outcome as reported to throttle_leave(). */
THROTTLE_EXTERN throttle_outcome_t
throttle_curl_result_outcome(const throttle_curl_result_t *r);

/* The last delay the server asked for, in ms, so that a caller that gave
 * up can hold its producer back: the last usable Retry-After (or the
 * default delay for a lock answer without one), or, when the call gave up
 * waiting for admission, what throttle_remaining() said.  0 when none. */
THROTTLE_EXTERN uint64_t
throttle_curl_result_retry_after(const throttle_curl_result_t *r);

/* The last transfer's CURLcode (CURLE_OK when it completed) and
 * curl_easy_strerror() of it ("" for CURLE_OK). */
THROTTLE_EXTERN CURLcode
throttle_curl_result_curl_code(const throttle_curl_result_t *r);
THROTTLE_EXTERN const char *
throttle_curl_result_curl_error(const throttle_curl_result_t *r);

/* The error.code and error.message of the last non-2xx answer ("" when
 * there was none, or it had none). */
THROTTLE_EXTERN const char *
throttle_curl_result_error_code(const throttle_curl_result_t *r);
THROTTLE_EXTERN const char *
throttle_curl_result_error_message(const throttle_curl_result_t *r);

/* The first THROTTLE_CURL_BODY_MAX bytes of the last non-2xx answer's
 * body, NUL-terminated, its length in *len (len may be NULL). */
THROTTLE_EXTERN const char *
throttle_curl_result_body(const throttle_curl_result_t *r, size_t *len);

/* The throttle error that ended the call (THROTTLE_ECANCELED for
 * CANCELED, THROTTLE_ETIMEDOUT when it gave up waiting for admission,
 * throttle_enter()'s error for ERROR); else, when a request was sent
 * without admission, the segment's error that made it so (THROTTLE_EFULL,
 * THROTTLE_ELOCKTIMEOUT, ...); else 0. */
THROTTLE_EXTERN int throttle_curl_result_error(const throttle_curl_result_t *r);

/* 1 when every request the call sent was admitted by the throttle (also
 * when it sent none); 0 when at least one was sent without admission
 * because the segment failed (fail open, see throttle_curl_perform()):
 * its back-off then held in this call only.  A tool should warn. */
THROTTLE_EXTERN int
throttle_curl_result_admitted(const throttle_curl_result_t *r);

/* How many requests were sent without admission (0 when admitted). */
THROTTLE_EXTERN unsigned
throttle_curl_result_unadmitted(const throttle_curl_result_t *r);

/* 1 when h used the shared segment, 0 when it had fallen back to
 * process-private memory (back-off then held within this process only). */
THROTTLE_EXTERN int throttle_curl_result_shared(const throttle_curl_result_t *r);

/* Milliseconds from the start of the call to its end. */
THROTTLE_EXTERN uint64_t
throttle_curl_result_elapsed(const throttle_curl_result_t *r);

#ifdef __cplusplus
}
#endif
#endif /* THROTTLE_CURL_H */
