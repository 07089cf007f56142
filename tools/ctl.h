/* SPDX-License-Identifier: MIT */
/*
 * ctl.h — what the files of throttlectl share.  throttlectl.c owns the
 * command and option tables, the argument parser, help and main;
 * ctl_open.c checking the segment's name, opening it, and `rm`; ctl_out.c
 * the output helpers (messages, human durations, JSON strings, text
 * tables); ctl_keys.c `ls` and `show`; ctl_backoff.c `backoff`, `wait`,
 * `clear`, `reset` and `max-delay`; ctl_control.c `set`, `pause`,
 * `resume` and `cancel`; ctl_run.c `run`; ctl_http.c `http`; ctl_check.c
 * the checks of option values; ctl_duration.c the one duration
 * syntax; ctl_env.c the environment; ctl_segments.c `segments` and read-only
 * opening; ctl_watch.c `watch`; ctl_metrics.c `metrics`.  Names shared
 * between these files start with ctl_.
 */
#ifndef THROTTLECTL_CTL_H
#define THROTTLECTL_CTL_H

#include "throttle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sysexits.h>

#define PROG "throttlectl"

/* Exit statuses (DESIGN.md): 0, 1, EX_USAGE (64), EX_TEMPFAIL (75).  `run`
 * also passes on its command's status. */
enum { XIT_OK = 0, XIT_FAIL = 1, XIT_USAGE = EX_USAGE, XIT_TEMP = EX_TEMPFAIL };

#define KEY_MAX 255
/* A key as text: every byte may become "\xHH". */
#define KEY_TEXT_MAX (4 * KEY_MAX + 1)

/* Largest fixed cap: the library keeps this many participant slots per key
 * and refuses a larger cap. */
#define CAP_MAX 32

/* Options a command may take, in the order usage lines show them.
 * --segment and --help are taken by every command and handled by the
 * parser itself. */
enum opt_id {
  OPT_JSON,
  OPT_REQUEST,     /* http: -X */
  OPT_HEADER,      /* http: -H, repeatable */
  OPT_DATA,        /* http: -d, repeatable */
  OPT_DATA_BINARY, /* http */
  OPT_OUTPUT,      /* http: -o */
  OPT_VERBOSE,     /* http: -v */
  OPT_COMPRESSED,  /* http */
  OPT_CLASS,
  OPT_MAX_PARALLEL,
  OPT_RATE,
  OPT_BACKFILL_SHARE,
  OPT_RETRIES,
  OPT_TIMEOUT,
  OPT_INTERVAL, /* watch */
  OPT_PUBLISH, /* http: repeatable */
  OPT_STATUS,  /* backoff: what the server said */
  OPT_CODE,
  OPT_MESSAGE,
  OPT_COUNT_
};
#define OPT(id) (1u << (id))

/* How a command needs the segment. */
enum open_mode {
  OPEN_NONE,      /* works on the name only */
  OPEN_ATTACH,    /* an existing segment; never creates one */
  OPEN_CREATE,    /* creates the segment when absent, as a library user would */
  OPEN_FAIL_OPEN, /* as OPEN_CREATE, but an unusable segment is a warning:
                     the command carries on with the library's
                     process-private fallback (`run`, `http`) */
  OPEN_READ,      /* as OPEN_ATTACH, but a segment this user may read and
                     not write (another user's) is opened read-only
                     (ctl_segments.c): `ls`, `show`, `watch`, `metrics` */
};

struct ctx;

struct command {
  const char *name;
  const char *args;    /* positional arguments, for usage lines */
  const char *trailer; /* after the options ("-- CMD [ARG...]"), or NULL */
  const char *summary;
  int min_args, max_args;
  unsigned opts;  /* OPT() bits of the options it takes */
  bool key_first; /* the first positional is a key (validated) */
  bool cmd_line;  /* positionals after the first are a command line: the
                     first of them ends the options */
  enum open_mode open;
  /* Before opening the segment: 0, XIT_USAGE, or XIT_FAIL (e.g. an input
   * file that cannot be read); may be NULL. */
  int (*check)(struct ctx *c);
  int (*run)(struct ctx *c);
  /* Help for an option where this command's meaning differs from the
   * table's (indexed by opt_id; NULL entries use the table's); may be
   * NULL. */
  const char *const *opt_help;
};

/* One invocation: what was parsed, then the open handle. */
struct ctx {
  const struct command *cmd;
  const char *segment; /* --segment, or NULL for $THROTTLE_SEGMENT/default */
  char **args;         /* positionals (points into argv), NULL-terminated */
  int nargs;
  const char *opt[OPT_COUNT_];   /* argument ("" for a flag) when given; the
                                    last one of a repeatable option */
  const char **list[OPT_COUNT_]; /* every argument of a repeatable option,
                                    in order (NULL when not given) */
  int nlist[OPT_COUNT_];
  /* Values checked before the segment is opened. */
  uint64_t ms;           /* backoff: the delay */
  int status;            /* backoff --status: 0 = none */
  uint64_t timeout_ms;   /* wait, run, http: THROTTLE_FOREVER without
                            --timeout */
  uint32_t max_parallel; /* --max-parallel: 0 = auto */
  uint32_t max_auto;     /* --max-parallel auto:MAX (set): MAX, else 0 */
  uint32_t rate_n;       /* --rate: 0 = off */
  uint64_t rate_period_ms;
  double backfill_share;
  throttle_class_t cls; /* --class */
  int publish_level[4];  /* http --publish, per outcome; 0 = key ... */
  unsigned publish_set;  /* bit o: publish_level[o] given */
  unsigned retries;     /* --retries */
  char *body;           /* http: the request body (-d, --data-binary) */
  size_t body_len;
  bool has_body;
  uint64_t interval_ms;  /* watch: --interval */
  throttle_t *h;
  const char *segname; /* for messages */
  bool readonly;       /* OPEN_READ fell back to a read-only handle */
};

/* ---- messages (ctl_out.c) --------------------------------------------- */

/* "throttlectl: " + message + newline on stderr. */
void ctl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A library failure on c->h: say it with the segment name, and return the
 * exit status for it (ctl_exit_for()). */
int ctl_lib_fail(struct ctx *c, int rc);
/* The exit status for a library code: 0 for 0, 64 for EKEY, 75 for the
 * transient ones (ETIMEDOUT, ELOCKTIMEOUT, EINITTIMEOUT, EWOULDBLOCK: the
 * same call may succeed later), 1 for the rest. */
int ctl_exit_for(int rc);

/* ---- parsing (throttlectl.c) ------------------------------------------ */

/* A usage error: the message, the command's usage line (cmd may be NULL),
 * and XIT_USAGE to return. */
int ctl_usage_error(const struct command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* ctl_duration.c: a duration ("30" seconds, "250ms", "1.5s", "5m",
 * "1h30m", "2d") to milliseconds, rounded up, saturating.  Returns 0, or
 * -1 with what is wrong in why (len bytes; may be NULL). */
int ctl_parse_duration(const char *s, uint64_t *ms, char *why, size_t len);
/* The same for an argument: a usage error naming what ("--timeout") and
 * saying why unless it is a duration from min_ms to max_ms (UINT64_MAX:
 * no bound).  Returns 0 or XIT_USAGE. */
int ctl_check_duration(struct ctx *c, const char *what, const char *s,
                       uint64_t min_ms, uint64_t max_ms, uint64_t *ms);
/* A whole number of digits only, min..max.  Returns 0 or -1. */
int ctl_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Checks of the options set, run and http share; each returns 0 or
 * XIT_USAGE. */
int ctl_check_max_parallel(struct ctx *c);
int ctl_check_timeout(struct ctx *c);
int ctl_check_class(struct ctx *c); /* --class into c->cls (default live) */
/* http --publish SIGNAL=WHERE (repeatable): checked into c, then applied
 * to c->h (a warning when the library refuses). */
int ctl_check_publish(struct ctx *c);
void ctl_apply_publish(struct ctx *c);
/* --retries N (0..RETRIES_MAX) into c->retries, def when absent. */
#define RETRIES_MAX 1000u
int ctl_check_retries(struct ctx *c, unsigned def);
int ctl_check_rate(struct ctx *c);           /* --rate N/PERIOD | off */
int ctl_check_backfill_share(struct ctx *c); /* --backfill-share F */
/* A delay of ms (given: as the user or the server wrote it) that the
 * segment's maximum delay bounds: "warning: WHAT GIVEN is out of range;
 * the segment's maximum delay, ... is used" on stderr, the first time in
 * this invocation only.  Returns ms bounded by that maximum (ms when it
 * cannot be read). */
uint64_t ctl_warn_max_delay(struct ctx *c, const char *what, const char *given,
                            uint64_t ms);

/* ---- output (ctl_out.c) ----------------------------------------------- */

/* Milliseconds as a short human duration (350ms, 4.2s, 3m05s, 2h05m,
 * 3d04h); up rounds up. */
const char *ctl_human_ms(int64_t ms, bool up, char *buf, size_t len);
/* "120/1m", "5/500ms": a rate as --rate takes it. */
const char *ctl_rate_text(int64_t n, int64_t period_ms, char *buf, size_t len);
/* Text from a server or from shared memory, for a terminal: controls (C0,
 * DEL, C1 raw or UTF-8-encoded), bidirectional overrides and bytes that
 * are not UTF-8 shown as \uXXXX / \xHH; LF and TAB pass when lines.  The
 * one function that decides this (ctl_say() uses it for every message). */
void ctl_text_put(FILE *f, const char *s, size_t n, bool lines);
/* The same into out (len bytes, never cutting an escape), for a key or
 * other short text; a key's text fits in KEY_TEXT_MAX. */
char *ctl_key_text(const char *key, char *out, size_t len);
/* The "schema" of every --json document: raised only when a field changes
 * meaning or type (fields are added under the same number). */
#define CTL_JSON_SCHEMA 1
/* A JSON string literal; bytes that are not UTF-8 become U+FFFD. */
void ctl_json_string(FILE *f, const char *s);
/* 1 when s is valid UTF-8. */
int ctl_utf8_valid(const char *s);
/* `"key":"...",`: the key as a JSON string, followed, when the key is not
 * valid UTF-8, by `"key_base64":"..."` with its exact bytes. */
void ctl_json_key(FILE *f, const char *key);
/* A clamped value: "warning: WHAT GIVEN is out of range; USED" on stderr
 * (the exit status does not change). */
void ctl_warn_clamped(const char *what, const char *given, const char *used);
/* "live", "backfill". */
const char *ctl_class_name(throttle_class_t cls);
/* With a backend other than shm, one line: "backend URL: up; ..." or
 * "backend URL: UNREACHABLE for 12s; this host's segment served N calls
 * meanwhile ..." (throttle_backend_status(), after the calls made). */
void ctl_backend_text(FILE *f, const throttle_t *h);
/* After a command: a backend that was unreachable is said on stderr
 * (which served instead), unless the command's own output said it. */
void ctl_backend_warn(const throttle_t *h);
/* `,"backend":"...","backend_up":B,"backend_down_ms":N,
 * "backend_served_meanwhile":N` for a JSON object. */
void ctl_backend_json(FILE *f, const throttle_t *h);
/* The name of process pid on this host (/proc/PID/comm), made safe for a
 * terminal, into buf; "" when it cannot be read (gone, hidden, another
 * PID namespace's pid).  A pid reused since it was recorded names the
 * new process: a hint for an operator, never evidence of who holds. */
#define CTL_COMM_MAX 64
const char *ctl_comm(int64_t pid, char *buf, size_t len);

/* A text table: cells are copied; widths come from the data.  The first
 * row is the header.  Columns are separated by two spaces; the last column
 * has no trailing padding. */
struct ctl_table {
  int ncols;
  const bool *right; /* right-align column i */
  char **cells;      /* nrows * ncols */
  size_t nrows, cap;
};
int ctl_table_add(struct ctl_table *t, char *const *row); /* 0 or -1 */
void ctl_table_print(FILE *f, const struct ctl_table *t, const char *indent);
void ctl_table_free(struct ctl_table *t);

/* ---- the environment (ctl_env.c) --------------------------------------- */

/* Every variable libthrottle or throttlectl reads, NULL-terminated. */
struct ctl_env {
  const char *name, *meaning;
};
extern const struct ctl_env ctl_env_vars[];
/* A warning for each THROTTLE_* variable set that nothing reads. */
void ctl_env_check(void);

/* ---- the last refusal (ctl_refusal.c) ---------------------------------- */

/* What the server said when it last refused a key (throttle_info_refusal):
 * status 0 when none was noted. */
struct ctl_refusal {
  int status;
  int64_t at_ms, pid; /* at_ms: ms since the epoch */
  char code[64], msg[200], ra[64], host[64];
};
void ctl_refusal_take(const throttle_info_t *info, struct ctl_refusal *r);
/* ms since it was noted, by this host's wall clock (0 when ahead). */
int64_t ctl_refusal_ago_ms(const struct ctl_refusal *r);
/* "409 RESOURCE_LOCKED 'table orders is locked', Retry-After 5, 2.1s ago,
 * pid 4242 loader (host b)", or "none"; the process name (looked up now)
 * only when comm. */
void ctl_refusal_text(const struct ctl_refusal *r, bool comm, char *buf,
                      size_t len);
/* `,"last_refusal":{...}` or `,"last_refusal":null` for a JSON object. */
void ctl_refusal_json(FILE *f, const struct ctl_refusal *r);

/* ---- commands in their own files -------------------------------------- */

/* ctl_keys.c: every key's fields (no holders) and the segment's figures,
 * for `metrics` and `watch`.  want (may be NULL) picks the keys kept. */
struct ctl_key {
  char key[KEY_MAX + 1];
  int64_t f[THROTTLE_FIELD_COUNT_];
  /* Its holders as "PID COMM" (this host) or "PID@HOST", comma-separated,
   * "+N" for those that did not fit; "-" for none. */
  char holders[128];
  struct ctl_refusal refusal; /* what the server said last */
};
struct ctl_keys {
  struct ctl_key *v; /* in key order */
  size_t n, cap;
  bool (*want)(const char *key, const void *arg);
  const void *want_arg;
  uint32_t capacity, used;
  uint64_t evictions, repairs;
  char backend[512]; /* throttle_backend() */
  int backend_up;    /* throttle_backend_status() after the snapshot */
  uint64_t backend_down_ms;
};
/* Take a fresh snapshot into k (its earlier keys are dropped): 0, or the
 * exit status after saying what failed. */
int ctl_keys_take(struct ctx *c, struct ctl_keys *k);
void ctl_keys_free(struct ctl_keys *k);

int ctl_cmd_ls(struct ctx *c);     /* ctl_keys.c */
/* ctl_keys.c: a key's STATE cell ("episode,probe,paused,rate 120/1m" or
 * "-") from its THROTTLE_FIELD_COUNT_ fields. */
void ctl_state_text(const int64_t *f, char *buf, size_t len);
int ctl_cmd_show(struct ctx *c);   /* ctl_keys.c */
int ctl_check_run(struct ctx *c);  /* ctl_run.c */
int ctl_cmd_run(struct ctx *c);    /* ctl_run.c */
int ctl_check_http(struct ctx *c); /* ctl_http.c */
int ctl_cmd_http(struct ctx *c);   /* ctl_http.c */
int ctl_open_read(struct ctx *c);      /* ctl_segments.c: OPEN_READ */
int ctl_cmd_segments(struct ctx *c);   /* ctl_segments.c */
int ctl_check_watch(struct ctx *c);    /* ctl_watch.c */
int ctl_cmd_watch(struct ctx *c);      /* ctl_watch.c */
int ctl_cmd_metrics(struct ctx *c);    /* ctl_metrics.c */
int ctl_check_backoff(struct ctx *c);   /* ctl_backoff.c */
int ctl_cmd_backoff(struct ctx *c);     /* ctl_backoff.c */
int ctl_check_wait(struct ctx *c);      /* ctl_backoff.c */
int ctl_cmd_wait(struct ctx *c);        /* ctl_backoff.c */
int ctl_cmd_clear(struct ctx *c);       /* ctl_backoff.c */
int ctl_cmd_reset(struct ctx *c);       /* ctl_backoff.c */
int ctl_check_max_delay(struct ctx *c); /* ctl_backoff.c */
int ctl_cmd_max_delay(struct ctx *c);   /* ctl_backoff.c */
int ctl_check_set(struct ctx *c);       /* ctl_control.c */
int ctl_cmd_set(struct ctx *c);         /* ctl_control.c */
int ctl_cmd_pause(struct ctx *c);       /* ctl_control.c */
int ctl_cmd_resume(struct ctx *c);      /* ctl_control.c */
int ctl_cmd_cancel(struct ctx *c);      /* ctl_control.c */
/* ctl_open.c: before anything is opened, an invalid --segment or
 * $THROTTLE_SEGMENT is a usage error (the library would fall back to the
 * default segment); then the segment opened as c->cmd->open asks, and
 * `rm`.  Each returns 0 or the exit status after saying why. */
int ctl_check_segment_names(struct ctx *c);
int ctl_open_segment(struct ctx *c);
int ctl_cmd_rm(struct ctx *c);

#endif /* THROTTLECTL_CTL_H */
