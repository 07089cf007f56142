/* SPDX-License-Identifier: MIT */
/*
 * segment_table.c — the host's segment as a backend: its one table of
 * operations (backend.h), which every handle uses unless a backend across
 * hosts is opened in front of it (api/backend.c, whose table falls back to
 * this one).  The operations are in segment_backoff.c (the not-before) and
 * gate_enter.c (admission).
 */
#include "backend.h"

const struct throttle__ops throttle__segment_ops = {
    .name = "shm",
    .backoff = throttle__seg_backoff,
    .remaining = throttle__seg_remaining,
    .wait = throttle__seg_wait,
    .clear = throttle__seg_clear,
    .reset = throttle__seg_reset,
    .info = throttle__seg_info,
    .foreach = throttle__seg_foreach,
    .enter = throttle__seg_enter,
    .leave = throttle__seg_leave,
    .requeue = throttle__seg_requeue,
    .set = throttle__seg_set,
    .set_max_delay = throttle__seg_set_max_delay,
    .note_refusal = throttle__seg_note_refusal,
    .stats = throttle__seg_stats,
};
