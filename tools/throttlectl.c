/*
 * throttlectl.c — the command-line tool over include/throttle.h: list and
 * show the keys of a segment, publish, wait for and clear back-offs, remove
 * the segment.  docs/throttlectl.md is its reference.
 *
 * Shape.  A table of commands (name, positional arguments, the options it
 * takes, how it opens the segment, a check run before opening and the
 * handler); one option parser shared by every command; output helpers
 * (human durations, aligned tables, JSON strings, error messages) shared by
 * every printer.  A new command is one row in `commands` and one handler; a
 * new option is one row in `options` and a bit in the commands that take it.
 *
 * Everything is validated before the segment is opened, so a usage error
 * (exit 64) never creates or touches a segment.  A segment that cannot be
 * used is an error (exit 1) for every command: the library's fail-open
 * fallback to process-private memory is right for a loader but would make
 * this tool report or change nothing while claiming success.
 */
#include "throttle.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#define PROG "throttlectl"

/* Exit statuses (DESIGN.md): 0, 1, EX_USAGE (64), EX_TEMPFAIL (75). */
enum { XIT_OK = 0, XIT_FAIL = 1, XIT_USAGE = EX_USAGE, XIT_TEMP = EX_TEMPFAIL };

#define KEY_MAX 255

/* ---- messages --------------------------------------------------------- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(PROG ": ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- options ---------------------------------------------------------- */

/* Options a command may take.  --segment and --help are taken by every
 * command and handled by the parser itself. */
enum opt_id { OPT_JSON, OPT_TIMEOUT, OPT_COUNT_ };
#define OPT(id) (1u << (id))

struct option_spec {
  const char *name; /* "--json" */
  const char *arg;  /* argument name, or NULL for a flag */
  const char *help;
};

static const struct option_spec options[OPT_COUNT_] = {
    [OPT_JSON] = {"--json", NULL, "print JSON instead of text"},
    [OPT_TIMEOUT] = {"--timeout", "SEC",
                     "give up after SEC seconds (decimal allowed); exit 75"},
};

/* ---- commands --------------------------------------------------------- */

/* How a command needs the segment. */
enum open_mode {
  OPEN_NONE,   /* works on the name only */
  OPEN_ATTACH, /* an existing segment; never creates one */
  OPEN_CREATE, /* creates the segment when absent, as a library user would */
};

struct ctx;

struct command {
  const char *name;
  const char *args; /* positional arguments, for usage lines */
  const char *summary;
  int min_args, max_args;
  unsigned opts;         /* OPT() bits of the options it takes */
  bool key_first;        /* the first positional is a key (validated) */
  enum open_mode open;
  int (*check)(struct ctx *c); /* before opening: 0 or XIT_USAGE; may be NULL */
  int (*run)(struct ctx *c);
};

/* One invocation: what was parsed, then the open handle. */
struct ctx {
  const struct command *cmd;
  const char *segment; /* --segment, or NULL for $THROTTLE_SEGMENT/default */
  char **args;         /* positionals (points into argv) */
  int nargs;
  const char *opt[OPT_COUNT_]; /* argument ("" for a flag) when given */
  uint64_t ms;                 /* a duration parsed by the command's check */
  uint64_t timeout_ms;
  throttle_t *h;
  const char *segname; /* for messages */
};

static int cmd_ls(struct ctx *c);
static int cmd_show(struct ctx *c);
static int check_backoff(struct ctx *c);
static int cmd_backoff(struct ctx *c);
static int check_wait(struct ctx *c);
static int cmd_wait(struct ctx *c);
static int cmd_clear(struct ctx *c);
static int cmd_reset(struct ctx *c);
static int cmd_rm(struct ctx *c);

static const struct command commands[] = {
    {"ls", "", "every key: back-off left and counters", 0, 0, OPT(OPT_JSON),
     false, OPEN_ATTACH, NULL, cmd_ls},
    {"show", "KEY", "one key in full", 1, 1, OPT(OPT_JSON), true, OPEN_ATTACH,
     NULL, cmd_show},
    {"backoff", "KEY RETRY_AFTER",
     "publish: KEY opens no sooner than RETRY_AFTER seconds from now", 2, 2, 0,
     true, OPEN_CREATE, check_backoff, cmd_backoff},
    {"wait", "KEY", "block until KEY would admit a request", 1, 1,
     OPT(OPT_TIMEOUT), true, OPEN_CREATE, check_wait, cmd_wait},
    {"clear", "KEY", "drop KEY's back-off and wake its waiters", 1, 1, 0, true,
     OPEN_ATTACH, NULL, cmd_clear},
    {"reset", "", "drop every key's back-off and wake every waiter", 0, 0, 0,
     false, OPEN_ATTACH, NULL, cmd_reset},
    {"rm", "", "remove the segment (the next user recreates it)", 0, 0, 0,
     false, OPEN_NONE, NULL, cmd_rm},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const struct command *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

/* "ls [--json]", "wait KEY [--timeout SEC]" */
static void format_synopsis(const struct command *cmd, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "%s%s%s", cmd->name,
                              *cmd->args ? " " : "", cmd->args);
  for (int o = 0; o < OPT_COUNT_ && n < len; o++)
    if (cmd->opts & OPT(o))
      n += (size_t)snprintf(buf + n, len - n, " [%s%s%s]", options[o].name,
                            options[o].arg ? " " : "",
                            options[o].arg ? options[o].arg : "");
}

static void usage_line(FILE *f, const struct command *cmd) {
  char syn[128];
  format_synopsis(cmd, syn, sizeof syn);
  fprintf(f, "usage: " PROG " [--segment NAME] %s\n", syn);
}

static void help_main(FILE *f) {
  char syn[NCOMMANDS][128];
  int w = 0;
  for (size_t i = 0; i < NCOMMANDS; i++) {
    format_synopsis(&commands[i], syn[i], sizeof syn[i]);
    int n = (int)strlen(syn[i]);
    if (n > w)
      w = n;
  }
  fprintf(f, "usage: " PROG " [--segment NAME] COMMAND [ARGS...]\n"
             "       " PROG " --help | --version\n\n"
             "Inspect and steer the back-offs libthrottle shares between the "
             "processes of this host.\n\ncommands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(f, "  %-*s  %s\n", w, syn[i], commands[i].summary);
  fprintf(f, "\noptions:\n"
             "  --segment NAME  the shm segment (default: $THROTTLE_SEGMENT, "
             "else the per-user one)\n"
             "  -h, --help      this help; COMMAND --help for one command\n"
             "  --version       print the version\n"
             "\nexit status: 0 success, 1 failure, 64 usage error, "
             "75 wait timed out\n");
}

static void help_command(FILE *f, const struct command *cmd) {
  usage_line(f, cmd);
  fprintf(f, "\n%s\n", cmd->summary);
  if (cmd->opts == 0)
    return;
  fprintf(f, "\noptions:\n");
  for (int o = 0; o < OPT_COUNT_; o++) {
    if (!(cmd->opts & OPT(o)))
      continue;
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", options[o].name,
             options[o].arg ? " " : "", options[o].arg ? options[o].arg : "");
    fprintf(f, "  %-16s %s\n", head, options[o].help);
  }
}

/* A usage error: the message, the command's usage line, status 64. */
static int usage_error(const struct command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int usage_error(const struct command *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(PROG ": ", stderr);
  if (cmd != NULL)
    fprintf(stderr, "%s: ", cmd->name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  if (cmd != NULL)
    usage_line(stderr, cmd);
  else
    fprintf(stderr, "usage: " PROG " [--segment NAME] COMMAND [ARGS...]\n");
  fprintf(stderr, "Try '" PROG " %s%s--help' for more.\n",
          cmd != NULL ? cmd->name : "", cmd != NULL ? " " : "");
  return XIT_USAGE;
}

/* ---- parsing ---------------------------------------------------------- */

/* Seconds as "N" or "N.F" (no sign, exponent or spaces) to milliseconds,
 * rounded up so that "come back in 0.0001 s" is never shortened to 0.
 * Saturates at UINT64_MAX (the library clamps to its maximum delay).
 * Returns 0, or -1 when s is not such a number. */
static int parse_seconds(const char *s, uint64_t *ms) {
  const char *p = s;
  uint64_t whole = 0;
  bool sat = false;
  if (*p < '0' || *p > '9')
    return -1;
  for (; *p >= '0' && *p <= '9'; p++) {
    unsigned d = (unsigned)(*p - '0');
    if (whole > (UINT64_MAX - d) / 10)
      sat = true;
    else
      whole = whole * 10 + d;
  }
  uint64_t frac = 0; /* milliseconds */
  if (*p == '.') {
    p++;
    if (*p < '0' || *p > '9')
      return -1;
    int n = 0;
    bool more = false; /* non-zero digits beyond the millisecond */
    for (; *p >= '0' && *p <= '9'; p++) {
      if (n < 3) {
        frac = frac * 10 + (uint64_t)(*p - '0');
        n++;
      } else if (*p != '0') {
        more = true;
      }
    }
    for (; n < 3; n++)
      frac *= 10;
    if (more)
      frac++;
  }
  if (*p != 0)
    return -1;
  if (sat || whole > (UINT64_MAX - frac) / 1000)
    *ms = UINT64_MAX;
  else
    *ms = whole * 1000 + frac;
  return 0;
}

/* An argument that starts an option: "-x" or "--x", but not "-" and not a
 * negative number (so "backoff K -3" reports a bad number, not an unknown
 * option). */
static bool looks_like_option(const char *a) {
  return a[0] == '-' && a[1] != 0 && !(a[1] >= '0' && a[1] <= '9');
}

/* Match "--name" or "--name=value"; *val is the inline value or NULL. */
static bool match_option(const char *a, const char *name, const char **val) {
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return false;
  if (a[n] == 0) {
    *val = NULL;
    return true;
  }
  if (a[n] == '=') {
    *val = a + n + 1;
    return true;
  }
  return false;
}

/* The option's argument: inline ("--x=v") or the next argv element. */
static int option_arg(const struct command *cmd, const char *name,
                      const char *inl, int argc, char **argv, int *i,
                      const char **out) {
  if (inl != NULL) {
    *out = inl;
    return 0;
  }
  if (*i + 1 >= argc)
    return usage_error(cmd, "option %s needs an argument", name);
  *out = argv[++*i];
  return 0;
}

enum { PARSED_HELP = -1 };

/* Options every command takes, wherever they appear: --segment, --help.
 * Returns 1 when a is one (consumed), 0 when it is not, PARSED_HELP, or
 * XIT_USAGE. */
static int common_option(struct ctx *c, int argc, char **argv, int *i) {
  const char *a = argv[*i], *inl;
  if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
    return PARSED_HELP;
  if (match_option(a, "--segment", &inl)) {
    const char *v = NULL;
    if (option_arg(c->cmd, "--segment", inl, argc, argv, i, &v) != 0)
      return XIT_USAGE;
    c->segment = v;
    return 1;
  }
  return 0;
}

/* Parse a command's arguments (after its name): options anywhere, "--"
 * ends them.  Returns 0, PARSED_HELP or XIT_USAGE. */
static int parse_command_args(struct ctx *c, int argc, char **argv) {
  const struct command *cmd = c->cmd;
  c->args = calloc((size_t)argc + 1, sizeof *c->args);
  if (c->args == NULL) {
    say("out of memory");
    return XIT_FAIL;
  }
  bool opts_done = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (opts_done || !looks_like_option(a)) {
      c->args[c->nargs++] = argv[i];
      continue;
    }
    if (strcmp(a, "--") == 0) {
      opts_done = true;
      continue;
    }
    int r = common_option(c, argc, argv, &i);
    if (r == PARSED_HELP || r == XIT_USAGE)
      return r;
    if (r == 1)
      continue;
    bool known = false;
    for (int o = 0; o < OPT_COUNT_ && !known; o++) {
      const char *inl;
      if (!(cmd->opts & OPT(o)) || !match_option(a, options[o].name, &inl))
        continue;
      known = true;
      if (options[o].arg == NULL) {
        if (inl != NULL)
          return usage_error(cmd, "option %s takes no argument",
                             options[o].name);
        c->opt[o] = "";
      } else if (option_arg(cmd, options[o].name, inl, argc, argv, &i,
                            &c->opt[o]) != 0) {
        return XIT_USAGE;
      }
    }
    if (!known)
      return usage_error(cmd, "unknown option '%s'", a);
  }
  if (c->nargs < cmd->min_args)
    return usage_error(cmd, "missing argument (expected %s)", cmd->args);
  if (c->nargs > cmd->max_args)
    return usage_error(cmd, "unexpected argument '%s'",
                       c->args[cmd->max_args]);
  if (cmd->key_first && c->nargs > 0) {
    size_t n = strlen(c->args[0]);
    if (n == 0 || n > KEY_MAX)
      return usage_error(cmd, "KEY must be 1 to %d bytes, not %zu", KEY_MAX,
                         n);
  }
  return 0;
}

/* ---- output helpers --------------------------------------------------- */

static uint64_t div_round(uint64_t a, uint64_t b, bool up) {
  return up ? a / b + (a % b != 0) : a / b;
}

/* Milliseconds as a short human duration: 350ms, 4.2s, 3m05s, 2h05m,
 * 3d04h.  up rounds up (for time still to wait: never shows less than is
 * left, so "0.0s" never appears for a closed key). */
static const char *human_ms(int64_t v, bool up, char *buf, size_t len) {
  uint64_t ms = v < 0 ? 0 : (uint64_t)v, t;
  if (ms < 1000) {
    snprintf(buf, len, "%llums", (unsigned long long)ms);
    return buf;
  }
  if (ms < 60000) {
    if ((t = div_round(ms, 100, up)) < 600) {
      snprintf(buf, len, "%llu.%llus", (unsigned long long)(t / 10),
               (unsigned long long)(t % 10));
      return buf;
    }
    ms = 60000;
  }
  if (ms < 3600000) {
    if ((t = div_round(ms, 1000, up)) < 3600) {
      snprintf(buf, len, "%llum%02llus", (unsigned long long)(t / 60),
               (unsigned long long)(t % 60));
      return buf;
    }
    ms = 3600000;
  }
  if (ms < 86400000) {
    if ((t = div_round(ms, 60000, up)) < 1440) {
      snprintf(buf, len, "%lluh%02llum", (unsigned long long)(t / 60),
               (unsigned long long)(t % 60));
      return buf;
    }
    ms = 86400000;
  }
  t = div_round(ms, 3600000, up);
  snprintf(buf, len, "%llud%02lluh", (unsigned long long)(t / 24),
           (unsigned long long)(t % 24));
  return buf;
}

/* A key for a terminal: control bytes as \xHH, everything else as is.
 * (JSON output is exact; this is for eyes, and keeps a key with a newline
 * or an escape sequence from breaking the table or the terminal.)
 * out must hold 4 * KEY_MAX + 1 bytes. */
static char *key_for_text(const char *key, char *out, size_t len) {
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)key; *p && n + 5 < len;
       p++) {
    if (*p < 0x20 || *p == 0x7f)
      n += (size_t)snprintf(out + n, len - n, "\\x%02x", *p);
    else
      out[n++] = (char)*p;
  }
  out[n] = 0;
  return out;
}

/* Columns a string takes on a UTF-8 terminal, near enough: one per byte
 * that does not continue a multi-byte sequence. */
static size_t text_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    w += (*p & 0xc0) != 0x80;
  return w;
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      fputc('\\', f);
      fputc(*p, f);
    } else if (*p < 0x20) {
      fprintf(f, "\\u%04x", *p);
    } else {
      fputc(*p, f); /* bytes >= 0x80 pass through as they are */
    }
  }
  fputc('"', f);
}

/* A text table: cells are copied; widths come from the data.  The first
 * row is the header.  Columns are separated by two spaces; the last column
 * has no trailing padding. */
struct table {
  int ncols;
  const bool *right; /* right-align column i */
  char **cells;      /* nrows * ncols */
  size_t nrows, cap;
};

static int table_add(struct table *t, char *const *row) {
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    char **cells = realloc(t->cells, cap * (size_t)t->ncols * sizeof *cells);
    if (cells == NULL)
      return -1;
    t->cells = cells;
    t->cap = cap;
  }
  char **dst = &t->cells[t->nrows * (size_t)t->ncols];
  for (int i = 0; i < t->ncols; i++) {
    dst[i] = strdup(row[i]);
    if (dst[i] == NULL) {
      while (i-- > 0)
        free(dst[i]);
      return -1;
    }
  }
  t->nrows++;
  return 0;
}

static void table_print(FILE *f, const struct table *t) {
  size_t *w = calloc((size_t)t->ncols, sizeof *w);
  if (w == NULL)
    return;
  for (size_t r = 0; r < t->nrows; r++)
    for (int i = 0; i < t->ncols; i++) {
      size_t n = text_width(t->cells[r * (size_t)t->ncols + i]);
      if (n > w[i])
        w[i] = n;
    }
  for (size_t r = 0; r < t->nrows; r++) {
    for (int i = 0; i < t->ncols; i++) {
      const char *s = t->cells[r * (size_t)t->ncols + i];
      size_t pad = w[i] - text_width(s);
      bool last = i == t->ncols - 1;
      if (i > 0)
        fputs("  ", f);
      if (t->right[i])
        fprintf(f, "%*s", (int)pad, "");
      fputs(s, f);
      if (!t->right[i] && !last)
        fprintf(f, "%*s", (int)pad, "");
    }
    fputc('\n', f);
  }
  free(w);
}

static void table_free(struct table *t) {
  for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
    free(t->cells[i]);
  free(t->cells);
}

/* ---- the segment ------------------------------------------------------ */

/* A library failure on the open handle: the segment, the library's message
 * (which often names the segment already), and the exit status for it. */
static int lib_fail(struct ctx *c, int rc) {
  const char *msg = throttle_errmsg(c->h);
  if (*msg == 0)
    msg = throttle_strerror(rc);
  if (strstr(msg, c->segname) != NULL)
    say("%s", msg);
  else
    say("%s: %s", c->segname, msg);
  if (rc == THROTTLE_EKEY)
    return XIT_USAGE;
  if (rc == THROTTLE_ETIMEDOUT)
    return XIT_TEMP;
  return XIT_FAIL;
}

/* $THROTTLE_SEGMENT, when set and not empty. */
static const char *env_segment(void) {
  const char *e = getenv("THROTTLE_SEGMENT");
  return e != NULL && *e != 0 ? e : NULL;
}

/* The library falls back to the default segment when $THROTTLE_SEGMENT is
 * invalid; for a tool that can remove segments, acting on another segment
 * than the one named is worse than refusing. */
static int check_segment_names(struct ctx *c) {
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL) {
    say("out of memory");
    return XIT_FAIL;
  }
  int rc = XIT_OK;
  if (c->segment != NULL &&
      throttle_config_set_segment(cfg, c->segment) != 0)
    rc = usage_error(NULL,
                     "invalid segment name '%s' (1 to 200 bytes, no '/' "
                     "after the first)",
                     c->segment);
  else if (c->segment == NULL && env_segment() != NULL &&
           throttle_config_set_segment(cfg, env_segment()) != 0)
    rc = usage_error(NULL,
                     "THROTTLE_SEGMENT='%s' is not a valid segment name (1 "
                     "to 200 bytes, no '/' after the first)",
                     env_segment());
  throttle_config_free(cfg);
  return rc;
}

static int open_segment(struct ctx *c) {
  throttle_config_t *cfg = throttle_config_new();
  if (cfg == NULL) {
    say("out of memory");
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
    say("cannot open the segment: %s", throttle_strerror(rc));
    return XIT_FAIL;
  }
  c->segname = throttle_segment_name(c->h);
  const char *msg = throttle_errmsg(c->h);
  if (rc != 0 || !throttle_is_shared(c->h)) {
    /* The message ends by announcing the private fallback, which this tool
     * does not use: drop that part rather than say something untrue. */
    static const char fallback[] =
        "; falling back to process-private back-off";
    size_t n = strlen(msg), k = sizeof fallback - 1;
    if (n >= k && strcmp(msg + n - k, fallback) == 0)
      n -= k;
    if (n == 0) {
      msg = throttle_strerror(rc);
      n = strlen(msg);
    }
    if (strstr(msg, c->segname) != NULL)
      say("%.*s", (int)n, msg);
    else
      say("%s: %.*s", c->segname, (int)n, msg);
    return XIT_FAIL;
  }
  if (*msg != 0) /* e.g. an invalid $THROTTLE_KEYS, replaced by the default */
    say("warning: %s: %s", c->segname, msg);
  return XIT_OK;
}

/* ---- key snapshots ---------------------------------------------------- */

struct keyrow {
  char key[KEY_MAX + 1];
  int64_t field[THROTTLE_FIELD_COUNT_];
};

static void keyrow_from(struct keyrow *row, const throttle_info_t *info) {
  snprintf(row->key, sizeof row->key, "%s", throttle_info_key(info));
  for (int f = 0; f < THROTTLE_FIELD_COUNT_; f++)
    row->field[f] = throttle_info_get(info, (throttle_field_t)f);
}

struct rows {
  struct keyrow *v;
  size_t n, cap;
};

/* throttle_foreach callback: copy (the snapshot is gone once we return). */
static int collect(const throttle_info_t *info, void *arg) {
  struct rows *rows = arg;
  if (rows->n == rows->cap) {
    size_t cap = rows->cap ? 2 * rows->cap : 64;
    struct keyrow *v = realloc(rows->v, cap * sizeof *v);
    if (v == NULL)
      return 1; /* stops the walk; reported as out of memory */
    rows->v = v;
    rows->cap = cap;
  }
  keyrow_from(&rows->v[rows->n++], info);
  return 0;
}

/* {"key":"...","remaining_ms":N,...}: every field, by its stable name. */
static void key_json(FILE *f, const struct keyrow *row) {
  fputs("{\"key\":", f);
  json_string(f, row->key);
  for (int i = 0; i < THROTTLE_FIELD_COUNT_; i++) {
    const char *name = throttle_field_name((throttle_field_t)i);
    if (name == NULL)
      continue;
    fprintf(f, ",\"%s\":%lld", name, (long long)row->field[i]);
  }
  fputc('}', f);
}

/* ---- commands --------------------------------------------------------- */

enum { COL_KEY, COL_LEFT, COL_PUBLISHES, COL_WAITS, COL_WAITED, COL_LAST,
       COL_PID, COL_IDLE, NCOLS };

static int ls_text(struct ctx *c, const struct rows *rows, uint32_t cap,
                   uint32_t used, uint64_t evictions, uint64_t repairs) {
  static const bool right[NCOLS] = {false, true, true, true,
                                    true,  true, true, true};
  static char *const head[NCOLS] = {"KEY",    "LEFT", "PUBLISHES", "WAITS",
                                    "WAITED", "LAST", "PID",       "IDLE"};
  struct table t = {.ncols = NCOLS, .right = right};
  int rc = table_add(&t, head);
  for (size_t i = 0; i < rows->n && rc == 0; i++) {
    const int64_t *f = rows->v[i].field;
    char key[4 * KEY_MAX + 1], left[32], pubs[24], waits[24], waited[32],
        last[32], pid[24], idle[32];
    char *row[NCOLS] = {key, left, pubs, waits, waited, last, pid, idle};
    key_for_text(rows->v[i].key, key, sizeof key);
    if (f[THROTTLE_FIELD_REMAINING_MS] > 0)
      human_ms(f[THROTTLE_FIELD_REMAINING_MS], true, left, sizeof left);
    else
      snprintf(left, sizeof left, "-");
    snprintf(pubs, sizeof pubs, "%lld", (long long)f[THROTTLE_FIELD_PUBLISHES]);
    snprintf(waits, sizeof waits, "%lld", (long long)f[THROTTLE_FIELD_WAITS]);
    if (f[THROTTLE_FIELD_WAITS] > 0)
      human_ms(f[THROTTLE_FIELD_WAITED_MS], false, waited, sizeof waited);
    else
      snprintf(waited, sizeof waited, "-");
    if (f[THROTTLE_FIELD_PUBLISHES] > 0)
      human_ms(f[THROTTLE_FIELD_LAST_DELAY_MS], false, last, sizeof last);
    else
      snprintf(last, sizeof last, "-");
    if (f[THROTTLE_FIELD_LAST_PUBLISHER_PID] > 0)
      snprintf(pid, sizeof pid, "%lld",
               (long long)f[THROTTLE_FIELD_LAST_PUBLISHER_PID]);
    else
      snprintf(pid, sizeof pid, "-");
    human_ms(f[THROTTLE_FIELD_IDLE_MS], false, idle, sizeof idle);
    rc = table_add(&t, row);
  }
  if (rc != 0) {
    table_free(&t);
    say("out of memory");
    return XIT_FAIL;
  }
  printf("segment %s: %u/%u keys, %llu evictions, %llu repairs\n", c->segname,
         used, cap, (unsigned long long)evictions,
         (unsigned long long)repairs);
  table_print(stdout, &t);
  table_free(&t);
  return XIT_OK;
}

static int cmd_ls(struct ctx *c) {
  uint32_t cap = 0, used = 0;
  uint64_t evictions = 0, repairs = 0;
  int rc = throttle_stats(c->h, &cap, &used, &evictions, &repairs);
  if (rc != 0)
    return lib_fail(c, rc);
  struct rows rows = {0};
  rc = throttle_foreach(c->h, collect, &rows);
  if (rc != 0) {
    free(rows.v);
    if (rc > 0) {
      say("out of memory");
      return XIT_FAIL;
    }
    return lib_fail(c, rc);
  }
  if (c->opt[OPT_JSON] == NULL) {
    rc = ls_text(c, &rows, cap, used, evictions, repairs);
    free(rows.v);
    return rc;
  }
  fputs("{\"segment\":", stdout);
  json_string(stdout, c->segname);
  printf(",\"capacity\":%u,\"used\":%u,\"evictions\":%llu,\"repairs\":%llu,"
         "\"keys\":[",
         cap, used, (unsigned long long)evictions,
         (unsigned long long)repairs);
  for (size_t i = 0; i < rows.n; i++) {
    if (i > 0)
      fputc(',', stdout);
    key_json(stdout, &rows.v[i]);
  }
  fputs("]}\n", stdout);
  free(rows.v);
  return XIT_OK;
}

static int cmd_show(struct ctx *c) {
  throttle_info_t *info;
  int rc = throttle_info(c->h, c->args[0], &info);
  if (rc != 0)
    return lib_fail(c, rc);
  struct keyrow row = {0};
  keyrow_from(&row, info);
  throttle_info_free(info);
  if (c->opt[OPT_JSON] != NULL) {
    key_json(stdout, &row);
    fputc('\n', stdout);
    return XIT_OK;
  }
  char key[4 * KEY_MAX + 1];
  printf("key: %s\n", key_for_text(row.key, key, sizeof key));
  for (int i = 0; i < THROTTLE_FIELD_COUNT_; i++) {
    const char *name = throttle_field_name((throttle_field_t)i);
    if (name != NULL)
      printf("%s: %lld\n", name, (long long)row.field[i]);
  }
  return XIT_OK;
}

static int check_backoff(struct ctx *c) {
  if (parse_seconds(c->args[1], &c->ms) != 0)
    return usage_error(c->cmd,
                       "RETRY_AFTER must be a non-negative number of seconds "
                       "such as 5 or 1.5, not '%s'",
                       c->args[1]);
  return 0;
}

static int cmd_backoff(struct ctx *c) {
  int rc = throttle_backoff(c->h, c->args[0], c->ms);
  return rc != 0 ? lib_fail(c, rc) : XIT_OK;
}

static int check_wait(struct ctx *c) {
  c->timeout_ms = THROTTLE_FOREVER;
  const char *t = c->opt[OPT_TIMEOUT];
  if (t != NULL && parse_seconds(t, &c->timeout_ms) != 0)
    return usage_error(c->cmd,
                       "--timeout must be a non-negative number of seconds "
                       "such as 30 or 0.5, not '%s'",
                       t);
  return 0;
}

static int cmd_wait(struct ctx *c) {
  int rc = throttle_wait(c->h, c->args[0], c->timeout_ms);
  return rc != 0 ? lib_fail(c, rc) : XIT_OK;
}

static int cmd_clear(struct ctx *c) {
  int rc = throttle_clear(c->h, c->args[0]);
  return rc != 0 ? lib_fail(c, rc) : XIT_OK;
}

static int cmd_reset(struct ctx *c) {
  int rc = throttle_reset(c->h);
  return rc != 0 ? lib_fail(c, rc) : XIT_OK;
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

static int cmd_rm(struct ctx *c) {
  int rc = throttle_unlink(c->segment);
  if (rc == 0)
    return XIT_OK;
  int e = errno;
  char name[256];
  rm_name(c, name, sizeof name);
  if (rc == THROTTLE_ENOKEY)
    say("%s: no such segment", name);
  else if (rc == THROTTLE_ESHM)
    say("%s: cannot remove: %s", name, strerror(e));
  else
    say("%s: cannot remove: %s", name, throttle_strerror(rc));
  return XIT_FAIL;
}

/* ---- main ------------------------------------------------------------- */

static int run(int argc, char **argv) {
  struct ctx c = {0};
  int i = 1;
  /* Options before the command. */
  for (; i < argc && looks_like_option(argv[i]); i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf(PROG " %s (libthrottle %s)\n", THROTTLE_VERSION_STRING,
             throttle_version_string());
      return XIT_OK;
    }
    int r = common_option(&c, argc, argv, &i);
    if (r == PARSED_HELP) {
      help_main(stdout);
      return XIT_OK;
    }
    if (r == XIT_USAGE)
      return r;
    if (r == 0)
      return usage_error(NULL, "unknown option '%s'", argv[i]);
  }
  if (i >= argc)
    return usage_error(NULL, "no command given");
  c.cmd = find_command(argv[i]);
  if (c.cmd == NULL)
    return usage_error(NULL, "unknown command '%s'", argv[i]);
  int rc = parse_command_args(&c, argc - i - 1, argv + i + 1);
  if (rc == PARSED_HELP) {
    help_command(stdout, c.cmd);
    rc = XIT_OK;
    goto out;
  }
  if (rc != 0)
    goto out;
  if ((rc = check_segment_names(&c)) != 0)
    goto out;
  if (c.cmd->check != NULL && (rc = c.cmd->check(&c)) != 0)
    goto out;
  if (c.cmd->open != OPEN_NONE && (rc = open_segment(&c)) != 0)
    goto out;
  rc = c.cmd->run(&c);
out:
  throttle_close(c.h);
  free(c.args);
  return rc;
}

int main(int argc, char **argv) {
  int rc = run(argc, argv);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    say("write error on standard output: %s", strerror(errno));
    if (rc == XIT_OK)
      rc = XIT_FAIL;
  }
  return rc;
}
