/*
 * test_throttlectl.c — throttlectl as scripts use it: run the real binary
 * ($B/throttlectl, B defaulting to "build") in child processes and check
 * exit statuses, stdout and stderr.  Each test has its own segment
 * ("/thr-ctl-test-<pid>-<n>"), removed in its teardown.
 *
 * JSON output is checked with python3's json module when python3 is there
 * (the test is skipped, not failed, without it).  The only timing checks are
 * lower bounds, or upper bounds far above what is asked (a 0.2 s timeout
 * against a 5 s back-off).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 32
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

/* A number field of a flat JSON object: "name":N. */
static long long json_int(const char *json, const char *name) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", name);
  const char *p = strstr(json, pat);
  assert_non_null(p);
  return strtoll(p + strlen(pat), NULL, 10);
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

/* ---- fixtures --------------------------------------------------------- */

struct seg {
  char name[64];  /* "/thr-ctl-test-<pid>-<n>" */
  char path[128]; /* "/dev/shm/thr-ctl-test-..." */
};

static int setup(void **state) {
  static int n;
  struct seg *s = calloc(1, sizeof *s);
  if (s == NULL)
    return -1;
  snprintf(s->name, sizeof s->name, "/thr-ctl-test-%ld-%d", (long)getpid(),
           ++n);
  snprintf(s->path, sizeof s->path, "/dev/shm%s", s->name);
  shm_unlink(s->name);
  *state = s;
  return 0;
}

static int teardown(void **state) {
  struct seg *s = *state;
  shm_unlink(s->name);
  free(s);
  return 0;
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

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
  const char *cols[] = {"LEFT", "PUBLISHES", "WAITS", "WAITED",
                        "LAST", "PID",       "IDLE"};
  for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
    assert_non_null(strstr(head, cols[i]));
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
      " if n!='key')\n";
  assert_int_equal(python_json(r.out, check, s->name), 0);
  result_free(&r);
}

static void test_throttlectl_json_escapes_keys(void **state) {
  struct seg *s = *state;
  struct result r;
  const char *key = "q\"uo\\te\ttab\x01 caf\xc3\xa9";
  assert_status(&r, ctl(&r, s->name, "backoff", key, "5", END), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "ls", "--json", END), 0);
  assert_non_null(
      strstr(r.out, "\"key\":\"q\\\"uo\\\\te\\u0009tab\\u0001 caf\xc3\xa9\""));
  if (have_python)
    assert_int_equal(python_json(r.out, PY_HAS_KEY, key), 0);
  result_free(&r);
  assert_status(&r, ctl(&r, s->name, "show", key, "--json", END), 0);
  if (have_python)
    assert_int_equal(python_json(r.out, PY_HAS_KEY, key), 0);
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

static void test_throttlectl_usage_errors_exit_64(void **state) {
  struct seg *s = *state;
  char long_key[257];
  memset(long_key, 'k', 256);
  long_key[256] = 0;
  const char *cases[][5] = {
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
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *argv[8];
    int n = 0;
    argv[n++] = ctl_path;
    argv[n++] = "--segment";
    argv[n++] = s->name;
    for (int j = 0; cases[i][j] != NULL; j++)
      argv[n++] = (char *)cases[i][j];
    argv[n] = NULL;
    struct proc p;
    struct result r;
    spawn(argv, NULL, &p);
    finish(&p, &r);
    if (r.status != 64)
      print_message("case %zu (%s %s) \n", i, cases[i][0] ? cases[i][0] : "",
                    cases[i][0] && cases[i][1] ? cases[i][1] : "");
    assert_status(&r, r.status, 64);
    assert_true(strncmp(r.err, "throttlectl: ", 13) == 0);
    assert_int_equal(r.outlen, 0);
    result_free(&r);
    /* A usage error never creates the segment. */
    assert_false(exists(s->path));
  }
  struct result r;
  assert_status(&r, ctl(&r, "bad/name", "ls", END), 64);
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
  assert_non_null(strstr(r.out, "--timeout SEC"));
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
      T(test_throttlectl_ls_table_lists_key),
      T(test_throttlectl_ls_without_keys_prints_only_header),
      T(test_throttlectl_ls_json_parses),
      T(test_throttlectl_json_escapes_keys),
      T(test_throttlectl_wait_timeout_exits_75),
      T(test_throttlectl_wait_sleeps_out_backoff),
      T(test_throttlectl_clear_releases_waiter),
      T(test_throttlectl_reset_opens_every_key),
      T(test_throttlectl_clear_unknown_key_exits_1),
      T(test_throttlectl_usage_errors_exit_64),
      T(test_throttlectl_rm_removes_segment),
      T(test_throttlectl_garbage_segment_needs_rm),
      T(test_throttlectl_help_and_version),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
