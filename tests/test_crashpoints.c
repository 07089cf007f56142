/* SPDX-License-Identifier: MIT */
/*
 * test_crashpoints.c — kill -9 at every named crash point, then measure
 * that the next caller gets through within a second and finds the table
 * whole (I6).
 *
 * One table lists the points.  For each, a child arms THROTTLE_CRASH_AT
 * (read by the test build of the library), does the operation that reaches
 * the point, and must die there by SIGKILL.  What follows is the contract
 * under test: whoever comes next (a fresh opener, a caller that finds the
 * mutex's owner dead, a waiter the dead process was handing a slot to)
 * recovers in under 1000 ms — a bound, not a benchmark: the usual figure is
 * one poll interval — and the keys published before are still there with
 * their not-before, no slot is left to the dead process, and enter/leave
 * work.  test_multiproc.c checks the repair of the first five points in
 * detail; here they get the same recovery bound as the gate's points.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"

#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NS_PER_MS UINT64_C(1000000)
#define HANG_GUARD_MS 10000
#define RECOVER_MS 1000 /* the contract */
#define GATE_KEY "g"
#define LOCKED_RETRY_MS 300

static struct th_fx *fx_of(void **state) { return *state; }

/* How a point is reached, and so how the crash is staged. */
enum stage {
  STAGE_CREATE,    /* creating the segment */
  STAGE_LOCKED_OP, /* inside a back-off, holding the mutex */
  STAGE_REPAIR,    /* repairing after an earlier crash */
  STAGE_HAND_OVER, /* leaving: the slot goes to a waiting process */
  STAGE_OWN_GRANT, /* being admitted itself */
  STAGE_TABLE,     /* inserting a key (evicting one first if full) */
};

struct point {
  const char *name;
  enum stage stage;
  throttle_outcome_t outcome; /* STAGE_HAND_OVER: what the leaver reports */
};

static const struct point points[] = {
    {"init-before-truncate", STAGE_CREATE, THROTTLE_OUTCOME_OK},
    {"init-before-magic", STAGE_CREATE, THROTTLE_OUTCOME_OK},
    {"after-lock", STAGE_LOCKED_OP, THROTTLE_OUTCOME_OK},
    {"mid-update", STAGE_LOCKED_OP, THROTTLE_OUTCOME_OK},
    {"mid-repair", STAGE_REPAIR, THROTTLE_OUTCOME_OK},
    {"gate-mid-grant", STAGE_HAND_OVER, THROTTLE_OUTCOME_OK},
    {"gate-mid-grant", STAGE_OWN_GRANT, THROTTLE_OUTCOME_OK},
    {"gate-mid-leave", STAGE_HAND_OVER, THROTTLE_OUTCOME_OK},
    {"gate-mid-leave", STAGE_HAND_OVER, THROTTLE_OUTCOME_LOCKED},
    {"table-mid-insert", STAGE_TABLE, THROTTLE_OUTCOME_OK},
    {"table-mid-evict", STAGE_TABLE, THROTTLE_OUTCOME_OK},
};

/* ---- small helpers ------------------------------------------------------ */

/* th_recv_u64 with a hang guard: fails the test on EOF or timeout. */
static uint64_t recv_within(int fd, int timeout_ms) {
  struct pollfd pfd = {fd, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) != 1)
    fail_msg("no word from the child within %d ms", timeout_ms);
  uint64_t v;
  if (th_recv_u64(fd, &v) != 0)
    fail_msg("the child closed its pipe before sending");
  return v;
}

static int64_t field(throttle_t *h, const char *key, throttle_field_t f) {
  throttle_info_t *info = NULL;
  int rc = throttle_info(h, key, &info);
  if (rc != 0)
    fail_msg("throttle_info(%s): %s: %s", key, throttle_err_name(rc),
             throttle_errmsg(h));
  int64_t v = throttle_info_get(info, f);
  throttle_info_free(info);
  return v;
}

static uint64_t repairs(throttle_t *h) {
  uint64_t n = UINT64_MAX;
  assert_int_equal(throttle_stats(h, NULL, NULL, NULL, &n), 0);
  return n;
}

/* The table's own bookkeeping is whole (see th_table_faults). */
static void expect_table_whole(throttle_t *h) {
  char why[256];
  int n = th_table_faults(h, why, sizeof why);
  if (n != 0)
    fail_msg("%d faults in the table, the first: %s", n, why);
}

static void arm(const char *point) {
  if (setenv("THROTTLE_CRASH_AT", point, 1) != 0)
    _exit(3);
}

/* A child's own handle (the inherited one is the parent's). */
static throttle_t *child_open(struct th_fx *fx) {
  throttle_close(fx->h);
  fx->h = NULL;
  throttle_t *h = NULL;
  if (throttle_open(fx->cfg, &h) != 0 || !throttle_is_shared(h))
    return NULL;
  return h;
}

/* ---- what was there before the crash ------------------------------------- */

struct before {
  uint64_t t0; /* throttle clock, just before publishing */
};

static struct before publish_abc(throttle_t *h) {
  struct before b = {th_now_ns()};
  assert_int_equal(throttle_backoff(h, "a", 20000), 0);
  assert_int_equal(throttle_backoff(h, "b", 30000), 0);
  assert_int_equal(throttle_backoff(h, "c", 40000), 0);
  assert_int_equal(throttle_set_max_parallel(h, GATE_KEY, 1), 0);
  return b;
}

/* Published keys present, not-before intact (neither lost nor moved). */
static void expect_abc(throttle_t *h, const struct before *b) {
  const char *keys[] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++) {
    uint64_t ms = th_remaining(h, keys[i]);
    uint64_t now = th_now_ns();
    uint64_t want = (uint64_t)(20000 + 10000 * i);
    assert_true(ms <= want);
    assert_true(ms * NS_PER_MS + (now - b->t0) >= want * NS_PER_MS);
  }
}

/* No slot left to anyone; admission works; the cap still holds. */
static void expect_gate_clean(throttle_t *h) {
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, 5000, &t),
                   0);
  throttle_ticket_t *t2 = NULL;
  assert_int_equal(
      throttle_try_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, &t2, NULL),
      THROTTLE_EWOULDBLOCK); /* cap 1 */
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_WAITING_LIVE), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_WAITING_BACKFILL), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_PROBE_OUT), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_CAP), 1);
  /* and a key never seen before */
  assert_int_equal(throttle_enter(h, "fresh", THROTTLE_CLASS_LIVE, 5000, &t),
                   0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  expect_table_whole(h);
}

/* ---- children ----------------------------------------------------------- */

struct kid {
  struct th_fx *fx;
  const struct point *p;
  int out; /* write end: words for the parent */
  int in;  /* read end: the parent's go-ahead */
};

/* Creates the segment and dies in the middle. */
static int kid_creates(void *arg) {
  struct kid *k = arg;
  arm(k->p->name);
  throttle_t *h = NULL;
  throttle_open(k->fx->cfg, &h);
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

/* Publishes a back-off and dies holding the mutex. */
static int kid_backs_off(void *arg) {
  struct kid *k = arg;
  throttle_t *h = child_open(k->fx);
  TH_CHILD_CHECK(h != NULL);
  arm(k->p->name);
  throttle_backoff(h, "x", 1000);
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

/* Holds the gate key, waits for the go-ahead, then leaves armed: dies
 * handing its slot over.  Sends the time just before leaving. */
static int kid_holds_then_leaves(void *arg) {
  struct kid *k = arg;
  throttle_t *h = child_open(k->fx);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, 5000, &t) ==
                 0);
  th_send_u64(k->out, 1);
  uint64_t go;
  TH_CHILD_CHECK(th_recv_u64(k->in, &go) == 0);
  arm(k->p->name);
  th_send_u64(k->out, th_mono_ms());
  th_send_u64(k->out, th_now_ns());
  throttle_leave(h, t, k->p->outcome, LOCKED_RETRY_MS);
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

/* Dies being admitted: its own slot marked as a holder. */
static int kid_dies_admitted(void *arg) {
  struct kid *k = arg;
  throttle_t *h = child_open(k->fx);
  TH_CHILD_CHECK(h != NULL);
  arm(k->p->name);
  throttle_ticket_t *t = NULL;
  throttle_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, 5000, &t);
  th_child_fail(__FILE__, __LINE__, "crash point not reached");
  return 1;
}

/* Waits for the gate key (unarmed); reports when it got in. */
static int kid_waits(void *arg) {
  struct kid *k = arg;
  throttle_t *h = child_open(k->fx);
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, HANG_GUARD_MS, &t);
  TH_CHILD_CHECK(rc == 0);
  th_send_u64(k->out, th_mono_ms());
  th_send_u64(k->out, th_now_ns());
  th_send_u64(k->out, (uint64_t)throttle_ticket_is_probe(t));
  th_sleep_ms(20);
  TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(h);
  return 0;
}

/* ---- the stages ------------------------------------------------------------
 */

static void run_create(struct th_fx *fx, const struct point *p) {
  struct kid k = {fx, p, -1, -1};
  pid_t pid = th_spawn(fx, kid_creates, &k);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  uint64_t m0 = th_mono_ms();
  throttle_t *h = th_open(fx);
  uint64_t took = th_mono_ms() - m0;
  print_message("%-22s opener got in after %llu ms\n", p->name,
                (unsigned long long)took);
  assert_true(took < RECOVER_MS);
  struct before b = publish_abc(h);
  expect_abc(h, &b);
  expect_gate_clean(h);
  throttle_t *other = NULL;
  assert_int_equal(th_open_rc(fx, &other), 0);
  assert_int_equal(throttle_is_shared(other), 1);
  expect_abc(other, &b);
  throttle_close(other);
}

static void run_locked_op(struct th_fx *fx, const struct point *p) {
  throttle_t *h = th_open(fx);
  struct before b = publish_abc(h);
  struct kid k = {fx, p, -1, -1};
  if (p->stage == STAGE_REPAIR) {
    /* an owner died; the next one dies repairing after it */
    static const struct point first = {"after-lock", STAGE_LOCKED_OP,
                                       THROTTLE_OUTCOME_OK};
    struct kid k1 = {fx, &first, -1, -1};
    th_reap_killed(fx, th_spawn(fx, kid_backs_off, &k1), HANG_GUARD_MS);
  }
  pid_t pid = th_spawn(fx, kid_backs_off, &k);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  uint64_t took = th_mono_ms() - m0;
  print_message("%-22s next caller got in after %llu ms\n", p->name,
                (unsigned long long)took);
  assert_true(took < RECOVER_MS);
  assert_int_equal(repairs(h), 1);
  expect_abc(h, &b);
  assert_true(th_remaining(h, "d") > 0);
  /* the half-made key is whole or gone, and never longer than it asked */
  assert_true(th_remaining(h, "x") <= 1000);
  expect_gate_clean(h);
  assert_int_equal(repairs(h), 1); /* once, not on every call */
}

/* A holder dies handing its slot to a waiting process: the waiter gets in
 * on its own within the bound, as the probe if the dead one had reported
 * LOCKED, and not before the back-off it published. */
static void run_hand_over(struct th_fx *fx, const struct point *p) {
  throttle_t *h = th_open(fx);
  struct before b = publish_abc(h);
  int up[2], down[2], wp[2];
  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  assert_int_equal(pipe(wp), 0);
  struct kid holder = {fx, p, up[1], down[0]};
  struct kid waiter = {fx, p, wp[1], -1};
  pid_t hp = th_spawn(fx, kid_holds_then_leaves, &holder);
  assert_int_equal(recv_within(up[0], HANG_GUARD_MS), 1);
  pid_t wpid = th_spawn(fx, kid_waits, &waiter);
  close(up[1]);
  close(wp[1]);
  close(down[0]);
  uint64_t m0 = th_mono_ms();
  while (field(h, GATE_KEY, THROTTLE_FIELD_WAITING_LIVE) != 1 &&
         th_mono_ms() - m0 < HANG_GUARD_MS)
    th_sleep_ms(2);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_WAITING_LIVE), 1);
  th_wait_sleeping(wpid, 2000);

  th_send_u64(down[1], 1); /* go: leave, and die on the way */
  uint64_t crash_mono = recv_within(up[0], HANG_GUARD_MS);
  uint64_t crash_now = recv_within(up[0], HANG_GUARD_MS);
  th_reap_killed(fx, hp, HANG_GUARD_MS);
  uint64_t in_mono = recv_within(wp[0], HANG_GUARD_MS);
  uint64_t in_now = recv_within(wp[0], HANG_GUARD_MS);
  uint64_t probe = recv_within(wp[0], HANG_GUARD_MS);
  th_reap_ok(fx, wpid, HANG_GUARD_MS);
  uint64_t took = in_mono > crash_mono ? in_mono - crash_mono : 0;
  print_message("%-22s %s: waiter got in %llu ms after the crash\n", p->name,
                p->outcome == THROTTLE_OUTCOME_LOCKED ? "LOCKED" : "OK",
                (unsigned long long)took);
  assert_true(took < RECOVER_MS);
  if (p->outcome == THROTTLE_OUTCOME_LOCKED) {
    /* the back-off was published before the crash: honoured (I1), and
     * the waiter is the episode's probe (I3) */
    assert_true(in_now >= crash_now + LOCKED_RETRY_MS * NS_PER_MS);
    assert_int_equal(probe, 1);
  } else {
    assert_int_equal(probe, 0);
  }
  close(up[0]);
  close(down[1]);
  close(wp[0]);

  m0 = th_mono_ms();
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  assert_true(th_mono_ms() - m0 < RECOVER_MS);
  assert_int_equal(repairs(h), 1);
  expect_abc(h, &b);
  expect_gate_clean(h);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_RECLAIMS), 0);
}

/* A process dies while being admitted: its slot is a holder's, its pid
 * dead.  The next caller takes it back and gets in. */
static void run_own_grant(struct th_fx *fx, const struct point *p) {
  throttle_t *h = th_open(fx);
  struct before b = publish_abc(h);
  struct kid k = {fx, p, -1, -1};
  pid_t pid = th_spawn(fx, kid_dies_admitted, &k);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  uint64_t m0 = th_mono_ms();
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, 5000, &t),
                   0);
  uint64_t took = th_mono_ms() - m0;
  print_message("%-22s own admission: next caller got in after %llu ms\n",
                p->name, (unsigned long long)took);
  assert_true(took < RECOVER_MS);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_RECLAIMS), 1);
  assert_int_equal(repairs(h), 1);
  expect_abc(h, &b);
  expect_gate_clean(h);
}

/* A process dies half-way through inserting a key (or evicting one to make
 * room): a record in use that no bucket leads to, or a bucket gone for a
 * record not yet freed, with the table's sequence left odd. */
#define SMALL_TABLE 8u
static void run_table(struct th_fx *fx, const struct point *p) {
  assert_int_equal(throttle_config_set_capacity(fx->cfg, SMALL_TABLE), 0);
  throttle_t *h = th_open(fx);
  struct before b = publish_abc(h);
  bool evict = strcmp(p->name, "table-mid-evict") == 0;
  uint32_t used = 0;
  assert_int_equal(throttle_stats(h, NULL, &used, NULL, NULL), 0);
  for (uint32_t i = 0; evict && used + i < SMALL_TABLE; i++) {
    char key[16];
    snprintf(key, sizeof key, "idle-%u", i);
    assert_int_equal(throttle_backoff(h, key, 0), 0); /* seen once, */
    assert_int_equal(throttle_clear(h, key), 0);      /* idle at once */
  }
  th_sleep_ms(2);
  struct kid k = {fx, p, -1, -1};
  pid_t pid = th_spawn(fx, kid_backs_off, &k);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  uint64_t m0 = th_mono_ms();
  assert_int_equal(throttle_backoff(h, "d", 10000), 0);
  uint64_t took = th_mono_ms() - m0;
  print_message("%-22s next caller got in after %llu ms\n", p->name,
                (unsigned long long)took);
  assert_true(took < RECOVER_MS);
  assert_int_equal(repairs(h), 1);
  expect_abc(h, &b);
  assert_true(th_remaining(h, "d") > 0);
  assert_true(th_remaining(h, "x") <= 1000);
  expect_table_whole(h);
  uint32_t cap = 0;
  assert_int_equal(throttle_stats(h, &cap, &used, NULL, NULL), 0);
  assert_true(used <= cap);
  expect_gate_clean(h);
}

static void run_point(void **state, size_t i) {
  struct th_fx *fx = fx_of(state);
  const struct point *p = &points[i];
  switch (p->stage) {
  case STAGE_CREATE:
    run_create(fx, p);
    break;
  case STAGE_LOCKED_OP:
  case STAGE_REPAIR:
    run_locked_op(fx, p);
    break;
  case STAGE_HAND_OVER:
    run_hand_over(fx, p);
    break;
  case STAGE_OWN_GRANT:
    run_own_grant(fx, p);
    break;
  case STAGE_TABLE:
    run_table(fx, p);
    break;
  }
}

static void test_crashpoints_init_before_truncate(void **s) { run_point(s, 0); }
static void test_crashpoints_init_before_magic(void **s) { run_point(s, 1); }
static void test_crashpoints_after_lock(void **s) { run_point(s, 2); }
static void test_crashpoints_mid_update(void **s) { run_point(s, 3); }
static void test_crashpoints_mid_repair(void **s) { run_point(s, 4); }
static void test_crashpoints_gate_mid_grant_hand_over(void **s) {
  run_point(s, 5);
}
static void test_crashpoints_gate_mid_grant_own_admission(void **s) {
  run_point(s, 6);
}
static void test_crashpoints_gate_mid_leave_ok(void **s) { run_point(s, 7); }
static void test_crashpoints_gate_mid_leave_locked(void **s) {
  run_point(s, 8);
}
static void test_crashpoints_table_mid_insert(void **s) { run_point(s, 9); }
static void test_crashpoints_table_mid_evict(void **s) { run_point(s, 10); }

/* ---- a grant cut short ------------------------------------------------- */

struct grant_arg {
  struct th_fx *fx;
  int out; /* to the parent: 1 once admitted */
  int in;  /* from the parent: a word means go on (the leaver only) */
};

static int enter_and_tell(struct grant_arg *a, throttle_t **h,
                          throttle_ticket_t **t) {
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, h) == 0);
  TH_CHILD_CHECK(throttle_enter(*h, GATE_KEY, THROTTLE_CLASS_LIVE, 5000, t) ==
                 0);
  th_send_u64(a->out, 1);
  return 0;
}

static int hold_then_die_handing_over(void *p) {
  struct grant_arg *a = p;
  throttle_t *h = NULL;
  throttle_ticket_t *t = NULL;
  if (enter_and_tell(a, &h, &t) != 0)
    return 1;
  uint64_t v;
  th_recv_u64(a->in, &v); /* the waiter is queued */
  setenv("THROTTLE_CRASH_AT", "gate-mid-grant", 1);
  throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
  return 1; /* not reached: the crash point kills */
}

static int wait_then_hold(void *p) {
  throttle_t *h = NULL;
  throttle_ticket_t *t = NULL;
  if (enter_and_tell(p, &h, &t) != 0)
    return 1;
  for (;;)
    pause();
}

/* The leaver dies handing its slot to a waiter, just after the waiter's
 * slot became a holder.  The waiter's lease must run from that grant, not
 * from whenever its slot was last timed (here never: the lease would lapse
 * at once, and the slot go to the next caller while the waiter sends). */
static void test_crashpoints_grant_cut_short_keeps_lease(void **s) {
  struct th_fx *fx = fx_of(s);
  assert_int_equal(throttle_config_set_lease(fx->cfg, 5000), 0);
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(h, GATE_KEY, 1), 0);
  int lout[2], lin[2], wout[2];
  assert_int_equal(pipe(lout), 0);
  assert_int_equal(pipe(lin), 0);
  assert_int_equal(pipe(wout), 0);
  struct grant_arg la = {fx, lout[1], lin[0]}, wa = {fx, wout[1], -1};
  pid_t leaver = th_spawn(fx, hold_then_die_handing_over, &la);
  close(lout[1]);
  close(lin[0]);
  assert_int_equal(recv_within(lout[0], HANG_GUARD_MS), 1);
  pid_t waiter = th_spawn(fx, wait_then_hold, &wa);
  close(wout[1]);
  th_wait_field(h, GATE_KEY, THROTTLE_FIELD_WAITING_LIVE, 1, HANG_GUARD_MS);
  th_send_u64(lin[1], 1); /* hand over */
  close(lin[1]);
  th_reap_killed(fx, leaver, HANG_GUARD_MS);
  assert_int_equal(recv_within(wout[0], HANG_GUARD_MS), 1); /* admitted */
  for (int i = 0; i < 4; i++) {
    throttle_ticket_t *t = NULL;
    assert_int_equal(
        throttle_try_enter(h, GATE_KEY, THROTTLE_CLASS_LIVE, &t, NULL),
        THROTTLE_EWOULDBLOCK);
    th_sleep_ms(60); /* past the reap interval */
  }
  assert_int_equal(field(h, GATE_KEY, THROTTLE_FIELD_RECLAIMS), 0);
  close(lout[0]);
  close(wout[0]);
  kill(waiter, SIGKILL);
  th_reap_killed(fx, waiter, HANG_GUARD_MS);
}

/* ---- publishing ---------------------------------------------------- */

static int publish_and_die(void *arg) {
  struct th_fx *fx = arg;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  setenv("THROTTLE_CRASH_AT", "gate-mid-publish", 1);
  throttle_backoff(h, GATE_KEY, 30000);
  return 1; /* not reached: the crash point kills */
}

/* A publisher killed half-way through its update leaves a state that is
 * safe as it stands: never a not-before without its lock episode (when it
 * passed, every waiter would go at once instead of one probe). */
static void test_crashpoints_publish_any_prefix_safe(void **s) {
  struct th_fx *fx = fx_of(s);
  th_reap_killed(fx, th_spawn(fx, publish_and_die, fx), HANG_GUARD_MS);
  throttle_t *h = th_open(fx);
  uint64_t left = th_remaining(h, GATE_KEY);
  int64_t episode = field(h, GATE_KEY, THROTTLE_FIELD_LOCK_EPISODE);
  assert_true(left == 0 || episode == 1);
  assert_int_equal(episode, 1); /* the crash came between the two stores */
  assert_int_equal(throttle_clear(h, GATE_KEY), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, th_setup, th_teardown)

int main(void) {
  _Static_assert(sizeof points / sizeof points[0] == 11,
                 "one test per row of the table");
  const struct CMUnitTest tests[] = {
      T(test_crashpoints_init_before_truncate),
      T(test_crashpoints_init_before_magic),
      T(test_crashpoints_after_lock),
      T(test_crashpoints_mid_update),
      T(test_crashpoints_mid_repair),
      T(test_crashpoints_gate_mid_grant_hand_over),
      T(test_crashpoints_gate_mid_grant_own_admission),
      T(test_crashpoints_gate_mid_leave_ok),
      T(test_crashpoints_gate_mid_leave_locked),
      T(test_crashpoints_table_mid_insert),
      T(test_crashpoints_table_mid_evict),
      T(test_crashpoints_publish_any_prefix_safe),
      T(test_crashpoints_grant_cut_short_keeps_lease),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
