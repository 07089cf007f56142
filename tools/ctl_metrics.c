/* SPDX-License-Identifier: MIT */
/*
 * ctl_metrics.c — `metrics`: every key and the segment in the Prometheus
 * text exposition format (version 0.0.4), for a scraper or for
 * node_exporter's textfile collector (-o FILE, written atomically).
 *
 * One family per figure, each with # HELP and # TYPE, every sample
 * labelled with the segment and the key.  Counters end in _total (they
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

/* Labels for a key's samples; the key made valid UTF-8 first. */
static void key_labels(FILE *f, const char *segment, const char *key,
                       const char *extra) {
  char safe[KEY_TEXT_MAX];
  size_t n = 0;
  char one[2] = {0, 0};
  for (const unsigned char *p = (const unsigned char *)key;
       *p && n + 5 < sizeof safe; p++) {
    one[0] = (char)*p;
    /* A byte >= 0x80 is kept only as part of a valid sequence. */
    if (*p >= 0x80) {
      size_t len = 1;
      while (p[len] != 0 && (p[len] & 0xc0) == 0x80 && len < 4)
        len++;
      char seq[5] = {0};
      memcpy(seq, p, len);
      if (ctl_utf8_valid(seq) && n + len < sizeof safe) {
        memcpy(safe + n, seq, len);
        n += len;
        p += len - 1;
        continue;
      }
      n += (size_t)snprintf(safe + n, sizeof safe - n, "\\x%02x", *p);
      continue;
    }
    safe[n++] = one[0];
  }
  safe[n] = 0;
  fputs("{segment=\"", f);
  label_value(f, segment);
  fputs("\",key=\"", f);
  label_value(f, safe);
  fputc('"', f);
  if (extra != NULL)
    fprintf(f, ",%s", extra);
  fputc('}', f);
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

static void write_metrics(FILE *f, const char *seg, const struct ctl_keys *k) {
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
      if (fam->field < 0) {
        fputs(fam->name, f);
        key_labels(f, seg, m->key, "class=\"live\"");
        value(f, m->f[THROTTLE_FIELD_WAITING_LIVE], 1);
        fputs(fam->name, f);
        key_labels(f, seg, m->key, "class=\"backfill\"");
        value(f, m->f[THROTTLE_FIELD_WAITING_BACKFILL], 1);
        continue;
      }
      fputs(fam->name, f);
      key_labels(f, seg, m->key, NULL);
      value(f, m->f[fam->field], fam->scale);
    }
  }
}

/* FILE.tmp.XXXXXX beside FILE, then rename: a collector never reads half
 * a file. */
static int write_atomically(const char *path, const char *seg,
                            const struct ctl_keys *k) {
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
  write_metrics(f, seg, k);
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

int ctl_cmd_metrics(struct ctx *c) {
  struct ctl_keys k = {0};
  int rc = ctl_keys_take(c, &k);
  if (rc != 0) {
    ctl_keys_free(&k);
    return rc;
  }
  const char *out = c->opt[OPT_OUTPUT];
  if (out != NULL && strcmp(out, "-") != 0)
    rc = write_atomically(out, c->segname, &k);
  else
    write_metrics(stdout, c->segname, &k);
  ctl_keys_free(&k);
  return rc;
}
