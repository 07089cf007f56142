/* SPDX-License-Identifier: MIT */
/*
 * repair.c — the segment made whole again after a process died inside the
 * critical section (segment.c calls it when the robust mutex says so, and
 * when it finds a segment mid-change): the table's index rebuilt from the
 * records (table.c), each record's fields bounded and its gate repaired
 * (gate_rec.c), then the scopes' pool places (scope.c).  Above all three,
 * so that none of them needs to know of the others' repair.
 */
#include "internal.h"

void throttle__repair_locked(throttle_t *h) {
  uint64_t now = throttle__now_ns();
  uint32_t s = atomic_load_explicit(&h->hdr->tseq, memory_order_relaxed);
  atomic_store_explicit(&h->hdr->tseq, s | 1, memory_order_release);
  throttle__rebuild_locked(h);
  for (uint32_t i = 0; i < h->capacity; i++) {
    struct throttle__rec *r = &h->recs[i];
    if (r->state != THROTTLE__REC_USED)
      continue;
    throttle__clamp_nb_locked(h, r, now);
    throttle__gate_repair_locked(h, r);
    if (r->last_use_ns > now)
      r->last_use_ns = now;
  }
  throttle__scope_repair_locked(h); /* pool places of a grant cut short */
  atomic_store_explicit(&h->hdr->tseq, (s | 1) + 1, memory_order_release);
  throttle__scope_touch(h); /* a publish or pause cut short by the crash */
}
