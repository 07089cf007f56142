/* SPDX-License-Identifier: MIT */
/*
 * ctl_open.c — the segment a command names: the name checked before
 * anything is opened, the segment opened as the command's table row asks
 * (OPEN_ATTACH, OPEN_CREATE, OPEN_FAIL_OPEN; OPEN_READ is ctl_segments.c's),
 * and `rm`, which removes it by that name.
 */
#include "ctl.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* $THROTTLE_SEGMENT, when set and not empty. */
static const char *env_segment(void) {
  const char *e = getenv("THROTTLE_SEGMENT");
  return e != NULL && *e != 0 ? e : NULL;
}

/* The library falls back to the default segment when $THROTTLE_SEGMENT is
 * invalid; for a tool that can remove segments, acting on another segment
 * than the one named is worse than refusing. */
int ctl_check_segment_names(struct ctx *c) {
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  int rc = XIT_OK;
  if (c->segment != NULL && throttle_config_set_segment(cfg, c->segment) != 0)
    rc = ctl_usage_error(NULL,
                         "invalid segment name '%s' (1 to 200 bytes, no '/' "
                         "after the first)",
                         c->segment);
  else if (c->segment == NULL && env_segment() != NULL &&
           throttle_config_set_segment(cfg, env_segment()) != 0)
    rc = ctl_usage_error(NULL,
                         "THROTTLE_SEGMENT='%s' is not a valid segment name "
                         "(1 to 200 bytes, no '/' after the first)",
                         env_segment());
  throttle_config_free(cfg);
  return rc;
}

int ctl_open_segment(struct ctx *c) {
  if (c->cmd->open == OPEN_READ)
    return ctl_open_read(c);
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  int rc = 0;
  if (c->segment != NULL)
    rc = throttle_config_set_segment(cfg, c->segment);
  if (rc == 0 && c->cmd->open == OPEN_ATTACH)
    rc = throttle_config_set_flags(cfg, THROTTLE_NO_CREATE);
  if (rc == 0)
    rc = throttle_open(cfg, &c->h);
  throttle_config_free(cfg);
  if (c->h == NULL) {
    ctl_say("cannot open the segment: %s", throttle_strerror(rc));
    return XIT_FAIL;
  }
  c->segname = throttle_segment_name(c->h);
  const char *msg = throttle_errmsg(c->h);
  /* The library's message may end by announcing its private fallback. */
  static const char fallback[] = "; falling back to process-private back-off";
  if ((rc != 0 || !throttle_is_shared(c->h)) &&
      c->cmd->open == OPEN_FAIL_OPEN) {
    if (*msg == 0)
      msg = throttle_strerror(rc);
    const char *tail = strstr(msg, fallback) != NULL ? "" : fallback;
    if (strstr(msg, c->segname) != NULL)
      ctl_say("warning: %s%s", msg, tail);
    else
      ctl_say("warning: %s: %s%s", c->segname, msg, tail);
    return XIT_OK;
  }
  if (rc != 0 || !throttle_is_shared(c->h)) {
    /* This tool does not use the fallback: drop its announcement rather
     * than say something untrue. */
    size_t n = strlen(msg), k = sizeof fallback - 1;
    if (n >= k && strcmp(msg + n - k, fallback) == 0)
      n -= k;
    if (n == 0) {
      msg = throttle_strerror(rc);
      n = strlen(msg);
    }
    if (strstr(msg, c->segname) != NULL)
      ctl_say("%.*s", (int)n, msg);
    else
      ctl_say("%s: %.*s", c->segname, (int)n, msg);
    /* A segment another process is creating or holds locked is a
     * segment to try again (75); a foreign or damaged one is not. */
    return rc != 0 && ctl_exit_for(rc) == XIT_TEMP ? XIT_TEMP : XIT_FAIL;
  }
  if (*msg != 0) /* e.g. an invalid $THROTTLE_KEYS, replaced by the default */
    ctl_say("warning: %s: %s", c->segname, msg);
  return XIT_OK;
}

/* The name the library will resolve, for messages only.  Without --segment
 * or $THROTTLE_SEGMENT it is the per-user default, which only the library
 * knows: ask it through a handle that may not create anything. */
static void rm_name(const struct ctx *c, char *buf, size_t len) {
  const char *n = c->segment != NULL ? c->segment : env_segment();
  if (n != NULL) {
    snprintf(buf, len, "%s%s", n[0] == '/' ? "" : "/", n);
    return;
  }
  snprintf(buf, len, "the default segment");
  throttle_config_t *cfg = throttle_config_new();
  throttle_t *h = NULL;
  if (cfg != NULL && throttle_config_set_flags(cfg, THROTTLE_NO_CREATE) == 0 &&
      throttle_config_set_lock_timeout(cfg, 100) == 0) {
    (void)throttle_open(cfg, &h);
    if (h != NULL)
      snprintf(buf, len, "%s", throttle_segment_name(h));
  }
  throttle_close(h);
  throttle_config_free(cfg);
}

/* The processes of this host (other than this one) that map /dev/shm +
 * name, as far as /proc lets this user see: up to max pids into pids;
 * returns how many there are. */
static size_t mappers(const char *name, long *pids, size_t max) {
  char want[300];
  snprintf(want, sizeof want, " /dev/shm%s", name);
  size_t wn = strlen(want), n = 0;
  DIR *d = opendir("/proc");
  if (d == NULL)
    return 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != 0 || pid <= 0 || pid == (long)getpid())
      continue;
    char path[64], line[4096];
    snprintf(path, sizeof path, "/proc/%ld/maps", pid);
    FILE *f = fopen(path, "re");
    if (f == NULL)
      continue;
    bool maps = false;
    while (!maps && fgets(line, sizeof line, f) != NULL) {
      line[strcspn(line, "\n")] = 0;
      const char *p = strstr(line, want);
      maps = p != NULL && (p[wn] == 0 || strcmp(p + wn, " (deleted)") == 0);
    }
    fclose(f);
    if (maps && n++ < max)
      pids[n - 1] = pid;
  }
  closedir(d);
  return n;
}

/* Removing a segment that processes still map splits them from every
 * process that opens the name afterwards (a new segment): say who. */
static void warn_mapped(const char *name, const long *pids, size_t n,
                        size_t shown) {
  char list[512] = "", comm[CTL_COMM_MAX];
  size_t k = 0;
  for (size_t i = 0; i < shown && k < sizeof list; i++)
    k += (size_t)snprintf(list + k, sizeof list - k, "%s%ld %s",
                          i > 0 ? ", " : "", pids[i],
                          *ctl_comm(pids[i], comm, sizeof comm) ? comm : "?");
  if (n > shown && k < sizeof list)
    snprintf(list + k, sizeof list - k, ", +%zu", n - shown);
  ctl_say("warning: %s was still mapped by %zu process%s (%s): they go on "
          "with the removed copy, and no longer share back-offs with the "
          "processes that open %s from now on; restart them",
          name, n, n == 1 ? "" : "es", list, name);
}

int ctl_cmd_rm(struct ctx *c) {
  char name[256];
  rm_name(c, name, sizeof name);
  long pids[8];
  size_t nmap = name[0] == '/' ? mappers(name, pids, 8) : 0;
  int rc = throttle_unlink(c->segment);
  if (rc == 0) {
    if (nmap > 0)
      warn_mapped(name, pids, nmap, nmap < 8 ? nmap : 8);
    return XIT_OK;
  }
  int e = errno;
  if (rc == THROTTLE_ENOKEY)
    ctl_say("%s: no such segment", name);
  else if (rc == THROTTLE_ESHM)
    ctl_say("%s: cannot remove: %s", name, strerror(e));
  else
    ctl_say("%s: cannot remove: %s", name, throttle_strerror(rc));
  return XIT_FAIL;
}
