/* SPDX-License-Identifier: MIT */
/*
 * test_table.c — the keyed table: capacity, LRU eviction of idle keys,
 * EFULL when nothing is idle, key identity (lengths, prefixes, bytes),
 * collisions, tombstones and the index rebuild, foreach.
 *
 * "Use" of a key, for LRU, is a publish, a clear or a wait that slept;
 * lookups (throttle_remaining, throttle_info) write nothing.
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

#define SHUFFLE_SEED UINT64_C(0x7ab1e5eed)

static struct th_fx *fx_of(void **state) { return *state; }

static throttle_t *open_cap(struct th_fx *fx, uint32_t cap) {
  assert_int_equal(throttle_config_set_capacity(fx->cfg, cap), 0);
  return th_open(fx);
}

static int has_key(throttle_t *h, const char *key) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, key, &info);
  if (rc != 0 && rc != THROTTLE_ENOKEY)
    fail_msg("throttle_info(%s): %s", key, throttle_err_name(rc));
  if (rc == 0)
    assert_string_equal(throttle_info_key(info), key);
  throttle_info_free(info);
  return rc == 0;
}

static int64_t publishes(throttle_t *h, const char *key) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, key, &info);
  if (rc != 0)
    fail_msg("throttle_info(%s): %s", key, throttle_err_name(rc));
  int64_t v = throttle_info_get(info, THROTTLE_FIELD_PUBLISHES);
  throttle_info_free(info);
  return v;
}

static void stats(throttle_t *h, uint32_t *used, uint64_t *evictions) {
  assert_int_equal(throttle_stats(h, NULL, used, evictions, NULL), 0);
}

/* A key seen once and open now (a back-off published and cleared: no
 * lock episode left, which would keep its record): it exists and is idle.
 * Successive calls get strictly increasing last-use times. */
static void touch(throttle_t *h, const char *key) {
  uint64_t t = th_now_ns();
  assert_int_equal(throttle_backoff(h, key, 0), 0);
  assert_int_equal(throttle_clear(h, key), 0);
  while (th_now_ns() == t) /* clock granularity, not timing */
    ;
}

/* ---- capacity and eviction ---------------------------------------------- */

static void test_table_capacity_keys_fit(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  char key[32];
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "key-%d", i);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  uint32_t used;
  uint64_t ev;
  stats(h, &used, &ev);
  assert_int_equal(used, 8);
  assert_int_equal(ev, 0);
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "key-%d", i);
    assert_true(th_remaining(h, key) > 0);
    assert_true(has_key(h, key));
  }
}

static void test_table_evicts_least_recently_used_idle_key(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  char key[32];
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "k%d", i);
    touch(h, key);
  }
  touch(h, "k0"); /* k0 is now the most recent; k1 the oldest */
  touch(h, "k8");
  uint32_t used;
  uint64_t ev;
  stats(h, &used, &ev);
  assert_int_equal(used, 8);
  assert_int_equal(ev, 1);
  assert_false(has_key(h, "k1"));
  assert_int_equal(th_remaining(h, "k1"), 0);
  for (int i = 0; i <= 8; i++) {
    snprintf(key, sizeof key, "k%d", i);
    if (i != 1)
      assert_true(has_key(h, key));
  }
  /* a clear is a use too: k2 survives, k3 goes */
  assert_int_equal(throttle_clear(h, "k2"), 0);
  touch(h, "k9");
  assert_true(has_key(h, "k2"));
  assert_false(has_key(h, "k3"));
  /* lookups are not uses: k4 stays the oldest however often it is read */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(th_remaining(h, "k4"), 0);
    assert_true(has_key(h, "k4"));
  }
  touch(h, "k10");
  assert_false(has_key(h, "k4"));
  stats(h, &used, &ev);
  assert_int_equal(used, 8);
  assert_int_equal(ev, 3);
  /* the evicted key comes back as a new key, counters from zero */
  touch(h, "k1");
  assert_int_equal(publishes(h, "k1"), 1);
}

static void test_table_pending_keys_never_evicted(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  char key[32];
  /* the oldest keys are pending, the newest idle: the idle ones go */
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "pending%d", i);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "idle%d", i);
    touch(h, key);
  }
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "new%d", i);
    touch(h, key);
  }
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "pending%d", i);
    assert_true(th_remaining(h, key) > 0);
    snprintf(key, sizeof key, "idle%d", i);
    assert_false(has_key(h, key));
  }
}

static void test_table_full_of_pending_keys_is_efull(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  char key[32];
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "p%d", i);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  assert_int_equal(throttle_backoff(h, "p8", TH_LONG_MS), THROTTLE_EFULL);
  assert_true(strlen(throttle_errmsg(h)) > 0);
  uint32_t used;
  uint64_t ev;
  stats(h, &used, &ev);
  assert_int_equal(used, 8);
  assert_int_equal(ev, 0);
  for (int i = 0; i < 8; i++) {
    snprintf(key, sizeof key, "p%d", i);
    assert_true(th_remaining(h, key) > 0);
  }
  assert_false(has_key(h, "p8"));
  /* the existing keys can still be published to */
  assert_int_equal(throttle_backoff(h, "p3", TH_LONG_MS), 0);
  /* one cleared key makes room, and it is the one evicted */
  assert_int_equal(throttle_clear(h, "p5"), 0);
  assert_int_equal(throttle_backoff(h, "p8", TH_LONG_MS), 0);
  assert_false(has_key(h, "p5"));
  assert_true(th_remaining(h, "p8") > 0);
  stats(h, &used, &ev);
  assert_int_equal(ev, 1);
}

/* ---- key identity ------------------------------------------------------- */

static void test_table_keys_differing_in_last_byte(void **state) {
  throttle_t *h = open_cap(fx_of(state), 64);
  for (size_t len = 1; len <= 255; len += 127) {
    char key[256];
    memset(key, 'k', len);
    key[len] = 0;
    for (int v = 0; v < 16; v++) {
      key[len - 1] = (char)('A' + v);
      for (int n = 0; n <= v; n++)
        assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
    }
    for (int v = 0; v < 16; v++) {
      key[len - 1] = (char)('A' + v);
      assert_int_equal(publishes(h, key), v + 1);
    }
  }
  uint32_t used;
  stats(h, &used, NULL);
  assert_int_equal(used, 48);
}

static void test_table_prefix_keys_distinct(void **state) {
  throttle_t *h = open_cap(fx_of(state), 512);
  char key[256];
  for (int len = 1; len <= 255; len++) {
    for (int i = 0; i < len; i++)
      key[i] = (char)('a' + i % 26);
    key[len] = 0;
    for (int n = 0; n < 1 + len % 5; n++)
      assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  for (int len = 1; len <= 255; len++) {
    for (int i = 0; i < len; i++)
      key[i] = (char)('a' + i % 26);
    key[len] = 0;
    assert_int_equal(publishes(h, key), 1 + len % 5);
  }
  uint32_t used;
  stats(h, &used, NULL);
  assert_int_equal(used, 255);
}

struct collected {
  char keys[600][8];
  int n;
  int stop_at;
};

static int collect(const throttle_info_t *info, void *arg) {
  struct collected *c = arg;
  if (c->n < 600)
    snprintf(c->keys[c->n], sizeof c->keys[0], "%s", throttle_info_key(info));
  c->n++;
  return c->n == c->stop_at ? 7 : 0;
}

/* May a key hold byte b?  Not a control byte, and '/' only between names
 * (never a one-byte key, nor a key's last byte). */
static int key_byte(int b) { return b >= 0x20 && b != 0x7f && b != '/'; }

/* Every byte a key may hold as a one-byte key, and as the second byte of
 * a two-byte key after ' ': distinct keys, sorted as unsigned bytes. */
static void test_table_binary_bytes_distinct(void **state) {
  throttle_t *h = open_cap(fx_of(state), 512);
  char key[3];
  int n = 0;
  for (int b = 1; b <= 255; b++) {
    key[0] = (char)b;
    key[1] = 0;
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS),
                     key_byte(b) ? 0 : THROTTLE_EKEY);
    key[0] = ' ';
    key[1] = (char)b;
    key[2] = 0;
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS),
                     key_byte(b) ? 0 : THROTTLE_EKEY);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS),
                     key_byte(b) ? 0 : THROTTLE_EKEY);
    n += key_byte(b) ? 2 : 0;
  }
  uint32_t used;
  stats(h, &used, NULL);
  assert_int_equal(used, n);
  for (int b = 1; b <= 255; b++) {
    if (!key_byte(b))
      continue;
    key[0] = (char)b;
    key[1] = 0;
    assert_int_equal(publishes(h, key), 1);
    key[0] = ' ';
    key[1] = (char)b;
    key[2] = 0;
    assert_int_equal(publishes(h, key), 2);
  }
  struct collected *c = calloc(1, sizeof *c);
  assert_non_null(c);
  assert_int_equal(throttle_foreach(h, collect, c), 0);
  assert_int_equal(c->n, n);
  for (int i = 1; i < c->n; i++)
    assert_true(strcmp(c->keys[i - 1], c->keys[i]) < 0);
  assert_string_equal(c->keys[0], " ");
  assert_string_equal(c->keys[c->n - 1], "\xff");
  free(c);
}

static void test_table_many_keys_all_retrievable(void **state) {
  throttle_t *h = open_cap(fx_of(state), 4096);
  char key[32];
  for (int i = 0; i < 4096; i++) {
    snprintf(key, sizeof key, "hotdata:ws%d/orders", i);
    int rc = throttle_backoff(h, key, TH_LONG_MS);
    if (rc != 0)
      fail_msg("key %d: %s: %s", i, throttle_err_name(rc), throttle_errmsg(h));
  }
  uint32_t used;
  uint64_t ev;
  stats(h, &used, &ev);
  assert_int_equal(used, 4096);
  assert_int_equal(ev, 0);
  for (int i = 0; i < 4096; i++) {
    snprintf(key, sizeof key, "hotdata:ws%d/orders", i);
    assert_true(th_remaining(h, key) > 0); /* lock-free path */
    assert_int_equal(publishes(h, key), 1); /* locked path */
  }
  assert_int_equal(throttle_backoff(h, "one-more", 1), THROTTLE_EFULL);
}

/* ---- foreach ------------------------------------------------------------ */

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void test_table_foreach_sorted_and_stops_early(void **state) {
  throttle_t *h = open_cap(fx_of(state), 128);
  uint64_t seed = SHUFFLE_SEED;
  print_message("seed 0x%llx\n", (unsigned long long)seed);
  int order[100];
  for (int i = 0; i < 100; i++)
    order[i] = i;
  for (int i = 99; i > 0; i--) {
    int j = (int)(xorshift(&seed) % (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  char key[32];
  for (int i = 0; i < 100; i++) {
    snprintf(key, sizeof key, "t%03d", order[i]);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  struct collected *c = calloc(1, sizeof *c);
  assert_non_null(c);
  assert_int_equal(throttle_foreach(h, collect, c), 0);
  assert_int_equal(c->n, 100);
  for (int i = 0; i < 100; i++) {
    snprintf(key, sizeof key, "t%03d", i);
    assert_string_equal(c->keys[i], key);
  }
  memset(c, 0, sizeof *c);
  c->stop_at = 3;
  assert_int_equal(throttle_foreach(h, collect, c), 7);
  assert_int_equal(c->n, 3);
  assert_string_equal(c->keys[2], "t002");
  free(c);
}

static int count_only(const throttle_info_t *info, void *arg) {
  (void)info;
  (*(int *)arg)++;
  return 0;
}

static void test_table_foreach_empty_table(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  int n = 0;
  assert_int_equal(throttle_foreach(h, count_only, &n), 0);
  assert_int_equal(n, 0);
}

/* ---- collisions, tombstones, rebuild ------------------------------------ */

static uint32_t home_of(throttle_t *h, const char *key) {
  uint64_t hash = throttle__hash(h->seed, key, strlen(key));
  return (uint32_t)(hash >> 32) & h->bucket_mask;
}

/* Keys chosen (for this segment's seed) to share one home bucket, the last
 * one, so the probe chain also wraps around the end of the index. */
static void colliding_keys(throttle_t *h, char keys[][32], int n) {
  uint32_t want = h->bucket_mask;
  int got = 0;
  for (unsigned i = 0; got < n; i++) {
    assert_true(i < 1000000);
    snprintf(keys[got], 32, "c%u", i);
    if (home_of(h, keys[got]) == want)
      got++;
  }
}

static void test_table_colliding_keys_all_found(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8); /* 16 buckets */
  char keys[12][32];
  colliding_keys(h, keys, 12);
  for (int i = 0; i < 8; i++)
    assert_int_equal(throttle_backoff(h, keys[i], TH_LONG_MS), 0);
  for (int i = 0; i < 8; i++) {
    assert_true(th_remaining(h, keys[i]) > 0);
    assert_true(has_key(h, keys[i]));
  }
  for (int i = 8; i < 12; i++)
    assert_int_equal(th_remaining(h, keys[i]), 0);
  /* open three keys in the middle of the chain, replace them: the keys
   * behind their tombstones stay reachable */
  for (int i = 2; i < 5; i++)
    assert_int_equal(throttle_clear(h, keys[i]), 0);
  for (int i = 8; i < 11; i++)
    assert_int_equal(throttle_backoff(h, keys[i], TH_LONG_MS), 0);
  for (int i = 0; i < 11; i++) {
    int live = i < 2 || i >= 5;
    assert_int_equal(has_key(h, keys[i]), live);
    if (live)
      assert_true(th_remaining(h, keys[i]) > 0);
  }
  uint64_t ev;
  stats(h, NULL, &ev);
  assert_int_equal(ev, 3);
}

/* Insert/evict churn around a few pinned (pending) keys: the tombstones it
 * leaves force index rebuilds, and after every step each key that should be
 * there is found, by the lock-free and the locked lookup alike. */
static void test_table_rebuild_after_many_evictions(void **state) {
  throttle_t *h = open_cap(fx_of(state), 8);
  const char *pinned[] = {"pin-a", "pin-b", "pin-c"};
  for (int i = 0; i < 3; i++)
    assert_int_equal(throttle_backoff(h, pinned[i], TH_LONG_MS), 0);
  char key[32];
  uint32_t max_tomb = 0;
  const int rounds = 2000;
  for (int i = 0; i < rounds; i++) {
    snprintf(key, sizeof key, "churn-%d", i);
    touch(h, key);
    /* the last five churn keys are the ones the LRU kept */
    for (int j = i; j >= 0 && j > i - 5; j--) {
      snprintf(key, sizeof key, "churn-%d", j);
      assert_true(has_key(h, key));
    }
    if (i >= 5) {
      snprintf(key, sizeof key, "churn-%d", i - 5);
      assert_false(has_key(h, key));
    }
    for (int p = 0; p < 3; p++)
      assert_true(th_remaining(h, pinned[p]) > 0);
    if (h->hdr->tombstones > max_tomb)
      max_tomb = h->hdr->tombstones;
  }
  uint32_t used;
  uint64_t ev;
  stats(h, &used, &ev);
  assert_int_equal(used, 8);
  assert_int_equal(ev, rounds - 5);
  /* tombstones never pile up past the rebuild threshold (+1: the
   * eviction that crosses it is swept by the next insert) */
  assert_true(max_tomb <= (h->bucket_mask + 1) / 4 + 1);
}

/* The index is derived: wiped or damaged, the repair rebuilds it from the
 * records, drops records that repeat a key or hold a malformed one, and
 * pulls in a not-before beyond the maximum delay. */
static void test_table_repair_rebuilds_index(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 5000), 0);
  throttle_t *h = open_cap(fx, 16);
  char key[32];
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "r%d", i);
    assert_int_equal(throttle_backoff(h, key, 3000), 0);
  }
  assert_int_equal(throttle__lock(h), 0);
  for (uint32_t i = 0; i <= h->bucket_mask; i++)
    atomic_store(&h->buckets[i], 0);
  h->hdr->free_head = 0;
  h->hdr->used = 1000;
  /* a free record now also claims r1's key; r2's has a bad length; r3's
   * not-before is a year away */
  struct throttle__rec *r2 = NULL, *r3 = NULL;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state != THROTTLE__REC_USED)
      continue;
    if (r->key_len == 2 && memcmp(r->key, "r2", 2) == 0)
      r2 = r;
    if (r->key_len == 2 && memcmp(r->key, "r3", 2) == 0)
      r3 = r;
  }
  assert_non_null(r2);
  assert_non_null(r3);
  r2->key_len = 300;
  atomic_store(&r3->not_before,
               th_now_ns() + UINT64_C(365) * 86400 * 1000000000);
  int dup = -1;
  for (uint32_t i = 0; i < h->capacity; i++)
    if (h->recs[i].state == THROTTLE__REC_FREE) {
      dup = (int)i;
      break;
    }
  assert_true(dup >= 0);
  h->recs[dup].state = THROTTLE__REC_USED;
  h->recs[dup].key_len = 2;
  memcpy(h->recs[dup].key, "r1", 3);
  throttle__repair_locked(h);
  throttle__unlock(h);

  uint32_t used;
  stats(h, &used, NULL);
  assert_int_equal(used, 9); /* r0..r9 but r2; r1 once */
  for (int i = 0; i < 10; i++) {
    snprintf(key, sizeof key, "r%d", i);
    assert_int_equal(has_key(h, key), i != 2);
  }
  assert_true(th_remaining(h, "r3") <= 5000);
  assert_true(th_remaining(h, "r4") > 0);
  /* and the rebuilt free list takes new keys */
  for (int i = 0; i < 7; i++) {
    snprintf(key, sizeof key, "n%d", i);
    assert_int_equal(throttle_backoff(h, key, TH_LONG_MS), 0);
  }
  stats(h, &used, NULL);
  assert_int_equal(used, 16);
}

static int enter_then_stop(void *arg) {
  const char *key = ((void **)arg)[1];
  struct th_fx *fx = ((void **)arg)[0];
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  throttle_ticket_t *t;
  TH_CHILD_CHECK(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 5000, &t) == 0);
  raise(SIGSTOP); /* killed stopped, still holding */
  return 0;
}

/* A full table whose keys are held only by dead processes, and nobody
 * waits on them: a new key reaps one of them and takes its record,
 * instead of THROTTLE_EFULL for ever. */
static void test_table_evicts_key_held_only_by_the_dead(void **state) {
  struct th_fx *fx = *state;
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 2), 0);
  throttle_t *h = th_open(fx);
  const char *keys[2] = {"held-a", "held-b"};
  for (int i = 0; i < 2; i++) {
    void *arg[2] = {fx, (void *)keys[i]};
    pid_t pid = th_spawn(fx, enter_then_stop, arg);
    th_wait_stopped(fx, pid, 10000);
    kill(pid, SIGKILL);
    th_reap_killed(fx, pid, 10000);
  }
  uint64_t evictions = 0;
  assert_int_equal(throttle_backoff(h, "new", TH_LONG_MS), 0);
  assert_int_equal(throttle_stats(h, NULL, NULL, &evictions, NULL), 0);
  assert_int_equal(evictions, 1);
  assert_true(th_remaining(h, "new") > 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_table_capacity_keys_fit),
      T(test_table_evicts_least_recently_used_idle_key),
      T(test_table_pending_keys_never_evicted),
      T(test_table_full_of_pending_keys_is_efull),
      T(test_table_keys_differing_in_last_byte),
      T(test_table_prefix_keys_distinct),
      T(test_table_binary_bytes_distinct),
      T(test_table_many_keys_all_retrievable),
      T(test_table_foreach_sorted_and_stops_early),
      T(test_table_foreach_empty_table),
      T(test_table_colliding_keys_all_found),
      T(test_table_rebuild_after_many_evictions),
      T(test_table_repair_rebuilds_index),
      T(test_table_evicts_key_held_only_by_the_dead),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
