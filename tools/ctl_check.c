/* SPDX-License-Identifier: MIT */
/*
 * ctl_check.c — checks of throttlectl's option values, run before the
 * segment is opened: each returns 0, or XIT_USAGE after saying what is
 * wrong (so a usage error never creates or touches a segment).
 */
#include "ctl.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks of option values ------------------------------------------ */

int ctl_check_timeout(struct ctx *c) {
  c->timeout_ms = THROTTLE_FOREVER;
  const char *t = c->opt[OPT_TIMEOUT];
  if (t != NULL)
    return ctl_check_duration(c, "--timeout", t, 0, UINT64_MAX,
                              &c->timeout_ms);
  return 0;
}

int ctl_check_retries(struct ctx *c, unsigned def) {
  c->retries = def;
  const char *r = c->opt[OPT_RETRIES];
  uint64_t n;
  if (r != NULL) {
    if (ctl_parse_uint(r, 0, RETRIES_MAX, &n) != 0)
      return ctl_usage_error(c->cmd,
                             "--retries must be a whole number from 0 to %u, "
                             "not '%s'",
                             RETRIES_MAX, r);
    c->retries = (unsigned)n;
  }
  return 0;
}

int ctl_check_class(struct ctx *c) {
  const char *cls = c->opt[OPT_CLASS];
  c->cls = THROTTLE_CLASS_LIVE;
  if (cls != NULL && strcmp(cls, "backfill") == 0)
    c->cls = THROTTLE_CLASS_BACKFILL;
  else if (cls != NULL && strcmp(cls, "live") != 0)
    return ctl_usage_error(c->cmd, "--class must be live or backfill, not '%s'",
                           cls);
  return 0;
}

int ctl_check_publish(struct ctx *c) {
  static const struct {
    const char *name;
    throttle_outcome_t o;
  } sig[] = {{"locked", THROTTLE_OUTCOME_LOCKED},
             {"409", THROTTLE_OUTCOME_LOCKED},
             {"429", THROTTLE_OUTCOME_RATE_LIMITED},
             {"503", THROTTLE_OUTCOME_UNAVAILABLE}};
  for (int i = 0; i < c->nlist[OPT_PUBLISH]; i++) {
    const char *v = c->list[OPT_PUBLISH][i], *eq = strchr(v, '=');
    size_t n = eq != NULL ? (size_t)(eq - v) : 0, k = 0;
    while (k < sizeof sig / sizeof sig[0] &&
           !(strlen(sig[k].name) == n && strncmp(v, sig[k].name, n) == 0))
      k++;
    uint64_t lv = 0;
    int level = 0;
    if (k < sizeof sig / sizeof sig[0] && strcmp(eq + 1, "root") == 0)
      level = THROTTLE_LEVEL_ROOT;
    else if (k < sizeof sig / sizeof sig[0] && strcmp(eq + 1, "key") == 0)
      level = THROTTLE_LEVEL_KEY;
    else if (k < sizeof sig / sizeof sig[0] &&
             ctl_parse_uint(eq + 1, 1, 255, &lv) == 0)
      level = (int)lv;
    else
      return ctl_usage_error(c->cmd,
                             "--publish must be SIGNAL=WHERE (SIGNAL locked, "
                             "429 or 503; WHERE key, root or 1 to 255), not "
                             "'%s'",
                             v);
    c->publish_level[sig[k].o] = level;
    c->publish_set |= 1u << sig[k].o;
  }
  return 0;
}

void ctl_apply_publish(struct ctx *c) {
  for (unsigned o = 0; o < 4; o++)
    if ((c->publish_set & (1u << o)) &&
        throttle_set_publish_level(c->h, (throttle_outcome_t)o,
                                   c->publish_level[o]) != 0)
      ctl_say("warning: --publish: %s", throttle_errmsg(c->h));
}

int ctl_check_max_parallel(struct ctx *c) {
  const char *v = c->opt[OPT_MAX_PARALLEL];
  uint64_t n = 0;
  if (v == NULL)
    return 0;
  c->max_auto = 0;
  if (strncmp(v, "auto:", 5) == 0) {
    /* Only `set` applies a bound (run and http set the cap they are
     * given, and would drop it). */
    if (strcmp(c->cmd->name, "set") != 0 ||
        ctl_parse_uint(v + 5, 1, CAP_MAX, &n) != 0)
      return ctl_usage_error(c->cmd,
                             "--max-parallel auto:MAX takes MAX 1 to %d, with "
                             "set only, not '%s'",
                             CAP_MAX, v);
    c->max_auto = (uint32_t)n;
    c->max_parallel = 0;
    return 0;
  }
  if (strcmp(v, "auto") != 0 && ctl_parse_uint(v, 1, CAP_MAX, &n) != 0)
    return ctl_usage_error(
        c->cmd, "--max-parallel must be 1 to %d, auto or auto:MAX, not '%s'",
        CAP_MAX, v);
  c->max_parallel = (uint32_t)n; /* 0: auto */
  return 0;
}

#define RATE_N_MAX 1000000u /* keeps period / N at 1 ns or more */
#define PERIOD_MAX_MS (UINT64_C(366) * 86400000u) /* the library's limit */

int ctl_check_rate(struct ctx *c) {
  const char *v = c->opt[OPT_RATE];
  if (v == NULL)
    return 0;
  if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0) {
    c->rate_n = 0;
    c->rate_period_ms = 0;
    return 0;
  }
  const char *slash = strchr(v, '/');
  char num[32];
  uint64_t n = 0, ms = 0;
  bool ok = slash != NULL && (size_t)(slash - v) < sizeof num;
  if (ok) {
    memcpy(num, v, (size_t)(slash - v));
    num[slash - v] = 0;
    ok = ctl_parse_uint(num, 1, RATE_N_MAX, &n) == 0;
  }
  if (!ok)
    return ctl_usage_error(c->cmd,
                           "--rate must be N/PERIOD with N 1 to %u (e.g. "
                           "120/1m, 5/500ms, 10/1) or off, not '%s'",
                           RATE_N_MAX, v);
  int rc = ctl_check_duration(c, "--rate: the PERIOD", slash + 1, 1,
                              PERIOD_MAX_MS, &ms);
  if (rc != 0)
    return rc;
  c->rate_n = (uint32_t)n;
  c->rate_period_ms = ms;
  return 0;
}

/* A decimal 0 to 1: digits, optionally '.' and digits. */
int ctl_check_backfill_share(struct ctx *c) {
  const char *v = c->opt[OPT_BACKFILL_SHARE];
  if (v == NULL)
    return 0;
  const char *p = v;
  bool ok = *p >= '0' && *p <= '9';
  while (*p >= '0' && *p <= '9')
    p++;
  if (ok && *p == '.') {
    p++;
    ok = *p >= '0' && *p <= '9';
    while (*p >= '0' && *p <= '9')
      p++;
  }
  if (ok && *p == 0) {
    c->backfill_share = strtod(v, NULL);
    ok = c->backfill_share <= 1.0;
  }
  if (!ok || *p != 0)
    return ctl_usage_error(c->cmd,
                           "--backfill-share must be a decimal from 0 to 1 "
                           "such as 0.25, not '%s'",
                           v);
  /* The library keeps thousandths: say so when that changes the value,
   * above all when a small share would round to none at all. */
  double kept = (double)(uint32_t)(c->backfill_share * 1000.0 + 0.5) / 1000.0;
  if (kept != c->backfill_share)
    ctl_say("warning: --backfill-share %s is kept in thousandths: %.3f is "
            "used%s",
            v, kept, kept == 0.0 ? " (backfill gets no slot)" : "");
  return 0;
}


/* ---- values the library bounds ---------------------------------------- */

/* What is stored for everyone is bounded by the segment's maximum delay
 * (throttle_segment_max_delay(), `throttlectl max-delay`), not by this
 * process's own THROTTLE_MAX_DELAY_MS, so the warning is given once the
 * segment is open, against the maximum read from it.  Once per invocation:
 * `run` and `http` are told the same by every attempt. */
uint64_t ctl_warn_max_delay(struct ctx *c, const char *what, const char *given,
                            uint64_t ms) {
  static bool told;
  uint64_t max;
  if (throttle_segment_max_delay(c->h, &max) != 0 || ms <= max)
    return ms;
  if (!told) {
    told = true;
    char used[112], human[32];
    snprintf(used, sizeof used,
             "the segment's maximum delay, %s, is used (throttlectl "
             "max-delay)",
             ctl_human_ms((int64_t)max, false, human, sizeof human));
    ctl_warn_clamped(what, given, used);
  }
  return max;
}
int ctl_check_duration(struct ctx *c, const char *what, const char *s,
                       uint64_t min_ms, uint64_t max_ms, uint64_t *ms) {
  char why[128];
  if (ctl_parse_duration(s, ms, why, sizeof why) != 0)
    return ctl_usage_error(c->cmd,
                           "%s: '%s' is not a duration: %s (e.g. 250ms, 1.5s, "
                           "30 (seconds), 5m, 1h30m)",
                           what, s, why);
  if (*ms < min_ms || *ms > max_ms) {
    char lo[32], hi[32];
    return ctl_usage_error(c->cmd, "%s: '%s' is out of range: %s to %s", what,
                           s, ctl_human_ms((int64_t)min_ms, false, lo, sizeof lo),
                           max_ms == UINT64_MAX
                               ? "any length"
                               : ctl_human_ms((int64_t)max_ms, false, hi,
                                              sizeof hi));
  }
  return 0;
}
