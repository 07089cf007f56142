/* SPDX-License-Identifier: MIT */
/*
 * clock.c — the one clock every process on the host shares, futex waits on
 * words in shared memory, and a cheap per-thread random source for jitter.
 *
 * Why CLOCK_BOOTTIME.  A not-before is published by one process and read by
 * others, so it needs a clock that is the same in every process of the host:
 * CLOCK_MONOTONIC and CLOCK_BOOTTIME both are (CLOCK_REALTIME is not
 * monotonic and jumps with NTP or an operator).  They differ only across a
 * suspend: MONOTONIC stops, BOOTTIME keeps counting.  A server's Retry-After
 * is real elapsed time, so after a laptop or VM resumes from a 10-minute
 * suspend a 5 s back-off must be over; with MONOTONIC it would still have 5 s
 * to run.  Both are read through the vDSO without a system call; `make bench`
 * measures the two side by side (on the development machine they cost the
 * same within noise), so correctness decides.
 *
 * Leases are the exception: they bound how long a running holder may keep
 * its slot, and a holder frozen with the whole host during a suspend has
 * not run, so they are measured on CLOCK_MONOTONIC (gate_enter.c, reap_locked).
 * On BOOTTIME a suspend longer than the lease would reclaim every holder
 * at once on resume while they go on sending, exceeding the cap.
 *
 * Futexes take relative timeouts measured on CLOCK_MONOTONIC; every sleep is
 * therefore followed by a fresh reading of the throttle clock, never trusted
 * to have lasted exactly as asked.
 */
#include "internal.h"
#include "rng.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* When no clock answers.  clock_gettime() fails only for a clock the
 * kernel lacks (CLOCK_BOOTTIME before 2.6.39) or a system call a sandbox
 * refuses; the timespec is then unset, and using it would publish or wait
 * for a garbage time.  Instead: CLOCK_BOOTTIME, else CLOCK_MONOTONIC (the
 * same but across a suspend), else the latest reading any thread of the
 * process made — time stands still for that call, so a not-before is
 * neither passed early nor pushed out.  A process none of whose readings
 * ever succeeded gets 0.  The latest reading is stored at most once per
 * millisecond, so threads reading the clock do not all write one shared
 * cache line; it may therefore be up to 1 ms old. */
static _Atomic uint64_t seen_now, seen_mono;

/* The kernel's clock, whatever the C library's clock_gettime() says.  A
 * process run under a clock interposer (libfaketime, LD_PRELOAD'ed by a
 * test of date logic) reads CLOCK_BOOTTIME and CLOCK_MONOTONIC as the
 * faked date, decades away from every other process's: every not-before
 * in the segment looked long passed to it, and every other process's
 * holder long past its lease, reclaimed while it still sends.  The host
 * shares one kernel clock, so the library reads that: the C library's
 * (the vDSO, no system call) once it has agreed with the kernel's within
 * a second, the system call otherwise (a process in another time
 * namespace reads its namespace's either way).  Judged at the first
 * reading of each process, with CLOCK_BOOTTIME; a fork inherits the
 * judgement. */
enum { CLOCK_UNJUDGED, CLOCK_LIBC, CLOCK_KERNEL };
static _Atomic int clock_path;

static int kernel_clock(clockid_t c, struct timespec *ts) {
  return (int)syscall(SYS_clock_gettime, c, ts);
}

static __attribute__((noinline)) int clock_judge(void) {
  struct timespec a, k;
  if (clock_gettime(CLOCK_BOOTTIME, &a) != 0)
    return CLOCK_UNJUDGED; /* the fallbacks below; judged again later */
  long long d = 0;
  /* a sandbox that refuses the system call leaves the vDSO's */
  if (kernel_clock(CLOCK_BOOTTIME, &k) == 0)
    d = (long long)a.tv_sec - (long long)k.tv_sec;
  int p = d > 1 || d < -1 ? CLOCK_KERNEL : CLOCK_LIBC;
  atomic_store_explicit(&clock_path, p, memory_order_relaxed);
  return p;
}

static inline int read_clock(clockid_t c, struct timespec *ts) {
  int p = atomic_load_explicit(&clock_path, memory_order_relaxed);
  if (__builtin_expect(p == CLOCK_UNJUDGED, 0))
    p = clock_judge();
  return p == CLOCK_KERNEL ? kernel_clock(c, ts) : clock_gettime(c, ts);
}

int throttle__clock_gettime(clockid_t c, struct timespec *ts) {
  return read_clock(c, ts);
}

static uint64_t remember(_Atomic uint64_t *seen, const struct timespec *ts) {
  uint64_t v = (uint64_t)ts->tv_sec * UINT64_C(1000000000) +
               (uint64_t)ts->tv_nsec;
  if (v >= atomic_load_explicit(seen, memory_order_relaxed) +
               THROTTLE__NS_PER_MS)
    atomic_store_explicit(seen, v, memory_order_relaxed);
  return v;
}

uint64_t throttle__now_ns(void) {
  struct timespec ts;
  if (THROTTLE__SYS(CLOCK, -1, read_clock(CLOCK_BOOTTIME, &ts)) == 0 ||
      THROTTLE__SYS(CLOCK, -1, read_clock(CLOCK_MONOTONIC, &ts)) == 0)
    return remember(&seen_now, &ts);
  return atomic_load_explicit(&seen_now, memory_order_relaxed);
}

uint64_t throttle__mono_ns(void) {
  struct timespec ts;
  if (THROTTLE__SYS(CLOCK, -1, read_clock(CLOCK_MONOTONIC, &ts)) == 0)
    return remember(&seen_mono, &ts);
  return atomic_load_explicit(&seen_mono, memory_order_relaxed);
}

/* CLOCK_MONOTONIC at the instant the throttle clock read now, from the
 * difference of the two clocks (the time the host spent suspended) that
 * this thread measured at most OFFSET_TTL_NS of throttle time ago: a grant
 * stamps its lease's start this way, one clock reading fewer per
 * admission.  The difference only grows (a suspend adds to it), and it is
 * measured with the throttle clock read first, so a remembered one is never
 * too large: the estimate is never earlier than the true reading, and a
 * lease never lapses early.  A suspend since the measurement makes it late
 * by that suspend, and a suspend longer than OFFSET_TTL_NS forces a new
 * measurement: a lease starts at most that late, and the reap clamps any
 * start in the future (gate_enter.c).  Per thread: no shared word to race on. */
#define OFFSET_TTL_NS (1000 * THROTTLE__NS_PER_MS)
static THROTTLE__TLS uint64_t off_at, off_ns; /* off_at 0: none yet */

uint64_t throttle__mono_at(uint64_t now) {
  if (off_at != 0 && now >= off_at && now - off_at < OFFSET_TTL_NS &&
      now >= off_ns)
    return now - off_ns;
  struct timespec ts;
  if (THROTTLE__SYS(CLOCK, -1, read_clock(CLOCK_MONOTONIC, &ts)) != 0) {
    off_at = 0; /* no reading to measure with: the fallback, and again */
    return throttle__mono_ns();
  }
  uint64_t mono = remember(&seen_mono, &ts);
  /* now was read first, so now - mono is at most the true difference; a
   * host never suspended has a difference of 0, which the later reading
   * of mono can make "negative": 0 then, the estimate again never early. */
  off_ns = now > mono ? now - mono : 0;
  off_at = now;
  return mono;
}

/* The throttle clock from the kernel's last tick: CLOCK_MONOTONIC_COARSE
 * (a memory read in the vDSO, a tenth of a precise reading here) plus
 * this thread's difference of the two clocks (throttle__mono_at).  Never
 * ahead of the true reading: the coarse clock lags it by up to a tick
 * (1 to 4 ms), and the difference is never too large.  For a stamp that
 * decides nothing (a key's last use); the precise reading when no
 * difference was measured within OFFSET_TTL_NS. */
uint64_t throttle__now_coarse_ns(void) {
  struct timespec ts;
  if (off_at != 0 &&
      THROTTLE__SYS(CLOCK, -1, read_clock(CLOCK_MONOTONIC_COARSE, &ts)) ==
          0) {
    uint64_t v = (uint64_t)ts.tv_sec * UINT64_C(1000000000) +
                 (uint64_t)ts.tv_nsec + off_ns;
    if (v < throttle__sat_add(off_at, OFFSET_TTL_NS))
      return v;
  }
  return throttle__now_ns();
}

uint64_t throttle__sat_add(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Shared (not FUTEX_PRIVATE) waits: the word lives in a MAP_SHARED segment
 * and the waker is usually another process. */
int throttle__futex_wait(_Atomic uint32_t *word, uint32_t expect,
                         uint64_t rel_ns) {
  struct timespec ts;
  if (rel_ns > UINT64_C(86400) * 1000000000u)
    rel_ns = UINT64_C(86400) * 1000000000u;
  ts.tv_sec = (time_t)(rel_ns / 1000000000u);
  ts.tv_nsec = (long)(rel_ns % 1000000000u);
  /* Every caller re-checks after a wait, so an early return (EINTR, or a
   * test's injected fault) costs a loop, never a wrong answer. */
  if (THROTTLE__FAULT(FUTEX))
    return EINTR;
  if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL,
              0) != 0 &&
      errno == EINTR)
    return EINTR;
  return 0;
}

/* The interrupt check runs before the first slice (a caller already told
 * to stop does not sleep at all), after every slice and after a signal.
 * The slices are counted as well as timed: with no clock (clock.c above)
 * the count still ends the sleep, and an early end only makes the caller
 * look again.  Rejected: a signal of our own to cut the sleep short (the
 * library would then own a signal number and its handler, which belong to
 * the application). */
int throttle__sleep(const throttle_t *h, _Atomic uint32_t *word,
                    uint32_t expect, uint64_t rel_ns) {
  if (h->intr == NULL) {
    throttle__futex_wait(word, expect, rel_ns);
    return 0;
  }
  uint64_t period = h->intr_period_ns;
  uint64_t end = throttle__sat_add(throttle__mono_ns(), rel_ns);
  uint64_t slices = rel_ns / period + 2;
  for (uint64_t i = 0;; i++) {
    if (h->intr(h->intr_arg) != 0)
      return THROTTLE_EINTR;
    uint64_t now = throttle__mono_ns();
    if (i >= slices || now >= end ||
        atomic_load_explicit(word, memory_order_acquire) != expect)
      return 0;
    uint64_t slice = end - now < period ? end - now : period;
    throttle__futex_wait(word, expect, slice);
  }
}

void throttle__futex_wake(_Atomic uint32_t *word) {
  /* A lost wake makes a sleeper late (until its own time or re-check
   * interval runs out), never early. */
  if (THROTTLE__FAULT(FUTEX))
    return;
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Per thread: jitter must not make the threads of one process agree. */
uint64_t throttle__random(void) {
  static THROTTLE__TLS uint64_t s;
  return throttle__rng_next(&s);
}
