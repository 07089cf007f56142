/* SPDX-License-Identifier: MIT */
/*
 * test_contract_shm.c — the contract cases of tests/contract_cases.c on
 * the host's segment alone: the two "hosts" of a case are processes of
 * this host on one segment (the segment is what every process of a host
 * shares).  tests/test_contract_redis.c runs the same cases on Redis.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "contract.h"
#include "internal.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static throttle_config_t *shm_config(struct ct_fx *c, int host) {
  (void)host; /* one segment for every process of the host */
  throttle_config_t *cfg = throttle_config_new();
  if (cfg != NULL && (throttle_config_set_segment(cfg, c->fx->name) != 0 ||
                      throttle_config_set_lock_timeout(cfg, 2000) != 0)) {
    throttle_config_free(cfg);
    cfg = NULL;
  }
  return cfg;
}

static int shm_start(struct ct_fx *c) {
  c->host[1] = shm_config(c, 1);
  return c->host[1] != NULL ? 0 : -1;
}

static void shm_stop(struct ct_fx *c) {
  throttle_config_free(c->host[1]);
  c->host[1] = NULL;
}

/* The segment's name taken by a file that is no segment (EMAGIC at the
 * next open); the teardown unlinks it with the segment's name. */
static void shm_cut(struct ct_fx *c) {
  shm_unlink(c->fx->name);
  int fd = shm_open(c->fx->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  char junk[4096];
  memset(junk, 'x', sizeof junk);
  assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
  close(fd);
}

/* The record's not-before, in ns on the throttle clock. */
static void shm_forge_not_before(struct ct_fx *c, throttle_t *h,
                                 const char *key) {
  (void)c;
  atomic_store(&((struct throttle__rec *)th_rec(h, key))->not_before,
               UINT64_MAX - 1);
}

static const struct ct_backend shm = {
    .name = "shm",
    .id = CT_SHM,
    .start = shm_start,
    .config = shm_config,
    .stop = shm_stop,
    .cut = shm_cut,
    .forge_not_before = shm_forge_not_before,
    .cut_says = "throttlectl rm",
    .clock_ms_rounding = 0,
    .liveness_env = NULL,
};

int main(void) { return ct_main(&shm); }
