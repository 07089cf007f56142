/* SPDX-License-Identifier: MIT */
/*
 * helpers.h — what every test file shares: a per-test fixture with its own
 * segment name, child processes that are always reaped, clocks, and access
 * to a segment's raw bytes for forging damaged ones.
 *
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h> and <cmocka.h>.
 */
#ifndef THROTTLE_TEST_HELPERS_H
#define THROTTLE_TEST_HELPERS_H

#include "throttle.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TH_MAX_CHILDREN 64

/* One per test: set up by th_setup, torn down by th_teardown. */
struct th_fx {
  char name[128];          /* "/tt-<pid>-<counter>", unique to the test */
  throttle_config_t *cfg;  /* segment = name, lock timeout 2000 ms */
  throttle_t *h;           /* opened by th_open(), closed in teardown */
  pid_t kids[TH_MAX_CHILDREN];
  int nkids;
  char extra[8][128]; /* more segment names, unlinked in teardown */
  int nextra;
};

/* cmocka setup / teardown: the teardown kills and reaps every child still
 * registered, closes fx->h, frees fx->cfg, unlinks the segment (and the
 * extra names, and every name of this run's tag: th_remove_tagged) and unsets the THROTTLE_* environment variables a test may
 * have set. */
int th_setup(void **state);
int th_teardown(void **state);
/* th_setup, then a throw-away redis-server in *r (tests/redis_helpers.h)
 * that the fixture's configuration names as its backend. */
struct th_redis;
int th_redis_setup(void **state, struct th_redis *r);
/* th_teardown, then *r stopped and removed, and the environment the Redis
 * tests change put back (THROTTLE_BACKEND, THROTTLE_LIVENESS_MS unset;
 * THROTTLE_BACKEND_MODULE as th_redis_use_module set it). */
int th_redis_teardown(void **state, struct th_redis *r);
/* Another host: a handle on a segment of its own (th_extra_name) naming
 * the backend url; *rc is throttle_open's code (the handle is never
 * NULL). */
throttle_t *th_redis_host(struct th_fx *fx, const char *url, int *rc);
/* th_redis_host(), failing the test unless the open returned 0. */
throttle_t *th_redis_other_host(struct th_fx *fx, const char *url);

/* The tag every test name carries: $TH_TEST_TAG (tests/run.sh sets one per
 * run, so that what a run leaves behind is found and told from what
 * others' runs on the same machine make), else "p<pid>-" of the first
 * process that asks, exported to its children. */
const char *th_test_tag(void);
/* A fresh unique segment name "/tt-<tag><pid>-<n>" (n counts per process). */
void th_unique_name(char *buf, size_t len);
/* Unlink every /dev/shm object named "tt-<tag>...": th_teardown calls it,
 * for the segments a test's children named. */
void th_remove_tagged(void);

/* Another unique segment name, unlinked by the teardown. */
const char *th_extra_name(struct th_fx *fx);

/* Open fx->cfg into fx->h; fails the test unless it returns 0 and the
 * handle is shared. */
throttle_t *th_open(struct th_fx *fx);
/* th_open(), then key capped at 1 (throttle_set_max_parallel) and its
 * only slot taken by this process (*t, for the caller to leave): the
 * next caller of throttle_enter() queues.  Fails the test on an error. */
throttle_t *th_hold_only_slot(struct th_fx *fx, const char *key,
                              throttle_ticket_t **t);
/* Open fx->cfg into a second handle the caller closes; returns the code. */
int th_open_rc(struct th_fx *fx, throttle_t **out);

/* Fork a child that runs fn(arg) and exits with its value (0 = success).
 * The child never returns into the test runner.  The pid is registered so
 * the teardown reaps it whatever happens. */
pid_t th_spawn(struct th_fx *fx, int (*fn)(void *arg), void *arg);
/* A child for th_spawn(fx, th_child_sits_on_mutex, fx): opens fx->cfg,
 * takes the segment mutex and stops itself (SIGSTOP), a live owner that
 * never lets go; the test kills it. */
int th_child_sits_on_mutex(void *fx);
/* A child for th_spawn(fx, th_child_holds, &hold): opens hold.fx->cfg,
 * enters hold.key (at most 10 s), writes 1 to hold.fd once admitted and
 * holds until it is killed. */
struct th_hold {
  struct th_fx *fx;
  const char *key;
  int fd;
};
int th_child_holds(void *hold);
/* Wait up to timeout_ms (a hang guard) for pid and unregister it; returns
 * its wait status.  On timeout the child is killed and the test fails. */
int th_reap(struct th_fx *fx, pid_t pid, int timeout_ms);
/* Wait up to timeout_ms for pid to stop (SIGSTOP); fails the test if it
 * exits or does not stop.  The child stays registered. */
void th_wait_stopped(struct th_fx *fx, pid_t pid, int timeout_ms);
/* Reap and require a normal exit with status 0. */
void th_reap_ok(struct th_fx *fx, pid_t pid, int timeout_ms);
/* Reap and require death by SIGKILL (a crash point fired). */
void th_reap_killed(struct th_fx *fx, pid_t pid, int timeout_ms);

/* Children report failures with this (never with cmocka, whose failures
 * would longjmp into the runner's copy inside the child). */
#define TH_CHILD_CHECK(cond)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      th_child_fail(__FILE__, __LINE__, #cond);                                \
      return 1;                                                                \
    }                                                                          \
  } while (0)
void th_child_fail(const char *file, int line, const char *what);

/* Pipes used as start barriers between a parent and its children. */
struct th_gate {
  int fd[2];
};
void th_gate_init(struct th_gate *g);
void th_gate_open(struct th_gate *g);   /* parent: releases every waiter */
void th_gate_wait(struct th_gate *g);   /* child: blocks until opened */
void th_gate_close(struct th_gate *g);

/* Small values from a child to its parent over a pipe.  th_recv_u64
 * returns 0 on success, -1 on EOF (the child died first). */
void th_send_u64(int fd, uint64_t v);
int th_recv_u64(int fd, uint64_t *v);

/* Wait up to timeout_ms for pid to be asleep in the kernel (state 'S' in
 * /proc/PID/stat), e.g. blocked in a futex; 1 when seen, 0 otherwise.  A
 * synchronisation aid only: callers never rely on it for correctness. */
int th_wait_sleeping(pid_t pid, int timeout_ms);

/* Clocks: the library's (CLOCK_BOOTTIME) and a monotonic one for hang
 * guards, in milliseconds and nanoseconds. */
uint64_t th_now_ns(void);
uint64_t th_mono_ms(void);
void th_sleep_ms(unsigned ms);

/* "/dev/shm" + name. */
void th_shm_path(const char *name, char *buf, size_t len);

/* Map the whole segment file read-write (its current size in *size);
 * th_unmap undoes it.  Fails the test when the file cannot be mapped. */
void *th_map(const char *name, size_t *size);
void th_unmap(void *base, size_t size);

/* Set an shm object's size (bytes) or mode, by name. */
void th_truncate(const char *name, uint64_t size);
void th_chmod(const char *name, unsigned mode);

/* 1 when msg contains needle. */
int th_contains(const char *msg, const char *needle);

/* A key published with this much delay stays pending for the whole test. */
#define TH_LONG_MS UINT64_C(60000)

/* A field of throttle_info() for key; fails the test on an error. */
int64_t th_field(throttle_t *h, const char *key, throttle_field_t f);
/* Wait up to timeout_ms for that field to read want; fails the test if it
 * never does. */
void th_wait_field(throttle_t *h, const char *key, throttle_field_t f,
                   int64_t want, int timeout_ms);

/* The record (struct throttle__rec *) of key in h's segment, found by a
 * scan without the mutex, for tests that forge its fields; fails the test
 * when there is none. */
void *th_rec(throttle_t *h, const char *key);

/* throttle_enter() that must admit within timeout_ms, and
 * throttle_leave() that must succeed; each fails the test otherwise, with
 * the handle's message. */
throttle_ticket_t *th_enter(throttle_t *h, const char *key,
                            throttle_class_t cls, uint64_t timeout_ms);
void th_leave(throttle_t *h, throttle_ticket_t *t, throttle_outcome_t o,
              uint64_t retry_after_ms);

/* throttle_remaining() of key in ms; fails the test on an error. */
uint64_t th_remaining(throttle_t *h, const char *key);

/* The table's own consistency, checked under the segment mutex (and after
 * the repair that taking it may run): every record in use is found by its
 * key (none orphaned, none doubled), the key count is right, the free list
 * holds exactly the other records without a cycle, and no change is left
 * half done (the sequence is even).  Returns the number of faults and
 * describes the first in why (may be NULL).  For a shared handle. */
int th_table_faults(throttle_t *h, char *why, size_t len);

/* TH_ASAN: built with AddressSanitizer (gcc's __SANITIZE_ADDRESS__,
 * clang's __has_feature), for the few tests its runtime cannot run. */
#if defined(__SANITIZE_ADDRESS__)
#define TH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TH_ASAN 1
#endif
#endif

#endif
