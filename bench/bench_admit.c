/* SPDX-License-Identifier: MIT */
/*
 * bench_admit.c — the cost of an uncontended admission: throttle_enter() +
 * throttle_leave(THROTTLE_OUTCOME_OK) on an open key that no other process
 * uses, as a ratio to one clock_gettime(CLOCK_MONOTONIC) measured in the
 * same round, and the system calls one such pair makes.
 *
 * Time.  ROUNDS rounds; each measures the baseline right before the pairs,
 * and the figure is the median of the per-round ratios (a noisy neighbour
 * moves both sides of a ratio together), as bench_backoff does.  Each side
 * is timed twice: on CLOCK_MONOTONIC (wall) and on this thread's CPU clock
 * (CLOCK_THREAD_CPUTIME_ID, read once before and once after a loop).  The
 * target is judged on CPU time: on a shared machine a round's wall time
 * also counts the slices other processes ran in, which land on one side of
 * a ratio or the other at random (the wall ratio of one run went from 7 to
 * 22 x between rounds); CPU time is the cost of the call.  On an idle
 * machine the two agree, and both are printed.
 *
 * System calls.  They are counted, not inferred from time: a forked child
 * asks to be traced (PTRACE_TRACEME) and the parent stops it at every
 * system-call entry (PTRACE_SYSCALL) and reads the call's number with
 * PTRACE_GET_SYSCALL_INFO, which is the same on every architecture.  The
 * child brackets COUNT_PAIRS pairs between two marker calls (getpriority
 * with a "which" no caller uses), after warm-up pairs, so opening the
 * segment and the first use of the key are not counted.  A call served by
 * the vDSO (clock_gettime) is no system call and is not counted, as it
 * should not be.  The counter checks itself first: COUNT_PAIRS getppid()
 * calls between the same markers must count as exactly COUNT_PAIRS.  Rejected:
 * `strace -c -f` around the whole program (counts the open and the timing
 * rounds too, and needs strace installed); getrusage() (sees context switches,
 * not system calls); perf (the counters are often not permitted on a shared
 * VM); a seccomp filter that traps every call (the trap handler must then
 * re-issue the call itself). Where ptrace is not permitted the count is
 * reported as unknown, with why.
 *
 * Target: <= 8 x clock_gettime and 0 system calls per pair; the last line
 * says whether it is met.  Exit 1 means the benchmark could not run.
 */
#include "bench_util.h"
#include "throttle.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 31
#define ITERS 20000
#define WARM_PAIRS 100
#define COUNT_PAIRS 1000
#define MARK_WHICH 0x7ead /* getpriority(which = this): EINVAL, a marker */
#define KEY "hotdata:ws1/orders"
#define TARGET_RATIO 8.0

static int pairs(throttle_t *h, int n) {
  for (int i = 0; i < n; i++) {
    throttle_ticket_t *t;
    int rc = throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t);
    if (rc == 0)
      rc = throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
    if (rc != 0) {
      fprintf(stderr, "bench_admit: enter/leave: %s (%s)\n",
              throttle_strerror(rc), throttle_errmsg(h));
      return -1;
    }
  }
  return 0;
}

static double cpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* One round: ns per clock_gettime(CLOCK_MONOTONIC) and per pair, on the
 * wall clock and on this thread's CPU clock. */
struct round {
  double base, pair, base_cpu, pair_cpu;
};

static struct round time_round(throttle_t *h) {
  struct round r;
  double c0 = cpu_now_ns();
  r.base = bench_time_clock(CLOCK_MONOTONIC, ITERS);
  double c1 = cpu_now_ns();
  double t0 = bench_now_ns();
  if (pairs(h, ITERS) != 0)
    exit(1);
  double t1 = bench_now_ns();
  double c2 = cpu_now_ns();
  r.base_cpu = (c1 - c0) / ITERS;
  r.pair = (t1 - t0) / ITERS;
  r.pair_cpu = (c2 - c1) / ITERS;
  return r;
}

/* ---- counting system calls ------------------------------------------ */

/* The calls the admission path is known to make or might make, by name;
 * any other is printed by number. */
static const struct {
  long nr;
  const char *name;
} known[] = {
    {SYS_getpid, "getpid"},
    {SYS_gettid, "gettid"},
    {SYS_futex, "futex"},
    {SYS_clock_gettime, "clock_gettime"},
    {SYS_kill, "kill"},
    {SYS_openat, "openat"},
    {SYS_read, "read"},
    {SYS_close, "close"},
    {SYS_sched_yield, "sched_yield"},
    {SYS_clock_nanosleep, "clock_nanosleep"},
};
#define NKNOWN (int)(sizeof known / sizeof known[0])
#define MAXNR 1024

enum { CHILD_NO_TRACE = 3, CHILD_BENCH_FAILED = 4 };

/* calibrate: between the markers, COUNT_PAIRS getppid() calls (each one
 * system call) instead of the pairs, to check the counter itself. */
static void traced_child(const char *seg, int calibrate) {
  if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
    _exit(CHILD_NO_TRACE);
  raise(SIGSTOP); /* the parent sets its options, then lets us go */
  throttle_t *h = bench_open("bench_admit", seg, 0);
  if (h == NULL || pairs(h, WARM_PAIRS) != 0)
    _exit(CHILD_BENCH_FAILED);
  int rc = 0;
  syscall(SYS_getpriority, MARK_WHICH, 0);
  if (calibrate)
    for (int i = 0; i < COUNT_PAIRS; i++)
      syscall(SYS_getppid);
  else
    rc = pairs(h, COUNT_PAIRS);
  syscall(SYS_getpriority, MARK_WHICH, 0);
  throttle_close(h);
  _exit(rc == 0 ? 0 : CHILD_BENCH_FAILED);
}

/* Count the child's system calls between the markers into counts[]; 0 on
 * success, else -1 with why in *why. */
static int count_syscalls(const char *seg, int calibrate, unsigned long *counts,
                          unsigned long *other, const char **why) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    *why = "fork failed";
    return -1;
  }
  if (pid == 0)
    traced_child(seg, calibrate);
  int st, inside = 0, marks = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFSTOPPED(st)) {
    *why = WIFEXITED(st) && WEXITSTATUS(st) == CHILD_NO_TRACE
               ? "ptrace is not permitted here"
               : "the traced child did not stop";
    if (!WIFEXITED(st))
      kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  if (ptrace(PTRACE_SETOPTIONS, pid, NULL,
             (void *)(long)(PTRACE_O_TRACESYSGOOD | PTRACE_O_EXITKILL)) != 0) {
    *why = "PTRACE_SETOPTIONS failed";
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  *why = NULL;
  int sig = 0;
  for (;;) {
    if (ptrace(PTRACE_SYSCALL, pid, NULL, (void *)(long)sig) != 0)
      break;
    sig = 0;
    if (waitpid(pid, &st, 0) != pid)
      break;
    if (WIFEXITED(st) || WIFSIGNALED(st))
      break;
    if (!WIFSTOPPED(st))
      continue;
    if (WSTOPSIG(st) != (SIGTRAP | 0x80)) {
      sig = WSTOPSIG(st); /* a real signal: deliver it */
      continue;
    }
    struct __ptrace_syscall_info info; /* glibc >= 2.31 */
    long n = ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof info, &info);
    if (n <= 0) {
      *why = "PTRACE_GET_SYSCALL_INFO is not supported (Linux < 5.3)";
      kill(pid, SIGKILL);
      break;
    }
    if (info.op != PTRACE_SYSCALL_INFO_ENTRY)
      continue;
    long nr = (long)info.entry.nr;
    if (nr == SYS_getpriority && info.entry.args[0] == MARK_WHICH) {
      inside = ++marks == 1;
      continue;
    }
    if (inside) {
      if (nr >= 0 && nr < MAXNR)
        counts[nr]++;
      else
        (*other)++;
    }
  }
  waitpid(pid, &st, 0);
  if (*why != NULL)
    return -1;
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || marks != 2) {
    *why = "the traced child failed";
    return -1;
  }
  return 0;
}

int main(void) {
  char seg[64];
  snprintf(seg, sizeof seg, "/thr-admit-%d", (int)getpid());
  throttle_unlink(seg);
  throttle_t *h = bench_open("bench_admit", seg, 0);
  if (h == NULL || pairs(h, WARM_PAIRS) != 0)
    return 1;
  double ns[ROUNDS], base[ROUNDS], ratio[ROUNDS];
  double ns_cpu[ROUNDS], base_cpu[ROUNDS], ratio_cpu[ROUNDS];
  for (int k = 0; k < ROUNDS; k++) {
    struct round rd = time_round(h);
    base[k] = rd.base;
    ns[k] = rd.pair;
    ratio[k] = rd.pair / rd.base;
    base_cpu[k] = rd.base_cpu;
    ns_cpu[k] = rd.pair_cpu;
    ratio_cpu[k] = rd.pair_cpu / rd.base_cpu;
  }
  throttle_close(h);

  /* First the counter's own check: COUNT_PAIRS getppid() calls must be
   * counted as exactly that, or no count is printed. */
  static unsigned long check[MAXNR], counts[MAXNR];
  unsigned long other = 0, total = 0;
  const char *why;
  int counted = count_syscalls(seg, 1, check, &other, &why) == 0;
  for (int nr = 0; nr < MAXNR; nr++)
    total += check[nr];
  if (counted && (other != 0 || total != COUNT_PAIRS ||
                  check[SYS_getppid] != COUNT_PAIRS)) {
    counted = 0;
    why = "the counter's check did not count 1 call per getppid()";
  }
  other = 0;
  if (counted)
    counted = count_syscalls(seg, 0, counts, &other, &why) == 0;
  throttle_unlink(seg);

  double r = bench_median(ratio_cpu, ROUNDS);
  printf("uncontended throttle_enter + throttle_leave(OK) on an open key, "
         "one process, default (auto) cap\n");
  printf("  median of %d rounds of %d pairs; baseline clock_gettime("
         "CLOCK_MONOTONIC) measured in the same round\n",
         ROUNDS, ITERS);
  printf("  CPU time: clock_gettime %.1f ns; pair %.1f ns = %.1f x "
         "clock_gettime (target <= %.0f x)\n",
         bench_median(base_cpu, ROUNDS), bench_median(ns_cpu, ROUNDS), r,
         TARGET_RATIO);
  printf("  wall time: clock_gettime %.1f ns; pair %.1f ns = %.1f x "
         "clock_gettime\n",
         bench_median(base, ROUNDS), bench_median(ns, ROUNDS),
         bench_median(ratio, ROUNDS));
  if (!counted) {
    printf("syscalls per pair: unknown (%s)\n", why);
    return 0;
  }
  total = other;
  for (int nr = 0; nr < MAXNR; nr++)
    total += counts[nr];
  printf("syscalls per pair: %.2f (counted with ptrace over %d pairs, the "
         "counter checked on %d getppid(); target 0)",
         (double)total / COUNT_PAIRS, COUNT_PAIRS, COUNT_PAIRS);
  const char *sep = ": ";
  for (int nr = 0; nr < MAXNR; nr++) {
    if (counts[nr] == 0)
      continue;
    const char *name = NULL;
    for (int k = 0; k < NKNOWN; k++)
      if (known[k].nr == nr)
        name = known[k].name;
    if (name != NULL)
      printf("%s%s %.2f", sep, name, (double)counts[nr] / COUNT_PAIRS);
    else
      printf("%s#%d %.2f", sep, nr, (double)counts[nr] / COUNT_PAIRS);
    sep = ", ";
  }
  if (other != 0)
    printf("%sother %.2f", sep, (double)other / COUNT_PAIRS);
  printf("\n");
  printf("<= %.0f x clock_gettime (CPU time) and 0 system calls per pair: "
         "%s\n",
         TARGET_RATIO, r <= TARGET_RATIO && total == 0 ? "met" : "NOT met");
  return 0;
}
