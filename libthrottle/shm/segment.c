/* SPDX-License-Identifier: MIT */
/*
 * segment.c — the shared-memory object: create or attach, race-free
 * initialisation, header validation, the robust mutex and its repair.
 *
 * Creation protocol.  Every opener takes an exclusive flock() on the shm fd
 * (bounded by the lock timeout) before looking at the contents.  Under that
 * lock, a segment of size 0, or one whose magic is still 0, is (re)built:
 * size set and reserved with posix_fallocate, header and table written, and
 * the magic stored last with release ordering.  A creator killed at any
 * point releases the flock with its file descriptor and leaves a magic of 0,
 * which the next opener treats as "not yet built" — so a half-built segment
 * can neither block nor fool anyone.  A non-zero magic that is not ours is
 * never overwritten: it may be another program's live segment.  Nothing
 * here ever removes the name (a failed creator leaves it unfinished for the
 * next opener) or makes the object smaller (others may map all of it).
 *
 * Read-only attach (THROTTLE_READONLY), for an operator inspecting a
 * segment they may read but not write (another user's, as root).  The
 * object is opened O_RDONLY and mapped PROT_READ, so not a byte of it can
 * be written, not even its mutex (taking it is a write, and a stopped
 * inspector would then block every loader).  The handle works on a private
 * copy instead: throttle__lock() refreshes it with a seqlock-checked copy
 * (repaired privately, like an EOWNERDEAD repair, if the table kept
 * changing under every try) and validates its header again, so every
 * reading function works unchanged.  Outside the lock the copy's table
 * sequence is held odd, so lock-free lookups always take the locked path
 * and never read a stale or half-copied table.  Rejected: a second,
 * lock-free implementation of every inspection call (two codes to keep in
 * step), and reading the records in place (a reader would see a key's
 * fields torn across an update).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <signal.h>
#include <stdlib.h>

static uint64_t fnv1a(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

/* Everything about the build that changes how the bytes are read. */
uint64_t throttle__fingerprint(void) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  const uint64_t parts[] = {
      THROTTLE__LAYOUT,
      sizeof(pthread_mutex_t),
      sizeof(struct throttle__hdr),
      offsetof(struct throttle__hdr, mutex),
      offsetof(struct throttle__hdr, tseq),
      sizeof(struct throttle__rec),
      offsetof(struct throttle__rec, key),
      offsetof(struct throttle__rec, publishes),
      offsetof(struct throttle__rec, refusal),
      sizeof(void *),
      sizeof(long),
      THROTTLE__KEY_MAX,
      THROTTLE__MAX_PROBE,
      0x0102030405060708u, /* byte order, via the hash of its bytes */
  };
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    h = fnv1a(h, parts[i]);
  return h;
}

static uint32_t pow2_at_least(uint64_t v) {
  uint32_t p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

static uint64_t header_size(void) {
  return (sizeof(struct throttle__hdr) + THROTTLE__CACHELINE - 1) &
         ~(uint64_t)(THROTTLE__CACHELINE - 1);
}

static void layout_sizes(uint32_t capacity, uint32_t *nbuckets,
                         uint64_t *records_off, uint64_t *total) {
  *nbuckets = pow2_at_least((uint64_t)capacity * 2);
  *records_off = header_size() + (uint64_t)*nbuckets * sizeof(uint64_t);
  *records_off = (*records_off + THROTTLE__CACHELINE - 1) &
                 ~(uint64_t)(THROTTLE__CACHELINE - 1);
  *total = *records_off + (uint64_t)capacity * sizeof(struct throttle__rec);
}

/* The smallest capacity whose segment is at least size bytes, or 0 when
 * even the largest is smaller. */
static uint32_t capacity_filling(uint64_t size) {
  uint32_t lo = 1, hi = THROTTLE__MAX_CAPACITY, nb;
  uint64_t roff, total;
  layout_sizes(hi, &nb, &roff, &total);
  if (total < size)
    return 0;
  while (lo < hi) { /* total grows with the capacity */
    uint32_t mid = lo + (hi - lo) / 2;
    layout_sizes(mid, &nb, &roff, &total);
    if (total >= size)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

int throttle__validate_header(const struct throttle__hdr *hdr, uint64_t size,
                              char *why, size_t whylen) {
  uint64_t magic = atomic_load_explicit(&hdr->magic, memory_order_acquire);
  if (magic != THROTTLE__MAGIC) {
    snprintf(why, whylen, "magic is 0x%016llx, expected 0x%016llx",
             (unsigned long long)magic, (unsigned long long)THROTTLE__MAGIC);
    return THROTTLE_EMAGIC;
  }
  if (hdr->layout != THROTTLE__LAYOUT) {
    snprintf(why, whylen, "layout version %u, this library reads %u",
             hdr->layout, THROTTLE__LAYOUT);
    return THROTTLE_EVERSION;
  }
  if (hdr->fingerprint != throttle__fingerprint()) {
    snprintf(why, whylen,
             "layout fingerprint 0x%016llx, this build expects 0x%016llx "
             "(built with a different compiler, ABI or library version)",
             (unsigned long long)hdr->fingerprint,
             (unsigned long long)throttle__fingerprint());
    return THROTTLE_EFINGERPRINT;
  }
  uint32_t nb;
  uint64_t roff, total;
  if (hdr->capacity == 0 || hdr->capacity > THROTTLE__MAX_CAPACITY) {
    snprintf(why, whylen, "capacity %u out of range", hdr->capacity);
    return THROTTLE_ESIZE;
  }
  layout_sizes(hdr->capacity, &nb, &roff, &total);
  if (hdr->header_size != header_size() || hdr->nbuckets != nb ||
      hdr->records_off != roff ||
      hdr->record_size != sizeof(struct throttle__rec) ||
      hdr->total_size != total) {
    snprintf(why, whylen,
             "header sizes disagree: header %u, buckets %u, records at %u of "
             "%u bytes, total %llu (expected %llu for %u keys)",
             hdr->header_size, hdr->nbuckets, hdr->records_off,
             hdr->record_size, (unsigned long long)hdr->total_size,
             (unsigned long long)total, hdr->capacity);
    return THROTTLE_ESIZE;
  }
  if (total != size) {
    snprintf(why, whylen, "header says %llu bytes but the object has %llu",
             (unsigned long long)total, (unsigned long long)size);
    return THROTTLE_ESIZE;
  }
  return 0;
}

static void bind_handle(throttle_t *h, void *base, size_t size) {
  h->base = base;
  h->size = size;
  h->hdr = base;
  h->capacity = h->hdr->capacity;
  h->bucket_mask = h->hdr->nbuckets - 1;
  h->seed = h->hdr->seed;
  h->buckets = (_Atomic uint64_t *)((char *)base + h->hdr->header_size);
  h->recs = (struct throttle__rec *)((char *)base + h->hdr->records_off);
}

static int init_mutex(pthread_mutex_t *m, int pshared) {
  pthread_mutexattr_t ma;
  int rc = pthread_mutexattr_init(&ma);
  if (rc == 0)
    rc = pthread_mutexattr_setpshared(
        &ma, pshared ? PTHREAD_PROCESS_SHARED : PTHREAD_PROCESS_PRIVATE);
  if (rc == 0)
    rc = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  if (rc == 0)
    rc = pthread_mutexattr_setprotocol(&ma, PTHREAD_PRIO_NONE);
  if (rc == 0)
    rc = THROTTLE__SYS(MUTEX_INIT, errno, pthread_mutex_init(m, &ma));
  pthread_mutexattr_destroy(&ma);
  return rc;
}

/* Build a fresh segment image in base (zero-filled or not). */
static int build(throttle_t *h, void *base, uint32_t capacity, int pshared) {
  uint32_t nb;
  uint64_t roff, total;
  layout_sizes(capacity, &nb, &roff, &total);
  memset(base, 0, total);
  struct throttle__hdr *hdr = base;
  hdr->layout = THROTTLE__LAYOUT;
  hdr->header_size = (uint32_t)header_size();
  hdr->fingerprint = throttle__fingerprint();
  hdr->total_size = total;
  hdr->capacity = capacity;
  hdr->nbuckets = nb;
  hdr->record_size = sizeof(struct throttle__rec);
  hdr->records_off = (uint32_t)roff;
  if (getrandom(&hdr->seed, sizeof hdr->seed, GRND_NONBLOCK) !=
      (ssize_t)sizeof hdr->seed)
    hdr->seed = throttle__mono_ns() ^ ((uint64_t)getpid() << 40);
  hdr->created_ns = throttle__now_ns();
  atomic_store_explicit(&hdr->max_delay_ns, h->max_delay_ns,
                        memory_order_relaxed);
  hdr->creator_pid = (uint32_t)getpid();

  int rc = init_mutex(&hdr->mutex, pshared);
  if (rc != 0)
    return throttle__fail(h, THROTTLE_ESYS, "%s: pthread_mutex_init: %s",
                          h->name, strerror(rc));
  bind_handle(h, base, total);
  throttle__init_table(h);
  THROTTLE__CRASHPOINT("init-before-magic");
  atomic_store_explicit(&hdr->magic, THROTTLE__MAGIC, memory_order_release);
  return 0;
}

static int sys_fail(throttle_t *h, const char *what, int e) {
  if (e == ENOSPC || e == EFBIG)
    return throttle__fail(h, THROTTLE_ENOSPC,
                          "%s: %s: %s; free space in /dev/shm or lower "
                          "THROTTLE_KEYS",
                          h->name, what, strerror(e));
  return throttle__fail(h, THROTTLE_ESYS, "%s: %s: %s", h->name, what,
                        strerror(e));
}

static int take_flock(throttle_t *h, int fd) {
  uint64_t deadline =
      throttle__mono_ns() + (uint64_t)h->lock_timeout_ms * THROTTLE__NS_PER_MS;
  /* Each nap lasts at least 2 ms, so counting them bounds the wait too,
   * should the clock stand still (see clock.c). */
  uint64_t naps = h->lock_timeout_ms / 2 + 1;
  for (uint64_t nap = 0;; nap++) {
    if (THROTTLE__SYS(FLOCK, -1, flock(fd, LOCK_EX | LOCK_NB)) == 0)
      return 0;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return sys_fail(h, "flock", errno);
    if (throttle__mono_ns() >= deadline || nap >= naps)
      return throttle__fail(h, THROTTLE_EINITTIMEOUT,
                            "%s: another process kept the segment's init lock "
                            "for more than %u ms",
                            h->name, h->lock_timeout_ms);
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Called with the flock held, for an object that was empty when we took
 * it and that we could not reserve (/dev/shm full): nobody can have built
 * or mapped it, so its name is removed rather than left as an empty
 * object that every `ls` would trip on.  Only when the name is still this
 * object (same inode).  Whoever opened the name before and waits for the
 * flock finds the object unlinked once it has it, and opens the name
 * again (throttle__segment_open), so no two groups of processes use two
 * objects. */
static void unlink_unbuilt(const throttle_t *h, int fd) {
  char path[sizeof h->name + 16];
  struct stat a, b;
  snprintf(path, sizeof path, "/dev/shm%s", h->name);
  if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino)
    (void)shm_unlink(h->name);
}

/* Called with the flock held.  On success the handle is bound. */
static int mutex_kind_bad(const throttle_t *h, int *kind);

static int attach_locked(throttle_t *h, int fd, uint32_t capacity,
                         int created) {
  struct stat st;
  if (THROTTLE__SYS(FSTAT, -1, fstat(fd, &st)) != 0)
    return sys_fail(h, "fstat", errno);
  if (st.st_uid != geteuid())
    return throttle__fail(h, THROTTLE_EOWNER,
                          "%s is owned by uid %u, not %u; use another segment "
                          "name (THROTTLE_SEGMENT) or remove it as its owner "
                          "(throttlectl rm)",
                          h->name, (unsigned)st.st_uid, (unsigned)geteuid());
  mode_t bad = (h->flags & THROTTLE_GROUP_SHARED) ? 0002 : 0022;
  if ((st.st_mode & bad) && !created)
    return throttle__fail(h, THROTTLE_EMODE,
                          "%s has mode %04o: writable by %s; remove it "
                          "(throttlectl rm)%s",
                          h->name, (unsigned)(st.st_mode & 07777),
                          (st.st_mode & 0002) ? "others" : "its group",
                          (st.st_mode & 0002) ? ""
                                              : " or open with "
                                                "THROTTLE_GROUP_SHARED");
  uint64_t size = (uint64_t)st.st_size;
  if (size != 0 && size < header_size())
    return throttle__fail(h, THROTTLE_ESIZE,
                          "%s is %llu bytes, too small for a header; remove "
                          "it (throttlectl rm)",
                          h->name, (unsigned long long)size);
  if (size != 0) {
    void *base = THROTTLE__SYS(
        MMAP, MAP_FAILED,
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (base == MAP_FAILED)
      return sys_fail(h, "mmap", errno);
    struct throttle__hdr *hdr = base;
    if (atomic_load_explicit(&hdr->magic, memory_order_acquire) != 0) {
      char why[256];
      int rc = throttle__validate_header(hdr, size, why, sizeof why);
      if (rc != 0) {
        munmap(base, size);
        return throttle__fail(h, rc, "%s: %s; remove it (throttlectl rm)",
                              h->name, why);
      }
      bind_handle(h, base, size);
      h->shared = 1;
      int kind;
      if (mutex_kind_bad(h, &kind)) { /* refused here, so callers fail open */
        munmap(base, size);
        h->base = NULL;
        h->shared = 0;
        return throttle__fail(h, THROTTLE_ECORRUPT,
                              "%s: mutex damaged (kind 0x%x); remove it "
                              "(throttlectl rm)",
                              h->name, (unsigned)kind);
      }
      return 0;
    }
    if (h->flags & THROTTLE_NO_CREATE) {
      munmap(base, size);
      return throttle__fail(h, THROTTLE_ESHM,
                            "%s was never finished by its creator; open it "
                            "without THROTTLE_NO_CREATE to rebuild it, or "
                            "remove it (throttlectl rm)",
                            h->name);
    }
    /* Magic 0: a creator died before finishing (or a writer zeroed the
     * header under live users).  Rebuild it, never smaller: processes that
     * still map it would fault (SIGBUS) past a new end.  The header's own
     * capacity cannot be trusted for that (it may be zeroed too), so the
     * size of the object decides: when this opener's capacity would shrink
     * it, take the smallest capacity that fills it (growing it by less than
     * one record at most). */
    munmap(base, size);
    uint32_t cnb;
    uint64_t croff, ctotal;
    layout_sizes(capacity, &cnb, &croff, &ctotal);
    if (ctotal < size) {
      capacity = capacity_filling(size);
      if (capacity == 0)
        return throttle__fail(h, THROTTLE_ESIZE,
                              "%s is %llu bytes, more than the largest "
                              "segment; remove it (throttlectl rm)",
                              h->name, (unsigned long long)size);
    }
  }
  if (size == 0 && (h->flags & THROTTLE_NO_CREATE))
    return throttle__fail(h, THROTTLE_ESHM,
                          "%s is empty (its creator has not begun); open it "
                          "without THROTTLE_NO_CREATE to build it",
                          h->name);
  uint32_t nb;
  uint64_t roff, total;
  layout_sizes(capacity, &nb, &roff, &total);
  THROTTLE__CRASHPOINT("init-before-truncate");
  if (THROTTLE__SYS(FTRUNCATE, -1, ftruncate(fd, (off_t)total)) != 0)
    return sys_fail(h, "ftruncate", errno);
  int e = THROTTLE__SYS(FALLOCATE, errno,
                        posix_fallocate(fd, 0, (off_t)total));
  if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    if (size == 0) { /* never shrink what others may map */
      int ignored = ftruncate(fd, 0);
      (void)ignored;
      unlink_unbuilt(h, fd);
    }
    return sys_fail(h, "posix_fallocate", e);
  }
  void *base = THROTTLE__SYS(
      MMAP, MAP_FAILED,
      mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (base == MAP_FAILED)
    return sys_fail(h, "mmap", errno);
  int rc = build(h, base, capacity, 1);
  if (rc != 0) {
    munmap(base, total);
    h->base = NULL;
    return rc;
  }
  return 0;
}

/* ---- read-only attach ------------------------------------------------ */

#define RO_TSEQ_OFF offsetof(struct throttle__hdr, tseq)
#define RO_TSEQ_LEN sizeof(uint32_t)

/* Copy the live segment into the private one, all but the copy's table
 * sequence (which stays odd, see above).  Races with writers by design:
 * the sequence check tells whether the table was stable meanwhile. */
__attribute__((no_sanitize("thread"))) static int ro_copy(throttle_t *h) {
  const char *src = h->ro_src;
  char *dst = h->base;
  const struct throttle__hdr *shdr = h->ro_src;
  for (int t = 0; t < 8; t++) {
    uint32_t s = atomic_load_explicit(&shdr->tseq, memory_order_acquire);
    memcpy(dst, src, RO_TSEQ_OFF);
    memcpy(dst + RO_TSEQ_OFF + RO_TSEQ_LEN, src + RO_TSEQ_OFF + RO_TSEQ_LEN,
           h->size - RO_TSEQ_OFF - RO_TSEQ_LEN);
    atomic_thread_fence(memory_order_acquire);
    if (!(s & 1) &&
        atomic_load_explicit(&shdr->tseq, memory_order_relaxed) == s)
      return 1;
  }
  return 0;
}

static int open_readonly(throttle_t *h) {
  int fd = THROTTLE__SYS(SHM_OPEN, -1,
                         shm_open(h->name, O_RDONLY | O_NOFOLLOW, 0));
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      return throttle__fail(h, THROTTLE_ESYMLINK,
                            "%s is a symbolic link; refusing to follow it",
                            h->name);
    if (e == EACCES)
      return throttle__fail(h, THROTTLE_EOWNER,
                            "%s: permission denied: only its owner, root, or "
                            "a user its mode lets read can inspect it "
                            "(e.g. sudo throttlectl --segment %s ls)",
                            h->name, h->name);
    if (e == ENOENT)
      return throttle__fail(h, THROTTLE_ESHM, "%s does not exist", h->name);
    return throttle__fail(h, THROTTLE_ESHM, "shm_open %s: %s", h->name,
                          strerror(e));
  }
  struct stat st;
  if (THROTTLE__SYS(FSTAT, -1, fstat(fd, &st)) != 0) {
    int rc = sys_fail(h, "fstat", errno);
    close(fd);
    return rc;
  }
  size_t size = (size_t)st.st_size;
  if (size < header_size()) {
    close(fd);
    return throttle__fail(h, THROTTLE_ESHM,
                          "%s is %zu bytes: not (yet) a segment", h->name,
                          size);
  }
  void *src = THROTTLE__SYS(MMAP, MAP_FAILED,
                            mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0));
  int e = errno;
  close(fd);
  if (src == MAP_FAILED)
    return sys_fail(h, "mmap", e);
  char why[256];
  int rc = throttle__validate_header(src, size, why, sizeof why);
  if (rc != 0) {
    munmap(src, size);
    return throttle__fail(h, rc, "%s: %s", h->name, why);
  }
  void *copy = THROTTLE__SYS(MMAP, MAP_FAILED,
                             mmap(NULL, size, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (copy == MAP_FAILED) {
    e = errno;
    munmap(src, size);
    return sys_fail(h, "mmap", e);
  }
  h->ro_src = src;
  h->base = copy;
  h->size = size;
  ro_copy(h);
  atomic_store_explicit(&((struct throttle__hdr *)copy)->tseq, 1,
                        memory_order_release);
  /* Validated again: the header copied may not be the one checked. */
  if ((rc = throttle__validate_header(copy, size, why, sizeof why)) != 0) {
    munmap(copy, size);
    munmap(src, size);
    h->ro_src = NULL;
    h->base = NULL;
    return throttle__fail(h, rc, "%s: %s", h->name, why);
  }
  bind_handle(h, copy, size);
  pthread_mutex_init(&h->ro_lock, NULL);
  atomic_store_explicit(&h->ro_owner, throttle__pid(), memory_order_release);
  return 0;
}

#define RO_FRESH (UINT64_C(1) << 32) /* ro_owner: being made afresh */

/* The handle's mutex as this process's own.  In a forked child (the pid
 * changed: throttle__pid) it may be held by a thread of the parent that
 * the child does not have: the first of the child's threads makes it
 * afresh, the others wait for that.  No pthread_atfork(): it is not run
 * by a raw clone() or _Fork(), and the pid tells every kind of child. */
static void ro_own(throttle_t *h) {
  uint64_t me = throttle__pid();
  for (;;) {
    uint64_t w = atomic_load_explicit(&h->ro_owner, memory_order_acquire);
    if (w == me)
      return;
    if (w == (RO_FRESH | me)) { /* another thread of ours is at it */
      sched_yield();
      continue;
    }
    /* the parent's (or a parent's that was itself making it afresh) */
    if (atomic_compare_exchange_strong_explicit(&h->ro_owner, &w,
                                                RO_FRESH | me,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
      pthread_mutex_init(&h->ro_lock, NULL);
      atomic_store_explicit(&h->ro_owner, me, memory_order_release);
      return;
    }
  }
}

/* throttle__lock() on a read-only handle: refresh the copy, under the
 * handle's own mutex (threads sharing the handle share the copy). */
static int ro_lock(throttle_t *h) {
  ro_own(h);
  pthread_mutex_lock(&h->ro_lock);
  int stable = ro_copy(h);
  char why[256];
  int rc = throttle__validate_header(h->hdr, h->size, why, sizeof why);
  if (rc == 0 && h->hdr->capacity != h->capacity)
    rc = THROTTLE_ESIZE;
  if (rc != 0) {
    pthread_mutex_unlock(&h->ro_lock);
    return throttle__fail(h, rc, "%s: changed while being read: %s", h->name,
                          why);
  }
  if (!stable) /* a writer kept the table moving, or died mid-change */
    throttle__repair_locked(h);
  return 0;
}

static void ro_unlock(throttle_t *h) {
  atomic_store_explicit(&h->hdr->tseq, 1, memory_order_release);
  pthread_mutex_unlock(&h->ro_lock);
}

/* ---- open ----------------------------------------------------------- */

int throttle__segment_open(throttle_t *h, const throttle_config_t *cfg) {
  (void)cfg;
  if (h->flags & THROTTLE_READONLY) {
    int rc = open_readonly(h);
    if (rc == 0)
      h->shared = 1;
    return rc;
  }
  mode_t mode = (h->flags & THROTTLE_GROUP_SHARED) ? 0660 : 0600;
  int removed = 0; /* times the object was unlinked under us */
again:;
  int created = 0;
  int fd = -1;
  if (!(h->flags & THROTTLE_NO_CREATE)) {
    fd = THROTTLE__SYS(
        SHM_OPEN, -1,
        shm_open(h->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, mode));
    if (fd >= 0) {
      created = 1;
      /* shm_open applied the umask; set the mode we mean. */
      if (THROTTLE__SYS(FCHMOD, -1, fchmod(fd, mode)) != 0) {
        int e = errno; /* left in place: see the end of this function */
        close(fd);
        return sys_fail(h, "fchmod", e);
      }
    } else if (errno != EEXIST) {
      fd = -2;
    }
  }
  if (fd == -1)
    fd = THROTTLE__SYS(SHM_OPEN, -1,
                       shm_open(h->name, O_RDWR | O_NOFOLLOW, 0));
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      return throttle__fail(h, THROTTLE_ESYMLINK,
                            "%s is a symbolic link; refusing to follow it "
                            "(remove it with throttlectl rm)",
                            h->name);
    if (e == EACCES)
      return throttle__fail(h, THROTTLE_EOWNER,
                            "%s: permission denied: the segment belongs to "
                            "another user; set THROTTLE_SEGMENT to another "
                            "name, or have its owner remove it "
                            "(throttlectl rm)",
                            h->name);
    if (e == ENOENT && (h->flags & THROTTLE_NO_CREATE))
      return throttle__fail(h, THROTTLE_ESHM, "%s does not exist", h->name);
    return throttle__fail(h, THROTTLE_ESHM,
                          "shm_open %s: %s (is /dev/shm mounted and "
                          "writable?)",
                          h->name, strerror(e));
  }
  int rc = take_flock(h, fd);
  struct stat st;
  if (rc == 0 && fstat(fd, &st) == 0 && st.st_nlink == 0) {
    /* Its creator could not reserve it and removed the name while we
     * waited (unlink_unbuilt): open the name again. */
    flock(fd, LOCK_UN);
    close(fd);
    if (++removed < 8)
      goto again;
    return throttle__fail(h, THROTTLE_ESHM,
                          "%s was removed %d times while being opened",
                          h->name, removed);
  }
  if (rc == 0) {
    rc = attach_locked(h, fd, h->capacity, created);
    flock(fd, LOCK_UN);
  }
  /* A creator that fails leaves the name in place, unfinished (size 0 or
   * magic 0), for the next opener to build (but for an empty object it
   * could not reserve: unlink_unbuilt).  Removing it was a split
   * brain: between our O_EXCL and our failure (an init timeout above all)
   * another opener may have built the object and be using it, and later
   * openers would have created a second, empty one beside it.  Nothing
   * proves the name is still our own unfinished object without a lock
   * that others also hold across shm_open(), and there is none. */
  close(fd);
  if (rc == 0)
    h->shared = 1;
  return rc;
}

int throttle__segment_private(throttle_t *h, uint32_t capacity) {
  uint32_t nb;
  uint64_t roff, total;
  layout_sizes(capacity, &nb, &roff, &total);
  void *base = THROTTLE__SYS(MMAP, MAP_FAILED,
                             mmap(NULL, total, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (base == MAP_FAILED)
    return throttle__fail(h, THROTTLE_ENOMEM, "private fallback: mmap: %s",
                          strerror(errno));
  int rc = build(h, base, capacity, 0);
  if (rc != 0) {
    munmap(base, total);
    h->base = NULL;
  }
  h->shared = 0;
  return rc;
}

void throttle__segment_close(throttle_t *h) {
  if (h->base != NULL)
    munmap(h->base, h->size);
  h->base = NULL;
  if (h->ro_src != NULL) {
    munmap((void *)h->ro_src, h->size);
    pthread_mutex_destroy(&h->ro_lock);
    h->ro_src = NULL;
  }
}

/* ThreadSanitizer does not intercept pthread_mutex_clocklock, so it would
 * see every unlock as unbalanced; its builds take the mutex with
 * pthread_mutex_timedlock on CLOCK_REALTIME instead (a clock step can only
 * stretch or shrink one timeout there). */
#if defined(__SANITIZE_THREAD__)
#define LOCK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOCK_TSAN 1
#endif
#endif
#ifdef LOCK_TSAN
#define LOCK_CLOCK CLOCK_REALTIME
#define LOCK_MUTEX(m, ts) pthread_mutex_timedlock((m), (ts))
#else
#define LOCK_CLOCK CLOCK_MONOTONIC
#define LOCK_MUTEX(m, ts) pthread_mutex_clocklock((m), CLOCK_MONOTONIC, (ts))
#endif

static int lock_timed(throttle_t *h, uint32_t ms) {
  struct timespec ts;
  /* No clock: a deadline already past, so the lock is tried once and the
   * caller gets THROTTLE_ELOCKTIMEOUT rather than a garbage timeout. */
  if (THROTTLE__SYS(CLOCK, -1, throttle__clock_gettime(LOCK_CLOCK, &ts)) != 0) {
    ts.tv_sec = 0;
    ts.tv_nsec = 0;
    return LOCK_MUTEX(&h->hdr->mutex, &ts);
  }
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return LOCK_MUTEX(&h->hdr->mutex, &ts);
}

/* glibc picks a mutex's code path from its "kind" word and trusts it: in a
 * damaged segment a garbage kind selects the priority-protect or
 * priority-inheritance code, which aborts on an assertion or spins forever
 * (found by fuzz/fuzz_mutex.c).  The mutex is shared memory, hence input
 * (I8): refuse one whose kind is not what init_mutex() writes.  A writer
 * that changes it between this check and the lock still gets through; a
 * damaged segment does not.  Returns 1 (and the kind found in *kind) when
 * the kind is wrong; 0 when it is right, or the C library is not glibc. */
#ifdef __GLIBC__
/* The kind init_mutex() writes (by pshared), 0 if it cannot tell; out of
 * line, so the check on every lock stays a load and a compare. */
static __attribute__((noinline)) int mutex_kind_ref(int ps) {
  pthread_mutex_t ref;
  if (init_mutex(&ref, ps) != 0)
    return 0;
  int want = ref.__data.__kind;
  pthread_mutex_destroy(&ref);
  return want;
}
#endif

static int mutex_kind_bad(const throttle_t *h, int *kind) {
#ifdef __GLIBC__
  static _Atomic int expected[2]; /* by pshared; 0 = not computed yet */
  int ps = h->shared ? 1 : 0;
  int want = atomic_load_explicit(&expected[ps], memory_order_relaxed);
  if (want == 0) {
    if ((want = mutex_kind_ref(ps)) == 0)
      return 0;
    atomic_store_explicit(&expected[ps], want, memory_order_relaxed);
  }
  *kind = h->hdr->mutex.__data.__kind;
  return *kind != want;
#else
  (void)h;
  (void)kind;
  return 0;
#endif
}

/* The mutex within ms; say: a failure is the handle's message (else only
 * its code). */
static int lock_within(throttle_t *h, uint32_t ms, bool say) {
  if (h->ro_src != NULL)
    return ro_lock(h);
  int kind;
  if (mutex_kind_bad(h, &kind))
    return !say ? THROTTLE_ECORRUPT
                : throttle__fail(h, THROTTLE_ECORRUPT,
                                 "%s: mutex damaged (kind 0x%x); remove the "
                                 "segment (throttlectl rm)",
                                 h->name, (unsigned)kind);
  /* Uncontended, the common case: no deadline to compute, no clock read. */
  int rc =
      THROTTLE__SYS(LOCK, errno, pthread_mutex_trylock(&h->hdr->mutex));
  if (rc == EBUSY)
    rc = lock_timed(h, ms);
  if (rc == 0) {
    THROTTLE__CRASHPOINT("after-lock");
    return 0;
  }
  if (rc == EOWNERDEAD) {
    /* The previous owner died inside a critical section.  Put the table
     * back into a state every reader can trust, then mark the mutex
     * consistent again. */
    THROTTLE__CRASHPOINT("mid-repair");
    throttle__repair_locked(h);
    if (h->hdr->repairs < UINT64_MAX)
      h->hdr->repairs++;
    pthread_mutex_consistent(&h->hdr->mutex);
    return 0;
  }
  if (rc == ETIMEDOUT)
    return !say ? THROTTLE_ELOCKTIMEOUT
                : throttle__fail(h, THROTTLE_ELOCKTIMEOUT,
                                 "%s: mutex not acquired within %u ms (a "
                                 "live process holds it, or the segment is "
                                 "damaged)",
                                 h->name, ms);
  return !say ? THROTTLE_ECORRUPT
              : throttle__fail(h, THROTTLE_ECORRUPT,
                               "%s: mutex unusable (%s); remove the segment "
                               "(throttlectl rm)",
                               h->name, strerror(rc));
}

int throttle__lock(throttle_t *h) {
  return lock_within(h, h->lock_timeout_ms, true);
}

/* A copy the segment keeps while a backend across hosts serves (its
 * holders, settings, back-offs, the count of its own callers) is not worth
 * making a caller wait: a mutex held by a live process that does not let
 * go (stopped in a debugger, by ^Z) would add the lock timeout to every
 * call that Redis answers at once.  So: BRIEF_MS at most, and for a second
 * after such a wait failed, one try only. */
#define BRIEF_MS 5u
#define BRIEF_SKIP_NS (UINT64_C(1000) * THROTTLE__NS_PER_MS)

int throttle__lock_brief(throttle_t *h) {
  uint64_t now = throttle__mono_ns();
  bool skip = now < atomic_load_explicit(&h->brief_skip_until,
                                         memory_order_relaxed);
  int rc = lock_within(h, skip ? 0 : BRIEF_MS, false);
  if (rc == THROTTLE_ELOCKTIMEOUT && !skip)
    atomic_store_explicit(&h->brief_skip_until, now + BRIEF_SKIP_NS,
                          memory_order_relaxed);
  return rc;
}

void throttle__unlock(throttle_t *h) {
  if (h->ro_src != NULL) {
    ro_unlock(h);
    return;
  }
  pthread_mutex_unlock(&h->hdr->mutex);
}

#ifdef THROTTLE_TESTING
/* Test builds only: THROTTLE_CRASH_AT=name kills the process at that
 * point, as a power cut or `kill -9` would. */
void throttle__crashpoint(const char *name) {
  const char *at = getenv("THROTTLE_CRASH_AT");
  if (at != NULL && strcmp(at, name) == 0)
    raise(SIGKILL);
}
#endif
