/* SPDX-License-Identifier: MIT */
/*
 * handle.c — configuration objects, the environment, and the handle's life:
 * open (with the fail-open fallback to private memory), close, unlink.
 */
#include "backend.h"
#include "core/env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum {
  SET_CAPACITY = 1u << 0,
  SET_MAX_DELAY = 1u << 1,
  SET_LOCK_TIMEOUT = 1u << 2,
  SET_LEASE = 1u << 3,
};

THROTTLE_EXTERN throttle_config_t *throttle_config_new(void) {
  return throttle__calloc(1, sizeof(throttle_config_t));
}

THROTTLE_EXTERN void throttle_config_free(throttle_config_t *cfg) {
  if (cfg == NULL)
    return;
  throttle__free(cfg->segment);
  throttle__free(cfg->backend);
  throttle__free(cfg);
}

static int valid_segment_name(const char *name) {
  if (name == NULL)
    return 0;
  size_t n = strnlen(name, 202);
  if (n == 0 || n > 200 || (n == 1 && name[0] == '/'))
    return 0;
  return strchr(name + 1, '/') == NULL;
}

/* The segment to use: the given name, else $THROTTLE_SEGMENT, else the
 * per-user default.  Returns -1 when $THROTTLE_SEGMENT is set but invalid
 * (the default is used then). */
static int resolve_name(const char *given, char *out, size_t len) {
  const char *env = getenv("THROTTLE_SEGMENT");
  const char *name = given;
  if (name == NULL && env != NULL && *env != 0 && valid_segment_name(env))
    name = env;
  if (name != NULL) {
    snprintf(out, len, "%s%s", name[0] == '/' ? "" : "/", name);
    return 0;
  }
  snprintf(out, len, "/libthrottle-v%u-%u", THROTTLE__LAYOUT,
           (unsigned)geteuid());
  return env != NULL && *env != 0 ? -1 : 0;
}

THROTTLE_EXTERN int throttle_config_set_segment(throttle_config_t *cfg,
                                                const char *name) {
  if (cfg == NULL || !valid_segment_name(name))
    return THROTTLE_EINVAL;
  char *copy = throttle__malloc(strlen(name) + 2);
  if (copy == NULL)
    return THROTTLE_ENOMEM;
  snprintf(copy, strlen(name) + 2, "%s%s", name[0] == '/' ? "" : "/", name);
  throttle__free(cfg->segment);
  cfg->segment = copy;
  return 0;
}

THROTTLE_EXTERN int throttle_config_set_capacity(throttle_config_t *cfg,
                                                 uint32_t keys) {
  if (cfg == NULL || keys == 0 || keys > THROTTLE__MAX_CAPACITY)
    return THROTTLE_EINVAL;
  cfg->capacity = keys;
  cfg->set |= SET_CAPACITY;
  return 0;
}

#define MAX_MAX_DELAY_MS THROTTLE__MAX_MAX_DELAY_MS

THROTTLE_EXTERN int throttle_config_set_max_delay(throttle_config_t *cfg,
                                                  uint64_t ms) {
  if (cfg == NULL || ms == 0 || ms > MAX_MAX_DELAY_MS)
    return THROTTLE_EINVAL;
  cfg->max_delay_ms = ms;
  cfg->set |= SET_MAX_DELAY;
  return 0;
}

THROTTLE_EXTERN int throttle_config_set_lock_timeout(throttle_config_t *cfg,
                                                     uint32_t ms) {
  if (cfg == NULL || ms == 0)
    return THROTTLE_EINVAL;
  cfg->lock_timeout_ms = ms;
  cfg->set |= SET_LOCK_TIMEOUT;
  return 0;
}

THROTTLE_EXTERN int throttle_config_set_lease(throttle_config_t *cfg,
                                              uint32_t ms) {
  if (cfg == NULL || ms == 0 || ms > 86400000u)
    return THROTTLE_EINVAL;
  cfg->lease_ms = ms;
  cfg->set |= SET_LEASE;
  return 0;
}

THROTTLE_EXTERN int throttle_config_set_interrupt(throttle_config_t *cfg,
                                                  int (*check)(void *arg),
                                                  void *arg,
                                                  uint32_t period_ms) {
  if (cfg == NULL || (check != NULL && (period_ms == 0 || period_ms > 60000)))
    return THROTTLE_EINVAL;
  cfg->intr = check;
  cfg->intr_arg = check != NULL ? arg : NULL;
  cfg->intr_period_ms = check != NULL ? period_ms : 0;
  return 0;
}

THROTTLE_EXTERN int throttle_config_set_flags(throttle_config_t *cfg,
                                              unsigned flags) {
  if (cfg == NULL || (flags & ~15u) != 0)
    return THROTTLE_EINVAL;
  cfg->flags = flags;
  return 0;
}


THROTTLE_EXTERN int throttle_open(const throttle_config_t *cfg,
                                  throttle_t **out) {
  if (out == NULL)
    return THROTTLE_EINVAL;
  *out = NULL;
  throttle_t *h = throttle__calloc(1, sizeof *h);
  if (h == NULL)
    return throttle__fail(NULL, THROTTLE_ENOMEM,
                          "out of memory for a handle (%zu bytes)", sizeof *h);
  h->ops = &throttle__segment_ops; /* until a backend is opened */
  char warn[sizeof h->open_msg] = "";
  if (resolve_name(cfg != NULL ? cfg->segment : NULL, h->name,
                   sizeof h->name) != 0)
    snprintf(warn, sizeof warn,
             "THROTTLE_SEGMENT='%.40s' is not a segment name (1 to 200 "
             "bytes, no '/' after the first); %s is used",
             getenv("THROTTLE_SEGMENT"), h->name);
  h->capacity = (cfg != NULL && (cfg->set & SET_CAPACITY))
                    ? cfg->capacity
                    : (uint32_t)throttle__env_number("THROTTLE_KEYS",
                                           THROTTLE__DEFAULT_CAPACITY, 1,
                                           THROTTLE__MAX_CAPACITY, warn,
                                           sizeof warn);
  uint64_t max_ms = (cfg != NULL && (cfg->set & SET_MAX_DELAY))
                        ? cfg->max_delay_ms
                        : throttle__env_number("THROTTLE_MAX_DELAY_MS",
                                     THROTTLE__DEFAULT_MAX_DELAY_MS, 1,
                                     MAX_MAX_DELAY_MS, warn, sizeof warn);
  h->max_delay_ns = max_ms * THROTTLE__NS_PER_MS;
  h->lock_timeout_ms = (cfg != NULL && (cfg->set & SET_LOCK_TIMEOUT))
                           ? cfg->lock_timeout_ms
                           : THROTTLE__DEFAULT_LOCK_TIMEOUT_MS;
  h->lease_ms = (cfg != NULL && (cfg->set & SET_LEASE))
                    ? (uint32_t)cfg->lease_ms
                    : (uint32_t)throttle__env_number("THROTTLE_LEASE_MS",
                                           THROTTLE__DEFAULT_LEASE_MS, 1,
                                           86400000u, warn, sizeof warn);
  h->flags = cfg != NULL ? cfg->flags : 0;
  if (cfg != NULL && cfg->intr != NULL) {
    h->intr = cfg->intr;
    h->intr_arg = cfg->intr_arg;
    h->intr_period_ns = (uint64_t)cfg->intr_period_ms * THROTTLE__NS_PER_MS;
  }
  if (h->flags & THROTTLE_READONLY) /* inspecting never creates */
    h->flags |= THROTTLE_NO_CREATE;

  uint32_t want_capacity = h->capacity;
  int rc = throttle__segment_open(h, cfg);
  if (rc == 0 && (rc = throttle__be_open(h, cfg)) != 0) {
    /* The segment alone serves (I7); the caller hears why. */
    snprintf(h->open_msg, sizeof h->open_msg, "%s: %s", throttle_err_name(rc),
             throttle_errmsg(h));
    if (h->flags & THROTTLE_NO_FALLBACK) {
      throttle__orphan_msg(h);
      throttle__segment_close(h);
      throttle__free(h);
      return rc;
    }
    *out = h;
    return rc;
  }
  if (rc == 0) {
    /* Warnings: this process's environment, then the backend's. */
    size_t k = strlen(warn), m = strlen(h->open_msg);
    if (m > 0 && k > 0 && k + 2 < sizeof warn) {
      memcpy(warn + k, "; ", 2);
      k += 2;
    }
    if (m > sizeof warn - 1 - k)
      m = sizeof warn - 1 - k;
    memcpy(warn + k, h->open_msg, m);
    warn[k + m] = 0;
    memcpy(h->open_msg, warn, sizeof h->open_msg);
    throttle__clear_msg(h);
    *out = h;
    return 0;
  }
  if (h->flags & THROTTLE_NO_FALLBACK) {
    throttle__orphan_msg(h);
    throttle__free(h);
    return rc;
  }
  /* Fail open: same code, private memory.  Keep the reason for the caller;
   * throttle_is_shared() tells that it fell back. */
  snprintf(h->open_msg, sizeof h->open_msg, "%s: %s", throttle_err_name(rc),
           throttle_errmsg(h));
  throttle__clear_msg(h);
  int prc = throttle__segment_private(h, want_capacity);
  if (prc != 0) {
    /* No handle at all: THROTTLE_ENOMEM is the one code that says so
     * (throttle.h), whatever the private mapping failed on.  Its message
     * stays readable through throttle_errmsg(NULL). */
    throttle__orphan_msg(h);
    throttle__free(h);
    return THROTTLE_ENOMEM;
  }
  *out = h;
  return rc;
}

THROTTLE_EXTERN void throttle_close(throttle_t *h) {
  if (h == NULL)
    return;
  throttle__clear_msg(h);
  throttle__be_close(h);
  throttle__segment_close(h);
  throttle__free(h);
}

THROTTLE_EXTERN int throttle_is_shared(const throttle_t *h) {
  return h != NULL && h->shared;
}

THROTTLE_EXTERN const char *throttle_segment_name(const throttle_t *h) {
  return h != NULL ? h->name : "";
}

int throttle__readonly_fail(const throttle_t *h, const char *what) {
  return throttle__fail(h, THROTTLE_EREADONLY,
                        "%s is open read-only (THROTTLE_READONLY): cannot %s; "
                        "its owner can, without that flag",
                        h->name, what);
}

THROTTLE_EXTERN int throttle_unlink(const char *segment_name) {
  char name[256];
  if (segment_name != NULL && !valid_segment_name(segment_name))
    return THROTTLE_EINVAL;
  /* An invalid $THROTTLE_SEGMENT names no segment: removing the default
   * instead would destroy the back-offs of every loader that uses it.
   * Falling back to the default is for opening only, where it fails open
   * and throttle_errmsg() says so. */
  if (resolve_name(segment_name, name, sizeof name) != 0)
    return THROTTLE_EINVAL;
  if (shm_unlink(name) == 0)
    return 0;
  return errno == ENOENT ? THROTTLE_ENOKEY : THROTTLE_ESHM;
}
