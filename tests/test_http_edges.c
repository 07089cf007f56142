/* SPDX-License-Identifier: MIT */
/*
 * test_http_edges.c — throttle_curl_perform() against the awkward answers
 * of tests/scenario_server.py: an answer cut short after its headers, a
 * Retry-After sent twice, a compressed or BOM-prefixed lock answer, a lock
 * whose report fails, deadlines near 2^64, an upload re-sent without a
 * rewind, and the jitter of forked processes.
 *
 * "Never early" is checked on the server's side: it logs when each request
 * arrived (CLOCK_MONOTONIC, the clock of this process), and a retry must
 * arrive no sooner than the delay the answer before it asked for, less a
 * margin for the server's own latency.  No upper bounds on time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "http/http_internal.h"
#include "internal.h"
#include "throttle_curl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEY "edges:test/t"
/* A retry may be logged this much before the not-before the client
 * computed from the moment it read the answer: the server logs a request
 * a little after the client sent it, never before, so 50 ms is generous. */
#define MARGIN_MS 50

struct fx {
  struct th_fx *th;
  pid_t srv;
  char dir[64];
  char url[64];
  char log[128];
};

/* ---- the scenario server ------------------------------------------------- */

static void server_path(char *buf, size_t len) {
  const char *slash = strrchr(__FILE__, '/');
  int dirlen = slash != NULL ? (int)(slash - __FILE__) : 0;
  snprintf(buf, len, "%.*s%sscenario_server.py", dirlen, __FILE__,
           dirlen > 0 ? "/" : "");
}

static int setup(void **state) {
  struct fx *f = calloc(1, sizeof *f);
  void *inner = NULL;
  if (f == NULL || th_setup(&inner) != 0) {
    free(f);
    return -1;
  }
  f->th = inner;
  *state = f;
  char script[512], portfile[128];
  server_path(script, sizeof script);
  snprintf(f->dir, sizeof f->dir, "/tmp/tt-edges-XXXXXX");
  if (mkdtemp(f->dir) == NULL)
    return -1;
  snprintf(portfile, sizeof portfile, "%s/port", f->dir);
  snprintf(f->log, sizeof f->log, "%s/requests.log", f->dir);
  fflush(stdout);
  fflush(stderr);
  f->srv = fork();
  if (f->srv < 0)
    return -1;
  if (f->srv == 0) {
    execlp("python3", "python3", script, "--port", "0", "--port-file",
           portfile, "--log", f->log, (char *)NULL);
    _exit(127);
  }
  for (uint64_t until = th_mono_ms() + 10000; th_mono_ms() < until;) {
    FILE *pf = fopen(portfile, "r");
    int port = 0;
    if (pf != NULL) {
      if (fscanf(pf, "%d", &port) != 1)
        port = 0;
      fclose(pf);
    }
    if (port > 0) {
      snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", port);
      return 0;
    }
    if (waitpid(f->srv, NULL, WNOHANG) == f->srv) {
      f->srv = 0;
      return -1;
    }
    th_sleep_ms(20);
  }
  return -1;
}

static int teardown(void **state) {
  struct fx *f = *state;
  if (f == NULL)
    return 0;
  if (f->srv > 0) {
    kill(f->srv, SIGKILL);
    waitpid(f->srv, NULL, 0);
  }
  char path[160];
  snprintf(path, sizeof path, "%s/port", f->dir);
  unlink(path);
  unlink(f->log);
  rmdir(f->dir);
  void *inner = f->th;
  th_teardown(&inner);
  free(f);
  throttle__fault_reset();
  return 0;
}

/* The requests the server logged for path (exactly, query included):
 * their arrival times and body sizes, in order; returns how many. */
static int logged(const struct fx *f, const char *path, uint64_t *ms,
                  long *bytes, int max) {
  FILE *fp = fopen(f->log, "r");
  assert_non_null(fp);
  char line[1024], method[16], p[900];
  unsigned long long t;
  long b;
  int n = 0;
  while (fgets(line, sizeof line, fp) != NULL)
    if (sscanf(line, "%llu %15s %899s %ld", &t, method, p, &b) == 4 &&
        strcmp(p, path) == 0 && n < max) {
      ms[n] = t;
      if (bytes != NULL)
        bytes[n] = b;
      n++;
    }
  fclose(fp);
  return n;
}

/* The second request to path came at least min_ms after the first. */
static void assert_gap(const struct fx *f, const char *path, uint64_t min_ms) {
  uint64_t ms[8];
  int n = logged(f, path, ms, NULL, 8);
  assert_true(n >= 2);
  uint64_t gap = ms[1] - ms[0];
  print_message("%s: retry %llu ms after the first request (at least %llu)\n",
                path, (unsigned long long)gap, (unsigned long long)min_ms);
  if (gap + MARGIN_MS < min_ms)
    fail_msg("%s: retried after %llu ms, the server asked for %llu", path,
             (unsigned long long)gap, (unsigned long long)min_ms);
}

/* ---- requests ------------------------------------------------------------ */

static size_t discard(char *ptr, size_t size, size_t nmemb, void *ud) {
  (void)ptr, (void)ud;
  return size * nmemb;
}

struct lines {
  char text[8192];
  size_t len;
  const char *arm_on; /* arm a one-shot lock fault on the line with this */
};

static void collect(void *ud, const char *line) {
  struct lines *l = ud;
  if (l->arm_on != NULL && strstr(line, l->arm_on) != NULL) {
    throttle__fault_arm(THROTTLE__FAULT_LOCK, 1);
    l->arm_on = NULL;
  }
  int n = snprintf(l->text + l->len, sizeof l->text - l->len, "%s\n", line);
  if (n > 0 && (size_t)n < sizeof l->text - l->len)
    l->len += (size_t)n;
}

static throttle_curl_policy_t *policy(struct lines *log) {
  throttle_curl_policy_t *p = NULL;
  assert_int_equal(throttle_curl_policy_new(&p), 0);
  assert_int_equal(throttle_curl_policy_set_sink(p, discard, NULL), 0);
  assert_int_equal(throttle_curl_policy_set_retries(p, 3), 0);
  /* below every Retry-After the tests send: a value misread shows */
  assert_int_equal(throttle_curl_policy_set_default_delay(p, 1000), 0);
  if (log != NULL)
    assert_int_equal(throttle_curl_policy_set_log(p, collect, log), 0);
  else if (getenv("TEST_VERBOSE") != NULL)
    throttle_curl_policy_set_log_file(p, stderr);
  return p;
}

static CURL *get_handle(const struct fx *f, const char *path) {
  char u[512];
  snprintf(u, sizeof u, "%s%s", f->url, path);
  CURL *c = curl_easy_init();
  assert_non_null(c);
  curl_easy_setopt(c, CURLOPT_URL, u);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  return c;
}

static throttle_curl_result_t *run(throttle_t *h, CURL *c,
                                   const throttle_curl_policy_t *p) {
  throttle_curl_result_t *r = NULL;
  assert_int_equal(throttle_curl_perform(h, c, KEY, p, &r), 0);
  assert_non_null(r);
  return r;
}

/* GET path; the result's status and attempts must be as given. */
static void expect(const struct fx *f, throttle_t *h, const char *path,
                   const throttle_curl_policy_t *p, throttle_curl_status_t st,
                   unsigned attempts) {
  CURL *c = get_handle(f, path);
  struct curl_slist *hd = curl_slist_append(NULL, "Accept-Encoding: gzip");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
  throttle_curl_result_t *r = run(h, c, p);
  if (throttle_curl_result_status(r) != st ||
      throttle_curl_result_attempts(r) != attempts)
    fail_msg("%s: %s after %u attempts (HTTP %ld \"%s\"), want %s after %u",
             path, throttle_curl_status_name(throttle_curl_result_status(r)),
             throttle_curl_result_attempts(r),
             throttle_curl_result_http_status(r),
             throttle_curl_result_error_code(r), throttle_curl_status_name(st),
             attempts);
  throttle_curl_result_free(r);
  curl_easy_cleanup(c);
  curl_slist_free_all(hd);
}

/* ---- tests --------------------------------------------------------------- */

/* Headers with Retry-After: 2, then the connection closes mid-body: the
 * answer still asked for 2 s, and the retry waits for them. */
static void test_http_edges_cut_body_honours_retry_after(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  const char *path = "/cut?status=429&ra=2&cut=1";
  expect(f, h, path, p, THROTTLE_CURL_OK, 2);
  assert_gap(f, path, 2000);
  /* a cut 409 lock answer is a lock too */
  const char *lock = "/cutlock?status=409&code=RESOURCE_LOCKED&ra=2&cut=1";
  expect(f, h, lock, p, THROTTLE_CURL_OK, 2);
  assert_gap(f, lock, 2000);
  throttle_curl_policy_free(p);
  /* cut inside the JSON, after the code: still a lock, and published */
  struct lines log = {0};
  p = policy(&log);
  const char *mid =
      "/cutmid?status=409&code=RESOURCE_LOCKED&ra=2&cut=1&cutat=37";
  expect(f, h, mid, p, THROTTLE_CURL_OK, 2);
  print_message("%s", log.text);
  assert_gap(f, mid, 2000);
  assert_non_null(strstr(log.text, "-> locked; published not-before"));
  throttle_curl_policy_free(p);
}

/* Two Retry-After lines, or one line with a list: the largest counts. */
static void test_http_edges_duplicate_retry_after_takes_largest(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  const char *twice = "/twice?status=503&ra=2&ra=1";
  expect(f, h, twice, p, THROTTLE_CURL_OK, 2);
  assert_gap(f, twice, 2000);
  const char *list = "/list?status=429&ra=1,%202";
  expect(f, h, list, p, THROTTLE_CURL_OK, 2);
  assert_gap(f, list, 2000);
  throttle_curl_policy_free(p);
}

/* A lock answer the JSON reader cannot read as it comes: gzip-compressed
 * (asked for by the application's own Accept-Encoding header), behind a
 * byte order mark, or a text/plain body with a Retry-After.  Each is a
 * lock, retried; a readable CONFLICT with a Retry-After stays final. */
static void test_http_edges_unreadable_lock_is_not_permanent(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  expect(f, h, "/gz?status=409&code=RESOURCE_LOCKED&gzip=1", p,
         THROTTLE_CURL_OK, 2);
  expect(f, h, "/gzra?status=409&code=RESOURCE_LOCKED&gzip=1&ra=1", p,
         THROTTLE_CURL_OK, 2);
  expect(f, h, "/bom?status=409&code=RESOURCE_LOCKED&bom=1", p,
         THROTTLE_CURL_OK, 2);
  expect(f, h, "/txt?status=409&text=table%20locked&ra=1", p, THROTTLE_CURL_OK,
         2);
  assert_gap(f, "/txt?status=409&text=table%20locked&ra=1", 1000);
  expect(f, h, "/conflict?status=409&code=CONFLICT&ra=1", p,
         THROTTLE_CURL_PERMANENT, 1);
  expect(f, h, "/gzconflict?status=409&code=CONFLICT&gzip=1", p,
         THROTTLE_CURL_PERMANENT, 1);
  throttle_curl_policy_free(p);
}

/* The report of a lock answer fails (the segment mutex times out inside
 * throttle_leave()): nothing was published, so this call waits out the
 * Retry-After itself, and its log does not claim it published. */
static void test_http_edges_failed_report_still_waits(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  struct lines log = {.arm_on = "attempt 1: " KEY " admitted"};
  throttle_curl_policy_t *p = policy(&log);
  const char *path = "/lk?status=409&code=RESOURCE_LOCKED&ra=2";
  expect(f, h, path, p, THROTTLE_CURL_OK, 2);
  print_message("%s", log.text);
  assert_true(throttle__fault_hits(THROTTLE__FAULT_LOCK) >= 1);
  assert_gap(f, path, 2000);
  assert_null(strstr(log.text, "published not-before"));
  assert_non_null(strstr(log.text, "not published"));
  throttle_curl_policy_free(p);
}

/* A deadline near 2^64 ms is no deadline: the request is sent. */
static void test_http_edges_huge_deadline_still_sends(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  uint64_t big[] = {UINT64_MAX - 1, UINT64_MAX / 2, UINT64_MAX - 1000000};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    assert_int_equal(throttle_curl_policy_set_deadline(p, big[i]), 0);
    expect(f, h, "/ok?n=0", p, THROTTLE_CURL_OK, 1);
  }
  throttle_curl_policy_free(p);
}

/* An HTTP-date in the RFC 850 shape with a four-digit year is read, not
 * replaced by the (shorter) default delay. */
static void test_http_edges_rfc850_four_digit_year(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  /* The date has whole seconds and is read against the answer's Date:
   * "+4" is more than 3 s from when the answer was sent. */
  const char *path = "/d850?status=503&ra=date850:%2B4";
  expect(f, h, path, p, THROTTLE_CURL_OK, 2);
  assert_gap(f, path, 3000);
  throttle_curl_policy_free(p);
}

/* Retry-After: 0 is "now": published as 1 ms, not the default delay. */
static void test_http_edges_retry_after_zero_is_now(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  assert_int_equal(throttle_curl_policy_set_default_delay(p, 600000), 0);
  CURL *c = get_handle(f, "/zero?status=429&ra=0");
  throttle_curl_result_t *r = run(h, c, p);
  assert_int_equal(throttle_curl_result_status(r), THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_attempts(r), 2);
  assert_int_equal(throttle_curl_result_retry_after(r), 1);
  throttle_curl_result_free(r);
  curl_easy_cleanup(c);
  throttle_curl_policy_free(p);
}

/* A streamed upload re-sent without a rewind would go out empty, and the
 * server may accept it: the call fails, loudly, instead of saying ok. */
struct upload {
  const char *data;
  size_t left;
};

static size_t read_once(char *buf, size_t size, size_t nmemb, void *ud) {
  struct upload *u = ud;
  size_t n = size * nmemb < u->left ? size * nmemb : u->left;
  memcpy(buf, u->data, n);
  u->data += n;
  u->left -= n;
  return n;
}

static void test_http_edges_unrewound_upload_fails(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  struct lines log = {0};
  throttle_curl_policy_t *p = policy(&log);
  const char *path = "/up?status=503&ra=0";
  CURL *c = get_handle(f, path);
  struct upload u = {"hello", 5};
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_READFUNCTION, read_once);
  curl_easy_setopt(c, CURLOPT_READDATA, &u);
  throttle_curl_result_t *r = run(h, c, p);
  print_message("%s", log.text);
  assert_int_equal(throttle_curl_result_status(r), THROTTLE_CURL_TRANSPORT);
  assert_int_equal(throttle_curl_result_curl_code(r), CURLE_SEND_FAIL_REWIND);
  assert_non_null(strstr(log.text, "0 bytes"));
  uint64_t ms[4];
  long bytes[4];
  assert_int_equal(logged(f, path, ms, bytes, 4), 2);
  assert_int_equal(bytes[0], 5);
  assert_int_equal(bytes[1], 0);
  throttle_curl_result_free(r);
  curl_easy_cleanup(c);
  throttle_curl_policy_free(p);
}

/* fork() copies the jitter's random state: a forked loader must draw its
 * own sequence, or forked waiters wake together. */
static void test_http_edges_jitter_differs_across_forks(void **state) {
  (void)state;
  enum { KIDS = 4 };
  uint64_t parent = throttle__http_random(); /* seeded here, before fork */
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t kids[KIDS];
  for (int i = 0; i < KIDS; i++) {
    kids[i] = fork();
    assert_true(kids[i] >= 0);
    if (kids[i] == 0) {
      uint64_t v = throttle__http_random();
      _exit(write(pfd[1], &v, sizeof v) == (ssize_t)sizeof v ? 0 : 1);
    }
  }
  close(pfd[1]);
  uint64_t got[KIDS + 1];
  got[KIDS] = throttle__http_random(); /* the parent's own next value */
  for (int i = 0; i < KIDS; i++) {
    assert_int_equal(read(pfd[0], &got[i], sizeof got[i]),
                     (ssize_t)sizeof got[i]);
    int st;
    assert_int_equal(waitpid(kids[i], &st, 0), kids[i]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  close(pfd[0]);
  (void)parent;
  for (int i = 0; i <= KIDS; i++)
    for (int j = i + 1; j <= KIDS; j++)
      if (got[i] == got[j])
        fail_msg("draws %d and %d after fork are equal (%llx)", i, j,
                 (unsigned long long)got[i]);
}

/* The library's own log file writer: a server's error.code with ESC and a
 * C1 CSI (raw and UTF-8-encoded) reaches it as \xHH, while other UTF-8
 * passes. */
static void test_http_edges_log_file_is_terminal_safe(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy(NULL);
  FILE *log = tmpfile();
  assert_non_null(log);
  assert_int_equal(throttle_curl_policy_set_log_file(p, log), 0);
  expect(f, h, "/esc?status=409&code=%1B%5D0%3Bt%07%C2%9B%C5%91", p,
         THROTTLE_CURL_PERMANENT, 1);
  rewind(log);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, log);
  text[n] = 0;
  fclose(log);
  print_message("%s", text);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)text[i] < 0x20 && text[i] != '\n')
      fail_msg("control byte 0x%02x in the log", (unsigned char)text[i]);
  assert_null(strstr(text, "\xc2\x9b"));
  assert_non_null(strstr(text, "\\x1b]0;t\\x07\\x9b\xc5\x91"));
  throttle_curl_policy_free(p);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
  if (system("python3 -c 'import http.server' >/dev/null 2>&1") != 0) {
    printf("SKIP test_http_edges: python3 not found\n");
    return 0;
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      T(test_http_edges_cut_body_honours_retry_after),
      T(test_http_edges_duplicate_retry_after_takes_largest),
      T(test_http_edges_unreadable_lock_is_not_permanent),
      T(test_http_edges_failed_report_still_waits),
      T(test_http_edges_huge_deadline_still_sends),
      T(test_http_edges_rfc850_four_digit_year),
      T(test_http_edges_retry_after_zero_is_now),
      T(test_http_edges_unrewound_upload_fails),
      T(test_http_edges_log_file_is_terminal_safe),
      cmocka_unit_test(test_http_edges_jitter_differs_across_forks),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
