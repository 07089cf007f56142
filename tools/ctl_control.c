/* SPDX-License-Identifier: MIT */
/*
 * ctl_control.c — the commands that steer a key for every process: `set`
 * (cap, rate, backfill share), `pause`, `resume` and `cancel`.  Each is a
 * library call per setting; the options were checked before the segment
 * was opened (ctl_check.c).
 */
#include "ctl.h"

int ctl_check_set(struct ctx *c) {
  int rc = ctl_check_max_parallel(c);
  if (rc == 0)
    rc = ctl_check_rate(c);
  if (rc == 0)
    rc = ctl_check_backfill_share(c);
  if (rc == 0 && c->opt[OPT_MAX_PARALLEL] == NULL && c->opt[OPT_RATE] == NULL &&
      c->opt[OPT_BACKFILL_SHARE] == NULL)
    rc = ctl_usage_error(c->cmd, "nothing to set: give --max-parallel, "
                                 "--rate or --backfill-share");
  return rc;
}

/* In option order; one that fails leaves the ones before it applied. */
int ctl_cmd_set(struct ctx *c) {
  const char *key = c->args[0];
  int rc = 0;
  if (c->opt[OPT_MAX_PARALLEL] != NULL)
    rc = c->max_auto != 0
             ? throttle_set_max_parallel_auto(c->h, key, c->max_auto)
             : throttle_set_max_parallel(c->h, key, c->max_parallel);
  if (rc == 0 && c->opt[OPT_RATE] != NULL)
    rc = throttle_set_rate(c->h, key, c->rate_n, c->rate_period_ms);
  if (rc == 0 && c->opt[OPT_BACKFILL_SHARE] != NULL)
    rc = throttle_set_backfill_share(c->h, key, c->backfill_share);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_cmd_pause(struct ctx *c) {
  int rc = throttle_pause(c->h, c->args[0]);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_cmd_resume(struct ctx *c) {
  int rc = throttle_resume(c->h, c->args[0]);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}

int ctl_cmd_cancel(struct ctx *c) {
  int rc = throttle_cancel(c->h, c->args[0]);
  return rc != 0 ? ctl_lib_fail(c, rc) : XIT_OK;
}
