/* SPDX-License-Identifier: MIT */
/*
 * test_interrupt.c — throttle_config_set_interrupt(): every wait of the
 * library asks the caller's check at the promised period and on a signal,
 * and a wait the check abandons leaves no queue place or slot behind.
 *
 * Waiters are real processes; what they observe is counted in an anonymous
 * shared mapping.  Time appears only as generous lower bounds on how often
 * the check ran, and as hang guards.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"

#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KEY "hotdata:ws1/orders"
#define HANG_MS 20000
#define PERIOD_MS 10u

struct obs {
  _Atomic int stop;       /* the check's answer, set by the parent */
  _Atomic int calls;      /* calls of the check */
  _Atomic int stop_after; /* > 0: the check answers stop on that call */
  _Atomic int rc;         /* the waiter's result */
  _Atomic int done;       /* the waiter has returned */
  _Atomic uint64_t elapsed_ms;
  _Atomic int release; /* the waiter may exit */
};

static struct obs *obs_new(void) {
  struct obs *o = mmap(NULL, sizeof *o, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(o != MAP_FAILED);
  memset(o, 0, sizeof *o);
  atomic_store(&o->rc, 1);
  return o;
}

static volatile sig_atomic_t got_signal;

static int check(void *arg) {
  struct obs *o = arg;
  int n = atomic_fetch_add(&o->calls, 1) + 1;
  int after = atomic_load(&o->stop_after);
  return atomic_load(&o->stop) || got_signal || (after > 0 && n >= after);
}

struct waiter {
  struct th_fx *fx;
  struct obs *o;
  uint32_t period_ms;
  int use_enter; /* throttle_enter, else throttle_wait */
};

static int waiter_main(void *arg) {
  struct waiter *w = arg;
  TH_CHILD_CHECK(throttle_config_set_interrupt(w->fx->cfg, check, w->o,
                                               w->period_ms) == 0);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(w->fx->cfg, &h) == 0);
  uint64_t t0 = th_mono_ms();
  int rc;
  if (w->use_enter) {
    throttle_ticket_t *t = NULL;
    rc = throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t);
    TH_CHILD_CHECK(rc != 0 || t != NULL);
    if (rc == 0)
      throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
  } else {
    rc = throttle_wait(h, KEY, THROTTLE_FOREVER);
  }
  atomic_store(&w->o->elapsed_ms, th_mono_ms() - t0);
  atomic_store(&w->o->rc, rc);
  atomic_store(&w->o->done, 1);
  /* Stay alive: a place left behind by a live process is never reaped. */
  while (!atomic_load(&w->o->release))
    th_sleep_ms(5);
  throttle_close(h);
  return 0;
}

static void wait_done(struct obs *o) {
  uint64_t t0 = th_mono_ms();
  while (!atomic_load(&o->done) && th_mono_ms() - t0 < HANG_MS)
    th_sleep_ms(5);
  assert_true(atomic_load(&o->done));
}

static int64_t field(throttle_t *h, throttle_field_t f) {
  return th_field(h, KEY, f);
}

static void wait_field(throttle_t *h, throttle_field_t f, int64_t want) {
  th_wait_field(h, KEY, f, want, HANG_MS);
}

static int late_enter(void *arg) {
  struct th_fx *fx = arg;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  throttle_ticket_t *t = NULL;
  /* Far below the lease: admitted only if the interrupted place is gone. */
  int rc = throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, 5000, &t);
  TH_CHILD_CHECK(rc == 0);
  TH_CHILD_CHECK(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  throttle_close(h);
  return 0;
}

/* A waiter queued for the only slot is interrupted; the caller who queued
 * behind it is admitted when the slot frees, although the interrupted
 * process lives on.  Its check ran about every period while it waited. */
static void test_interrupt_enter_gives_back_place(void **state) {
  struct th_fx *fx = *state;
  struct obs *o = obs_new();
  throttle_ticket_t *t;
  throttle_t *h = th_hold_only_slot(fx, KEY, &t);
  struct waiter w = {fx, o, PERIOD_MS, 1};
  pid_t wp = th_spawn(fx, waiter_main, &w);
  wait_field(h, THROTTLE_FIELD_WAITING_LIVE, 1);
  pid_t late = th_spawn(fx, late_enter, fx);
  wait_field(h, THROTTLE_FIELD_WAITING_LIVE, 2);
  th_sleep_ms(300);
  atomic_store(&o->stop, 1);
  wait_done(o);
  assert_int_equal(atomic_load(&o->rc), THROTTLE_EINTR);
  assert_int_equal(field(h, THROTTLE_FIELD_WAITING_LIVE), 1);
  /* At least one call per five periods of the wait (about one per period
   * is promised; the margin is for a loaded machine), and no busy loop. */
  int calls = atomic_load(&o->calls);
  uint64_t ms = atomic_load(&o->elapsed_ms);
  print_message("check called %d times in %llu ms (period %u ms)\n", calls,
                (unsigned long long)ms, PERIOD_MS);
  assert_true(ms >= 300);
  assert_true((uint64_t)calls >= ms / (5 * PERIOD_MS));
  assert_true((uint64_t)calls <= ms + 10);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  th_reap_ok(fx, late, HANG_MS);
  assert_int_equal(field(h, THROTTLE_FIELD_IN_FLIGHT), 0);
  atomic_store(&o->release, 1);
  th_reap_ok(fx, wp, HANG_MS);
}

/* throttle_wait on a long back-off, and on a paused key: the check is
 * asked until it says stop, and the wait then ends with THROTTLE_EINTR,
 * the back-off untouched. */
static void test_interrupt_wait_backoff_and_pause(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  for (int paused = 0; paused <= 1; paused++) {
    struct obs *o = obs_new();
    atomic_store(&o->stop_after, 20);
    if (paused) {
      assert_int_equal(throttle_clear(h, KEY), 0);
      assert_int_equal(throttle_pause(h, KEY), 0);
    } else {
      assert_int_equal(throttle_backoff(h, KEY, TH_LONG_MS), 0);
    }
    struct waiter w = {fx, o, PERIOD_MS, 0};
    pid_t wp = th_spawn(fx, waiter_main, &w);
    wait_done(o);
    assert_int_equal(atomic_load(&o->rc), THROTTLE_EINTR);
    assert_int_equal(atomic_load(&o->calls), 20);
    /* 19 periods of sleep at the least: the check did not spin. */
    assert_true(atomic_load(&o->elapsed_ms) >= 19 * PERIOD_MS - 5);
    if (!paused)
      assert_true(th_remaining(h, KEY) > TH_LONG_MS / 2);
    atomic_store(&o->release, 1);
    th_reap_ok(fx, wp, HANG_MS);
  }
}

static void on_usr1(int sig) {
  (void)sig;
  got_signal = 1;
}

static int signalled_main(void *arg) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1; /* no SA_RESTART: the sleep sees EINTR */
  sigaction(SIGUSR1, &sa, NULL);
  return waiter_main(arg);
}

/* With the longest period, a signal still reaches the check at once: the
 * wait ends long before the period would have run out. */
static void test_interrupt_check_on_signal(void **state) {
  struct th_fx *fx = *state;
  throttle_t *h = th_open(fx);
  struct obs *o = obs_new();
  assert_int_equal(throttle_backoff(h, KEY, TH_LONG_MS), 0);
  struct waiter w = {fx, o, 60000, 0};
  pid_t wp = th_spawn(fx, signalled_main, &w);
  uint64_t t0 = th_mono_ms();
  while (atomic_load(&o->calls) == 0 && th_mono_ms() - t0 < HANG_MS)
    th_sleep_ms(5);
  assert_true(th_wait_sleeping(wp, HANG_MS));
  th_sleep_ms(50);
  assert_int_equal(kill(wp, SIGUSR1), 0);
  wait_done(o);
  assert_int_equal(atomic_load(&o->rc), THROTTLE_EINTR);
  assert_int_equal(atomic_load(&o->calls), 2); /* before sleeping, on EINTR */
  assert_true(atomic_load(&o->elapsed_ms) < 30000); /* hang guard */
  atomic_store(&o->release, 1);
  th_reap_ok(fx, wp, HANG_MS);
}

static int never(void *arg) {
  (void)arg;
  return 0;
}

static void test_interrupt_bad_input(void **state) {
  struct th_fx *fx = *state;
  assert_int_equal(throttle_config_set_interrupt(NULL, never, NULL, 10),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_interrupt(fx->cfg, never, NULL, 0),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_interrupt(fx->cfg, never, NULL, 60001),
                   THROTTLE_EINVAL);
  assert_int_equal(throttle_config_set_interrupt(fx->cfg, NULL, NULL, 0), 0);
  assert_string_equal(throttle_err_name(THROTTLE_EINTR), "THROTTLE_EINTR");
  assert_string_equal(throttle_strerror(THROTTLE_EINTR),
                      "interrupted by the caller");
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, th_setup, th_teardown)
      T(test_interrupt_enter_gives_back_place),
      T(test_interrupt_wait_backoff_and_pause),
      T(test_interrupt_check_on_signal),
      T(test_interrupt_bad_input),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
