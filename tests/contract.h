/* SPDX-License-Identifier: MIT */
/*
 * contract.h — the contracts (I1–I8 as far as a backend can be seen
 * through the public API, scopes, pools, the learned cap, cancel, pause,
 * resume and clear) written once, as a table of cases in
 * tests/contract_cases.c, and run against each backend by a thin main:
 * tests/test_contract_shm.c (the host's segment alone) and
 * tests/test_contract_redis.c (Redis, with a second simulated host).
 *
 * A case sees the backend only through a struct ct_fx: the configuration
 * of two "hosts" (on the segment, two processes of one host share one
 * segment; on Redis, the second host is a segment of its own that shares
 * nothing with the first but the Redis), a way to cut the backend off,
 * and the few documented properties in which backends differ (how fast a
 * dead holder is judged dead, the resolution of the backend's clock).
 * A rule changed in one backend and not the other makes one of the two
 * programs fail.
 *
 * Include after <stdarg.h>, <stddef.h>, <setjmp.h> and <cmocka.h>.
 */
#ifndef THROTTLE_TEST_CONTRACT_H
#define THROTTLE_TEST_CONTRACT_H

#include "helpers.h"

enum ct_backend_id { CT_SHM, CT_REDIS, CT_NBACKENDS };

struct ct_fx;

struct ct_backend {
  const char *name; /* "shm", "redis" */
  enum ct_backend_id id;
  /* After th_setup(): point c->host[0] (the fixture's own config) and
   * c->host[1] (another host's) at the backend; 0, or -1 when it cannot
   * be started. */
  int (*start)(struct ct_fx *c);
  /* A new configuration of host 0 or 1, as c->host[i] (for a case that
   * changes one of its settings); the caller frees it. */
  throttle_config_t *(*config)(struct ct_fx *c, int host);
  /* Undo start(); always called by the teardown, whatever happened. */
  void (*stop)(struct ct_fx *c);
  /* Make the backend unusable for the handles opened from now on (I7):
   * the segment replaced by a foreign file, Redis killed. */
  void (*cut)(struct ct_fx *c);
  /* Write into key's stored state a not-before far past any maximum, as
   * a hostile or buggy writer with access to the backend would (I8); h
   * is a handle of host 0 that has published on key. */
  void (*forge_not_before)(struct ct_fx *c, throttle_t *h, const char *key);
  /* What throttle_errmsg() of a handle opened after cut() contains. */
  const char *cut_says;
  /* The backend's clock reads whole milliseconds (Redis's TIME as the
   * scripts use it): a not-before is compared with this much rounding. */
  unsigned clock_ms_rounding;
  /* Set in the environment before a case's handles are opened when the
   * case needs a dead holder judged dead quickly (NULL: at once anyway,
   * as the segment judges a holder by its pid). */
  const char *liveness_env;
};

struct ct_fx {
  struct th_fx *fx; /* helpers.h's fixture: segment name, children */
  const struct ct_backend *be;
  const struct ct_case *cs;
  throttle_config_t *host[2]; /* host[0] == fx->cfg */
  void *priv;                 /* the backend's own (its redis-server) */
};

/* One case: the rule it pins, and per backend NULL or the reason it is
 * skipped there (a documented difference, with its reference, or
 * "fails: ..." for a bug left open; CONTRACT_RUN_FAILING=1 in the
 * environment runs those anyway, to see whether a fix closes them). */
struct ct_case {
  const char *name;
  void (*fn)(struct ct_fx *c);
  const char *skip[CT_NBACKENDS];
};

/* Run every case of the table against be; main's return value. */
int ct_main(const struct ct_backend *be);

#endif
