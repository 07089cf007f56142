/* SPDX-License-Identifier: MIT */
/*
 * test_http_perform.c — throttle_curl_perform() against real HTTP: each
 * test starts its own mock Hotdata server (tests/mock_server.py, on a free
 * loopback port) and its own segment, sends real requests through libcurl,
 * and checks both the result and what the server saw (its /stats: no
 * request early, conflicts sent once, refusals bounded).
 *
 * Timing is never asserted beyond hang guards: "never early" is measured
 * by the server, which knows what it advertised.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"
#include "throttle_curl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANG_GUARD_MS 30000
#define KEY "hotdata:test/t"
#define TABLE "t"

/* ---- the mock server ----------------------------------------------------- */

/* A test's fixture: the shared one plus its server. */
struct fx {
  struct th_fx *th;
  pid_t mock;
  char dir[64];  /* temporary directory holding the port file */
  char url[64];  /* "http://127.0.0.1:PORT" */
};

/* tests/mock_server.py, found next to this file (tests run from the top
 * of the tree, where the compiler saw this file as tests/...). */
static void mock_path(char *buf, size_t len) {
  const char *slash = strrchr(__FILE__, '/');
  int dirlen = slash != NULL ? (int)(slash - __FILE__) : 0;
  if (dirlen > 0)
    snprintf(buf, len, "%.*s/mock_server.py", dirlen, __FILE__);
  else
    snprintf(buf, len, "mock_server.py");
}

/* Start the server with extra options (NULL-terminated); fills fx->url. */
static void mock_start(struct fx *f, const char *const *extra) {
  char script[512], portfile[128];
  mock_path(script, sizeof script);
  snprintf(f->dir, sizeof f->dir, "/tmp/tt-mock-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(portfile, sizeof portfile, "%s/port", f->dir);
  const char *argv[32] = {"python3",   script,     "--port", "0",
                          "--port-file", portfile, "--service-ms", "20",
                          "--retry-after", "1"};
  int n = 10;
  for (int i = 0; extra != NULL && extra[i] != NULL && n < 30; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0)
      dup2(null, STDOUT_FILENO);
    execvp("python3", (char *const *)argv);
    _exit(127);
  }
  f->mock = pid;
  uint64_t deadline = th_mono_ms() + 10000;
  int port = 0;
  while (port == 0) {
    FILE *pf = fopen(portfile, "r");
    if (pf != NULL) {
      if (fscanf(pf, "%d", &port) != 1)
        port = 0;
      fclose(pf);
    }
    if (port != 0)
      break;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      f->mock = 0;
      fail_msg("the mock server exited at start (status %d)", st);
    }
    if (th_mono_ms() > deadline)
      fail_msg("the mock server did not write %s within 10 s", portfile);
    th_sleep_ms(20);
  }
  snprintf(f->url, sizeof f->url, "http://127.0.0.1:%d", port);
}

static void mock_stop(struct fx *f) {
  if (f->mock > 0) {
    kill(f->mock, SIGTERM);
    uint64_t deadline = th_mono_ms() + 5000;
    while (waitpid(f->mock, NULL, WNOHANG) == 0) {
      if (th_mono_ms() > deadline) {
        kill(f->mock, SIGKILL);
        waitpid(f->mock, NULL, 0);
        break;
      }
      th_sleep_ms(10);
    }
    f->mock = 0;
  }
  if (f->dir[0] != 0) {
    char path[128];
    snprintf(path, sizeof path, "%s/port", f->dir);
    unlink(path);
    rmdir(f->dir);
    f->dir[0] = 0;
  }
}

static int setup_with(void **state, const char *const *extra) {
  struct fx *f = calloc(1, sizeof *f);
  if (f == NULL)
    return -1;
  void *inner = NULL;
  if (th_setup(&inner) != 0) {
    free(f);
    return -1;
  }
  f->th = inner;
  *state = f;
  mock_start(f, extra);
  return 0;
}

static int setup(void **state) { return setup_with(state, NULL); }

static int setup_date(void **state) {
  static const char *const extra[] = {"--date-retry-after", NULL};
  return setup_with(state, extra);
}

static int teardown(void **state) {
  struct fx *f = *state;
  if (f == NULL)
    return 0;
  mock_stop(f);
  void *inner = f->th;
  th_teardown(&inner);
  free(f);
  *state = NULL;
  return 0;
}

/* ---- plain HTTP to the server's admin routes ----------------------------- */

struct buf {
  char data[8192];
  size_t len;
};

static size_t to_buf(char *ptr, size_t size, size_t nmemb, void *userdata) {
  struct buf *b = userdata;
  size_t n = size * nmemb;
  size_t room = sizeof b->data - 1 - b->len;
  size_t take = n < room ? n : room;
  memcpy(b->data + b->len, ptr, take);
  b->len += take;
  b->data[b->len] = 0;
  return n;
}

/* One request without the throttle; returns the status, body into *out. */
static long raw(struct fx *f, const char *method, const char *path,
                const char *body, struct buf *out) {
  struct buf ignored;
  if (out == NULL)
    out = &ignored;
  out->len = 0;
  out->data[0] = 0;
  char url[256];
  snprintf(url, sizeof url, "%s%s", f->url, path);
  CURL *c = curl_easy_init();
  assert_non_null(c);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  if (body != NULL)
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buf);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode cc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  if (cc != CURLE_OK)
    fail_msg("%s %s: %s", method, url, curl_easy_strerror(cc));
  return status;
}

static void admin(struct fx *f, const char *what, const char *json) {
  char path[64];
  snprintf(path, sizeof path, "/admin/%s", what);
  assert_int_equal(raw(f, "POST", path, json, NULL), 200);
}

/* A counter of /stats ("early"), or of /stats tables.TABLE when table is
 * not NULL. */
static long stat_of(struct fx *f, const char *table, const char *name) {
  struct buf b;
  assert_int_equal(raw(f, "GET", "/stats", NULL, &b), 200);
  json_error_t err;
  json_t *root = json_loads(b.data, 0, &err);
  assert_non_null(root);
  json_t *obj = root;
  if (table != NULL)
    obj = json_object_get(json_object_get(root, "tables"), table);
  json_t *v = json_object_get(obj, name);
  long n = json_is_integer(v) ? (long)json_integer_value(v) : -1;
  json_decref(root);
  if (n < 0)
    fail_msg("/stats has no counter %s%s%s: %s", table ? table : "",
             table ? "." : "", name, b.data);
  return n;
}

/* ---- requests through the throttle -------------------------------------- */

/* An easy handle POSTing body to URL + path (body copied). */
static CURL *post_handle(const char *url, const char *path, const char *body) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", url, path);
  CURL *c = curl_easy_init();
  if (c == NULL)
    return NULL;
  curl_easy_setopt(c, CURLOPT_URL, full);
  curl_easy_setopt(c, CURLOPT_COPYPOSTFIELDS, body);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  return c;
}

/* A policy whose 2xx bodies go to b. */
static throttle_curl_policy_t *policy_to(struct buf *b) {
  throttle_curl_policy_t *p = NULL;
  assert_int_equal(throttle_curl_policy_new(&p), 0);
  if (b != NULL) {
    b->len = 0;
    b->data[0] = 0;
    assert_int_equal(throttle_curl_policy_set_sink(p, to_buf, b), 0);
  }
  if (getenv("TEST_VERBOSE") != NULL)
    throttle_curl_policy_set_log_file(p, stderr);
  return p;
}

/* POST body to path through the throttle under key; the result. */
static throttle_curl_result_t *perform(throttle_t *h, const char *url,
                                       const char *path, const char *body,
                                       const char *key,
                                       const throttle_curl_policy_t *p) {
  CURL *c = post_handle(url, path, body);
  assert_non_null(c);
  throttle_curl_result_t *r = NULL;
  int rc = throttle_curl_perform(h, c, key, p, &r);
  curl_easy_cleanup(c);
  assert_int_equal(rc, 0);
  assert_non_null(r);
  return r;
}

static void expect_status(const throttle_curl_result_t *r,
                          throttle_curl_status_t want) {
  if (throttle_curl_result_status(r) != want)
    fail_msg("status %s (HTTP %ld %s, curl \"%s\", error %s), want %s",
             throttle_curl_status_name(throttle_curl_result_status(r)),
             throttle_curl_result_http_status(r),
             throttle_curl_result_error_code(r),
             throttle_curl_result_curl_error(r),
             throttle_err_name(throttle_curl_result_error(r)),
             throttle_curl_status_name(want));
}

/* ---- single requests ----------------------------------------------------- */

static void test_http_perform_ok_on_first_attempt(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "abc", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_attempts(r), 1);
  assert_int_equal(throttle_curl_result_http_status(r), 200);
  assert_int_equal(throttle_curl_result_outcome(r), THROTTLE_OUTCOME_OK);
  assert_int_equal(throttle_curl_result_transient(r), 0);
  assert_int_equal(throttle_curl_result_shared(r), 1);
  assert_int_equal(throttle_curl_result_admitted(r), 1);
  assert_int_equal(throttle_curl_result_unadmitted(r), 0);
  assert_int_equal(throttle_curl_result_error(r), 0);
  assert_string_equal(throttle_curl_result_curl_error(r), "");
  assert_string_equal(body.data, "{\"loaded\": 3, \"table\": \"t\"}");
  assert_int_equal(stat_of(f, NULL, "requests"), 1);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  assert_int_equal(th_remaining(h, KEY), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

static void
test_http_perform_conflict_is_permanent_and_sent_once(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables", "{\"name\":\"orders\"}", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_http_status(r), 201);
  throttle_curl_result_free(r);

  r = perform(h, f->url, "/v1/tables", "{\"name\":\"orders\"}", KEY, p);
  expect_status(r, THROTTLE_CURL_PERMANENT);
  assert_int_equal(throttle_curl_result_attempts(r), 1);
  assert_int_equal(throttle_curl_result_http_status(r), 409);
  assert_int_equal(throttle_curl_result_outcome(r), THROTTLE_OUTCOME_PERMANENT);
  assert_int_equal(throttle_curl_result_transient(r), 0);
  assert_string_equal(throttle_curl_result_error_code(r), "CONFLICT");
  assert_true(th_contains(throttle_curl_result_error_message(r), "orders"));
  size_t len = 0;
  assert_true(th_contains(throttle_curl_result_body(r, &len), "CONFLICT"));
  assert_true(len > 0);
  /* one create and one conflict: the conflict was never re-sent */
  assert_int_equal(stat_of(f, NULL, "conflicts"), 1);
  assert_int_equal(stat_of(f, NULL, "requests"), 2);
  assert_int_equal(th_remaining(h, KEY), 0); /* nothing published */
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

static void test_http_perform_429_twice_then_ok(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  admin(f, "fail", "{\"status\":429,\"count\":2}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_attempts(r), 3);
  assert_int_equal(throttle_curl_result_http_status(r), 200);
  assert_int_equal(throttle_curl_result_retry_after(r), 1000);
  assert_int_equal(stat_of(f, NULL, "rate_limited"), 2);
  assert_int_equal(stat_of(f, NULL, "requests"), 3);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

static void test_http_perform_503_with_and_without_retry_after(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  admin(f, "fail", "{\"status\":503,\"count\":1,\"retry_after\":1}");
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_attempts(r), 2);
  assert_int_equal(throttle_curl_result_retry_after(r), 1000);
  assert_int_equal(stat_of(f, NULL, "unavailable"), 1);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  throttle_curl_result_free(r);

  /* Without Retry-After the policy's default delay is published. */
  assert_int_equal(throttle_curl_policy_set_default_delay(p, 300), 0);
  admin(f, "fail", "{\"status\":503,\"count\":1,\"retry_after\":null}");
  r = perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_attempts(r), 2);
  assert_int_equal(throttle_curl_result_retry_after(r), 300);
  assert_int_equal(stat_of(f, NULL, "unavailable"), 2);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- a lock held by somebody else ---------------------------------------- */

struct load_args {
  struct fx *f;
  const char *key;
  int loads;
  struct th_gate *gate; /* NULL: start at once */
};

/* A child: its own throttle handle and easy handles, `loads` loads of one
 * table; exits 0 when each ended OK. */
static int child_loads(void *p) {
  struct load_args *a = p;
  if (a->gate != NULL)
    th_gate_wait(a->gate);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->f->th->cfg, &h) == 0);
  throttle_curl_policy_t *pol = NULL;
  TH_CHILD_CHECK(throttle_curl_policy_new(&pol) == 0);
  FILE *null = fopen("/dev/null", "w");
  TH_CHILD_CHECK(null != NULL);
  TH_CHILD_CHECK(throttle_curl_policy_set_sink(pol, NULL, null) == 0);
  if (getenv("TEST_VERBOSE") != NULL)
    throttle_curl_policy_set_log_file(pol, stderr);
  int bad = 0;
  for (int i = 0; i < a->loads; i++) {
    CURL *c = post_handle(a->f->url, "/v1/tables/" TABLE "/load", "data");
    TH_CHILD_CHECK(c != NULL);
    throttle_curl_result_t *r = NULL;
    int rc = throttle_curl_perform(h, c, a->key, pol, &r);
    curl_easy_cleanup(c);
    if (rc != 0 || throttle_curl_result_status(r) != THROTTLE_CURL_OK) {
      fprintf(stderr, "child %ld: load %d: rc %d status %s (HTTP %ld)\n",
              (long)getpid(), i, rc,
              throttle_curl_status_name(throttle_curl_result_status(r)),
              throttle_curl_result_http_status(r));
      bad++;
    }
    throttle_curl_result_free(r);
  }
  throttle_curl_policy_free(pol);
  fclose(null);
  throttle_close(h);
  return bad != 0;
}

/* Poll until throttle_remaining() of key is above 0 (a back-off has been
 * published) or the child exits; returns the largest value seen. */
static uint64_t watch_remaining(throttle_t *h, const char *key, pid_t kid) {
  uint64_t seen = 0, deadline = th_mono_ms() + HANG_GUARD_MS;
  while (th_mono_ms() < deadline) {
    uint64_t left = th_remaining(h, key);
    if (left > seen)
      seen = left;
    if (seen > 0)
      break;
    int st;
    if (waitpid(kid, &st, WNOHANG | WNOWAIT) == kid)
      break; /* done already; th_reap reports it */
    th_sleep_ms(5);
  }
  return seen;
}

static void test_http_perform_locked_waits_out_hold(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct load_args a = {.f = f, .key = KEY, .loads = 1};
  pid_t kid = th_spawn(f->th, child_loads, &a);
  /* While the table is held, the child's 409 is published: every process
   * on the host sees the key closed. */
  uint64_t seen = watch_remaining(h, KEY, kid);
  assert_true(seen > 0);
  assert_true(seen <= 1000 + 50);
  th_reap_ok(f->th, kid, HANG_GUARD_MS);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  long refused = stat_of(f, NULL, "refused");
  assert_true(refused >= 1 && refused <= 3);
}

static void test_http_perform_locked_result_in_process(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "abcd", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  unsigned n = throttle_curl_result_attempts(r);
  assert_true(n >= 2 && n <= 4);
  assert_int_equal(throttle_curl_result_retry_after(r), 1000);
  assert_string_equal(body.data, "{\"loaded\": 4, \"table\": \"t\"}");
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "refused"), (long)n - 1);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- giving up ----------------------------------------------------------- */

static void test_http_perform_retry_budget_gives_up(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  admin(f, "fail", "{\"status\":429,\"count\":10,\"retry_after\":1}");
  throttle_curl_policy_t *p = policy_to(NULL);
  assert_int_equal(throttle_curl_policy_set_retries(p, 1), 0);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_GAVE_UP);
  assert_int_equal(throttle_curl_result_attempts(r), 2);
  assert_int_equal(throttle_curl_result_transient(r), 1);
  assert_int_equal(throttle_curl_result_http_status(r), 429);
  assert_int_equal(throttle_curl_result_outcome(r),
                   THROTTLE_OUTCOME_RATE_LIMITED);
  assert_string_equal(throttle_curl_result_error_code(r), "OVERLOADED");
  assert_int_equal(throttle_curl_result_retry_after(r), 1000);
  assert_int_equal(stat_of(f, NULL, "requests"), 2);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  /* the last answer's back-off stays published for everyone */
  assert_true(th_remaining(h, KEY) > 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

static void test_http_perform_deadline_gives_up(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":60000}");
  throttle_curl_policy_t *p = policy_to(NULL);
  assert_int_equal(throttle_curl_policy_set_deadline(p, 1500), 0);
  uint64_t t0 = th_mono_ms();
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  uint64_t took = th_mono_ms() - t0;
  expect_status(r, THROTTLE_CURL_GAVE_UP);
  assert_int_equal(throttle_curl_result_transient(r), 1);
  assert_int_equal(throttle_curl_result_http_status(r), 409);
  assert_string_equal(throttle_curl_result_error_code(r), "RESOURCE_LOCKED");
  assert_true(throttle_curl_result_retry_after(r) > 0);
  assert_true(took < HANG_GUARD_MS);
  assert_true(stat_of(f, NULL, "requests") >= 1);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- transport errors ---------------------------------------------------- */

/* A loopback port nobody listens on: bound, then closed. */
static int closed_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(s >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
  close(s);
  return ntohs(a.sin_port);
}

static void test_http_perform_refused_connection_is_transport(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
  throttle_curl_policy_t *p = policy_to(NULL);
  assert_int_equal(throttle_curl_policy_set_retries(p, 2), 0);
  assert_int_equal(throttle_curl_policy_set_local_backoff(p, 1, 10), 0);
  throttle_curl_result_t *r = perform(h, url, "/v1/tables/t/load", "x", KEY, p);
  /* connection refused is worth re-sending with local back-off (the
   * server may be restarting), within the budget; then it is a transport
   * failure, not a transient answer to queue again for, and nothing is
   * ever published */
  expect_status(r, THROTTLE_CURL_TRANSPORT);
  /* but a later call may get through: transient, unlike a bad URL */
  assert_int_equal(throttle_curl_result_transient(r), 1);
  assert_int_equal(throttle_curl_result_attempts(r), 3);
  assert_int_equal(throttle_curl_result_http_status(r), 0);
  assert_int_equal(throttle_curl_result_outcome(r), THROTTLE_OUTCOME_FAILED);
  assert_int_equal(throttle_curl_result_curl_code(r), CURLE_COULDNT_CONNECT);
  assert_string_equal(throttle_curl_result_curl_error(r),
                      curl_easy_strerror(CURLE_COULDNT_CONNECT));
  assert_int_equal(throttle_curl_result_retry_after(r), 0);
  assert_int_equal(th_remaining(h, KEY), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

static void test_http_perform_unmendable_transport_error(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy_to(NULL);
  throttle_curl_result_t *r =
      perform(h, "nope://127.0.0.1", "/v1/tables/t/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_TRANSPORT);
  assert_int_equal(throttle_curl_result_attempts(r), 1);
  assert_int_equal(throttle_curl_result_transient(r), 0);
  assert_int_equal(throttle_curl_result_curl_code(r),
                   CURLE_UNSUPPORTED_PROTOCOL);
  assert_true(strlen(throttle_curl_result_curl_error(r)) > 0);
  assert_int_equal(th_remaining(h, KEY), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- Retry-After as an HTTP-date ----------------------------------------- */

static void test_http_perform_http_date_retry_after(void **state) {
  struct fx *f = *state; /* started with --date-retry-after */
  throttle_t *h = th_open(f->th);
  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_true(throttle_curl_result_attempts(r) >= 2);
  /* a date one to two seconds ahead, read against the answer's Date */
  uint64_t ra = throttle_curl_result_retry_after(r);
  assert_true(ra >= 1000 && ra <= 3000);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- fail open ----------------------------------------------------------- */

/* A segment that is not one: throttle_open() falls back to private memory,
 * which admits as usual within the process. */
static void test_http_perform_fallback_handle_completes(void **state) {
  struct fx *f = *state;
  int fd = shm_open(f->th->name, O_CREAT | O_EXCL | O_RDWR, 0600);
  assert_true(fd >= 0);
  char junk[8192];
  memset(junk, 0xab, sizeof junk);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
  throttle_t *h = NULL;
  assert_int_not_equal(throttle_open(f->th->cfg, &h), 0);
  assert_non_null(h);
  f->th->h = h; /* closed by the teardown */
  assert_int_equal(throttle_is_shared(h), 0);

  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_shared(r), 0);
  assert_int_equal(throttle_curl_result_admitted(r), 1);
  assert_true(throttle_curl_result_attempts(r) >= 2);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* Every key of a one-key segment has a back-off pending: admission fails
 * with THROTTLE_EFULL, and the request goes out anyway, its back-off
 * slept in-process. */
static void test_http_perform_fail_open_table_full(void **state) {
  struct fx *f = *state;
  assert_int_equal(throttle_config_set_capacity(f->th->cfg, 1), 0);
  throttle_t *h = th_open(f->th);
  assert_int_equal(throttle_backoff(h, "other", TH_LONG_MS), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, 0, &t),
                   THROTTLE_EFULL);

  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_admitted(r), 0);
  unsigned n = throttle_curl_result_attempts(r);
  assert_true(n >= 2);
  assert_int_equal(throttle_curl_result_unadmitted(r), n);
  assert_int_equal(throttle_curl_result_error(r), THROTTLE_EFULL);
  assert_int_equal(throttle_curl_result_retry_after(r), 1000);
  /* the Retry-After was honoured all the same */
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "refused"), (long)n - 1);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* A live process sits on the segment mutex (stopped): admission times out
 * on the lock, and the request goes out anyway. */
static int child_sits_on_mutex(void *p) {
  struct fx *f = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(f->th->cfg, &h) == 0);
  TH_CHILD_CHECK(pthread_mutex_lock(&h->hdr->mutex) == 0);
  raise(SIGSTOP);
  return 0; /* never: the parent kills it stopped */
}

static void test_http_perform_fail_open_mutex_held(void **state) {
  struct fx *f = *state;
  assert_int_equal(throttle_config_set_lock_timeout(f->th->cfg, 200), 0);
  throttle_t *h = th_open(f->th);
  pid_t kid = th_spawn(f->th, child_sits_on_mutex, f);
  th_wait_stopped(f->th, kid, HANG_GUARD_MS);

  admin(f, "hold", "{\"table\":\"" TABLE "\",\"ms\":1500}");
  struct buf body;
  throttle_curl_policy_t *p = policy_to(&body);
  throttle_curl_result_t *r =
      perform(h, f->url, "/v1/tables/" TABLE "/load", "x", KEY, p);
  expect_status(r, THROTTLE_CURL_OK);
  assert_int_equal(throttle_curl_result_admitted(r), 0);
  assert_int_equal(throttle_curl_result_error(r), THROTTLE_ELOCKTIMEOUT);
  unsigned n = throttle_curl_result_attempts(r);
  assert_true(n >= 2);
  assert_int_equal(throttle_curl_result_unadmitted(r), n);
  assert_int_equal(stat_of(f, NULL, "early"), 0);
  assert_int_equal(stat_of(f, NULL, "loads_ok"), 1);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);

  kill(kid, SIGKILL);
  th_reap_killed(f->th, kid, HANG_GUARD_MS);
}

/* A bad key is the caller's error, not the segment's: no fail open. */
static void test_http_perform_bad_key_is_an_error(void **state) {
  struct fx *f = *state;
  throttle_t *h = th_open(f->th);
  throttle_curl_policy_t *p = policy_to(NULL);
  CURL *c = post_handle(f->url, "/v1/tables/" TABLE "/load", "x");
  assert_non_null(c);
  throttle_curl_result_t *r = NULL;
  assert_int_equal(throttle_curl_perform(h, c, "", p, &r), THROTTLE_EKEY);
  curl_easy_cleanup(c);
  assert_non_null(r);
  expect_status(r, THROTTLE_CURL_ERROR);
  assert_int_equal(throttle_curl_result_error(r), THROTTLE_EKEY);
  assert_int_equal(throttle_curl_result_attempts(r), 0);
  assert_int_equal(stat_of(f, NULL, "requests"), 0);
  throttle_curl_result_free(r);
  throttle_curl_policy_free(p);
}

/* ---- many processes, one table ------------------------------------------- */

#define PROCS 8
#define LOADS 3

static void test_http_perform_multiproc_one_table(void **state) {
  struct fx *f = *state; /* service 20 ms, Retry-After 1 */
  th_open(f->th);        /* creates the segment before the children race */
  struct th_gate gate;
  th_gate_init(&gate);
  struct load_args a = {.f = f, .key = KEY, .loads = LOADS, .gate = &gate};
  pid_t kids[PROCS];
  for (int i = 0; i < PROCS; i++)
    kids[i] = th_spawn(f->th, child_loads, &a);
  th_gate_open(&gate);
  for (int i = 0; i < PROCS; i++)
    th_reap_ok(f->th, kids[i], HANG_GUARD_MS * 2);
  th_gate_close(&gate);
  long ok = stat_of(f, NULL, "loads_ok"), early = stat_of(f, NULL, "early"),
       refused = stat_of(f, NULL, "refused");
  print_message("%d processes x %d loads: loads_ok %ld refused %ld early %ld "
                "max_concurrent %ld\n",
                PROCS, LOADS, ok, refused, early,
                stat_of(f, TABLE, "max_concurrent"));
  assert_int_equal(ok, PROCS * LOADS);
  assert_int_equal(early, 0);
  assert_true(refused <= 3);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
#define TD(fn) cmocka_unit_test_setup_teardown(fn, setup_date, teardown)

int main(void) {
  /* Once, before any fork: children inherit it and create their own easy
   * handles. */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return 1;
  const struct CMUnitTest tests[] = {
      T(test_http_perform_ok_on_first_attempt),
      T(test_http_perform_conflict_is_permanent_and_sent_once),
      T(test_http_perform_429_twice_then_ok),
      T(test_http_perform_503_with_and_without_retry_after),
      T(test_http_perform_locked_waits_out_hold),
      T(test_http_perform_locked_result_in_process),
      T(test_http_perform_retry_budget_gives_up),
      T(test_http_perform_deadline_gives_up),
      T(test_http_perform_refused_connection_is_transport),
      T(test_http_perform_unmendable_transport_error),
      TD(test_http_perform_http_date_retry_after),
      T(test_http_perform_fallback_handle_completes),
      T(test_http_perform_fail_open_table_full),
      T(test_http_perform_fail_open_mutex_held),
      T(test_http_perform_bad_key_is_an_error),
      T(test_http_perform_multiproc_one_table),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
