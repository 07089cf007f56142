/* SPDX-License-Identifier: MIT */
/*
 * test_multiproc.c — real processes sharing one segment: visibility across
 * fork and exec, crashes at every named point (I6), racing creators, and
 * the lock timeout when a live process sits on the mutex.
 *
 * Children are forked (and once exec'ed), never mocked; each one is
 * registered with the fixture, so a failing test still kills and reaps
 * them.  Crash points are armed in the child only (THROTTLE_CRASH_AT, read
 * by the test build of the library) and kill it with SIGKILL.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_GUARD_MS 10000
#define NRACERS 8

static struct th_fx *fx_of(void **state) { return *state; }

static char self_exe[4096];

static int has_key(throttle_t *h, const char *key) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, key, &info);
  if (rc != 0 && rc != THROTTLE_ENOKEY)
    fail_msg("throttle_info(%s): %s: %s", key, throttle_err_name(rc),
             throttle_errmsg(h));
  throttle_info_free(info);
  return rc == 0;
}

static uint64_t repairs(throttle_t *h) {
  uint64_t n = UINT64_MAX;
  assert_int_equal(throttle_stats(h, NULL, NULL, NULL, &n), 0);
  return n;
}

/* ---- visibility --------------------------------------------------------- */

struct vis_arg {
  struct th_fx *fx;
  uint64_t t_pub; /* before the parent published "orders" for 30 s */
};

static int child_sees_and_publishes(void *p) {
  struct vis_arg *a = p;
  throttle_close(a->fx->h); /* the inherited handle: not the one under test */
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_is_shared(h));
  uint64_t ms = 0;
  TH_CHILD_CHECK(throttle_remaining(h, "orders", &ms) == 0);
  uint64_t now = th_now_ns();
  TH_CHILD_CHECK(ms <= 30000);
  TH_CHILD_CHECK(ms * NS_PER_MS + (now - a->t_pub) >= 30000 * NS_PER_MS);
  TH_CHILD_CHECK(throttle_backoff(h, "from-child", 30000) == 0);
  throttle_close(h);
  return 0;
}

static void test_multiproc_publish_seen_by_forked_child(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct vis_arg a = {fx, th_now_ns()};
  assert_int_equal(throttle_backoff(h, "orders", 30000), 0);
  pid_t pid = th_spawn(fx, child_sees_and_publishes, &a);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_true(th_remaining(h, "from-child") > 0);
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(h, "from-child", &info), 0);
  assert_int_equal(throttle_info_get(info, THROTTLE_FIELD_LAST_PUBLISHER_PID),
                   pid);
  throttle_info_free(info);
}

static int child_execs(void *p) {
  struct th_fx *fx = p;
  execl(self_exe, self_exe, "--exec-child", fx->name, (char *)NULL);
  th_child_fail(__FILE__, __LINE__, "execl");
  return 1;
}

/* The exec'ed side: a process with nothing inherited but the name. */
static int exec_child_main(const char *name) {
  throttle_config_t *c = throttle_config_new();
  throttle_t *h = NULL;
  TH_CHILD_CHECK(c != NULL && throttle_config_set_segment(c, name) == 0);
  TH_CHILD_CHECK(throttle_config_set_flags(c, THROTTLE_NO_CREATE |
                                                  THROTTLE_NO_FALLBACK) == 0);
  TH_CHILD_CHECK(throttle_open(c, &h) == 0);
  uint64_t ms = 0;
  TH_CHILD_CHECK(throttle_remaining(h, "orders", &ms) == 0);
  TH_CHILD_CHECK(ms > 0 && ms <= 30000);
  TH_CHILD_CHECK(throttle_backoff(h, "from-exec", 30000) == 0);
  throttle_close(h);
  throttle_config_free(c);
  return 0;
}

static void test_multiproc_publish_seen_after_exec(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "orders", 30000), 0);
  pid_t pid = th_spawn(fx, child_execs, fx);
  th_reap_ok(fx, pid, HANG_GUARD_MS);
  assert_true(th_remaining(h, "from-exec") > 0);
}

struct waiter_arg {
  struct th_fx *fx;
  uint64_t t_pub;
  int fd; /* read end: the parent's time just before its clear */
};

static int child_waits_for_backoff(void *p) {
  struct waiter_arg *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_wait(h, "k", THROTTLE_FOREVER) == 0);
  TH_CHILD_CHECK(th_now_ns() - a->t_pub >= 300 * NS_PER_MS);
  throttle_close(h);
  return 0;
}

/* I1 across processes: another process's wait ends no earlier. */
static void test_multiproc_wait_honours_other_process_backoff(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  struct waiter_arg a = {fx, th_now_ns(), -1};
  assert_int_equal(throttle_backoff(h, "k", 300), 0);
  pid_t pid[3];
  for (int i = 0; i < 3; i++)
    pid[i] = th_spawn(fx, child_waits_for_backoff, &a);
  for (int i = 0; i < 3; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS);
}

static int child_waits_for_clear(void *p) {
  struct waiter_arg *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  TH_CHILD_CHECK(throttle_wait(h, "k", THROTTLE_FOREVER) == 0);
  uint64_t t_ret = th_now_ns(), t_clear = 0;
  TH_CHILD_CHECK(th_recv_u64(a->fd, &t_clear) == 0);
  TH_CHILD_CHECK(t_ret >= t_clear);
  throttle_close(h);
  return 0;
}

static void test_multiproc_clear_wakes_every_waiting_process(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct waiter_arg a = {fx, 0, fds[0]};
  pid_t pid[4];
  for (int i = 0; i < 4; i++)
    pid[i] = th_spawn(fx, child_waits_for_clear, &a);
  close(fds[0]);
  for (int i = 0; i < 4; i++)
    th_wait_sleeping(pid[i], 5000);
  uint64_t m0 = th_mono_ms();
  uint64_t t_clear = th_now_ns();
  for (int i = 0; i < 4; i++)
    th_send_u64(fds[1], t_clear);
  assert_int_equal(throttle_clear(h, "k"), 0);
  for (int i = 0; i < 4; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS);
  close(fds[1]);
  assert_true(th_mono_ms() - m0 < HANG_GUARD_MS); /* not the 30 s */
}

/* ---- crashes holding the mutex ------------------------------------------ */

struct crash_arg {
  struct th_fx *fx;
  const char *point;
  const char *key;
};

static int child_crashes(void *p) {
  struct crash_arg *a = p;
  throttle_close(a->fx->h);
  TH_CHILD_CHECK(setenv("THROTTLE_CRASH_AT", a->point, 1) == 0);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  throttle_backoff(h, a->key, 1000); /* dies in here */
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

static void crash_child(struct th_fx *fx, const char *point, const char *key) {
  struct crash_arg a = {fx, point, key};
  pid_t pid = th_spawn(fx, child_crashes, &a);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
}

/* Three keys with long back-offs, published before the crash. */
static uint64_t publish_abc(throttle_t *h) {
  uint64_t t0 = th_now_ns();
  assert_int_equal(throttle_backoff(h, "a", 20000), 0);
  assert_int_equal(throttle_backoff(h, "b", 30000), 0);
  assert_int_equal(throttle_backoff(h, "c", 40000), 0);
  return t0;
}

static void expect_abc_intact(throttle_t *h, uint64_t t0) {
  const char *keys[] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++) {
    uint64_t ms = th_remaining(h, keys[i]);
    uint64_t now = th_now_ns();
    uint64_t want = (uint64_t)(20000 + 10000 * i);
    assert_true(ms <= want);
    assert_true(ms * NS_PER_MS + (now - t0) >= want * NS_PER_MS);
    assert_true(has_key(h, keys[i]));
  }
}

static void test_multiproc_crash_holding_mutex_repaired(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  uint64_t t0 = publish_abc(h);
  crash_child(fx, "after-lock", "x");
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  assert_true(th_mono_ms() - m0 < HANG_GUARD_MS);
  assert_int_equal(repairs(h), 1);
  expect_abc_intact(h, t0);
  assert_false(has_key(h, "x")); /* it died before inserting */
  assert_true(th_remaining(h, "d") > 0);
  uint32_t used = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, NULL, NULL), 0);
  assert_int_equal(used, 4);
  /* repaired once, not on every call */
  assert_int_equal(throttle_backoff(h, "e", 10000), 0);
  assert_int_equal(repairs(h), 1);
}

static void test_multiproc_crash_mid_update_repaired(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  uint64_t t0 = publish_abc(h);
  crash_child(fx, "mid-update", "x");
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  assert_int_equal(repairs(h), 1);
  expect_abc_intact(h, t0);
  /* the half-made key is either whole or gone, and never a hazard */
  uint64_t ms = th_remaining(h, "x");
  assert_true(ms <= 1000);
  assert_int_equal(throttle_backoff(h, "x", 10000), 0);
  assert_true(th_remaining(h, "x") > 1000);
  assert_int_equal(throttle_clear(h, "x"), 0);
}

static void test_multiproc_crash_mid_repair_recovers(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  uint64_t t0 = publish_abc(h);
  crash_child(fx, "after-lock", "x");
  crash_child(fx, "mid-repair", "y"); /* dies repairing the first one */
  crash_child(fx, "mid-repair", "z"); /* and again */
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  uint64_t n = repairs(h);
  assert_true(n >= 1 && n <= 3);
  expect_abc_intact(h, t0);
  assert_false(has_key(h, "y"));
  assert_false(has_key(h, "z"));
  assert_int_equal(throttle_backoff(h, "e", 10000), 0);
  assert_int_equal(repairs(h), n);
}

/* ---- the lock timeout --------------------------------------------------- */

static void test_multiproc_lock_timeout_then_owner_killed(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 200), 0);
  throttle_t *h = th_open(fx);
  uint64_t t0 = publish_abc(h);
  pid_t pid = th_spawn(fx, th_child_sits_on_mutex, fx);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);

  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_backoff(h, "d", 1000), THROTTLE_ELOCKTIMEOUT);
  uint64_t took = th_mono_ms() - m0;
  assert_true(took >= 199); /* it did wait out its timeout */
  assert_true(took < HANG_GUARD_MS);
  assert_true(th_contains(throttle_errmsg(h), fx->name));
  uint32_t cap;
  assert_int_equal(throttle_stats(h, &cap, NULL, NULL, NULL),
                   THROTTLE_ELOCKTIMEOUT);
  /* readers of published back-offs need no mutex */
  assert_true(th_remaining(h, "a") > 0);
  assert_int_equal(th_remaining(h, "never-seen"), 0);

  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  assert_int_equal(throttle_backoff(h, "d", 1000), 0);
  assert_int_equal(repairs(h), 1);
  expect_abc_intact(h, t0);
}

/* ---- creation races and half-made segments ------------------------------ */

struct race_arg {
  struct th_fx *fx;
  struct th_gate start, published;
  int done_fd;
  int i;
};

static int child_races(void *p) {
  struct race_arg *a = p;
  close(a->published.fd[1]);
  a->published.fd[1] = -1;
  th_gate_wait(&a->start);
  throttle_t *h = NULL;
  int rc = throttle_open(a->fx->cfg, &h);
  if (rc != 0)
    fprintf(stderr, "racer %d: %s: %s\n", a->i, throttle_err_name(rc),
            throttle_errmsg(h));
  TH_CHILD_CHECK(rc == 0 && throttle_is_shared(h));
  char key[32];
  snprintf(key, sizeof key, "racer-%d", a->i);
  TH_CHILD_CHECK(throttle_backoff(h, key, TH_LONG_MS) == 0);
  char c = 1;
  TH_CHILD_CHECK(write(a->done_fd, &c, 1) == 1);
  th_gate_wait(&a->published);
  for (int j = 0; j < NRACERS; j++) {
    uint64_t ms = 0;
    snprintf(key, sizeof key, "racer-%d", j);
    TH_CHILD_CHECK(throttle_remaining(h, key, &ms) == 0 && ms > 0);
  }
  throttle_close(h);
  return 0;
}

static void test_multiproc_racing_creators_see_one_segment(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_capacity(fx->cfg, 64), 0);
  struct race_arg a[NRACERS];
  struct th_gate start, published;
  th_gate_init(&start);
  th_gate_init(&published);
  int done[2];
  assert_int_equal(pipe(done), 0);
  pid_t pid[NRACERS];
  for (int i = 0; i < NRACERS; i++) {
    a[i] = (struct race_arg){fx, start, published, done[1], i};
    pid[i] = th_spawn(fx, child_races, &a[i]);
  }
  close(done[1]);
  th_gate_open(&start);
  /* every racer has published (or, on failure, the hang guard ran out:
   * the racers still hold the pipe open, so EOF cannot tell) */
  int n = 0;
  uint64_t deadline = th_mono_ms() + HANG_GUARD_MS;
  while (n < NRACERS && th_mono_ms() < deadline) {
    struct pollfd pfd = {done[0], POLLIN, 0};
    char c;
    if (poll(&pfd, 1, 100) == 1 && read(done[0], &c, 1) == 1)
      n++;
  }
  close(done[0]);
  th_gate_open(&published);
  for (int i = 0; i < NRACERS; i++)
    th_reap_ok(fx, pid[i], HANG_GUARD_MS);
  th_gate_close(&start);
  th_gate_close(&published);
  assert_int_equal(n, NRACERS);

  throttle_t *h = th_open(fx);
  uint32_t cap = 0, used = 0;
  assert_int_equal(throttle_stats(h, &cap, &used, NULL, NULL), 0);
  assert_int_equal(cap, 64);
  assert_int_equal(used, NRACERS);
}

static int child_dies_creating(void *p) {
  struct crash_arg *a = p;
  TH_CHILD_CHECK(setenv("THROTTLE_CRASH_AT", a->point, 1) == 0);
  throttle_t *h = NULL;
  throttle_open(a->fx->cfg, &h); /* dies in here */
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

static void creator_killed(struct th_fx *fx, const char *point) {
  struct crash_arg a = {fx, point, NULL};
  pid_t pid = th_spawn(fx, child_dies_creating, &a);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  /* what it left: an object with no magic */
  char path[256];
  struct stat st;
  th_shm_path(fx->name, path, sizeof path);
  assert_int_equal(stat(path, &st), 0);
  if (st.st_size >= (off_t)sizeof(struct throttle__hdr)) {
    size_t size;
    struct throttle__hdr *hdr = th_map(fx->name, &size);
    assert_true(atomic_load(&hdr->magic) == 0);
    th_unmap(hdr, size);
  } else {
    assert_int_equal(st.st_size, 0);
  }
  uint64_t m0 = th_mono_ms();
  throttle_t *h = th_open(fx);
  assert_true(th_mono_ms() - m0 < 1000);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
  throttle_t *b = NULL;
  assert_int_equal(th_open_rc(fx, &b), 0);
  assert_true(th_remaining(b, "k") > 0);
  throttle_close(b);
}

static void test_multiproc_creator_killed_before_magic(void **state) {
  creator_killed(fx_of(state), "init-before-magic");
}

static void test_multiproc_creator_killed_before_truncate(void **state) {
  creator_killed(fx_of(state), "init-before-truncate");
}

struct stuck_arg {
  struct th_fx *fx;
};

/* Holds the segment's init lock and stops: a creator that hangs. */
static int child_holds_init_lock(void *p) {
  struct stuck_arg *a = p;
  int fd = shm_open(a->fx->name, O_RDWR | O_CREAT, 0600);
  TH_CHILD_CHECK(fd >= 0);
  TH_CHILD_CHECK(flock(fd, LOCK_EX) == 0);
  raise(SIGSTOP);
  return 0;
}

/* ---- liveness across PID namespaces and hidden /proc ------------------- */

#define NS_KEY "ns"
#define SKIP_STATUS 77

struct ns_arg {
  struct th_fx *fx;
  int fd; /* to the parent: 1 = holding, 0 = cannot (skip) */
};

static int enter_and_hold(struct th_fx *fx, int fd) {
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  throttle_ticket_t *t;
  TH_CHILD_CHECK(throttle_enter(h, NS_KEY, THROTTLE_CLASS_LIVE, 5000, &t) ==
                 0);
  th_send_u64(fd, 1);
  for (;;)
    pause();
}

/* As `unshare --pid --fork --mount-proc`: a new PID namespace whose first
 * process (pid 1 there) mounts its own /proc, then holds the only slot. */
static int ns_holder(void *arg) {
  struct ns_arg *a = arg;
  if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) {
    fprintf(stderr, "unshare(CLONE_NEWPID|CLONE_NEWNS): %s\n",
            strerror(errno));
    th_send_u64(a->fd, 0);
    return 0;
  }
  pid_t g = fork();
  if (g == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) != 0) {
      fprintf(stderr, "mount /proc: %s\n", strerror(errno));
      th_send_u64(a->fd, 0);
      _exit(0);
    }
    _exit(enter_and_hold(a->fx, a->fd));
  }
  if (g < 0)
    return 1;
  while (waitpid(g, NULL, 0) < 0 && errno == EINTR)
    ;
  return 0;
}

static int plain_holder(void *arg) {
  struct ns_arg *a = arg;
  return enter_and_hold(a->fx, a->fd);
}

/* Callers that keep asking while a holder they cannot judge holds the
 * only slot: never admitted, nothing reclaimed. */
static int keep_asking(throttle_t *h) {
  for (int i = 0; i < 8; i++) {
    throttle_ticket_t *t = NULL;
    int rc = throttle_try_enter(h, NS_KEY, THROTTLE_CLASS_LIVE, &t, NULL);
    if (rc == 0)
      throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
    if (rc != THROTTLE_EWOULDBLOCK)
      return 1;
    th_sleep_ms(60); /* past the reap interval */
  }
  return 0;
}

static pid_t start_holder(struct th_fx *fx, int (*fn)(void *), int *ok) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  static struct ns_arg a;
  a = (struct ns_arg){fx, p[1]};
  pid_t pid = th_spawn(fx, fn, &a);
  close(p[1]);
  uint64_t v = 0;
  *ok = th_recv_u64(p[0], &v) == 0 && v == 1;
  close(p[0]);
  return pid;
}

static int64_t ns_field(throttle_t *h, throttle_field_t f) {
  return th_field(h, NS_KEY, f);
}

/* A holder in another PID namespace (two containers sharing /dev/shm):
 * its pid means another process here, so it cannot be judged, and it
 * keeps its slot (until its lease lapses). */
static void test_multiproc_other_pid_namespace_holder_kept(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(h, NS_KEY, 1), 0);
  int ok;
  start_holder(fx, ns_holder, &ok);
  if (!ok) {
    print_message("skipped: no new PID namespace here (see the message "
                  "above; needs root or user namespaces)\n");
    skip();
  }
  throttle_info_t *info;
  assert_int_equal(throttle_info(h, NS_KEY, &info), 0);
  int64_t pid = 0;
  assert_int_equal(throttle_info_holder(info, 0, &pid, NULL, NULL, NULL), 0);
  throttle_info_free(info);
  assert_int_equal(pid, 1); /* its own namespace's init */
  assert_int_equal(keep_asking(h), 0);
  assert_int_equal(ns_field(h, THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(ns_field(h, THROTTLE_FIELD_IN_FLIGHT), 1);
}

/* A reader that cannot see the holder in /proc (a /proc of its own, as
 * with hidepid or an unmounted /proc) must not take it for dead. */
static int hidden_proc_reader(void *arg) {
  struct th_fx *fx = arg;
  if (unshare(CLONE_NEWNS) != 0 ||
      mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("none", "/proc", "tmpfs", 0, NULL) != 0) {
    fprintf(stderr, "hiding /proc: %s\n", strerror(errno));
    return SKIP_STATUS;
  }
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(keep_asking(h) == 0);
  throttle_close(h);
  return 0;
}

static void test_multiproc_hidden_proc_holder_kept(void **state) {
  struct th_fx *fx = fx_of(state);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(h, NS_KEY, 1), 0);
  int ok;
  start_holder(fx, plain_holder, &ok);
  assert_true(ok);
  int st = th_reap(fx, th_spawn(fx, hidden_proc_reader, fx), HANG_GUARD_MS);
  if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP_STATUS) {
    print_message("skipped: cannot mount over /proc here\n");
    skip();
  }
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(ns_field(h, THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(ns_field(h, THROTTLE_FIELD_IN_FLIGHT), 1);
}

/* The mutex out of reach: throttle_enter() fails open, but only after the
 * not-before it can read without the mutex; try_enter says how long. */
static void test_multiproc_fail_open_honours_not_before(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 100), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 1500), 0);
  uint64_t nb = th_now_ns() + 1400 * NS_PER_MS;
  pid_t pid = th_spawn(fx, th_child_sits_on_mutex, fx);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  assert_int_equal(throttle_try_enter(h, "k", THROTTLE_CLASS_LIVE, &t,
                                      &wait_ms),
                   THROTTLE_EWOULDBLOCK);
  assert_true(wait_ms > 0 && wait_ms <= 1500);
  assert_int_equal(throttle_enter(h, "k", THROTTLE_CLASS_LIVE, 200, &t),
                   THROTTLE_ETIMEDOUT); /* the back-off is past the timeout */
  assert_int_equal(throttle_enter(h, "k", THROTTLE_CLASS_LIVE, 10000, &t),
                   THROTTLE_ELOCKTIMEOUT);
  assert_null(t);
  assert_true(th_now_ns() >= nb); /* failed open, but not early */
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
}

/* ---- fork and jitter ------------------------------------------------- */

static int draw_jitter(void *arg) {
  int fd = *(int *)arg;
  th_send_u64(fd, throttle__random());
  return 0;
}

/* Forked waiters must not share one jitter sequence: each child's first
 * draw differs from its siblings' and from the parent's next one. */
static void test_multiproc_fork_reseeds_jitter(void **state) {
  struct th_fx *fx = fx_of(state);
  (void)throttle__random(); /* the parent's state is seeded */
  enum { N = 4 };
  uint64_t v[N + 1];
  for (int i = 0; i < N; i++) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = th_spawn(fx, draw_jitter, &p[1]);
    close(p[1]);
    assert_int_equal(th_recv_u64(p[0], &v[i]), 0);
    close(p[0]);
    th_reap_ok(fx, pid, HANG_GUARD_MS);
  }
  v[N] = throttle__random();
  for (int i = 0; i <= N; i++)
    for (int j = 0; j < i; j++)
      assert_true(v[i] != v[j]);
}

static void test_multiproc_stuck_creator_times_out_then_recovers(void **state) {
  struct th_fx *fx = fx_of(state);
  assert_int_equal(throttle_config_set_lock_timeout(fx->cfg, 200), 0);
  struct stuck_arg a = {fx};
  pid_t pid = th_spawn(fx, child_holds_init_lock, &a);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);
  uint64_t m0 = th_mono_ms();
  throttle_t *h = NULL;
  assert_int_equal(th_open_rc(fx, &h), THROTTLE_EINITTIMEOUT);
  uint64_t took = th_mono_ms() - m0;
  assert_true(took >= 199);
  assert_true(took < HANG_GUARD_MS);
  /* fail open: the private handle works */
  assert_non_null(h);
  assert_int_equal(throttle_is_shared(h), 0);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
  assert_true(th_remaining(h, "k") > 0);
  throttle_close(h);
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  h = th_open(fx);
  assert_int_equal(throttle_backoff(h, "k", 30000), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--exec-child") == 0)
    return exec_child_main(argv[2]);
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0) {
    perror("readlink /proc/self/exe");
    return 1;
  }
  self_exe[n] = 0;
  const struct CMUnitTest tests[] = {
      T(test_multiproc_publish_seen_by_forked_child),
      T(test_multiproc_publish_seen_after_exec),
      T(test_multiproc_wait_honours_other_process_backoff),
      T(test_multiproc_clear_wakes_every_waiting_process),
      T(test_multiproc_crash_holding_mutex_repaired),
      T(test_multiproc_crash_mid_update_repaired),
      T(test_multiproc_crash_mid_repair_recovers),
      T(test_multiproc_lock_timeout_then_owner_killed),
      T(test_multiproc_racing_creators_see_one_segment),
      T(test_multiproc_creator_killed_before_magic),
      T(test_multiproc_creator_killed_before_truncate),
      T(test_multiproc_stuck_creator_times_out_then_recovers),
      T(test_multiproc_fork_reseeds_jitter),
      T(test_multiproc_fail_open_honours_not_before),
      T(test_multiproc_other_pid_namespace_holder_kept),
      T(test_multiproc_hidden_proc_holder_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
