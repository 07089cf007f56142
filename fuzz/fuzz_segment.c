/* SPDX-License-Identifier: MIT */
/*
 * fuzz_segment.c — attach to a segment whose bytes are arbitrary (I8:
 * shared memory is input; a buggy or hostile same-user writer must never
 * crash or hang a reader, and delays a key by at most the maximum delay).
 *
 * Each input becomes the contents of a fresh POSIX shm object (mode 0600,
 * a name unique to this process, unlinked afterwards), which is opened with
 * THROTTLE_NO_FALLBACK | THROTTLE_NO_CREATE.  If the library accepts it,
 * every entry point that reads the table runs on a few keys, and the
 * answers are checked against the limits the API promises.
 *
 * Input layout:
 *   byte 0  mode
 *     bits 0-1  object size: 0 the image's own length; 1 the total_size
 *               field of the image's header; 2 the layout size for the
 *               header's capacity field; 3 the layout size for the
 *               capacity of byte 1
 *     bit 2     valid header: overwrite the identity and size fields with
 *               a correct header for the capacity of byte 1 (the sizes of
 *               bits 0-1 are then ignored), so the record, bucket and slot
 *               garbage behind it is what gets exercised
 *     bit 3     index: write bucket words for every well-formed record (as
 *               a consistent table would have them), so lookups find the
 *               keys of the garbage records at once
 *     bit 4     fill the object beyond the input by repeating the input
 *               (otherwise with zeros)
 *     bit 5     also run the setters (max parallel, pause, resume, cancel,
 *               clear, reset)
 *     bit 6     keep the input's mutex bytes (otherwise they are
 *               re-initialised; see "The mutex" below)
 *     bit 7     try to enter before anything else looks at the key (the
 *               peeks repair what they read, which would hide what the
 *               admission path does with the raw record)
 *   byte 1  capacity 8 + byte % 57 (8 to 64 keys)
 *   byte 2  bits 0-5: the outcome reported to throttle_leave() (any
 *           value, also invalid ones); bit 6: also call the blocking
 *           throttle_wait() and throttle_enter() with a 100 ms timeout on
 *           one key (byte 3 picks it), which must return in bounded time;
 *           bit 7: the class
 *   byte 3  a delay in seconds for throttle_backoff() / throttle_leave()
 *   then    the image, from offset 0 of the object
 *
 * The mutex.  glibc trusts the bytes of a pthread_mutex_t: a garbage
 * "kind" word selects the priority-protect or priority-inheritance code,
 * which aborts on an assertion (tpp.c: new_prio out of range,
 * pthread_mutex_trylock.c: robust) or spins forever; the library now
 * refuses a mutex whose kind is not the one it creates.  Garbage that
 * passes that check (a lock word that looks held) costs the lock timeout
 * on every call, which would slow this harness to a few dozen inputs a
 * second.  So the mutex bytes are re-initialised unless bit 6 says to keep
 * them, and fuzz_mutex.c fuzzes the mutex bytes alone.
 *
 * Seeds: images built by the library itself (keys, a back-off, a held
 * slot, settings) are written at start-up to any empty corpus directory on
 * the command line, and, when several are given (`make fuzz` passes the
 * working corpus first, then fuzz/corpus/segment), to the first one every
 * time: the raw images match only the layout they were built with, and the
 * layout fingerprint changes with struct throttle__rec.
 */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sanitizer/asan_interface.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_check.h"

enum {
  M_SIZE = 3,
  M_VALID = 1 << 2,
  M_INDEX = 1 << 3,
  M_REPEAT = 1 << 4,
  M_SETTERS = 1 << 5,
  M_KEEP_MUTEX = 1 << 6,
  M_ENTER_FIRST = 1 << 7,
};
#define PREFIX 4u
#define MAX_IMAGE (1u << 20)
#define MAX_DELAY_MS 60000u
#define LOCK_TIMEOUT_MS 50u

static char shm_name[64];
static int verbose; /* FUZZ_VERBOSE=1: say what each input opened as */
/* Set by the first call that timed out on the mutex: every later call
 * would wait out the same 50 ms for nothing new, so the input ends there. */
static int stalled;

/* ---- the layout, as segment.c computes it --------------------------- */

static uint64_t hdr_size(void) {
  return (sizeof(struct throttle__hdr) + THROTTLE__CACHELINE - 1) &
         ~(uint64_t)(THROTTLE__CACHELINE - 1);
}

static void layout(uint32_t cap, uint32_t *nb, uint64_t *roff,
                   uint64_t *total) {
  uint32_t p = 1;
  while (p < (uint64_t)cap * 2)
    p <<= 1;
  *nb = p;
  *roff = (hdr_size() + (uint64_t)p * 8 + THROTTLE__CACHELINE - 1) &
          ~(uint64_t)(THROTTLE__CACHELINE - 1);
  *total = *roff + (uint64_t)cap * sizeof(struct throttle__rec);
}

static void init_mutex(pthread_mutex_t *m) {
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &ma);
  pthread_mutexattr_destroy(&ma);
}

static void valid_header(unsigned char *img, uint32_t cap) {
  struct throttle__hdr *hdr = (struct throttle__hdr *)img;
  uint32_t nb;
  uint64_t roff, total;
  layout(cap, &nb, &roff, &total);
  atomic_store_explicit(&hdr->magic, THROTTLE__MAGIC, memory_order_relaxed);
  hdr->layout = THROTTLE__LAYOUT;
  hdr->header_size = (uint32_t)hdr_size();
  hdr->fingerprint = throttle__fingerprint();
  hdr->total_size = total;
  hdr->capacity = cap;
  hdr->nbuckets = nb;
  hdr->record_size = sizeof(struct throttle__rec);
  hdr->records_off = (uint32_t)roff;
}

/* Bucket words for the well-formed records of a valid image. */
static void index_records(unsigned char *img) {
  struct throttle__hdr *hdr = (struct throttle__hdr *)img;
  uint64_t *b = (uint64_t *)(img + hdr->header_size);
  struct throttle__rec *recs =
      (struct throttle__rec *)(img + hdr->records_off);
  uint32_t mask = hdr->nbuckets - 1;
  memset(b, 0, (size_t)hdr->nbuckets * 8);
  for (uint32_t i = 0; i < hdr->capacity; i++) {
    struct throttle__rec *r = &recs[i];
    if (r->state != THROTTLE__REC_USED || r->key_len < 1 ||
        r->key_len > THROTTLE__KEY_MAX)
      continue;
    uint64_t h = throttle__hash(hdr->seed, r->key, r->key_len);
    uint32_t pos = (uint32_t)(h >> 32) & mask;
    for (uint32_t k = 0; k < THROTTLE__MAX_PROBE; k++) {
      uint64_t *w = &b[(pos + k) & mask];
      if (*w == 0) {
        *w = (h << 32) | ((uint64_t)i + 1);
        break;
      }
    }
  }
}

/* ---- the object ------------------------------------------------------ */

static int write_object(const unsigned char *img, size_t size) {
  int fd = shm_open(shm_name, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    return -1;
  int rc = fchmod(fd, 0600) == 0 && ftruncate(fd, (off_t)size) == 0 ? 0 : -1;
  size_t done = 0;
  while (rc == 0 && done < size) {
    ssize_t w = pwrite(fd, img + done, size - done, (off_t)done);
    if (w <= 0)
      rc = -1;
    else
      done += (size_t)w;
  }
  close(fd);
  return rc;
}

static throttle_config_t *config(void) {
  throttle_config_t *cfg = throttle_config_new();
  CHECK(cfg != NULL, "config");
  CHECK(throttle_config_set_segment(cfg, shm_name) == 0, "segment name");
  CHECK(throttle_config_set_flags(cfg, THROTTLE_NO_FALLBACK |
                                           THROTTLE_NO_CREATE) == 0,
        "flags");
  CHECK(throttle_config_set_lock_timeout(cfg, LOCK_TIMEOUT_MS) == 0, "lock");
  CHECK(throttle_config_set_capacity(cfg, 8) == 0, "capacity");
  CHECK(throttle_config_set_max_delay(cfg, MAX_DELAY_MS) == 0, "max delay");
  CHECK(throttle_config_set_lease(cfg, 1000) == 0, "lease");
  return cfg;
}

/* ---- checks on what the library answers ------------------------------- */

/* Errors any call on an attached handle may give for a damaged segment. */
static int lock_error(int rc) {
  if (rc == THROTTLE_ELOCKTIMEOUT)
    stalled = 1;
  return rc == THROTTLE_ELOCKTIMEOUT || rc == THROTTLE_ECORRUPT;
}

static void check_info(const throttle_info_t *info) {
  const char *k = throttle_info_key(info);
  size_t n = strlen(k);
  CHECK(n >= 1 && n <= THROTTLE__KEY_MAX, "info key of %zu bytes", n);
  CHECK(throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS) <= MAX_DELAY_MS,
        "remaining %lld ms > max delay",
        (long long)throttle_info_get(info, THROTTLE_FIELD_REMAINING_MS));
  for (int f = 0; f < THROTTLE_FIELD_COUNT_; f++) {
    /* The learner's two "when" fields say "never" with -1 (throttle.h). */
    int64_t lo = f == THROTTLE_FIELD_CAP_NEXT_RAISE_MS ||
                         f == THROTTLE_FIELD_CAP_LEARNED_AGO_MS
                     ? -1
                     : 0;
    CHECK(throttle_info_get(info, (throttle_field_t)f) >= lo,
          "field %s below %lld", throttle_field_name((throttle_field_t)f),
          (long long)lo);
  }
  int64_t cap = throttle_info_get(info, THROTTLE_FIELD_CAP);
  CHECK(cap >= 1 && cap <= THROTTLE__SLOTS, "cap %lld", (long long)cap);
  int64_t inflight = throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT);
  CHECK(inflight <= THROTTLE__SLOTS, "in flight %lld", (long long)inflight);
  CHECK(throttle_info_get(info, THROTTLE_FIELD_BACKFILL_SHARE_PERMILLE) <=
            1000,
        "share");
  size_t i = 0;
  for (;; i++) {
    int64_t pid, age;
    throttle_class_t cls;
    int probe;
    int rc = throttle_info_holder(info, i, &pid, &age, &cls, &probe);
    if (rc == THROTTLE_ENOKEY)
      break;
    CHECK(rc == 0, "holder %zu: %d", i, rc);
    CHECK(i < THROTTLE__SLOTS, "more than %u holders", THROTTLE__SLOTS);
  }
  CHECK((int64_t)i == inflight, "%zu holders, in flight %lld", i,
        (long long)inflight);
}

static int each(const throttle_info_t *info, void *arg) {
  check_info(info);
  ++*(unsigned *)arg;
  return 0;
}

static void admit(throttle_t *h, const char *key, uint8_t ob,
                  uint8_t delay_s) {
  throttle_class_t cls =
      (ob & 0x80) ? THROTTLE_CLASS_BACKFILL : THROTTLE_CLASS_LIVE;
  throttle_ticket_t *t = NULL;
  uint64_t wait_ms = 0;
  int rc = throttle_try_enter(h, key, cls, &t, &wait_ms);
  if (verbose)
    fprintf(stderr, "try_enter %s: %s, wait %llu ms\n", key,
            throttle_err_name(rc), (unsigned long long)wait_ms);
  CHECK(rc == 0 || rc == THROTTLE_EWOULDBLOCK || rc == THROTTLE_EFULL ||
            rc == THROTTLE_ECANCELED || lock_error(rc),
        "try_enter: %s", throttle_err_name(rc));
  CHECK(rc == 0 || wait_ms <= MAX_DELAY_MS,
        "try_enter: wait hint %llu ms > max delay",
        (unsigned long long)wait_ms);
  if (rc == 0) {
    CHECK(t != NULL, "admitted without a ticket");
    rc = throttle_leave(h, t, (throttle_outcome_t)(ob & 0x3f),
                        (uint64_t)delay_s * 1000);
    CHECK(rc == 0 || rc == THROTTLE_EINVAL || rc == THROTTLE_EFULL ||
              lock_error(rc),
          "leave: %s", throttle_err_name(rc));
  } else {
    CHECK(t == NULL, "refused with a ticket");
  }
}

static void exercise_key(throttle_t *h, const char *key, uint8_t ob,
                         uint8_t delay_s, int setters, int enter_first) {
  if (enter_first)
    admit(h, key, ob, delay_s);
  if (stalled)
    return;
  uint64_t ms = UINT64_MAX;
  int rc = throttle_remaining(h, key, &ms);
  CHECK(rc == 0 || lock_error(rc), "remaining: %s", throttle_err_name(rc));
  if (rc == 0)
    CHECK(ms <= MAX_DELAY_MS, "remaining %llu ms > max delay",
          (unsigned long long)ms);
  if (stalled)
    return;

  throttle_info_t *info = NULL;
  rc = throttle_info(h, key, &info);
  CHECK(rc == 0 || rc == THROTTLE_ENOKEY || lock_error(rc),
        "info: %s", throttle_err_name(rc));
  if (rc == 0) {
    CHECK(strcmp(throttle_info_key(info), key) == 0, "info of another key");
    check_info(info);
  }
  throttle_info_free(info);
  if (stalled)
    return;

  rc = throttle_wait(h, key, 0);
  CHECK(rc == 0 || rc == THROTTLE_ETIMEDOUT || lock_error(rc), "wait: %s",
        throttle_err_name(rc));
  if (stalled)
    return;

  if (!enter_first)
    admit(h, key, ob, delay_s);
  if (stalled)
    return;

  rc = throttle_backoff(h, key, (uint64_t)delay_s * 1000);
  CHECK(rc == 0 || rc == THROTTLE_EFULL || lock_error(rc), "backoff: %s",
        throttle_err_name(rc));
  if (rc == 0) {
    rc = throttle_remaining(h, key, &ms);
    CHECK(rc == 0 || lock_error(rc), "remaining: %s", throttle_err_name(rc));
    if (rc == 0)
      CHECK(ms <= MAX_DELAY_MS, "remaining %llu ms after a back-off",
            (unsigned long long)ms);
  }

  if (setters && !stalled) {
    rc = throttle_set_max_parallel(h, key, delay_s % 34);
    CHECK(rc == 0 || rc == THROTTLE_EINVAL || rc == THROTTLE_EFULL ||
              lock_error(rc),
          "set_max_parallel: %s", throttle_err_name(rc));
    if (stalled)
      return;
    rc = throttle_pause(h, key);
    CHECK(rc == 0 || rc == THROTTLE_EFULL || lock_error(rc), "pause: %s",
          throttle_err_name(rc));
    if (stalled)
      return;
    rc = throttle_resume(h, key);
    CHECK(rc == 0 || rc == THROTTLE_ENOKEY || lock_error(rc), "resume: %s",
          throttle_err_name(rc));
    if (stalled)
      return;
    rc = throttle_cancel(h, key);
    CHECK(rc == 0 || rc == THROTTLE_ENOKEY || lock_error(rc), "cancel: %s",
          throttle_err_name(rc));
    if (stalled)
      return;
    rc = throttle_clear(h, key);
    CHECK(rc == 0 || rc == THROTTLE_ENOKEY || lock_error(rc), "clear: %s",
          throttle_err_name(rc));
  }
}

/* The blocking calls on garbage: whatever the record says, they give up
 * at their deadline (plus a lock timeout per look, and the jitter). */
static void block(throttle_t *h, const char *key, uint8_t ob) {
  throttle_class_t cls =
      (ob & 0x80) ? THROTTLE_CLASS_BACKFILL : THROTTLE_CLASS_LIVE;
  uint64_t t0 = throttle__mono_ns();
  int rc = throttle_wait(h, key, 100);
  CHECK(rc == 0 || rc == THROTTLE_ETIMEDOUT || lock_error(rc), "wait: %s",
        throttle_err_name(rc));
  uint64_t t1 = throttle__mono_ns();
  CHECK(t1 - t0 < UINT64_C(2000000000), "throttle_wait(100 ms) took %llu ms",
        (unsigned long long)((t1 - t0) / 1000000));
  if (stalled)
    return;
  throttle_ticket_t *t = NULL;
  rc = throttle_enter(h, key, cls, 100, &t);
  CHECK(rc == 0 || rc == THROTTLE_ETIMEDOUT || rc == THROTTLE_EFULL ||
            rc == THROTTLE_ECANCELED || lock_error(rc),
        "enter: %s", throttle_err_name(rc));
  uint64_t t2 = throttle__mono_ns();
  CHECK(t2 - t1 < UINT64_C(2000000000), "throttle_enter(100 ms) took %llu ms",
        (unsigned long long)((t2 - t1) / 1000000));
  if (rc == 0) {
    rc = throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
    CHECK(rc == 0 || lock_error(rc), "leave: %s", throttle_err_name(rc));
  }
}

/* A record's key, if it is one (1-255 bytes, no NUL). */
static int rec_key(const throttle_t *h, uint32_t i, char *out) {
  if (i >= h->capacity)
    return 0;
  const struct throttle__rec *r = &h->recs[i];
  uint16_t n = r->key_len;
  if (n < 1 || n > THROTTLE__KEY_MAX || memchr(r->key, 0, n) != NULL)
    return 0;
  memcpy(out, r->key, n);
  out[n] = 0;
  /* only a key a caller could name: the key rules (throttle_check_key)
   * refuse the others with THROTTLE_EKEY before any record is read;
   * foreach and the listings still walk such a record */
  return throttle_check_key(out) == 0;
}

static void exercise(throttle_t *h, const uint8_t *p, int setters,
                     int enter_first) {
  char k0[THROTTLE__KEY_MAX + 1], k1[THROTTLE__KEY_MAX + 1];
  const char *keys[6] = {"orders", "a", "hotdata:ws1/orders"};
  size_t n = 3;
  if (rec_key(h, 0, k0))
    keys[n++] = k0;
  if (rec_key(h, 1, k1))
    keys[n++] = k1;

  uint32_t cap = 0, used = 0;
  uint64_t ev = 0, rep = 0;
  int rc = throttle_stats(h, &cap, &used, &ev, &rep);
  CHECK(rc == 0 || lock_error(rc), "stats: %s", throttle_err_name(rc));
  if (rc == 0)
    CHECK(cap == h->capacity, "stats capacity %u", cap);
  if (stalled)
    return;

  if (p[2] & 0x40)
    block(h, keys[p[3] % n], p[2]);
  for (size_t i = 0; i < n && !stalled; i++)
    exercise_key(h, keys[i], p[2], p[3], setters, enter_first);
  if (stalled)
    return;

  unsigned seen = 0;
  rc = throttle_foreach(h, each, &seen);
  CHECK(rc == 0 || rc == THROTTLE_ENOMEM || lock_error(rc), "foreach: %s",
        throttle_err_name(rc));
  CHECK(seen <= h->capacity, "foreach saw %u keys of %u", seen, h->capacity);

  if (setters && !stalled) {
    rc = throttle_reset(h);
    CHECK(rc == 0 || lock_error(rc), "reset: %s", throttle_err_name(rc));
  }
}

/* ---- one input -------------------------------------------------------- */

static uint64_t rd64(const unsigned char *img, size_t n, size_t off) {
  uint64_t v = 0;
  if (off + 8 <= n)
    memcpy(&v, img + off, 8);
  return v;
}

static uint32_t rd32(const unsigned char *img, size_t n, size_t off) {
  uint32_t v = 0;
  if (off + 4 <= n)
    memcpy(&v, img + off, 4);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < PREFIX)
    return 0;
  uint8_t mode = data[0];
  uint32_t cap = 8 + data[1] % 57;
  const unsigned char *in = data + PREFIX;
  size_t n = size - PREFIX;

  uint32_t nb;
  uint64_t roff, total;
  size_t img_size = n;
  if (mode & M_VALID) {
    layout(cap, &nb, &roff, &total);
    img_size = (size_t)total;
  } else {
    switch (mode & M_SIZE) {
    case 1: {
      uint64_t t = rd64(in, n, offsetof(struct throttle__hdr, total_size));
      if (t <= MAX_IMAGE)
        img_size = (size_t)t;
      break;
    }
    case 2: {
      uint32_t c = rd32(in, n, offsetof(struct throttle__hdr, capacity));
      if (c >= 1 && c <= 256) {
        layout(c, &nb, &roff, &total);
        img_size = (size_t)total;
      }
      break;
    }
    case 3:
      layout(cap, &nb, &roff, &total);
      img_size = (size_t)total;
      break;
    }
  }
  if (img_size > MAX_IMAGE)
    img_size = MAX_IMAGE;

  /* Aligned as the mapping is (the header has 64-byte members). */
  size_t alloc = (img_size + THROTTLE__CACHELINE) & ~(size_t)(THROTTLE__CACHELINE - 1);
  unsigned char *img = aligned_alloc(THROTTLE__CACHELINE, alloc);
  if (img == NULL)
    return 0;
  memset(img, 0, alloc);
  if (n > 0) {
    size_t step = n < img_size ? n : img_size;
    memcpy(img, in, step);
    if (mode & M_REPEAT)
      for (size_t off = step; off < img_size; off += step)
        memcpy(img + off, in, img_size - off < step ? img_size - off : step);
  }
  if (mode & M_VALID) {
    valid_header(img, cap);
    if (mode & M_INDEX)
      index_records(img);
  }
  if (!(mode & M_KEEP_MUTEX) &&
      img_size >= offsetof(struct throttle__hdr, mutex) + sizeof(pthread_mutex_t))
    init_mutex(&((struct throttle__hdr *)img)->mutex);

  if (write_object(img, img_size) != 0) {
    free(img);
    shm_unlink(shm_name);
    return 0;
  }
  free(img);

  stalled = 0;
  throttle_config_t *cfg = config();
  throttle_t *h = NULL;
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  if (verbose)
    fprintf(stderr, "mode 0x%02x, %zu bytes: open %s%s%s\n", mode, img_size,
            throttle_err_name(rc), rc ? ": " : "",
            rc ? throttle_errmsg(NULL) : "");
  if (rc == 0) {
    CHECK(h != NULL && throttle_is_shared(h), "open: no shared handle");
    CHECK(h->size == (size_t)h->hdr->total_size, "attached %zu bytes",
          h->size);
    /* Reads past the object but within its last page do not fault: make
     * AddressSanitizer report them. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t tail = (page - h->size % page) % page;
    if (tail)
      ASAN_POISON_MEMORY_REGION((char *)h->base + h->size, tail);
    exercise(h, data, (mode & M_SETTERS) != 0, (mode & M_ENTER_FIRST) != 0);
    if (tail)
      ASAN_UNPOISON_MEMORY_REGION((char *)h->base + h->size, tail);
    throttle_close(h);
  } else {
    CHECK(h == NULL, "NO_FALLBACK open failed but left a handle");
    CHECK(rc == THROTTLE_EMAGIC || rc == THROTTLE_EVERSION ||
              rc == THROTTLE_EFINGERPRINT || rc == THROTTLE_ESIZE ||
              rc == THROTTLE_ECORRUPT || rc == THROTTLE_ESYS ||
              rc == THROTTLE_ENOSPC || rc == THROTTLE_EINITTIMEOUT ||
              /* magic 0: unfinished, and NO_CREATE never builds */
              rc == THROTTLE_ESHM,
          "open: %s (%s)", throttle_err_name(rc), throttle_errmsg(NULL));
  }
  shm_unlink(shm_name);
  return 0;
}

/* ---- seeds ------------------------------------------------------------ */

/* A real segment, as the library builds and uses it. */
static unsigned char *real_image(size_t *len) {
  char name[64];
  snprintf(name, sizeof name, "/throttle-fuzz-seed-%d", (int)getpid());
  throttle_config_t *cfg = throttle_config_new();
  throttle_config_set_segment(cfg, name);
  throttle_config_set_capacity(cfg, 8);
  throttle_config_set_flags(cfg, THROTTLE_NO_FALLBACK);
  throttle_t *h = NULL;
  shm_unlink(name);
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  CHECK(rc == 0, "seed segment: %s", throttle_errmsg(NULL));
  throttle_backoff(h, "orders", 30000);
  throttle_set_max_parallel(h, "a", 4);
  throttle_set_rate(h, "a", 10, 1000);
  throttle_set_backfill_share(h, "a", 0.5);
  throttle_ticket_t *t1 = NULL, *t2 = NULL;
  throttle_try_enter(h, "a", THROTTLE_CLASS_LIVE, &t1, NULL);
  throttle_try_enter(h, "a", THROTTLE_CLASS_BACKFILL, &t2, NULL);
  throttle_leave(h, t2, THROTTLE_OUTCOME_LOCKED, 2000);
  throttle_pause(h, "hotdata:ws1/orders");
  throttle_backoff(h, "hotdata:ws1/orders", 5000);
  /* t1 stays held: the image has a holding slot (of a process that will
   * be gone when the image is replayed). */
  *len = h->size;
  unsigned char *img = malloc(h->size);
  CHECK(img != NULL, "seed image");
  memcpy(img, h->base, h->size);
  throttle_leave(h, t1, THROTTLE_OUTCOME_OK, 0);
  throttle_close(h);
  shm_unlink(name);
  return img;
}

static int dir_is_empty(const char *path) {
  DIR *d = opendir(path);
  if (d == NULL)
    return 0;
  struct dirent *e;
  int empty = 1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      empty = 0;
  closedir(d);
  return empty;
}

static void write_seed(const char *dir, const char *file, uint8_t mode,
                       uint8_t b2, const unsigned char *img, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return;
  unsigned char prefix[PREFIX] = {mode, 0 /* 8 keys */, b2, 3};
  fwrite(prefix, 1, sizeof prefix, f);
  fwrite(img, 1, len, f);
  fclose(f);
}

/* Objects left by runs that crashed (their names carry the dead pid). */
static void remove_stale_objects(void) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int pid;
    char tail;
    if (sscanf(e->d_name, "throttle-fuzz-%d%c", &pid, &tail) != 1 &&
        sscanf(e->d_name, "throttle-fuzz-seed-%d%c", &pid, &tail) != 1)
      continue;
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      char name[300];
      snprintf(name, sizeof name, "/%s", e->d_name);
      shm_unlink(name);
    }
  }
  closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  snprintf(shm_name, sizeof shm_name, "/throttle-fuzz-%d", (int)getpid());
  remove_stale_objects();
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  int first = 0, ndirs = 0;
  for (int i = 1; i < *argc; i++) {
    struct stat st;
    if ((*argv)[i][0] != '-' && stat((*argv)[i], &st) == 0 &&
        S_ISDIR(st.st_mode) && ndirs++ == 0)
      first = i;
  }
  for (int i = 1; i < *argc; i++) {
    const char *a = (*argv)[i];
    if (a[0] == '-' || !(dir_is_empty(a) || (i == first && ndirs > 1)))
      continue;
    size_t len;
    unsigned char *img = real_image(&len);
    write_seed(a, "real-raw", 0, THROTTLE_OUTCOME_LOCKED, img, len);
    write_seed(a, "real-valid-index", M_VALID | M_INDEX | M_SETTERS,
               THROTTLE_OUTCOME_OK, img, len);
    write_seed(a, "real-raw-setters", M_SETTERS,
               0x80 | THROTTLE_OUTCOME_UNAVAILABLE, img, len);
    write_seed(a, "real-valid-blocking", M_VALID | M_INDEX | M_ENTER_FIRST,
               0x40 | THROTTLE_OUTCOME_LOCKED, img, len);
    /* A header only: the size taken from its own fields. */
    write_seed(a, "header-only-size-from-header", 1, 0, img,
               (size_t)hdr_size());
    free(img);
  }
  return 0;
}
