/* SPDX-License-Identifier: MIT */
/*
 * bench_fleet.c — a fleet of loader processes writing into one table of a
 * stand-in server, with five retry strategies side by side, and the
 * hand-over latency of a cap-1 key against a plain futex wake.
 *
 * The server.  One table whose writes are serialised, in an anonymous
 * MAP_SHARED mapping made before forking and guarded by a process-shared
 * mutex of its own (it is the server, not libthrottle).  A write arriving
 * while the table lock is free takes it; the loader then sleeps S (the
 * request in flight) and releases it.  A write arriving while the lock is
 * held (by another write, or by an external hold) is refused "409
 * RESOURCE_LOCKED, Retry-After R", and the server records that it told the
 * fleet "come back at now + R".  A request arriving more than TOL before the
 * latest such time is "early": it is what I1 forbids.  Time is scaled down
 * 50 times: R = 5 s becomes 100 ms, a 1 s write 20 ms.
 *
 * The loaders.  N processes share a job counter; each takes the next job
 * until none is left.  A job retries until it succeeds or gives up (50
 * attempts, or a deadline of 30 s scaled, 600 ms, from the job's start; a
 * strategy that would sleep past the deadline gives up at once).  Strategies:
 *
 *   a  linear back-off 1.5 s x attempt (30 ms x attempt), Retry-After ignored
 *   b  each process alone honours Retry-After, plus up to 50 % jitter
 *   c  throttle_wait() before each attempt, throttle_backoff(R) on a refusal
 *   d  throttle_enter() / throttle_leave(), learned ("auto") cap
 *   e  throttle_enter() / throttle_leave(), throttle_set_max_parallel(1)
 *
 * Every run has its own server and its own fresh segment, so no run sees
 * another's learned state.  The 15 runs (strategy x N) of one scenario run
 * at the same time, each against its own server: the loaders spend nearly
 * all their time asleep (the whole benchmark uses well under a second of
 * CPU), so they do not compete for the CPU in any way that shows at the
 * 1 ms scale measured here, and one at a time takes about two minutes.
 * `bench_fleet --serial` runs them one at a time, to check that claim.
 *
 * Scenarios: (1) the fleet's own contention; (2) the table locked by
 * somebody else for 20 x R from the instant the loaders start.  The hold
 * (2 s) outlasts a job's budget (600 ms), as 100 s outlasts 30 s in real
 * time, so jobs started during it give up under every strategy; what tells
 * the strategies apart there is how many refused and early requests they
 * send meanwhile.
 *
 * Hand-over: with a cap of 1, the time from a holder's throttle_leave()
 * call to the next holder returning from throttle_enter(), against the same
 * hand-over done with a bare futex wake and with a pipe write->read wake.
 *
 * Nothing is checked here (make check does that); exit 1 means the
 * benchmark itself could not run (open, fork, an unexpected error code).
 */
#include "bench_util.h"
#include "throttle.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MS UINT64_C(1000000)
#define US UINT64_C(1000)

/* Scaled-down server and client parameters (real value / 50). */
#define S_NS (20 * MS)          /* service time of one write (1 s) */
#define R_MS UINT64_C(100)      /* Retry-After (5 s) */
#define R_NS (R_MS * MS)
#define TOL_NS (1 * MS)         /* an arrival this close to the time is on time */
#define RACE_NS (2 * MS)        /* see "early<2ms" in the legend */
#define LINEAR_NS (30 * MS)     /* strategy a: 1.5 s x attempt */
#define ATTEMPTS 50
#define DEADLINE_NS (600 * MS)  /* 30 s */
#define HOLD_NS (20 * R_NS)     /* scenario 2: external hold */

#define JOBS_OWN 200
#define JOBS_HOLD 50

#define KEY "hotdata:ws1/orders"

enum { STRAT_A, STRAT_B, STRAT_C, STRAT_D, STRAT_E, NSTRAT };
static const char *const strat_name[NSTRAT] = {
    "a linear 30ms*k", "b retry-after+jitter", "c throttle_backoff",
    "d enter/leave auto", "e enter/leave cap 1"};

static const int fleet_sizes[] = {4, 8, 16};
#define NSIZES (int)(sizeof fleet_sizes / sizeof fleet_sizes[0])
#define MAXN 16

/* ---- clock and sleeping ---------------------------------------------- */

/* The library's clock: every timestamp here is comparable with its own. */
static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
  struct timespec ts = {.tv_sec = (time_t)(t / 1000000000u),
                        .tv_nsec = (long)(t % 1000000000u)};
  while (clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

static void sleep_ns(uint64_t d) { sleep_until(now_ns() + d); }

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * UINT64_C(0x2545f4914f6cdd1d);
}

static long futex(_Atomic uint32_t *w, int op, uint32_t val) {
  return syscall(SYS_futex, (uint32_t *)w, op, val, NULL, NULL, 0);
}

/* ---- the stand-in server --------------------------------------------- */

struct server {
  pthread_mutex_t mu;
  int busy;               /* the table's write lock is held by a write */
  uint64_t hold_until;    /* held by somebody else until then */
  uint64_t advertised;    /* latest "come back at" told to anyone */
  uint64_t advertised_at; /* when it was told */
  uint64_t requests, ok, refused, early, early_race, worst_early_ns;
};

enum { REQ_OK, REQ_LOCKED };

static int server_request(struct server *s) {
  pthread_mutex_lock(&s->mu);
  uint64_t now = now_ns();
  s->requests++;
  if (s->advertised > now + TOL_NS) {
    s->early++;
    if (now - s->advertised_at < RACE_NS)
      s->early_race++;
    if (s->advertised - now > s->worst_early_ns)
      s->worst_early_ns = s->advertised - now;
  }
  int rc;
  if (s->busy || now < s->hold_until) {
    s->refused++;
    s->advertised = now + R_NS; /* R is constant, so this is the latest */
    s->advertised_at = now;
    rc = REQ_LOCKED;
  } else {
    s->busy = 1;
    s->ok++;
    rc = REQ_OK;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static void server_release(struct server *s) {
  pthread_mutex_lock(&s->mu);
  s->busy = 0;
  pthread_mutex_unlock(&s->mu);
}

/* ---- one run: a strategy, a fleet size, a scenario ------------------- */

struct run {
  struct server srv;
  int strategy, n, jobs;
  uint64_t hold_ns;
  char seg[64];
  _Atomic uint64_t t0; /* 0 until the parent says go */
  _Atomic uint32_t next_job;
  _Atomic uint32_t failed;
  _Atomic uint64_t last_end;
  pid_t pid[MAXN];
};

static void die_child(const char *what, throttle_t *h, int rc) {
  fprintf(stderr, "bench_fleet: %s: %s (%s)\n", what, throttle_strerror(rc),
          h ? throttle_errmsg(h) : "");
  _exit(1);
}

static uint64_t ms_until(uint64_t deadline) {
  uint64_t now = now_ns();
  return deadline > now ? (deadline - now) / MS : 0;
}

/* One job; 1 when it succeeded, 0 when it gave up. */
static int job(struct run *r, throttle_t *h, uint64_t *rng) {
  uint64_t deadline = now_ns() + DEADLINE_NS;
  for (int attempt = 1; attempt <= ATTEMPTS; attempt++) {
    throttle_ticket_t *t = NULL;
    int rc;
    if (attempt > 1 && now_ns() >= deadline)
      return 0;
    if (r->strategy == STRAT_C) {
      rc = throttle_wait(h, KEY, ms_until(deadline));
      if (rc == THROTTLE_ETIMEDOUT)
        return 0;
      if (rc != 0)
        die_child("throttle_wait", h, rc);
    } else if (r->strategy >= STRAT_D) {
      rc = throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, ms_until(deadline), &t);
      if (rc == THROTTLE_ETIMEDOUT)
        return 0;
      if (rc != 0)
        die_child("throttle_enter", h, rc);
    }
    if (server_request(&r->srv) == REQ_OK) {
      sleep_ns(S_NS);
      server_release(&r->srv);
      if (t != NULL && (rc = throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0)))
        die_child("throttle_leave", h, rc);
      return 1;
    }
    /* 409 RESOURCE_LOCKED, Retry-After R */
    if (t != NULL) {
      if ((rc = throttle_leave(h, t, THROTTLE_OUTCOME_LOCKED, R_MS)) != 0)
        die_child("throttle_leave", h, rc);
    } else if (r->strategy == STRAT_C) {
      if ((rc = throttle_backoff(h, KEY, R_MS)) != 0)
        die_child("throttle_backoff", h, rc);
    } else {
      uint64_t d = r->strategy == STRAT_A
                       ? LINEAR_NS * (uint64_t)attempt
                       : R_NS + rng_next(rng) % (R_NS / 2 + 1);
      if (now_ns() + d > deadline)
        return 0;
      sleep_ns(d);
    }
  }
  return 0;
}

static void loader(struct run *r, int idx) {
  throttle_t *h = NULL;
  if (r->strategy >= STRAT_C &&
      (h = bench_open("bench_fleet", r->seg, THROTTLE_NO_CREATE)) == NULL)
    _exit(1);
  uint64_t rng = UINT64_C(0x9e3779b97f4a7c15) ^
                 ((uint64_t)(r->strategy * 64 + r->n) << 32) ^ (uint64_t)idx;
  uint64_t t0;
  while ((t0 = atomic_load_explicit(&r->t0, memory_order_acquire)) == 0)
    sleep_ns(MS);
  sleep_until(t0);
  for (;;) {
    uint32_t j = atomic_fetch_add(&r->next_job, 1);
    if (j >= (uint32_t)r->jobs)
      break;
    if (!job(r, h, &rng))
      atomic_fetch_add(&r->failed, 1);
    uint64_t end = now_ns(), cur = atomic_load(&r->last_end);
    while (end > cur && !atomic_compare_exchange_weak(&r->last_end, &cur, end))
      ;
  }
  throttle_close(h);
  _exit(0);
}

static void kill_started(struct run **runs, int nruns) {
  for (int k = 0; k < nruns; k++)
    for (int i = 0; i < runs[k]->n; i++)
      if (runs[k]->pid[i] > 0) {
        kill(runs[k]->pid[i], SIGKILL);
        waitpid(runs[k]->pid[i], NULL, 0);
      }
}

static int g_seq;

static void prepare(struct run *r, int strategy, int n, int jobs,
                    uint64_t hold) {
  memset(r, 0, sizeof *r);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  if (pthread_mutex_init(&r->srv.mu, &a) != 0) {
    fprintf(stderr, "bench_fleet: pthread_mutex_init failed\n");
    exit(1);
  }
  pthread_mutexattr_destroy(&a);
  r->strategy = strategy;
  r->n = n;
  r->jobs = jobs;
  r->hold_ns = hold;
  snprintf(r->seg, sizeof r->seg, "/thr-fleet-%d-%d", (int)getpid(), g_seq++);
  if (strategy < STRAT_C)
    return;
  throttle_unlink(r->seg);
  throttle_t *h = bench_open("bench_fleet", r->seg, 0);
  if (h == NULL)
    exit(1);
  if (strategy == STRAT_E) {
    int rc = throttle_set_max_parallel(h, KEY, 1);
    if (rc != 0) {
      fprintf(stderr, "bench_fleet: set_max_parallel: %s\n",
              throttle_errmsg(h));
      exit(1);
    }
  }
  throttle_close(h);
}

/* Run the given runs at the same time and wait for all of them. */
static void run_group(struct run **runs, int nruns) {
  fflush(stdout);
  fflush(stderr);
  for (int k = 0; k < nruns; k++)
    for (int i = 0; i < runs[k]->n; i++) {
      pid_t p = fork();
      if (p < 0) {
        perror("bench_fleet: fork");
        kill_started(runs, nruns);
        exit(1);
      }
      if (p == 0)
        loader(runs[k], i);
      runs[k]->pid[i] = p;
    }
  /* Everyone has forked and opened by now or soon; the margin covers it. */
  uint64_t t0 = now_ns() + 30 * MS;
  for (int k = 0; k < nruns; k++) {
    pthread_mutex_lock(&runs[k]->srv.mu);
    runs[k]->srv.hold_until = runs[k]->hold_ns ? t0 + runs[k]->hold_ns : 0;
    pthread_mutex_unlock(&runs[k]->srv.mu);
    atomic_store_explicit(&runs[k]->t0, t0, memory_order_release);
  }
  int bad = 0;
  for (int k = 0; k < nruns; k++)
    for (int i = 0; i < runs[k]->n; i++) {
      int st;
      if (waitpid(runs[k]->pid[i], &st, 0) < 0 || !WIFEXITED(st) ||
          WEXITSTATUS(st) != 0)
        bad = 1;
      runs[k]->pid[i] = 0;
    }
  for (int k = 0; k < nruns; k++)
    if (runs[k]->strategy >= STRAT_C)
      throttle_unlink(runs[k]->seg);
  if (bad) {
    fprintf(stderr, "bench_fleet: a loader failed\n");
    exit(1);
  }
}

static void print_row(const char *scen, const struct run *r) {
  const struct server *s = &r->srv;
  uint64_t t0 = atomic_load(&r->t0);
  uint64_t end = atomic_load(&r->last_end);
  double makespan = end > t0 ? (double)(end - t0) / 1e6 : 0;
  double ideal = (double)((uint64_t)r->jobs * S_NS + r->hold_ns) / 1e6;
  printf("%-5s %-21s %3d %5d %6llu %7llu %6llu %9llu %9.1f %6u %9.0f %7.0f "
         "%7.2f\n",
         scen, strat_name[r->strategy], r->n, r->jobs,
         (unsigned long long)s->requests, (unsigned long long)s->refused,
         (unsigned long long)s->early, (unsigned long long)s->early_race,
         (double)s->worst_early_ns / 1e6, (unsigned)atomic_load(&r->failed),
         makespan, ideal, makespan / ideal);
}

static void fleet(int serial) {
  static const struct {
    const char *name;
    int jobs;
    uint64_t hold;
  } scen[] = {{"own", JOBS_OWN, 0}, {"hold", JOBS_HOLD, HOLD_NS}};
  enum { NRUNS = NSTRAT * NSIZES };
  struct run *runs =
      mmap(NULL, sizeof(struct run) * NRUNS, PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (runs == MAP_FAILED) {
    perror("bench_fleet: mmap");
    exit(1);
  }
  printf("fleet: one serialised table; S = %llu ms per write, 409 "
         "Retry-After R = %llu ms (real 1 s and 5 s, scaled 1/50)\n",
         (unsigned long long)(S_NS / MS), (unsigned long long)R_MS);
  printf("  job budget %d attempts or %llu ms from its start (30 s scaled); "
         "early = arrived > %llu ms before the latest advertised time\n",
         ATTEMPTS, (unsigned long long)(DEADLINE_NS / MS),
         (unsigned long long)(TOL_NS / MS));
  printf("  scenario own: %d jobs; scenario hold: %d jobs, table held "
         "externally for %llu ms from t=0; ideal = jobs x S + hold\n",
         JOBS_OWN, JOBS_HOLD, (unsigned long long)(HOLD_NS / MS));
  printf("  the hold outlasts a job's budget: jobs started during it give up "
         "under every strategy\n");
  printf("  %s; each run has its own server and segment\n",
         serial ? "runs one at a time (--serial)"
                : "the 15 runs of one scenario run at the same time");
  printf("  early<2ms: early requests that arrived within 2 ms of the "
         "refusal that set the\n    advertised time (sent before the refused "
         "loader could have published it)\n");
  printf("  x ideal below 1: jobs were given up (failed) rather than "
         "written\n\n");
  printf("%-5s %-21s %3s %5s %6s %7s %6s %9s %9s %6s %9s %7s %7s\n", "scen",
         "strategy", "N", "jobs", "reqs", "refused", "early", "early<2ms",
         "worst ms", "failed", "makespan", "ideal", "x ideal");
  for (size_t sc = 0; sc < sizeof scen / sizeof scen[0]; sc++) {
    struct run *group[NRUNS];
    for (int ni = 0; ni < NSIZES; ni++)
      for (int k = 0; k < NSTRAT; k++) {
        struct run *r = &runs[ni * NSTRAT + k];
        group[ni * NSTRAT + k] = r;
        prepare(r, k, fleet_sizes[ni], scen[sc].jobs, scen[sc].hold);
      }
    if (serial)
      for (int k = 0; k < NRUNS; k++)
        run_group(&group[k], 1);
    else
      run_group(group, NRUNS);
    for (int k = 0; k < NRUNS; k++) {
      print_row(scen[sc].name, group[k]);
      pthread_mutex_destroy(&group[k]->srv.mu);
    }
    fflush(stdout);
  }
  munmap(runs, sizeof(struct run) * NRUNS);
}

/* ---- hand-over latency ----------------------------------------------- */

#define HO_ROUNDS 3
#define HO_WARM 20
#define HO_N 200
#define HO_HOLD_NS (1 * MS) /* long enough for the others to be asleep */
#define HO_MAXP 4

enum { HO_FUTEX, HO_PIPE, HO_THROTTLE };

struct handover {
  _Atomic uint64_t leave_ns; /* when the last holder started to let go */
  _Atomic int32_t leave_who;
  _Atomic uint32_t count;
  _Atomic uint32_t token; /* futex baseline: whose turn */
  uint64_t lat[HO_WARM + HO_N];
};

/* A new holder: record the latency from the previous holder's release. */
static int ho_record(struct handover *ho, int me) {
  uint64_t now = now_ns();
  uint64_t ls = atomic_exchange(&ho->leave_ns, 0);
  int32_t who = atomic_load(&ho->leave_who);
  if (ls != 0 && who != me) {
    uint32_t i = atomic_fetch_add(&ho->count, 1);
    if (i < HO_WARM + HO_N)
      ho->lat[i] = now - ls;
  }
  return atomic_load(&ho->count) >= HO_WARM + HO_N;
}

static void ho_release_mark(struct handover *ho, int me) {
  atomic_store(&ho->leave_who, me);
  atomic_store(&ho->leave_ns, now_ns());
}

static void ho_throttle(struct handover *ho, const char *seg, int me) {
  throttle_t *h = bench_open("bench_fleet", seg, THROTTLE_NO_CREATE);
  if (h == NULL)
    _exit(1);
  for (;;) {
    throttle_ticket_t *t;
    int rc = throttle_enter(h, KEY, THROTTLE_CLASS_LIVE, THROTTLE_FOREVER, &t);
    if (rc != 0)
      die_child("throttle_enter", h, rc);
    int done = ho_record(ho, me);
    if (!done) {
      sleep_ns(HO_HOLD_NS);
      ho_release_mark(ho, me);
    }
    if ((rc = throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0)) != 0)
      die_child("throttle_leave", h, rc);
    if (done)
      break;
  }
  throttle_close(h);
  _exit(0);
}

static void ho_futex(struct handover *ho, int me, int np) {
  for (;;) {
    uint32_t v;
    while ((v = atomic_load(&ho->token)) != (uint32_t)me)
      futex(&ho->token, FUTEX_WAIT, v);
    int done = ho_record(ho, me);
    if (!done) {
      sleep_ns(HO_HOLD_NS);
      ho_release_mark(ho, me);
    }
    atomic_store(&ho->token, (uint32_t)((me + 1) % np));
    futex(&ho->token, FUTEX_WAKE, INT_MAX);
    if (done)
      break;
  }
  _exit(0);
}

/* Two processes pass a byte back and forth: p[0] carries 0 -> 1. */
static void ho_pipe(struct handover *ho, int fds[2][2], int me) {
  int in = fds[1 - me][0], out = fds[me][1];
  char c = 0;
  if (me == 1 && read(in, &c, 1) != 1)
    _exit(1);
  for (;;) {
    int done = ho_record(ho, me);
    if (!done) {
      sleep_ns(HO_HOLD_NS);
      ho_release_mark(ho, me);
    }
    if (write(out, &c, 1) != 1)
      _exit(1);
    if (done)
      break;
    if (read(in, &c, 1) != 1)
      break; /* the other side finished and closed */
  }
  _exit(0);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* One round of HO_N hand-overs of one mechanism between np processes; the
 * latencies (warm-up dropped) are appended to out. */
static void ho_run(int kind, int np, uint64_t *out) {
  struct handover *ho = mmap(NULL, sizeof *ho, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (ho == MAP_FAILED) {
    perror("bench_fleet: mmap");
    exit(1);
  }
  char seg[64];
  snprintf(seg, sizeof seg, "/thr-fleet-%d-ho%d", (int)getpid(), g_seq++);
  int fds[2][2];
  if (kind == HO_THROTTLE) {
    throttle_unlink(seg);
    throttle_t *h = bench_open("bench_fleet", seg, 0);
    if (h == NULL || throttle_set_max_parallel(h, KEY, 1) != 0) {
      fprintf(stderr, "bench_fleet: hand-over setup failed\n");
      exit(1);
    }
    throttle_close(h);
  }
  if (kind == HO_PIPE && (pipe(fds[0]) != 0 || pipe(fds[1]) != 0)) {
    perror("bench_fleet: pipe");
    exit(1);
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid[HO_MAXP];
  for (int i = 0; i < np; i++) {
    pid[i] = fork();
    if (pid[i] < 0) {
      perror("bench_fleet: fork");
      for (int k = 0; k < i; k++) {
        kill(pid[k], SIGKILL);
        waitpid(pid[k], NULL, 0);
      }
      exit(1);
    }
    if (pid[i] == 0) {
      if (kind == HO_THROTTLE)
        ho_throttle(ho, seg, i);
      else if (kind == HO_FUTEX)
        ho_futex(ho, i, np);
      else
        ho_pipe(ho, fds, i);
    }
  }
  if (kind == HO_PIPE)
    for (int i = 0; i < 2; i++) {
      close(fds[i][0]);
      close(fds[i][1]);
    }
  int bad = 0;
  for (int i = 0; i < np; i++) {
    int st;
    if (waitpid(pid[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      bad = 1;
  }
  if (kind == HO_THROTTLE)
    throttle_unlink(seg);
  if (bad || atomic_load(&ho->count) < HO_WARM + HO_N) {
    fprintf(stderr, "bench_fleet: hand-over run failed\n");
    exit(1);
  }
  memcpy(out, ho->lat + HO_WARM, sizeof(uint64_t) * HO_N);
  munmap(ho, sizeof *ho);
}

static void handover(void) {
  static const struct {
    int kind, np;
    const char *name;
  } m[] = {{HO_FUTEX, 2, "futex wake (baseline), 2 procs"},
           {HO_PIPE, 2, "pipe write -> read, 2 procs"},
           {HO_THROTTLE, 2, "throttle_leave -> throttle_enter, 2 procs"},
           {HO_THROTTLE, 4, "throttle_leave -> throttle_enter, 4 procs"}};
  enum { NM = sizeof m / sizeof m[0] };
  static uint64_t lat[NM][HO_ROUNDS * HO_N];
  double med[NM], p99[NM];
  /* Rounds interleave the mechanisms, so a slow spell of the machine hits
   * all of them alike rather than one. */
  for (int round = 0; round < HO_ROUNDS; round++)
    for (int i = 0; i < NM; i++)
      ho_run(m[i].kind, m[i].np, lat[i] + round * HO_N);
  for (int i = 0; i < NM; i++) {
    qsort(lat[i], HO_ROUNDS * HO_N, sizeof lat[i][0], cmp_u64);
    med[i] = (double)lat[i][HO_ROUNDS * HO_N / 2] / 1e3;
    p99[i] = (double)lat[i][HO_ROUNDS * HO_N * 99 / 100] / 1e3;
  }
  printf("\nhand-over latency, cap 1: from the holder starting to let go to "
         "the next holder running\n");
  printf("  %d hand-overs each (%d interleaved rounds of %d, after %d "
         "warm-up each), holder keeps it %llu ms;\n  baseline = bare futex "
         "wake between 2 processes, same run\n",
         HO_ROUNDS * HO_N, HO_ROUNDS, HO_N, HO_WARM,
         (unsigned long long)(HO_HOLD_NS / MS));
  printf("%-44s %10s %10s %9s %9s\n", "mechanism", "median us", "p99 us",
         "x median", "x p99");
  for (int i = 0; i < NM; i++)
    printf("%-44s %10.1f %10.1f %9.2f %9.2f\n", m[i].name, med[i], p99[i],
           med[i] / med[0], p99[i] / p99[0]);
}

int main(int argc, char **argv) {
  int serial = argc > 1 && strcmp(argv[1], "--serial") == 0;
  if (argc > 1 && !serial) {
    fprintf(stderr, "usage: bench_fleet [--serial]\n");
    return 64;
  }
  uint64_t start = now_ns();
  fleet(serial);
  handover();
  printf("\ntotal runtime %.1f s\n", (double)(now_ns() - start) / 1e9);
  return 0;
}
