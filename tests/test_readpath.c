/* SPDX-License-Identifier: MIT */
/*
 * test_readpath.c — the lock-free read path and what it remembers: a
 * thread's guesses (table.c) are only ever reused for the same key bytes
 * on the same segment, whatever buffer the key comes in and whatever
 * address a handle gets; a caller that cannot take the mutex still honours
 * every not-before above its key.  Another process publishes (fork), the
 * reader reads; no timing assertions beyond "not before the published
 * time".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_GUARD_MS 15000
#define LONG_MS 10000

static struct th_fx *fx_of(void **state) { return *state; }

/* What a child publishes: a back-off of LONG_MS on key. */
struct pub {
  struct th_fx *fx;
  const char *open_key; /* or NULL: a key seen once, open now, first */
  const char *key;
  uint32_t tseq, sgen; /* nonzero: the sequences the segment then shows */
};

static int child_publishes(void *p) {
  const struct pub *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  if (a->open_key != NULL)
    TH_CHILD_CHECK(throttle_backoff(h, a->open_key, 1) == 0 &&
                   throttle_clear(h, a->open_key) == 0);
  TH_CHILD_CHECK(throttle_backoff(h, a->key, LONG_MS) == 0);
  if (a->tseq != 0) {
    /* A segment made afresh counts its sequences from the start again,
     * so they meet the old segment's values after as many changes: set
     * them where the reader last saw the old one's, as that many changes
     * would have.  Even, so lock-free readers go on. */
    atomic_store(&h->hdr->tseq, a->tseq);
    atomic_store(&h->hdr->sgen, a->sgen);
  }
  throttle_close(h);
  return 0;
}

static void publish_elsewhere(struct th_fx *fx, const char *key) {
  struct pub a = {fx, NULL, key, 0, 0};
  th_reap_ok(fx, th_spawn(fx, child_publishes, &a), HANG_GUARD_MS);
}

static uint64_t remaining(throttle_t *h, const char *key) {
  uint64_t ms = 0;
  assert_int_equal(throttle_remaining(h, key, &ms), 0);
  return ms;
}

/* key seen once and open now, as a loader meets it: it has a record. */
static void seen_open(throttle_t *h, const char *key) {
  assert_int_equal(throttle_backoff(h, key, 1), 0);
  assert_int_equal(throttle_clear(h, key), 0);
}

/* From one buffer, first a key never seen (remembered absent), then key
 * (backed off by another process): the second is seen held. */
static void one_buffer_two_keys(struct th_fx *fx, const char *published,
                                const char *first, const char *key) {
  throttle_t *h = th_open(fx);
  publish_elsewhere(fx, published);
  char buf[THROTTLE__KEY_MAX + 1];
  strcpy(buf, first);
  assert_int_equal(remaining(h, buf), 0);
  assert_int_equal(throttle_wait(h, buf, 0), 0);
  strcpy(buf, key);
  assert_true(remaining(h, buf) > LONG_MS / 2);
  assert_int_equal(throttle_wait(h, buf, 0), THROTTLE_ETIMEDOUT);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  assert_int_equal(
      throttle_try_enter(h, buf, THROTTLE_CLASS_LIVE, &t, &wait_ms),
      THROTTLE_EWOULDBLOCK);
  assert_null(t);
}

static void test_readpath_absent_guess_compares_bytes(void **state) {
  one_buffer_two_keys(fx_of(state), "tbl-b", "tbl-a", "tbl-b");
}

/* The same for a scope: "wsA" absent says nothing of "wsB", although the
 * prefix is read from the same buffer with the same length. */
static void test_readpath_absent_scope_guess_compares_bytes(void **state) {
  one_buffer_two_keys(fx_of(state), "wsB", "wsA/orders", "wsB/orders");
}

/* Keys at the length an absent key is remembered up to (72 bytes) and
 * one beyond, differing in their last byte but one (the first and last
 * bytes, and the length, alike), and a scope of that length. */
static void test_readpath_absent_guess_at_the_copy_limit(void **state) {
  struct th_fx *fx = fx_of(state);
  for (size_t len = 71; len <= 73; len++) {
    char a[96], b[96], ka[112], kb[112];
    memset(a, 'k', len);
    a[len] = 0;
    a[len - 2] = 'a';
    memcpy(b, a, len + 1);
    b[len - 2] = 'b';
    snprintf(ka, sizeof ka, "%s/t", a);
    snprintf(kb, sizeof kb, "%s/t", b);
    for (int scope = 0; scope < 2; scope++) {
      /* the key b, then the scope b, backed off */
      one_buffer_two_keys(fx, b, scope ? ka : a, scope ? kb : b);
      throttle_close(fx->h);
      fx->h = NULL;
      assert_int_equal(throttle_unlink(fx->name), 0);
    }
  }
}

/* A loop over table names, each formatted into one buffer (what a
 * binding does when its runtime reuses a string's address): the one
 * backed off is seen whichever came before it. */
static void test_readpath_loop_over_names_in_one_buffer(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  /* names remembered absent with their bytes, and names too long for
   * that (looked up each time) */
  static const char *const prefix[3] = {
      "ws1",
      "hotdata:a-workspace-with-a-longer-name",
      ("hotdata:a-workspace-with-a-name-longer-than-what-is-remembered-of-"
       "an-absent-key"),
  };
  char key[128];
  for (int i = 0; i < 3; i++) {
    snprintf(key, sizeof key, "%s/tbl-7", prefix[i]);
    publish_elsewhere(fx, key);
  }
  for (int round = 0; round < 6; round++)
    for (int i = 0; i < 10; i++) {
      snprintf(key, sizeof key, "%s/tbl-%d", prefix[round % 3], i);
      uint64_t ms = remaining(h, key);
      if (i == 7)
        assert_true(ms > LONG_MS / 2);
      else
        assert_int_equal(ms, 0);
      assert_int_equal(throttle_wait(h, key, 0),
                       i == 7 ? THROTTLE_ETIMEDOUT : 0);
    }
}

/* rm, then a segment of the same name made afresh, whose sequences come
 * round to the values this thread last saw: a guess about the old
 * segment says nothing of the new one, even when the new handle has the
 * old one's address. */
static void recreate(struct th_fx *fx, throttle_t **h, const char *open_key,
                     const char *key) {
  struct pub a = {fx, open_key, key, atomic_load(&(*h)->hdr->tseq),
                  atomic_load(&(*h)->hdr->sgen)};
  void *old = *h;
  assert_int_equal(throttle_unlink(fx->name), 0);
  th_reap_ok(fx, th_spawn(fx, child_publishes, &a), HANG_GUARD_MS);
  /* The allocator's per-thread cache for the handle's size full, the
   * handle freed next goes where calloc() looks first: the new handle
   * gets the old one's address, as it often does in a longer program. */
  void *fill[8];
  for (int i = 0; i < 8; i++)
    fill[i] = malloc(sizeof **h);
  for (int i = 0; i < 8; i++)
    free(fill[i]);
  throttle_close(*h);
  fx->h = NULL;
  *h = th_open(fx);
  if ((void *)*h != old)
    print_message("note: the new handle has another address\n");
}

static void test_readpath_absent_guess_is_the_segments(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  const char *key = "orders";
  assert_int_equal(throttle_backoff(h, "other", 1), 0);
  assert_int_equal(remaining(h, key), 0); /* absent, remembered */
  assert_int_equal(throttle_wait(h, key, 0), 0);
  recreate(fx, &h, NULL, key);
  assert_true(remaining(h, key) > LONG_MS / 2);
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
}

/* The scopes' "open" memory: the key at the same record in both
 * segments, its scope open in the old one and backed off in the new. */
static void test_readpath_open_scopes_guess_is_the_segments(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  const char *key = "ws/orders";
  seen_open(h, key);
  assert_int_equal(throttle_wait(h, key, 0), 0); /* scopes seen open */
  assert_int_equal(throttle_wait(h, key, 0), 0);
  recreate(fx, &h, key, "ws");
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
  assert_true(remaining(h, key) > LONG_MS / 2);
}

/* remaining() reads a key alone once this thread saw its scopes open
 * (the mark a wait notes too): a scope backed off by another process
 * afterwards is still seen, by both calls. */
static void test_readpath_remaining_sees_a_scope_closed_after(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  const char *key = "ws/orders";
  seen_open(h, key);
  seen_open(h, "ws");
  assert_int_equal(remaining(h, key), 0); /* scopes seen open: noted */
  assert_int_equal(remaining(h, key), 0); /* read alone */
  publish_elsewhere(fx, "ws");
  assert_true(remaining(h, key) > LONG_MS / 2);
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
}

static int child_pauses(void *p) {
  const struct th_fx *fx = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_pause(h, "ws") == 0);
  throttle_close(h);
  return 0;
}

/* A scope paused has no not-before: remaining() answers 0 for a key
 * beneath, and must not let that answer vouch for the scope to a wait
 * (which the pause holds) in the same thread. */
static void test_readpath_remaining_does_not_vouch_for_a_held_scope(
    void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  const char *key = "ws/orders";
  seen_open(h, key);
  th_reap_ok(fx, th_spawn(fx, child_pauses, fx), HANG_GUARD_MS);
  assert_int_equal(remaining(h, key), 0);
  assert_int_equal(remaining(h, key), 0);
  assert_int_equal(throttle_wait(h, key, 0), THROTTLE_ETIMEDOUT);
  assert_int_equal(throttle_resume(h, "ws"), 0);
  assert_int_equal(throttle_wait(h, key, 0), 0);
}

/* Two segments alive at once, used in turn from one thread, their
 * sequences at the same values (two segments made alike count alike):
 * what the thread remembers of one (a key absent, a key's scopes open)
 * says nothing of the other. */
static void test_readpath_two_segments_in_turn(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *a = th_open(fx);
  seen_open(a, "ws/orders");
  assert_int_equal(throttle_wait(a, "ws/orders", 0), 0); /* scopes open */
  assert_int_equal(remaining(a, "tbl"), 0);              /* absent */
  /* the other segment: the same key at the same record, its scope and
   * "tbl" backed off by another process, the sequences set to a's */
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, th_extra_name(fx)), 0);
  struct th_fx other = *fx;
  other.cfg = cfg;
  struct pub p = {&other, "ws/orders", "ws", 0, 0};
  th_reap_ok(fx, th_spawn(fx, child_publishes, &p), HANG_GUARD_MS);
  struct pub q = {&other, NULL, "tbl", atomic_load(&a->hdr->tseq),
                  atomic_load(&a->hdr->sgen)};
  th_reap_ok(fx, th_spawn(fx, child_publishes, &q), HANG_GUARD_MS);
  throttle_t *b = NULL;
  assert_int_equal(throttle_open(cfg, &b), 0);
  for (int round = 0; round < 3; round++) {
    assert_int_equal(throttle_wait(a, "ws/orders", 0), 0);
    assert_int_equal(remaining(a, "tbl"), 0);
    assert_int_equal(throttle_wait(b, "ws/orders", 0), THROTTLE_ETIMEDOUT);
    assert_true(remaining(b, "tbl") > LONG_MS / 2);
    assert_int_equal(throttle_wait(b, "tbl", 0), THROTTLE_ETIMEDOUT);
  }
  throttle_close(b);
  throttle_config_free(cfg);
}

/* ---- fail open ----------------------------------------------------------- */

/* Each key is refused for now, with the time left of a back-off of
 * 1500 ms: the mutex out of reach, the not-before still honoured. */
static void expect_held(throttle_t *h, const char *const *keys, size_t n) {
  for (size_t i = 0; i < n; i++) {
    throttle_ticket_t *t = NULL;
    uint64_t wait_ms = 0;
    assert_int_equal(throttle_try_enter(h, keys[i], THROTTLE_CLASS_LIVE, &t,
                                        &wait_ms),
                     THROTTLE_EWOULDBLOCK);
    assert_true(wait_ms > 0 && wait_ms <= 1500);
    assert_null(t);
  }
}

/* The mutex held by a live, stopped process: an admission fails open,
 * but not before the not-before of any scope above the key (a 429 goes
 * to the root scope), as far as it can read it without the mutex. */
/* "ws" backed off 1500 ms, its keys seen, then the mutex held by a live,
 * stopped process (its pid); *nb a little before that back-off ends. */
static pid_t stop_mutex_with_ws_held(struct th_fx *fx, throttle_t **h,
                                     uint64_t *nb) {
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 100), 0);
  *h = th_open(fx);
  assert_int_equal(throttle_backoff(*h, "ws", 1500), 0);
  assert_int_equal(throttle_backoff(*h, "ws/orders", 1), 0);
  assert_int_equal(throttle_backoff(*h, "ws/deep/orders", 1), 0);
  *nb = th_now_ns() + 1400 * NS_PER_MS;
  pid_t pid = th_spawn(fx, th_child_sits_on_mutex, fx);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);
  return pid;
}

static void test_readpath_fail_open_honours_scopes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h;
  uint64_t nb;
  pid_t pid = stop_mutex_with_ws_held(fx, &h, &nb);
  const char *keys[] = {"ws/orders", "ws/deep/orders", "ws/never-seen"};
  expect_held(h, keys, sizeof keys / sizeof keys[0]);
  throttle_ticket_t *t = NULL;
  assert_int_equal(
      throttle_enter(h, "ws/orders", THROTTLE_CLASS_LIVE, 200, &t),
      THROTTLE_ETIMEDOUT); /* the scope's back-off is past the timeout */
  assert_int_equal(
      throttle_enter(h, "ws/orders", THROTTLE_CLASS_LIVE, 10000, &t),
      THROTTLE_ELOCKTIMEOUT);
  assert_null(t);
  assert_true(th_now_ns() >= nb); /* failed open, but not early */
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
}

/* The mutex held by a live, stopped process: throttle_remaining() and
 * throttle_wait() still answer without it, the scopes' not-befores
 * counted. */
static void test_readpath_stopped_mutex_readers_honour_scopes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h;
  uint64_t nb;
  pid_t pid = stop_mutex_with_ws_held(fx, &h, &nb);
  const char *keys[] = {"ws/orders", "ws/never-seen", "ws"};
  for (size_t i = 0; i < 3; i++) {
    uint64_t ms = 0;
    assert_int_equal(throttle_remaining(h, keys[i], &ms), 0);
    assert_true(ms > 0 && ms <= 1500);
    assert_int_equal(throttle_wait(h, keys[i], 100), THROTTLE_ETIMEDOUT);
  }
  /* waits the scope's back-off out without the mutex, then is open */
  assert_int_equal(throttle_wait(h, "ws/orders", 10000), 0);
  assert_true(th_now_ns() >= nb);
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
}

/* A process stopped inside a change of the table (the mutex held, the
 * table's sequence odd: no lock-free lookup is stable) still leaves the
 * not-befores readable: a caller failing open reads them from the records
 * themselves. */
static int child_stops_mid_insert(void *p) {
  struct th_fx *fx = p;
  throttle_close(fx->h);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(pthread_mutex_lock(&h->hdr->mutex) == 0);
  atomic_fetch_add(&h->hdr->tseq, 1); /* as an insert begins */
  raise(SIGSTOP);
  return 0; /* never: the parent kills it stopped */
}

static void test_readpath_fail_open_mid_insert_honours_back_offs(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 100), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "ws", 1500), 0);
  assert_int_equal(throttle_backoff(h, "tbl", 1500), 0);
  pid_t pid = th_spawn(fx, child_stops_mid_insert, fx);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);
  const char *keys[] = {"ws/orders", "tbl"};
  expect_held(h, keys, sizeof keys / sizeof keys[0]);
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_readpath_absent_guess_compares_bytes),
      T(test_readpath_absent_scope_guess_compares_bytes),
      T(test_readpath_loop_over_names_in_one_buffer),
      T(test_readpath_absent_guess_at_the_copy_limit),
      T(test_readpath_absent_guess_is_the_segments),
      T(test_readpath_open_scopes_guess_is_the_segments),
      T(test_readpath_two_segments_in_turn),
      T(test_readpath_remaining_sees_a_scope_closed_after),
      T(test_readpath_remaining_does_not_vouch_for_a_held_scope),
      T(test_readpath_fail_open_honours_scopes),
      T(test_readpath_fail_open_mid_insert_honours_back_offs),
      T(test_readpath_stopped_mutex_readers_honour_scopes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
