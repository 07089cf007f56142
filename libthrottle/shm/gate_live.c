/* SPDX-License-Identifier: MIT */
/*
 * gate_live.c — is a holder alive?  The evidence the gate uses to reclaim
 * the slot of a dead holder: /proc/PID/stat (state and start time), kill(),
 * and the PID namespace both sides are in.
 *
 * Dead only on evidence (I5): a holder that cannot be judged keeps its slot
 * until its lease lapses.  Rejected: OFD locks per slot (reliable death
 * detection, but inherited across fork(), so a child would keep a dead
 * parent's slot alive and cannot tell its parent's slots from its own),
 * pid alone (pid reuse), and pidfds (they need the holder's pid in our
 * namespace to open, which is exactly what another namespace lacks).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* What /proc says of a process: a zombie (dead to us: a killed child its
 * parent has not reaped yet), missing (no entry: gone, or hidden from us by
 * hidepid or a /proc of another PID namespace), alive with its start time
 * in clock ticks since boot, or unknown (unreadable, e.g. out of file
 * descriptors). */
enum { PROC_ZOMBIE, PROC_MISSING, PROC_ALIVE, PROC_UNKNOWN };

static int proc_start(pid_t pid, uint64_t *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT || errno == ESRCH ? PROC_MISSING : PROC_UNKNOWN;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  int e = errno;
  close(fd);
  if (n <= 0)
    return n < 0 && e == ESRCH ? PROC_MISSING : PROC_UNKNOWN;
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces */
  if (p == NULL || p[1] != ' ')
    return PROC_UNKNOWN;
  char state = p[2];
  if (state == 'Z' || state == 'X' || state == 'x')
    return PROC_ZOMBIE;
  /* Field 3 is the state; the start time is field 22. */
  p += 2;
  for (int field = 3; field < 22 && p != NULL; field++) {
    p = strchr(p, ' ');
    if (p != NULL)
      p++;
  }
  if (p == NULL)
    return PROC_UNKNOWN;
  *start = strtoull(p, NULL, 10);
  return PROC_ALIVE;
}

/* The pid, cached in a page the kernel zeroes in a forked child
 * (MADV_WIPEONFORK, Linux 4.14), so the cache needs no check of its own
 * and costs no system call; a child finds 0 and asks again.  Without the
 * page (an older kernel, or the mapping failed) getpid() every time.
 * Rejected: pthread_atfork() (not run by a raw clone() or _Fork(), and a
 * handler the library could never unregister when it is dlclose'd), and
 * comparing with getpid() on each use (the system call this saves). */
static _Atomic uint32_t *pid_page; /* set once, ordered by pid_once */
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;
static _Atomic(_Atomic uint32_t *) pid_page_seen; /* pid_page, once known */

static void pid_page_init(void) {
  long sz = sysconf(_SC_PAGESIZE);
  void *p = mmap(NULL, sz > 0 ? (size_t)sz : 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return;
#ifdef MADV_WIPEONFORK
  if (madvise(p, sz > 0 ? (size_t)sz : 4096, MADV_WIPEONFORK) == 0) {
    pid_page = p;
    return;
  }
#endif
  munmap(p, sz > 0 ? (size_t)sz : 4096);
}

uint32_t throttle__pid(void) {
  /* The page, once set, is set for good: pthread_once() only until then
   * (a call, on the hot path, per admission). */
  _Atomic uint32_t *page = atomic_load_explicit(&pid_page_seen,
                                                memory_order_acquire);
  if (page == NULL) {
    pthread_once(&pid_once, pid_page_init);
    page = pid_page;
    atomic_store_explicit(&pid_page_seen, page, memory_order_release);
  }
  if (page != NULL) {
    uint32_t p = atomic_load_explicit(page, memory_order_relaxed);
    if (p != 0)
      return p;
  }
  uint32_t me = (uint32_t)getpid();
  if (page != NULL)
    atomic_store_explicit(page, me, memory_order_relaxed);
  return me;
}

/* This process's start time and PID namespace (the inode of
 * /proc/self/ns/pid), 0 when /proc could not tell.  Cached per pid, so a
 * forked child looks again. */
struct throttle__self_id throttle__self_id(void) {
  static _Atomic int64_t cached_pid;
  static _Atomic uint64_t cached_start, cached_ns;
  pid_t me = (pid_t)throttle__pid();
  if (atomic_load(&cached_pid) != me) {
    uint64_t st = 0;
    if (proc_start(me, &st) != PROC_ALIVE)
      st = 0;
    struct stat sb;
    uint64_t ns = stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
    atomic_store(&cached_start, st);
    atomic_store(&cached_ns, ns);
    atomic_store(&cached_pid, me);
  }
  return (struct throttle__self_id){atomic_load(&cached_start),
                                    atomic_load(&cached_ns)};
}

/* Dead only on evidence: a live holder's slot must never be taken because
 * it could not be seen (that would admit over the cap, I5).  Evidence is
 * judged only within one PID namespace, known on both sides: a pid of
 * another namespace names some other process here (two containers of a
 * pod share IPC and /dev/shm but not their PIDs), so such a holder, or one
 * whose namespace is unknown, lives until its lease lapses.  Within the
 * namespace: kill() saying ESRCH, a zombie, or another start time on the
 * pid (reused).  A missing /proc entry of a process kill() still finds
 * is hidden (hidepid, another /proc), not dead; if it really just died,
 * the next look sees ESRCH. */
bool throttle__holder_alive(const struct throttle__slot *s) {
  struct throttle__self_id me = throttle__self_id();
  if (s->pidns == 0 || me.pidns == 0 || s->pidns != me.pidns)
    return true;
  if (s->pid == throttle__pid())
    return true;
  if (s->pid == 0 || s->pid > INT32_MAX)
    return false;
  if (kill((pid_t)s->pid, 0) != 0 && errno == ESRCH)
    return false;
  uint64_t st = 0;
  switch (proc_start((pid_t)s->pid, &st)) {
  case PROC_ZOMBIE:
    return false;
  case PROC_ALIVE: /* another process now wears the pid? */
    return s->start == 0 || st == s->start;
  default:
    return true;
  }
}
