/* SPDX-License-Identifier: MIT */
/*
 * test_threads.c — threads of one process sharing one handle: back-off,
 * peek, wait, clear and snapshots on a few hot keys, with insert/evict
 * churn in a small table going on at the same time.  Built with
 * ThreadSanitizer by `make tsan`.
 *
 * Worker threads never call cmocka (its failures longjmp); they record what
 * they saw and the main thread asserts after joining them.  Each thread's
 * random choices come from a fixed, printed seed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define NTHREADS 4
#define NHOT 3
/* the hot and mono keys (7, kept while in their lock episodes), and room
 * for every thread's churn */
#define CAPACITY 16
#define MAX_DELAY_MS 200
#define RUN_MS 500
#define SEED_BASE UINT64_C(0x7412ead5)
#define NS_PER_MS UINT64_C(1000000)

struct worker {
  throttle_t *h;
  int id;
  uint64_t seed;
  uint64_t ops, timeouts, nokeys, churned;
  int errors;
  char first_error[256];
};

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* One unexpected result: what was called on which key, the code, and the
 * value involved (ms left, delay). */
static void record(struct worker *w, const char *what, const char *key,
                   int rc, uint64_t v) {
  if (w->errors++ == 0)
    snprintf(w->first_error, sizeof w->first_error, "%s %s: %s (%llu)", what,
             key, throttle_err_name(rc), (unsigned long long)v);
}

static void *work(void *p) {
  struct worker *w = p;
  throttle_t *h = w->h;
  char hot[NHOT][16], mono[32], key[48];
  for (int i = 0; i < NHOT; i++)
    snprintf(hot[i], sizeof hot[i], "hot%d", i);
  snprintf(mono, sizeof mono, "mono%d", w->id);
  /* the latest lower bound on mono's not-before this thread published */
  uint64_t mono_floor = 0;
  uint64_t end = th_mono_ms() + RUN_MS;
  while (th_mono_ms() < end) {
    const char *k = hot[next_rand(&w->seed) % NHOT];
    uint64_t ms = 0;
    throttle_info_t *info = NULL;
    int rc;
    w->ops++;
    switch (next_rand(&w->seed) % 8) {
    case 0:
      rc = throttle_backoff(h, k, next_rand(&w->seed) % 1000);
      if (rc != 0)
        record(w, "backoff", k, rc, 0);
      break;
    case 1:
      rc = throttle_remaining(h, k, &ms);
      if (rc != 0 || ms > MAX_DELAY_MS)
        record(w, "remaining", k, rc, ms);
      break;
    case 2:
      rc = throttle_wait(h, k, next_rand(&w->seed) % 50);
      if (rc == THROTTLE_ETIMEDOUT)
        w->timeouts++;
      else if (rc != 0)
        record(w, "wait", k, rc, 0);
      break;
    case 3:
      rc = throttle_clear(h, k); /* ENOKEY: evicted while idle */
      if (rc == THROTTLE_ENOKEY)
        w->nokeys++;
      else if (rc != 0)
        record(w, "clear", k, rc, 0);
      break;
    case 4:
      rc = throttle_info(h, k, &info);
      if (rc == THROTTLE_ENOKEY) {
        w->nokeys++;
      } else if (rc != 0) {
        record(w, "info", k, rc, 0);
      } else {
        int64_t left = throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS);
        if (left < 0 || left > MAX_DELAY_MS || strcmp(throttle_info_key(info), k))
          record(w, "info remaining/key", k, 0, (uint64_t)left);
      }
      throttle_info_free(info);
      break;
    case 5: {
      uint64_t d = 1 + next_rand(&w->seed) % 150;
      uint64_t t0 = th_now_ns();
      rc = throttle_backoff(h, mono, d);
      if (rc != 0)
        record(w, "backoff", mono, rc, d);
      else if (t0 + d * NS_PER_MS > mono_floor)
        mono_floor = t0 + d * NS_PER_MS;
      break;
    }
    case 6: {
      rc = throttle_remaining(h, mono, &ms);
      uint64_t t1 = th_now_ns();
      /* nobody clears mono and a pending key is never evicted, so what it
       * reads can only be at or after what this thread published */
      if (rc != 0 || t1 + ms * NS_PER_MS < mono_floor)
        record(w, "remaining moved earlier", mono, rc,
               ms);
      break;
    }
    default:
      snprintf(key, sizeof key, "churn%d-%llu", w->id,
               (unsigned long long)w->churned++);
      rc = throttle_backoff(h, key, 0); /* seen once, */
      if (rc != 0)
        record(w, "backoff", key, rc, 0);
      rc = throttle_clear(h, key); /* idle at once: evictable */
      if (rc != 0 && rc != THROTTLE_ENOKEY)
        record(w, "clear", key, rc, 0);
      rc = throttle_remaining(h, key, &ms);
      if (rc != 0 || ms != 0)
        record(w, "remaining", key, rc, ms);
      break;
    }
  }
  return NULL;
}

static void test_threads_share_one_handle(void **state) {
  struct th_fx *fx = *state;
  assert_int_equal(throttle_config_set_capacity(fx->cfg, CAPACITY), 0);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, MAX_DELAY_MS), 0);
  throttle_t *h = th_open(fx);
  struct worker w[NTHREADS];
  pthread_t tid[NTHREADS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < NTHREADS; i++) {
    w[i].h = h;
    w[i].id = i;
    w[i].seed = SEED_BASE + (uint64_t)i;
    print_message("thread %d seed 0x%llx\n", i,
                  (unsigned long long)w[i].seed);
    assert_int_equal(pthread_create(&tid[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    assert_int_equal(pthread_join(tid[i], NULL), 0);

  uint64_t ops = 0, churned = 0;
  for (int i = 0; i < NTHREADS; i++) {
    print_message("thread %d: %llu ops, %llu timeouts, %llu evicted lookups, "
                  "%d errors\n",
                  i, (unsigned long long)w[i].ops,
                  (unsigned long long)w[i].timeouts,
                  (unsigned long long)w[i].nokeys, w[i].errors);
    if (w[i].errors)
      fail_msg("thread %d: %d errors, first: %s", i, w[i].errors,
               w[i].first_error);
    ops += w[i].ops;
    churned += w[i].churned;
  }
  assert_true(ops > 0);
  uint32_t used = 0;
  uint64_t evictions = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, &evictions, NULL), 0);
  assert_true(used <= CAPACITY);
  if (churned > CAPACITY)
    assert_true(evictions > 0);
  /* every key the table still holds is consistent after the storm */
  for (int i = 0; i < NHOT; i++) {
    char k[16];
    snprintf(k, sizeof k, "hot%d", i);
    assert_true(th_remaining(h, k) <= MAX_DELAY_MS);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_threads_share_one_handle, th_setup,
                                      th_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
