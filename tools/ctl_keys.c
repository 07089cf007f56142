/* SPDX-License-Identifier: MIT */
/*
 * ctl_keys.c — `ls` and `show`: snapshots of keys (every field the library
 * reports, and the holders of each key's admissions) printed as a table,
 * as "name: value" lines, or as JSON.
 *
 * The JSON forms carry every field under its stable name, so a field added
 * to the library appears without a change here; the table picks the
 * columns an operator reads at a glance and leaves the rest to `show`.
 */
#include "ctl.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

/* ---- snapshots -------------------------------------------------------- */

struct holder {
  int64_t pid, age_ms;
  throttle_class_t cls;
  int probe;
  char host[64]; /* "" for this host's (the segment) */
  char comm[CTL_COMM_MAX]; /* this host's: the process name, or "" */
};

struct keyrow {
  char key[KEY_MAX + 1];
  int64_t field[THROTTLE_FIELD_COUNT_];
  size_t hfirst, hcount; /* its holders in rows->hv */
  size_t wcount;         /* then its waiters, in arrival order */
  struct ctl_refusal refusal;
};

struct rows {
  struct keyrow *v;
  size_t n, cap;
  struct holder *hv;
  size_t hn, hcap;
  char **patterns; /* ls PATTERN...: the keys kept (NULL: every key) */
  int npatterns;
};

/* ls PATTERN...: a key matching any of the shell patterns (fnmatch(3),
 * no flags: '*' matches '/' too, so "hotdata:*" is a whole tree). */
static bool key_matches(char *const *patterns, int n, const char *key) {
  if (n == 0)
    return true;
  for (int i = 0; i < n; i++)
    if (fnmatch(patterns[i], key, 0) == 0)
      return true;
  return false;
}

/* Keys are paths: a key's scopes are its prefixes at '/'.  The tree of
 * the listed keys: each row's nearest listed scope, its depth among
 * listed scopes, and what the keys beneath a scope hold and wait for. */
struct tree {
  long *parent; /* row index, -1 = none listed */
  int *depth;
  int64_t *keys, *flight, *wait; /* sums over the keys beneath */
};

static long find_row(const struct rows *rows, const char *key) {
  size_t lo = 0, hi = rows->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(rows->v[mid].key, key);
    if (c == 0)
      return (long)mid;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

static void tree_free(struct tree *t) {
  free(t->parent);
  free(t->depth);
  free(t->keys);
  free(t->flight);
  free(t->wait);
}

/* Rows are in key order (strcmp), so a scope's row is found by search. */
static int tree_build(const struct rows *rows, struct tree *t) {
  size_t n = rows->n ? rows->n : 1;
  *t = (struct tree){calloc(n, sizeof(long)), calloc(n, sizeof(int)),
                     calloc(n, sizeof(int64_t)), calloc(n, sizeof(int64_t)),
                     calloc(n, sizeof(int64_t))};
  if (!t->parent || !t->depth || !t->keys || !t->flight || !t->wait) {
    tree_free(t);
    return -1;
  }
  char buf[KEY_MAX + 1];
  for (size_t i = 0; i < rows->n; i++) {
    const char *k = rows->v[i].key;
    t->parent[i] = -1;
    for (size_t p = strlen(k); p-- > 1 && t->parent[i] < 0;)
      if (k[p] == '/') {
        memcpy(buf, k, p);
        buf[p] = 0;
        t->parent[i] = find_row(rows, buf);
      }
  }
  for (size_t i = 0; i < rows->n; i++) {
    const int64_t *f = rows->v[i].field;
    for (long a = t->parent[i]; a >= 0; a = t->parent[a]) {
      t->depth[i]++;
      t->keys[a]++;
      t->flight[a] += f[THROTTLE_FIELD_IN_FLIGHT];
      t->wait[a] += f[THROTTLE_FIELD_WAITING_LIVE] +
                    f[THROTTLE_FIELD_WAITING_BACKFILL];
    }
  }
  return 0;
}

/* Room for one more of each, doubling. */
static int grow_rows(struct rows *rows) {
  if (rows->n == rows->cap) {
    size_t cap = rows->cap ? 2 * rows->cap : 64;
    struct keyrow *v = realloc(rows->v, cap * sizeof *v);
    if (v == NULL)
      return -1;
    rows->v = v;
    rows->cap = cap;
  }
  return 0;
}

static int grow_holders(struct rows *rows) {
  if (rows->hn == rows->hcap) {
    size_t cap = rows->hcap ? 2 * rows->hcap : 64;
    struct holder *v = realloc(rows->hv, cap * sizeof *v);
    if (v == NULL)
      return -1;
    rows->hv = v;
    rows->hcap = cap;
  }
  return 0;
}

/* throttle_foreach callback, and show's single copy: the snapshot is gone
 * once the callback returns.  Non-zero (out of memory) stops the walk. */
static int collect(const throttle_info_t *info, void *arg) {
  struct rows *rows = arg;
  if (!key_matches(rows->patterns, rows->npatterns, throttle_info_key(info)))
    return 0;
  if (grow_rows(rows) != 0)
    return 1;
  struct keyrow *row = &rows->v[rows->n];
  snprintf(row->key, sizeof row->key, "%s", throttle_info_key(info));
  for (int f = 0; f < THROTTLE_FIELD_COUNT_; f++)
    row->field[f] = throttle_info_get(info, (throttle_field_t)f);
  ctl_refusal_take(info, &row->refusal);
  row->hfirst = rows->hn;
  row->hcount = 0;
  for (size_t i = 0;; i++) {
    struct holder hd;
    if (throttle_info_holder(info, i, &hd.pid, &hd.age_ms, &hd.cls,
                             &hd.probe) != 0)
      break;
    const char *host = throttle_info_holder_host(info, i);
    snprintf(hd.host, sizeof hd.host, "%s", host != NULL ? host : "");
    ctl_comm(hd.host[0] == 0 ? hd.pid : 0, hd.comm, sizeof hd.comm);
    if (grow_holders(rows) != 0)
      return 1;
    rows->hv[rows->hn++] = hd;
    row->hcount++;
  }
  row->wcount = 0;
  for (size_t i = 0;; i++) {
    struct holder hd = {.probe = 0};
    if (throttle_info_waiter(info, i, &hd.pid, &hd.age_ms, &hd.cls) != 0)
      break;
    const char *host = throttle_info_waiter_host(info, i);
    snprintf(hd.host, sizeof hd.host, "%s", host != NULL ? host : "");
    ctl_comm(hd.host[0] == 0 ? hd.pid : 0, hd.comm, sizeof hd.comm);
    if (grow_holders(rows) != 0)
      return 1;
    rows->hv[rows->hn++] = hd;
    row->wcount++;
  }
  rows->n++;
  return 0;
}

static void rows_free(struct rows *rows) {
  free(rows->v);
  free(rows->hv);
}

/* The fields that are yes/no, written as JSON true/false. */
static bool field_is_flag(int f) {
  return f == THROTTLE_FIELD_CAP_AUTO || f == THROTTLE_FIELD_PROBE_OUT ||
         f == THROTTLE_FIELD_LOCK_EPISODE || f == THROTTLE_FIELD_PAUSED;
}

/* What the keys beneath a scope do (show SCOPE). */
struct beneath {
  const char *scope;
  size_t len;
  int64_t keys, flight, wait;
};

static int add_beneath(const throttle_info_t *info, void *arg) {
  struct beneath *b = arg;
  const char *k = throttle_info_key(info);
  if (strncmp(k, b->scope, b->len) == 0 && k[b->len] == '/') {
    b->keys++;
    b->flight += throttle_info_get(info, THROTTLE_FIELD_IN_FLIGHT);
    b->wait += throttle_info_get(info, THROTTLE_FIELD_WAITING_LIVE) +
               throttle_info_get(info, THROTTLE_FIELD_WAITING_BACKFILL);
  }
  return 0;
}

/* The end of a holder's or waiter's object: its host (another host's) or
 * its process name (this host's, when readable). */
static void party_json_tail(FILE *f, const struct holder *hd) {
  if (hd->host[0] != 0) {
    fputs(",\"host\":", f);
    ctl_json_string(f, hd->host);
  } else if (hd->comm[0] != 0) {
    fputs(",\"comm\":", f);
    ctl_json_string(f, hd->comm);
  }
  fputc('}', f);
}

/* {"key":"...","remaining_ms":N,...,"holders":[...]}: every field, by its
 * stable name, then the holders.  A key that is not UTF-8 also comes as
 * "key_base64" (ctl_json_key). */
static void key_json(FILE *f, const struct rows *rows,
                     const struct keyrow *row, bool schema,
                     const struct beneath *t, const throttle_t *h) {
  fputc('{', f);
  if (schema)
    fprintf(f, "\"schema\":%d,", CTL_JSON_SCHEMA);
  ctl_json_key(f, row->key);
  if (h != NULL) /* show: the backend that answered, and its health */
    ctl_backend_json(f, h);
  const char *slash = strrchr(row->key, '/');
  fputs(",\"scope\":", f); /* the key's own scope: its prefix at the last / */
  if (slash != NULL && slash > row->key) {
    char scope[KEY_MAX + 1];
    snprintf(scope, sizeof scope, "%.*s", (int)(slash - row->key), row->key);
    ctl_json_string(f, scope);
  } else {
    fputs("null", f);
  }
  for (int i = 0; i < THROTTLE_FIELD_COUNT_; i++) {
    const char *name = throttle_field_name((throttle_field_t)i);
    if (name == NULL)
      continue;
    if (field_is_flag(i))
      fprintf(f, ",\"%s\":%s", name, row->field[i] ? "true" : "false");
    else
      fprintf(f, ",\"%s\":%lld", name, (long long)row->field[i]);
  }
  /* After the key's own fields: a reader that looks for the first
   * "in_flight" finds the key's, not the sum beneath. */
  if (t != NULL)
    fprintf(f,
            ",\"beneath\":{\"keys\":%lld,\"in_flight\":%lld,"
            "\"waiting\":%lld}",
            (long long)t->keys, (long long)t->flight, (long long)t->wait);
  ctl_refusal_json(f, &row->refusal);
  fputs(",\"holders\":[", f);
  for (size_t i = 0; i < row->hcount; i++) {
    const struct holder *hd = &rows->hv[row->hfirst + i];
    fprintf(f,
            "%s{\"pid\":%lld,\"class\":\"%s\",\"age_ms\":%lld,"
            "\"probe\":%s",
            i > 0 ? "," : "", (long long)hd->pid, ctl_class_name(hd->cls),
            (long long)hd->age_ms, hd->probe ? "true" : "false");
    party_json_tail(f, hd);
  }
  fputs("],\"waiters\":[", f);
  for (size_t i = 0; i < row->wcount; i++) {
    const struct holder *hd = &rows->hv[row->hfirst + row->hcount + i];
    fprintf(f, "%s{\"pid\":%lld,\"class\":\"%s\",\"age_ms\":%lld",
            i > 0 ? "," : "", (long long)hd->pid, ctl_class_name(hd->cls),
            (long long)hd->age_ms);
    party_json_tail(f, hd);
  }
  fputs("]}", f);
}

/* ---- snapshots for metrics and watch ---------------------------------- */

/* "4242 loader,4250 curl,+3": the holders in a cell (ctl_key.holders). */
static void holders_text(const throttle_info_t *info, char *buf, size_t len) {
  size_t n = 0, i = 0, left = 0;
  int64_t pid, age;
  throttle_class_t cls;
  int probe;
  buf[0] = 0;
  for (; throttle_info_holder(info, i, &pid, &age, &cls, &probe) == 0; i++) {
    char one[CTL_COMM_MAX + 96], comm[CTL_COMM_MAX], host[64];
    const char *h = throttle_info_holder_host(info, i);
    if (h != NULL && *h != 0)
      snprintf(one, sizeof one, "%lld@%s", (long long)pid,
               ctl_key_text(h, host, sizeof host));
    else if (*ctl_comm(pid, comm, sizeof comm) != 0)
      snprintf(one, sizeof one, "%lld %s", (long long)pid, comm);
    else
      snprintf(one, sizeof one, "%lld", (long long)pid);
    size_t k = strlen(one) + (n > 0);
    if (left > 0 || n + k + 8 >= len) { /* room for ",+NNNNN" */
      left++;
      continue;
    }
    n += (size_t)snprintf(buf + n, len - n, "%s%s", n > 0 ? "," : "", one);
  }
  if (left > 0)
    snprintf(buf + n, len - n, "%s+%zu", n > 0 ? "," : "", left);
  else if (n == 0)
    snprintf(buf, len, "-");
}

static int collect_fields(const throttle_info_t *info, void *arg) {
  struct ctl_keys *k = arg;
  const char *key = throttle_info_key(info);
  if (k->want != NULL && !k->want(key, k->want_arg))
    return 0;
  if (k->n == k->cap) {
    size_t cap = k->cap ? 2 * k->cap : 64;
    struct ctl_key *v = realloc(k->v, cap * sizeof *v);
    if (v == NULL)
      return 1;
    k->v = v;
    k->cap = cap;
  }
  struct ctl_key *m = &k->v[k->n++];
  snprintf(m->key, sizeof m->key, "%s", key);
  for (int i = 0; i < THROTTLE_FIELD_COUNT_; i++)
    m->f[i] = throttle_info_get(info, (throttle_field_t)i);
  holders_text(info, m->holders, sizeof m->holders);
  ctl_refusal_take(info, &m->refusal);
  return 0;
}

int ctl_keys_take(struct ctx *c, struct ctl_keys *k) {
  k->n = 0;
  int rc = throttle_stats(c->h, &k->capacity, &k->used, &k->evictions,
                          &k->repairs);
  if (rc == 0)
    rc = throttle_foreach(c->h, collect_fields, k);
  snprintf(k->backend, sizeof k->backend, "%s", throttle_backend(c->h));
  (void)throttle_backend_status(c->h, &k->backend_up, &k->backend_down_ms,
                                NULL);
  if (rc > 0) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  return rc < 0 ? ctl_lib_fail(c, rc) : 0;
}

void ctl_keys_free(struct ctl_keys *k) {
  free(k->v);
  k->v = NULL;
  k->n = k->cap = 0;
}

/* ---- ls --------------------------------------------------------------- */

/* KEY and LEFT first (what scripts grep for), then admission, counters,
 * and STATE last: it is the only cell of varying length besides KEY.
 * Dropped from the table for width (still in `show` and --json): the
 * publish and wait counters, the last publisher's pid, the idle time. */
enum {
  COL_KEY,
  COL_LEFT,
  COL_FLIGHT,
  COL_WAIT,
  COL_ADMIT,
  COL_LOCKED,
  COL_RECL,
  COL_LAST,
  COL_STATE,
  NCOLS
};

/* "episode,probe,paused,rate 120/1m", or "-". */
void ctl_state_text(const int64_t *f, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
#define FLAG(cond, ...)                                                        \
  do {                                                                         \
    if ((cond) && n < len) {                                                   \
      if (n > 0)                                                               \
        n += (size_t)snprintf(buf + n, len - n, ",");                          \
      if (n < len)                                                             \
        n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__);                  \
    }                                                                          \
  } while (0)
  char rate[48];
  FLAG(f[THROTTLE_FIELD_LOCK_EPISODE], "episode");
  FLAG(f[THROTTLE_FIELD_PROBE_OUT], "probe");
  FLAG(f[THROTTLE_FIELD_PAUSED], "paused");
  FLAG(f[THROTTLE_FIELD_RATE_N] > 0, "rate %s",
       ctl_rate_text(f[THROTTLE_FIELD_RATE_N], f[THROTTLE_FIELD_RATE_PERIOD_MS],
                     rate, sizeof rate));
#undef FLAG
  if (n == 0)
    snprintf(buf, len, "-");
}

static int ls_text(struct ctx *c, const struct rows *rows,
                   const struct tree *tr, uint32_t cap, uint32_t used,
                   uint64_t evictions, uint64_t repairs) {
  static const bool right[NCOLS] = {false, true, true, true, true,
                                    true,  true, true, false};
  static char *const head[NCOLS] = {"KEY",    "LEFT", "FLIGHT", "WAIT", "ADMIT",
                                    "LOCKED", "RECL", "LAST",   "STATE"};
  struct ctl_table t = {.ncols = NCOLS, .right = right};
  int rc = ctl_table_add(&t, head);
  for (size_t i = 0; i < rows->n && rc == 0; i++) {
    const int64_t *f = rows->v[i].field;
    char key[KEY_TEXT_MAX + 2 * 16], name[KEY_TEXT_MAX], left[32],
        flight[48], wait[48], admit[24], locked[24], recl[24], last[32],
        state[192];
    char *row[NCOLS] = {key,    left, flight, wait, admit,
                        locked, recl, last,   state};
    /* beneath a listed scope: indented (the whole key still, for the
     * scripts that look for it) */
    ctl_key_text(rows->v[i].key, name, sizeof name);
    int depth = tr->depth[i] < 16 ? tr->depth[i] : 16;
    snprintf(key, sizeof key, "%*s%s", 2 * depth, "", name);
    if (f[THROTTLE_FIELD_REMAINING_MS] > 0)
      ctl_human_ms(f[THROTTLE_FIELD_REMAINING_MS], true, left, sizeof left);
    else
      snprintf(left, sizeof left, "-");
    snprintf(flight, sizeof flight, "%lld/%lld%s",
             (long long)f[THROTTLE_FIELD_IN_FLIGHT],
             (long long)f[THROTTLE_FIELD_CAP],
             f[THROTTLE_FIELD_CAP_AUTO] ? "*" : "");
    snprintf(wait, sizeof wait, "%lld+%lld",
             (long long)f[THROTTLE_FIELD_WAITING_LIVE],
             (long long)f[THROTTLE_FIELD_WAITING_BACKFILL]);
    snprintf(admit, sizeof admit, "%lld",
             (long long)f[THROTTLE_FIELD_ADMITTED]);
    snprintf(locked, sizeof locked, "%lld",
             (long long)f[THROTTLE_FIELD_LOCKED]);
    snprintf(recl, sizeof recl, "%lld", (long long)f[THROTTLE_FIELD_RECLAIMS]);
    if (f[THROTTLE_FIELD_PUBLISHES] > 0)
      ctl_human_ms(f[THROTTLE_FIELD_LAST_DELAY_MS], false, last, sizeof last);
    else
      snprintf(last, sizeof last, "-");
    ctl_state_text(f, state, sizeof state);
    if (tr->keys[i] > 0) { /* a scope: what the keys beneath it do */
      char below[96];
      snprintf(below, sizeof below,
               "%lld keys beneath: %lld in flight, %lld waiting",
               (long long)tr->keys[i], (long long)tr->flight[i],
               (long long)tr->wait[i]);
      size_t n = strcmp(state, "-") == 0 ? 0 : strlen(state);
      snprintf(state + n, sizeof state - n, "%s%s", n ? "," : "", below);
    }
    rc = ctl_table_add(&t, row);
  }
  if (rc != 0) {
    ctl_table_free(&t);
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  ctl_backend_text(stdout, c->h);
  printf("segment %s%s: %u/%u keys, %llu evictions, %llu repairs\n",
         c->segname, c->readonly ? " (read-only)" : "", used, cap,
         (unsigned long long)evictions, (unsigned long long)repairs);
  ctl_table_print(stdout, &t, NULL);
  ctl_table_free(&t);
  return XIT_OK;
}

int ctl_cmd_ls(struct ctx *c) {
  uint32_t cap = 0, used = 0;
  uint64_t evictions = 0, repairs = 0;
  int rc = throttle_stats(c->h, &cap, &used, &evictions, &repairs);
  if (rc != 0)
    return ctl_lib_fail(c, rc);
  struct rows rows = {.patterns = c->args, .npatterns = c->nargs};
  rc = throttle_foreach(c->h, collect, &rows);
  if (rc != 0) {
    rows_free(&rows);
    if (rc > 0) {
      ctl_say("out of memory");
      return XIT_FAIL;
    }
    return ctl_lib_fail(c, rc);
  }
  struct tree tr;
  if (tree_build(&rows, &tr) != 0) {
    rows_free(&rows);
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  if (c->opt[OPT_JSON] == NULL) {
    rc = ls_text(c, &rows, &tr, cap, used, evictions, repairs);
    tree_free(&tr);
    rows_free(&rows);
    return rc;
  }
  printf("{\"schema\":%d,\"segment\":", CTL_JSON_SCHEMA);
  ctl_json_string(stdout, c->segname);
  ctl_backend_json(stdout, c->h);
  printf(",\"readonly\":%s,\"capacity\":%u,\"used\":%u,\"evictions\":%llu,"
         "\"repairs\":%llu,\"keys\":[",
         c->readonly ? "true" : "false", cap, used,
         (unsigned long long)evictions, (unsigned long long)repairs);
  for (size_t i = 0; i < rows.n; i++) {
    if (i > 0)
      fputc(',', stdout);
    struct beneath sum = {rows.v[i].key, 0, tr.keys[i], tr.flight[i],
                          tr.wait[i]};
    key_json(stdout, &rows, &rows.v[i], false, &sum, NULL);
  }
  fputs("]}\n", stdout);
  tree_free(&tr);
  rows_free(&rows);
  return XIT_OK;
}

/* ---- show ------------------------------------------------------------- */

/* "holders: none", or "holders:" and one indented line per holder; the
 * same for the waiters, in arrival order, when the key has any (a line
 * "waiters: none" would change what every script reading show saw). */
static int parties_text(const char *what, const struct holder *hv, size_t n) {
  if (n == 0) {
    printf("%s: none\n", what);
    return 0;
  }
  static const bool right[6] = {true, false, false, true, false, false};
  static char *const head[6] = {"PID", "COMMAND", "CLASS", "AGE", "", "HOST"};
  /* The HOST column only for those of other hosts (a backend); COMMAND
   * is this host's only ("-" where it cannot be read). */
  bool hosts = hv[0].host[0] != 0;
  struct ctl_table t = {.ncols = hosts ? 6 : 5, .right = right};
  int rc = ctl_table_add(&t, head);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const struct holder *hd = &hv[i];
    char pid[24], comm[CTL_COMM_MAX], cls[16], age[32], probe[8], host[64];
    char *cells[6] = {pid, comm, cls, age, probe, host};
    snprintf(host, sizeof host, "%s", hd->host);
    snprintf(comm, sizeof comm, "%s", hd->comm[0] ? hd->comm : "-");
    snprintf(pid, sizeof pid, "%lld", (long long)hd->pid);
    snprintf(cls, sizeof cls, "%s", ctl_class_name(hd->cls));
    ctl_human_ms(hd->age_ms, false, age, sizeof age);
    snprintf(probe, sizeof probe, "%s", hd->probe ? "probe" : "");
    rc = ctl_table_add(&t, cells);
  }
  if (rc == 0) {
    printf("%s:\n", what);
    ctl_table_print(stdout, &t, "  ");
  }
  ctl_table_free(&t);
  return rc;
}

/* What the cap learner knows, in words.  Its own label: "cap:" is the
 * field line, which scripts read. */
static void learner_text(const int64_t *f) {
  char a[32], b[32];
  printf("cap learner: ");
  if (!f[THROTTLE_FIELD_CAP_AUTO]) {
    printf("off, cap %lld fixed (--max-parallel)", (long long)f[THROTTLE_FIELD_CAP]);
    if (f[THROTTLE_FIELD_CAP_GOOD] > 0)
      printf("; learned %lld is kept for auto", (long long)f[THROTTLE_FIELD_CAP_GOOD]);
    printf("\n");
    return;
  }
  printf("cap %lld", (long long)f[THROTTLE_FIELD_CAP]);
  if (f[THROTTLE_FIELD_CAP_MAX] > 0)
    printf(", at most %lld", (long long)f[THROTTLE_FIELD_CAP_MAX]);
  if (f[THROTTLE_FIELD_CAP_LEARNED_AGO_MS] < 0) {
    printf(", slow start (never refused with others in flight)\n");
    return;
  }
  ctl_human_ms((int64_t)f[THROTTLE_FIELD_CAP_LEARNED_AGO_MS], false, a, sizeof a);
  ctl_human_ms((int64_t)f[THROTTLE_FIELD_CAP_RETRY_AFTER_MS], false, b, sizeof b);
  printf(": set by a refusal %s ago (Retry-After %s)", a, b);
  if (f[THROTTLE_FIELD_CAP_FAIL] > 0)
    printf(", a raise to %lld refused", (long long)f[THROTTLE_FIELD_CAP_FAIL]);
  if (f[THROTTLE_FIELD_CAP_NEXT_RAISE_MS] < 0) {
    printf("; no raise: at the bound\n");
    return;
  }
  ctl_human_ms((int64_t)f[THROTTLE_FIELD_CAP_NEXT_RAISE_MS], false, a, sizeof a);
  printf("; next raise after %s more work at the cap\n", a);
}

int ctl_cmd_show(struct ctx *c) {
  throttle_info_t *info;
  int rc = throttle_info(c->h, c->args[0], &info);
  if (rc != 0)
    return ctl_lib_fail(c, rc);
  struct rows rows = {0};
  rc = collect(info, &rows);
  throttle_info_free(info);
  if (rc != 0) {
    rows_free(&rows);
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  const struct keyrow *row = &rows.v[0];
  struct beneath b = {row->key, strlen(row->key), 0, 0, 0};
  if (throttle_foreach(c->h, add_beneath, &b) != 0)
    b.keys = b.flight = b.wait = 0; /* a snapshot that failed: none known */
  if (c->opt[OPT_JSON] != NULL) {
    key_json(stdout, &rows, row, true, &b, c->h);
    fputc('\n', stdout);
  } else {
    char key[KEY_TEXT_MAX];
    printf("key: %s\n", ctl_key_text(row->key, key, sizeof key));
    learner_text(row->field);
    if (row->refusal.status != 0) { /* a line only when one was noted */
      char said[1024];
      ctl_refusal_text(&row->refusal, true, said, sizeof said);
      printf("last refusal: %s\n", said);
    }
    for (int i = 0; i < THROTTLE_FIELD_COUNT_; i++) {
      const char *name = throttle_field_name((throttle_field_t)i);
      if (name != NULL)
        printf("%s: %lld\n", name, (long long)row->field[i]);
    }
    const struct holder *hv = &rows.hv[row->hfirst];
    rc = parties_text("holders", hv, row->hcount);
    if (rc == 0 && row->wcount > 0)
      rc = parties_text("waiters", hv + row->hcount, row->wcount);
    /* a list that had to be cut says so (waiters beyond the key's slots,
     * whose pids are not kept, or past the first 32) */
    if (rc == 0 && row->field[THROTTLE_FIELD_WAITERS_UNLISTED] > 0)
      printf("waiters not listed: %lld\n",
             (long long)row->field[THROTTLE_FIELD_WAITERS_UNLISTED]);
    if (rc == 0 && b.keys)
      printf("beneath: %lld keys, %lld in flight, %lld waiting\n",
             (long long)b.keys, (long long)b.flight, (long long)b.wait);
    if (rc == 0)
      ctl_backend_text(stdout, c->h);
  }
  rows_free(&rows);
  if (rc != 0) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  return XIT_OK;
}
