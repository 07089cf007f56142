/* SPDX-License-Identifier: MIT */
/*
 * ctl_refusal.c — what the server said when it last refused a key
 * (throttle_info_refusal()), as `show`, `show --json`, `ls --json`, `watch`
 * and `metrics` print it: one line of words, one JSON object, one gauge.
 * The library keeps the words as UTF-8 without control bytes; they are
 * still written through the one terminal filter (ctl_text_put) and the
 * JSON string writer, as any text from shared memory is.
 */
#include "ctl.h"

#include <string.h>
#include <time.h>

void ctl_refusal_take(const throttle_info_t *info, struct ctl_refusal *r) {
  const char *code, *msg, *ra, *host;
  memset(r, 0, sizeof *r);
  if (throttle_info_refusal(info, &r->status, &code, &msg, &ra, &r->at_ms,
                            &r->pid, &host) != 0) {
    r->status = 0;
    return;
  }
  snprintf(r->code, sizeof r->code, "%s", code);
  snprintf(r->msg, sizeof r->msg, "%s", msg);
  snprintf(r->ra, sizeof r->ra, "%s", ra);
  snprintf(r->host, sizeof r->host, "%s", host);
}

/* Now on the wall clock, in ms since the epoch (what the notes are in). */
static int64_t wall_ms(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
    return 0;
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ctl_refusal_ago_ms(const struct ctl_refusal *r) {
  int64_t now = wall_ms();
  return now > r->at_ms ? now - r->at_ms : 0;
}

void ctl_refusal_text(const struct ctl_refusal *r, bool comm, char *buf,
                      size_t len) {
  if (r->status == 0) {
    snprintf(buf, len, "none");
    return;
  }
  char code[4 * sizeof r->code], msg[4 * sizeof r->msg], ra[4 * sizeof r->ra],
      host[4 * sizeof r->host], ago[32], name[CTL_COMM_MAX];
  size_t n = (size_t)snprintf(buf, len, "%d", r->status);
  if (r->code[0] && n < len)
    n += (size_t)snprintf(buf + n, len - n, " %s",
                          ctl_key_text(r->code, code, sizeof code));
  if (r->msg[0] && n < len)
    n += (size_t)snprintf(buf + n, len - n, " \"%s\"",
                          ctl_key_text(r->msg, msg, sizeof msg));
  if (n < len)
    n += (size_t)snprintf(buf + n, len - n, ", Retry-After %s",
                          r->ra[0] ? ctl_key_text(r->ra, ra, sizeof ra) : "none");
  if (n < len)
    n += (size_t)snprintf(buf + n, len - n, ", %s ago, pid %lld",
                          ctl_human_ms(ctl_refusal_ago_ms(r), false, ago,
                                       sizeof ago),
                          (long long)r->pid);
  /* The process name only when asked (show: this host's pid, looked up
   * now, so a hint) */
  if (comm && n < len && *ctl_comm(r->pid, name, sizeof name) != 0)
    n += (size_t)snprintf(buf + n, len - n, " %s", name);
  if (r->host[0] && n < len)
    snprintf(buf + n, len - n, " (host %s)", ctl_key_text(r->host, host, sizeof host));
}

void ctl_refusal_json(FILE *f, const struct ctl_refusal *r) {
  fputs(",\"last_refusal\":", f);
  if (r->status == 0) {
    fputs("null", f);
    return;
  }
  fprintf(f, "{\"status\":%d,\"code\":", r->status);
  ctl_json_string(f, r->code);
  fputs(",\"message\":", f);
  ctl_json_string(f, r->msg);
  fputs(",\"retry_after\":", f);
  ctl_json_string(f, r->ra);
  fprintf(f, ",\"at_ms\":%lld,\"ago_ms\":%lld,\"pid\":%lld,\"host\":",
          (long long)r->at_ms, (long long)ctl_refusal_ago_ms(r),
          (long long)r->pid);
  ctl_json_string(f, r->host);
  fputc('}', f);
}
