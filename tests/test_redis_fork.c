/* SPDX-License-Identifier: MIT */
/*
 * test_redis_fork.c — fork() of a process that uses the Redis backend, each
 * case against a real redis-server the test starts (redis_helpers.h): the
 * parent has made an admission (its heartbeat thread runs, asleep on the
 * handle's condition variable, and its pool holds a connection) and then
 * forks, as a multiprocessing pool or a pre-fork server does.
 *
 * Covered: a child admits on the inherited handle, holds past the liveness
 * bound while another host is refused, leaves and closes; a child that
 * makes no call exits at once, closing or not; the parent's admission
 * stays the parent's (kept alive by the parent, not by a child, and a
 * child's leave of it follows the segment's rule); a program a child
 * execs holds none of the parent's connections.  A "host" is a handle
 * on its own segment name.  Skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#define HANG_GUARD_MS 30000
#define LIVENESS_MS 1000 /* the heartbeat beats every 250 ms */
/* A child that has nothing to do ends well within this (a close that
 * waits for a thread of the parent waits forever). */
#define AT_ONCE_MS 3000

static struct th_redis R;

static int setup(void **state) {
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  return th_redis_setup(state, &R);
}
static int teardown(void **state) { return th_redis_teardown(state, &R); }

/* A second host: its own segment, the same Redis. */
#define other_host(fx) th_redis_other_host(fx, R.url)

/* The parent's state at every fork below: an admission of its own on
 * "p", its heartbeat asleep, a connection in its pool. */
static throttle_t *parent_holding(struct th_fx *fx, throttle_ticket_t **t) {
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_enter(a, "p", THROTTLE_CLASS_LIVE, 5000, t), 0);
  th_sleep_ms(50); /* the heartbeat thread is asleep on its wait */
  return a;
}

/* The end of a child that used the handle: what the parent's heartbeat
 * thread held (its connection) has no owner in the child, and a leak
 * checker would report it at exit, so the child ends by exec, which it
 * does not check. */
static int end_by_exec(void) {
  execl("/bin/true", "true", (char *)NULL);
  return 1;
}

struct kid {
  throttle_t *h;
  throttle_ticket_t *t; /* the parent's admission, inherited */
  int up;               /* child -> parent */
  int go;               /* parent -> child */
};

static int admit_hold_leave_close(void *arg) {
  struct kid *k = arg;
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(k->h, "f", THROTTLE_CLASS_LIVE, 5000, &t) ==
                 0);
  th_send_u64(k->up, 1);
  uint64_t v;
  TH_CHILD_CHECK(th_recv_u64(k->go, &v) == 0); /* the parent has looked */
  TH_CHILD_CHECK(throttle_leave(k->h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  uint64_t t0 = th_mono_ms();
  throttle_close(k->h);
  th_send_u64(k->up, th_mono_ms() - t0);
  return end_by_exec();
}

/* th_recv_u64 within ms (a child that hangs must fail the test, not hang
 * it): 0, or -1 on timeout or end of file. */
static int recv_within(int fd, uint64_t *v, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1)
    return -1;
  return th_recv_u64(fd, v);
}

static void pipes(struct kid *k, int up[2], int go[2]) {
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(go), 0);
  k->up = up[1];
  k->go = go[0];
}

static void close_pipes(int up[2], int go[2]) {
  close(up[0]);
  close(up[1]);
  close(go[0]);
  close(go[1]);
}

/* A child admits on the handle it inherited: its admission is kept alive
 * past the liveness bound (by a heartbeat of the child's own), so another
 * host is refused beside it; it leaves, closes (at once) and exits. */
static void test_redis_fork_child_admits_holds_leaves_closes(void **state) {
  struct th_fx *fx = *state;
  throttle_ticket_t *pt = NULL;
  throttle_t *a = parent_holding(fx, &pt);
  assert_int_equal(throttle_set_max_parallel(a, "f", 1), 0);
  throttle_t *b = other_host(fx);
  int up[2], go[2];
  struct kid k = {a, pt, 0, 0};
  pipes(&k, up, go);
  pid_t kid = th_spawn(fx, admit_hold_leave_close, &k);
  uint64_t v;
  assert_int_equal(recv_within(up[0], &v, HANG_GUARD_MS), 0); /* admitted */
  th_sleep_ms(3 * LIVENESS_MS);
  throttle_ticket_t *bt = NULL;
  assert_int_equal(throttle_try_enter(b, "f", THROTTLE_CLASS_LIVE, &bt, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(th_field(b, "f", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(th_field(b, "f", THROTTLE_FIELD_RECLAIMS), 0);
  th_send_u64(go[1], 1);
  assert_int_equal(recv_within(up[0], &v, AT_ONCE_MS), 0);
  printf("the child's close took %llu ms\n", (unsigned long long)v);
  assert_true(v < AT_ONCE_MS);
  th_reap_ok(fx, kid, AT_ONCE_MS);
  /* its leave freed the slot; the parent's own admission is untouched */
  assert_int_equal(throttle_try_enter(b, "f", THROTTLE_CLASS_LIVE, &bt, NULL),
                   0);
  assert_int_equal(throttle_leave(b, bt, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(b, "p", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(th_field(b, "p", THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(throttle_leave(a, pt, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
  close_pipes(up, go);
}

static int close_at_once(void *arg) {
  throttle_close(((struct kid *)arg)->h);
  return 0;
}

static int exit_at_once(void *arg) {
  (void)arg;
  exit(0); /* atexit handlers and destructors run */
}

/* A child that makes no call on the inherited handle ends at once, whether
 * it closes its copy or not; the parent's admission and heartbeat go on. */
static void test_redis_fork_child_without_calls_exits_at_once(void **state) {
  struct th_fx *fx = *state;
  throttle_ticket_t *pt = NULL;
  throttle_t *a = parent_holding(fx, &pt);
  struct kid k = {a, pt, -1, -1};
  int (*fn[])(void *) = {close_at_once, exit_at_once};
  for (size_t i = 0; i < sizeof fn / sizeof fn[0]; i++) {
    uint64_t t0 = th_mono_ms();
    th_reap_ok(fx, th_spawn(fx, fn[i], &k), AT_ONCE_MS);
    printf("child %zu ended after %llu ms\n", i,
           (unsigned long long)(th_mono_ms() - t0));
  }
  th_sleep_ms(3 * LIVENESS_MS);
  throttle_t *b = other_host(fx);
  assert_int_equal(th_field(b, "p", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(th_field(b, "p", THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(throttle_leave(a, pt, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

static int own_admission_then_exit(void *arg) {
  struct kid *k = arg;
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(k->h, "g", THROTTLE_CLASS_LIVE, 5000, &t) ==
                 0);
  th_sleep_ms(LIVENESS_MS / 2); /* the child's heartbeat runs a round */
  TH_CHILD_CHECK(throttle_leave(k->h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(k->h);
  return end_by_exec();
}

static int leave_inherited(void *arg) {
  struct kid *k = arg;
  TH_CHILD_CHECK(throttle_leave(k->h, k->t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(k->h);
  return end_by_exec();
}

/* The parent's admission stays the parent's: a child that used the handle
 * and exited takes nothing of it along (the parent keeps it alive, so
 * another host is still refused after the liveness bound); a child that
 * leaves it releases the slot, and the parent's copy is then stale, as on
 * the segment. */
static void test_redis_fork_inherited_admission_stays_the_parents(
    void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "p", 1), 0);
  throttle_ticket_t *pt = NULL;
  assert_int_equal(throttle_enter(a, "p", THROTTLE_CLASS_LIVE, 5000, &pt), 0);
  th_sleep_ms(50);
  struct kid k = {a, pt, -1, -1};
  th_reap_ok(fx, th_spawn(fx, own_admission_then_exit, &k), HANG_GUARD_MS);
  th_sleep_ms(3 * LIVENESS_MS);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *bt = NULL;
  assert_int_equal(throttle_try_enter(b, "p", THROTTLE_CLASS_LIVE, &bt, NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(th_field(b, "p", THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(th_field(b, "g", THROTTLE_FIELD_IN_FLIGHT), 0);
  /* a child's leave of the inherited admission releases its slot */
  th_reap_ok(fx, th_spawn(fx, leave_inherited, &k), HANG_GUARD_MS);
  assert_int_equal(throttle_try_enter(b, "p", THROTTLE_CLASS_LIVE, &bt, NULL),
                   0);
  assert_int_equal(throttle_leave(b, bt, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(a, pt, THROTTLE_OUTCOME_OK, 0),
                   THROTTLE_ESTALE);
  throttle_close(b);
}

struct exec_kid {
  int fd; /* the shell's standard output */
};

/* The child execs a shell that counts the sockets it was handed. */
static int exec_counting_sockets(void *arg) {
  struct exec_kid *k = arg;
  if (dup2(k->fd, 1) < 0)
    return 1;
  execl("/bin/sh", "sh", "-c",
        "n=0; for f in /proc/$$/fd/*; do case $(readlink \"$f\") in "
        "socket:*) n=$((n + 1));; esac; done; echo $n",
        (char *)NULL);
  return 1;
}

/* A child that execs (throttlectl run's command, a subprocess) takes none
 * of the parent's Redis connections along: the pool's, the heartbeat's.
 * (It took both: an exec'ed program held sockets to Redis open, and
 * could write on them.) */
static void test_redis_fork_exec_takes_no_connection(void **state) {
  struct th_fx *fx = *state;
  throttle_ticket_t *pt = NULL;
  throttle_t *a = parent_holding(fx, &pt);
  th_sleep_ms(LIVENESS_MS / 2); /* the heartbeat has connected */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct exec_kid k = {fds[1]};
  th_reap_ok(fx, th_spawn(fx, exec_counting_sockets, &k), HANG_GUARD_MS);
  close(fds[1]);
  char out[32] = "";
  ssize_t n = read(fds[0], out, sizeof out - 1);
  close(fds[0]);
  assert_true(n > 0);
  out[n] = 0;
  printf("sockets in the exec'ed child: %s", out);
  assert_int_equal(atoi(out), 0);
  assert_int_equal(throttle_leave(a, pt, THROTTLE_OUTCOME_OK, 0), 0);
}

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_redis_fork: redis-server is not installed (make "
           "deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_redis_fork_child_admits_holds_leaves_closes, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_fork_child_without_calls_exits_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_fork_inherited_admission_stays_the_parents, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_redis_fork_exec_takes_no_connection,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
