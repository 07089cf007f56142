/* SPDX-License-Identifier: MIT */
/*
 * throttlectl.c — the command-line tool over include/throttle.h: list and
 * show the keys of a segment, publish, wait for and clear back-offs, change
 * a key's settings, pause, resume and cancel it, run a command or send an
 * HTTP request under its admission, remove the segment.
 * docs/throttlectl.md is its reference.
 *
 * Shape.  A table of commands (name, positional arguments, the options it
 * takes, how it opens the segment, a check run before opening and the
 * handler); one option parser shared by every command; output helpers
 * (ctl_out.c) shared by every printer.  A new command is one row in
 * `commands` and one handler; a new option is one row in `options` and a
 * bit in the commands that take it.  The handlers live in files by
 * family (ctl_keys.c, ctl_backoff.c, ctl_control.c, ctl_run.c,
 * ctl_http.c, ctl_watch.c, ctl_metrics.c, ctl_segments.c), opening the
 * segment and `rm` in ctl_open.c, the checks of option values in
 * ctl_check.c; ctl.h is what the files share.
 *
 * Everything is validated before the segment is opened, so a usage error
 * (exit 64) never creates or touches a segment.  A segment that cannot be
 * used is an error (exit 1) for every command but `run`: the library's
 * fail-open fallback to process-private memory is right for a loader but
 * would make this tool report or change nothing while claiming success.
 * `run` and `http` are loaders, so they warn and carry on (I7).
 */
#include "ctl.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- options ---------------------------------------------------------- */

struct option_spec {
  const char *name;       /* "--json" */
  const char *short_name; /* "-X" (as curl spells it), or NULL */
  const char *arg;        /* argument name, or NULL for a flag */
  const char *help;
  bool repeat; /* may be given more than once: every value is kept */
};

static const struct option_spec options[OPT_COUNT_] = {
    [OPT_JSON] = {"--json", NULL, NULL, "print JSON instead of text"},
    [OPT_REQUEST] = {"--request", "-X", "METHOD",
                     "the request method (default GET, or POST with a body)"},
    [OPT_HEADER] = {"--header", "-H", "'NAME: VALUE'",
                    "add a request header (repeatable)", .repeat = true},
    [OPT_DATA] = {"--data", "-d", "DATA|@FILE",
                  "send DATA, or FILE without CR and LF (@- stdin); "
                  "repeats join with &",
                  .repeat = true},
    [OPT_DATA_BINARY] = {"--data-binary", NULL, "DATA|@FILE",
                         "send DATA, or FILE's bytes exactly (@- stdin)"},
    [OPT_OUTPUT] = {"--output", "-o", "FILE",
                    "write a 2xx answer's body to FILE instead of stdout"},
    [OPT_VERBOSE] = {"--verbose", "-v", NULL,
                     "log attempts, answers and waits, and a failed "
                     "answer's body, on stderr"},
    [OPT_COMPRESSED] = {"--compressed", NULL, NULL,
                        "ask for a compressed answer and decode it (as "
                        "curl --compressed)"},
    [OPT_CLASS] = {"--class", NULL, "live|backfill",
                   "admission class (default live): live is admitted "
                   "before backfill"},
    [OPT_MAX_PARALLEL] = {"--max-parallel", NULL, "N|auto[:MAX]",
                          "at most N (1 to 32) admissions of KEY at once; "
                          "auto: learned from lock answers"},
    [OPT_RATE] = {"--rate", NULL, "N/PERIOD",
                  "at most N admissions per PERIOD (a DURATION: 500ms, 1s, "
                  "1m, 1h); off: no rate"},
    [OPT_BACKFILL_SHARE] = {"--backfill-share", NULL, "F",
                            "backfill may hold at most F (0 to 1) of the cap"},
    [OPT_RETRIES] = {"--retries", NULL, "N",
                     "retry up to N times while CMD exits 75 (default 5)"},
    [OPT_TIMEOUT] = {"--timeout", NULL, "DURATION",
                     "give up waiting after DURATION in all; exit 75"},
    [OPT_INTERVAL] = {"--interval", NULL, "DURATION",
                      "refresh every DURATION (default 1s; 100ms to 1h)"},
    [OPT_PUBLISH] = {"--publish", NULL, "SIGNAL=WHERE",
                     "where a back-off goes: SIGNAL locked, 429 or 503; "
                     "WHERE key, root (KEY's first part) or N (its first N "
                     "parts); default locked=key 429=root 503=root "
                     "(repeatable)",
                     .repeat = true},
    [OPT_STATUS] = {"--status", NULL, "N",
                    "keep what the server said: its HTTP status (100 to "
                    "999), shown by show, watch and metrics"},
    [OPT_CODE] = {"--code", NULL, "CODE",
                  "with --status: the answer's error.code"},
    [OPT_MESSAGE] = {"--message", NULL, "TEXT",
                     "with --status: the answer's error.message"},
};

/* Where `http` means something else by a shared option. */
static const char *const http_help[OPT_COUNT_] = {
    [OPT_RETRIES] = "re-send a transient answer up to N times (default 10)",
    [OPT_TIMEOUT] = "give up after DURATION in all, waiting and sending; "
                    "exit 75.  Without it each transfer may take 300 s",
};

/* Where `metrics` means something else by a shared option. */
static const char *const metrics_help[OPT_COUNT_] = {
    [OPT_OUTPUT] = "write to FILE atomically (a temporary file renamed), "
                   "e.g. for node_exporter's textfile collector",
};

/* ---- commands --------------------------------------------------------- */

static const struct command commands[] = {
    {.name = "ls",
     .args = "[PATTERN...]",
     .summary = "every key (or those matching a PATTERN, e.g. 'hotdata:*'): "
                "back-off, in flight/cap, waiters, counters",
     .max_args = INT_MAX,
     .opts = OPT(OPT_JSON),
     .open = OPEN_READ,
     .run = ctl_cmd_ls},
    {.name = "show",
     .args = "KEY",
     .summary = "one key in full, with the holders of its admissions",
     .min_args = 1,
     .max_args = 1,
     .opts = OPT(OPT_JSON),
     .key_first = true,
     .open = OPEN_READ,
     .run = ctl_cmd_show},
    {.name = "backoff",
     .args = "KEY RETRY_AFTER",
     .summary = "publish: KEY opens no sooner than RETRY_AFTER (a DURATION) "
                "from now",
     .min_args = 2,
     .max_args = 2,
     .opts = OPT(OPT_STATUS) | OPT(OPT_CODE) | OPT(OPT_MESSAGE),
     .key_first = true,
     .open = OPEN_CREATE,
     .check = ctl_check_backoff,
     .run = ctl_cmd_backoff},
    {.name = "wait",
     .args = "KEY",
     .summary = "block until KEY would admit a request",
     .min_args = 1,
     .max_args = 1,
     .opts = OPT(OPT_TIMEOUT),
     .key_first = true,
     .open = OPEN_CREATE,
     .check = ctl_check_wait,
     .run = ctl_cmd_wait},
    {.name = "clear",
     .args = "KEY",
     .summary = "drop KEY's back-off and wake its waiters",
     .min_args = 1,
     .max_args = 1,
     .key_first = true,
     .open = OPEN_ATTACH,
     .run = ctl_cmd_clear},
    {.name = "reset",
     .args = "",
     .summary = "drop every key's back-off and wake every waiter",
     .open = OPEN_ATTACH,
     .run = ctl_cmd_reset},
    {.name = "max-delay",
     .args = "[DURATION]",
     .summary = "the longest back-off the segment stores for anyone: show "
                "it, or set it to DURATION",
     .max_args = 1,
     .open = OPEN_CREATE,
     .check = ctl_check_max_delay,
     .run = ctl_cmd_max_delay},
    {.name = "set",
     .args = "KEY",
     .summary = "change KEY's cap, rate or backfill share",
     .min_args = 1,
     .max_args = 1,
     .opts = OPT(OPT_MAX_PARALLEL) | OPT(OPT_RATE) | OPT(OPT_BACKFILL_SHARE),
     .key_first = true,
     .open = OPEN_CREATE,
     .check = ctl_check_set,
     .run = ctl_cmd_set},
    {.name = "pause",
     .args = "KEY",
     .summary = "hold new admissions of KEY (in-flight ones finish)",
     .min_args = 1,
     .max_args = 1,
     .key_first = true,
     .open = OPEN_CREATE,
     .run = ctl_cmd_pause},
    {.name = "resume",
     .args = "KEY",
     .summary = "admit KEY again after a pause",
     .min_args = 1,
     .max_args = 1,
     .key_first = true,
     .open = OPEN_ATTACH,
     .run = ctl_cmd_resume},
    {.name = "cancel",
     .args = "KEY",
     .summary = "end every waiter of KEY now with \"canceled\"",
     .min_args = 1,
     .max_args = 1,
     .key_first = true,
     .open = OPEN_ATTACH,
     .run = ctl_cmd_cancel},
    {.name = "run",
     .args = "KEY",
     .trailer = "-- CMD [ARG...]",
     .summary = "admit, run CMD, report how it ended; retry on exit 75",
     .min_args = 1,
     .max_args = INT_MAX,
     .opts = OPT(OPT_CLASS) | OPT(OPT_MAX_PARALLEL) | OPT(OPT_RETRIES) |
             OPT(OPT_TIMEOUT),
     .key_first = true,
     .cmd_line = true,
     .open = OPEN_FAIL_OPEN,
     .check = ctl_check_run,
     .run = ctl_cmd_run},
    {.name = "http",
     .args = "KEY",
     .trailer = "URL",
     .summary = "send one HTTP request admitted by KEY; retry while transient",
     .min_args = 1,
     .max_args = 2,
     .opts = OPT(OPT_REQUEST) | OPT(OPT_HEADER) | OPT(OPT_DATA) |
             OPT(OPT_DATA_BINARY) | OPT(OPT_OUTPUT) | OPT(OPT_VERBOSE) |
             OPT(OPT_COMPRESSED) | OPT(OPT_CLASS) | OPT(OPT_MAX_PARALLEL) | OPT(OPT_RETRIES) |
             OPT(OPT_PUBLISH) |
             OPT(OPT_TIMEOUT),
     .key_first = true,
     .open = OPEN_FAIL_OPEN,
     .check = ctl_check_http,
     .run = ctl_cmd_http,
     .opt_help = http_help},
    {.name = "rm",
     .args = "",
     .summary = "remove the segment (the next user recreates it)",
     .open = OPEN_NONE,
     .run = ctl_cmd_rm},
    {.name = "watch",
     .args = "[KEY...]",
     .summary = "live view of the keys (or of KEYs and the keys below "
                "them); q quits",
     .max_args = INT_MAX,
     .opts = OPT(OPT_INTERVAL),
     .open = OPEN_READ,
     .check = ctl_check_watch,
     .run = ctl_cmd_watch},
    {.name = "metrics",
     .args = "",
     .summary = "every key and the segment in Prometheus text format",
     .opts = OPT(OPT_OUTPUT),
     .open = OPEN_NONE, /* opened by ctl_cmd_metrics, which tells a failure */
     .run = ctl_cmd_metrics,
     .opt_help = metrics_help},
    {.name = "segments",
     .args = "",
     .summary = "the libthrottle segments on this host: owner, size, keys",
     .opts = OPT(OPT_JSON),
     .open = OPEN_NONE,
     .run = ctl_cmd_segments},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const struct command *find_command(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

/* "ls [--json]", "run KEY [--class live|backfill] ... -- CMD [ARG...]",
 * "http KEY [-X METHOD] [-H 'NAME: VALUE']... URL": an option that has a
 * short name is shown by it. */
static void format_synopsis(const struct command *cmd, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "%s%s%s", cmd->name,
                              *cmd->args ? " " : "", cmd->args);
  for (int o = 0; o < OPT_COUNT_ && n < len; o++)
    if (cmd->opts & OPT(o))
      n += (size_t)snprintf(
          buf + n, len - n, " [%s%s%s]%s",
          options[o].short_name ? options[o].short_name : options[o].name,
          options[o].arg ? " " : "", options[o].arg ? options[o].arg : "",
          options[o].repeat ? "..." : "");
  if (cmd->trailer != NULL && n < len)
    snprintf(buf + n, len - n, " %s", cmd->trailer);
}

#define SYNOPSIS_MAX 256

static void usage_line(FILE *f, const struct command *cmd) {
  char syn[SYNOPSIS_MAX];
  format_synopsis(cmd, syn, sizeof syn);
  fprintf(f, "usage: " PROG " [--segment NAME] %s\n", syn);
}

static void help_main(FILE *f) {
  /* Synopses longer than this get their summary on the next line. */
  enum { WIDE = 36 };
  char syn[NCOMMANDS][SYNOPSIS_MAX];
  int w = 0;
  for (size_t i = 0; i < NCOMMANDS; i++) {
    format_synopsis(&commands[i], syn[i], sizeof syn[i]);
    int n = (int)strlen(syn[i]);
    if (n > w && n <= WIDE)
      w = n;
  }
  fprintf(f, "usage: " PROG " [--segment NAME] COMMAND [ARGS...]\n"
             "       " PROG " --help | --version\n\n"
             "Inspect and steer the back-offs and admissions libthrottle "
             "shares between the\nprocesses of this host.\n\ncommands:\n");
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if ((int)strlen(syn[i]) > w)
      fprintf(f, "  %s\n  %-*s  %s\n", syn[i], w, "", commands[i].summary);
    else
      fprintf(f, "  %-*s  %s\n", w, syn[i], commands[i].summary);
  }
  fprintf(f, "\noptions:\n"
             "  --segment NAME  the shm segment (default: $THROTTLE_SEGMENT, "
             "else the per-user one)\n"
             "  --backend URL   shm (default: $THROTTLE_BACKEND, else shm), "
             "redis://[:PW@]HOST[:PORT][/DB]\n"
             "                  or unix:///PATH[?db=N]: share keys across "
             "hosts through Redis\n"
             "  -h, --help      this help; COMMAND --help for one command\n"
             "  --version       print the version\n"
             "\nDURATION: 30 (seconds), 1.5s, 250ms, 5m, 1h30m, 2d\n"
             "\nenvironment:\n");
  for (const struct ctl_env *v = ctl_env_vars; v->name != NULL; v++)
    fprintf(f, "  %-26s %s\n", v->name, v->meaning);
  fprintf(f,
             "\nexit status: 0 success, 1 failure, 64 usage error, "
             "75 still closed, locked or\ntransient (timeout, retries "
             "spent); run: CMD's own status otherwise\n");
}

static void help_command(FILE *f, const struct command *cmd) {
  usage_line(f, cmd);
  fprintf(f, "\n%s\n", cmd->summary);
  if (cmd->opts == 0)
    return;
  char head[OPT_COUNT_][64];
  int w = 0;
  for (int o = 0; o < OPT_COUNT_; o++) {
    snprintf(head[o], sizeof head[o], "%s%s%s%s%s",
             options[o].short_name ? options[o].short_name : "",
             options[o].short_name ? ", " : "", options[o].name,
             options[o].arg ? " " : "", options[o].arg ? options[o].arg : "");
    if ((cmd->opts & OPT(o)) && (int)strlen(head[o]) > w)
      w = (int)strlen(head[o]);
  }
  fprintf(f, "\noptions:\n");
  for (int o = 0; o < OPT_COUNT_; o++)
    if (cmd->opts & OPT(o))
      fprintf(f, "  %-*s  %s\n", w, head[o],
              cmd->opt_help != NULL && cmd->opt_help[o] != NULL
                  ? cmd->opt_help[o]
                  : options[o].help);
}

int ctl_usage_error(const struct command *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs(PROG ": ", stderr);
  if (cmd != NULL)
    fprintf(stderr, "%s: ", cmd->name);
  /* va_start is above; the analyzer loses it across the fprintf call (a
   * known false positive of clang-analyzer-valist.Uninitialized). */
  vfprintf(stderr, fmt, ap); // NOLINT(clang-analyzer-valist.Uninitialized)
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

/* ---- parsing numbers -------------------------------------------------- */

int ctl_parse_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  uint64_t v = 0;
  if (*s == 0)
    return -1;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return -1;
    unsigned d = (unsigned)(*p - '0');
    if (d > max || v > (max - d) / 10)
      return -1; /* beyond max, found before it can overflow */
    v = v * 10 + d;
  }
  if (v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

/* ---- parsing arguments ------------------------------------------------ */

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
    return ctl_usage_error(cmd, "option %s needs an argument", name);
  *out = argv[++*i];
  return 0;
}

/* A short option as curl takes it: "-X" alone (its argument is the next
 * word) or, when it takes an argument, followed by it ("-XPOST").  No
 * bundling of flags ("-vo"): -v is the only flag. */
static bool match_short(const char *a, const char *name, bool takes_arg,
                        const char **val) {
  if (name == NULL || a[0] != name[0] || a[1] != name[1])
    return false;
  if (a[2] == 0) {
    *val = NULL;
    return true;
  }
  if (takes_arg) {
    *val = a + 2;
    return true;
  }
  return false;
}

enum { PARSED_HELP = -1 };

/* Options every command takes, wherever they appear: --segment, --backend,
 * --help.
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
  if (match_option(a, "--backend", &inl)) {
    /* Through the environment, so that the library reads it like any
     * program's and a command run by `run` inherits it. */
    const char *v = NULL;
    if (option_arg(c->cmd, "--backend", inl, argc, argv, i, &v) != 0)
      return XIT_USAGE;
    if (v == NULL || setenv("THROTTLE_BACKEND", v, 1) != 0) {
      ctl_say("out of memory");
      return XIT_USAGE;
    }
    return 1;
  }
  return 0;
}

/* Parse a command's arguments (after its name): options anywhere, "--"
 * ends them; for a command that takes a command line, so does its first
 * word (everything from there on is CMD's).  Returns 0, PARSED_HELP or
 * XIT_USAGE. */
static int parse_command_args(struct ctx *c, int argc, char **argv) {
  const struct command *cmd = c->cmd;
  c->args = calloc((size_t)argc + 1, sizeof *c->args);
  if (c->args == NULL) {
    ctl_say("out of memory");
    return XIT_FAIL;
  }
  bool opts_done = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (opts_done || !looks_like_option(a)) {
      if (cmd->cmd_line && c->nargs >= 1)
        opts_done = true;
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
      const char *inl, *name = options[o].name;
      if (!(cmd->opts & OPT(o)))
        continue;
      if (match_short(a, options[o].short_name, options[o].arg != NULL, &inl))
        name = options[o].short_name;
      else if (!match_option(a, name, &inl))
        continue;
      known = true;
      if (options[o].arg == NULL) {
        if (inl != NULL)
          return ctl_usage_error(cmd, "option %s takes no argument", name);
        c->opt[o] = "";
      } else if (option_arg(cmd, name, inl, argc, argv, &i, &c->opt[o]) != 0) {
        return XIT_USAGE;
      }
      if (options[o].repeat) {
        if (c->list[o] == NULL &&
            (c->list[o] = calloc((size_t)argc + 1, sizeof *c->list[o])) ==
                NULL) {
          ctl_say("out of memory");
          return XIT_FAIL;
        }
        c->list[o][c->nlist[o]++] = c->opt[o];
      }
    }
    if (!known)
      return ctl_usage_error(cmd, "unknown option '%s'", a);
  }
  if (c->nargs < cmd->min_args)
    return ctl_usage_error(cmd, "missing argument (expected %s)", cmd->args);
  if (c->nargs > cmd->max_args)
    return ctl_usage_error(cmd, "unexpected argument '%s'",
                           c->args[cmd->max_args]);
  if (cmd->key_first && c->nargs > 0 && throttle_check_key(c->args[0]) != 0)
    return ctl_usage_error(cmd, "KEY: %s", throttle_errmsg(NULL));
  return 0;
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
      return ctl_usage_error(NULL, "unknown option '%s'", argv[i]);
  }
  if (i >= argc)
    return ctl_usage_error(NULL, "no command given");
  ctl_env_check();
  c.cmd = find_command(argv[i]);
  if (c.cmd == NULL)
    return ctl_usage_error(NULL, "unknown command '%s'", argv[i]);
  int rc = parse_command_args(&c, argc - i - 1, argv + i + 1);
  if (rc == PARSED_HELP) {
    help_command(stdout, c.cmd);
    rc = XIT_OK;
    goto out;
  }
  if (rc != 0)
    goto out;
  if ((rc = ctl_check_segment_names(&c)) != 0)
    goto out;
  if (c.cmd->check != NULL && (rc = c.cmd->check(&c)) != 0)
    goto out;
  if (c.cmd->open != OPEN_NONE && (rc = ctl_open_segment(&c)) != 0)
    goto out;
  rc = c.cmd->run(&c);
  ctl_backend_warn(c.h);
out:
  throttle_close(c.h);
  free(c.args);
  for (int o = 0; o < OPT_COUNT_; o++)
    free(c.list[o]);
  free(c.body);
  return rc;
}

int main(int argc, char **argv) {
  int rc = run(argc, argv);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    ctl_say("write error on standard output: %s", strerror(errno));
    if (rc == XIT_OK)
      rc = XIT_FAIL;
  }
  return rc;
}
