/* SPDX-License-Identifier: MIT */
/*
 * test_refusal.c — throttle_note_refusal() and throttle_info_refusal():
 * what the server said is kept in the key's record with the noting
 * process's pid, host and wall-clock time, and read back by another
 * process (fork); a key without a note says ENOKEY; hostile text (control
 * bytes, C1, bidirectional overrides, bytes that are not UTF-8, a message
 * far past the bound) is kept as bounded UTF-8 without a control byte;
 * a record whose refusal was forged in shared memory (no NUL, a status
 * out of range, raw control bytes) is judged again when read (I8); and on
 * Redis the note is this host's, shown with the backend's snapshot.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"
#include "redis_helpers.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct said {
  int rc, status;
  const char *code, *msg, *ra, *host;
  int64_t at_ms, pid;
  throttle_info_t *info;
};

static void read_said(throttle_t *h, const char *key, struct said *s) {
  assert_int_equal(throttle_info(h, key, &s->info), 0);
  s->rc = throttle_info_refusal(s->info, &s->status, &s->code, &s->msg,
                                &s->ra, &s->at_ms, &s->pid, &s->host);
}

/* Valid UTF-8 and no control byte (C0, DEL, C1 as U+0080-U+009F), no
 * bidirectional override: what a terminal may be handed. */
static void assert_clean(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2
                              : c >= 0xe0 && c <= 0xef ? 3
                              : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0)
      fail_msg("not UTF-8 at byte %zu of \"%s\"", (size_t)(p - (const unsigned char *)s), s);
    for (size_t i = 1; i < len; i++)
      if ((p[i] & 0xc0) != 0x80)
        fail_msg("a cut UTF-8 sequence in \"%s\"", s);
    if (c < 0x20 || c == 0x7f)
      fail_msg("control byte 0x%02x in \"%s\"", c, s);
    if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
      fail_msg("C1 control in \"%s\"", s);
    if (c == 0xe2 && p[1] == 0x80 && p[2] >= 0xaa && p[2] <= 0xae)
      fail_msg("bidirectional override in \"%s\"", s);
    p += len;
  }
}

static void test_refusal_kept_and_read_back(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  struct said s;
  assert_int_equal(throttle_backoff(h, "ws/orders", 5000), 0);
  read_said(h, "ws/orders", &s);
  assert_int_equal(s.rc, THROTTLE_ENOKEY); /* none noted yet */
  assert_int_equal(s.status, 0);
  assert_string_equal(s.code, "");
  assert_string_equal(s.msg, "");
  throttle_info_free(s.info);

  int64_t before = wall_ms();
  assert_int_equal(throttle_note_refusal(h, "ws/orders", 409, "RESOURCE_LOCKED",
                                         "table orders is locked by another "
                                         "operation",
                                         "5"),
                   0);
  int64_t after = wall_ms();
  read_said(h, "ws/orders", &s);
  assert_int_equal(s.rc, 0);
  assert_int_equal(s.status, 409);
  assert_string_equal(s.code, "RESOURCE_LOCKED");
  assert_string_equal(s.msg, "table orders is locked by another operation");
  assert_string_equal(s.ra, "5");
  assert_int_equal(s.pid, getpid());
  char host[256];
  assert_int_equal(gethostname(host, sizeof host), 0);
  host[63] = 0;
  assert_string_equal(s.host, host);
  assert_true(s.at_ms >= before - 1 && s.at_ms <= after + 1);
  /* the back-off itself is untouched by the note */
  assert_int_equal(throttle_info_get(s.info, THROTTLE_FIELD_PUBLISHES), 1);
  throttle_info_free(s.info);

  /* NULL and "" are "not sent"; a later note replaces the earlier one */
  assert_int_equal(throttle_note_refusal(h, "ws/orders", 503, NULL, "", NULL),
                   0);
  read_said(h, "ws/orders", &s);
  assert_int_equal(s.status, 503);
  assert_string_equal(s.code, "");
  assert_string_equal(s.ra, "");
  throttle_info_free(s.info);

  /* the arguments are checked; out pointers may be NULL */
  assert_int_equal(throttle_note_refusal(NULL, "k", 409, NULL, NULL, NULL),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_note_refusal(h, "k", 99, NULL, NULL, NULL),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_note_refusal(h, "k", 1000, NULL, NULL, NULL),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_note_refusal(h, "", 409, NULL, NULL, NULL),
                   THROTTLE_EKEY);
  assert_int_equal(throttle_info_refusal(NULL, NULL, NULL, NULL, NULL, NULL,
                                         NULL, NULL),
                   THROTTLE_EINVAL);
}

/* A child notes; the parent, another process, reads the child's pid. */
static void test_refusal_seen_by_another_process(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    throttle_t *c = NULL;
    if (throttle_open(fx->cfg, &c) != 0 ||
        throttle_note_refusal(c, "ws/users", 429, "OVERLOADED", "slow down",
                              "Wed, 21 Oct 2026 07:28:00 GMT") != 0)
      _exit(1);
    throttle_close(c);
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  struct said s;
  read_said(h, "ws/users", &s);
  assert_int_equal(s.rc, 0);
  assert_int_equal(s.status, 429);
  assert_int_equal(s.pid, pid);
  assert_string_equal(s.ra, "Wed, 21 Oct 2026 07:28:00 GMT");
  throttle_info_free(s.info);
}

static void test_refusal_hostile_text_is_bounded_utf8(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  struct said s;
  /* controls, ESC sequences, C1 (raw and as UTF-8), a bidirectional
   * override, bytes that are not UTF-8 (lone continuation, overlong '/',
   * a surrogate, a cut sequence at the end) */
  const char *msg = "a\x01" "b\x1b[31mred\n\tline\x7f" "c\x9b" "d\xc2\x9b"
                    "e\xe2\x80\xae" "f\x80" "g\xc0\xaf" "h\xed\xa0\x80" "i\xe2\x82";
  assert_int_equal(throttle_note_refusal(h, "k", 409, "RESOURCE\x1b]0;x\x07",
                                         msg, "5\r\nX-Evil: 1"),
                   0);
  read_said(h, "k", &s);
  assert_int_equal(s.rc, 0);
  assert_clean(s.code);
  assert_clean(s.msg);
  assert_clean(s.ra);
  assert_string_equal(s.code, "RESOURCE ]0;x ");
  assert_string_equal(s.msg, "a b [31mred  line c?d e f?g??h???i??");
  assert_string_equal(s.ra, "5  X-Evil: 1");
  throttle_info_free(s.info);

  /* far past the bound: cut, marked, never inside a UTF-8 sequence */
  char big[4096];
  size_t n = 0;
  while (n + 2 < sizeof big) {
    big[n++] = (char)0xc3; /* é */
    big[n++] = (char)0xa9;
  }
  big[n] = 0;
  assert_int_equal(throttle_note_refusal(h, "k", 409, big, big, big), 0);
  read_said(h, "k", &s);
  assert_clean(s.msg);
  assert_clean(s.code);
  assert_true(strlen(s.msg) <= THROTTLE__REFUSAL_MSG - 1);
  assert_true(strlen(s.msg) >= THROTTLE__REFUSAL_MSG - 5);
  assert_string_equal(s.msg + strlen(s.msg) - 3, "...");
  assert_true(strlen(s.code) <= THROTTLE__REFUSAL_CODE - 1);
  assert_string_equal(s.code + strlen(s.code) - 3, "...");
  throttle_info_free(s.info);
}

/* I8: the record's refusal forged in place is judged again when read. */
static void test_refusal_forged_record_is_judged(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_note_refusal(h, "k", 409, "X", "y", "1"), 0);
  struct throttle__rec *r = th_rec(h, "k");
  assert_int_equal(throttle__lock(h), 0);
  memset(r->refusal.msg, 'A', sizeof r->refusal.msg); /* no NUL */
  r->refusal.msg[3] = '\x1b';
  r->refusal.code[0] = (char)0xff;
  memset(r->refusal.host, 0x9b, sizeof r->refusal.host);
  throttle__unlock(h);
  struct said s;
  read_said(h, "k", &s);
  assert_int_equal(s.rc, 0);
  assert_clean(s.msg);
  assert_clean(s.code);
  assert_clean(s.host);
  assert_true(strlen(s.msg) < THROTTLE__REFUSAL_MSG);
  assert_int_equal(s.msg[3], ' ');
  throttle_info_free(s.info);

  assert_int_equal(throttle__lock(h), 0);
  r->refusal.status = 7; /* no HTTP status: not a note of the library */
  throttle__unlock(h);
  read_said(h, "k", &s);
  assert_int_equal(s.rc, THROTTLE_ENOKEY);
  assert_string_equal(s.msg, "");
  throttle_info_free(s.info);
}

/* ---- Redis: the note is this host's, shown with the backend's snapshot */

static struct th_redis R;
static int rsetup(void **state) { return th_redis_setup(state, &R); }
static int rteardown(void **state) { return th_redis_teardown(state, &R); }

static int with_refusal(const throttle_info_t *info, void *arg) {
  int *seen = arg;
  int status = 0;
  if (strcmp(throttle_info_key(info), "ws/orders") == 0 &&
      throttle_info_refusal(info, &status, NULL, NULL, NULL, NULL, NULL,
                            NULL) == 0)
    *seen = status;
  return 0;
}

static void test_refusal_redis_shows_this_host_s(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  assert_string_equal(throttle_backend(h), R.url);
  assert_int_equal(throttle_backoff(h, "ws/orders", 5000), 0);
  assert_int_equal(throttle_note_refusal(h, "ws/orders", 409, "RESOURCE_LOCKED",
                                         "locked", "5"),
                   0);
  struct said s;
  read_said(h, "ws/orders", &s); /* Redis answers; the words are merged */
  assert_int_equal(s.rc, 0);
  assert_int_equal(s.status, 409);
  assert_string_equal(s.msg, "locked");
  assert_int_equal(throttle_info_get(s.info, THROTTLE_FIELD_PUBLISHES), 1);
  throttle_info_free(s.info);
  int seen = 0;
  assert_int_equal(throttle_foreach(h, with_refusal, &seen), 0);
  assert_int_equal(seen, 409);
}

int main(int argc, char **argv) {
  (void)argc;
  const struct CMUnitTest shm[] = {
      cmocka_unit_test_setup_teardown(test_refusal_kept_and_read_back,
                                      th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_refusal_seen_by_another_process,
                                      th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_refusal_hostile_text_is_bounded_utf8,
                                      th_setup, th_teardown),
      cmocka_unit_test_setup_teardown(test_refusal_forged_record_is_judged,
                                      th_setup, th_teardown),
  };
  int rc = cmocka_run_group_tests(shm, NULL, NULL);
  if (!th_redis_available()) {
    printf("SKIP the Redis cases: redis-server is not installed (make deps)\n");
    return rc;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest redis[] = {
      cmocka_unit_test_setup_teardown(test_refusal_redis_shows_this_host_s,
                                      rsetup, rteardown),
  };
  return rc | cmocka_run_group_tests(redis, NULL, NULL);
}
