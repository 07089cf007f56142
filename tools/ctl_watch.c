/* SPDX-License-Identifier: MIT */
/*
 * ctl_watch.c — `watch`: a live view of a segment's keys, like top(1).
 *
 * Every --interval it takes a snapshot (throttle_foreach, the same one `ls`
 * prints), and shows per key the back-off left, in flight / cap, waiters,
 * and the admissions and refusals (LOCKED outcomes) per second computed
 * from the counters of the previous snapshot and the monotonic time
 * between the two.  On a terminal it draws in place on the alternate
 * screen, shows what changed since the last refresh in bold, fits the rows
 * to the window, and reads single keys (q quits); otherwise it prints
 * plain repeated blocks, with a time stamp each, for a log or a pipe.
 * Ctrl-C, SIGTERM and SIGHUP end it cleanly (terminal restored, exit 0).
 *
 * Rejected: curses (a dependency and a second screen model for one
 * table; the few escape sequences used are ECMA-48 ones every terminal
 * emulator speaks), and redrawing only changed cells (a full redraw of a
 * screenful once a second costs nothing).
 */
#include "ctl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define INTERVAL_DEFAULT_MS 1000u
#define INTERVAL_MIN_MS 100u
#define INTERVAL_MAX_MS 3600000u

int ctl_check_watch(struct ctx *c) {
  const char *v = c->opt[OPT_INTERVAL];
  c->interval_ms = INTERVAL_DEFAULT_MS;
  if (v != NULL) {
    int rc = ctl_check_duration(c, "--interval", v, 0, UINT64_MAX,
                                &c->interval_ms);
    if (rc != 0)
      return rc;
    if (c->interval_ms < INTERVAL_MIN_MS) {
      ctl_warn_clamped("watch: --interval", v, "the minimum, 0.1 s, is used");
      c->interval_ms = INTERVAL_MIN_MS;
    } else if (c->interval_ms > INTERVAL_MAX_MS) {
      ctl_warn_clamped("watch: --interval", v, "the maximum, 3600 s, is used");
      c->interval_ms = INTERVAL_MAX_MS;
    }
  }
  for (int i = 0; i < c->nargs; i++)
    if (throttle_check_key(c->args[i]) != 0)
      return ctl_usage_error(c->cmd, "KEY: %s", throttle_errmsg(NULL));
  return 0;
}

/* ---- snapshots -------------------------------------------------------- */

/* A snapshot and when it was taken. */
struct frame {
  struct ctl_keys k;
  uint64_t mono_ms;
};

/* The keys named, and the keys below them ("ws1" covers "ws1/orders"). */
static bool wanted(const char *key, const void *arg) {
  const struct ctx *c = arg;
  if (c->nargs == 0)
    return true;
  for (int i = 0; i < c->nargs; i++) {
    size_t n = strlen(c->args[i]);
    if (strncmp(key, c->args[i], n) == 0 && (key[n] == 0 || key[n] == '/'))
      return true;
  }
  return false;
}

static uint64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 0, or the exit status after saying what failed. */
static int take(struct ctx *c, struct frame *fr) {
  fr->k.want = wanted;
  fr->k.want_arg = c;
  int rc = ctl_keys_take(c, &fr->k);
  fr->mono_ms = mono_ms();
  return rc;
}

/* The key in the previous frame (both are in key order), or NULL. */
static const struct ctl_key *find_prev(const struct frame *p, const char *key) {
  size_t lo = 0, hi = p->k.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int d = strcmp(p->k.v[mid].key, key);
    if (d == 0)
      return &p->k.v[mid];
    if (d < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

/* ---- cells ------------------------------------------------------------ */

enum {
  W_KEY,
  W_LEFT,
  W_FLIGHT,
  W_WAIT,
  W_ADMIT_RATE,
  W_REFUSED_RATE,
  W_ADMIT,
  W_LOCKED,
  W_STATE,
  W_HOLDERS,
  W_REFUSAL,
  W_NCOLS
};
#define CELL 128

static const char *const w_head[W_NCOLS] = {
    "KEY",   "LEFT",   "FLIGHT", "WAIT",   "ADMIT/s", "REFUSED/s",
    "ADMIT", "LOCKED", "STATE",  "HOLDERS", "LAST REFUSAL"};
static const bool w_right[W_NCOLS] = {false, true, true,  true,  true, true,
                                      true,  true, false, false, false};

/* Per second between two readings of a counter; "-" without a previous
 * one (first frame, or a key new since), and "-" when the counter went
 * down (the key was evicted and made again). */
static void rate_cell(char *buf, const struct ctl_key *prev,
                      const struct ctl_key *w, int field, uint64_t dt_ms) {
  if (prev == NULL || dt_ms == 0 || w->f[field] < prev->f[field]) {
    snprintf(buf, CELL, "-");
    return;
  }
  double r = (double)(w->f[field] - prev->f[field]) * 1000.0 / (double)dt_ms;
  snprintf(buf, CELL, "%.1f", r);
}

/* What the server said last, short: `409 RESOURCE_LOCKED 2.1s ago "table
 * orders is locked by..."` (show has it whole); "-" for none. */
static void refusal_cell(const struct ctl_refusal *r, char *buf) {
  if (r->status == 0) {
    snprintf(buf, CELL, "-");
    return;
  }
  char code[4 * sizeof r->code], msg[48], ago[32];
  int n = snprintf(buf, CELL, "%d%s%s %s ago", r->status, r->code[0] ? " " : "",
                   ctl_key_text(r->code, code, sizeof code),
                   ctl_human_ms(ctl_refusal_ago_ms(r), false, ago, sizeof ago));
  if (r->msg[0] == 0 || n < 0 || n >= CELL)
    return;
  /* The message cut to fit the cell (never inside an escape or a UTF-8
   * sequence: ctl_key_text cuts whole). */
  size_t room = (size_t)(CELL - n) > sizeof msg ? sizeof msg : (size_t)(CELL - n);
  if (room > 8) {
    ctl_key_text(r->msg, msg, room - 6);
    snprintf(buf + n, CELL - (size_t)n, " \"%s%s\"", msg,
             strlen(msg) < strlen(r->msg) ? "..." : "");
  }
}

static void cells(const struct ctl_key *w, const struct ctl_key *prev,
                  uint64_t dt_ms, char out[W_NCOLS][CELL]) {
  const int64_t *f = w->f;
  char key[KEY_TEXT_MAX];
  snprintf(out[W_KEY], CELL, "%s", ctl_key_text(w->key, key, sizeof key));
  if (f[THROTTLE_FIELD_REMAINING_MS] > 0)
    ctl_human_ms(f[THROTTLE_FIELD_REMAINING_MS], true, out[W_LEFT], CELL);
  else
    snprintf(out[W_LEFT], CELL, "-");
  snprintf(out[W_FLIGHT], CELL, "%lld/%lld%s",
           (long long)f[THROTTLE_FIELD_IN_FLIGHT],
           (long long)f[THROTTLE_FIELD_CAP],
           f[THROTTLE_FIELD_CAP_AUTO] ? "*" : "");
  snprintf(out[W_WAIT], CELL, "%lld+%lld",
           (long long)f[THROTTLE_FIELD_WAITING_LIVE],
           (long long)f[THROTTLE_FIELD_WAITING_BACKFILL]);
  rate_cell(out[W_ADMIT_RATE], prev, w, THROTTLE_FIELD_ADMITTED, dt_ms);
  rate_cell(out[W_REFUSED_RATE], prev, w, THROTTLE_FIELD_LOCKED, dt_ms);
  snprintf(out[W_ADMIT], CELL, "%lld", (long long)f[THROTTLE_FIELD_ADMITTED]);
  snprintf(out[W_LOCKED], CELL, "%lld", (long long)f[THROTTLE_FIELD_LOCKED]);
  ctl_state_text(f, out[W_STATE], CELL);
  snprintf(out[W_HOLDERS], CELL, "%s", w->holders);
  refusal_cell(&w->refusal, out[W_REFUSAL]);
}

/* ---- drawing ---------------------------------------------------------- */

static size_t text_width(const char *s) {
  size_t w = 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    w += (*p & 0xc0) != 0x80;
  return w;
}

struct screen {
  bool tty;
  int rows; /* lines available on the terminal (0: unbounded) */
};

static void header(FILE *o, const struct ctx *c, const struct frame *fr,
                   bool tty) {
  char when[16], every[32];
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(when, sizeof when, "%H:%M:%S", &tm);
  ctl_human_ms((int64_t)c->interval_ms, false, every, sizeof every);
  fprintf(o, "%s segment %s%s: %u/%u keys, every %s%s%s", when, c->segname,
          c->readonly ? " (read-only)" : "", fr->k.used, fr->k.capacity, every,
          c->nargs > 0 ? ", filtered" : "", tty ? "; q quits" : "");
  if (strcmp(fr->k.backend, "shm") != 0) {
    char down[32];
    if (fr->k.backend_up)
      fprintf(o, "; backend %s up", fr->k.backend);
    else
      fprintf(o, "; backend %s UNREACHABLE for %s", fr->k.backend,
              ctl_human_ms((int64_t)fr->k.backend_down_ms, false, down,
                           sizeof down));
  }
}

/* One frame.  prev may be empty (first frame). */
static void draw(FILE *o, const struct ctx *c, const struct screen *scr,
                 const struct frame *fr, const struct frame *prev,
                 bool have_prev) {
  size_t n = fr->k.n;
  size_t shown = n;
  if (scr->tty && scr->rows > 3 && shown > (size_t)scr->rows - 3)
    shown = (size_t)scr->rows - 3;
  char(*cell)[W_NCOLS][CELL] = calloc(shown + 1, sizeof *cell);
  char(*old)[W_NCOLS][CELL] = calloc(shown + 1, sizeof *old);
  bool *had = calloc(shown + 1, sizeof *had);
  int64_t *prev_at = calloc(shown + 1, sizeof *prev_at);
  if (cell == NULL || old == NULL || had == NULL || prev_at == NULL) {
    free(cell);
    free(old);
    free(had);
    free(prev_at);
    return;
  }
  uint64_t dt = have_prev ? fr->mono_ms - prev->mono_ms : 0;
  size_t w[W_NCOLS];
  for (int i = 0; i < W_NCOLS; i++)
    w[i] = text_width(w_head[i]);
  for (size_t r = 0; r < shown; r++) {
    const struct ctl_key *p =
        have_prev ? find_prev(prev, fr->k.v[r].key) : NULL;
    cells(&fr->k.v[r], p, dt, cell[r]);
    had[r] = p != NULL;
    if (p != NULL) { /* what the previous frame showed for it */
      cells(p, NULL, 0, old[r]);
      prev_at[r] = p->refusal.at_ms;
    }
    for (int i = 0; i < W_NCOLS; i++)
      if (text_width(cell[r][i]) > w[i])
        w[i] = text_width(cell[r][i]);
  }
  const char *eol = scr->tty ? "\033[K\n" : "\n";
  if (scr->tty)
    fputs("\033[H", o);
  header(o, c, fr, scr->tty);
  fputs(eol, o);
  fputs(eol, o);
  for (int i = 0; i < W_NCOLS; i++) {
    size_t pad = w[i] - text_width(w_head[i]);
    fprintf(o, "%s%*s%s%*s", i ? "  " : "", w_right[i] ? (int)pad : 0, "",
            w_head[i], (!w_right[i] && i < W_NCOLS - 1) ? (int)pad : 0, "");
  }
  fputs(eol, o);
  for (size_t r = 0; r < shown; r++) {
    for (int i = 0; i < W_NCOLS; i++) {
      const char *s = cell[r][i];
      size_t pad = w[i] - text_width(s);
      /* Changed since the last refresh: a key new since, or a cell that
       * reads differently (rates are new every frame: not highlighted). */
      bool hot = scr->tty && have_prev && i != W_ADMIT_RATE &&
                 i != W_REFUSED_RATE && (!had[r] || strcmp(s, old[r][i]) != 0);
      /* the refusal's age changes every frame: hot only for a new one */
      if (hot && i == W_REFUSAL && had[r])
        hot = fr->k.v[r].refusal.at_ms != prev_at[r];
      fprintf(o, "%s%*s%s%s%s%*s", i ? "  " : "", w_right[i] ? (int)pad : 0, "",
              hot ? "\033[1;7m" : "", s, hot ? "\033[0m" : "",
              (!w_right[i] && i < W_NCOLS - 1) ? (int)pad : 0, "");
    }
    fputs(eol, o);
  }
  if (n == 0)
    fprintf(o, "(no keys%s)%s", c->nargs > 0 ? " match" : "", eol);
  else if (shown < n)
    fprintf(o, "... %zu more keys (a larger window, or name KEYs)%s", n - shown,
            eol);
  if (scr->tty)
    fputs("\033[J", o);
  else
    fputc('\n', o);
  fflush(o);
  free(cell);
  free(old);
  free(had);
  free(prev_at);
}

/* ---- the terminal ----------------------------------------------------- */

static volatile sig_atomic_t stop_sig, resized;

static void on_stop(int sig) { stop_sig = sig; }
static void on_winch(int sig) {
  (void)sig;
  resized = 1;
}

static int term_rows(void) {
  struct winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0)
    return ws.ws_row;
  return 24;
}

int ctl_cmd_watch(struct ctx *c) {
  struct screen scr = {.tty = isatty(STDOUT_FILENO) == 1};
  bool keys = scr.tty && isatty(STDIN_FILENO) == 1;
  struct termios saved;
  struct sigaction sa = {0}, old_int, old_term, old_hup, old_winch;
  sa.sa_handler = on_stop; /* no SA_RESTART: poll returns at once */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  sa.sa_handler = on_winch;
  sigaction(SIGWINCH, &sa, &old_winch);
  if (keys && tcgetattr(STDIN_FILENO, &saved) == 0) {
    struct termios raw = saved;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  } else {
    keys = false;
  }
  if (scr.tty)
    fputs("\033[?1049h\033[?25l\033[H\033[2J", stdout); /* alt screen */

  struct frame a = {0}, b = {0};
  struct frame *cur = &a, *prev = &b;
  bool have_prev = false;
  int rc = XIT_OK;
  while (!stop_sig) {
    scr.rows = scr.tty ? term_rows() : 0;
    resized = 0;
    if ((rc = take(c, cur)) != 0)
      break;
    draw(stdout, c, &scr, cur, prev, have_prev);
    struct frame *t = prev;
    prev = cur;
    cur = t;
    have_prev = true;
    /* Sleep until the next refresh, a key, a signal or a resize. */
    uint64_t until = prev->mono_ms + c->interval_ms;
    bool quit = false;
    while (!stop_sig && !resized && !quit) {
      uint64_t now = mono_ms();
      if (now >= until)
        break;
      struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
      int pr = poll(keys ? &pfd : NULL, keys ? 1 : 0, (int)(until - now));
      if (pr > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) &&
          !(pfd.revents & POLLIN))
        keys = false; /* the terminal went away: sleep on, no keys */
      else if (pr > 0) {
        char ch;
        if (read(STDIN_FILENO, &ch, 1) == 1)
          quit = ch == 'q' || ch == 'Q';
        else
          keys = false;
      }
    }
    if (quit)
      break;
  }
  if (scr.tty)
    fputs("\033[?25h\033[?1049l", stdout);
  fflush(stdout);
  if (keys)
    tcsetattr(STDIN_FILENO, TCSANOW, &saved);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  sigaction(SIGWINCH, &old_winch, NULL);
  ctl_keys_free(&a.k);
  ctl_keys_free(&b.k);
  return rc;
}
