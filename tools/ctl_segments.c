/* SPDX-License-Identifier: MIT */
/*
 * ctl_segments.c — how the inspecting commands open a segment, and
 * `segments`, the list of the libthrottle segments on this host.
 *
 * Inspecting (`ls`, `show`, `watch`, `metrics`: OPEN_READ) first attaches
 * as a library user would.  When that is refused because the segment is
 * another user's (THROTTLE_EOWNER) or writable by others (THROTTLE_EMODE),
 * it opens it again with THROTTLE_READONLY: root, or anyone its mode lets
 * read, sees it without writing a byte.  The messages then say how to
 * read, never to remove: a segment in use by another user's loaders is
 * theirs.  Rejected: always reading read-only (a private copy per call
 * costs a copy of the whole segment, and the owner's own view should be
 * the locked, exact one).
 *
 * `segments` lists /dev/shm (where glibc keeps POSIX shared memory): every
 * object this user can open that a read-only open accepts as a segment,
 * and, by name, the ones it may not read.  "Last change" is the most
 * recent use of any key (the segment's mtime does not move when it is
 * written through a mapping).
 */
#include "ctl.h"

#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"

static throttle_t *open_flags(const char *segment, unsigned flags, int *rc) {
  throttle_config_t *cfg = throttle_config_new();
  throttle_t *h = NULL;
  *rc = THROTTLE_ENOMEM;
  if (cfg == NULL)
    return NULL;
  *rc = 0;
  if (segment != NULL)
    *rc = throttle_config_set_segment(cfg, segment);
  if (*rc == 0)
    *rc = throttle_config_set_flags(cfg, flags | THROTTLE_NO_FALLBACK);
  if (*rc == 0)
    *rc = throttle_open(cfg, &h);
  throttle_config_free(cfg);
  return h;
}

int ctl_open_read(struct ctx *c) {
  int rc;
  c->h = open_flags(c->segment, THROTTLE_NO_CREATE, &rc);
  if (c->h == NULL && (rc == THROTTLE_EOWNER || rc == THROTTLE_EMODE)) {
    int why = rc;
    c->h = open_flags(c->segment, THROTTLE_READONLY, &rc);
    if (c->h != NULL && why == THROTTLE_EMODE)
      ctl_say("note: %s is writable by group or others, which loaders "
              "refuse (unless THROTTLE_GROUP_SHARED and only the group); "
              "shown read-only",
              throttle_segment_name(c->h));
    c->readonly = c->h != NULL;
  }
  if (c->h == NULL) {
    const char *msg = throttle_errmsg(NULL);
    if (*msg == 0)
      msg = throttle_strerror(rc);
    ctl_say("%s", msg);
    if (rc == THROTTLE_ESHM && strstr(msg, "does not exist") != NULL)
      ctl_say("`" PROG " segments` lists the segments on this host; "
              "--segment NAME picks one");
    return XIT_FAIL;
  }
  c->segname = throttle_segment_name(c->h);
  if (*throttle_errmsg(c->h) != 0) /* e.g. an invalid $THROTTLE_KEYS */
    ctl_say("warning: %s: %s", c->segname, throttle_errmsg(c->h));
  return XIT_OK;
}

/* ---- segments --------------------------------------------------------- */

struct seg {
  char name[256];
  uid_t uid;
  unsigned mode;
  long long size;
  int rc; /* of the read-only open */
  bool empty; /* size 0: never built */
  uint32_t cap, used;
  int64_t idle_ms; /* least idle key; -1 when no key */
};

static int least_idle(const throttle_info_t *info, void *arg) {
  int64_t *m = arg, idle = throttle_info_get(info, THROTTLE_FIELD_IDLE_MS);
  if (*m < 0 || idle < *m)
    *m = idle;
  return 0;
}

/* Fill s from the object /dev/shm/NAME; 0 to list it, -1 to skip it (not
 * a segment, or not one we can tell is ours). */
static int probe(const char *file, struct seg *s, throttle_t **bh) {
  char path[sizeof SHM_DIR + 256];
  struct stat st;
  snprintf(path, sizeof path, SHM_DIR "/%s", file);
  if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return -1;
  snprintf(s->name, sizeof s->name, "/%s", file);
  s->uid = st.st_uid;
  s->mode = (unsigned)(st.st_mode & 07777);
  s->size = (long long)st.st_size;
  s->idle_ms = -1;
  s->cap = s->used = 0;
  s->empty = st.st_size == 0 && st.st_uid == geteuid();
  if (s->empty) {
    /* A creator that could not build it, or one building it right now:
     * no header says whose, so one of this user's empty objects is shown
     * with what to do about it. */
    s->rc = THROTTLE_ESIZE;
    return 0;
  }
  throttle_t *h = open_flags(s->name, THROTTLE_READONLY, &s->rc);
  if (h == NULL)
    /* EMAGIC and ESIZE say "not ours" for most objects; one that is
     * ours by name but unreadable or damaged is still worth a line. */
    return strncmp(file, "libthrottle-", 12) == 0 ||
                   s->rc == THROTTLE_EVERSION || s->rc == THROTTLE_EFINGERPRINT
               ? 0
               : -1;
  if ((s->rc = throttle_stats(h, &s->cap, &s->used, NULL, NULL)) == 0)
    s->rc = throttle_foreach(h, least_idle, &s->idle_ms);
  /* With a backend, the first handle that asked it is kept: it says
   * whether the backend answered (ctl_cmd_segments). */
  if (*bh == NULL && strcmp(throttle_backend(h), "shm") != 0)
    *bh = h;
  else
    throttle_close(h);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const struct seg *)a)->name, ((const struct seg *)b)->name);
}

static const char *owner_name(uid_t uid, char *buf, size_t len) {
  struct passwd *pw = getpwuid(uid);
  if (pw != NULL)
    snprintf(buf, len, "%s", pw->pw_name);
  else
    snprintf(buf, len, "%u", (unsigned)uid);
  return buf;
}

static void segments_json(const struct seg *v, size_t n, const throttle_t *bh) {
  printf("{\"schema\":%d", CTL_JSON_SCHEMA);
  if (bh != NULL) /* a backend: whether it answered */
    ctl_backend_json(stdout, bh);
  printf(",\"segments\":[");
  for (size_t i = 0; i < n; i++) {
    const struct seg *s = &v[i];
    char owner[64];
    printf("%s{\"name\":", i ? "," : "");
    ctl_json_string(stdout, s->name);
    printf(",\"uid\":%u,\"owner\":", (unsigned)s->uid);
    ctl_json_string(stdout, owner_name(s->uid, owner, sizeof owner));
    printf(",\"mode\":\"%04o\",\"bytes\":%lld,\"readable\":%s", s->mode,
           s->size, s->rc == 0 ? "true" : "false");
    if (s->rc == 0)
      printf(",\"used\":%u,\"capacity\":%u,\"idle_ms\":%lld", s->used, s->cap,
             (long long)s->idle_ms);
    else if (s->empty)
      printf(",\"error\":\"empty\"");
    else
      printf(",\"error\":\"%s\"", throttle_err_name(s->rc));
    fputc('}', stdout);
  }
  fputs("]}\n", stdout);
}

enum { S_NAME, S_OWNER, S_MODE, S_SIZE, S_KEYS, S_CHANGE, S_NCOLS };

static int segments_text(const struct seg *v, size_t n) {
  static const bool right[S_NCOLS] = {false, false, false, true, true, false};
  static char *const head[S_NCOLS] = {"NAME", "OWNER", "MODE",
                                      "SIZE", "KEYS",  "LAST CHANGE"};
  struct ctl_table t = {.ncols = S_NCOLS, .right = right};
  int rc = ctl_table_add(&t, head);
  for (size_t i = 0; i < n && rc == 0; i++) {
    const struct seg *s = &v[i];
    char name[KEY_TEXT_MAX], owner[64], mode[8], size[32], keys[32], change[96],
        ago[32];
    char *row[S_NCOLS] = {name, owner, mode, size, keys, change};
    ctl_key_text(s->name, name, sizeof name);
    owner_name(s->uid, owner, sizeof owner);
    snprintf(mode, sizeof mode, "%04o", s->mode);
    if (s->size >= 10 * 1024 * 1024)
      snprintf(size, sizeof size, "%lldM", s->size / (1024 * 1024));
    else
      snprintf(size, sizeof size, "%lldK", (s->size + 1023) / 1024);
    if (s->empty) {
      snprintf(keys, sizeof keys, "?");
      snprintf(change, sizeof change, "(empty: never built)");
    } else if (s->rc != 0) {
      snprintf(keys, sizeof keys, "?");
      snprintf(change, sizeof change, "(%s)", throttle_strerror(s->rc));
    } else {
      snprintf(keys, sizeof keys, "%u/%u", s->used, s->cap);
      if (s->idle_ms < 0)
        snprintf(change, sizeof change, "-");
      else
        snprintf(change, sizeof change, "%s ago",
                 ctl_human_ms(s->idle_ms, false, ago, sizeof ago));
    }
    rc = ctl_table_add(&t, row);
  }
  if (rc == 0)
    ctl_table_print(stdout, &t, NULL);
  ctl_table_free(&t);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (v[i].empty) {
      char name[KEY_TEXT_MAX];
      printf("%s is empty: its creator could not build it (is /dev/shm "
             "full? df /dev/shm), or is building it now; if no process uses "
             "it, remove it: " PROG " --segment %s rm\n",
             ctl_key_text(v[i].name, name, sizeof name), name);
    }
  return rc;
}

int ctl_cmd_segments(struct ctx *c) {
  DIR *d = opendir(SHM_DIR);
  if (d == NULL) {
    ctl_say(SHM_DIR ": %s", strerror(errno));
    return XIT_FAIL;
  }
  struct seg *v = NULL;
  size_t n = 0, cap = 0;
  int rc = XIT_OK;
  throttle_t *bh = NULL; /* with a backend: a handle that asked it */
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.' || strlen(e->d_name) > 200)
      continue;
    if (n == cap) {
      size_t ncap = cap ? 2 * cap : 16;
      struct seg *nv = realloc(v, ncap * sizeof *nv);
      if (nv == NULL) {
        ctl_say("out of memory");
        rc = XIT_FAIL;
        break;
      }
      v = nv;
      cap = ncap;
    }
    if (probe(e->d_name, &v[n], &bh) == 0)
      n++;
  }
  closedir(d);
  if (rc == XIT_OK) {
    if (n > 1)
      qsort(v, n, sizeof *v, by_name);
    if (c->opt[OPT_JSON] != NULL)
      segments_json(v, n, bh);
    else if (n == 0)
      printf("no libthrottle segments in " SHM_DIR "\n");
    else if (segments_text(v, n) != 0) {
      ctl_say("out of memory");
      rc = XIT_FAIL;
    } else if (bh != NULL) {
      ctl_backend_text(stdout, bh);
    }
  }
  if (bh != NULL)
    throttle_close(bh);
  free(v);
  return rc;
}
