/* SPDX-License-Identifier: MIT */
/*
 * test_backoff.c — the back-off API: publish, peek, wait, clear, reset,
 * counters, argument checking, errors, versions and configuration.
 *
 * Timing assertions are lower bounds (I1: never early); upper bounds are
 * only generous hang guards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_GUARD_MS 10000

static struct th_fx *fx_of(void **state) { return *state; }

static int64_t info_field(throttle_t *h, const char *key, throttle_field_t f) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, key, &info);
  if (rc != 0)
    fail_msg("throttle_info(%s): %s: %s", key, throttle_err_name(rc),
             throttle_errmsg(h));
  int64_t v = throttle_info_get(info, f);
  throttle_info_free(info);
  return v;
}

/* ---- publish and peek --------------------------------------------------- */

static void test_backoff_publish_sets_remaining(void **state) {
  throttle_t *h = th_open(fx_of(state));
  assert_int_equal(th_remaining(h, "orders"), 0); /* never seen: open */
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "orders", 5000), 0);
  uint64_t ms = th_remaining(h, "orders");
  uint64_t t1 = th_now_ns();
  assert_true(ms > 0);
  assert_true(ms <= 5000);
  /* not-before >= t0 + 5 s, so at t <= t1 at least this much is left */
  assert_true(ms * NS_PER_MS + (t1 - t0) >= 5000 * NS_PER_MS);
  assert_int_equal(th_remaining(h, "other"), 0);
}

static void test_backoff_never_moves_earlier(void **state) {
  throttle_t *h = th_open(fx_of(state));
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "k", 5000), 0);
  assert_int_equal(throttle_backoff(h, "k", 100), 0);
  assert_int_equal(throttle_backoff(h, "k", 0), 0);
  uint64_t ms = th_remaining(h, "k");
  uint64_t t1 = th_now_ns();
  assert_true(ms * NS_PER_MS + (t1 - t0) >= 5000 * NS_PER_MS);
  /* and a longer one does move it later */
  assert_int_equal(throttle_backoff(h, "k", 20000), 0);
  ms = th_remaining(h, "k");
  uint64_t t2 = th_now_ns();
  assert_true(ms * NS_PER_MS + (t2 - t1) >= 20000 * NS_PER_MS);
}

static void test_backoff_clamps_to_max_delay(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 1000), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", UINT64_C(1000000000)), 0);
  uint64_t ms = th_remaining(h, "k");
  assert_true(ms > 0);
  assert_true(ms <= 1000);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_DELAY_MS), 1000);
  assert_true(info_field(h, "k", THROTTLE_FIELD_REMAINING_MS) <= 1000);
}

static void test_backoff_huge_delay_does_not_overflow(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx); /* default maximum: 900000 ms */
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "k", UINT64_MAX), 0);
  assert_int_equal(throttle_backoff(h, "k", UINT64_MAX / 2 + 1), 0);
  assert_int_equal(throttle_backoff(h, "j", UINT64_MAX / NS_PER_MS + 1), 0);
  uint64_t ms = th_remaining(h, "k");
  uint64_t mj = th_remaining(h, "j");
  uint64_t t1 = th_now_ns();
  assert_true(ms <= 900000 && mj <= 900000);
  /* clamped, not wrapped around to something small */
  assert_true(ms * NS_PER_MS + (t1 - t0) >= 900000 * NS_PER_MS);
  assert_true(mj * NS_PER_MS + (t1 - t0) >= 900000 * NS_PER_MS);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_DELAY_MS), 900000);
  /* a huge timeout saturates to "no deadline" rather than wrapping into
   * one in the past */
  assert_int_equal(throttle_backoff(h, "short", 50), 0);
  assert_int_equal(throttle_wait(h, "short", UINT64_MAX - 1), 0);
  assert_int_equal(th_remaining(h, "short"), 0);
}

/* ---- wait --------------------------------------------------------------- */

static void test_backoff_wait_returns_no_earlier_than_not_before(void **state) {
  throttle_t *h = th_open(fx_of(state));
  uint64_t m0 = th_mono_ms();
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "k", 300), 0);
  assert_int_equal(throttle_wait(h, "k", THROTTLE_FOREVER), 0);
  uint64_t t1 = th_now_ns();
  assert_true(t1 - t0 >= 300 * NS_PER_MS);
  assert_int_equal(th_remaining(h, "k"), 0);
  assert_true(th_mono_ms() - m0 < HANG_GUARD_MS);
}

static void test_backoff_wait_with_enough_timeout_succeeds(void **state) {
  throttle_t *h = th_open(fx_of(state));
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "k", 200), 0);
  assert_int_equal(throttle_wait(h, "k", 5000), 0);
  assert_true(th_now_ns() - t0 >= 200 * NS_PER_MS);
}

static void test_backoff_wait_timeout_returns_etimedout_promptly(void **state) {
  throttle_t *h = th_open(fx_of(state));
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_wait(h, "k", 100), THROTTLE_ETIMEDOUT);
  uint64_t took = th_mono_ms() - m0;
  /* "at once": far less than the 30 s back-off (a hang guard, not a
   * performance bound) */
  assert_true(took < 5000);
  assert_true(strlen(throttle_errmsg(h)) > 0);
  assert_true(th_remaining(h, "k") > 0);
  assert_int_equal(throttle_wait(h, "k", 0), THROTTLE_ETIMEDOUT);
}

static void test_backoff_wait_unknown_key_returns_at_once(void **state) {
  throttle_t *h = th_open(fx_of(state));
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_wait(h, "never-seen", THROTTLE_FOREVER), 0);
  assert_int_equal(throttle_wait(h, "never-seen", 0), 0);
  assert_true(th_mono_ms() - m0 < 5000);
  /* waiting does not create the key */
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(h, "never-seen", &info), THROTTLE_ENOKEY);
  assert_null(info);
  /* a key whose back-off was cleared is open too */
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_int_equal(throttle_clear(h, "k"), 0);
  assert_int_equal(throttle_wait(h, "k", 0), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_WAITS), 0);
}

struct clear_arg {
  struct th_fx *fx;
  pid_t parent;
  int fd; /* write end: the time just before the clear */
  int reset;
};

static int child_clears_after_200ms(void *p) {
  struct clear_arg *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  th_sleep_ms(200);
  th_wait_sleeping(a->parent, 5000); /* let it be asleep in its wait */
  th_send_u64(a->fd, th_now_ns());
  TH_CHILD_CHECK((a->reset ? throttle_reset(h) : throttle_clear(h, "k")) == 0);
  throttle_close(h);
  return 0;
}

static void wait_wakes(void **state, int reset) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct clear_arg a = {fx, getpid(), fds[1], reset};
  uint64_t m0 = th_mono_ms();
  pid_t pid = th_spawn(fx, child_clears_after_200ms, &a);
  close(fds[1]);
  int rc = throttle_wait(h, "k", THROTTLE_FOREVER);
  uint64_t t_ret = th_now_ns();
  uint64_t took = th_mono_ms() - m0;
  uint64_t t_clear = 0;
  int got = th_recv_u64(fds[0], &t_clear);
  close(fds[0]);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_int_equal(rc, 0);
  assert_int_equal(got, 0);
  assert_true(t_ret >= t_clear); /* not before the clear began */
  assert_true(took >= 200);
  assert_true(took < HANG_GUARD_MS); /* well before the 30 s back-off */
  assert_int_equal(th_remaining(h, "k"), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_CLEARS), 1);
}

static void test_backoff_wait_wakes_on_clear(void **state) {
  wait_wakes(state, 0);
}

static void test_backoff_wait_wakes_on_reset(void **state) {
  wait_wakes(state, 1);
}

struct extend_arg {
  struct th_fx *fx;
  pid_t parent;
  int fd;
};

static int child_extends(void *p) {
  struct extend_arg *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  th_wait_sleeping(a->parent, 5000);
  uint64_t t0 = th_now_ns();
  TH_CHILD_CHECK(throttle_backoff(h, "k", 2000) == 0);
  th_send_u64(a->fd, t0);
  th_send_u64(a->fd, th_now_ns());
  throttle_close(h);
  return 0;
}

/* A back-off extended while a waiter sleeps makes it sleep on. */
static void test_backoff_wait_sleeps_on_when_extended(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  uint64_t tp = th_now_ns();
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct extend_arg a = {fx, getpid(), fds[1]};
  pid_t pid = th_spawn(fx, child_extends, &a);
  close(fds[1]);
  assert_int_equal(throttle_wait(h, "k", THROTTLE_FOREVER), 0);
  uint64_t t_ret = th_now_ns();
  uint64_t t_pub = 0, t_done = 0;
  int got = th_recv_u64(fds[0], &t_pub) | th_recv_u64(fds[0], &t_done);
  close(fds[0]);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_int_equal(got, 0);
  assert_true(t_ret - tp >= 1000 * NS_PER_MS);
  if (t_done < tp + 1000 * NS_PER_MS) {
    /* The extension landed before the first not-before passed, so the
     * waiter cannot have returned before the new one. */
    assert_true(t_ret >= t_pub + 2000 * NS_PER_MS);
  } else {
    print_message("child published its extension late (%llu ms after the "
                  "first back-off); only the first bound was checked\n",
                  (unsigned long long)((t_done - tp) / NS_PER_MS));
  }
}

/* ---- clear and reset ---------------------------------------------------- */

static void test_backoff_clear_unknown_key_is_enokey(void **state) {
  throttle_t *h = th_open(fx_of(state));
  assert_int_equal(throttle_clear(h, "nope"), THROTTLE_ENOKEY);
  assert_true(th_contains(throttle_errmsg(h), "nope"));
  /* a later success clears the message */
  assert_int_equal(throttle_backoff(h, "k", 10), 0);
  assert_string_equal(throttle_errmsg(h), "");
}

static void test_backoff_clear_opens_key_keeps_counters(void **state) {
  throttle_t *h = th_open(fx_of(state));
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_int_equal(throttle_backoff(h, "other", 30000), 0);
  assert_int_equal(throttle_clear(h, "k"), 0);
  assert_int_equal(th_remaining(h, "k"), 0);
  assert_true(th_remaining(h, "other") > 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_PUBLISHES), 1);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_CLEARS), 1);
  /* clearing an open key is still a success */
  assert_int_equal(throttle_clear(h, "k"), 0);
  /* and it can be published again afterwards */
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
}

static void test_backoff_reset_opens_every_key(void **state) {
  throttle_t *h = th_open(fx_of(state));
  const char *keys[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(throttle_backoff(h, keys[i], 30000), 0);
  assert_int_equal(throttle_reset(h), 0);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(th_remaining(h, keys[i]), 0);
    assert_int_equal(info_field(h, keys[i], THROTTLE_FIELD_CLEARS), 1);
    assert_int_equal(info_field(h, keys[i], THROTTLE_FIELD_PUBLISHES), 1);
  }
  uint32_t used = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, NULL, NULL), 0);
  assert_int_equal(used, 4); /* reset drops back-offs, not keys */
  assert_int_equal(throttle_reset(h), 0); /* nothing pending: still fine */
  assert_int_equal(info_field(h, "a", THROTTLE_FIELD_CLEARS), 1);
}

/* ---- counters ----------------------------------------------------------- */

static int child_publishes(void *p) {
  struct th_fx *fx = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_backoff(h, "k", 10) == 0);
  throttle_close(h);
  return 0;
}

static void test_backoff_counters_via_info(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 5000), 0);
  assert_int_equal(throttle_backoff(h, "k", 100), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_PUBLISHES), 2);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_DELAY_MS), 100);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_PUBLISHER_PID),
                   getpid());
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_WAITS), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_WAITED_MS), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_CLEARS), 0);
  assert_true(info_field(h, "k", THROTTLE_FIELD_REMAINING_MS) > 0);
  assert_true(info_field(h, "k", THROTTLE_FIELD_IDLE_MS) >= 0);

  /* a wait that sleeps counts once, with the time it slept */
  assert_int_equal(throttle_clear(h, "k"), 0);
  assert_int_equal(throttle_backoff(h, "k", 300), 0);
  uint64_t m0 = th_now_ns();
  assert_int_equal(throttle_wait(h, "k", THROTTLE_FOREVER), 0);
  uint64_t took_ms = (th_now_ns() - m0) / NS_PER_MS;
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_WAITS), 1);
  int64_t waited = info_field(h, "k", THROTTLE_FIELD_WAITED_MS);
  assert_true(waited > 0);
  assert_true((uint64_t)waited <= took_ms + 1);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_PUBLISHES), 3);
  /* a wait on an open key does not count */
  assert_int_equal(throttle_wait(h, "k", THROTTLE_FOREVER), 0);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_WAITS), 1);

  /* another process's publish is attributed to it */
  pid_t pid = th_spawn(fx, child_publishes, fx);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_PUBLISHER_PID), pid);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_LAST_DELAY_MS), 10);
  assert_int_equal(info_field(h, "k", THROTTLE_FIELD_PUBLISHES), 4);

  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(h, "k", &info), 0);
  assert_string_equal(throttle_info_key(info), "k");
  assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_COUNT_), 0);
  assert_int_equal(throttle_info_get(info, (throttle_field_t)-1), 0);
  throttle_info_free(info);
  assert_int_equal(throttle_info_get(NULL, THROTTLE_FIELD_PUBLISHES), 0);
  assert_string_equal(throttle_info_key(NULL), "");
}

/* ---- bad input ---------------------------------------------------------- */

static void test_backoff_rejects_null_handle(void **state) {
  (void)state;
  uint64_t ms;
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_backoff(NULL, "k", 1), THROTTLE_EINVAL);
  assert_int_equal(throttle_remaining(NULL, "k", &ms), THROTTLE_EINVAL);
  assert_int_equal(throttle_wait(NULL, "k", 0), THROTTLE_EINVAL);
  assert_int_equal(throttle_clear(NULL, "k"), THROTTLE_EINVAL);
  assert_int_equal(throttle_reset(NULL), THROTTLE_EINVAL);
  assert_int_equal(throttle_info(NULL, "k", &info), THROTTLE_EINVAL);
  assert_int_equal(throttle_stats(NULL, NULL, NULL, NULL, NULL),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_open(NULL, NULL), THROTTLE_EINVAL);
  assert_int_equal(throttle_is_shared(NULL), 0);
  assert_string_equal(throttle_errmsg(NULL), "");
  assert_string_equal(throttle_segment_name(NULL), "");
  throttle_close(NULL);
  throttle_info_free(NULL);
  throttle_config_free(NULL);
}

static int never_called(const throttle_info_t *info, void *arg) {
  (void)info;
  (void)arg;
  return 1;
}

static void test_backoff_rejects_bad_keys(void **state) {
  throttle_t *h = th_open(fx_of(state));
  uint64_t ms = 7;
  throttle_info_t *info = NULL;
  char k256[257], k255[256];
  memset(k256, 'x', 256);
  k256[256] = 0;
  memset(k255, 'y', 255);
  k255[255] = 0;
  const char *bad[] = {NULL, "", k256};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(throttle_backoff(h, bad[i], 1), THROTTLE_EKEY);
    assert_true(strlen(throttle_errmsg(h)) > 0);
    assert_int_equal(throttle_remaining(h, bad[i], &ms), THROTTLE_EKEY);
    assert_int_equal(throttle_wait(h, bad[i], 0), THROTTLE_EKEY);
    assert_int_equal(throttle_clear(h, bad[i]), THROTTLE_EKEY);
    assert_int_equal(throttle_info(h, bad[i], &info), THROTTLE_EKEY);
    assert_null(info);
  }
  assert_int_equal(throttle_remaining(h, "k", NULL), THROTTLE_EINVAL);
  assert_int_equal(throttle_info(h, "k", NULL), THROTTLE_EINVAL);
  assert_int_equal(throttle_foreach(h, NULL, NULL), THROTTLE_EINVAL);
  assert_int_equal(throttle_foreach(NULL, never_called, NULL),
                   THROTTLE_EINVAL);

  /* 255 bytes is the longest valid key */
  assert_int_equal(throttle_backoff(h, k255, 30000), 0);
  assert_true(th_remaining(h, k255) > 0);
  assert_int_equal(throttle_info(h, k255, &info), 0);
  assert_string_equal(throttle_info_key(info), k255);
  throttle_info_free(info);
  /* the 256-byte key is not its 255-byte prefix */
  uint32_t used = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, NULL, NULL), 0);
  assert_int_equal(used, 1);
}

/* ---- errors, versions, configuration ------------------------------------ */

static void test_backoff_error_names_distinct(void **state) {
  (void)state;
  static const struct {
    int code;
    const char *name;
  } all[] = {
#define XX(name, value, desc) {value, "THROTTLE_" #name},
      THROTTLE_ERRNO_MAP(XX)
#undef XX
  };
  size_t n = sizeof all / sizeof all[0];
  assert_true(n >= 22);
  for (size_t i = 0; i < n; i++) {
    const char *s = throttle_strerror(all[i].code);
    const char *nm = throttle_err_name(all[i].code);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    assert_string_not_equal(s, "unknown error");
    assert_string_equal(nm, all[i].name);
    assert_string_not_equal(nm, "THROTTLE_UNKNOWN");
    if (i > 0)
      assert_true(all[i].code < 0); /* only OK is non-negative */
    for (size_t j = 0; j < i; j++) {
      assert_int_not_equal(all[i].code, all[j].code);
      assert_string_not_equal(s, throttle_strerror(all[j].code));
      assert_string_not_equal(nm, throttle_err_name(all[j].code));
    }
  }
  assert_int_equal(THROTTLE_OK, 0);
  assert_int_equal(THROTTLE_ESYMLINK, -21); /* never renumbered */
  assert_int_equal(THROTTLE_EINTR, -22);
  assert_int_equal(THROTTLE_ESTALE, -23);
  assert_int_equal(THROTTLE_EREADONLY, -24);
  assert_int_equal(THROTTLE_EBACKEND, -25);
  /* one past the last code, whatever it is now */
  const int unknown[] = {1, -(int)n, -1000, 12345};
  for (size_t i = 0; i < 4; i++) {
    assert_string_equal(throttle_strerror(unknown[i]), "unknown error");
    assert_string_equal(throttle_err_name(unknown[i]), "THROTTLE_UNKNOWN");
  }
}

static void test_backoff_version_matches_macros(void **state) {
  (void)state;
  assert_int_equal(throttle_version(), THROTTLE_VERSION_NUM);
  assert_string_equal(throttle_version_string(), THROTTLE_VERSION_STRING);
  char buf[32];
  snprintf(buf, sizeof buf, "%d.%d.%d", THROTTLE_VERSION_MAJOR,
           THROTTLE_VERSION_MINOR, THROTTLE_VERSION_PATCH);
  assert_string_equal(buf, THROTTLE_VERSION_STRING);
  assert_true(THROTTLE_AT_LEAST_VERSION(1, 0, 0));
  assert_false(THROTTLE_AT_LEAST_VERSION(THROTTLE_VERSION_MAJOR + 1, 0, 0));
}

static void test_backoff_config_setters_reject_bad_values(void **state) {
  (void)state;
  throttle_config_t *c = throttle_config_new();
  assert_non_null(c);
  assert_int_equal(throttle_config_set_capacity(c, 0), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_capacity(c, 1048577), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_capacity(c, 1048576), 0);
  assert_int_equal(throttle_config_set_capacity(c, 1), 0);
  assert_int_equal(throttle_config_set_capacity(NULL, 8), THROTTLE_EINVAL);

  uint64_t week = UINT64_C(7) * 24 * 3600 * 1000;
  assert_int_equal(throttle_config_set_max_delay(c, 0), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_max_delay(c, week + 1), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_max_delay(c, UINT64_MAX),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_max_delay(c, week), 0);
  assert_int_equal(throttle_config_set_max_delay(c, 1), 0);
  assert_int_equal(throttle_config_set_max_delay(NULL, 1), THROTTLE_EINVAL);

  assert_int_equal(throttle_config_set_lock_timeout(c, 0), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_lock_timeout(c, 1), 0);
  assert_int_equal(throttle_config_set_lock_timeout(NULL, 1), THROTTLE_EINVAL);

  assert_int_equal(throttle_config_set_flags(c, 1u << 4), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_flags(c, ~0u), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_flags(c, THROTTLE_GROUP_SHARED |
                                                    THROTTLE_NO_FALLBACK |
                                                    THROTTLE_NO_CREATE |
                                                    THROTTLE_READONLY),
                   0);
  assert_int_equal(throttle_config_set_flags(c, 0), 0);
  assert_int_equal(throttle_config_set_flags(NULL, 0), THROTTLE_EINVAL);

  char n200[202], n201[203];
  n200[0] = n201[0] = '/';
  memset(n200 + 1, 'a', 199);
  n200[200] = 0;
  memset(n201 + 1, 'a', 200);
  n201[201] = 0;
  const char *bad[] = {NULL, "", "/", "a/b", "/a/b", "/a/", n201};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(throttle_config_set_segment(c, bad[i]), THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_segment(c, n200), 0);
  assert_int_equal(throttle_config_set_segment(c, "plain"), 0);
  assert_int_equal(throttle_config_set_segment(c, "/slashed"), 0);
  assert_int_equal(throttle_config_set_segment(NULL, "/x"), THROTTLE_EINVAL);
  throttle_config_free(c);

  assert_int_equal(throttle_unlink("a/b"), THROTTLE_EINVAL);
  assert_int_equal(throttle_unlink(""), THROTTLE_EINVAL);

  for (int f = 0; f < THROTTLE_FIELD_COUNT_; f++) {
    assert_non_null(throttle_field_name((throttle_field_t)f));
    for (int g = 0; g < f; g++)
      assert_string_not_equal(throttle_field_name((throttle_field_t)f),
                              throttle_field_name((throttle_field_t)g));
  }
  assert_null(throttle_field_name(THROTTLE_FIELD_COUNT_));
  assert_string_equal(throttle_field_name(THROTTLE_FIELD_REMAINING_MS),
                      "remaining_ms");
}

/* A segment name without the leading '/' names the same segment. */
static void test_backoff_segment_name_gets_slash(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_segment(fx->cfg, fx->name + 1), 0);
  throttle_t *h = th_open(fx);
  assert_string_equal(throttle_segment_name(h), fx->name);
  assert_string_equal(throttle_errmsg(h), "");
}

/* ---- a process's own limits ------------------------------------------- */

/* A process opened with a 1 s maximum delay: it peeks and waits, and may
 * honour only 1 s itself, but must not store its limit for the others. */
static int short_max_peeker(void *arg) {
  struct th_fx *fx = arg;
  throttle_config_t *cfg = throttle_config_new();
  TH_CHILD_CHECK(cfg != NULL);
  TH_CHILD_CHECK(throttle_config_set_segment(cfg, fx->name) == 0);
  TH_CHILD_CHECK(throttle_config_set_max_delay(cfg, 1000) == 0);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(cfg, &h) == 0);
  uint64_t ms = UINT64_MAX;
  TH_CHILD_CHECK(throttle_remaining(h, "k", &ms) == 0);
  TH_CHILD_CHECK(ms > 0 && ms <= 1000); /* what it honours itself */
  throttle_info_t *info = NULL;
  TH_CHILD_CHECK(throttle_info(h, "k", &info) == 0); /* under the mutex */
  throttle_info_free(info);
  TH_CHILD_CHECK(throttle_wait(h, "k", 1500) == 0); /* its own 1 s */
  /* the gate is everyone's: it still holds, and is not rewritten */
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_try_enter(h, "k", THROTTLE_CLASS_LIVE, &t, NULL) ==
                 THROTTLE_EWOULDBLOCK);
  /* what it publishes is bounded by the segment, not by itself */
  TH_CHILD_CHECK(throttle_backoff(h, "j", 60000) == 0);
  throttle_close(h);
  throttle_config_free(cfg);
  return 0;
}

static void test_backoff_own_max_delay_stays_private(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 60000), 0);
  th_reap_ok(fx, th_spawn(fx, short_max_peeker, fx), HANG_GUARD_MS);
  assert_true(th_remaining(h, "k") > 30000);
  assert_true(th_remaining(h, "j") > 30000);
}

/* The fleet's maximum is the segment's: set by its creator, changed for
 * everyone, and applied to what any process publishes. */
static void test_backoff_segment_max_delay(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 2000), 0);
  throttle_t *h = th_open(fx); /* the creator: the segment's max is 2 s */
  uint64_t ms = 0;
  assert_int_equal(throttle_segment_max_delay(h, &ms), 0);
  assert_int_equal(ms, 2000);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 900000), 0);
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  assert_int_equal(throttle_backoff(b, "k", 60000), 0);
  assert_true(th_remaining(b, "k") <= 2000);
  assert_int_equal(throttle_set_segment_max_delay(b, 120000), 0);
  assert_int_equal(throttle_backoff(b, "k", 60000), 0);
  assert_true(th_remaining(b, "k") > 30000);
  assert_true(th_remaining(h, "k") <= 2000); /* h honours its own 2 s */
  throttle_close(b);
  assert_int_equal(throttle_set_segment_max_delay(h, 0), THROTTLE_EINVAL);
  assert_int_equal(throttle_set_segment_max_delay(NULL, 1), THROTTLE_EINVAL);
  assert_int_equal(throttle_segment_max_delay(h, NULL), THROTTLE_EINVAL);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_backoff_publish_sets_remaining),
      T(test_backoff_never_moves_earlier),
      T(test_backoff_clamps_to_max_delay),
      T(test_backoff_huge_delay_does_not_overflow),
      T(test_backoff_wait_returns_no_earlier_than_not_before),
      T(test_backoff_wait_with_enough_timeout_succeeds),
      T(test_backoff_wait_timeout_returns_etimedout_promptly),
      T(test_backoff_wait_unknown_key_returns_at_once),
      T(test_backoff_wait_wakes_on_clear),
      T(test_backoff_wait_wakes_on_reset),
      T(test_backoff_wait_sleeps_on_when_extended),
      T(test_backoff_clear_unknown_key_is_enokey),
      T(test_backoff_clear_opens_key_keeps_counters),
      T(test_backoff_reset_opens_every_key),
      T(test_backoff_counters_via_info),
      T(test_backoff_rejects_null_handle),
      T(test_backoff_rejects_bad_keys),
      T(test_backoff_error_names_distinct),
      T(test_backoff_version_matches_macros),
      T(test_backoff_config_setters_reject_bad_values),
      T(test_backoff_segment_name_gets_slash),
      T(test_backoff_own_max_delay_stays_private),
      T(test_backoff_segment_max_delay),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
