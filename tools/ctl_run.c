/* SPDX-License-Identifier: MIT */
/*
 * ctl_run.c — `run KEY [opts] -- CMD [ARG...]`: wait for admission to KEY,
 * run CMD, report its outcome to the gate, and retry while it says the key
 * is locked.
 *
 * CMD speaks through its exit status, as sysexits(3) programs and job
 * runners already do: 0 is success; 75 (EX_TEMPFAIL) is "locked, come back
 * later", with the delay written to the file $THROTTLE_RETRY_AFTER_FILE
 * names (a fresh one per attempt, removed afterwards); anything else is a
 * permanent failure, reported as such and never retried.  A retry enters
 * again, so it sleeps out the back-off the failed attempt published, behind
 * the lock episode's probe like every other process (I1, I3).
 *
 * The holder of the admission is this process, not CMD: CMD runs in a
 * child that leads a process group of its own, and the slot is given back
 * when that whole group is gone (CMD's background children included), or
 * reclaimed when this process dies.  In that case a keeper process that
 * leads CMD's group sends SIGTERM to the group, once, then SIGKILL a second
 * later: left running, CMD and its children would go on without the slot
 * that someone else now holds (I5).  (PR_SET_PDEATHSIG only when the
 * keeper could not be started: it reaches CMD alone.)  A descendant that
 * leaves the group (setsid) escapes both; docs/throttlectl.md says so.
 * Exit statuses follow the shell: CMD's own status, 126/127 when it cannot
 * be executed, 128 + N when signal N ended it.
 *
 * Signals.  SIGINT, SIGTERM and SIGHUP sent to this process while CMD's
 * group runs are passed on to the group, each kind once, and no retry
 * follows (a CMD exiting 75 then publishes nothing).  Because CMD has a
 * group of its own, a signal sent to ours (a job runner, timeout(1))
 * reaches CMD only through us, once.  Rejected: skipping signals "that
 * came from the group" (si_code cannot tell kill(pid) from kill(-pgid)),
 * and forwarding every signal (timeout(1) signals us twice).  While we own
 * the terminal's foreground, CMD's group gets it (tcsetpgrp), as a shell
 * gives it to a job.  While waiting for admission the signals keep their
 * usual effect; the library reclaims the waiting slot of a process that
 * died.
 *
 * Fail open (I7).  With an unusable segment the command still runs, on the
 * library's process-private fallback (throttlectl.c warns).  If admission
 * itself fails for another reason than a timeout or a cancel (key table
 * full, a mutex nobody releases), CMD runs without admission and a lock
 * is waited out here, after publishing it for the others if that works.
 */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RETRY_AFTER_ENV "THROTTLE_RETRY_AFTER_FILE"
#define DEFAULT_RETRY_AFTER_MS 5000u
#define RETRIES_DEFAULT 5u
/* Without admission, the longest this process sleeps for one lock: the
 * library's default maximum delay. */
#define LOCAL_SLEEP_MAX_MS 900000u

/* ---- arguments -------------------------------------------------------- */

int ctl_check_run(struct ctx *c) {
  int rc = ctl_check_class(c);
  if (rc == 0)
    rc = ctl_check_retries(c, RETRIES_DEFAULT);
  if (rc == 0)
    rc = ctl_check_max_parallel(c);
  if (rc == 0)
    rc = ctl_check_timeout(c);
  if (rc == 0 && c->nargs < 2)
    rc = ctl_usage_error(c->cmd, "missing CMD to run");
  return rc;
}

/* ---- time ------------------------------------------------------------- */

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(uint64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ---- the Retry-After file --------------------------------------------- */

static const char *tmp_dir(void) {
  const char *d = getenv("TMPDIR");
  return d != NULL && *d != 0 ? d : "/tmp";
}

/* An empty file of our own (mode 0600) for CMD to write to. */
static int retry_file_new(char *path, size_t len) {
  int n = snprintf(path, len, "%s/throttlectl-retry-after.XXXXXX", tmp_dir());
  if (n < 0 || (size_t)n >= len) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0)
    return -1;
  close(fd);
  return 0;
}

static bool is_blank(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
}

/* What CMD wrote, a duration as the command line takes one (delta-seconds
 * "5", "1.5", "250ms", "2m"), with blanks around it allowed.  false when the file is gone, empty, or holds
 * anything else; the caller then uses the default. */
static bool retry_file_read(const char *path, uint64_t *ms) {
  char buf[64];
  /* CMD may have replaced the file with anything: a FIFO would block
   * open() and read() while SIGINT and SIGTERM are held back (and the slot
   * with them).  Non-blocking, and only a regular file is read. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return false;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return false;
  }
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = 0;
  char *p = buf, *e = buf + n;
  while (is_blank(*p))
    p++;
  while (e > p && is_blank(e[-1]))
    *--e = 0;
  return ctl_parse_duration(p, ms, NULL, 0) == 0;
}

/* ---- running CMD ------------------------------------------------------ */

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
#define NFORWARDED (sizeof forwarded / sizeof forwarded[0])

static volatile sig_atomic_t child_pgid;  /* 0 when no CMD group runs */
static volatile sig_atomic_t interrupted; /* a forwarded signal came */
static sigset_t saved_mask;
static struct sigaction saved_act[NFORWARDED];
static bool handler_set[NFORWARDED];

/* CMD runs in a process group of its own, so a signal sent to this
 * process's group (a job runner's kill -TERM -- -PGID, timeout(1)) reaches
 * CMD once, from here, and never twice. */
static volatile sig_atomic_t sent_mask; /* 1 << sig: passed on already */

/* Each signal is passed on once per CMD: timeout(1) and many supervisors
 * send one signal twice (to this process, then to its group), and a
 * program that reads a second SIGTERM or ^C as "force quit" must not get
 * one from a single request to stop. */
static void forward(int sig) {
  interrupted = 1;
  int e = errno;
  pid_t pg = (pid_t)child_pgid;
  if (pg > 0 && !(sent_mask & (1 << sig))) {
    sent_mask |= 1 << sig;
    kill(-pg, sig);
  }
  errno = e;
}

static void block_forwarded(void) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < NFORWARDED; i++)
    sigaddset(&set, forwarded[i]);
  sigprocmask(SIG_BLOCK, &set, &saved_mask);
}

static void unblock_forwarded(void) {
  sigprocmask(SIG_SETMASK, &saved_mask, NULL);
}

/* Forward while CMD's group lives; a signal this process was told to
 * ignore stays ignored (CMD inherits that too). */
static void handlers_install(void) {
  for (size_t i = 0; i < NFORWARDED; i++) {
    handler_set[i] = false;
    if (sigaction(forwarded[i], NULL, &saved_act[i]) != 0 ||
        saved_act[i].sa_handler == SIG_IGN)
      continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    handler_set[i] = sigaction(forwarded[i], &sa, NULL) == 0;
  }
}

static void handlers_restore(void) {
  for (size_t i = 0; i < NFORWARDED; i++)
    if (handler_set[i])
      sigaction(forwarded[i], &saved_act[i], NULL);
}

/* The terminal, when this process owns its foreground: CMD's group is
 * given the foreground while it runs (as a shell does for a job), so that
 * CMD may read the terminal and ^C reaches CMD's group, once. */
static int tty_fd(void) {
  return isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp()
             ? STDIN_FILENO
             : -1;
}

static void tty_give(int fd, pid_t pgid) {
  if (fd < 0)
    return;
  /* From a background group tcsetpgrp() raises SIGTTOU unless blocked. */
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGTTOU);
  sigprocmask(SIG_BLOCK, &set, &old);
  (void)tcsetpgrp(fd, pgid);
  sigprocmask(SIG_SETMASK, &old, NULL);
}

/* The keeper: a small process that leads CMD's process group and outlives
 * this one.  If this process dies without saying goodbye (kill -9), the
 * library reclaims its slot, and CMD and its children would go on without
 * it (I5): the keeper then sends SIGTERM to the group, and SIGKILL
 * KEEPER_GRACE_MS later (to itself too, last).  It is forked before CMD,
 * so that CMD can join its group at once, and it stands in for
 * PR_SET_PDEATHSIG (which reaches CMD only, and would be a second SIGTERM
 * for it).  Its pid names the group and cannot be reused while the group
 * lives.  Returns the write end to say goodbye on (one byte, then close)
 * and the group in *pgid, or -1 (then CMD leads a group of its own). */
#define KEEPER_GRACE_MS 1000
static int keeper_start(pid_t *pgid) {
  int kfd[2];
  if (pipe2(kfd, O_CLOEXEC) != 0)
    return -1;
  pid_t k = fork();
  if (k < 0) {
    close(kfd[0]);
    close(kfd[1]);
    return -1;
  }
  if (k == 0) {
    close(kfd[1]);
    /* Hold nothing of this process's open: a pipe a caller reads to its
     * end must not wait for the keeper. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
    }
    if (dup2(kfd[0], 3) == 3) {
      kfd[0] = 3;
      close_range(4, ~0u, 0);
    }
    signal(SIGTERM, SIG_IGN); /* its own SIGTERM to the group */
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    setpgid(0, 0);
    char b;
    ssize_t n;
    while ((n = read(kfd[0], &b, 1)) < 0 && errno == EINTR)
      ;
    if (n == 1)
      _exit(0); /* goodbye */
    kill(0, SIGTERM);
    struct timespec ts = {KEEPER_GRACE_MS / 1000,
                          (KEEPER_GRACE_MS % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
      ;
    kill(0, SIGKILL);
    _exit(0);
  }
  close(kfd[0]);
  setpgid(k, k); /* also here: the group exists before CMD joins it */
  *pgid = k;
  return kfd[1];
}

/* Wait until no process is left in CMD's group: its members become our
 * children as their parents end (PR_SET_CHILD_SUBREAPER, set in
 * ctl_cmd_run), and one that is not (its parent left the group) is polled
 * for.  Signals are not blocked meanwhile, so they are forwarded. */
static void group_wait(pid_t pgid) {
  while (waitpid(-pgid, NULL, 0) > 0 || errno == EINTR)
    ;
  while (kill(-pgid, 0) == 0) {
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    while (waitpid(-pgid, NULL, WNOHANG) > 0)
      ;
  }
}

struct cmd_end {
  enum { END_EXIT, END_SIGNAL, END_NOEXEC } how;
  int code; /* exit status, signal number, or execvp's errno */
};

/* Run argv in a process group of its own until the whole group is gone,
 * with $THROTTLE_RETRY_AFTER_FILE set to retry_path (unset when NULL).
 * Returns 0 and fills *end (CMD's own end), or -1 (said why) when CMD
 * could not be started.  Returns with SIGINT, SIGTERM and SIGHUP blocked
 * either way: one that arrives after the group ended waits until the
 * outcome has been reported, so the slot is handed back before it takes
 * effect.  Nothing that may block runs while they are blocked. */
static int cmd_spawn_wait(char **argv, const char *retry_path,
                          struct cmd_end *end) {
  int pfd[2];
  block_forwarded();
  if (retry_path != NULL)
    setenv(RETRY_AFTER_ENV, retry_path, 1);
  else
    unsetenv(RETRY_AFTER_ENV);
  fflush(stdout);
  fflush(stderr);
  /* Before the pipe below: the keeper must not hold its write end. */
  pid_t pgid = 0;
  int keeper = keeper_start(&pgid);
  /* CLOEXEC: closed by a successful exec, so EOF says CMD started. */
  if (pipe2(pfd, O_CLOEXEC) != 0) {
    ctl_say("cannot run %s: pipe: %s", argv[0], strerror(errno));
    if (keeper >= 0) {
      close(keeper); /* no goodbye: it ends its (empty) group, and itself */
      group_wait(pgid);
    }
    return -1;
  }
  int tty = tty_fd();
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    ctl_say("cannot run %s: fork: %s", argv[0], strerror(errno));
    close(pfd[0]);
    close(pfd[1]);
    if (keeper >= 0) {
      close(keeper); /* no goodbye: it ends its (empty) group, and itself */
      group_wait(pgid);
    }
    return -1;
  }
  if (pid == 0) {
    close(pfd[0]);
    setpgid(0, pgid);
    tty_give(tty, getpgrp());
    /* Without a keeper: ends CMD if we die; kept across execve.  If we
     * died already, the signal will not come: stop here. */
    if (keeper < 0 && prctl(PR_SET_PDEATHSIG, SIGTERM) == 0 &&
        getppid() != parent)
      _exit(128 + SIGTERM);
    sigprocmask(SIG_SETMASK, &saved_mask, NULL);
    execvp(argv[0], argv);
    int e = errno;
    ssize_t w = write(pfd[1], &e, sizeof e);
    (void)w;
    _exit(e == ENOENT ? 127 : 126);
  }
  close(pfd[1]);
  if (pgid == 0)
    pgid = pid;
  setpgid(pid, pgid); /* also here: whichever runs first */
  tty_give(tty, pgid);
  sent_mask = 0;
  child_pgid = pgid;
  handlers_install();
  unblock_forwarded(); /* a signal that came meanwhile is forwarded now */

  int err = 0;
  ssize_t n;
  do
    n = read(pfd[0], &err, sizeof err);
  while (n < 0 && errno == EINTR);
  close(pfd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  if (keeper >= 0) {
    ssize_t w = write(keeper, "", 1);
    (void)w;
    close(keeper);
  }
  group_wait(pgid);
  tty_give(tty, getpgrp());
  block_forwarded();
  child_pgid = 0;
  handlers_restore();
  if (n == (ssize_t)sizeof err) {
    end->how = END_NOEXEC;
    end->code = err;
  } else if (WIFSIGNALED(st)) {
    end->how = END_SIGNAL;
    end->code = WTERMSIG(st);
  } else {
    end->how = END_EXIT;
    end->code = WEXITSTATUS(st);
  }
  return 0;
}

/* ---- the loop --------------------------------------------------------- */

static int timed_out(const struct ctx *c, const char *ktext) {
  char t[32];
  ctl_say("%s: not admitted within %s (--timeout)", ktext,
          ctl_human_ms((int64_t)c->timeout_ms, false, t, sizeof t));
  return XIT_TEMP;
}

/* Run CMD once (admitted, or failing open).  Returns the outcome to report
 * and sets *status (run's exit status for it) and *retry_ms (for LOCKED). */
static throttle_outcome_t attempt(char **argv, int *status,
                                  uint64_t *retry_ms) {
  char path[PATH_MAX];
  bool have_path = retry_file_new(path, sizeof path) == 0;
  if (!have_path)
    ctl_say("warning: cannot create a file in %s for CMD's Retry-After: %s; "
            "a lock is retried after %u s",
            tmp_dir(), strerror(errno), DEFAULT_RETRY_AFTER_MS / 1000);
  struct cmd_end end;
  int rc = cmd_spawn_wait(argv, have_path ? path : NULL, &end);
  uint64_t ms = DEFAULT_RETRY_AFTER_MS;
  if (have_path) {
    if (rc == 0 && end.how == END_EXIT && end.code == EX_TEMPFAIL &&
        retry_file_read(path, &ms) && ms == 0)
      ms = 1; /* "now": the smallest back-off there is (0 means default) */
    unlink(path);
  }
  *retry_ms = 0;
  if (rc != 0) {
    *status = XIT_FAIL;
    return THROTTLE_OUTCOME_ABANDONED;
  }
  switch (end.how) {
  case END_NOEXEC:
    ctl_say("%s: cannot run: %s", argv[0], strerror(end.code));
    *status = end.code == ENOENT ? 127 : 126;
    return THROTTLE_OUTCOME_ABANDONED;
  case END_SIGNAL:
    *status = 128 + end.code;
    return THROTTLE_OUTCOME_ABANDONED;
  case END_EXIT:
    break;
  }
  *status = end.code;
  if (end.code == 0)
    return THROTTLE_OUTCOME_OK;
  if (end.code != EX_TEMPFAIL)
    return THROTTLE_OUTCOME_PERMANENT;
  *retry_ms = ms;
  return THROTTLE_OUTCOME_LOCKED;
}

int ctl_cmd_run(struct ctx *c) {
  const char *key = c->args[0];
  char **argv = c->args + 1;
  char ktext[KEY_TEXT_MAX], t[32];
  ctl_key_text(key, ktext, sizeof ktext);
  /* Inherited SIGCHLD = SIG_IGN would reap CMD before we see its status. */
  signal(SIGCHLD, SIG_DFL);
  /* CMD's orphaned children become ours, so that we can wait for them
   * (group_wait); without it they are polled for. */
  (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
  /* A throttlectl or library call inside CMD uses the same segment. */
  if (c->segment != NULL)
    setenv("THROTTLE_SEGMENT", c->segment, 1);
  if (c->opt[OPT_MAX_PARALLEL] != NULL) {
    int rc = throttle_set_max_parallel(c->h, key, c->max_parallel);
    if (rc != 0)
      ctl_say("warning: %s: cannot set the cap: %s", ktext,
              *throttle_errmsg(c->h) ? throttle_errmsg(c->h)
                                     : throttle_strerror(rc));
  }
  uint64_t waited = 0; /* waiting for admission, over all attempts */
  bool warned = false;
  for (unsigned n = 1;; n++) {
    uint64_t left = THROTTLE_FOREVER;
    if (c->timeout_ms != THROTTLE_FOREVER)
      left = c->timeout_ms > waited ? c->timeout_ms - waited : 0;
    throttle_ticket_t *ticket = NULL;
    uint64_t t0 = now_ms();
    int rc = throttle_enter(c->h, key, c->cls, left, &ticket);
    waited += now_ms() - t0;
    if (rc == THROTTLE_ETIMEDOUT)
      return timed_out(c, ktext);
    if (rc == THROTTLE_ECANCELED) {
      ctl_say("%s: canceled while waiting for admission", ktext);
      return XIT_FAIL;
    }
    if (rc != 0 && !warned) {
      ctl_say("warning: %s: running without admission: %s", ktext,
              *throttle_errmsg(c->h) ? throttle_errmsg(c->h)
                                     : throttle_strerror(rc));
      warned = true;
    }
    bool admitted = rc == 0;

    int status;
    uint64_t retry_ms;
    throttle_outcome_t outcome = attempt(argv, &status, &retry_ms);
    if (interrupted && outcome == THROTTLE_OUTCOME_LOCKED) {
      /* CMD exited 75 because it was told to stop, not because the key is
       * locked: nothing to publish to every other process. */
      outcome = THROTTLE_OUTCOME_ABANDONED;
      retry_ms = 0;
      ctl_say("%s: CMD exited %d after a signal; not retried, no back-off "
              "published", ktext, status);
    }
    if (admitted) {
      rc = throttle_leave(c->h, ticket, outcome, retry_ms);
      if (rc != 0)
        ctl_say("warning: %s: reporting the outcome: %s", ktext,
                *throttle_errmsg(c->h) ? throttle_errmsg(c->h)
                                       : throttle_strerror(rc));
    } else if (outcome == THROTTLE_OUTCOME_LOCKED) {
      (void)throttle_backoff(c->h, key, retry_ms); /* tell the others */
    }
    unblock_forwarded(); /* a signal held back takes effect now */

    if (outcome != THROTTLE_OUTCOME_LOCKED)
      return status;
    /* What the gate stores (and the wait): CMD's Retry-After, bounded by
     * the segment's maximum delay (said once when it is). */
    char what[KEY_TEXT_MAX + 32], given[32];
    snprintf(what, sizeof what, "%s: CMD's Retry-After", ktext);
    ctl_human_ms((int64_t)retry_ms, true, given, sizeof given);
    uint64_t wait_ms = ctl_warn_max_delay(c, what, given, retry_ms);
    if (interrupted) {
      ctl_say("%s: locked, not retrying after a signal", ktext);
      return XIT_TEMP;
    }
    if (n > c->retries) {
      ctl_say("%s: still locked after %u attempt%s", ktext, n,
              n == 1 ? "" : "s");
      return XIT_TEMP;
    }
    ctl_say("%s: locked (attempt %u of %u); retrying after %s", ktext, n,
            c->retries + 1, ctl_human_ms((int64_t)wait_ms, true, t, sizeof t));
    if (!admitted) {
      uint64_t d = wait_ms < LOCAL_SLEEP_MAX_MS ? wait_ms : LOCAL_SLEEP_MAX_MS;
      if (c->timeout_ms != THROTTLE_FOREVER && waited + d > c->timeout_ms)
        return timed_out(c, ktext);
      sleep_ms(d);
      waited += d;
    }
  }
}
