/* SPDX-License-Identifier: MIT */
/*
 * test_segment.c — creating and attaching the shared segment, and refusing
 * the ones that cannot be trusted (I7 fail open, I8 shared memory is input).
 *
 * Damaged segments are forged by writing the header through internal.h.
 * Every refusal is checked three ways: its own error code, a message that
 * tells the operator what to do, and a fallback handle that still works.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GARBAGE_SEED UINT64_C(0x5eed0001)

static struct th_fx *fx_of(void **state) { return *state; }

/* Create the fixture's segment with a key in it, then close every handle
 * so the file can be forged. */
static void make_segment(struct th_fx *fx) {
  throttle_t *h = NULL;
  assert_int_equal(throttle_open(fx->cfg, &h), 0);
  assert_int_equal(throttle_is_shared(h), 1);
  assert_int_equal(throttle_backoff(h, "kept", TH_LONG_MS), 0);
  throttle_close(h);
}

static struct stat stat_segment(const char *name) {
  char path[256];
  struct stat st;
  th_shm_path(name, path, sizeof path);
  if (lstat(path, &st) != 0)
    fail_msg("lstat(%s): %s", path, strerror(errno));
  return st;
}

/* The open is refused with `code`: by default the handle falls back to
 * private memory and works; with THROTTLE_NO_FALLBACK there is no handle. */
static void expect_refused(struct th_fx *fx, int code) {
  throttle_t *h = NULL;
  int rc = throttle_open(fx->cfg, &h);
  if (rc != code)
    fail_msg("open returned %s, expected %s (%s)", throttle_err_name(rc),
             throttle_err_name(code), h ? throttle_errmsg(h) : "");
  assert_non_null(h);
  assert_int_equal(throttle_is_shared(h), 0);
  const char *msg = throttle_errmsg(h);
  if (!th_contains(msg, "throttlectl rm") ||
      !th_contains(msg, throttle_err_name(code)))
    fail_msg("message lacks the fix or the code: \"%s\"", msg);
  assert_string_equal(throttle_segment_name(h), fx->name);
  /* the private handle does the job within this process */
  uint64_t ms = 0;
  assert_int_equal(throttle_remaining(h, "kept", &ms), 0);
  assert_int_equal(ms, 0); /* the shared key is not visible */
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
  assert_int_equal(throttle_wait(h, "k", 10), THROTTLE_ETIMEDOUT);
  assert_int_equal(throttle_clear(h, "k"), 0);
  assert_int_equal(throttle_wait(h, "k", 10), 0);
  uint32_t used = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, NULL, NULL), 0);
  assert_int_equal(used, 1);
  throttle_close(h);

  throttle_config_t *c = throttle_config_new();
  assert_non_null(c);
  assert_int_equal(throttle_config_set_segment(c, fx->name), 0);
  assert_int_equal(throttle_config_set_flags(c, THROTTLE_NO_FALLBACK), 0);
  h = (throttle_t *)&h; /* any non-NULL value */
  assert_int_equal(throttle_open(c, &h), code);
  assert_null(h);
  throttle_config_free(c);
}

static struct throttle__hdr *map_hdr(struct th_fx *fx, size_t *size) {
  return th_map(fx->name, size);
}

/* ---- creation and attachment -------------------------------------------- */

static void test_segment_create_then_attach_shares_state(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  throttle_t *a = th_open(fx);
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  assert_int_equal(throttle_is_shared(b), 1);
  assert_string_equal(throttle_errmsg(a), "");
  assert_int_equal(throttle_backoff(a, "k", 30000), 0);
  assert_true(th_remaining(b, "k") > 0);
  assert_int_equal(throttle_clear(b, "k"), 0);
  assert_int_equal(th_remaining(a, "k"), 0);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(b, &cap, NULL, NULL, NULL), 0);
  assert_int_equal(cap, 8);
  throttle_close(b);
}

static void test_segment_attach_keeps_creator_capacity(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 64), 0);
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(b, &cap, NULL, NULL, NULL), 0);
  assert_int_equal(cap, 8);
  assert_int_equal(throttle_stats(a, &cap, NULL, NULL, NULL), 0);
  assert_int_equal(cap, 8);
  throttle_close(b);
}

/* An object of size 0 (someone shm_open'ed it and went away) is built. */
static void test_segment_empty_object_is_built(void **state) {
  struct th_fx *fx = fx_of(state);
  int fd = shm_open(fx->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  close(fd);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
}

/* Magic 0 means "a creator died before finishing": rebuilt, not refused. */
static void test_segment_unfinished_magic_zero_rebuilt(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  make_segment(fx);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  atomic_store(&hdr->magic, 0);
  memset((char *)hdr + sizeof *hdr, 0xa5, size - sizeof *hdr); /* junk */
  th_unmap(hdr, size);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 16), 0);
  throttle_t *h = th_open(fx);
  uint32_t cap = 0, used = 1;
  assert_int_equal(throttle_stats(h, &cap, &used, NULL, NULL), 0);
  assert_int_equal(cap, 16); /* built anew, by this opener */
  assert_int_equal(used, 0);
  assert_int_equal(th_remaining(h, "kept"), 0);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
}

/* The header (magic and capacity) zeroed under a live user, then an opener
 * with a smaller capacity: the rebuild must not shrink the object, or the
 * live user faults (SIGBUS) on its records past the new end. */
static int touch_last_record(void *arg) {
  throttle_t *h = arg;
  /* the last record, far past what a 16-key segment holds */
  struct throttle__rec *r = &h->recs[h->capacity - 1];
  return atomic_load(&r->not_before) == UINT64_MAX ? 1 : 0;
}

static void test_segment_rebuild_never_shrinks(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 4096), 0);
  throttle_t *live = th_open(fx);
  struct stat before = stat_segment(fx->name);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  atomic_store(&hdr->magic, 0);
  hdr->capacity = 0;
  th_unmap(hdr, size);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 16), 0);
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  struct stat after = stat_segment(fx->name);
  assert_true(after.st_size >= before.st_size);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(b, &cap, NULL, NULL, NULL), 0);
  assert_true(cap >= 4096);
  assert_int_equal(throttle_backoff(b, "k", 30000), 0);
  throttle_close(b);
  /* the old mapping is still whole */
  th_reap_ok(fx, th_spawn(fx, touch_last_record, live), 10000);
}

/* ---- forged headers ----------------------------------------------------- */

static void test_segment_wrong_magic_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  atomic_store(&hdr->magic, UINT64_C(0x1234567890abcdef));
  th_unmap(hdr, size);
  expect_refused(fx, THROTTLE_EMAGIC);
  /* someone else's object is never overwritten */
  hdr = map_hdr(fx, &size);
  assert_true(atomic_load(&hdr->magic) == UINT64_C(0x1234567890abcdef));
  th_unmap(hdr, size);
}

static void test_segment_wrong_version_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  hdr->layout = THROTTLE__LAYOUT + 1;
  th_unmap(hdr, size);
  expect_refused(fx, THROTTLE_EVERSION);
}

static void test_segment_wrong_fingerprint_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  hdr->fingerprint ^= 1;
  th_unmap(hdr, size);
  expect_refused(fx, THROTTLE_EFINGERPRINT);
}

/* The header says X bytes, the object has Y. */
static void test_segment_wrong_size_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  struct stat st = stat_segment(fx->name);
  th_truncate(fx->name, (uint64_t)st.st_size + 4096);
  expect_refused(fx, THROTTLE_ESIZE);
  /* shorter than the header says, but with a whole header */
  th_truncate(fx->name, (uint64_t)st.st_size - 64);
  expect_refused(fx, THROTTLE_ESIZE);
}

static void test_segment_inconsistent_header_sizes_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  make_segment(fx);
  size_t size;
  struct throttle__hdr *hdr = map_hdr(fx, &size);
  struct throttle__hdr good = {0};
  memcpy(&good, hdr, offsetof(struct throttle__hdr, mutex));
  th_unmap(hdr, size);
  /* each size field in turn, the rest left right */
  for (int field = 0; field < 6; field++) {
    hdr = map_hdr(fx, &size);
    switch (field) {
    case 0: hdr->capacity = 0; break;
    case 1: hdr->capacity = 9; break;
    case 2: hdr->capacity = THROTTLE__MAX_CAPACITY + 1; break;
    case 3: hdr->nbuckets = 1024; break;
    case 4: hdr->record_size = 64; break;
    case 5: hdr->total_size = UINT64_MAX; break;
    }
    th_unmap(hdr, size);
    expect_refused(fx, THROTTLE_ESIZE);
    hdr = map_hdr(fx, &size);
    hdr->capacity = good.capacity;
    hdr->nbuckets = good.nbuckets;
    hdr->record_size = good.record_size;
    hdr->total_size = good.total_size;
    th_unmap(hdr, size);
  }
  /* restored: accepted again, with its key */
  throttle_t *h = th_open(fx);
  assert_true(th_remaining(h, "kept") > 0);
}

static void test_segment_too_small_file_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  th_truncate(fx->name, sizeof(struct throttle__hdr) - 1);
  expect_refused(fx, THROTTLE_ESIZE);
  th_truncate(fx->name, 16);
  expect_refused(fx, THROTTLE_ESIZE);
  th_truncate(fx->name, 1);
  expect_refused(fx, THROTTLE_ESIZE);
}

/* ---- ownership and permissions ------------------------------------------ */

static void test_segment_mode_0666_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  th_chmod(fx->name, 0666);
  expect_refused(fx, THROTTLE_EMODE);
  /* group sharing does not make an other-writable segment acceptable */
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_GROUP_SHARED),
                   0);
  expect_refused(fx, THROTTLE_EMODE);
  th_chmod(fx->name, 0602);
  expect_refused(fx, THROTTLE_EMODE);
}

static void test_segment_mode_0660_needs_group_shared(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  th_chmod(fx->name, 0660);
  expect_refused(fx, THROTTLE_EMODE);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_GROUP_SHARED),
                   0);
  throttle_t *h = th_open(fx);
  assert_true(th_remaining(h, "kept") > 0);
  /* group-readable only is not writable by anyone else: fine either way */
  throttle_close(h);
  fx->h = NULL;
  th_chmod(fx->name, 0640);
  assert_int_equal(throttle_config_set_flags(fx->cfg, 0), 0);
  th_open(fx);
}

static void test_segment_foreign_owner_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  if (geteuid() != 0) {
    print_message("skipped: giving the segment to another uid needs root "
                  "(running as uid %u)\n",
                  (unsigned)geteuid());
    skip();
  }
  make_segment(fx);
  int fd = shm_open(fx->name, O_RDWR, 0);
  assert_true(fd >= 0);
  int rc = fchown(fd, 65534, 65534);
  close(fd);
  assert_int_equal(rc, 0);
  expect_refused(fx, THROTTLE_EOWNER);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_GROUP_SHARED),
                   0);
  expect_refused(fx, THROTTLE_EOWNER);
}

static void test_segment_symlink_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  const char *target = th_extra_name(fx);
  throttle_config_t *c = throttle_config_new();
  assert_non_null(c);
  assert_int_equal(throttle_config_set_segment(c, target), 0);
  throttle_t *t = NULL;
  assert_int_equal(throttle_open(c, &t), 0);
  assert_int_equal(throttle_backoff(t, "kept", TH_LONG_MS), 0);
  char from[256], to[256];
  th_shm_path(fx->name, from, sizeof from);
  th_shm_path(target, to, sizeof to);
  assert_int_equal(symlink(to, from), 0);
  expect_refused(fx, THROTTLE_ESYMLINK);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_NO_CREATE), 0);
  expect_refused(fx, THROTTLE_ESYMLINK);
  /* a dangling link is refused too, and not created through */
  throttle_close(t);
  throttle_config_free(c);
  assert_int_equal(shm_unlink(target), 0);
  assert_int_equal(throttle_config_set_flags(fx->cfg, 0), 0);
  expect_refused(fx, THROTTLE_ESYMLINK);
  struct stat st;
  assert_int_equal(stat(to, &st), -1);
  assert_int_equal(S_ISLNK(stat_segment(fx->name).st_mode), 1);
}

/* ---- garbage (I8) ------------------------------------------------------- */

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static void fill_random(void *p, size_t n, uint64_t *seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = (unsigned char)xorshift(seed);
}

static void test_segment_random_garbage_refused(void **state) {
  struct th_fx *fx = fx_of(state);
  uint64_t seed = GARBAGE_SEED;
  print_message("seed 0x%llx\n", (unsigned long long)seed);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  make_segment(fx);
  struct stat st0 = stat_segment(fx->name);
  for (int round = 0; round < 40; round++) {
    /* sizes: the real one, and others from tiny to a few pages */
    uint64_t sz = round % 2 == 0 ? (uint64_t)st0.st_size
                                 : 1 + xorshift(&seed) % 16384;
    th_truncate(fx->name, 0);
    th_truncate(fx->name, sz);
    size_t size;
    unsigned char *b = th_map(fx->name, &size);
    fill_random(b, size, &seed);
    struct throttle__hdr *hdr = (struct throttle__hdr *)b;
    if (size >= sizeof *hdr) {
      if (atomic_load(&hdr->magic) == 0)
        atomic_store(&hdr->magic, 1); /* 0 would mean "rebuild me" */
      if (round % 4 >= 2) /* our magic, garbage after it */
        atomic_store(&hdr->magic, THROTTLE__MAGIC);
      if (round % 8 >= 6) {
        hdr->layout = THROTTLE__LAYOUT;
        hdr->fingerprint = throttle__fingerprint();
      }
    }
    th_unmap(b, size);
    throttle_t *h = NULL;
    int rc = throttle_open(fx->cfg, &h);
    if (rc != THROTTLE_EMAGIC && rc != THROTTLE_EVERSION &&
        rc != THROTTLE_EFINGERPRINT && rc != THROTTLE_ESIZE)
      fail_msg("round %d (size %llu): %s", round, (unsigned long long)sz,
               throttle_err_name(rc));
    assert_int_equal(throttle_is_shared(h), 0);
    assert_int_equal(throttle_backoff(h, "k", 100), 0);
    throttle_close(h);
  }
}

/* A header that checks out over a table of garbage: every call must stay
 * within bounds and finish, and no key may look closed for longer than the
 * maximum delay. */
static int count_keys(const throttle_info_t *info, void *arg) {
  (void)info;
  (*(int *)arg)++;
  return 0;
}

static void test_segment_garbage_table_no_crash(void **state) {
  struct th_fx *fx = fx_of(state);
  uint64_t seed = GARBAGE_SEED + 1;
  print_message("seed 0x%llx\n", (unsigned long long)seed);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  assert_int_equal(throttle_config_set_max_delay(fx->cfg, 2000), 0);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 200), 0);
  make_segment(fx);
  for (int round = 0; round < 20; round++) {
    size_t size;
    struct throttle__hdr *hdr = map_hdr(fx, &size);
    size_t keep = offsetof(struct throttle__hdr, tseq);
    fill_random((char *)hdr + keep, size - keep, &seed);
    /* records that claim to be in use, so the garbage is acted upon */
    struct throttle__rec *r =
        (struct throttle__rec *)((char *)hdr + hdr->records_off);
    for (uint32_t i = 0; i < hdr->capacity; i++)
      if (round % 2 == 0 || i % 2 == 0)
        r[i].state = THROTTLE__REC_USED;
    if (round % 4 == 1) {
      /* nothing that would make the table rebuild itself first: a full
       * table of idle records whose lengths and keys are garbage, so an
       * insert goes straight to eviction */
      atomic_store(&hdr->tseq, 0);
      hdr->free_head = 0;
      hdr->tombstones = 0;
      for (uint32_t i = 0; i < hdr->capacity; i++) {
        memset(&r[i], 0, sizeof r[i]); /* idle: no back-off, no holders */
        r[i].state = THROTTLE__REC_USED;
        r[i].key_len = (uint16_t)(0xff00u + i);
        fill_random(r[i].key, sizeof r[i].key, &seed);
        r[i].last_use_ns = xorshift(&seed);
      }
    }
    th_unmap(hdr, size);

    throttle_t *h = NULL;
    assert_int_equal(throttle_open(fx->cfg, &h), 0);
    assert_int_equal(throttle_is_shared(h), 1);
    char key[32];
    for (int i = 0; i < 12; i++) {
      snprintf(key, sizeof key, "g%d", i);
      int rc = throttle_backoff(h, key, 50);
      assert_true(rc == 0 || rc == THROTTLE_EFULL);
      uint64_t ms = 0;
      rc = throttle_remaining(h, key, &ms);
      assert_true(rc == 0 || rc == THROTTLE_ELOCKTIMEOUT);
      assert_true(ms <= 2000);
      rc = throttle_wait(h, key, 0);
      assert_true(rc == 0 || rc == THROTTLE_ETIMEDOUT);
      throttle_info_t *info = NULL;
      rc = throttle_info(h, key, &info);
      assert_true(rc == 0 || rc == THROTTLE_ENOKEY);
      if (info != NULL)
        assert_true(throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS) <=
                    2000);
      throttle_info_free(info);
    }
    int n = 0;
    assert_int_equal(throttle_foreach(h, count_keys, &n), 0);
    assert_true(n <= 8);
    assert_int_equal(throttle_stats(h, NULL, NULL, NULL, NULL), 0);
    assert_int_equal(throttle_reset(h), 0);
    throttle_close(h);
  }
}

/* ---- creation mode ------------------------------------------------------ */

static void created_mode(struct th_fx *fx, mode_t mask, unsigned flags,
                         unsigned want) {
  mode_t old = umask(mask);
  assert_int_equal(throttle_config_set_flags(fx->cfg, flags), 0);
  throttle_t *h = NULL;
  int rc = throttle_open(fx->cfg, &h);
  umask(old);
  assert_int_equal(rc, 0);
  assert_int_equal(throttle_is_shared(h), 1);
  struct stat st = stat_segment(fx->name);
  assert_int_equal(st.st_mode & 07777, want);
  assert_int_equal(st.st_uid, geteuid());
  /* and another opener accepts what was created */
  throttle_t *b = NULL;
  assert_int_equal(throttle_open(fx->cfg, &b), 0);
  throttle_close(b);
  throttle_close(h);
  shm_unlink(fx->name);
}

static void test_segment_created_mode_0600_umask_0(void **state) {
  created_mode(fx_of(state), 0, 0, 0600);
}

static void test_segment_created_mode_0600_umask_0277(void **state) {
  created_mode(fx_of(state), 0277, 0, 0600);
}

static void test_segment_created_mode_0660_group_shared(void **state) {
  created_mode(fx_of(state), 0, THROTTLE_GROUP_SHARED, 0660);
  created_mode(fx_of(state), 0277, THROTTLE_GROUP_SHARED, 0660);
}

/* ---- flags -------------------------------------------------------------- */

static void test_segment_no_create_missing_is_eshm(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_NO_CREATE), 0);
  throttle_t *h = NULL;
  assert_int_equal(throttle_open(fx->cfg, &h), THROTTLE_ESHM);
  assert_non_null(h);
  assert_int_equal(throttle_is_shared(h), 0);
  assert_true(th_contains(throttle_errmsg(h), fx->name));
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
  throttle_close(h);
  char path[256];
  struct stat st;
  th_shm_path(fx->name, path, sizeof path);
  assert_int_equal(lstat(path, &st), -1); /* not created */
  assert_int_equal(
      throttle_config_set_flags(fx->cfg, THROTTLE_NO_CREATE |
                                             THROTTLE_NO_FALLBACK),
      0);
  h = (throttle_t *)&h;
  assert_int_equal(throttle_open(fx->cfg, &h), THROTTLE_ESHM);
  assert_null(h);
}

static void test_segment_no_create_attaches_existing(void **state) {
  struct th_fx *fx = fx_of(state);
  make_segment(fx);
  assert_int_equal(throttle_config_set_flags(fx->cfg, THROTTLE_NO_CREATE), 0);
  throttle_t *h = th_open(fx);
  assert_true(th_remaining(h, "kept") > 0);
}

/* ---- environment -------------------------------------------------------- */

static void test_segment_env_segment_respected(void **state) {
  struct th_fx *fx = fx_of(state);
  const char *name = th_extra_name(fx);
  assert_int_equal(setenv("THROTTLE_SEGMENT", name + 1, 1), 0); /* no '/' */
  throttle_t *h = NULL;
  assert_int_equal(throttle_open(NULL, &h), 0);
  assert_int_equal(throttle_is_shared(h), 1);
  assert_string_equal(throttle_segment_name(h), name);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  throttle_close(h);
  stat_segment(name); /* exists */
  /* a config without a segment name also takes the environment's */
  throttle_config_t *c = throttle_config_new();
  assert_non_null(c);
  assert_int_equal(throttle_open(c, &h), 0);
  assert_string_equal(throttle_segment_name(h), name);
  assert_true(th_remaining(h, "k") > 0);
  throttle_close(h);
  throttle_config_free(c);
  /* an explicit name wins over the environment */
  h = th_open(fx);
  assert_string_equal(throttle_segment_name(h), fx->name);
  assert_int_equal(th_remaining(h, "k"), 0);
  unsetenv("THROTTLE_SEGMENT");
}

static void test_segment_env_keys_sets_capacity(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(setenv("THROTTLE_KEYS", "16", 1), 0);
  throttle_t *h = th_open(fx);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(h, &cap, NULL, NULL, NULL), 0);
  assert_int_equal(cap, 16);
  throttle_close(h);
  fx->h = NULL;
  shm_unlink(fx->name);
  /* the config overrides the environment */
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 8), 0);
  h = th_open(fx);
  assert_int_equal(throttle_stats(h, &cap, NULL, NULL, NULL), 0);
  assert_int_equal(cap, 8);
  unsetenv("THROTTLE_KEYS");
}

static void test_segment_env_bad_value_uses_default(void **state) {
  struct th_fx *fx = fx_of(state);
  const char *bad[] = {"abc", "0", "-5", "16x", "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(setenv("THROTTLE_KEYS", bad[i], 1), 0);
    throttle_t *h = th_open(fx);
    uint32_t cap = 0;
    assert_int_equal(throttle_stats(h, &cap, NULL, NULL, NULL), 0);
    assert_int_equal(cap, THROTTLE__DEFAULT_CAPACITY);
    if (!th_contains(throttle_errmsg(h), "THROTTLE_KEYS"))
      fail_msg("THROTTLE_KEYS=%s: message \"%s\"", bad[i],
               throttle_errmsg(h));
    throttle_close(h);
    fx->h = NULL;
    shm_unlink(fx->name);
  }
  unsetenv("THROTTLE_KEYS");
}

static void test_segment_env_max_delay_respected(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(setenv("THROTTLE_MAX_DELAY_MS", "1500", 1), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 1000000), 0);
  uint64_t ms = th_remaining(h, "k");
  assert_true(ms > 0 && ms <= 1500);
  unsetenv("THROTTLE_MAX_DELAY_MS");
}

/* ---- unlink ------------------------------------------------------------- */

static void test_segment_unlink(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_int_equal(throttle_unlink(fx->name), 0);
  char path[256];
  struct stat st;
  th_shm_path(fx->name, path, sizeof path);
  assert_int_equal(lstat(path, &st), -1);
  assert_int_equal(errno, ENOENT);
  /* the mapping lives on for who has it */
  assert_true(th_remaining(h, "k") > 0);
  assert_int_equal(throttle_backoff(h, "j", 30000), 0);
  assert_int_equal(throttle_unlink(fx->name), THROTTLE_ENOKEY);
  assert_int_equal(throttle_unlink(fx->name + 1), THROTTLE_ENOKEY);
  /* the next opener starts afresh */
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  assert_int_equal(th_remaining(b, "k"), 0);
  throttle_close(b);
  assert_int_equal(throttle_unlink(fx->name + 1), 0); /* without the '/' */
  assert_int_equal(throttle_unlink("/no-such-throttle-segment-x"),
                   THROTTLE_ENOKEY);
}

/* An invalid $THROTTLE_SEGMENT names nothing to remove: unlink(NULL) must
 * fail, not fall back to removing the per-user default segment. */
static void test_segment_unlink_invalid_env_is_einval(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  const char *bad[] = {"a/b", "/", "/x/y"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("THROTTLE_SEGMENT", bad[i], 1);
    assert_int_equal(throttle_unlink(NULL), THROTTLE_EINVAL);
  }
  /* a valid one is what unlink(NULL) removes */
  setenv("THROTTLE_SEGMENT", fx->name, 1);
  assert_int_equal(throttle_unlink(NULL), 0);
  assert_int_equal(throttle_unlink(NULL), THROTTLE_ENOKEY);
  unsetenv("THROTTLE_SEGMENT");
}

/* ---- a creator that fails ---------------------------------------------- */

/* Waits for the name to appear, then opens it normally (building it) and
 * publishes a back-off. */
static int late_builder(void *arg) {
  struct th_fx *fx = arg;
  char path[256];
  th_shm_path(fx->name, path, sizeof path);
  uint64_t t0 = th_mono_ms();
  while (access(path, F_OK) != 0 && th_mono_ms() - t0 < 10000)
    th_sleep_ms(1);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_backoff(h, "k", TH_LONG_MS) == 0);
  throttle_close(h);
  return 0;
}

/* The creator (O_EXCL) cannot take the init lock and times out while
 * another process builds the segment and publishes into it.  The failing
 * creator must not remove the name: later openers would get a second,
 * empty segment and ignore the back-off (a split brain). */
static void test_segment_failed_creator_keeps_name(void **state) {
  struct th_fx *fx = fx_of(state);
  pid_t kid = th_spawn(fx, late_builder, fx);
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, fx->name), 0);
  assert_int_equal(throttle_config_set_lock_timeout(cfg, 1000), 0);
  throttle__fault_arm(THROTTLE__FAULT_FLOCK, 1);
  throttle__fault_persist(THROTTLE__FAULT_FLOCK, true);
  throttle__fault_errno(THROTTLE__FAULT_FLOCK, EWOULDBLOCK);
  throttle_t *a = NULL;
  int rc = throttle_open(cfg, &a);
  throttle__fault_reset();
  assert_int_equal(rc, THROTTLE_EINITTIMEOUT);
  throttle_close(a);
  throttle_config_free(cfg);
  th_reap_ok(fx, kid, 10000);
  throttle_t *h = th_open(fx);
  assert_true(th_remaining(h, "k") > 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_segment_create_then_attach_shares_state),
      T(test_segment_attach_keeps_creator_capacity),
      T(test_segment_empty_object_is_built),
      T(test_segment_unfinished_magic_zero_rebuilt),
      T(test_segment_rebuild_never_shrinks),
      T(test_segment_wrong_magic_refused),
      T(test_segment_wrong_version_refused),
      T(test_segment_wrong_fingerprint_refused),
      T(test_segment_wrong_size_refused),
      T(test_segment_inconsistent_header_sizes_refused),
      T(test_segment_too_small_file_refused),
      T(test_segment_mode_0666_refused),
      T(test_segment_mode_0660_needs_group_shared),
      T(test_segment_foreign_owner_refused),
      T(test_segment_symlink_refused),
      T(test_segment_random_garbage_refused),
      T(test_segment_garbage_table_no_crash),
      T(test_segment_created_mode_0600_umask_0),
      T(test_segment_created_mode_0600_umask_0277),
      T(test_segment_created_mode_0660_group_shared),
      T(test_segment_no_create_missing_is_eshm),
      T(test_segment_no_create_attaches_existing),
      T(test_segment_env_segment_respected),
      T(test_segment_env_keys_sets_capacity),
      T(test_segment_env_bad_value_uses_default),
      T(test_segment_env_max_delay_respected),
      T(test_segment_unlink),
      T(test_segment_unlink_invalid_env_is_einval),
      T(test_segment_failed_creator_keeps_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
