/* SPDX-License-Identifier: MIT */
/*
 * gate.c — the public calls of admission: enter, try_enter, leave,
 * requeue.  Each checks its arguments, refuses an admission on a
 * read-only handle, and hands the call to the handle's backend (h->ops,
 * backend.h): the segment's gate is shm/gate_enter.c (its rules and why),
 * a backend across hosts in front of it is backend.c.
 */
#include "backend.h"

static int do_enter(throttle_t *h, const char *key, throttle_class_t cls,
                    uint64_t timeout_ms, int nowait,
                    throttle_ticket_t **out, uint64_t *wait_ms) {
  if (h == NULL || out == NULL ||
      (cls != THROTTLE_CLASS_LIVE && cls != THROTTLE_CLASS_BACKFILL))
    return THROTTLE_EINVAL;
  *out = NULL;
  if (h->ro_src != NULL)
    return throttle__readonly_fail(h, "admit a request");
  size_t len;
  int rc = throttle__check_key(h, key, &len);
  if (rc != 0)
    return rc;
  throttle_ticket_t *t = throttle__ticket_new(h, key, len, cls);
  if (t == NULL)
    return throttle__fail(h, THROTTLE_ENOMEM, "out of memory");
  return h->ops->enter(h, key, t, timeout_ms, nowait, out, wait_ms);
}

THROTTLE_EXTERN int throttle_enter(throttle_t *h, const char *key,
                                   throttle_class_t cls, uint64_t timeout_ms,
                                   throttle_ticket_t **ticket) {
  return do_enter(h, key, cls, timeout_ms, 0, ticket, NULL);
}

THROTTLE_EXTERN int throttle_try_enter(throttle_t *h, const char *key,
                                       throttle_class_t cls,
                                       throttle_ticket_t **ticket,
                                       uint64_t *wait_ms) {
  if (wait_ms != NULL)
    *wait_ms = 0;
  return do_enter(h, key, cls, 0, 1, ticket, wait_ms);
}

THROTTLE_EXTERN int throttle_ticket_is_probe(const throttle_ticket_t *t) {
  return t != NULL && t->probe;
}

/* t must be h's; an unknown outcome still gives the slot back, as
 * abandoned, and is reported after. */
static int check_report(throttle_t *h, throttle_ticket_t *t,
                        throttle_outcome_t *outcome, uint64_t *retry_after_ms,
                        int *bad_outcome) {
  if (h == NULL || t == NULL || t->h != h) {
    throttle__free(t);
    return THROTTLE_EINVAL;
  }
  *bad_outcome = (unsigned)*outcome > THROTTLE_OUTCOME_ABANDONED;
  if (*bad_outcome) {
    *outcome = THROTTLE_OUTCOME_ABANDONED;
    *retry_after_ms = 0;
  }
  return 0;
}

THROTTLE_EXTERN int throttle_leave(throttle_t *h, throttle_ticket_t *t,
                                   throttle_outcome_t outcome,
                                   uint64_t retry_after_ms) {
  int bad;
  int rc = check_report(h, t, &outcome, &retry_after_ms, &bad);
  if (rc != 0)
    return rc;
  return h->ops->leave(h, t, outcome, retry_after_ms, bad);
}

THROTTLE_EXTERN int throttle_requeue(throttle_t *h, throttle_ticket_t **ticket,
                                     throttle_outcome_t outcome,
                                     uint64_t retry_after_ms,
                                     uint64_t timeout_ms) {
  if (ticket == NULL)
    return THROTTLE_EINVAL;
  throttle_ticket_t *t = *ticket;
  *ticket = NULL;
  int bad;
  int rc = check_report(h, t, &outcome, &retry_after_ms, &bad);
  if (rc != 0)
    return rc;
  return h->ops->requeue(h, t, outcome, retry_after_ms, bad, timeout_ms,
                         ticket);
}
