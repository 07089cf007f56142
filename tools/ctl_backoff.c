/* SPDX-License-Identifier: MIT */
/*
 * ctl_backoff.c — the back-off commands: `backoff` (publish a not-before),
 * `wait` (block until a key opens), `clear`, `reset`, and `max-delay` (the
 * segment's maximum delay, which bounds what `backoff` stores).  Each is
 * one library call; the values were checked before the segment was
 * opened (throttlectl.c's table runs the ctl_check_* here first).
 */
#include "ctl.h"

/* backoff KEY RETRY_AFTER [--status N [--code CODE] [--message TEXT]]:
 * the words are those a script read from the server's answer. */
int ctl_check_backoff(struct ctx *c) {
  int rc = ctl_check_duration(c, "RETRY_AFTER", c->args[1], 0, UINT64_MAX,
                              &c->ms);
  if (rc != 0)
    return rc;
  uint64_t v = 0;
  c->status = 0;
  if (c->opt[OPT_STATUS] != NULL) {
    if (ctl_parse_uint(c->opt[OPT_STATUS], 100, 999, &v) != 0)
      return ctl_usage_error(c->cmd, "--status %s: an HTTP status, 100 to 999",
                             c->opt[OPT_STATUS]);
    c->status = (int)v;
  } else if (c->opt[OPT_CODE] != NULL || c->opt[OPT_MESSAGE] != NULL) {
    return ctl_usage_error(c->cmd, "--code and --message need --status");
  }
  return 0;
}

int ctl_cmd_backoff(struct ctx *c) {
  (void)ctl_warn_max_delay(c, "backoff: RETRY_AFTER", c->args[1], c->ms);
  int rc = throttle_backoff(c->h, c->args[0], c->ms);
  /* The words after the back-off they explain (a note never delays). */
  if (rc == 0 && c->status != 0)
    rc = throttle_note_refusal(c->h, c->args[0], c->status, c->opt[OPT_CODE],
                               c->opt[OPT_MESSAGE], c->args[1]);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_check_wait(struct ctx *c) { return ctl_check_timeout(c); }

int ctl_cmd_wait(struct ctx *c) {
  int rc = throttle_wait(c->h, c->args[0], c->timeout_ms);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_cmd_clear(struct ctx *c) {
  int rc = throttle_clear(c->h, c->args[0]);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_cmd_reset(struct ctx *c) {
  int rc = throttle_reset(c->h);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

/* max-delay DURATION: 1 ms to 7 days, as the library takes it. */
int ctl_check_max_delay(struct ctx *c) {
  if (c->nargs == 0)
    return 0;
  return ctl_check_duration(c, "max-delay", c->args[0], 1,
                            UINT64_C(7) * 86400000u, &c->ms);
}

/* The segment's maximum delay, in seconds (a process's own
 * THROTTLE_MAX_DELAY_MS bounds only what that process honours). */
int ctl_cmd_max_delay(struct ctx *c) {
  int rc = c->nargs == 0 ? 0 : throttle_set_segment_max_delay(c->h, c->ms);
  uint64_t ms = 0;
  if (rc == 0)
    rc = throttle_segment_max_delay(c->h, &ms);
  if (rc != 0)
    return ctl_lib_fail(c, rc);
  printf("%llu.%03llu\n", (unsigned long long)(ms / 1000),
         (unsigned long long)(ms % 1000));
  return XIT_OK;
}
