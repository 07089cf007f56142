/* SPDX-License-Identifier: MIT */
/*
 * helpers.c — the shared test fixture (see helpers.h).
 *
 * Every test gets its own segment name, so tests never see each other's
 * state and a failed test leaves nothing behind for the next one: the
 * teardown kills and reaps its children and unlinks its segment.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "internal.h"
#include "redis_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned name_counter;

const char *th_test_tag(void) {
  const char *t = getenv("TH_TEST_TAG");
  if (t == NULL || *t == 0) {
    char buf[32];
    snprintf(buf, sizeof buf, "p%ld-", (long)getpid());
    setenv("TH_TEST_TAG", buf, 1);
    t = getenv("TH_TEST_TAG");
  }
  return t;
}

void th_unique_name(char *buf, size_t len) {
  snprintf(buf, len, "/tt-%s%ld-%u", th_test_tag(), (long)getpid(),
           ++name_counter);
}

void th_remove_tagged(void) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "tt-%s", th_test_tag());
  size_t n = strlen(prefix);
  DIR *d = opendir("/dev/shm");
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, prefix, n) == 0) {
      char name[300];
      snprintf(name, sizeof name, "/%s", e->d_name);
      shm_unlink(name);
    }
  closedir(d);
}

/* The variables throttle_open() and the crash points read: tests set them
 * on purpose only, and never leave them behind. */
static void clear_env(void) {
  unsetenv("THROTTLE_SEGMENT");
  unsetenv("THROTTLE_KEYS");
  unsetenv("THROTTLE_MAX_DELAY_MS");
  unsetenv("THROTTLE_CRASH_AT");
}

int th_setup(void **state) {
  clear_env();
  struct th_fx *fx = calloc(1, sizeof *fx);
  if (fx == NULL)
    return -1;
  th_unique_name(fx->name, sizeof fx->name);
  shm_unlink(fx->name); /* a pid reused from an earlier crashed run */
  fx->cfg = throttle_config_new();
  if (fx->cfg == NULL || throttle_config_set_segment(fx->cfg, fx->name) != 0 ||
      throttle_config_set_lock_timeout(fx->cfg, 2000) != 0) {
    throttle_config_free(fx->cfg);
    free(fx);
    return -1;
  }
  *state = fx;
  return 0;
}

int th_redis_setup(void **state, struct th_redis *r) {
  if (th_setup(state) != 0)
    return -1;
  memset(r, 0, sizeof *r);
  if (th_redis_start(r) != 0)
    return -1;
  struct th_fx *fx = *state;
  return throttle_config_set_backend(fx->cfg, r->url);
}

int th_redis_teardown(void **state, struct th_redis *r) {
  int rc = th_teardown(state);
  th_redis_cleanup(r);
  unsetenv("THROTTLE_LIVENESS_MS");
  unsetenv("THROTTLE_BACKEND");
  th_redis_module_again();
  return rc;
}

throttle_t *th_redis_host(struct th_fx *fx, const char *url, int *rc) {
  throttle_config_t *cfg = throttle_config_new();
  assert_non_null(cfg);
  assert_int_equal(throttle_config_set_segment(cfg, th_extra_name(fx)), 0);
  assert_int_equal(throttle_config_set_backend(cfg, url), 0);
  throttle_t *h = NULL;
  *rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  assert_non_null(h);
  return h;
}

throttle_t *th_redis_other_host(struct th_fx *fx, const char *url) {
  int rc;
  throttle_t *h = th_redis_host(fx, url, &rc);
  if (rc != 0)
    fail_msg("open: %s: %s", throttle_err_name(rc), throttle_errmsg(h));
  return h;
}

int th_teardown(void **state) {
  struct th_fx *fx = *state;
  if (fx == NULL)
    return 0;
  for (int i = 0; i < fx->nkids; i++) {
    kill(fx->kids[i], SIGKILL);
    while (waitpid(fx->kids[i], NULL, 0) < 0 && errno == EINTR)
      ;
  }
  fx->nkids = 0;
  throttle_close(fx->h);
  throttle_config_free(fx->cfg);
  shm_unlink(fx->name);
  for (int i = 0; i < fx->nextra; i++)
    shm_unlink(fx->extra[i]);
  /* and what the test's children named and could not remove (a child
   * that ends by _exit or exec runs no teardown) */
  th_remove_tagged();
  clear_env();
  free(fx);
  *state = NULL;
  return 0;
}

const char *th_extra_name(struct th_fx *fx) {
  assert_true(fx->nextra < 8);
  char *n = fx->extra[fx->nextra++];
  th_unique_name(n, sizeof fx->extra[0]);
  shm_unlink(n);
  return n;
}

throttle_t *th_open(struct th_fx *fx) {
  int rc = throttle_open(fx->cfg, &fx->h);
  if (rc != 0)
    print_error("throttle_open(%s): %s: %s\n", fx->name, throttle_err_name(rc),
                throttle_errmsg(fx->h));
  assert_int_equal(rc, 0);
  assert_non_null(fx->h);
  assert_int_equal(throttle_is_shared(fx->h), 1);
  return fx->h;
}

throttle_t *th_hold_only_slot(struct th_fx *fx, const char *key,
                              throttle_ticket_t **t) {
  throttle_t *h = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(h, key, 1), 0);
  assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, t), 0);
  return h;
}

int th_open_rc(struct th_fx *fx, throttle_t **out) {
  return throttle_open(fx->cfg, out);
}

static void forget(struct th_fx *fx, pid_t pid) {
  for (int i = 0; i < fx->nkids; i++)
    if (fx->kids[i] == pid) {
      fx->kids[i] = fx->kids[--fx->nkids];
      return;
    }
}

#ifdef TH_ASAN /* helpers.h */
/* AddressSanitizer's allocator (gcc 12, clang 14) takes no lock at fork:
 * a child forked while another thread of the parent is inside malloc or
 * free (a handle's heartbeat, talking to Redis) inherits that thread's
 * allocator lock held, and its first malloc of the same size class waits
 * for ever (seen: a child's close joining its own heartbeat, stuck in
 * ASan's allocator).  glibc's malloc locks its arenas around fork; under
 * ASan th_spawn makes sure instead: it forks only when every other thread
 * is asleep in a system call that holds no allocator lock, and lets the
 * child run only if none of them ran between the look and the fork
 * (same call, same count of context switches); else the child exits at
 * once and the fork is made again. */
struct th_task {
  long tid;
  char sc[24]; /* the first field of /proc/self/task/TID/syscall */
  unsigned long long sw; /* voluntary + involuntary context switches */
};

#define TH_TASKS 16

static int task_read(long tid, struct th_task *t) {
  char path[64], buf[512];
  t->tid = tid;
  snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  int ok = fscanf(f, "%23s", t->sc) == 1;
  fclose(f);
  snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
  if (!ok || (f = fopen(path, "r")) == NULL)
    return -1;
  t->sw = 0;
  while (fgets(buf, sizeof buf, f) != NULL) {
    unsigned long long n;
    if (sscanf(buf, "voluntary_ctxt_switches: %llu", &n) == 1 ||
        sscanf(buf, "nonvoluntary_ctxt_switches: %llu", &n) == 1)
      t->sw += n;
  }
  fclose(f);
  return 0;
}

/* The other threads; -1 if one is running, in a fault, or in a call that
 * may hold an allocator lock (mmap, munmap, mprotect, brk, madvise,
 * mremap), or if they cannot be read. */
static int tasks_quiet(struct th_task *t, int max) {
  DIR *d = opendir("/proc/self/task");
  if (d == NULL)
    return -1;
  long self = (long)gettid();
  int n = 0, quiet = 1;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    long tid = strtol(e->d_name, NULL, 10);
    if (tid <= 0 || tid == self)
      continue;
    if (n == max || task_read(tid, &t[n]) != 0) {
      quiet = 0;
      break;
    }
    char *end;
    long sc = strtol(t[n].sc, &end, 10);
    if (*end != '\0' || sc < 0 || sc == SYS_mmap || sc == SYS_munmap ||
        sc == SYS_mprotect || sc == SYS_brk || sc == SYS_madvise ||
        sc == SYS_mremap)
      quiet = 0;
    n++;
  }
  closedir(d);
  return quiet ? n : -1;
}

static int tasks_same(const struct th_task *a, int n) {
  struct th_task b[TH_TASKS];
  if (tasks_quiet(b, TH_TASKS) != n)
    return 0;
  for (int i = 0; i < n; i++)
    if (b[i].tid != a[i].tid || strcmp(b[i].sc, a[i].sc) != 0 ||
        b[i].sw != a[i].sw)
      return 0;
  return 1;
}

static pid_t spawn_fork(void) {
  for (int tries = 0;; tries++) {
    struct th_task before[TH_TASKS];
    int n = tasks_quiet(before, TH_TASKS);
    if (n < 0 && tries < 2000) { /* 2 s at most, then fork as it comes */
      th_sleep_ms(1);
      continue;
    }
    int go[2];
    if (pipe(go) != 0)
      return fork();
    pid_t pid = fork();
    if (pid == 0) {
      close(go[1]);
      char v = 0;
      while (read(go[0], &v, 1) < 0 && errno == EINTR)
        ;
      if (v != 'y')
        _exit(0); /* its allocator may be locked: touch nothing */
      close(go[0]);
      return 0;
    }
    close(go[0]);
    int same = pid < 0 || n < 0 || tasks_same(before, n);
    if (pid > 0 && write(go[1], same ? "y" : "n", 1) != 1)
      same = 0; /* the child reads end of file and exits: reaped below */
    close(go[1]);
    if (same)
      return pid;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
  }
}
#else
static pid_t spawn_fork(void) { return fork(); }
#endif

pid_t th_spawn(struct th_fx *fx, int (*fn)(void *arg), void *arg) {
  assert_true(fx->nkids < TH_MAX_CHILDREN);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = spawn_fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* The runner's crash handlers would longjmp back into its loop and run
     * the rest of the suite in the child: a crash must end the child. */
    const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
      signal(sigs[i], SIG_DFL);
    _exit(fn(arg) & 0xff); /* never back into the runner */
  }
  fx->kids[fx->nkids++] = pid;
  return pid;
}

int th_reap(struct th_fx *fx, pid_t pid, int timeout_ms) {
  uint64_t deadline = th_mono_ms() + (uint64_t)timeout_ms;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      break;
    if (r < 0 && errno != EINTR)
      fail_msg("waitpid(%ld): %s", (long)pid, strerror(errno));
    if (th_mono_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      forget(fx, pid);
      fail_msg("child %ld still running after %d ms (hang guard)", (long)pid,
               timeout_ms);
    }
    th_sleep_ms(2);
  }
  forget(fx, pid);
  return status;
}

void th_wait_stopped(struct th_fx *fx, pid_t pid, int timeout_ms) {
  uint64_t deadline = th_mono_ms() + (uint64_t)timeout_ms;
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WUNTRACED | WNOHANG);
    if (r == pid && WIFSTOPPED(st))
      return;
    if (r == pid) {
      forget(fx, pid);
      fail_msg("child %ld ended instead of stopping (status 0x%x)", (long)pid,
               (unsigned)st);
    }
    if (r < 0 && errno != EINTR)
      fail_msg("waitpid(%ld): %s", (long)pid, strerror(errno));
    if (th_mono_ms() > deadline)
      fail_msg("child %ld did not stop within %d ms", (long)pid, timeout_ms);
    th_sleep_ms(2);
  }
}

void th_reap_ok(struct th_fx *fx, pid_t pid, int timeout_ms) {
  int st = th_reap(fx, pid, timeout_ms);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("child %ld: %s %d", (long)pid,
             WIFEXITED(st) ? "exit status" : "killed by signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

void th_reap_killed(struct th_fx *fx, pid_t pid, int timeout_ms) {
  int st = th_reap(fx, pid, timeout_ms);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
    fail_msg("child %ld should have died by SIGKILL at its crash point: %s %d",
             (long)pid, WIFEXITED(st) ? "exit status" : "signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

void th_child_fail(const char *file, int line, const char *what) {
  fprintf(stderr, "child %ld: %s:%d: check failed: %s\n", (long)getpid(), file,
          line, what);
}

void th_gate_init(struct th_gate *g) { assert_int_equal(pipe(g->fd), 0); }

void th_gate_open(struct th_gate *g) {
  if (g->fd[1] >= 0)
    close(g->fd[1]);
  g->fd[1] = -1;
}

/* A child: closes its copy of the write end, then reads until every write
 * end is closed (EOF) — that is, until the parent opens the gate. */
void th_gate_wait(struct th_gate *g) {
  if (g->fd[1] >= 0)
    close(g->fd[1]);
  g->fd[1] = -1;
  char c;
  while (read(g->fd[0], &c, 1) < 0 && errno == EINTR)
    ;
}

void th_gate_close(struct th_gate *g) {
  th_gate_open(g);
  if (g->fd[0] >= 0)
    close(g->fd[0]);
  g->fd[0] = -1;
}

void th_send_u64(int fd, uint64_t v) {
  ssize_t n;
  while ((n = write(fd, &v, sizeof v)) < 0 && errno == EINTR)
    ;
}

int th_recv_u64(int fd, uint64_t *v) {
  size_t got = 0;
  while (got < sizeof *v) {
    ssize_t n = read(fd, (char *)v + got, sizeof *v - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    got += (size_t)n;
  }
  return 0;
}

static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return 0;
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  return p != NULL && p[1] == ' ' ? p[2] : 0;
}

int th_wait_sleeping(pid_t pid, int timeout_ms) {
  uint64_t deadline = th_mono_ms() + (uint64_t)timeout_ms;
  while (th_mono_ms() < deadline) {
    if (proc_state(pid) == 'S')
      return 1;
    th_sleep_ms(1);
  }
  return 0;
}

uint64_t th_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

uint64_t th_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void th_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

void th_shm_path(const char *name, char *buf, size_t len) {
  snprintf(buf, len, "/dev/shm%s%s", name[0] == '/' ? "" : "/", name);
}

void *th_map(const char *name, size_t *size) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0)
    fail_msg("shm_open(%s): %s", name, strerror(errno));
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  assert_true(st.st_size > 0);
  void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  close(fd);
  assert_true(base != MAP_FAILED);
  *size = (size_t)st.st_size;
  return base;
}

void th_unmap(void *base, size_t size) { munmap(base, size); }

void th_truncate(const char *name, uint64_t size) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0)
    fail_msg("shm_open(%s): %s", name, strerror(errno));
  int rc = ftruncate(fd, (off_t)size);
  close(fd);
  assert_int_equal(rc, 0);
}

void th_chmod(const char *name, unsigned mode) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0)
    fail_msg("shm_open(%s): %s", name, strerror(errno));
  int rc = fchmod(fd, (mode_t)mode);
  close(fd);
  assert_int_equal(rc, 0);
}

int th_contains(const char *msg, const char *needle) {
  return msg != NULL && strstr(msg, needle) != NULL;
}

int64_t th_field(throttle_t *h, const char *key, throttle_field_t f) {
  throttle_info_t *info;
  assert_int_equal(throttle_info(h, key, &info), 0);
  int64_t v = throttle_info_get(info, f);
  throttle_info_free(info);
  return v;
}

/* The field, or 'absent' while the key has no record yet (a child that
 * is seen asleep may be asleep before its first call: starting up, or
 * opening the segment). */
static int64_t field_or(throttle_t *h, const char *key, throttle_field_t f,
                        int64_t absent) {
  throttle_info_t *info;
  int rc = throttle_info(h, key, &info);
  if (rc == THROTTLE_ENOKEY)
    return absent;
  assert_int_equal(rc, 0);
  int64_t v = throttle_info_get(info, f);
  throttle_info_free(info);
  return v;
}

void th_wait_field(throttle_t *h, const char *key, throttle_field_t f,
                   int64_t want, int timeout_ms) {
  uint64_t t0 = th_mono_ms();
  while (field_or(h, key, f, want - 1) != want &&
         th_mono_ms() - t0 < (uint64_t)timeout_ms)
    th_sleep_ms(5);
  assert_int_equal(th_field(h, key, f), want);
}

void *th_rec(throttle_t *h, const char *key) {
  size_t len = strlen(key);
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state == THROTTLE__REC_USED && r->key_len == len &&
        memcmp(r->key, key, len) == 0)
      return r;
  }
  fail_msg("no record for %s", key);
  return NULL;
}

uint64_t th_remaining(throttle_t *h, const char *key) {
  uint64_t ms = UINT64_MAX;
  int rc = throttle_remaining(h, key, &ms);
  if (rc != 0)
    fail_msg("throttle_remaining(%s): %s: %s", key, throttle_err_name(rc),
             throttle_errmsg(h));
  return ms;
}

throttle_ticket_t *th_enter(throttle_t *h, const char *key,
                            throttle_class_t cls, uint64_t timeout_ms) {
  throttle_ticket_t *t = NULL;
  int rc = throttle_enter(h, key, cls, timeout_ms, &t);
  if (rc != 0)
    fail_msg("enter %s: %s: %s", key, throttle_err_name(rc),
             throttle_errmsg(h));
  return t;
}

void th_leave(throttle_t *h, throttle_ticket_t *t, throttle_outcome_t o,
              uint64_t retry_after_ms) {
  int rc = throttle_leave(h, t, o, retry_after_ms);
  if (rc != 0)
    fail_msg("leave: %s: %s", throttle_err_name(rc), throttle_errmsg(h));
}

/* ---- the table's own consistency ---------------------------------------- */

/* Count a fault; describe it when it is the first. */
__attribute__((format(printf, 4, 5))) static int
table_fault(int n, char *why, size_t len, const char *fmt, ...) {
  if (n == 0 && why != NULL && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
  }
  return n + 1;
}

int th_table_faults(throttle_t *h, char *why, size_t len) {
  if (why != NULL && len > 0)
    why[0] = 0;
  int n = 0;
  int rc = throttle__lock(h);
  if (rc != 0)
    return table_fault(n, why, len, "lock: %s", throttle_err_name(rc));
  struct throttle__hdr *hdr = h->hdr;
  uint32_t seq = atomic_load(&hdr->tseq);
  if (seq & 1)
    n = table_fault(n, why, len, "sequence left odd (%u)", seq);
  uint32_t used = 0;
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state == THROTTLE__REC_FREE)
      continue;
    if (r->state != THROTTLE__REC_USED) {
      n = table_fault(n, why, len, "record %u: state 0x%x", i, r->state);
      continue;
    }
    used++;
    size_t kl = r->key_len;
    if (kl < 1 || kl > THROTTLE__KEY_MAX) {
      n = table_fault(n, why, len, "record %u: key length %zu", i, kl);
      continue;
    }
    struct throttle__rec *f = throttle__find_locked(
        h, r->key, kl, throttle__hash(h->seed, r->key, kl));
    if (f == NULL)
      n = table_fault(n, why, len, "record %u not found by its key", i);
    else if (f != r)
      n = table_fault(n, why, len, "records %u and %td hold one key", i,
                      f - h->recs);
  }
  if (hdr->used != used)
    n = table_fault(n, why, len, "used says %u, %u records in use", hdr->used,
                    used);
  uint32_t nfree = 0;
  for (uint32_t fi = hdr->free_head; fi != 0; fi = h->recs[fi - 1].next_free) {
    if (fi > h->capacity || ++nfree > h->capacity) {
      n = table_fault(n, why, len,
                      "free list: %u out of range or a cycle (%u steps)", fi,
                      nfree);
      break;
    }
    if (h->recs[fi - 1].state != THROTTLE__REC_FREE) {
      n = table_fault(n, why, len, "record %u on the free list is in use",
                      fi - 1);
      break;
    }
  }
  if (nfree + used != h->capacity)
    n = table_fault(n, why, len, "%u free + %u used != capacity %u", nfree,
                    used, h->capacity);
  throttle__unlock(h);
  return n;
}

int th_child_holds(void *p) {
  const struct th_hold *a = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(a->fx->cfg, &h) == 0);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, a->key, THROTTLE_CLASS_LIVE, 10000, &t) ==
                 0);
  th_send_u64(a->fd, 1);
  for (;;)
    pause();
}

int th_child_sits_on_mutex(void *p) {
  struct th_fx *fx = p;
  throttle_close(fx->h);
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(fx->cfg, &h) == 0);
  TH_CHILD_CHECK(pthread_mutex_lock(&h->hdr->mutex) == 0);
  raise(SIGSTOP);
  return 0; /* never: the parent kills it stopped */
}
