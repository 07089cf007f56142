/* SPDX-License-Identifier: MIT */
/*
 * test_contract_redis.c — the contract cases of tests/contract_cases.c on
 * the Redis backend, with a throw-away redis-server per case
 * (redis_helpers.h) and two simulated hosts: handles on two segment names
 * that share nothing but the Redis, so whatever one host sees of the
 * other came through Redis.  tests/test_contract_shm.c runs the same
 * cases on the segment alone.  Skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "contract.h"
#include "redis_helpers.h"

#include <stdio.h>
#include <string.h>

static struct th_redis R;
static const char *other_segment; /* the second host's */

static throttle_config_t *redis_config(struct ct_fx *c, int host) {
  throttle_config_t *cfg = throttle_config_new();
  if (cfg != NULL &&
      (throttle_config_set_segment(cfg, host ? other_segment
                                             : c->fx->name) != 0 ||
       throttle_config_set_lock_timeout(cfg, 2000) != 0 ||
       throttle_config_set_backend(cfg, R.url) != 0)) {
    throttle_config_free(cfg);
    cfg = NULL;
  }
  return cfg;
}

static int redis_start(struct ct_fx *c) {
  memset(&R, 0, sizeof R);
  c->priv = &R;
  if (th_redis_start(&R) != 0 ||
      throttle_config_set_backend(c->host[0], R.url) != 0)
    return -1;
  other_segment = th_extra_name(c->fx); /* unlinked by the teardown */
  c->host[1] = redis_config(c, 1);
  return c->host[1] != NULL ? 0 : -1;
}

static void redis_stop(struct ct_fx *c) {
  throttle_config_free(c->host[1]);
  c->host[1] = NULL;
  th_redis_cleanup(&R);
  th_redis_module_again();
}

/* Redis killed: every handle's calls go to its host's segment. */
static void redis_cut(struct ct_fx *c) {
  (void)c;
  th_redis_stop(&R, 1);
}

/* The key's state hash (libthrottle/redis/common.lua), its 'nb' in ms
 * on Redis's clock. */
static void redis_forge_not_before(struct ct_fx *c, throttle_t *h,
                                   const char *key) {
  (void)c;
  (void)h;
  char name[600];
  snprintf(name, sizeof name, "thr1:{%s}:k:%s", key, key);
  const char *args[] = {"HSET", name, "nb", "9e18", NULL};
  assert_int_equal(th_redis_cli(&R, 0, args), 0);
}

static const struct ct_backend redis = {
    .name = "redis",
    .id = CT_REDIS,
    .start = redis_start,
    .config = redis_config,
    .stop = redis_stop,
    .cut = redis_cut,
    .forge_not_before = redis_forge_not_before,
    .cut_says = "segment serves",
    /* the scripts read Redis's TIME in whole milliseconds */
    .clock_ms_rounding = 2,
    /* a holder whose heartbeat stopped is dead after this (README,
     * "Across hosts": lease lapses; 10 s by default) */
    .liveness_env = "THROTTLE_LIVENESS_MS=1000",
};

int main(int argc, char **argv) {
  (void)argc;
  if (!th_redis_available()) {
    printf("SKIP test_contract_redis: redis-server is not installed (make "
           "deps)\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  return ct_main(&redis);
}
