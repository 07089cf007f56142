/* SPDX-License-Identifier: MIT */
/*
 * test_faults.c — every allocation and system call the library checks,
 * failed on purpose, one at a time (I6, I7).
 *
 * As SQLite's tests do: for N = 1, 2, ... the Nth call of one kind (an
 * allocation, shm_open, flock, fstat, fchmod, ftruncate, posix_fallocate,
 * mmap, pthread_mutex_init, the segment mutex, the clock, a futex) fails
 * (libthrottle/core/fault.c, test builds only), until the operation no longer
 * reaches an Nth call and succeeds.  After each failure:
 *
 *   - the error is the specific one (THROTTLE_ENOMEM for memory,
 *     THROTTLE_ENOSPC for a full /dev/shm, THROTTLE_ESHM / THROTTLE_ESYS
 *     naming the call for the rest, THROTTLE_ELOCKTIMEOUT for the mutex)
 *     with a message, never a crash or a generic code;
 *   - nothing leaked: the library's live allocations and this process's
 *     open file descriptors are what they were (valgrind checks the rest:
 *     `make valgrind`);
 *   - the segment is whole or absent: a failed create leaves no object in
 *     /dev/shm; a failed attach leaves an existing segment and its keys as
 *     they were; a failed rebuild of a half-built one leaves it to the next
 *     opener, who rebuilds it; and the next un-faulted open attaches to
 *     whatever is there and finds the table consistent;
 *   - fail open: unless THROTTLE_NO_FALLBACK, a failed shared open still
 *     gives a working private handle, except when the private one cannot
 *     be made either (THROTTLE_ENOMEM, *out NULL).
 *
 * The counts are deterministic (the hooks count the library's own calls
 * only), so each loop prints the N at which the operation stopped failing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "http/http_internal.h"
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEYS 16     /* small segments: the loops make many */
#define OPS_KEYS 256 /* the operations' segment collects a key per round */
#define MAX_N 100   /* no operation here makes this many calls of a kind */
#define NS_PER_MS UINT64_C(1000000)
#define SHORT_MS 30 /* a back-off the test waits out */

static struct th_fx *fx_of(void **state) { return *state; }

/* ---- resources ---------------------------------------------------------- */

static int fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n - 1; /* the directory's own */
}

struct res {
  int fds;
  long live;
};

static struct res res_now(void) {
  return (struct res){fd_count(), throttle__fault_live()};
}

static void res_same(struct res before, const char *what, unsigned long n) {
  struct res after = res_now();
  if (after.fds != before.fds)
    fail_msg("%s, N=%lu: %d file descriptors open, %d before", what, n,
             after.fds, before.fds);
  if (after.live != before.live)
    fail_msg("%s, N=%lu: %ld allocations live, %ld before", what, n,
             after.live, before.live);
}

static int shm_exists(const char *name) {
  char path[256];
  th_shm_path(name, path, sizeof path);
  return access(path, F_OK) == 0;
}

/* Absent, or never finished (empty, or magic still 0): what a creator
 * that failed may leave for the next opener to build. */
static int shm_unfinished(const char *name) {
  char path[256];
  th_shm_path(name, path, sizeof path);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return 1;
  uint64_t magic = 0;
  ssize_t n = read(fd, &magic, sizeof magic);
  close(fd);
  return n <= 0 || magic == 0;
}

static off_t shm_size(const char *name) {
  char path[256];
  struct stat st;
  th_shm_path(name, path, sizeof path);
  assert_int_equal(stat(path, &st), 0);
  return st.st_size;
}

/* Arm kind for the Nth call (and every later one when persist). */
static void arm(int kind, unsigned long n, bool persist) {
  throttle__fault_reset();
  throttle__fault_arm(kind, n);
  throttle__fault_persist(kind, persist);
}

/* Disarm, returning how many calls failed. */
static unsigned long disarm(int kind) {
  unsigned long hits = throttle__fault_hits(kind);
  throttle__fault_reset();
  return hits;
}

static void table_ok(throttle_t *h, const char *what, unsigned long n) {
  char why[256];
  if (th_table_faults(h, why, sizeof why) != 0)
    fail_msg("%s, N=%lu: table damaged: %s", what, n, why);
}

/* ---- opening: what each kind must give --------------------------------- */

static const int open_kinds[] = {
    THROTTLE__FAULT_ALLOC,     THROTTLE__FAULT_SHM_OPEN,
    THROTTLE__FAULT_FCHMOD,    THROTTLE__FAULT_FLOCK,
    THROTTLE__FAULT_FSTAT,     THROTTLE__FAULT_FTRUNCATE,
    THROTTLE__FAULT_FALLOCATE, THROTTLE__FAULT_MMAP,
    THROTTLE__FAULT_MUTEX_INIT, THROTTLE__FAULT_CLOCK,
};
#define N_OPEN_KINDS (sizeof open_kinds / sizeof open_kinds[0])

/* The code a failed shared open gives, and a word its message must hold. */
static int open_code(int kind) {
  switch (kind) {
  case THROTTLE__FAULT_ALLOC:
    return THROTTLE_ENOMEM;
  case THROTTLE__FAULT_SHM_OPEN:
    return THROTTLE_ESHM;
  case THROTTLE__FAULT_FALLOCATE:
    return THROTTLE_ENOSPC;
  case THROTTLE__FAULT_CLOCK:
    return 0; /* the clock's fallback absorbs it */
  default:
    return THROTTLE_ESYS;
  }
}

static const char *open_word(int kind) {
  return kind == THROTTLE__FAULT_ALLOC ? "out of memory"
                                       : throttle__fault_name(kind);
}

static const int default_errno[] = {
    [THROTTLE__FAULT_ALLOC] = ENOMEM,      [THROTTLE__FAULT_SHM_OPEN] = EMFILE,
    [THROTTLE__FAULT_FCHMOD] = EPERM,      [THROTTLE__FAULT_FLOCK] = ENOLCK,
    [THROTTLE__FAULT_FSTAT] = EIO,         [THROTTLE__FAULT_FTRUNCATE] = EIO,
    [THROTTLE__FAULT_FALLOCATE] = ENOSPC,  [THROTTLE__FAULT_MMAP] = ENOMEM,
    [THROTTLE__FAULT_MUTEX_INIT] = EAGAIN,
};

enum scene {
  SCENE_CREATE,  /* no segment yet */
  SCENE_ATTACH,  /* a live segment with keys, another handle on it */
  SCENE_REBUILD, /* a half-built segment (magic 0) a creator left */
};
static const char *const scene_name[] = {"create", "attach", "rebuild"};

static const char *const attach_keys[] = {"orders", "lines", "stock"};

static throttle_config_t *open_cfg(const char *name, bool fallback) {
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, name), 0);
  assert_int_equal(throttle_config_set_capacity(cfg, KEYS), 0);
  assert_int_equal(throttle_config_set_lock_timeout(cfg, 500), 0);
  assert_int_equal(
      throttle_config_set_flags(cfg, fallback ? 0 : THROTTLE_NO_FALLBACK), 0);
  return cfg;
}

/* A segment whose creator died before writing the magic: built, then the
 * magic zeroed, no handle left on it. */
static void make_half_built(const char *name) {
  throttle_config_t *cfg = open_cfg(name, false);
  throttle_t *h = NULL;
  assert_int_equal(throttle_open(cfg, &h), 0);
  assert_int_equal(throttle_backoff(h, "lost", TH_LONG_MS), 0);
  throttle_close(h);
  throttle_config_free(cfg);
  size_t size;
  struct throttle__hdr *hdr = th_map(name, &size);
  atomic_store(&hdr->magic, 0);
  th_unmap(hdr, size);
}

/* The next un-faulted open attaches (or rebuilds) and finds a consistent
 * table; with want_keys, the attach scene's keys with their back-off. */
static void reopen_ok(const char *name, bool want_keys, const char *what,
                      unsigned long n) {
  throttle_config_t *cfg = open_cfg(name, false);
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  if (rc != 0)
    fail_msg("%s, N=%lu: the next open: %s: %s", what, n,
             throttle_err_name(rc), throttle_errmsg(NULL));
  assert_int_equal(throttle_is_shared(h), 1);
  table_ok(h, what, n);
  for (size_t i = 0; want_keys && i < 3; i++)
    if (th_remaining(h, attach_keys[i]) == 0)
      fail_msg("%s, N=%lu: key %s lost its back-off", what, n,
               attach_keys[i]);
  throttle_close(h);
  throttle_config_free(cfg);
}

/* A fallback handle does its job within the process. */
static void private_works(throttle_t *h) {
  assert_int_equal(throttle_is_shared(h), 0);
  assert_int_equal(throttle_backoff(h, "p", TH_LONG_MS), 0);
  assert_true(th_remaining(h, "p") > 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(h, "q", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* One loop: N = 1, 2, ... until the open no longer reaches an Nth call of
 * kind.  Returns the number of opens that met a fault. */
static unsigned long open_loop(struct th_fx *fx, enum scene sc, int kind,
                               bool persist, bool fallback) {
  char what[128];
  snprintf(what, sizeof what, "open/%s %s%s%s", scene_name[sc],
           throttle__fault_name(kind), persist ? " from N on" : "",
           fallback ? " (fallback)" : "");
  unsigned long n;
  for (n = 1;; n++) {
    if (n > MAX_N)
      fail_msg("%s: still failing at N=%d", what, MAX_N);
    char name[128];
    if (sc == SCENE_ATTACH)
      snprintf(name, sizeof name, "%s", fx->name);
    else
      th_unique_name(name, sizeof name);
    if (sc == SCENE_REBUILD)
      make_half_built(name);
    off_t size_before = sc == SCENE_REBUILD ? shm_size(name) : 0;
    struct res before = res_now();
    throttle_config_t *cfg = open_cfg(name, fallback);

    throttle_t *h = NULL;
    arm(kind, n, persist);
    int rc = throttle_open(cfg, &h);
    unsigned long hits = disarm(kind);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", throttle_errmsg(h));

    if (hits == 0) { /* the open made fewer than n such calls */
      if (rc != 0)
        fail_msg("%s, N=%lu: no fault, yet %s: %s", what, n,
                 throttle_err_name(rc), msg);
      assert_int_equal(throttle_is_shared(h), 1);
      table_ok(h, what, n);
      throttle_close(h);
      throttle_config_free(cfg);
      if (sc != SCENE_ATTACH)
        shm_unlink(name);
      res_same(before, what, n);
      break;
    }

    /* What must have come back. */
    bool private_fails =
        persist && fallback &&
        (kind == THROTTLE__FAULT_MMAP || kind == THROTTLE__FAULT_MUTEX_INIT);
    int want = open_code(kind);
    if (private_fails)
      want = THROTTLE_ENOMEM;
    if (rc != want)
      fail_msg("%s, N=%lu: %s (%s), expected %s", what, n,
               throttle_err_name(rc), msg, throttle_err_name(want));
    if (rc == 0) {
      assert_non_null(h);
      assert_int_equal(throttle_is_shared(h), 1);
      table_ok(h, what, n);
    } else if (rc == THROTTLE_ENOMEM || !fallback) {
      if (h != NULL)
        fail_msg("%s, N=%lu: %s with a handle", what, n,
                 throttle_err_name(rc));
      if (!th_contains(msg, open_word(kind)))
        fail_msg("%s, N=%lu: message \"%s\" does not name %s", what, n, msg,
                 open_word(kind));
    } else {
      if (h == NULL)
        fail_msg("%s, N=%lu: %s without a fallback handle", what, n,
                 throttle_err_name(rc));
      /* "THROTTLE_ESYS: /tt-1-2: mmap: Cannot allocate memory" */
      if (strncmp(msg, throttle_err_name(rc), strlen(throttle_err_name(rc))) !=
              0 ||
          !th_contains(msg, open_word(kind)) ||
          !th_contains(msg, strerror(default_errno[kind])))
        fail_msg("%s, N=%lu: fallback message \"%s\"", what, n, msg);
      private_works(h);
    }
    throttle_close(h);
    throttle_config_free(cfg);

    /* The segment: whole or absent. */
    switch (sc) {
    case SCENE_CREATE:
      if (rc != 0 && !shm_unfinished(name))
        fail_msg("%s, N=%lu: %s left behind finished", what, n, name);
      break;
    case SCENE_ATTACH:
      table_ok(fx->h, what, n);
      for (size_t i = 0; i < 3; i++)
        if (th_remaining(fx->h, attach_keys[i]) == 0)
          fail_msg("%s, N=%lu: %s lost its back-off", what, n,
                   attach_keys[i]);
      break;
    case SCENE_REBUILD:
      if (!shm_exists(name))
        fail_msg("%s, N=%lu: the half-built segment was removed", what, n);
      if (shm_size(name) != size_before)
        fail_msg("%s, N=%lu: resized from %lld to %lld bytes", what, n,
                 (long long)size_before, (long long)shm_size(name));
      break;
    }
    if (shm_exists(name))
      reopen_ok(name, sc == SCENE_ATTACH, what, n);
    if (sc != SCENE_ATTACH)
      shm_unlink(name);
    res_same(before, what, n);
  }
  print_message("%-48s failed at N=1..%lu, succeeded at N=%lu\n", what, n - 1,
                n);
  return n - 1;
}

static void open_scene(struct th_fx *fx, enum scene sc) {
  if (sc == SCENE_ATTACH) {
    assert_int_equal(throttle_config_set_capacity(fx->cfg, KEYS), 0);
    th_open(fx);
    for (size_t i = 0; i < 3; i++)
      assert_int_equal(throttle_backoff(fx->h, attach_keys[i], TH_LONG_MS), 0);
    assert_int_equal(throttle_set_max_parallel(fx->h, "stock", 3), 0);
  }
  unsigned long total = 0;
  for (size_t k = 0; k < N_OPEN_KINDS; k++)
    for (int fallback = 0; fallback < 2; fallback++)
      total += open_loop(fx, sc, open_kinds[k], false, fallback);
  /* Every call from N on fails: the shared attempt and then the private
   * fallback meet the same fault. */
  total += open_loop(fx, sc, THROTTLE__FAULT_MMAP, true, true);
  total += open_loop(fx, sc, THROTTLE__FAULT_MUTEX_INIT, true, true);
  assert_true(total > 0);
}

static void test_faults_open_create(void **s) {
  open_scene(fx_of(s), SCENE_CREATE);
}

static void test_faults_open_attach_keeps_keys(void **s) {
  open_scene(fx_of(s), SCENE_ATTACH);
  /* The first handle never noticed. */
  struct th_fx *fx = fx_of(s);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(fx->h, "stock", &info), 0);
  assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_CAP), 3);
  throttle_info_free(info);
}

static void test_faults_open_rebuild_half_built(void **s) {
  open_scene(fx_of(s), SCENE_REBUILD);
}

/* The init lock never comes free and the clock stands still: the open
 * still ends, by counting its naps, with THROTTLE_EINITTIMEOUT.  In a
 * child, so that a hang fails the test instead of stalling it. */
static int flock_stuck_child(void *arg) {
  const char *name = arg;
  throttle_config_t *cfg = open_cfg(name, false);
  TH_CHILD_CHECK(throttle_config_set_lock_timeout(cfg, 40) == 0);
  arm(THROTTLE__FAULT_FLOCK, 1, true);
  throttle__fault_errno(THROTTLE__FAULT_FLOCK, EWOULDBLOCK);
  throttle__fault_arm(THROTTLE__FAULT_CLOCK, 1);
  throttle__fault_persist(THROTTLE__FAULT_CLOCK, true);
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  unsigned long naps = throttle__fault_calls(THROTTLE__FAULT_FLOCK);
  throttle__fault_reset();
  TH_CHILD_CHECK(rc == THROTTLE_EINITTIMEOUT);
  TH_CHILD_CHECK(h == NULL);
  TH_CHILD_CHECK(th_contains(throttle_errmsg(NULL), "init lock"));
  TH_CHILD_CHECK(naps >= 20 && naps <= 22); /* 40 ms / 2 ms, plus one */
  TH_CHILD_CHECK(shm_unfinished(name));
  throttle_config_free(cfg);
  return 0;
}

static void test_faults_open_flock_stuck_clock_stuck(void **s) {
  struct th_fx *fx = fx_of(s);
  th_reap_ok(fx, th_spawn(fx, flock_stuck_child, fx->name), 10000);
}

/* ---- operations on an open segment ------------------------------------ */

struct ctx {
  throttle_t *h;
  unsigned long round; /* unique per call: fresh keys */
  char key[64];        /* the key the operation used */
  int left_held;       /* enter/leave: leave failed, the slot stays held */
  uint64_t nb_ns;      /* waits: not before this (throttle clock) */
};

/* Returns the first failure, or 0. */
typedef int (*op_fn)(struct ctx *c);

static int op_backoff(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "b%lu", c->round);
  return throttle_backoff(c->h, c->key, TH_LONG_MS);
}

static int op_remaining(struct ctx *c) {
  uint64_t ms = 0;
  int rc = throttle_remaining(c->h, "k", &ms);
  if (rc == 0)
    assert_true(ms > 0);
  return rc;
}

static int op_info(struct ctx *c) {
  throttle_info_t *info = (throttle_info_t *)&info; /* must become NULL */
  int rc = throttle_info(c->h, "k", &info);
  if (rc != 0) {
    assert_null(info);
    return rc;
  }
  assert_true(throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS) > 0);
  throttle_info_free(info);
  return 0;
}

static int count_key(const throttle_info_t *info, void *arg) {
  (void)info;
  (*(unsigned *)arg)++;
  return 0;
}

static int op_foreach(struct ctx *c) {
  unsigned n = 0;
  int rc = throttle_foreach(c->h, count_key, &n);
  if (rc == 0) {
    assert_int_equal(n, c->h->hdr->used);
  } else {
    assert_int_equal(n, 0);
  }
  return rc;
}

static int op_enter_leave(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "e%lu", c->round);
  throttle_ticket_t *t = (throttle_ticket_t *)&t; /* must become NULL */
  int rc = throttle_enter(c->h, c->key, THROTTLE_CLASS_LIVE, 1000, &t);
  if (rc != 0) {
    assert_null(t);
    return rc;
  }
  rc = throttle_leave(c->h, t, THROTTLE_OUTCOME_OK, 0);
  c->left_held = rc != 0;
  return rc;
}

static int op_try_enter_leave(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "t%lu", c->round);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 1;
  int rc = throttle_try_enter(c->h, c->key, THROTTLE_CLASS_BACKFILL, &t,
                              &wait_ms);
  if (rc != 0) {
    assert_null(t);
    return rc;
  }
  rc = throttle_leave(c->h, t, THROTTLE_OUTCOME_LOCKED, 50);
  c->left_held = rc != 0;
  return rc;
}

/* Publish a short back-off, then wait it out: never early (I1), whatever
 * fails on the way. */
static int op_wait(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "w%lu", c->round);
  c->nb_ns = th_now_ns() + SHORT_MS * NS_PER_MS;
  int rc = throttle_backoff(c->h, c->key, SHORT_MS);
  if (rc != 0)
    return rc;
  rc = throttle_wait(c->h, c->key, THROTTLE_FOREVER);
  if (rc == 0 && th_now_ns() < c->nb_ns)
    fail_msg("throttle_wait returned %llu ns early",
             (unsigned long long)(c->nb_ns - th_now_ns()));
  return rc;
}

static int op_enter_after_backoff(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "a%lu", c->round);
  c->nb_ns = th_now_ns() + SHORT_MS * NS_PER_MS;
  int rc = throttle_backoff(c->h, c->key, SHORT_MS);
  if (rc != 0)
    return rc;
  throttle_ticket_t *t = NULL;
  rc = throttle_enter(c->h, c->key, THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t);
  if (rc != 0) {
    assert_null(t);
    return rc;
  }
  uint64_t at = th_now_ns();
  rc = throttle_leave(c->h, t, THROTTLE_OUTCOME_OK, 0);
  c->left_held = rc != 0;
  if (at < c->nb_ns)
    fail_msg("admitted %llu ns early", (unsigned long long)(c->nb_ns - at));
  return rc;
}

static int op_clear(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "c%lu", c->round);
  int rc = throttle_backoff(c->h, c->key, TH_LONG_MS);
  if (rc == 0)
    rc = throttle_clear(c->h, c->key);
  if (rc == 0)
    assert_int_equal(th_remaining(c->h, c->key), 0);
  return rc;
}

static int op_settings(struct ctx *c) {
  snprintf(c->key, sizeof c->key, "s%lu", c->round);
  int rc = throttle_set_max_parallel(c->h, c->key, 2);
  if (rc == 0)
    rc = throttle_set_rate(c->h, c->key, 100, 1000);
  if (rc == 0)
    rc = throttle_set_backfill_share(c->h, c->key, 0.5);
  if (rc == 0)
    rc = throttle_pause(c->h, c->key);
  if (rc == 0)
    rc = throttle_resume(c->h, c->key);
  if (rc == 0)
    rc = throttle_cancel(c->h, c->key);
  return rc;
}

static int op_stats(struct ctx *c) {
  uint32_t cap = 0;
  int rc = throttle_stats(c->h, &cap, NULL, NULL, NULL);
  if (rc == 0)
    assert_int_equal(cap, OPS_KEYS);
  return rc;
}

/* Runs last: it opens every key, "k" included (the check republishes). */
static int op_reset(struct ctx *c) { return throttle_reset(c->h); }

static int op_config(struct ctx *c) {
  (void)c;
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL)
    return THROTTLE_ENOMEM;
  int rc = throttle_config_set_segment(cfg, "first");
  if (rc == 0) {
    rc = throttle_config_set_segment(cfg, "second");
    /* a failed set leaves the name it had */
    assert_string_equal(cfg->segment, rc == 0 ? "/second" : "/first");
  }
  if (rc == 0)
    rc = throttle_config_set_capacity(cfg, 8);
  throttle_config_free(cfg);
  return rc;
}

static const char *const codes3[] = {"RESOURCE_LOCKED", "TABLE_BUSY",
                                     "LOCKED"};

static int op_http_policy(struct ctx *c) {
  (void)c;
  throttle_curl_policy_t *p = (throttle_curl_policy_t *)&p;
  int rc = throttle_curl_policy_new(&p);
  if (rc != 0) {
    assert_null(p);
    return rc;
  }
  rc = throttle_curl_policy_set_locked_codes(p, codes3, 3);
  /* a failed set keeps the previous codes (the default one) */
  assert_int_equal(p->nlocked, rc == 0 ? 3 : 1);
  throttle_curl_policy_free(p);
  return rc;
}

/* jansson allocates through the hooks too (json_set_alloc_funcs below).
 * A parser that ran out of memory may report a syntax error instead
 * (throttle_curl.h), and jansson 2.14 may even drop bytes from a string it
 * could not grow (its lexer ignores that failure): the code then reads
 * "RESOURCE_LOCKE".  What must hold is that a 409 is called a lock only on
 * the whole code, and is never called permanent for a failed read; those
 * readings are counted and printed. */
static unsigned partial_codes;

static int op_http_classify(struct ctx *c) {
  static const char body[] =
      "{\"error\": {\"code\": \"RESOURCE_LOCKED\", \"message\": \"table "
      "'orders' is locked by another operation\", \"details\": [1, 2, 3]}}";
  throttle_outcome_t o = THROTTLE_OUTCOME_FAILED;
  char code[64];
  int rc = throttle_classify(NULL, 409, body, sizeof body - 1, &o, code,
                             sizeof code);
  assert_true(rc == 0 || rc == THROTTLE_ENOMEM);
  if (o == THROTTLE_OUTCOME_LOCKED) {
    assert_string_equal(code, "RESOURCE_LOCKED");
  } else {
    /* a lock the parser could not read for want of memory is transient,
     * never permanent */
    assert_int_equal(o, THROTTLE_OUTCOME_FAILED);
    if (code[0] != 0) {
      partial_codes++;
      print_message("http classify: round %lu read the code as \"%s\"\n",
                    c->round, code);
    }
  }
  return rc;
}

struct op {
  const char *name;
  op_fn fn;
};

static const struct op ops[] = {
    {"backoff", op_backoff},
    {"remaining", op_remaining},
    {"info", op_info},
    {"foreach", op_foreach},
    {"enter+leave", op_enter_leave},
    {"try_enter+leave", op_try_enter_leave},
    {"backoff+wait", op_wait},
    {"backoff+enter", op_enter_after_backoff},
    {"backoff+clear", op_clear},
    {"settings", op_settings},
    {"stats", op_stats},
    {"config", op_config},
    {"http policy", op_http_policy},
    {"http classify", op_http_classify},
    {"reset", op_reset},
};

static const int op_kinds[] = {THROTTLE__FAULT_ALLOC, THROTTLE__FAULT_LOCK,
                               THROTTLE__FAULT_CLOCK, THROTTLE__FAULT_FUTEX};

/* The code a fault of kind gives when an operation reports it; 0 when the
 * operation may absorb it (the clock falls back, a futex wait is re-checked,
 * the counters of a wait are best effort, a parser may call it a syntax
 * error). */
static int op_code(const struct op *op, int kind, bool *may_absorb) {
  *may_absorb = kind == THROTTLE__FAULT_CLOCK || kind == THROTTLE__FAULT_FUTEX;
  if (kind == THROTTLE__FAULT_LOCK && op->fn == op_wait)
    *may_absorb = true; /* counting the wait, after it ended */
  if (kind == THROTTLE__FAULT_ALLOC && op->fn == op_http_classify)
    *may_absorb = true;
  switch (kind) {
  case THROTTLE__FAULT_ALLOC:
    return THROTTLE_ENOMEM;
  case THROTTLE__FAULT_LOCK:
    return THROTTLE_ELOCKTIMEOUT;
  default:
    return 0;
  }
}

/* After every round: the failed operation changed nothing it should not,
 * and left no slot behind unless its leave failed (then the slot is held
 * until its lease lapses, as throttle_leave() documents). */
static void op_after(struct ctx *c, const struct op *op, int rc,
                     const char *what, unsigned long n) {
  throttle_t *h = c->h;
  if (op->fn == op_reset)
    assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
  if (th_remaining(h, "k") == 0)
    fail_msg("%s, N=%lu: key k lost its back-off", what, n);
  table_ok(h, what, n);
  if (c->key[0] == 0 || (op->fn != op_enter_leave && op->fn != op_try_enter_leave &&
                         op->fn != op_enter_after_backoff))
    return;
  throttle_info_t *info = NULL;
  int irc = throttle_info(h, c->key, &info);
  if (irc == THROTTLE_ENOKEY) {
    assert_int_not_equal(rc, 0); /* failed before the key was made */
    return;
  }
  assert_int_equal(irc, 0);
  int64_t held = throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT);
  int64_t waiting = throttle_info_get(info, THROTTLE_FIELD_WAITING_LIVE) +
                    throttle_info_get(info, THROTTLE_FIELD_WAITING_BACKFILL);
  throttle_info_free(info);
  if (waiting != 0 || held != (c->left_held ? 1 : 0))
    fail_msg("%s, N=%lu: %s has %lld holding and %lld waiting", what, n,
             c->key, (long long)held, (long long)waiting);
}

static void test_faults_operations(void **s) {
  struct th_fx *fx = fx_of(s);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, OPS_KEYS), 0);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 500), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
  json_set_alloc_funcs(throttle__malloc, throttle__free);
  struct ctx c = {.h = h};
  for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
    for (size_t k = 0; k < sizeof op_kinds / sizeof op_kinds[0]; k++) {
      const struct op *op = &ops[o];
      int kind = op_kinds[k];
      char what[96];
      snprintf(what, sizeof what, "%s %s", op->name,
               throttle__fault_name(kind));
      bool may_absorb;
      int want = op_code(op, kind, &may_absorb);
      unsigned long n, failed = 0;
      for (n = 1;; n++) {
        if (n > MAX_N)
          fail_msg("%s: still failing at N=%d", what, MAX_N);
        c.round++;
        c.key[0] = 0;
        c.left_held = 0;
        struct res before = res_now();
        arm(kind, n, false);
        int rc = op->fn(&c);
        unsigned long hits = disarm(kind);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", throttle_errmsg(h));
        if (hits == 0) {
          if (rc != 0)
            fail_msg("%s, N=%lu: no fault, yet %s: %s", what, n,
                     throttle_err_name(rc), msg);
          op_after(&c, op, rc, what, n);
          res_same(before, what, n);
          break;
        }
        if (rc != 0)
          failed++;
        if (!(rc == want || (rc == 0 && may_absorb)))
          fail_msg("%s, N=%lu: %s (%s), expected %s", what, n,
                   throttle_err_name(rc), msg, throttle_err_name(want));
        if (rc == THROTTLE_ELOCKTIMEOUT && !th_contains(msg, "mutex"))
          fail_msg("%s, N=%lu: message \"%s\"", what, n, msg);
        op_after(&c, op, rc, what, n);
        res_same(before, what, n);
      }
      print_message("%-28s %lu fault%s, %lu reported, ok at N=%lu\n", what,
                    n - 1, n == 2 ? "" : "s", failed, n);
    }
  json_set_alloc_funcs(malloc, free);
}

/* Every futex wait returns at once and every wake is lost: waiters spin on
 * their re-checks, but nobody gets in early (I1) and nobody hangs. */
static void test_faults_futex_spurious_never_early(void **s) {
  struct th_fx *fx = fx_of(s);
  throttle_t *h = th_open(fx);
  struct ctx c = {.h = h, .round = 1000};
  arm(THROTTLE__FAULT_FUTEX, 1, true);
  assert_int_equal(op_wait(&c), 0);
  assert_int_equal(op_enter_after_backoff(&c), 0);
  unsigned long spins = throttle__fault_calls(THROTTLE__FAULT_FUTEX);
  throttle__fault_reset();
  assert_true(spins > 0);
}

/* The segment mutex is held elsewhere and the clock fails just when the
 * locker computes its deadline: THROTTLE_ELOCKTIMEOUT at once, not a wait
 * on an uninitialised deadline. */
struct holder {
  throttle_t *h;
  int go[2], done[2];
};

static void *hold_mutex(void *arg) {
  struct holder *x = arg;
  char b = 0;
  pthread_mutex_lock(&x->h->hdr->mutex);
  assert_int_equal(write(x->go[1], &b, 1), 1);
  assert_int_equal(read(x->done[0], &b, 1), 1);
  pthread_mutex_unlock(&x->h->hdr->mutex);
  return NULL;
}

static void test_faults_lock_deadline_without_clock(void **s) {
  struct th_fx *fx = fx_of(s);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 60000), 0);
  throttle_t *h = th_open(fx);
  struct holder x = {.h = h};
  assert_int_equal(pipe(x.go), 0);
  assert_int_equal(pipe(x.done), 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, hold_mutex, &x), 0);
  char b;
  assert_int_equal(read(x.go[0], &b, 1), 1);
  uint64_t t0 = th_mono_ms();
  arm(THROTTLE__FAULT_CLOCK, 1, false);
  int rc = throttle_backoff(h, "x", 1000);
  unsigned long hits = disarm(THROTTLE__FAULT_CLOCK);
  uint64_t took = th_mono_ms() - t0;
  assert_int_equal(write(x.done[1], &b, 1), 1);
  pthread_join(t, NULL);
  for (int i = 0; i < 2; i++) {
    close(x.go[i]);
    close(x.done[i]);
  }
  assert_int_equal(hits, 1);
  assert_int_equal(rc, THROTTLE_ELOCKTIMEOUT);
  assert_true(took < 30000); /* far below the 60 s lock timeout */
  /* and once the mutex is free, all is well */
  assert_int_equal(throttle_backoff(h, "x", 1000), 0);
  table_ok(h, "after", 0);
}

/* The clock's last resort: a failing clock reads as the latest reading,
 * never as garbage and never as 0 once one reading succeeded. */
static void test_faults_clock_falls_back_to_last_reading(void **s) {
  (void)s;
  (void)throttle__mono_ns(); /* a reading of each clock to fall back to */
  uint64_t before = throttle__now_ns();
  arm(THROTTLE__FAULT_CLOCK, 1, true);
  uint64_t stuck = throttle__now_ns();
  uint64_t mono = throttle__mono_ns();
  unsigned long calls = throttle__fault_calls(THROTTLE__FAULT_CLOCK);
  throttle__fault_reset();
  uint64_t after = throttle__now_ns();
  assert_int_equal(calls, 3); /* BOOTTIME, MONOTONIC, MONOTONIC */
  assert_true(stuck != 0 && mono != 0);
  assert_true(stuck <= before && before - stuck <= NS_PER_MS);
  assert_true(after >= before);
  /* one failing BOOTTIME reading falls back to MONOTONIC */
  arm(THROTTLE__FAULT_CLOCK, 1, false);
  uint64_t mono_reading = throttle__now_ns();
  throttle__fault_reset();
  assert_true(mono_reading != 0 && mono_reading <= th_now_ns());
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_faults_open_create),
      T(test_faults_open_attach_keeps_keys),
      T(test_faults_open_rebuild_half_built),
      T(test_faults_open_flock_stuck_clock_stuck),
      T(test_faults_operations),
      T(test_faults_futex_spurious_never_early),
      T(test_faults_lock_deadline_without_clock),
      T(test_faults_clock_falls_back_to_last_reading),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
