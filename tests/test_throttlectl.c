/* SPDX-License-Identifier: MIT */
/*
 * test_throttlectl.c — throttlectl as scripts use it: run the real binary
 * ($B/throttlectl, B defaulting to "build") in child processes and check
 * exit statuses, stdout and stderr.  Each test has its own segment
 * ("/tt-<tag>ctl-<pid>-<n>", th_test_tag()), removed in its teardown.
 *
 * JSON output is checked with python3's json module when python3 is there
 * (the test is skipped, not failed, without it).  The only timing checks are
 * lower bounds, or upper bounds far above what is asked (a 0.2 s timeout
 * against a 5 s back-off).  Where a test needs another process to have
 * reached some state (a waiter queued, a slot held), it polls `show --json`
 * for that state rather than sleeping.
 *
 * `run` tests drive small sh scripts; each test also has a scratch
 * directory for their files.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"  /* th_test_tag() */
#include "internal.h" /* the segment mutex, for the lock-timeout test */

#define MAX_ARGS 40
/* Ends the argument lists of ctl() and ctl_spawn(). */
#define END ((const char *)NULL)

static char ctl_path[4096];
static bool have_python;

/* ---- running a child -------------------------------------------------- */

struct proc {
  pid_t pid;
  int out, err;
  uint64_t start_ns;
};

struct result {
  int status; /* exit status, or 128 + signal */
  char *out, *err;
  size_t outlen, errlen;
  uint64_t ns; /* from spawn to exit */
};

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Start argv[0] with stdin from `in` (may be NULL) and stdout/stderr on
 * pipes. */
static void spawn(char *const argv[], const char *in, struct proc *p) {
  int po[2], pe[2], pi[2];
  assert_int_equal(pipe(po), 0);
  assert_int_equal(pipe(pe), 0);
  assert_int_equal(pipe(pi), 0);
  p->start_ns = mono_ns();
  p->pid = fork();
  assert_true(p->pid >= 0);
  if (p->pid == 0) {
    dup2(pi[0], 0);
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(pi[0]);
    close(pi[1]);
    close(po[0]);
    close(po[1]);
    close(pe[0]);
    close(pe[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(pi[0]);
  close(po[1]);
  close(pe[1]);
  if (in != NULL) {
    size_t n = strlen(in);
    /* Small inputs only: written whole before reading the outputs. */
    assert_true(n < 60000);
    assert_int_equal(write(pi[1], in, n), (ssize_t)n);
  }
  close(pi[1]);
  p->out = po[0];
  p->err = pe[0];
}

static void append(char **buf, size_t *len, const char *data, size_t n) {
  *buf = realloc(*buf, *len + n + 1);
  assert_non_null(*buf);
  memcpy(*buf + *len, data, n);
  *len += n;
  (*buf)[*len] = 0;
}

/* Read both outputs to the end, reap the child. */
static void finish(struct proc *p, struct result *r) {
  memset(r, 0, sizeof *r);
  append(&r->out, &r->outlen, "", 0);
  append(&r->err, &r->errlen, "", 0);
  struct pollfd fds[2] = {{p->out, POLLIN, 0}, {p->err, POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    int n = poll(fds, 2, -1);
    if (n < 0 && errno == EINTR)
      continue;
    assert_true(n > 0);
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0)
        continue;
      char buf[4096];
      ssize_t k = read(fds[i].fd, buf, sizeof buf);
      if (k > 0) {
        if (i == 0)
          append(&r->out, &r->outlen, buf, (size_t)k);
        else
          append(&r->err, &r->errlen, buf, (size_t)k);
      } else if (k == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
    }
  }
  int st;
  while (waitpid(p->pid, &st, 0) < 0)
    assert_int_equal(errno, EINTR);
  r->ns = mono_ns() - p->start_ns;
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void result_free(struct result *r) {
  free(r->out);
  free(r->err);
  memset(r, 0, sizeof *r);
}

/* argv for "throttlectl --segment SEG args..." (NULL-terminated va list). */
static void ctl_argv(char **argv, const char *seg, va_list ap) {
  int n = 0;
  argv[n++] = ctl_path;
  if (seg != NULL) {
    argv[n++] = "--segment";
    argv[n++] = (char *)seg;
  }
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL) {
    assert_true(n < MAX_ARGS - 1);
    argv[n++] = (char *)a;
  }
  argv[n] = NULL;
}

/* Run throttlectl to completion; returns its exit status. */
static int ctl(struct result *r, const char *seg, ...) {
  char *argv[MAX_ARGS];
  va_list ap;
  va_start(ap, seg);
  ctl_argv(argv, seg, ap);
  va_end(ap);
  struct proc p;
  spawn(argv, NULL, &p);
  finish(&p, r);
  return r->status;
}

/* The same, started in the background. */
static void ctl_spawn(struct proc *p, const char *seg, ...) {
  char *argv[MAX_ARGS];
  va_list ap;
  va_start(ap, seg);
  ctl_argv(argv, seg, ap);
  va_end(ap);
  spawn(argv, NULL, p);
}

/* Run python3 -c script arg with json on stdin; its exit status. */
static int python_json(const char *json, const char *script, const char *arg) {
  char *argv[] = {"python3", "-c", (char *)script, (char *)arg, NULL};
  struct proc p;
  struct result r;
  spawn(argv, json, &p);
  finish(&p, &r);
  if (r.status != 0)
    print_message("python3 (%d): %s\n", r.status, r.err);
  int st = r.status;
  result_free(&r);
  return st;
}

/* Loads the document and checks the "key" of the top-level object or of one
 * of its "keys" equals argv[1]; 0 when it does, 3 when not found. */
static const char PY_HAS_KEY[] =
    "import json,sys\n"
    "d=json.load(sys.stdin)\n"
    "ks=d['keys'] if 'keys' in d else [d]\n"
    "sys.exit(0 if any(k['key']==sys.argv[1] for k in ks) else 3)\n";

/* A number field of a flat JSON object: "name":N; a boolean reads as 1
 * (true) or 0 (false). */
static long long json_int(const char *json, const char *name) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", name);
  const char *p = strstr(json, pat);
  assert_non_null(p);
  p += strlen(pat);
  if (strncmp(p, "true", 4) == 0)
    return 1;
  if (strncmp(p, "false", 5) == 0)
    return 0;
  return strtoll(p, NULL, 10);
}

static void dump(const struct result *r) {
  print_message("status %d\nstdout:\n%s\nstderr:\n%s\n", r->status, r->out,
                r->err);
}

#define assert_status(r, expr, want)                                           \
  do {                                                                         \
    int got_ = (expr);                                                         \
    if (got_ != (want))                                                        \
      dump(r);                                                                 \
    assert_int_equal(got_, (want));                                            \
  } while (0)

static bool exists(const char *path) { return access(path, F_OK) == 0; }

/* ---- fixtures --------------------------------------------------------- */

struct seg {
  char name[64];  /* "/tt-<tag>ctl-<pid>-<n>" */
  char path[128]; /* "/dev/shm/tt-<tag>ctl-..." */
  char dir[64];   /* scratch directory, removed with its files */
};

/* A child process (named name, when not NULL) that opens seg's segment
 * with the library, runs act(h, key), and then sits until it is killed;
 * returned once act has succeeded (the test fails if it did not). */
static pid_t spawn_segment_child(const struct seg *s, const char *name,
                                 int (*act)(throttle_t *h, const char *key),
                                 const char *key) {
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    throttle_config_t *cfg = throttle_config_new();
    throttle_t *h = NULL;
    if (name != NULL)
      (void)prctl(PR_SET_NAME, name);
    if (cfg == NULL || throttle_config_set_segment(cfg, s->name) != 0 ||
        throttle_open(cfg, &h) != 0 || !throttle_is_shared(h) ||
        act(h, key) != 0)
      _exit(1);
    (void)!write(ready[1], "x", 1);
    for (;;)
      pause(); /* killed by the parent */
  }
  close(ready[1]);
  char x;
  bool ok = read(ready[0], &x, 1) == 1;
  close(ready[0]);
  if (!ok) {
    waitpid(pid, NULL, 0);
    fail_msg("the child could not open the segment or act on it");
  }
  return pid;
}

static int setup(void **state) {
  static int n;
  struct seg *s = calloc(1, sizeof *s);
  if (s == NULL)
    return -1;
  snprintf(s->name, sizeof s->name, "/tt-%sctl-%ld-%d", th_test_tag(),
           (long)getpid(), ++n);
  snprintf(s->path, sizeof s->path, "/dev/shm%s", s->name);
  snprintf(s->dir, sizeof s->dir, "/tmp/thr-ctl-test-XXXXXX");
  if (mkdtemp(s->dir) == NULL) {
    free(s);
    return -1;
  }
  shm_unlink(s->name);
  *state = s;
  return 0;
}

static int teardown(void **state) {
  struct seg *s = *state;
  shm_unlink(s->name);
  DIR *d = opendir(s->dir);
  if (d != NULL) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      char p[512];
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
        continue;
      snprintf(p, sizeof p, "%s/%s", s->dir, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  rmdir(s->dir);
  free(s);
  return 0;
}

/* dir/name into buf. */
static const char *scratch(const struct seg *s, const char *name, char *buf,
                           size_t len) {
  snprintf(buf, len, "%s/%s", s->dir, name);
  return buf;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

/* The file's first line as a number; -1 when it cannot be read. */
static long long read_number(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1)
    v = -1;
  fclose(f);
  return v;
}

static int count_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  int n = 0, ch;
  while ((ch = fgetc(f)) != EOF)
    n += ch == '\n';
  fclose(f);
  return n;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* Poll `show KEY --json` until field == want: another process reaching a
 * state, without guessing how long it takes.  Fails after about 20 s. */
static void wait_field(const struct seg *s, const char *key, const char *field,
                       long long want) {
  long long got = -1;
  for (int i = 0; i < 1000; i++) {
    struct result r;
    if (ctl(&r, s->name, "show", key, "--json", END) == 0)
      got = json_int(r.out, field);
    result_free(&r);
    if (got == want)
      return;
    sleep_ms(20);
  }
  fail_msg("%s of %s is %lld, never became %lld", field, key, got, want);
}

/* Poll until path exists (at most about 20 s). */
static void wait_file(const char *path) {
  for (int i = 0; i < 1000 && access(path, F_OK) != 0; i++)
    sleep_ms(20);
  assert_int_equal(access(path, F_OK), 0);
}

/* Expect status 64, a message, nothing on stdout, and no segment created:
 * args is a NULL-terminated list after "--segment SEG". */
static void expect_usage_error(const struct seg *s, const char *const *args) {
  char *argv[MAX_ARGS];
  int n = 0;
  argv[n++] = ctl_path;
  argv[n++] = "--segment";
  argv[n++] = (char *)s->name;
  for (int j = 0; args[j] != NULL; j++) {
    assert_true(n < MAX_ARGS - 1);
    argv[n++] = (char *)args[j];
  }
  argv[n] = NULL;
  struct proc p;
  struct result r;
  spawn(argv, NULL, &p);
  finish(&p, &r);
  if (r.status != 64) {
    print_message("case:");
    for (int j = 0; args[j] != NULL; j++)
      print_message(" '%s'", args[j]);
    print_message("\n");
  }
  assert_status(&r, r.status, 64);
  assert_true(strncmp(r.err, "throttlectl: ", 13) == 0);
  assert_int_equal(r.outlen, 0);
  result_free(&r);
  /* A usage error never creates the segment. */
  assert_false(exists(s->path));
}

/* ---- tests ------------------------------------------------------------ */

static void test_throttlectl_backoff_then_show_json(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "orders", "5", END), 0);
  assert_int_equal(r.outlen, 0); /* quiet on success */
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "orders", "--json", END), 0);
  assert_true(json_int(r.out, "remaining_ms") > 0);
  assert_true(json_int(r.out, "remaining_ms") <= 5000);
  assert_int_equal(json_int(r.out, "publishes"), 1);
  assert_int_equal(json_int(r.out, "last_delay_ms"), 5000);
  assert_int_equal(json_int(r.out, "last_publisher_pid") > 0, 1);
  if (have_python)
    assert_int_equal(python_json(r.out, PY_HAS_KEY, "orders"), 0);
  result_free(&r);

  /* Human form: "field: value" for the key and every field. */
  assert_status(&r, ctl(&r, s->name, "show", "orders", END), 0);
  assert_non_null(strstr(r.out, "key: orders\n"));
  assert_non_null(strstr(r.out, "\npublishes: 1\n"));
  assert_non_null(strstr(r.out, "\nremaining_ms: "));
  result_free(&r);
}

static void test_throttlectl_backoff_accepts_decimal_seconds(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "1.5", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "last_delay_ms"), 1500);
  result_free(&r);
}

/* One duration syntax wherever a length of time is taken: RETRY_AFTER,
 * --timeout, max-delay, the PERIOD of --rate; refused with the reason. */
static void test_throttlectl_durations_everywhere(void **state) {
  struct seg *s = *state;
  struct result r;
  static const struct {
    const char *key, *given;
    long long ms;
  } backoffs[] = {{"d1", "1.5s", 1500}, {"d2", "250ms", 250},
                  {"d3", "2m", 120000}, {"d4", "1m30s", 90000},
                  {"d5", "7", 7000}};
  for (size_t i = 0; i < sizeof backoffs / sizeof backoffs[0]; i++) {
    assert_status(&r,
                  ctl(&r, s->name, "backoff", backoffs[i].key,
                      backoffs[i].given, END),
                  0);
    result_free(&r);
    assert_status(&r, ctl(&r, s->name, "show", backoffs[i].key, "--json", END),
                  0);
    assert_int_equal(json_int(r.out, "last_delay_ms"), backoffs[i].ms);
    result_free(&r);
  }
  assert_status(&r, ctl(&r, s->name, "wait", "d3", "--timeout", "100ms", END),
                75);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "max-delay", "1h", END), 0);
  assert_string_equal(r.out, "3600.000\n");
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "max-delay", "8d", END), 64);
  assert_non_null(strstr(r.err, "out of range"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "set", "d1", "--rate", "10/1m30s", END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "d1", "--json", END), 0);
  assert_int_equal(json_int(r.out, "rate_period_ms"), 90000);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "d1", "--timeout", "5x", END), 64);
  assert_non_null(strstr(r.err, "--timeout: '5x' is not a duration: unknown "
                                "unit 'x'"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "backoff", "d1", "1h30", END), 64);
  assert_non_null(strstr(r.err, "'30' needs a unit"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "watch", "--interval", "1 s", END), 64);
  assert_non_null(strstr(r.err, "no spaces"));
  result_free(&r);
}

static void test_throttlectl_ls_table_lists_key(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "hotdata:ws1/orders", "5",
                        END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  char want[128];
  snprintf(want, sizeof want, "segment %s: 1/64 keys, 0 evictions, 0 repairs\n",
           s->name);
  assert_true(strncmp(r.out, want, strlen(want)) == 0);
  const char *head = r.out + strlen(want);
  assert_true(strncmp(head, "KEY ", 4) == 0);
  /* KEY and LEFT first, the rest in this order. */
  const char *cols[] = {"KEY",    "LEFT", "FLIGHT", "WAIT", "ADMIT",
                        "LOCKED", "RECL", "LAST",   "STATE"};
  const char *at = head;
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
    const char *c = strstr(at, cols[i]);
    assert_non_null(c);
    at = c + strlen(cols[i]);
  }
  const char *row = strchr(head, '\n');
  assert_non_null(row);
  row++;
  assert_true(strncmp(row, "hotdata:ws1/orders ", 19) == 0);
  /* Exactly summary + header + one row. */
  assert_non_null(strchr(row, '\n'));
  assert_int_equal(strchr(row, '\n')[1], 0);
  result_free(&r);
}

static void test_throttlectl_ls_without_keys_prints_only_header(void **state) {
  struct seg *s = *state;
  struct result r;
  /* wait on an open key creates the segment and adds no key. */
  assert_status(&r, ctl(&r, s->name, "wait", "k", "--timeout", "0", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  const char *nl = strchr(r.out, '\n');
  assert_non_null(nl);
  assert_true(strncmp(nl + 1, "KEY ", 4) == 0);
  assert_non_null(strchr(nl + 1, '\n'));
  assert_int_equal(strchr(nl + 1, '\n')[1], 0);
  assert_non_null(strstr(r.out, ": 0/64 keys"));
  assert_int_equal(r.errlen, 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "--json", END), 0);
  assert_non_null(strstr(r.out, "\"keys\":[]"));
  result_free(&r);
}

static void test_throttlectl_ls_json_parses(void **state) {
  struct seg *s = *state;
  struct result r;
  if (!have_python)
    skip();
  assert_status(&r, ctl(&r, s->name, "backoff", "alpha", "5", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "backoff", "beta", "0", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "--json", END), 0);
  assert_int_equal(python_json(r.out, PY_HAS_KEY, "alpha"), 0);
  assert_int_equal(python_json(r.out, PY_HAS_KEY, "beta"), 0);
  static const char check[] =
      "import json,sys\n"
      "d=json.load(sys.stdin)\n"
      "assert d['segment']==sys.argv[1], d\n"
      "assert d['capacity']==64 and d['used']==2, d\n"
      "assert d['evictions']==0 and d['repairs']==0, d\n"
      "k={x['key']:x for x in d['keys']}\n"
      "assert k['alpha']['remaining_ms']>0 and k['beta']['remaining_ms']==0\n"
      "assert all(isinstance(v,int) for x in d['keys'] for n,v in x.items()"
      " if n not in ('key','holders','waiters','scope','beneath',"
      "'last_refusal'))\n"
      "assert all(x['last_refusal'] is None for x in d['keys'])\n"
      "assert k['alpha']['scope'] is None and k['alpha']['beneath']['keys']==0\n"
      "assert all(x['holders']==[] for x in d['keys'])\n"
      "assert all(x['waiters']==[] for x in d['keys'])\n";
  assert_int_equal(python_json(r.out, check, s->name), 0);
  result_free(&r);
}

/* Overwrite the bytes of key where the segment holds them (its record)
 * with as many others: what a writer outside the library can do. */
static void forge_key_bytes(const char *seg, const char *key,
                            const char *bytes) {
  char path[256];
  snprintf(path, sizeof path, "/dev/shm%s", seg);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  char *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  close(fd);
  assert_true(base != MAP_FAILED);
  char *at = memmem(base, (size_t)st.st_size, key, strlen(key) + 1);
  assert_non_null(at);
  memcpy(at, bytes, strlen(key));
  munmap(base, (size_t)st.st_size);
}

/* Keys with control bytes are refused (exit 64); one that a writer
 * outside the library put in the segment is still shown escaped. */
static void test_throttlectl_json_escapes_keys(void **state) {
  struct seg *s = *state;
  struct result r;
  const char *key = "q\"uo\\te\ttab\x01 caf\xc3\xa9";
  assert_status(&r, ctl(&r, s->name, "backoff", key, "5", END), 64);
  result_free(&r);
  const char *printable = "q\"uo\\te_tab_ caf\xc3\xa9";
  assert_status(&r, ctl(&r, s->name, "backoff", printable, "5", END), 0);
  result_free(&r);
  forge_key_bytes(s->name, printable, key);
  assert_status(&r, ctl(&r, s->name, "ls", "--json", END), 0);
  assert_non_null(
      strstr(r.out, "\"key\":\"q\\\"uo\\\\te\\u0009tab\\u0001 caf\xc3\xa9\""));
  if (have_python)
    assert_int_equal(python_json(r.out, PY_HAS_KEY, key), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", key, "--json", END), 64);
  result_free(&r);
  /* The text forms show control bytes escaped, never raw. */
  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  assert_non_null(strstr(r.out, "q\"uo\\te\\x09tab\\x01 caf\xc3\xa9"));
  assert_null(strchr(r.out, '\x01'));
  result_free(&r);
}

static void test_throttlectl_wait_timeout_exits_75(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "5", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "k", "--timeout", "0.2", END),
                75);
  /* It knows at once that the key opens after the deadline. */
  assert_true(r.ns < UINT64_C(4000000000));
  assert_non_null(strstr(r.err, "throttlectl: "));
  assert_non_null(strstr(r.err, "timeout"));
  result_free(&r);
}

static void test_throttlectl_wait_sleeps_out_backoff(void **state) {
  struct seg *s = *state;
  struct result r;
  uint64_t t0 = mono_ns();
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "1", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "k", "--timeout=30", END), 0);
  result_free(&r);
  /* Never early (I1): the back-off was published after t0. */
  assert_true(mono_ns() - t0 >= UINT64_C(1000000000));
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "remaining_ms"), 0);
  result_free(&r);
}

static void test_throttlectl_clear_releases_waiter(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "20", END), 0);
  result_free(&r);
  struct proc waiter;
  ctl_spawn(&waiter, s->name, "wait", "k", "--timeout", "60", END);
  /* Whether the waiter is asleep yet or not, clear must release it. */
  assert_status(&r, ctl(&r, s->name, "clear", "k", END), 0);
  result_free(&r);
  finish(&waiter, &r);
  assert_status(&r, r.status, 0);
  assert_true(r.ns < UINT64_C(15000000000)); /* not the 20 s back-off */
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "k", "--timeout", "0", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "remaining_ms"), 0);
  assert_int_equal(json_int(r.out, "clears"), 1);
  result_free(&r);
}

static void test_throttlectl_reset_opens_every_key(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "a", "30", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "backoff", "b", "30", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "reset", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "a", "--timeout", "0", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "wait", "b", "--timeout", "0", END), 0);
  result_free(&r);
}

static void test_throttlectl_clear_unknown_key_exits_1(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "known", "1", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "clear", "unknown", END), 1);
  assert_true(strncmp(r.err, "throttlectl: ", 13) == 0);
  assert_non_null(strstr(r.err, s->name));
  assert_non_null(strstr(r.err, "no such key"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "unknown", END), 1);
  result_free(&r);
}

/* Another process holds the segment mutex and never lets go (stopped):
 * every command that needs the mutex ends with the library's lock
 * timeout, which is transient (75): the holder may be a slow process, or
 * a dead one the next try repairs. */
static int sit_on_mutex(throttle_t *h, const char *key) {
  (void)key;
  return pthread_mutex_lock(&h->hdr->mutex) == 0 ? 0 : -1;
}

static void test_throttlectl_lock_timeout_exits_75(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "1", END), 0);
  result_free(&r);
  pid_t pid = spawn_segment_child(s, NULL, sit_on_mutex, "k");
  (void)ctl(&r, s->name, "backoff", "k", "5", END);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  assert_status(&r, r.status, 75);
  assert_non_null(strstr(r.err, "mutex"));
  result_free(&r);
}

static void test_throttlectl_usage_errors_exit_64(void **state) {
  struct seg *s = *state;
  char long_key[257];
  memset(long_key, 'k', 256);
  long_key[256] = 0;
  const char *cases[][8] = {
      {NULL},
      {"bogus", NULL},
      {"backoff", "k", NULL},
      {"backoff", "k", "-3", NULL},
      {"backoff", "k", "abc", NULL},
      {"backoff", "k", "1e3", NULL},
      {"backoff", "k", "1.", NULL},
      {"backoff", "k", "5", "extra", NULL},
      {"backoff", long_key, "5", NULL},
      {"backoff", "", "5", NULL},
      {"show", NULL},
      {"ls", "--bogus", NULL},
      {"ls", "--json=yes", NULL},
      {"wait", "k", "--timeout", NULL},
      {"wait", "k", "--timeout", "soon", NULL},
      {"rm", "extra", NULL},
      {"pause", NULL},
      {"resume", "k", "extra", NULL},
      {"cancel", NULL},
      {"run", "k", NULL},
      {"run", "k", "--", NULL},
      {"run", "--", "true", NULL}, /* "true" is the key: no CMD */
      {"run", "k", "--class", "bulk", "--", "true", NULL},
      {"run", "k", "--retries", "-1", "--", "true", NULL},
      {"run", "k", "--retries", "x", "--", "true", NULL},
      {"run", "k", "--timeout", "x", "--", "true", NULL},
      {"run", "k", "--max-parallel", "0", "--", "true", NULL},
      {"run", "k", "--max-parallel", "auto:3", "--", "true", NULL},
      {"run", "k", "--json", "--", "true", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_usage_error(s, cases[i]);
  struct result r;
  assert_status(&r, ctl(&r, "bad/name", "ls", END), 64);
  result_free(&r);
}

static void test_throttlectl_set_bad_values_exit_64(void **state) {
  struct seg *s = *state;
  const char *cases[][8] = {
      {"set", "k", NULL}, /* nothing to set */
      {"set", NULL},
      {"set", "k", "--max-parallel", "0", NULL},
      {"set", "k", "--max-parallel", "33", NULL},
      {"set", "k", "--max-parallel", "abc", NULL},
      {"set", "k", "--max-parallel", "-1", NULL},
      {"set", "k", "--max-parallel", "", NULL},
      {"set", "k", "--max-parallel", "auto:0", NULL},
      {"set", "k", "--max-parallel", "auto:33", NULL},
      {"set", "k", "--max-parallel", "auto:", NULL},
      {"set", "k", "--rate", "5", NULL},
      {"set", "k", "--rate", "5/0", NULL},
      {"set", "k", "--rate", "5/0ms", NULL},
      {"set", "k", "--rate", "x/1s", NULL},
      {"set", "k", "--rate", "0/1s", NULL},
      {"set", "k", "--rate", "5/1w", NULL},
      {"set", "k", "--rate", "5/8785h", NULL}, /* 366 days and an hour */
      {"set", "k", "--rate", "2000000/1s", NULL},
      {"set", "k", "--rate", "/1s", NULL},
      {"set", "k", "--rate", "5/", NULL},
      {"set", "k", "--rate", "5/1.5us", NULL},
      {"set", "k", "--backfill-share", "1.5", NULL},
      {"set", "k", "--backfill-share", "-0.5", NULL},
      {"set", "k", "--backfill-share", "half", NULL},
      {"set", "k", "--backfill-share", "0.", NULL},
      {"set", "k", "--backfill-share", "1e-1", NULL},
      /* One bad value refuses the whole command. */
      {"set", "k", "--max-parallel", "2", "--rate", "5", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    expect_usage_error(s, cases[i]);
}

/* ---- set, pause, resume, cancel ---------------------------------------- */

static void test_throttlectl_set_max_parallel_fixed_then_auto(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel", "2", END),
                0);
  assert_int_equal(r.outlen, 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "cap"), 2);
  assert_int_equal(json_int(r.out, "cap_auto"), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel=32", END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "cap"), 32);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel", "auto",
                        END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "cap_auto"), 1);
  result_free(&r);
  /* auto:MAX: learned, bounded, said in words by show. */
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel", "auto:3",
                        END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "cap_auto"), 1);
  assert_int_equal(json_int(r.out, "cap_max"), 3);
  assert_int_equal(json_int(r.out, "cap_next_raise_ms"), 0);
  assert_int_equal(json_int(r.out, "cap_learned_ago_ms"), -1);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", END), 0);
  assert_non_null(strstr(r.out, "cap learner: cap 1, at most 3, slow start"));
  result_free(&r);
}

static void test_throttlectl_set_rate_and_backfill_share(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "set", "k", "--rate", "5/500ms", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "rate_n"), 5);
  assert_int_equal(json_int(r.out, "rate_period_ms"), 500);
  result_free(&r);

  /* Every form of PERIOD, and several options in one call. */
  struct {
    const char *rate;
    long long n, ms;
  } forms[] = {{"120/1m", 120, 60000}, {"10/1", 10, 1000},
               {"3/1h", 3, 3600000},   {"7/1.5s", 7, 1500},
               {"1/120", 1, 120000},   {"off", 0, 0},
               {"2/2s", 2, 2000},      {"0", 0, 0}};
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
    assert_status(&r, ctl(&r, s->name, "set", "k", "--rate", forms[i].rate,
                          "--backfill-share", "0.25", END),
                  0);
    result_free(&r);
    assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
    if (json_int(r.out, "rate_n") != forms[i].n)
      print_message("--rate %s\n", forms[i].rate);
    assert_int_equal(json_int(r.out, "rate_n"), forms[i].n);
    assert_int_equal(json_int(r.out, "rate_period_ms"), forms[i].ms);
    assert_int_equal(json_int(r.out, "backfill_share_permille"), 250);
    result_free(&r);
  }
  assert_status(&r, ctl(&r, s->name, "set", "k", "--backfill-share", "1",
                        END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "backfill_share_permille"), 1000);
  result_free(&r);
}

static void test_throttlectl_ls_shows_flight_wait_and_state(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "set", "fixed", "--max-parallel", "2",
                        "--rate", "120/1m", END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "pause", "fixed", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "backoff", "learned", "30", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  /* FLIGHT in_flight/cap ("*": learned), WAIT live+backfill, ADMIT,
   * LOCKED, RECL, LAST, then STATE. */
  const char *row = strstr(r.out, "\nfixed ");
  assert_non_null(row);
  assert_non_null(strstr(row, " 0/2 "));
  assert_non_null(strstr(row, " 0+0 "));
  assert_non_null(strstr(row, "  paused,rate 120/1m\n"));
  row = strstr(r.out, "\nlearned ");
  assert_non_null(row);
  assert_non_null(strstr(row, " 0/1* "));
  assert_non_null(strstr(row, " 30.0s  episode\n"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "resume", "fixed", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "set", "fixed", "--rate", "off", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  row = strstr(r.out, "\nfixed ");
  assert_non_null(row);
  assert_true(strncmp(strchr(row + 1, '\n') - 3, "  -\n", 4) == 0);
  result_free(&r);
}

/* Takes key's only slot (its cap set to 1) and keeps it. */
static int hold_only_slot(throttle_t *h, const char *key) {
  throttle_ticket_t *t = NULL;
  if (throttle_set_max_parallel(h, key, 1) != 0)
    return -1;
  return throttle_enter(h, key, THROTTLE_CLASS_LIVE, 0, &t);
}

/* Holders are shown with their process name: show, show --json, and
 * watch (which shows holders at all). */
static void test_throttlectl_holders_by_name(void **state) {
  struct seg *s = *state;
  struct result r;
  pid_t pid = spawn_segment_child(s, "hold-by-name", hold_only_slot, "named");
  char pidtext[32];
  snprintf(pidtext, sizeof pidtext, "%ld", (long)pid);
  int st = ctl(&r, s->name, "show", "named", END);
  bool text_ok = st == 0 && strstr(r.out, "COMMAND") != NULL &&
                 strstr(r.out, "hold-by-name") != NULL;
  if (!text_ok)
    dump(&r);
  result_free(&r);
  st = ctl(&r, s->name, "show", "named", "--json", END);
  bool json_ok = st == 0 && strstr(r.out, "\"comm\":\"hold-by-name\"") != NULL;
  if (!json_ok)
    dump(&r);
  result_free(&r);
  /* watch on a pipe prints a block per refresh: the first is enough. */
  struct proc p;
  ctl_spawn(&p, s->name, "watch", "--interval", "100ms", END);
  char buf[8192];
  size_t n = 0;
  bool watch_ok = false;
  uint64_t until = mono_ns() + UINT64_C(20000000000);
  while (!watch_ok && n < sizeof buf - 1 && mono_ns() < until) {
    struct pollfd pf = {.fd = p.out, .events = POLLIN};
    if (poll(&pf, 1, 1000) <= 0)
      continue;
    ssize_t k = read(p.out, buf + n, sizeof buf - 1 - n);
    if (k <= 0)
      break;
    n += (size_t)k;
    buf[n] = 0;
    char want[64];
    snprintf(want, sizeof want, "%s hold-by-name", pidtext);
    watch_ok = strstr(buf, "HOLDERS") != NULL && strstr(buf, want) != NULL;
  }
  kill(p.pid, SIGTERM);
  finish(&p, &r);
  result_free(&r);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  if (!watch_ok)
    print_message("watch printed:\n%s\n", buf);
  assert_true(text_ok);
  assert_true(json_ok);
  assert_true(watch_ok);
}

/* ls PATTERN...: the keys matching any shell pattern ('*' crosses '/'). */
static void test_throttlectl_ls_patterns(void **state) {
  struct seg *s = *state;
  struct result r;
  const char *keys[] = {"hot:ws1/orders", "hot:ws1/items", "cold:ws2/x"};
  for (size_t i = 0; i < 3; i++) {
    assert_status(&r, ctl(&r, s->name, "backoff", keys[i], "30", END), 0);
    result_free(&r);
  }
  assert_status(&r, ctl(&r, s->name, "ls", "hot:*", END), 0);
  assert_non_null(strstr(r.out, "hot:ws1/orders"));
  assert_non_null(strstr(r.out, "hot:ws1/items"));
  assert_null(strstr(r.out, "cold:"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "*/ord*", "cold:ws2/?", "--json",
                        END),
                0);
  assert_non_null(strstr(r.out, "\"hot:ws1/orders\""));
  assert_non_null(strstr(r.out, "\"cold:ws2/x\""));
  assert_null(strstr(r.out, "items"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "nothing*", END), 0);
  assert_null(strstr(r.out, "ws1"));
  result_free(&r);
}

static void test_throttlectl_pause_holds_run_until_resume(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "pause", "k", END), 0);
  assert_int_equal(r.outlen, 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--timeout", "0.3", "--",
                        "true", END),
                75);
  assert_non_null(strstr(r.err, "not admitted within 300ms"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "paused"), 1);
  assert_int_equal(json_int(r.out, "admitted"), 0);
  assert_int_equal(json_int(r.out, "waiting_live"), 0); /* it left */
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "resume", "k", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "true", END), 0);
  assert_int_equal(r.errlen, 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "paused"), 0);
  assert_int_equal(json_int(r.out, "admitted"), 1);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
  /* resume of a key nobody has seen is an error. */
  assert_status(&r, ctl(&r, s->name, "resume", "unknown", END), 1);
  assert_non_null(strstr(r.err, "no such key"));
  result_free(&r);
}

static void test_throttlectl_cancel_ends_waiting_run(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "pause", "k", END), 0);
  result_free(&r);
  struct proc waiter;
  ctl_spawn(&waiter, s->name, "run", "k", "--timeout", "60", "--", "true",
            END);
  /* cancel ends the waiters there are; make sure this one is. */
  wait_field(s, "k", "waiting_live", 1);
  assert_status(&r, ctl(&r, s->name, "cancel", "k", END), 0);
  assert_int_equal(r.outlen, 0);
  result_free(&r);
  finish(&waiter, &r);
  assert_status(&r, r.status, 1); /* not 75: it did not time out */
  assert_non_null(strstr(r.err, "canceled"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "canceled"), 1);
  assert_int_equal(json_int(r.out, "waiting_live"), 0);
  assert_int_equal(json_int(r.out, "admitted"), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "cancel", "unknown", END), 1);
  assert_non_null(strstr(r.err, "no such key"));
  result_free(&r);
}

/* A key has 32 participant slots: 35 callers waiting on a paused key are
 * all counted, 32 are listed, and show (text and JSON) says how many it
 * left out; a cancel ends them all, those beyond the slots too. */
static void test_throttlectl_show_counts_waiters_it_does_not_list(
    void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "pause", "q", END), 0);
  result_free(&r);
  enum { N = 35 };
  struct proc w[N];
  for (int i = 0; i < N; i++) {
    ctl_spawn(&w[i], s->name, "run", "q", "--timeout", "60", "--", "true",
              END);
    wait_field(s, "q", "waiting_live", i + 1);
  }
  assert_status(&r, ctl(&r, s->name, "show", "q", "--json", END), 0);
  assert_int_equal(json_int(r.out, "waiting_live"), N);
  assert_int_equal(json_int(r.out, "waiters_unlisted"), N - 32);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "q", END), 0);
  assert_non_null(strstr(r.out, "\nwaiters not listed: 3\n"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "cancel", "q", END), 0);
  result_free(&r);
  for (int i = 0; i < N; i++) {
    finish(&w[i], &r);
    assert_status(&r, r.status, 1); /* canceled, not timed out */
    result_free(&r);
  }
  assert_status(&r, ctl(&r, s->name, "show", "q", "--json", END), 0);
  assert_int_equal(json_int(r.out, "canceled"), N);
  assert_int_equal(json_int(r.out, "waiting_live"), 0);
  assert_int_equal(json_int(r.out, "waiters_unlisted"), 0);
  result_free(&r);
}

/* ---- run -------------------------------------------------------------- */

static void test_throttlectl_run_passes_on_permanent_status(void **state) {
  struct seg *s = *state;
  struct result r;
  char log[256], cmd[1024];
  scratch(s, "log", log, sizeof log);
  snprintf(cmd, sizeof cmd, "echo run >> '%s'; exit 3", log);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "sh", "-c", cmd, END),
                3);
  result_free(&r);
  assert_int_equal(count_lines(log), 1); /* never retried */
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "permanent"), 1);
  assert_int_equal(json_int(r.out, "locked"), 0);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
  /* Without "--": options end at CMD, whose own options stay its own. */
  assert_status(&r, ctl(&r, s->name, "run", "k", "sh", "-c", "exit 0",
                        "--retries", END),
                0);
  result_free(&r);
  /* stdout is CMD's. */
  assert_status(&r, ctl(&r, s->name, "run", "k", "--class", "backfill", "--",
                        "echo", "hello", END),
                0);
  assert_string_equal(r.out, "hello\n");
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "admitted"), 3);
  assert_int_equal(json_int(r.out, "permanent"), 1);
  result_free(&r);
}

static void test_throttlectl_run_retries_locked_then_gives_up(void **state) {
  struct seg *s = *state;
  struct result r;
  char log[256], cmd[1024];
  scratch(s, "log", log, sizeof log);
  snprintf(cmd, sizeof cmd,
           "echo run >> '%s'; echo 1 > \"$THROTTLE_RETRY_AFTER_FILE\"; "
           "exit 75",
           log);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--retries", "2", "--", "sh",
                        "-c", cmd, END),
                75);
  /* Never early (I1): each retry waited out the 1 s published. */
  assert_true(r.ns >= UINT64_C(2000000000));
  assert_non_null(strstr(r.err, "still locked after 3 attempts"));
  result_free(&r);
  assert_int_equal(count_lines(log), 3);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "locked"), 3);
  assert_int_equal(json_int(r.out, "last_delay_ms"), 1000);
  assert_int_equal(json_int(r.out, "permanent"), 0);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

static void test_throttlectl_run_succeeds_on_second_attempt(void **state) {
  struct seg *s = *state;
  struct result r;
  char count[256], cmd[1024];
  scratch(s, "count", count, sizeof count);
  write_file(count, "0\n");
  /* Locked the first time (0.2 s, written as a decimal), fine the second. */
  snprintf(cmd, sizeof cmd,
           "n=$(($(cat '%s') + 1)); echo $n > '%s'; "
           "if [ $n -lt 2 ]; then "
           "echo ' 0.2 ' > \"$THROTTLE_RETRY_AFTER_FILE\"; exit 75; fi; "
           "exit 0",
           count, count);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "sh", "-c", cmd, END),
                0);
  assert_non_null(strstr(r.err, "attempt 1 of 6"));
  result_free(&r);
  assert_int_equal(read_number(count), 2);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "locked"), 1);
  assert_int_equal(json_int(r.out, "last_delay_ms"), 200);
  assert_int_equal(json_int(r.out, "admitted"), 2);
  assert_int_equal(json_int(r.out, "probes"), 1); /* the retry probed */
  assert_int_equal(json_int(r.out, "lock_episode"), 0); /* and ended it */
  result_free(&r);
}

static void test_throttlectl_run_default_retry_after(void **state) {
  struct seg *s = *state;
  struct result r;
  const char *writes[] = {"", "echo soon > \"$THROTTLE_RETRY_AFTER_FILE\";",
                          "rm \"$THROTTLE_RETRY_AFTER_FILE\";"};
  for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s exit 75", writes[i]);
    assert_status(&r, ctl(&r, s->name, "run", "k", "--retries", "0", "--",
                          "sh", "-c", cmd, END),
                  75);
    result_free(&r);
    assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
    assert_int_equal(json_int(r.out, "last_delay_ms"), 5000);
    result_free(&r);
    assert_status(&r, ctl(&r, s->name, "clear", "k", END), 0);
    result_free(&r);
  }
}

static void test_throttlectl_run_timeout_counts_across_retries(void **state) {
  struct seg *s = *state;
  struct result r;
  char log[256], cmd[1024];
  scratch(s, "log", log, sizeof log);
  snprintf(cmd, sizeof cmd,
           "echo run >> '%s'; echo 30 > \"$THROTTLE_RETRY_AFTER_FILE\"; "
           "exit 75",
           log);
  /* The first attempt is admitted at once; the retry would have to wait
   * 30 s, past what is left of the 0.3 s. */
  assert_status(&r, ctl(&r, s->name, "run", "k", "--timeout", "0.3", "--",
                        "sh", "-c", cmd, END),
                75);
  assert_non_null(strstr(r.err, "not admitted within"));
  assert_true(r.ns < UINT64_C(20000000000)); /* not the 30 s */
  result_free(&r);
  assert_int_equal(count_lines(log), 1);
}

static void test_throttlectl_run_unrunnable_command(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "/nonexistent", END),
                127);
  assert_non_null(strstr(r.err, "/nonexistent"));
  assert_non_null(strstr(r.err, "cannot run"));
  result_free(&r);
  char plain[256];
  scratch(s, "not-executable", plain, sizeof plain);
  write_file(plain, "#!/bin/sh\nexit 0\n");
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", plain, END), 126);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "admitted"), 2);
  assert_int_equal(json_int(r.out, "permanent"), 0); /* abandoned */
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

static void test_throttlectl_run_killed_command_is_not_retried(void **state) {
  struct seg *s = *state;
  struct result r;
  char log[256], cmd[1024];
  scratch(s, "log", log, sizeof log);
  snprintf(cmd, sizeof cmd, "echo run >> '%s'; kill -KILL $$", log);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "sh", "-c", cmd, END),
                128 + SIGKILL);
  result_free(&r);
  assert_int_equal(count_lines(log), 1);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "permanent"), 0);
  assert_int_equal(json_int(r.out, "locked"), 0);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

static void test_throttlectl_run_exports_retry_after_file(void **state) {
  struct seg *s = *state;
  struct result r;
  /* A fresh file in $TMPDIR, there while CMD runs, gone afterwards. */
  setenv("TMPDIR", s->dir, 1);
  int st = ctl(&r, s->name, "run", "k", "--", "sh", "-c",
               "test -f \"$THROTTLE_RETRY_AFTER_FILE\" && "
               "test -w \"$THROTTLE_RETRY_AFTER_FILE\" && "
               "test ! -s \"$THROTTLE_RETRY_AFTER_FILE\" && "
               "echo \"$THROTTLE_RETRY_AFTER_FILE\"",
               END);
  unsetenv("TMPDIR");
  assert_status(&r, st, 0);
  assert_true(strncmp(r.out, s->dir, strlen(s->dir)) == 0);
  assert_true(r.outlen > 1 && r.out[r.outlen - 1] == '\n');
  r.out[r.outlen - 1] = 0;
  assert_false(exists(r.out));
  result_free(&r);
}

static void test_throttlectl_run_holder_is_the_run_process(void **state) {
  struct seg *s = *state;
  struct result r;
  char release[256];
  scratch(s, "release", release, sizeof release);
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel", "1", END),
                0);
  result_free(&r);
  struct proc holder;
  ctl_spawn(&holder, s->name, "run", "k", "--class", "backfill", "--", "sh",
            "-c", "while [ ! -e \"$0\" ]; do sleep 0.02; done", release, END);
  wait_field(s, "k", "in_flight", 1);

  assert_status(&r, ctl(&r, s->name, "ls", END), 0);
  const char *row = strstr(r.out, "\nk ");
  assert_non_null(row);
  assert_non_null(strstr(row, " 1/1 "));
  result_free(&r);

  char pid[64];
  snprintf(pid, sizeof pid, "\"holders\":[{\"pid\":%ld,", (long)holder.pid);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_non_null(strstr(r.out, pid)); /* throttlectl's pid, not CMD's */
  assert_non_null(strstr(r.out, "\"class\":\"backfill\""));
  assert_non_null(strstr(r.out, "\"probe\":false,\"comm\":\"throttlectl\"}]"));
  if (have_python) {
    static const char check[] =
        "import json,sys\n"
        "d=json.load(sys.stdin)\n"
        "h=d['holders']\n"
        "assert len(h)==1, h\n"
        "assert h[0]['pid']==int(sys.argv[1]) and h[0]['class']=='backfill'\n"
        "assert h[0]['age_ms']>=0 and h[0]['probe'] is False\n";
    char arg[32];
    snprintf(arg, sizeof arg, "%ld", (long)holder.pid);
    assert_int_equal(python_json(r.out, check, arg), 0);
  }
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "--json", END), 0);
  assert_non_null(strstr(r.out, pid));
  result_free(&r);

  /* Human form: a holders section with pid, process name and class. */
  assert_status(&r, ctl(&r, s->name, "show", "k", END), 0);
  const char *h = strstr(r.out, "\nholders:\n");
  assert_non_null(h);
  snprintf(pid, sizeof pid, "%ld  throttlectl  backfill", (long)holder.pid);
  assert_non_null(strstr(h, pid));
  result_free(&r);

  write_file(release, "");
  finish(&holder, &r);
  assert_status(&r, r.status, 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", END), 0);
  assert_non_null(strstr(r.out, "\nholders: none\n"));
  result_free(&r);
}

static void test_throttlectl_run_forwards_sigterm(void **state) {
  struct seg *s = *state;
  struct result r;
  char ready[256];
  scratch(s, "ready", ready, sizeof ready);
  struct proc p;
  ctl_spawn(&p, s->name, "run", "k", "--", "sh", "-c",
            "trap 'exit 42' TERM; : > \"$0\"; "
            "while :; do sleep 0.02; done",
            ready, END);
  wait_file(ready);
  assert_int_equal(kill(p.pid, SIGTERM), 0);
  finish(&p, &r);
  assert_status(&r, r.status, 42); /* CMD's answer to the signal */
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

/* 1 while pid runs; 0 once it is gone or a zombie. */
static int proc_alive(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

static void test_throttlectl_run_killed_hands_over_slot(void **state) {
  struct seg *s = *state;
  struct result r;
  char pidfile[256];
  scratch(s, "cmd.pid", pidfile, sizeof pidfile);
  assert_status(&r, ctl(&r, s->name, "set", "k", "--max-parallel", "1", END),
                0);
  result_free(&r);
  struct proc p;
  ctl_spawn(&p, s->name, "run", "k", "--", "sh", "-c",
            "echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; "
            "while :; do sleep 0.02; done",
            pidfile, END);
  wait_file(pidfile);
  long cmd = read_number(pidfile);
  assert_true(cmd > 0);
  assert_int_equal(kill(p.pid, SIGKILL), 0);
  finish(&p, &r);
  assert_int_equal(r.status, 128 + SIGKILL);
  result_free(&r);
  /* CMD does not outlive its admission... */
  for (int i = 0; i < 1000 && proc_alive(cmd); i++)
    sleep_ms(20);
  assert_false(proc_alive(cmd));
  /* ...and the slot goes to the next caller (I5, I6). */
  assert_status(&r, ctl(&r, s->name, "run", "k", "--timeout", "30", "--",
                        "true", END),
                0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "reclaims"), 1);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

static bool have_flock(void) {
  return system("command -v flock >/dev/null 2>&1") == 0;
}

static void test_throttlectl_run_caps_concurrency(void **state) {
  struct seg *s = *state;
  if (!have_flock())
    skip();
  struct result r;
  char script[256], count[256], max[256], lock[256];
  scratch(s, "cmd.sh", script, sizeof script);
  scratch(s, "count", count, sizeof count);
  scratch(s, "max", max, sizeof max);
  scratch(s, "lock", lock, sizeof lock);
  write_file(count, "0\n");
  write_file(max, "0\n");
  /* In flight +1 (recording the largest seen), a pause, in flight -1;
   * every update under one lock. */
  write_file(script, "d=$(dirname \"$0\")\n"
                     "exec 9>\"$d/lock\"\n"
                     "flock 9\n"
                     "n=$(($(cat \"$d/count\") + 1)); echo $n > \"$d/count\"\n"
                     "if [ $n -gt $(cat \"$d/max\") ]; then "
                     "echo $n > \"$d/max\"; fi\n"
                     "flock -u 9\n"
                     "sleep 0.1\n"
                     "flock 9\n"
                     "echo $(($(cat \"$d/count\") - 1)) > \"$d/count\"\n");
  enum { N = 6 };
  struct proc p[N];
  for (int i = 0; i < N; i++)
    ctl_spawn(&p[i], s->name, "run", "k", "--max-parallel", "2", "--", "sh",
              script, END);
  for (int i = 0; i < N; i++) {
    finish(&p[i], &r);
    assert_status(&r, r.status, 0);
    result_free(&r);
  }
  print_message("most in flight at once: %lld\n", read_number(max));
  assert_true(read_number(max) >= 1);
  assert_true(read_number(max) <= 2); /* I5 */
  assert_int_equal(read_number(count), 0);
  assert_status(&r, ctl(&r, s->name, "show", "k", "--json", END), 0);
  assert_int_equal(json_int(r.out, "admitted"), N);
  assert_int_equal(json_int(r.out, "cap"), 2);
  assert_int_equal(json_int(r.out, "in_flight"), 0);
  result_free(&r);
}

static void test_throttlectl_rm_removes_segment(void **state) {
  struct seg *s = *state;
  struct result r;
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "5", END), 0);
  result_free(&r);
  assert_true(exists(s->path));
  assert_status(&r, ctl(&r, s->name, "rm", END), 0);
  result_free(&r);
  assert_false(exists(s->path));
  /* Inspection does not recreate it. */
  assert_status(&r, ctl(&r, s->name, "show", "k", END), 1);
  assert_non_null(strstr(r.err, "does not exist"));
  result_free(&r);
  assert_false(exists(s->path));
  assert_status(&r, ctl(&r, s->name, "rm", END), 1);
  assert_non_null(strstr(r.err, s->name));
  assert_non_null(strstr(r.err, "no such segment"));
  result_free(&r);
}

static void test_throttlectl_garbage_segment_needs_rm(void **state) {
  struct seg *s = *state;
  struct result r;
  /* A fixed, printed seed: the bytes are the same on every run. */
  uint64_t x = UINT64_C(0x9e3779b97f4a7c15);
  print_message("garbage seed 0x%016llx\n", (unsigned long long)x);
  unsigned char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    junk[i] = (unsigned char)((x * UINT64_C(0x2545f4914f6cdd1d)) >> 56);
  }
  junk[0] |= 1; /* a non-zero magic: "someone else's", never rebuilt */
  int fd = open(s->path, O_CREAT | O_EXCL | O_WRONLY, 0600);
  assert_true(fd >= 0);
  assert_int_equal(fchmod(fd, 0600), 0);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);

  const char *cmds[][3] = {{"ls", NULL},
                           {"show", "k", NULL},
                           {"backoff", "k", "1"},
                           {"wait", "k", NULL},
                           {"reset", NULL}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    assert_status(&r, ctl(&r, s->name, cmds[i][0], cmds[i][1], cmds[i][2],
                          END),
                  1);
    assert_true(strncmp(r.err, "throttlectl: ", 13) == 0);
    assert_non_null(strstr(r.err, s->name));
    assert_non_null(strstr(r.err, "throttlectl rm"));
    assert_null(strstr(r.err, "falling back"));
    result_free(&r);
  }
  /* Nobody wrote to it. */
  unsigned char back[4096];
  fd = open(s->path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(read(fd, back, sizeof back), (ssize_t)sizeof back);
  close(fd);
  assert_memory_equal(back, junk, sizeof junk);

  /* run is a loader: it warns and runs CMD anyway (fail open, I7), and
   * still leaves the segment alone. */
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "sh", "-c", "exit 0",
                        END),
                0);
  assert_non_null(strstr(r.err, "throttlectl: warning: "));
  assert_non_null(strstr(r.err, s->name));
  assert_non_null(strstr(r.err, "throttlectl rm"));
  assert_non_null(strstr(r.err, "process-private"));
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "run", "k", "--", "sh", "-c", "exit 3",
                        END),
                3);
  result_free(&r);
  fd = open(s->path, O_RDONLY);
  assert_true(fd >= 0);
  assert_int_equal(read(fd, back, sizeof back), (ssize_t)sizeof back);
  close(fd);
  assert_memory_equal(back, junk, sizeof junk);

  assert_status(&r, ctl(&r, s->name, "rm", END), 0);
  result_free(&r);
  assert_false(exists(s->path));
  assert_status(&r, ctl(&r, s->name, "backoff", "k", "1", END), 0);
  result_free(&r);
}

static void test_throttlectl_help_and_version(void **state) {
  (void)state;
  struct result r;
  assert_status(&r, ctl(&r, NULL, "--help", END), 0);
  assert_non_null(strstr(r.out, "usage: throttlectl"));
  assert_non_null(strstr(r.out, "backoff KEY RETRY_AFTER"));
  result_free(&r);
  assert_status(&r, ctl(&r, NULL, "wait", "--help", END), 0);
  assert_non_null(strstr(r.out, "--timeout DURATION"));
  result_free(&r);
  assert_status(&r, ctl(&r, NULL, "--help", END), 0);
  const char *cmds[] = {"set KEY", "pause KEY", "resume KEY", "cancel KEY",
                        "run KEY"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    assert_non_null(strstr(r.out, cmds[i]));
  result_free(&r);
  assert_status(&r, ctl(&r, NULL, "run", "--help", END), 0);
  assert_non_null(strstr(r.out, "--retries N"));
  assert_non_null(strstr(r.out, "--class live|backfill"));
  assert_non_null(strstr(r.out, "-- CMD"));
  result_free(&r);
  assert_status(&r, ctl(&r, NULL, "set", "--help", END), 0);
  assert_non_null(strstr(r.out, "--rate N/PERIOD"));
  result_free(&r);
  assert_status(&r, ctl(&r, NULL, "--version", END), 0);
  assert_non_null(strstr(r.out, "throttlectl "));
  result_free(&r);
}

int main(void) {
  const char *b = getenv("B");
  snprintf(ctl_path, sizeof ctl_path, "%s/throttlectl",
           b != NULL && *b ? b : "build");
  if (access(ctl_path, X_OK) != 0) {
    fprintf(stderr, "%s: not found (build it with make)\n", ctl_path);
    return 1;
  }
  /* Small segments, and nothing from the caller's environment. */
  setenv("THROTTLE_KEYS", "64", 1);
  unsetenv("THROTTLE_SEGMENT");
  unsetenv("THROTTLE_MAX_DELAY_MS");
  signal(SIGPIPE, SIG_IGN);
  have_python = system("python3 -c 'import json' >/dev/null 2>&1") == 0;
  if (!have_python)
    fprintf(stderr, "python3 not found: JSON parse checks are skipped\n");

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_throttlectl_backoff_then_show_json),
      T(test_throttlectl_backoff_accepts_decimal_seconds),
      T(test_throttlectl_durations_everywhere),
      T(test_throttlectl_ls_table_lists_key),
      T(test_throttlectl_ls_without_keys_prints_only_header),
      T(test_throttlectl_ls_json_parses),
      T(test_throttlectl_json_escapes_keys),
      T(test_throttlectl_wait_timeout_exits_75),
      T(test_throttlectl_wait_sleeps_out_backoff),
      T(test_throttlectl_clear_releases_waiter),
      T(test_throttlectl_reset_opens_every_key),
      T(test_throttlectl_clear_unknown_key_exits_1),
      T(test_throttlectl_lock_timeout_exits_75),
      T(test_throttlectl_usage_errors_exit_64),
      T(test_throttlectl_set_bad_values_exit_64),
      T(test_throttlectl_set_max_parallel_fixed_then_auto),
      T(test_throttlectl_set_rate_and_backfill_share),
      T(test_throttlectl_ls_shows_flight_wait_and_state),
      T(test_throttlectl_holders_by_name),
      T(test_throttlectl_ls_patterns),
      T(test_throttlectl_pause_holds_run_until_resume),
      T(test_throttlectl_cancel_ends_waiting_run),
      T(test_throttlectl_show_counts_waiters_it_does_not_list),
      T(test_throttlectl_run_passes_on_permanent_status),
      T(test_throttlectl_run_retries_locked_then_gives_up),
      T(test_throttlectl_run_succeeds_on_second_attempt),
      T(test_throttlectl_run_default_retry_after),
      T(test_throttlectl_run_timeout_counts_across_retries),
      T(test_throttlectl_run_unrunnable_command),
      T(test_throttlectl_run_killed_command_is_not_retried),
      T(test_throttlectl_run_exports_retry_after_file),
      T(test_throttlectl_run_holder_is_the_run_process),
      T(test_throttlectl_run_forwards_sigterm),
      T(test_throttlectl_run_killed_hands_over_slot),
      T(test_throttlectl_run_caps_concurrency),
      T(test_throttlectl_rm_removes_segment),
      T(test_throttlectl_garbage_segment_needs_rm),
      T(test_throttlectl_help_and_version),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
