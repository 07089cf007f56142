/* SPDX-License-Identifier: MIT */
/*
 * fuzz_mutex.c — the segment mutex with arbitrary bytes (I8).
 *
 * The mutex lives in shared memory, so its bytes are input like any other
 * field, but they are read by the C library, not by libthrottle.  glibc
 * trusts them: a garbage "kind" word takes it into the priority-protect or
 * priority-inheritance code, which aborts on an assertion.  The library
 * must refuse such a mutex (THROTTLE_ECORRUPT) rather than hand it to
 * pthread_mutex_*; for any other bytes it may fail with
 * THROTTLE_ELOCKTIMEOUT or THROTTLE_ECORRUPT, but it must not crash, hang,
 * or leave the mutex held.
 *
 * Input: the bytes of the pthread_mutex_t (shorter inputs are padded with
 * zeros).  A real segment is built once; each input overwrites its mutex,
 * runs every call that takes the mutex, and then re-initialises it.
 *
 * The lock timeout is 5 ms (not the 50 ms of fuzz_segment): a garbage lock
 * word that looks held costs one timeout per call, and this target is made
 * of such inputs.
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_check.h"

#define MAX_DELAY_MS 60000u

static throttle_t *h;
static char name[64];

static void reinit_mutex(pthread_mutex_t *m) {
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(m, &ma);
  pthread_mutexattr_destroy(&ma);
}

static void unlink_at_exit(void) { shm_unlink(name); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(name, sizeof name, "/throttle-fuzz-mutex-%d", (int)getpid());
  shm_unlink(name);
  throttle_config_t *cfg = throttle_config_new();
  CHECK(cfg != NULL, "config");
  throttle_config_set_segment(cfg, name);
  throttle_config_set_capacity(cfg, 8);
  throttle_config_set_flags(cfg, THROTTLE_NO_FALLBACK);
  throttle_config_set_lock_timeout(cfg, 5);
  throttle_config_set_max_delay(cfg, MAX_DELAY_MS);
  int rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  CHECK(rc == 0, "open: %s", throttle_errmsg(NULL));
  /* The object may go at once: the mapping keeps it alive. */
  shm_unlink(name);
  atexit(unlink_at_exit);
  CHECK(throttle_backoff(h, "orders", 30000) == 0, "seed back-off");
  return 0;
}

static int ok(int rc) {
  return rc == 0 || rc == THROTTLE_ELOCKTIMEOUT || rc == THROTTLE_ECORRUPT;
}

static int each(const throttle_info_t *info, void *arg) {
  (void)info;
  (void)arg;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pthread_mutex_t *m = &h->hdr->mutex;
  unsigned char bytes[sizeof(pthread_mutex_t)] = {0};
  memcpy(bytes, data, size < sizeof bytes ? size : sizeof bytes);
  memcpy((void *)m, bytes, sizeof bytes);

  int rc = throttle_backoff(h, "orders", 1000);
  CHECK(ok(rc) || rc == THROTTLE_EFULL, "backoff: %s", throttle_err_name(rc));
  uint64_t ms;
  rc = throttle_remaining(h, "orders", &ms);
  CHECK(ok(rc), "remaining: %s", throttle_err_name(rc));
  throttle_info_t *info = NULL;
  rc = throttle_info(h, "orders", &info);
  CHECK(ok(rc) || rc == THROTTLE_ENOKEY, "info: %s", throttle_err_name(rc));
  throttle_info_free(info);
  throttle_ticket_t *t = NULL;
  rc = throttle_try_enter(h, "a", THROTTLE_CLASS_LIVE, &t, NULL);
  CHECK(ok(rc) || rc == THROTTLE_EWOULDBLOCK || rc == THROTTLE_EFULL,
        "try_enter: %s", throttle_err_name(rc));
  if (rc == 0) {
    rc = throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0);
    CHECK(ok(rc), "leave: %s", throttle_err_name(rc));
  }
  rc = throttle_foreach(h, each, NULL);
  CHECK(ok(rc) || rc == THROTTLE_ENOMEM, "foreach: %s", throttle_err_name(rc));
  rc = throttle_stats(h, NULL, NULL, NULL, NULL);
  CHECK(ok(rc), "stats: %s", throttle_err_name(rc));

  /* Whatever the bytes were, a call that took the mutex gave it back:
   * the lock word does not name this thread, unless the input did. */
#ifdef __GLIBC__
  int tid = (int)gettid();
  int was = (int)((unsigned)((const pthread_mutex_t *)(const void *)bytes)
                      ->__data.__lock &
                  0x3fffffffu);
  int now = (int)((unsigned)m->__data.__lock & 0x3fffffffu);
  /* Except: glibc's pthread_mutex_trylock() on a mutex marked not
   * recoverable (owner PTHREAD_MUTEX_NOTRECOVERABLE) returns
   * ENOTRECOVERABLE with the lock word still holding the caller's tid
   * (glibc 2.36 unlocks only when the old value was the caller's tid).
   * The library reports THROTTLE_ECORRUPT, and such a segment can only be
   * removed anyway. */
  int dead = ((const pthread_mutex_t *)(const void *)bytes)->__data.__owner ==
             0x7ffffffe;
  CHECK(was == tid || now != tid || dead,
        "the mutex was left held (lock 0x%x)", (unsigned)m->__data.__lock);
#endif
  reinit_mutex(m);
  return 0;
}
