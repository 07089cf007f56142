/* SPDX-License-Identifier: MIT */
/*
 * fault.c — fault injection for the tests (test builds only; a release
 * build compiles this file to nothing).
 *
 * The tests fail the Nth call of one kind (an allocation, shm_open, mmap,
 * the segment mutex, the clock...) for N = 1, 2, ... until the operation
 * under test no longer reaches the Nth call, and check after each failure
 * that the error is the specific one, nothing leaked and the segment is
 * whole or absent.  The hooks sit at the call sites (THROTTLE__SYS and
 * THROTTLE__FAULT in internal.h) rather than in interposed libc symbols, so
 * only the library's own calls are counted — not the test's, libc's or
 * libcurl's — and the counts are the same from run to run.
 *
 * An unarmed hook costs one relaxed load of a word that never changes
 * while a test runs operations, so threaded tests that link the same
 * archive are not slowed or serialised.
 */
#include "internal.h"

#ifdef THROTTLE_TESTING

#include <errno.h>

struct kind {
  _Atomic unsigned long at;    /* fail the call with this number; 0 = off */
  _Atomic unsigned long calls; /* since armed */
  _Atomic unsigned long hits;  /* calls failed since armed */
  _Atomic int err;             /* 0: the default below */
  _Atomic bool persist;        /* also every call after `at` */
};

static struct kind kinds[THROTTLE__FAULT_KINDS_];
static _Atomic unsigned armed; /* bit per kind: the fast "nothing armed" */
static _Atomic long live;      /* allocations not yet freed */

static const struct {
  const char *name;
  int err;
} defaults[THROTTLE__FAULT_KINDS_] = {
    [THROTTLE__FAULT_ALLOC] = {"alloc", ENOMEM},
    [THROTTLE__FAULT_SHM_OPEN] = {"shm_open", EMFILE},
    [THROTTLE__FAULT_FCHMOD] = {"fchmod", EPERM},
    [THROTTLE__FAULT_FLOCK] = {"flock", ENOLCK},
    [THROTTLE__FAULT_FSTAT] = {"fstat", EIO},
    [THROTTLE__FAULT_FTRUNCATE] = {"ftruncate", EIO},
    [THROTTLE__FAULT_FALLOCATE] = {"posix_fallocate", ENOSPC},
    [THROTTLE__FAULT_MMAP] = {"mmap", ENOMEM},
    [THROTTLE__FAULT_MUTEX_INIT] = {"pthread_mutex_init", EAGAIN},
    [THROTTLE__FAULT_LOCK] = {"lock", ETIMEDOUT},
    [THROTTLE__FAULT_CLOCK] = {"clock_gettime", EINVAL},
    [THROTTLE__FAULT_FUTEX] = {"futex", EINTR},
};

_Static_assert(THROTTLE__FAULT_KINDS_ <= 32, "one bit per kind in `armed`");

static bool valid(int kind) {
  return kind >= 0 && kind < THROTTLE__FAULT_KINDS_;
}

void throttle__fault_arm(int kind, unsigned long n) {
  if (!valid(kind))
    return;
  struct kind *k = &kinds[kind];
  atomic_fetch_and(&armed, ~(1u << kind));
  atomic_store(&k->calls, 0);
  atomic_store(&k->hits, 0);
  atomic_store(&k->at, n);
  if (n != 0)
    atomic_fetch_or(&armed, 1u << kind);
}

void throttle__fault_persist(int kind, bool on) {
  if (valid(kind))
    atomic_store(&kinds[kind].persist, on);
}

void throttle__fault_errno(int kind, int err) {
  if (valid(kind))
    atomic_store(&kinds[kind].err, err);
}

unsigned long throttle__fault_calls(int kind) {
  return valid(kind) ? atomic_load(&kinds[kind].calls) : 0;
}

unsigned long throttle__fault_hits(int kind) {
  return valid(kind) ? atomic_load(&kinds[kind].hits) : 0;
}

void throttle__fault_reset(void) {
  atomic_store(&armed, 0);
  for (int i = 0; i < THROTTLE__FAULT_KINDS_; i++) {
    atomic_store(&kinds[i].at, 0);
    atomic_store(&kinds[i].calls, 0);
    atomic_store(&kinds[i].hits, 0);
    atomic_store(&kinds[i].err, 0);
    atomic_store(&kinds[i].persist, false);
  }
}

long throttle__fault_live(void) { return atomic_load(&live); }

const char *throttle__fault_name(int kind) {
  return valid(kind) ? defaults[kind].name : "?";
}

int throttle__fault(int kind) {
  if (!(atomic_load_explicit(&armed, memory_order_relaxed) & (1u << kind)))
    return 0;
  struct kind *k = &kinds[kind];
  unsigned long c = atomic_fetch_add(&k->calls, 1) + 1;
  unsigned long at = atomic_load(&k->at);
  if (c < at || (c > at && !atomic_load(&k->persist)))
    return 0;
  atomic_fetch_add(&k->hits, 1);
  int e = atomic_load(&k->err);
  errno = e != 0 ? e : defaults[kind].err;
  return errno;
}

/* ---- the allocator -------------------------------------------------- */

void *throttle__malloc(size_t n) {
  if (throttle__fault(THROTTLE__FAULT_ALLOC))
    return NULL;
  void *p = malloc(n);
  if (p != NULL)
    atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
  return p;
}

void *throttle__calloc(size_t n, size_t size) {
  if (throttle__fault(THROTTLE__FAULT_ALLOC))
    return NULL;
  void *p = calloc(n, size);
  if (p != NULL)
    atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
  return p;
}

void *throttle__realloc(void *old, size_t n) {
  if (throttle__fault(THROTTLE__FAULT_ALLOC))
    return NULL; /* old stays valid, as with a real failure */
  void *p = realloc(old, n);
  if (p != NULL && old == NULL)
    atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
  return p;
}

char *throttle__strdup(const char *s) {
  if (throttle__fault(THROTTLE__FAULT_ALLOC))
    return NULL;
  char *p = strdup(s);
  if (p != NULL)
    atomic_fetch_add_explicit(&live, 1, memory_order_relaxed);
  return p;
}

void throttle__free(void *p) {
  if (p != NULL)
    atomic_fetch_sub_explicit(&live, 1, memory_order_relaxed);
  free(p);
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int throttle__fault_release_build;
#endif
