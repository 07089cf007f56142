/* SPDX-License-Identifier: MIT */
/*
 * ctl_env.c — the environment variables libthrottle and throttlectl read,
 * in one table: `throttlectl --help` prints it, throttlectl(1) documents
 * each (tests/test_ctl_docs.sh checks both against this table, and the
 * table against the library's sources), and a THROTTLE_* variable that is
 * not in it draws a warning, since a misspelt or imagined one
 * (THROTTLE_GROUP_SHARED is a flag of throttle_config_set_flags(), not a
 * variable) is otherwise silently without effect.  The values are checked
 * by the library that reads them (its warning comes with the handle:
 * throttle_errmsg() after throttle_open()), not here, so the ranges exist
 * once.
 */
#include "ctl.h"

#include <stdlib.h>
#include <string.h>

extern char **environ;

const struct ctl_env ctl_env_vars[] = {
    {"THROTTLE_SEGMENT", "the segment (default: /libthrottle-v<N>-<uid>)"},
    {"THROTTLE_KEYS", "key capacity of a segment this process creates "
                      "(1 to 1048576, default 4096)"},
    {"THROTTLE_MAX_DELAY_MS",
     "longest back-off this process honours (1 to 604800000, default "
     "900000); the creator's also bounds what the segment stores"},
    {"THROTTLE_LEASE_MS", "an admission held longer is reclaimed (1 to "
                          "86400000, default 600000)"},
    {"THROTTLE_BACKEND", "shm (default), redis://... or unix://...: keys "
                         "across hosts"},
    {"THROTTLE_BACKEND_MODULE", "path of libthrottle-redis.so.1"},
    {"THROTTLE_REDIS_TIMEOUT_MS", "Redis connect and command timeout (1 to "
                                  "60000, default 250)"},
    {"THROTTLE_LIVENESS_MS", "Redis: a dead holder is reclaimed within this "
                             "(100 to 3600000, default 10000)"},
    {"THROTTLE_REDIS_TTL_MS", "Redis: an idle key without settings is kept "
                              "this long (1000 to 31622400000, default "
                              "86400000)"},
    {"THROTTLE_RETRY_AFTER_FILE", "run: set for CMD, the file it may write "
                                  "its Retry-After into"},
    {NULL, NULL},
};

void ctl_env_check(void) {
  for (char **e = environ; e != NULL && *e != NULL; e++) {
    if (strncmp(*e, "THROTTLE_", 9) != 0)
      continue;
    size_t n = strcspn(*e, "=");
    bool known = false;
    for (const struct ctl_env *v = ctl_env_vars; v->name != NULL && !known;
         v++)
      known = strlen(v->name) == n && strncmp(v->name, *e, n) == 0;
    /* The test builds' crash points (never read by a release build). */
    known = known || (n == 17 && strncmp(*e, "THROTTLE_CRASH_AT", n) == 0);
    if (!known) {
      char name[KEY_TEXT_MAX], raw[KEY_MAX + 1];
      snprintf(raw, sizeof raw, "%.*s", (int)(n < KEY_MAX ? n : KEY_MAX), *e);
      ctl_say("warning: %s is not a variable libthrottle reads: it has no "
              "effect (" PROG " --help lists them)",
              ctl_key_text(raw, name, sizeof name));
    }
  }
}
