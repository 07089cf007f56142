/* SPDX-License-Identifier: MIT */
/*
 * test_readonly.c — THROTTLE_READONLY handles: an operator inspects a
 * segment without writing a byte of it.  Each test compares the segment's
 * bytes before and after; a change made by a writer after the read-only
 * open is seen at the next call (the private copy is refreshed), and the
 * settings calls are refused with THROTTLE_EREADONLY.  Cross-user reads
 * (root on another uid's segment) are in tests/test_ctl_readonly.sh, which
 * drives throttlectl the way an operator would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static struct th_fx *fx_of(void **state) { return *state; }

/* The segment's bytes, as a copy the caller frees. */
static unsigned char *segment_bytes(const char *name, size_t *size) {
  void *base = th_map(name, size);
  unsigned char *copy = malloc(*size);
  assert_non_null(copy);
  memcpy(copy, base, *size);
  th_unmap(base, *size);
  return copy;
}

static throttle_t *open_ro(struct th_fx *fx, int *rc) {
  throttle_config_t *c = throttle_config_new();
  assert_non_null(c);
  assert_int_equal(throttle_config_set_segment(c, fx->name), 0);
  assert_int_equal(
      throttle_config_set_flags(c, THROTTLE_READONLY | THROTTLE_NO_FALLBACK),
      0);
  throttle_t *h = NULL;
  *rc = throttle_open(c, &h);
  throttle_config_free(c);
  return h;
}

static int count_key(const throttle_info_t *info, void *arg) {
  (void)info;
  (*(int *)arg)++;
  return 0;
}

static void test_readonly_reads_without_writing(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "orders", TH_LONG_MS), 0);
  assert_int_equal(throttle_set_max_parallel(w, "orders", 3), 0);
  size_t n0, n1;
  unsigned char *before = segment_bytes(fx->name, &n0);

  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  assert_non_null(r);
  assert_int_equal(throttle_is_shared(r), 1);
  uint64_t left = 0;
  assert_int_equal(throttle_remaining(r, "orders", &left), 0);
  assert_true(left > 0 && left <= TH_LONG_MS);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(r, "orders", &info), 0);
  assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_CAP), 3);
  throttle_info_free(info);
  int keys = 0;
  assert_int_equal(throttle_foreach(r, count_key, &keys), 0);
  assert_int_equal(keys, 1);
  uint32_t cap = 0, used = 0;
  assert_int_equal(throttle_stats(r, &cap, &used, NULL, NULL), 0);
  assert_int_equal(used, 1);

  /* Settings calls are refused, with the reason, and change nothing. */
  assert_int_equal(throttle_set_max_parallel(r, "orders", 1),
                   THROTTLE_EREADONLY);
  assert_true(th_contains(throttle_errmsg(r), "read-only"));
  assert_int_equal(throttle_pause(r, "orders"), THROTTLE_EREADONLY);
  assert_int_equal(throttle_cancel(r, "orders"), THROTTLE_EREADONLY);
  /* So are publishing, clearing and admitting: a read-only handle never
   * pretends to have done what it cannot do to the segment. */
  assert_int_equal(throttle_backoff(r, "orders", 1000), THROTTLE_EREADONLY);
  assert_int_equal(throttle_clear(r, "orders"), THROTTLE_EREADONLY);
  assert_int_equal(throttle_reset(r), THROTTLE_EREADONLY);
  assert_int_equal(throttle_set_segment_max_delay(r, 1000), THROTTLE_EREADONLY);
  throttle_ticket_t *tk = NULL;
  assert_int_equal(throttle_try_enter(r, "orders", THROTTLE_CLASS_LIVE, &tk, NULL),
                   THROTTLE_EREADONLY);
  assert_null(tk);
  throttle_close(r);

  unsigned char *after = segment_bytes(fx->name, &n1);
  assert_int_equal(n0, n1);
  assert_memory_equal(before, after, n0);
  free(before);
  free(after);
}

/* A writer's change after the read-only open shows at the next call. */
static void test_readonly_sees_later_changes(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "a", TH_LONG_MS), 0);
  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  int keys = 0;
  assert_int_equal(throttle_foreach(r, count_key, &keys), 0);
  assert_int_equal(keys, 1);
  assert_int_equal(throttle_backoff(w, "b", TH_LONG_MS), 0);
  assert_int_equal(throttle_clear(w, "a"), 0);
  keys = 0;
  assert_int_equal(throttle_foreach(r, count_key, &keys), 0);
  assert_int_equal(keys, 2);
  uint64_t left = 1;
  assert_int_equal(throttle_remaining(r, "a", &left), 0);
  assert_int_equal(left, 0);
  assert_int_equal(throttle_remaining(r, "b", &left), 0);
  assert_true(left > 0);
  throttle_close(r);
}

/* The mode and owner checks are for writers: a group- and other-writable
 * segment, refused for writing, is still readable for inspection. */
static void test_readonly_ignores_mode(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "k", TH_LONG_MS), 0);
  th_chmod(fx->name, 0666);
  throttle_t *x = NULL;
  assert_int_equal(th_open_rc(fx, &x), THROTTLE_EMODE);
  throttle_close(x);
  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  uint64_t left = 0;
  assert_int_equal(throttle_remaining(r, "k", &left), 0);
  assert_true(left > 0);
  throttle_close(r);
}

static void test_readonly_missing_is_eshm_never_created(void **state) {
  struct th_fx *fx = fx_of(state);
  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_null(r);
  assert_int_equal(rc, THROTTLE_ESHM);
  assert_true(th_contains(throttle_errmsg(NULL), "does not exist"));
  int fd = shm_open(fx->name, O_RDONLY, 0);
  assert_true(fd < 0);
}

/* A header damaged after the open is caught at the next call, not read. */
static void test_readonly_damage_after_open_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "k", TH_LONG_MS), 0);
  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  size_t size;
  unsigned char *base = th_map(fx->name, &size);
  uint64_t magic;
  memcpy(&magic, base, sizeof magic);
  memset(base, 0x41, sizeof magic);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(r, &cap, NULL, NULL, NULL), THROTTLE_EMAGIC);
  memcpy(base, &magic, sizeof magic);
  assert_int_equal(throttle_stats(r, &cap, NULL, NULL, NULL), 0);
  th_unmap(base, size);
  throttle_close(r);
}

/* A writer that died half-way through changing the table leaves its
 * sequence odd: a read-only reader still reads every key (from its private
 * copy, repaired there), and leaves the segment as it found it, odd
 * sequence included, for the next writer to repair under the mutex. */
static void test_readonly_table_mid_change_read_privately(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "a", TH_LONG_MS), 0);
  assert_int_equal(throttle_backoff(w, "b", TH_LONG_MS), 0);
  size_t size;
  unsigned char *base = th_map(fx->name, &size);
  struct throttle__hdr *hdr = (struct throttle__hdr *)base;
  uint32_t odd = atomic_load(&hdr->tseq) | 1;
  atomic_store(&hdr->tseq, odd);
  unsigned char *before = malloc(size);
  assert_non_null(before);
  memcpy(before, base, size);
  int rc;
  throttle_t *r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  int keys = 0;
  assert_int_equal(throttle_foreach(r, count_key, &keys), 0);
  assert_int_equal(keys, 2);
  uint64_t left = 0;
  assert_int_equal(throttle_remaining(r, "b", &left), 0);
  assert_true(left > 0);
  throttle_close(r);
  assert_int_equal(atomic_load(&hdr->tseq), odd);
  assert_memory_equal(before, base, size);
  free(before);
  th_unmap(base, size);
}

/* A child forked while another thread of the parent is inside a read
 * through a read-only handle (each read copies the segment under the
 * handle's own mutex): here that thread holds the mutex, as it does for
 * the whole copy, until the child has read through its copy of the handle.
 * The child inherited the mutex held by a thread it does not have, and
 * hung. */
struct ro_holder {
  throttle_t *r;
  int ready[2], done[2]; /* pipes: the mutex is held; let it go */
};

static void *hold_ro_mutex(void *arg) {
  struct ro_holder *rh = arg;
  uint64_t v = 0;
  pthread_mutex_lock(&rh->r->ro_lock);
  th_send_u64(rh->ready[1], 1);
  (void)th_recv_u64(rh->done[0], &v);
  pthread_mutex_unlock(&rh->r->ro_lock);
  return NULL;
}

static int child_reads(void *arg) {
  throttle_t *r = arg;
  int keys = 0;
  TH_CHILD_CHECK(throttle_foreach(r, count_key, &keys) == 0 && keys == 1);
  throttle_close(r);
  return 0;
}

static void test_readonly_fork_while_another_thread_reads(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *w = th_open(fx);
  assert_int_equal(throttle_backoff(w, "orders", TH_LONG_MS), 0);
  int rc;
  static struct ro_holder rh; /* outlives a failed test's frame */
  rh.r = open_ro(fx, &rc);
  assert_int_equal(rc, 0);
  int keys = 0;
  assert_int_equal(throttle_foreach(rh.r, count_key, &keys), 0);
  assert_int_equal(pipe(rh.ready), 0);
  assert_int_equal(pipe(rh.done), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, hold_ro_mutex, &rh), 0);
  uint64_t v;
  assert_int_equal(th_recv_u64(rh.ready[0], &v), 0);
  int st = th_reap(fx, th_spawn(fx, child_reads, rh.r), 5000);
  th_send_u64(rh.done[1], 1);
  pthread_join(th, NULL);
  for (int i = 0; i < 2; i++) {
    close(rh.ready[i]);
    close(rh.done[i]);
  }
  keys = 0;
  assert_int_equal(throttle_foreach(rh.r, count_key, &keys), 0);
  assert_int_equal(keys, 1);
  throttle_close(rh.r);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_readonly_reads_without_writing),
      T(test_readonly_sees_later_changes),
      T(test_readonly_ignores_mode),
      T(test_readonly_missing_is_eshm_never_created),
      T(test_readonly_damage_after_open_refused),
      T(test_readonly_table_mid_change_read_privately),
      T(test_readonly_fork_while_another_thread_reads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
