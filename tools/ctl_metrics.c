/* SPDX-License-Identifier: MIT */
/*
 * ctl_metrics.c — `metrics`: every key and the segment in the Prometheus
 * text exposition format (version 0.0.4), for a scraper or for
 * node_exporter's textfile collector (-o FILE, written atomically).
 *
 * One family per figure, each with # HELP and # TYPE, every sample
 * labelled with the segment and the key, and with the key's own scope
 * (its prefix at the last '/', as --json's "scope"; no label for a key
 * with none, which keeps the series of such keys as they were), so a
 * dashboard sums a workspace's tables by one label.  Per
 * scope (every prefix at a '/' of a listed key, whether or not it has a
 * record): the keys beneath it, their admissions held and their waiters;
 * a pool's own occupancy is its row as a key (throttle_key_in_flight and
 * throttle_key_cap with key="SCOPE").  Counters end in _total (they
 * only grow for a key's lifetime; an evicted and re-created key starts
 * again at 0, which Prometheus reads as a counter reset).  Label values
 * are escaped as the format says (backslash, double quote, newline); a key
 * byte that is a control character or not part of valid UTF-8 is written
 * as the text \xHH, as `ls` shows it, since the format requires UTF-8 and
 * --json is where the exact bytes are.  Rejected: a per-key metric name
 * (unbounded names), and one family with a "field" label (mixes units and
 * types).
 */
#include "ctl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A label value, escaped. */
static void label_value(FILE *f, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '\\')
      fputs("\\\\", f);
    else if (*p == '"')
      fputs("\\\"", f);
    else if (*p == '\n')
      fputs("\\n", f);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(f, "\\\\x%02x", *p);
    else
      fputc(*p, f);
  }
}

/* A key as a label value can carry it: valid UTF-8, other bytes as the
 * text \xHH (as `ls` shows them). */
static void utf8_text(const char *key, char *safe, size_t size) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)key;
       *p && n + 5 < size; p++) {
    /* A byte >= 0x80 is kept only as part of a valid sequence. */
    if (*p >= 0x80) {
      size_t len = 1;
      while (p[len] != 0 && (p[len] & 0xc0) == 0x80 && len < 4)
        len++;
      char seq[5] = {0};
      memcpy(seq, p, len);
      if (ctl_utf8_valid(seq) && n + len < size) {
        memcpy(safe + n, seq, len);
        n += len;
        p += len - 1;
        continue;
      }
      n += (size_t)snprintf(safe + n, size - n, "\\x%02x", *p);
      continue;
    }
    safe[n++] = (char)*p;
  }
  safe[n] = 0;
}

/* ,name="value" with value made label-safe. */
static void label(FILE *f, const char *name, const char *v) {
  char safe[KEY_TEXT_MAX];
  utf8_text(v, safe, sizeof safe);
  fprintf(f, ",%s=\"", name);
  label_value(f, safe);
  fputc('"', f);
}

/* The key's own scope (its prefix at the last '/', as --json's "scope"),
 * or "" for a key with none. */
static void scope_of(const char *key, char *scope, size_t size) {
  const char *slash = strrchr(key, '/');
  size_t n = slash != NULL && slash > key ? (size_t)(slash - key) : 0;
  snprintf(scope, size, "%.*s", (int)n, key);
}

/* Labels for a key's samples: segment, key, scope (and extra). */
/* pool: the key is a scope with keys beneath it in the snapshot, so its
 * admissions are also those of its keys (pool="true": summing the rows
 * without it counts each request once). */
static void key_labels(FILE *f, const char *segment, const char *key,
                       bool pool, const char *extra, const char *code) {
  char scope[KEY_MAX + 1];
  scope_of(key, scope, sizeof scope);
  fputs("{segment=\"", f);
  label_value(f, segment);
  fputc('"', f);
  label(f, "key", key);
  if (scope[0] != 0) /* none: no label (Prometheus reads "" as absent) */
    label(f, "scope", scope);
  if (pool)
    fputs(",pool=\"true\"", f);
  if (extra != NULL)
    fprintf(f, ",%s", extra);
  if (code != NULL && code[0] != 0)
    label(f, "code", code);
  fputc('}', f);
}

/* Keys are in key order: the keys beneath k (k + "/...") follow it. */
static bool is_pool(const struct ctl_keys *k, size_t j) {
  size_t n = strlen(k->v[j].key);
  for (size_t i = j + 1; i < k->n; i++) {
    int c = strncmp(k->v[i].key, k->v[j].key, n);
    if (c != 0)
      return false;
    if (k->v[i].key[n] == '/')
      return true;
    /* "ab" sorts between "a" and "a/x" only when '/' > 'b': keep going */
  }
  return false;
}


enum mtype { GAUGE, COUNTER };

struct family {
  const char *name;
  const char *help;
  double scale; /* value = field * scale */
  enum mtype type;
  int field; /* THROTTLE_FIELD_*, or -1 for the special ones */
};

/* Per key.  Waiting callers are one family with a class label. */
static const struct family key_families[] = {
    {"throttle_key_seconds_left", "Seconds until the key opens (0: open).",
     0.001, GAUGE, THROTTLE_FIELD_REMAINING_MS},
    {"throttle_key_in_flight", "Admissions held now.", 1, GAUGE,
     THROTTLE_FIELD_IN_FLIGHT},
    {"throttle_key_cap", "Concurrent admissions allowed now.", 1, GAUGE,
     THROTTLE_FIELD_CAP},
    {"throttle_key_cap_learned",
     "1 when the cap is learned from lock answers, 0 when fixed.", 1, GAUGE,
     THROTTLE_FIELD_CAP_AUTO},
    {"throttle_key_waiting", "Callers waiting, by class.", 1, GAUGE, -1},
    {"throttle_key_paused", "1 while new admissions are held.", 1, GAUGE,
     THROTTLE_FIELD_PAUSED},
    {"throttle_key_lock_episode", "1 from a back-off until a probe succeeds.",
     1, GAUGE, THROTTLE_FIELD_LOCK_EPISODE},
    {"throttle_key_admissions_total", "Admissions granted.", 1, COUNTER,
     THROTTLE_FIELD_ADMITTED},
    {"throttle_key_refused_total",
     "Requests the server refused as locked (LOCKED outcomes).", 1, COUNTER,
     THROTTLE_FIELD_LOCKED},
    {"throttle_key_permanent_total",
     "Permanent failures reported (e.g. CONFLICT).", 1, COUNTER,
     THROTTLE_FIELD_PERMANENT},
    {"throttle_key_reclaimed_total",
     "Slots reclaimed from dead or hung holders.", 1, COUNTER,
     THROTTLE_FIELD_RECLAIMS},
    {"throttle_key_probes_total", "Probes of lock episodes admitted.", 1,
     COUNTER, THROTTLE_FIELD_PROBES},
    {"throttle_key_canceled_total", "Waiters ended by cancel.", 1, COUNTER,
     THROTTLE_FIELD_CANCELED},
    {"throttle_key_backoffs_total", "Back-offs published.", 1, COUNTER,
     THROTTLE_FIELD_PUBLISHES},
    {"throttle_key_waits_total",
     "Calls that had to sleep before the key opened.", 1, COUNTER,
     THROTTLE_FIELD_WAITS},
    {"throttle_key_waited_seconds_total", "Time slept by those calls.", 0.001,
     COUNTER, THROTTLE_FIELD_WAITED_MS},
};
#define NKEYFAM (sizeof key_families / sizeof key_families[0])

static void head(FILE *f, const char *name, enum mtype t, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name,
          t == COUNTER ? "counter" : "gauge");
}

/* Integers print exactly; scaled ones with the digits they have. */
static void value(FILE *f, int64_t v, double scale) {
  if (scale == 1)
    fprintf(f, " %lld\n", (long long)v);
  else
    fprintf(f, " %.3f\n", (double)v * scale);
}

/* Which build wrote the file, and whether it read the segment: a
 * textfile that only says throttle_up 0 replaces figures that would
 * otherwise look current. */
static void write_status(FILE *f, const char *seg, int up) {
  head(f, "throttle_build_info", GAUGE,
       "Always 1; the versions of throttlectl and libthrottle as labels.");
  fprintf(f, "throttle_build_info{throttlectl=\"%s\",libthrottle=\"%s\"} 1\n",
          THROTTLE_VERSION_STRING, throttle_version_string());
  head(f, "throttle_up", GAUGE,
       "1 when the segment was read for this exposition, 0 when it could "
       "not be (the figures are then absent, not stale).");
  fputs("throttle_up{segment=\"", f);
  label_value(f, seg);
  fprintf(f, "\"} %d\n", up);
}

/* ---- per scope: what the keys beneath it do ----------------------------- */

struct scope_sum {
  char scope[KEY_MAX + 1];
  int64_t keys, flight, live, backfill; /* summed over the keys beneath */
};

static int by_scope(const void *a, const void *b) {
  return strcmp(((const struct scope_sum *)a)->scope,
                ((const struct scope_sum *)b)->scope);
}

/* One row per scope of any key (every prefix at a '/'), merged: *n rows.
 * NULL with *n = 0 when there is none, or no memory (the scope families
 * are then left out; the keys' are already written). */
static struct scope_sum *scope_sums(const struct ctl_keys *k, size_t *n) {
  size_t total = 0;
  *n = 0;
  for (size_t j = 0; j < k->n; j++)
    for (const char *p = k->v[j].key + 1; (p = strchr(p, '/')) != NULL; p++)
      total++;
  struct scope_sum *v = total ? calloc(total, sizeof *v) : NULL;
  if (v == NULL)
    return NULL;
  for (size_t j = 0; j < k->n; j++) {
    const struct ctl_key *m = &k->v[j];
    for (const char *p = m->key + 1; (p = strchr(p, '/')) != NULL; p++) {
      struct scope_sum *e = &v[(*n)++];
      snprintf(e->scope, sizeof e->scope, "%.*s", (int)(p - m->key), m->key);
      e->keys = 1;
      e->flight = m->f[THROTTLE_FIELD_IN_FLIGHT];
      e->live = m->f[THROTTLE_FIELD_WAITING_LIVE];
      e->backfill = m->f[THROTTLE_FIELD_WAITING_BACKFILL];
    }
  }
  qsort(v, *n, sizeof *v, by_scope);
  size_t out = 0;
  for (size_t i = 0; i < *n; i++) {
    if (out > 0 && strcmp(v[out - 1].scope, v[i].scope) == 0) {
      v[out - 1].keys += v[i].keys;
      v[out - 1].flight += v[i].flight;
      v[out - 1].live += v[i].live;
      v[out - 1].backfill += v[i].backfill;
    } else {
      v[out++] = v[i];
    }
  }
  *n = out;
  return v;
}

static void scope_sample(FILE *f, const char *name, const char *seg,
                         const char *scope, const char *extra, int64_t v) {
  fprintf(f, "%s{segment=\"", name);
  label_value(f, seg);
  fputc('"', f);
  label(f, "scope", scope);
  if (extra != NULL)
    fprintf(f, ",%s", extra);
  fprintf(f, "} %lld\n", (long long)v);
}

/* A pool's own places are its row as a key (throttle_key_in_flight and
 * throttle_key_cap with key="SCOPE"); these are the sums beneath it. */
static void write_scopes(FILE *f, const char *seg, const struct ctl_keys *k) {
  size_t n;
  struct scope_sum *v = scope_sums(k, &n);
  head(f, "throttle_scope_keys", GAUGE,
       "Keys beneath the scope, at every depth.");
  for (size_t i = 0; i < n; i++)
    scope_sample(f, "throttle_scope_keys", seg, v[i].scope, NULL, v[i].keys);
  head(f, "throttle_scope_in_flight", GAUGE,
       "Admissions held now by the keys beneath the scope.");
  for (size_t i = 0; i < n; i++)
    scope_sample(f, "throttle_scope_in_flight", seg, v[i].scope, NULL,
                 v[i].flight);
  head(f, "throttle_scope_waiting", GAUGE,
       "Callers waiting for the keys beneath the scope, by class.");
  for (size_t i = 0; i < n; i++) {
    scope_sample(f, "throttle_scope_waiting", seg, v[i].scope,
                 "class=\"live\"", v[i].live);
    scope_sample(f, "throttle_scope_waiting", seg, v[i].scope,
                 "class=\"backfill\"", v[i].backfill);
  }
  free(v);
}

/* When the server last refused each key that has a note, with what it
 * said as labels (status and error.code: few values per key, so the
 * series stay few; the message is for show).  A new refusal with other
 * words starts another series: time() - max by (key) (...) is the age. */
static void write_refusals(FILE *f, const char *seg,
                           const struct ctl_keys *k) {
  static const char name[] = "throttle_key_last_refusal_timestamp_seconds";
  head(f, name, GAUGE,
       "When the server last refused the key (Unix time, by the noting "
       "host's clock); labels status and code say what it answered.");
  for (size_t j = 0; j < k->n; j++) {
    const struct ctl_refusal *r = &k->v[j].refusal;
    if (r->status == 0)
      continue;
    char extra[32];
    snprintf(extra, sizeof extra, "status=\"%d\"", r->status);
    fputs(name, f);
    key_labels(f, seg, k->v[j].key, is_pool(k, j), extra, r->code);
    fprintf(f, " %lld.%03lld\n", (long long)(r->at_ms / 1000),
            (long long)(r->at_ms % 1000));
  }
}

/* A pool's occupancy by its scope (the `scope` label names the pool
 * itself here), beside the throttle_scope_* sums of the keys beneath it:
 * its row as a key (pool="true") is kept, but summing throttle_key_* rows
 * with it counts a request twice, these never do. */
static const struct family pool_families[] = {
    {"throttle_pool_in_flight",
     "Admissions the pool (a scope with keys beneath it) holds now.", 1,
     GAUGE, THROTTLE_FIELD_IN_FLIGHT},
    {"throttle_pool_cap",
     "Concurrent admissions the pool allows beneath it now.", 1, GAUGE,
     THROTTLE_FIELD_CAP},
};

static void write_pools(FILE *f, const char *seg, const struct ctl_keys *k) {
  for (size_t i = 0; i < sizeof pool_families / sizeof pool_families[0];
       i++) {
    const struct family *fam = &pool_families[i];
    head(f, fam->name, fam->type, fam->help);
    for (size_t j = 0; j < k->n; j++)
      if (is_pool(k, j))
        scope_sample(f, fam->name, seg, k->v[j].key, NULL,
                     k->v[j].f[fam->field]);
  }
}

static void write_metrics(FILE *f, const char *seg, const struct ctl_keys *k) {
  write_status(f, seg, 1);
  if (strcmp(k->backend, "shm") != 0) {
    head(f, "throttle_backend_up", GAUGE,
         "1 when the backend answered, 0 while this host's segment serves "
         "in its place.");
    fputs("throttle_backend_up{segment=\"", f);
    label_value(f, seg);
    fputs("\",backend=\"", f);
    label_value(f, k->backend);
    fprintf(f, "\"} %d\n", k->backend_up);
    head(f, "throttle_backend_down_seconds", GAUGE,
         "Seconds since the backend was found unreachable (0 while up).");
    fputs("throttle_backend_down_seconds{segment=\"", f);
    label_value(f, seg);
    fputs("\",backend=\"", f);
    label_value(f, k->backend);
    fprintf(f, "\"} %.3f\n", (double)k->backend_down_ms / 1000.0);
  }
  head(f, "throttle_segment_keys", GAUGE, "Keys in the segment's table.");
  fputs("throttle_segment_keys{segment=\"", f);
  label_value(f, seg);
  fprintf(f, "\"} %u\n", k->used);
  head(f, "throttle_segment_capacity", GAUGE, "Keys the segment can hold.");
  fputs("throttle_segment_capacity{segment=\"", f);
  label_value(f, seg);
  fprintf(f, "\"} %u\n", k->capacity);
  head(f, "throttle_segment_evictions_total", COUNTER,
       "Idle keys evicted to make room.");
  fputs("throttle_segment_evictions_total{segment=\"", f);
  label_value(f, seg);
  fprintf(f, "\"} %llu\n", (unsigned long long)k->evictions);
  head(f, "throttle_segment_repairs_total", COUNTER,
       "Repairs after a process died holding the segment mutex.");
  fputs("throttle_segment_repairs_total{segment=\"", f);
  label_value(f, seg);
  fprintf(f, "\"} %llu\n", (unsigned long long)k->repairs);
  for (size_t i = 0; i < NKEYFAM; i++) {
    const struct family *fam = &key_families[i];
    head(f, fam->name, fam->type, fam->help);
    for (size_t j = 0; j < k->n; j++) {
      const struct ctl_key *m = &k->v[j];
      bool pool = is_pool(k, j);
      if (fam->field < 0) {
        fputs(fam->name, f);
        key_labels(f, seg, m->key, pool, "class=\"live\"", NULL);
        value(f, m->f[THROTTLE_FIELD_WAITING_LIVE], 1);
        fputs(fam->name, f);
        key_labels(f, seg, m->key, pool, "class=\"backfill\"", NULL);
        value(f, m->f[THROTTLE_FIELD_WAITING_BACKFILL], 1);
        continue;
      }
      fputs(fam->name, f);
      key_labels(f, seg, m->key, pool, NULL, NULL);
      value(f, m->f[fam->field], fam->scale);
    }
  }
  write_refusals(f, seg, k);
  write_pools(f, seg, k);
  write_scopes(f, seg, k);
}

/* FILE.tmp.XXXXXX beside FILE, then rename: a collector never reads half
 * a file. */
static int write_atomically(const char *path, const char *seg,
                            const struct ctl_keys *k) /* NULL: not up */ {
  size_t n = strlen(path) + sizeof ".tmp.XXXXXX";
  char *tmp = malloc(n);
  if (tmp == NULL) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  snprintf(tmp, n, "%s.tmp.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    ctl_say("%s: %s", tmp, strerror(errno));
    free(tmp);
    return XIT_FAIL;
  }
  /* mkstemp makes it 0600; a collector may run as another user. */
  (void)fchmod(fd, 0644);
  FILE *f = fdopen(fd, "w");
  if (f == NULL) {
    ctl_say("%s: %s", tmp, strerror(errno));
    close(fd);
    unlink(tmp);
    free(tmp);
    return XIT_FAIL;
  }
  if (k != NULL)
    write_metrics(f, seg, k);
  else
    write_status(f, seg, 0);
  int bad = fflush(f) != 0 || ferror(f) || fsync(fd) != 0;
  int e = errno;
  bad |= fclose(f) != 0;
  if (!bad && rename(tmp, path) != 0) {
    e = errno;
    bad = 1;
  }
  if (bad) {
    ctl_say("%s: %s", path, strerror(e));
    unlink(tmp);
  }
  free(tmp);
  return bad ? XIT_FAIL : XIT_OK;
}

/* metrics opens the segment itself (OPEN_NONE in the table): with -o FILE,
 * a segment that cannot be opened or read still rewrites FILE, with
 * throttle_up 0 and no figures, so that a collector does not go on
 * serving the last figures as current. */
int ctl_cmd_metrics(struct ctx *c) {
  const char *out = c->opt[OPT_OUTPUT];
  bool file = out != NULL && strcmp(out, "-") != 0;
  struct ctl_keys k = {0};
  int rc = ctl_open_read(c);
  if (rc == 0)
    rc = ctl_keys_take(c, &k);
  if (rc != 0) {
    ctl_keys_free(&k);
    if (file) {
      char name[256];
      snprintf(name, sizeof name, "%s",
               c->h != NULL ? throttle_segment_name(c->h)
               : c->segment != NULL ? c->segment
               : getenv("THROTTLE_SEGMENT") != NULL ? getenv("THROTTLE_SEGMENT")
                                                    : "default");
      if (write_atomically(out, name, NULL) == XIT_OK)
        ctl_say("%s: written with throttle_up 0", out);
    }
    return rc;
  }
  if (file)
    rc = write_atomically(out, c->segname, &k);
  else
    write_metrics(stdout, c->segname, &k);
  ctl_keys_free(&k);
  return rc;
}
