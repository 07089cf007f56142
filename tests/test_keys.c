/* SPDX-License-Identifier: MIT */
/*
 * test_keys.c — key syntax (table.c throttle__check_key): a key is a path
 * of names joined by '/', 1 to 255 bytes, none empty, no control byte, at
 * most THROTTLE_KEY_MAX_SCOPES scopes; anything else is THROTTLE_EKEY from
 * every entry point, with the reason in the message, on the segment and
 * on Redis alike (a deeper key lost its deepest scopes there), and from
 * throttlectl (exit 64).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"
#include "redis_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct th_fx *fx_of(void **state) { return *state; }
static char ctl_path[512]; /* $B/throttlectl */

/* A key with n scopes: "s0/s1/.../sn" (n + 1 names). */
static void deep_key(char *buf, size_t len, int n) {
  size_t at = 0;
  for (int i = 0; i <= n; i++)
    at += (size_t)snprintf(buf + at, len - at, "%ss%d", i ? "/" : "", i);
}

/* Every entry point that takes a key refuses this one. */
static void expect_refused(throttle_t *h, const char *key, const char *why) {
  uint64_t ms = 0;
  throttle_ticket_t *t = NULL;
  throttle_info_t *info = NULL;
  int rcs[] = {
      throttle_check_key(key),
      throttle_backoff(h, key, 1000),
      throttle_remaining(h, key, &ms),
      throttle_wait(h, key, 0),
      throttle_clear(h, key),
      throttle_pause(h, key),
      throttle_resume(h, key),
      throttle_cancel(h, key),
      throttle_set_max_parallel(h, key, 2),
      throttle_set_rate(h, key, 5, 1000),
      throttle_enter(h, key, THROTTLE_CLASS_LIVE, 0, &t),
      throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
      throttle_info(h, key, &info),
  };
  for (size_t i = 0; i < sizeof rcs / sizeof rcs[0]; i++)
    if (rcs[i] != THROTTLE_EKEY)
      fail_msg("key \"%s\", call %zu: %s, not THROTTLE_EKEY", key, i,
               throttle_err_name(rcs[i]));
  assert_null(t);
  assert_null(info);
  assert_int_equal(throttle_check_key(key), THROTTLE_EKEY);
  for (const char *m = throttle_errmsg(NULL); *m; m++)
    if ((unsigned char)*m < 0x20 || *m == 0x7f)
      fail_msg("key \"%s\": the message holds a control byte", key);
  if (strstr(throttle_errmsg(NULL), why) == NULL)
    fail_msg("key \"%s\": message \"%s\" does not say \"%s\"", key,
             throttle_errmsg(NULL), why);
  assert_int_equal(throttle_backoff(h, key, 1000), THROTTLE_EKEY);
  if (strstr(throttle_errmsg(h), why) == NULL)
    fail_msg("key \"%s\": handle's message \"%s\" does not say \"%s\"", key,
             throttle_errmsg(h), why);
}

static void expect_accepted(throttle_t *h, const char *key) {
  uint64_t ms = 0;
  assert_int_equal(throttle_check_key(key), 0);
  assert_int_equal(throttle_backoff(h, key, 1), 0);
  assert_int_equal(throttle_remaining(h, key, &ms), 0);
  assert_int_equal(throttle_clear(h, key), 0);
}

static void check_syntax(throttle_t *h) {
  static const char *const empty_name[] = {
      "/a", "a/", "a//b", "/", "//", "ws1//orders", "ws1/orders/",
      "/ws1/orders", "a/b/c//d/e/f/g/h/i/j", "0123456789abcdef//x"};
  for (size_t i = 0; i < sizeof empty_name / sizeof empty_name[0]; i++)
    expect_refused(h, empty_name[i], "empty name");
  static const char *const control[] = {
      "a\tb", "ws1/or\nders", "\x01", "ws1/\x7f", "0123456789abcdef\x1f",
      "0123456789abcde\x1b", "\x1b[2Jorders", "/a//\x1b]0;t"};
  for (size_t i = 0; i < sizeof control / sizeof control[0]; i++)
    expect_refused(h, control[i], "control byte");
  /* refused for another reason, holding a C1 control (U+009B, a CSI to
   * some terminals; a raw 0x9b byte, one to an 8-bit terminal): the
   * message says why without quoting them */
  static const char *const c1[] = {"a//\xc2\x9b" "2J", "a//\x9b" "2J",
                                   "\xc2\x85/", "ws\x9b/"};
  for (size_t i = 0; i < sizeof c1 / sizeof c1[0]; i++) {
    expect_refused(h, c1[i], "empty name");
    if (strchr(throttle_errmsg(h), '\x9b') != NULL ||
        strstr(throttle_errmsg(h), "\xc2\x85") != NULL)
      fail_msg("key %zu: the message quotes a C1 control", i);
  }
  static const char *const good[] = {
      "a", "hotdata:ws1/orders", "a b/c d", "caf\xc3\xa9/t\xc3\xa4\x62le",
      "x/y/z", "0123456789abcdef/0123456789abcdef/0", "~!@#$%^&*()_+"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    expect_accepted(h, good[i]);
  char key[THROTTLE__KEY_MAX + 1];
  deep_key(key, sizeof key, THROTTLE_KEY_MAX_SCOPES);
  expect_accepted(h, key);
  deep_key(key, sizeof key, THROTTLE_KEY_MAX_SCOPES + 1);
  expect_refused(h, key, "THROTTLE_KEY_MAX_SCOPES");
  /* every byte in every position of a word (the check reads 8 at once) */
  for (size_t len = 1; len <= 40; len++)
    for (size_t at = 0; at < len; at++) {
      memset(key, 'k', len);
      key[len] = 0;
      key[at] = '\x05';
      expect_refused(h, key, "control byte");
      if (at > 0 && at + 1 < len) {
        key[at] = '/';
        expect_accepted(h, key);
        key[at + 1] = '/';
        if (at + 2 < len)
          expect_refused(h, key, "empty name");
      }
    }
}

static void test_keys_syntax_is_refused_on_the_segment(void **state) {
  check_syntax(th_open(fx_of(state)));
}

/* On Redis the same keys are refused (the same check, before the
 * backend), and a key with THROTTLE_KEY_MAX_SCOPES scopes is held by its
 * deepest scope's back-off there too. */
static struct th_redis R;

static int redis_setup(void **state) { return th_redis_setup(state, &R); }

static int redis_teardown(void **state) {
  int rc = th_teardown(state);
  th_redis_cleanup(&R);
  return rc;
}

static void test_keys_syntax_is_refused_on_redis(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_string_not_equal(throttle_backend(h), "shm");
  check_syntax(h);
}

static void test_keys_deepest_scope_holds_on_redis(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  char key[THROTTLE__KEY_MAX + 1], scope[THROTTLE__KEY_MAX + 1];
  deep_key(key, sizeof key, THROTTLE_KEY_MAX_SCOPES);
  /* the deepest scope: all but the last name */
  strcpy(scope, key);
  *strrchr(scope, '/') = 0;
  assert_int_equal(throttle_backoff(h, scope, 10000), 0);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  assert_int_equal(
      throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_null(t);
  assert_true(wait_ms > 5000);
  assert_int_equal(throttle_clear(h, scope), 0);
  assert_int_equal(throttle_pause(h, scope), 0);
  assert_int_equal(
      throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_resume(h, scope), 0);
  assert_int_equal(throttle_try_enter(h, key, THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* throttlectl refuses them as usage errors (exit 64), saying why. */
static int ctl_status(const char *seg, const char *cmd, const char *key,
                      const char *extra, const char *why) {
  char out[512];
  snprintf(out, sizeof out, "/tmp/test_keys-%d.err", (int)getpid());
  pid_t pid = fork();
  if (pid == 0) {
    FILE *f = freopen(out, "w", stderr);
    (void)f;
    execl(ctl_path, "throttlectl", "--segment", seg, cmd, key, extra,
          (char *)NULL);
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  FILE *f = fopen(out, "r");
  char text[1024] = "";
  size_t n = f != NULL ? fread(text, 1, sizeof text - 1, f) : 0;
  text[n] = 0;
  if (f != NULL)
    fclose(f);
  unlink(out);
  if (why != NULL && strstr(text, why) == NULL)
    fail_msg("throttlectl %s \"%s\": \"%s\" does not say \"%s\"", cmd, key,
             text, why);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_keys_throttlectl_refuses_bad_keys(void **state) {
  struct th_fx *fx = fx_of(state);
  th_open(fx);
  char deep[THROTTLE__KEY_MAX + 1];
  deep_key(deep, sizeof deep, THROTTLE_KEY_MAX_SCOPES + 1);
  const char *bad[] = {"a//b", "/a", "a/", "a\tb", deep};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(ctl_status(fx->name, "backoff", bad[i], "5", "KEY"),
                     64);
    assert_int_equal(ctl_status(fx->name, "show", bad[i], NULL, "KEY"), 64);
    assert_int_equal(ctl_status(fx->name, "watch", bad[i], NULL, "KEY"), 64);
  }
  assert_int_equal(ctl_status(fx->name, "backoff", "ws1/orders", "5", NULL),
                   0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)
#define TR(f) cmocka_unit_test_setup_teardown(f, redis_setup, redis_teardown)

int main(int argc, char **argv) {
  (void)argc;
  const char *b = getenv("B");
  snprintf(ctl_path, sizeof ctl_path, "%s/throttlectl",
           b != NULL && *b ? b : "build");
  const struct CMUnitTest tests[] = {
      T(test_keys_syntax_is_refused_on_the_segment),
      T(test_keys_throttlectl_refuses_bad_keys),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (!th_redis_available()) {
    printf("SKIP test_keys on Redis: redis-server is not installed (make "
           "deps)\n");
    return rc;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest redis_tests[] = {
      TR(test_keys_syntax_is_refused_on_redis),
      TR(test_keys_deepest_scope_holds_on_redis),
  };
  return rc | cmocka_run_group_tests_name("redis", redis_tests, NULL, NULL);
}
