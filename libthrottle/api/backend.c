/* SPDX-License-Identifier: MIT */
/*
 * backend.c — choosing and loading a backend other than the segment: the
 * THROTTLE_BACKEND switch, dlopen() of the module, and the wrappers the
 * public entry points call first (backend.h).  The core keeps depending on
 * libc and pthreads only; the module brings its own client library.
 *
 * Where the module is found: $THROTTLE_BACKEND_MODULE (a path), else next
 * to the object that holds this code (the installed libthrottle.so.1, or a
 * statically linked program such as throttlectl), else by its soname
 * through the dynamic loader's search.  Whatever the backend, the handle
 * keeps its segment: calls the backend cannot serve (it is unreachable)
 * are served there, for this host's processes (I7).
 */
#include "backend.h"

#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>

#define MODULE_SONAME "libthrottle-redis.so.1"

struct throttle__be {
  char shown[512]; /* the URL, password masked */
  void *dl;
  const struct throttle__backend *ops;
  void *state;
  _Atomic int down; /* the last call was served by the segment */
  _Atomic uint64_t down_since_ns; /* throttle__mono_ns() when it went down */
  _Atomic uint64_t served_down;   /* calls the segment served since then */
  _Atomic unsigned notice_gen; /* the backend's notice last copied */
  char env_warn[256]; /* the module's warnings about its environment */
};

/* What throttle_errmsg() shows between errors: the module's warnings
 * about its environment, then its standing notice about the backend's
 * setup (a Redis that may evict keys, blocking commands refused). */
static unsigned show_notice(throttle_t *h, struct throttle__be *be) {
  char note[sizeof h->open_msg - sizeof be->env_warn - 2];
  unsigned gen = be->ops->notice(be->state, note, sizeof note);
  snprintf(h->open_msg, sizeof h->open_msg, "%.255s%s%.253s", be->env_warn,
           be->env_warn[0] && note[0] ? "; " : "", note);
  return gen;
}

THROTTLE_EXTERN int throttle_config_set_backend(throttle_config_t *cfg,
                                                const char *url) {
  if (cfg == NULL || url == NULL || *url == 0 || strlen(url) > 500)
    return THROTTLE_EINVAL;
  char *copy = throttle__strdup(url);
  if (copy == NULL)
    return THROTTLE_ENOMEM;
  throttle__free(cfg->backend);
  cfg->backend = copy;
  return 0;
}

static void *load_module(char *why, size_t len) {
  const char *path = getenv("THROTTLE_BACKEND_MODULE");
  if (path != NULL && *path != 0) {
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL)
      snprintf(why, len, "%s", dlerror());
    return dl;
  }
  /* The object this code is part of (libthrottle.so.1, or a program
   * linked with libthrottle.a): any of its functions names it. */
  Dl_info di;
  if (dladdr((void *)throttle__be_open, &di) != 0 && di.dli_fname != NULL) {
    /* Beside libthrottle, then in its libthrottle/ subdirectory, where a
     * distribution keeps a module nobody links against. */
    char dir[4096], full[4200];
    snprintf(dir, sizeof dir, "%s", di.dli_fname);
    const char *d = dirname(dir);
    static const char *const sub[] = {"", "libthrottle/"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
      snprintf(full, sizeof full, "%s/%s%s", d, sub[i], MODULE_SONAME);
      void *dl = dlopen(full, RTLD_NOW | RTLD_LOCAL);
      if (dl != NULL)
        return dl;
    }
  }
  void *dl = dlopen(MODULE_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL)
    snprintf(why, len, "%s", dlerror());
  return dl;
}

static uint32_t segment_count(void *arg, const char *key) {
  return throttle__segment_count(arg, key);
}

static int segment_settings(void *arg, const char *key, uint64_t within_ms,
                            struct throttle__be_settings *out) {
  return throttle__segment_settings(arg, key, within_ms, out);
}

/* 0 when no backend is asked for or it was loaded; else the error, with
 * its message, and the handle goes on with its segment alone. */
int throttle__be_open(throttle_t *h, const throttle_config_t *cfg) {
  const char *url = cfg != NULL ? cfg->backend : NULL;
  if (url == NULL)
    url = getenv("THROTTLE_BACKEND");
  if (url == NULL || *url == 0 || strcmp(url, "shm") == 0)
    return 0;
  char why[512] = "";
  if (strncmp(url, "rediss://", 9) == 0)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "THROTTLE_BACKEND: rediss:// (TLS) is not supported: "
                          "the hiredis this module is built with has no TLS; "
                          "carry redis:// or unix:// through a TLS tunnel "
                          "(docs/FAILURE-MODEL.md, Across hosts)");
  if (strncmp(url, "redis://", 8) != 0 && strncmp(url, "unix://", 7) != 0)
    return throttle__fail(h, THROTTLE_EINVAL,
                          "THROTTLE_BACKEND: '%.200s' is not redis://..., "
                          "unix://... or shm",
                          url);
  struct throttle__be *be = throttle__calloc(1, sizeof *be);
  if (be == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  be->dl = load_module(why, sizeof why);
  if (be->dl == NULL) {
    throttle__free(be);
    return throttle__fail(h, THROTTLE_EBACKEND,
                          "%s: cannot load " MODULE_SONAME " (%.300s); "
                          "install it or set THROTTLE_BACKEND_MODULE",
                          url, why);
  }
  be->ops = dlsym(be->dl, THROTTLE__BACKEND_SYMBOL);
  if (be->ops == NULL || be->ops->abi != THROTTLE__BACKEND_ABI) {
    dlclose(be->dl);
    throttle__free(be);
    return throttle__fail(h, THROTTLE_EBACKEND,
                          "%s: " MODULE_SONAME " is not a backend of this "
                          "libthrottle (ABI %u)",
                          url, THROTTLE__BACKEND_ABI);
  }
  struct throttle__be_params p = {
      .segment_count = segment_count,
      .segment_settings = segment_settings,
      .segment_arg = h,
      .segment_name = h->name, /* as throttle_segment_name() */
      .url = url,
      .max_delay_ms = h->max_delay_ns / THROTTLE__NS_PER_MS,
      .store_max_ms = throttle__seg_max_ns(h) / THROTTLE__NS_PER_MS,
      .lease_ms = h->lease_ms,
      .info_size = (uint32_t)sizeof(throttle_info_t),
      .intr = h->intr,
      .intr_arg = h->intr_arg,
      .intr_period_ms = h->intr_period_ns / THROTTLE__NS_PER_MS,
  };
  int rc = be->ops->open(&p, &be->state, why, sizeof why);
  if (rc != 0) {
    dlclose(be->dl);
    throttle__free(be);
    return throttle__fail(h, rc, "%s", why);
  }
  /* redis://[USER]:PASSWORD@HOST -> redis://[USER]:***@HOST */
  const char *ui = strstr(url, "://") + 3;
  const char *at = strrchr(ui, '@');
  const char *colon = at != NULL ? memchr(ui, ':', (size_t)(at - ui)) : NULL;
  if (colon != NULL)
    snprintf(be->shown, sizeof be->shown, "%.*s:***%s", (int)(colon - url),
             url, at);
  else
    snprintf(be->shown, sizeof be->shown, "%s", url);
  h->be = be;
  h->ops = &throttle__remote_ops;
  snprintf(be->env_warn, sizeof be->env_warn, "%.255s", why);
  atomic_store(&be->notice_gen, show_notice(h, be));
  return 0;
}

THROTTLE_EXTERN const char *throttle_backend(const throttle_t *h) {
  return h != NULL && h->be != NULL ? h->be->shown : "shm";
}

THROTTLE_EXTERN int throttle_backend_status(const throttle_t *h, int *up,
                                            uint64_t *down_ms,
                                            uint64_t *served) {
  if (h == NULL || up == NULL)
    return THROTTLE_EINVAL;
  const struct throttle__be *be = h->be;
  int down = be != NULL && atomic_load(&be->down);
  uint64_t since = down ? atomic_load(&be->down_since_ns) : 0,
           now = down ? throttle__mono_ns() : 0;
  *up = !down;
  if (down_ms != NULL)
    *down_ms = down && now > since ? (now - since) / THROTTLE__NS_PER_MS : 0;
  if (served != NULL)
    *served = down ? atomic_load(&be->served_down) : 0;
  return 0;
}

void throttle__be_close(throttle_t *h) {
  struct throttle__be *be = h->be;
  if (be == NULL)
    return;
  be->ops->close(be->state);
  /* The module stays mapped: a heartbeat thread of another handle, or a
   * ticket's code, may still be in it; dlclose() would gain nothing. */
  throttle__free(be);
  h->be = NULL;
  h->ops = &throttle__segment_ops;
}

/* The public answer for a backend's answer; DOWN passes through, with a
 * notice the first time (throttle_errmsg() shows it until Redis is back). */
static int result(throttle_t *h, int rc) {
  struct throttle__be *be = h->be;
  if (rc == THROTTLE__BE_DOWN) {
    if (!atomic_exchange(&be->down, 1)) {
      atomic_store(&be->down_since_ns, throttle__mono_ns());
      atomic_store(&be->served_down, 0);
      snprintf(h->open_msg, sizeof h->open_msg, "%s",
               be->ops->errmsg(be->state));
    }
    atomic_fetch_add(&be->served_down, 1);
    return rc;
  }
  /* back from the segment, or the backend's warning changed: the
   * warning (or nothing) is what throttle_errmsg() shows between errors */
  unsigned gen = be->ops->notice(be->state, NULL, 0);
  if (atomic_exchange(&be->down, 0) ||
      atomic_exchange(&be->notice_gen, gen) != gen)
    (void)show_notice(h, be);
  if (rc < 0)
    return throttle__fail(h, rc, "%s", be->ops->errmsg(be->state));
  throttle__clear_msg(h);
  return rc;
}

/* Key checks are the core's: a key the segment refuses is refused here. */
#define CHECK_KEY(h, key)                                                      \
  do {                                                                         \
    size_t len_;                                                               \
    int krc_ = throttle__check_key((h), (key), &len_);                         \
    if (krc_ != 0)                                                             \
      return krc_;                                                             \
  } while (0)

/* A read-only handle (THROTTLE_READONLY) changes nothing anywhere: its
 * changing calls go to the segment, which refuses them. */
#define READ_ONLY_STAYS(h)                                                     \
  do {                                                                         \
    if ((h)->ro_src != NULL)                                                   \
      return THROTTLE__BE_DOWN;                                                \
  } while (0)

int throttle__be_backoff(throttle_t *h, const char *key, uint64_t delay_ms) {
  READ_ONLY_STAYS(h);
  CHECK_KEY(h, key);
  return result(h, h->be->ops->backoff(h->be->state, key, delay_ms, -1));
}

int throttle__be_remaining(throttle_t *h, const char *key, uint64_t *ms) {
  CHECK_KEY(h, key);
  return result(h, h->be->ops->remaining(h->be->state, key, ms));
}

/* What this host was told and the backend may have lost (a restart, a
 * failover, an outage the segment served): published again before a
 * wait or an admission, on the key and on each of its scopes (where a
 * 429 or a 503 went), unless the backend had the key cleared since.  Only ever later there, so it costs nothing when
 * the backend knows already, and one extra call only while it is pending
 * here. */
static void heal(throttle_t *h, const char *key) {
  char name[THROTTLE__KEY_MAX + 1];
  size_t len = strnlen(key, THROTTLE__KEY_MAX);
  for (size_t p = 0;; p++) {
    size_t end = throttle__scope_next(key, len, p);
    p = end != 0 ? end : len;
    memcpy(name, key, p);
    name[p] = 0;
    uint64_t ms = throttle__segment_remaining(h, name);
    /* a copy older than a clear or reset on the backend (from any host)
     * is dropped, not published again */
    if (ms > 0 &&
        h->be->ops->backoff(h->be->state, name, ms,
                            (int64_t)throttle__segment_published_ago(
                                h, name)) == THROTTLE_ESTALE)
      throttle__segment_forget(h, name);
    if (end == 0)
      return;
  }
}

/* The caller's timeout less what the backend took since t0 (ns): what the
 * segment gets when it serves the call after all. */
static void spend(uint64_t *timeout_ms, uint64_t t0) {
  if (*timeout_ms == THROTTLE_FOREVER)
    return;
  uint64_t used = (throttle__mono_ns() - t0) / THROTTLE__NS_PER_MS;
  *timeout_ms = used < *timeout_ms ? *timeout_ms - used : 0;
}

static int enter(throttle_t *h, const char *key, int cls,
                 uint64_t timeout_ms, int nowait, void **tk, int *probe,
                 uint64_t *wait_ms);

int throttle__be_wait(throttle_t *h, const char *key, uint64_t *timeout_ms) {
  CHECK_KEY(h, key);
  uint64_t t0 = throttle__mono_ns();
  heal(h, key);
  uint64_t left = *timeout_ms;
  spend(&left, t0);
  int rc = result(h, h->be->ops->wait(h->be->state, key, left));
  if (rc == THROTTLE__BE_DOWN)
    spend(timeout_ms, t0);
  return rc;
}

int throttle__be_enter(throttle_t *h, const char *key, int cls,
                       uint64_t *timeout_ms, int nowait, void **tk,
                       int *probe, uint64_t *wait_ms) {
  uint64_t t0 = throttle__mono_ns();
  int rc = enter(h, key, cls, *timeout_ms, nowait, tk, probe, wait_ms);
  if (rc == THROTTLE__BE_DOWN)
    spend(timeout_ms, t0);
  return rc;
}

/* The settings the backend told with an enter (the key's, then its
 * scopes', root first), kept in the segment for a time it is away: a
 * key's cap or pause, a pool's cap or rate, a workspace's pause narrow to
 * this host then instead of lapsing. */
static void mirror(throttle_t *h, const char *key, size_t len,
                   const struct throttle__be_settings *set) {
  char name[THROTTLE__KEY_MAX + 1];
  size_t i = 1;
  for (size_t end = throttle__scope_next(key, len, 0);
       end != 0 && i < THROTTLE__BE_NSETTINGS;
       end = throttle__scope_next(key, len, end + 1), i++) {
    memcpy(name, key, end);
    name[end] = 0;
    throttle__segment_mirror(h, name, &set[i]);
  }
  throttle__segment_mirror(h, key, &set[0]);
}

static int enter(throttle_t *h, const char *key, int cls,
                 uint64_t timeout_ms, int nowait, void **tk, int *probe,
                 uint64_t *wait_ms) {
  READ_ONLY_STAYS(h);
  uint64_t t0 = throttle__mono_ns();
  /* While the backend comes back, some of this host's callers may still
   * be in the segment's gate, admitted or queued there during the outage.
   * New callers go to the backend all the same (were they to queue in the
   * segment, under load it would never empty and the host never rejoin);
   * each of their looks tells the backend how many the segment holds
   * (params segment_count), which it counts as this host's until the
   * segment has drained.  One of them told "come back later" after this
   * caller's heal must hold it too, so an admission is checked against the
   * segment's not-before and handed back if it closed meanwhile. */
  size_t len = strlen(key);
  const uint32_t cold[2] = {
      throttle__publish_len(h, key, len, THROTTLE_OUTCOME_RATE_LIMITED),
      throttle__publish_len(h, key, len, THROTTLE_OUTCOME_UNAVAILABLE)};
  for (int tries = 0;; tries++) {
    heal(h, key);
    uint64_t left = timeout_ms;
    spend(&left, t0);
    struct throttle__be_settings set[THROTTLE__BE_NSETTINGS] = {0};
    int rc = h->be->ops->enter(h->be->state, key, cls, left, nowait, tk,
                               probe, wait_ms, cold, set);
    mirror(h, key, len, set);
    uint64_t ms;
    if (rc != 0 || tries == 8 || (ms = throttle__segment_remaining(h, key)) == 0)
      return result(h, rc);
    (void)h->be->ops->leave(h->be->state, *tk, THROTTLE_OUTCOME_ABANDONED, 0,
                            (uint32_t)len);
    *tk = NULL;
    if (nowait) {
      if (wait_ms != NULL)
        *wait_ms = ms;
      return throttle__fail(h, THROTTLE_EWOULDBLOCK, "%s: not admitted now",
                            key);
    }
  }
}

int throttle__be_leave(throttle_t *h, void *tk, int outcome,
                       uint64_t retry_after_ms, uint32_t pub_len) {
  return result(h, h->be->ops->leave(h->be->state, tk, outcome,
                                     retry_after_ms, pub_len));
}

int throttle__be_set(throttle_t *h, const char *key, int what, uint64_t a,
                     uint64_t b) {
  READ_ONLY_STAYS(h);
  CHECK_KEY(h, key);
  return result(h, h->be->ops->set(h->be->state, key, what, a, b));
}

int throttle__be_clear(throttle_t *h, const char *key) {
  READ_ONLY_STAYS(h);
  if (key != NULL)
    CHECK_KEY(h, key);
  return result(h, h->be->ops->clear(h->be->state, key));
}

int throttle__be_info(throttle_t *h, const char *key, throttle_info_t **out) {
  CHECK_KEY(h, key);
  throttle_info_t *info = throttle__malloc(sizeof *info);
  if (info == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  int rc = result(h, h->be->ops->info(h->be->state, key, info));
  if (rc == 0) {
    throttle__refusal_merge(h, info); /* kept by this host (refusal.c) */
    *out = info;
  } else {
    throttle__free(info);
  }
  return rc;
}

/* Each key the backend lists, completed with what this host's segment
 * kept of its last refusal (refusal.c) before the caller's fn sees it. */
struct merged {
  throttle_t *h;
  int (*fn)(const throttle_info_t *, void *);
  void *arg;
  throttle_info_t *copy;
};

static int merge_one(const throttle_info_t *info, void *arg) {
  struct merged *m = arg;
  memcpy(m->copy, info, sizeof *m->copy);
  throttle__refusal_merge(m->h, m->copy);
  return m->fn(m->copy, m->arg);
}

int throttle__be_foreach(throttle_t *h,
                         int (*fn)(const throttle_info_t *, void *),
                         void *arg) {
  struct merged m = {h, fn, arg, throttle__malloc(sizeof *m.copy)};
  if (m.copy == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  int rc = h->be->ops->foreach(h->be->state, merge_one, &m);
  throttle__free(m.copy);
  /* fn's own non-zero value is returned as it is */
  if (rc == THROTTLE__BE_DOWN || rc == 0)
    return result(h, rc);
  return rc;
}

/* ---- the table of a backend across hosts -------------------------------
 * Each operation asks the backend (the wrappers above), and serves the
 * call from the segment's own table when the backend is down: downward
 * only, the segment never calls back. */

static int remote_backoff(throttle_t *h, const char *key, size_t len,
                          uint64_t delay_ms) {
  /* With a backend that took the back-off, the segment records a copy:
   * if the backend goes away, this host's processes still honour what
   * they were told.  A copy that finds no room (a table full of keys in
   * use) or no mutex turns no success into an error: the back-off is
   * published where every host reads it. */
  int rc = throttle__be_backoff(h, key, delay_ms);
  if (rc < 0)
    return rc;
  if (rc == THROTTLE__BE_DOWN)
    return throttle__segment_ops.backoff(h, key, len, delay_ms);
  if (throttle__segment_ops.backoff(h, key, len, delay_ms) != 0)
    throttle__clear_msg(h); /* the segment's copy failing is no error */
  return 0;
}

static int remote_remaining(throttle_t *h, const char *key, size_t len,
                            uint64_t *ms) {
  int rc = throttle__key_syntax(h, key, len);
  if (rc != 0)
    return rc;
  rc = throttle__be_remaining(h, key, ms);
  if (rc != THROTTLE__BE_DOWN)
    return rc;
  return throttle__segment_ops.remaining(h, key, len, ms);
}

static int remote_wait(throttle_t *h, const char *key, size_t len,
                       uint64_t timeout_ms) {
  int rc = throttle__key_syntax(h, key, len);
  if (rc != 0)
    return rc;
  rc = throttle__be_wait(h, key, &timeout_ms);
  if (rc != THROTTLE__BE_DOWN)
    return rc;
  return throttle__segment_ops.wait(h, key, len, timeout_ms);
}

/* A change made across hosts (brc: the backend's 0 or THROTTLE_ENOKEY)
 * and on this host's segment too (rc): done when either knew the key. */
static int either(throttle_t *h, int brc, int rc) {
  if (brc == 0 || rc == 0) {
    throttle__clear_msg(h);
    return 0;
  }
  return brc;
}

static int remote_clear(throttle_t *h, const char *key, size_t len) {
  /* Cleared across hosts, and this host's own copy too: it is kept to
   * heal a backend that lost its state, so left alone it would publish
   * the cleared back-off again at this host's next call.  A key only
   * this host's segment knows (told while the backend was away) is
   * cleared there. */
  int brc = throttle__be_clear(h, key);
  if (brc == 0 || brc == THROTTLE_ENOKEY)
    return either(h, brc, throttle__segment_clear(h, key, len));
  if (brc != THROTTLE__BE_DOWN)
    return brc;
  return throttle__segment_ops.clear(h, key, len);
}

static int remote_reset(throttle_t *h) {
  /* this host's copies go too (see remote_clear) */
  int brc = throttle__be_clear(h, NULL);
  if (brc != 0 && brc != THROTTLE__BE_DOWN)
    return brc;
  return throttle__segment_ops.reset(h);
}

static int remote_info(throttle_t *h, const char *key, size_t len,
                       throttle_info_t **out) {
  int rc = throttle__be_info(h, key, out);
  if (rc != THROTTLE__BE_DOWN)
    return rc;
  return throttle__segment_ops.info(h, key, len, out);
}

static int remote_foreach(throttle_t *h,
                          int (*fn)(const throttle_info_t *, void *),
                          void *arg) {
  int rc = throttle__be_foreach(h, fn, arg);
  if (rc != THROTTLE__BE_DOWN)
    return rc;
  return throttle__segment_ops.foreach(h, fn, arg);
}

static int remote_enter(throttle_t *h, const char *key, throttle_ticket_t *t,
                        uint64_t timeout_ms, int nowait,
                        throttle_ticket_t **out, uint64_t *wait_ms) {
  int rc = throttle__be_enter(h, key, t->cls, &timeout_ms, nowait, &t->be,
                              &t->probe, wait_ms);
  if (rc == 0) {
    throttle__segment_hold_backend(h, t); /* for an outage while held */
    *out = t;
    return 0;
  }
  if (rc != THROTTLE__BE_DOWN) {
    throttle__free(t);
    return rc;
  }
  t->be = NULL; /* the segment admits this one */
  return throttle__segment_ops.enter(h, key, t, timeout_ms, nowait, out,
                                     wait_ms);
}

/* The report of a backend's admission: the backend frees it (also when it
 * is down: then its liveness lapses), the segment records the back-off.
 * An admission the segment made (the backend was down at its enter) is
 * the segment's to report. */
static int remote_leave(throttle_t *h, throttle_ticket_t *t,
                        throttle_outcome_t outcome, uint64_t retry_after_ms,
                        int bad_outcome) {
  if (t->be == NULL)
    return throttle__segment_ops.leave(h, t, outcome, retry_after_ms,
                                       bad_outcome);
  uint32_t plen = throttle__publish_len(h, t->key, t->len, outcome);
  int rc = throttle__be_leave(h, t->be, outcome, retry_after_ms, plen);
  throttle__segment_release_backend(h, t);
  if (throttle__outcome_publishes(outcome))
    throttle__segment_mirror_publish(
        h, t, plen, retry_after_ms ? retry_after_ms : THROTTLE__LOCK_DELAY_MS);
  throttle__free(t);
  if (rc == THROTTLE__BE_DOWN)
    rc = 0;
  if (rc == 0 && bad_outcome)
    rc = throttle__fail(h, THROTTLE_EINVAL,
                        "unknown outcome; the slot was given back as "
                        "abandoned");
  return rc;
}

static int remote_requeue(throttle_t *h, throttle_ticket_t *t,
                          throttle_outcome_t outcome, uint64_t retry_after_ms,
                          int bad_outcome, uint64_t timeout_ms,
                          throttle_ticket_t **ticket) {
  if (t->be == NULL)
    return throttle__segment_ops.requeue(h, t, outcome, retry_after_ms,
                                         bad_outcome, timeout_ms, ticket);
  /* On a backend the report frees the place; the caller queues again
   * (at the back: the backend keeps no place across a report). */
  char key[THROTTLE__KEY_MAX + 1];
  throttle_class_t cls = t->cls;
  memcpy(key, t->key, t->len);
  key[t->len] = 0;
  size_t len = t->len;
  int rc = remote_leave(h, t, outcome, retry_after_ms, bad_outcome);
  if (rc != 0)
    return rc;
  /* as throttle_enter() would: the key and the class passed its checks */
  throttle_ticket_t *nt = throttle__ticket_new(h, key, len, cls);
  if (nt == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  return remote_enter(h, key, nt, timeout_ms, 0, ticket, NULL);
}

static int remote_set(throttle_t *h, const char *key, size_t len, int what,
                      uint64_t a, uint64_t b) {
  int brc = throttle__be_set(h, key, what, a, b);
  if (what == THROTTLE__BE_CANCEL && brc != THROTTLE__BE_DOWN) {
    /* Across hosts, and this host's own waiters in the segment too (queued
     * there while the backend was away): a cancel ends every current
     * waiter wherever it waits. */
    if (brc == 0 || brc == THROTTLE_ENOKEY)
      return either(h, brc,
                    throttle__segment_ops.set(h, key, len, what, a, b));
    return brc;
  }
  if (brc != THROTTLE__BE_DOWN)
    return brc;
  return throttle__segment_ops.set(h, key, len, what, a, b);
}

/* The segment's maximum delay and the refusals are this host's alone. */
static int remote_set_max_delay(throttle_t *h, uint64_t ms) {
  return throttle__segment_ops.set_max_delay(h, ms);
}

static int remote_note_refusal(throttle_t *h, const char *key, size_t len,
                               const struct throttle__refusal *n) {
  return throttle__segment_ops.note_refusal(h, key, len, n);
}

static int remote_stats(throttle_t *h, uint32_t *capacity, uint32_t *used,
                        uint64_t *evictions, uint64_t *repairs) {
  return throttle__segment_ops.stats(h, capacity, used, evictions, repairs);
}

const struct throttle__ops throttle__remote_ops = {
    .name = "remote",
    .backoff = remote_backoff,
    .remaining = remote_remaining,
    .wait = remote_wait,
    .clear = remote_clear,
    .reset = remote_reset,
    .info = remote_info,
    .foreach = remote_foreach,
    .enter = remote_enter,
    .leave = remote_leave,
    .requeue = remote_requeue,
    .set = remote_set,
    .set_max_delay = remote_set_max_delay,
    .note_refusal = remote_note_refusal,
    .stats = remote_stats,
};
