/* SPDX-License-Identifier: MIT */
/*
 * test_redis_faults.c — the Redis backend on an operator's bad day, each
 * against a real redis-server the test starts (redis_helpers.h) and set up
 * the way the fault needs: a holder killed beneath a pool, a script error,
 * an idle timeout that closes pooled connections, blocking commands
 * refused by an ACL, an evicting memory policy, a server that answers
 * anything, passwords and ACL users, a Cluster node, more admissions than
 * one heartbeat round used to carry, a stall longer than a caller's
 * timeout, and a server or a user without Functions.  A "host" is a handle on its own segment name: anything one
 * host sees of another came through Redis.  Skipped without redis-server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "helpers.h"
#include "redis_helpers.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HANG_GUARD_MS 30000

static struct th_redis R;

static int setup(void **state) { return th_redis_setup(state, &R); }
static int teardown(void **state) { return th_redis_teardown(state, &R); }

static void cli6(const char *a, const char *b, const char *c, const char *d,
                 const char *e, const char *f) {
  const char *args[] = {a, b, c, d, e, f, NULL};
  char out[512];
  int st = th_redis_cli_out(&R, args, out, sizeof out);
  if (st != 0 || strncmp(out, "ERR", 3) == 0)
    fail_msg("redis-cli %s %s: %d %s", a, b ? b : "", st, out);
}
#define cli(a, b, c, d, e) cli6(a, b, c, d, e, NULL)

#define host_at th_redis_host
#define field th_field

/* A second host: its own segment, the same Redis. */
#define other_host(fx) th_redis_other_host(fx, R.url)

/* The number after pat in INFO section, 0 when it is not there. */
static long long info_count(const char *section, const char *pat) {
  static char buf[1 << 16];
  const char *args[] = {"INFO", section, NULL};
  if (th_redis_cli_out(&R, args, buf, sizeof buf) != 0)
    fail_msg("INFO %s failed", section);
  const char *p = strstr(buf, pat);
  return p != NULL ? atoll(p + strlen(pat)) : 0;
}

/* The calls Redis counted of one command (INFO commandstats). */
static long long calls_of(const char *cmd) {
  char pat[64];
  snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
  return info_count("commandstats", pat);
}

/* The script calls Redis counted, either way they go. */
static long long script_calls(void) {
  return calls_of("fcall") + calls_of("evalsha") + calls_of("eval");
}

/* The count of one error prefix in INFO errorstats. */
static long long errors_of(const char *prefix) {
  char pat[64];
  snprintf(pat, sizeof pat, "errorstat_%s:count=", prefix);
  return info_count("errorstats", pat);
}

static void enter_leave(throttle_t *h, const char *key) {
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* ---- scripts ------------------------------------------------------------ */

/* The scripts are the functions of one library, called by FCALL, never
 * sent whole: loaded once, and again (once) when the server lost it (a
 * restart empty, a failover, FUNCTION FLUSH). */
static void test_redis_faults_functions_called_and_loaded_again(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  enter_leave(a, "k");
  enter_leave(a, "k/t");
  assert_int_equal(calls_of("function|load"), 1);
  assert_true(calls_of("fcall") >= 4);
  cli("FUNCTION", "FLUSH", NULL, NULL, NULL);
  enter_leave(a, "k");
  throttle_t *b = other_host(fx);
  enter_leave(b, "k");
  assert_int_equal(calls_of("function|load"), 2);
  assert_int_equal(calls_of("evalsha") + calls_of("eval"), 0);
  assert_int_equal(calls_of("script|load"), 0);
  char out[4096];
  const char *args[] = {"FUNCTION", "LIST", NULL};
  assert_int_equal(th_redis_cli_out(&R, args, out, sizeof out), 0);
  assert_true(th_contains(out, "libthrottle_"));
  throttle_close(b);
}

/* A user who may not call Functions (an ACL written for EVALSHA), or who
 * may call but not load them: the same scripts go by EVALSHA, and the
 * handle does not ask again on every call. */
static void test_redis_faults_functions_refused_evalsha(void **state) {
  struct th_fx *fx = *state;
  cli("ACL", "SETUSER", "default", "-fcall", NULL);
  throttle_t *a = th_open(fx);
  enter_leave(a, "k");
  enter_leave(a, "k");
  assert_int_equal(errors_of("NOPERM"), 1);
  assert_int_equal(calls_of("script|load"), 2); /* enter's and leave's */
  assert_true(calls_of("evalsha") >= 2);
  cli("SCRIPT", "FLUSH", NULL, NULL, NULL); /* NOSCRIPT: loaded again */
  enter_leave(a, "k");
  assert_int_equal(calls_of("script|load"), 4);
  cli("ACL", "SETUSER", "default", "+fcall", "-function");
  throttle_t *b = other_host(fx);
  enter_leave(b, "k");
  enter_leave(b, "k");
  assert_int_equal(calls_of("fcall"), 1); /* "not found", then EVALSHA */
  assert_int_equal(calls_of("function|load"), 0);
  assert_int_equal(th_field(b, "k", THROTTLE_FIELD_ADMITTED), 5);
  throttle_close(b);
}

static int setup_no_functions(void **state) {
  if (th_setup(state) != 0)
    return -1;
  memset(&R, 0, sizeof R);
  static const char *const extra[] = {"--rename-command", "FCALL", "",
                                      "--rename-command", "FUNCTION", "",
                                      NULL};
  R.extra = extra;
  if (th_redis_start(&R) != 0)
    return -1;
  struct th_fx *fx = *state;
  return throttle_config_set_backend(fx->cfg, R.url);
}

/* A server without Functions (before Redis 7; here FCALL and FUNCTION
 * renamed away): "unknown command" once, then EVALSHA, with EVAL when the
 * server does not know the script. */
static void test_redis_faults_no_functions_evalsha(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  enter_leave(a, "k");
  enter_leave(a, "k/t");
  assert_int_equal(errors_of("ERR"), 1);
  assert_int_equal(calls_of("script|load"), 2);
  assert_true(calls_of("evalsha") >= 2);
  assert_int_equal(th_field(a, "k", THROTTLE_FIELD_ADMITTED), 1);
}


struct pool_arg {
  struct th_fx *fx;
  int fd;
  int n;
};

static int hold_beneath_pools(void *p) {
  struct pool_arg *pa = p;
  throttle_t *h = NULL;
  TH_CHILD_CHECK(throttle_open(pa->fx->cfg, &h) == 0);
  for (int i = 0; i < pa->n; i++) {
    char key[32];
    snprintf(key, sizeof key, "ws%02d/t1", i);
    throttle_ticket_t *t = NULL;
    TH_CHILD_CHECK(throttle_enter(h, key, THROTTLE_CLASS_LIVE, 10000, &t) ==
                   0);
  }
  th_send_u64(pa->fd, 1);
  for (;;)
    pause();
}

/* A holder killed beneath a pool: reaping its place there must not break
 * the scope's scripts (a table walked while it is changed), for any of
 * many workspaces, and nothing falls back to the segment. */
static void test_redis_faults_dead_holder_beneath_pool_poisons_nothing(
    void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  enum { N = 40 };
  throttle_t *a = th_open(fx);
  for (int i = 0; i < N; i++) {
    char ws[16];
    snprintf(ws, sizeof ws, "ws%02d", i);
    assert_int_equal(throttle_set_max_parallel(a, ws, 4), 0);
  }
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct pool_arg pa = {fx, fds[1], N};
  pid_t kid = th_spawn(fx, hold_beneath_pools, &pa);
  uint64_t v;
  assert_int_equal(th_recv_u64(fds[0], &v), 0);
  kill(kid, SIGKILL);
  th_reap(fx, kid, HANG_GUARD_MS);
  /* past the holder's liveness on Redis's clock (1 s after its last
   * beat, which was before the kill) */
  th_sleep_ms(1600);
  throttle_t *b = other_host(fx);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    char key[32], ws[16];
    snprintf(key, sizeof key, "ws%02d/t2", i);
    snprintf(ws, sizeof ws, "ws%02d", i);
    throttle_ticket_t *t = NULL;
    assert_int_equal(throttle_try_enter(b, key, THROTTLE_CLASS_LIVE, &t, NULL),
                     0);
    if (*throttle_errmsg(b) != 0) {
      printf("%s: %s\n", key, throttle_errmsg(b));
      bad++;
    } else {
      assert_int_equal(field(a, key, THROTTLE_FIELD_IN_FLIGHT), 1);
      assert_true(field(a, ws, THROTTLE_FIELD_RECLAIMS) >= 1);
    }
    assert_int_equal(throttle_leave(b, t, THROTTLE_OUTCOME_OK, 0), 0);
  }
  assert_int_equal(bad, 0);
  throttle_close(b);
  close(fds[0]);
  close(fds[1]);
}

/* A script that fails on one key (its waiter list is not a sorted set
 * here) is that call's diagnostic: the call is served by the segment and
 * said so, and the next call on another key goes to Redis at once. */
static void test_redis_faults_script_error_is_no_outage(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  cli("SET", "thr1:{bad}:w:bad", "x", NULL, NULL);
  assert_int_equal(throttle_backoff(a, "bad", TH_LONG_MS), 0);
  assert_true(th_contains(throttle_errmsg(a), "WRONGTYPE"));
  assert_true(th_contains(throttle_errmsg(a), "bad"));
  assert_true(th_contains(throttle_errmsg(a), "serves this call"));
  assert_int_equal(throttle_backoff(a, "good", TH_LONG_MS), 0);
  assert_string_equal(throttle_errmsg(a), "");
  assert_true(th_remaining(b, "good") > 0);
  throttle_close(b);
}

/* A waiter record no version of the scripts writes (a class that is
 * neither live nor backfill, under the key's prefix): the queue's walk
 * drops it rather than scoring it again forever inside Redis (a script
 * that has written cannot be killed: every host would wait on a busy
 * server until it is restarted). */
static void test_redis_faults_foreign_waiter_record_is_dropped(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  char until[32], rec[96];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* the scripts' clock: Redis's TIME */
  snprintf(until, sizeof until, "%lld",
           (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 600000);
  snprintf(rec, sizeof rec, "7 %s 30000 10000 elsewhere 1 w tok", until);
  cli("ZADD", "thr1:{odd}:w:odd", "5", "5", NULL);
  cli("HSET", "thr1:{odd}:wi:odd", "5", rec, NULL);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "odd", THROTTLE_CLASS_LIVE, 2000, &t), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  const char *ping[] = {"PING", NULL};
  char out[64];
  assert_int_equal(th_redis_cli_out(&R, ping, out, sizeof out), 0);
  assert_true(th_contains(out, "PONG"));
}

/* ---- connections -------------------------------------------------------- */

/* Redis closes connections idle for a second (timeout 1, as a proxy or a
 * load balancer does): the next call reconnects and goes through. */
static void test_redis_faults_idle_closed_connection_reconnects(void **state) {
  struct th_fx *fx = *state;
  cli("CONFIG", "SET", "timeout", "1", NULL);
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_backoff(a, "k1", 1000), 0);
  assert_string_equal(throttle_errmsg(a), "");
  /* until only redis-cli's own connection is left */
  for (int i = 0; i < 400 &&
                  th_redis_info_int(&R, "clients", "connected_clients") > 1;
       i++)
    th_sleep_ms(25);
  assert_int_equal(th_redis_info_int(&R, "clients", "connected_clients"), 1);
  assert_int_equal(throttle_backoff(a, "k2", TH_LONG_MS), 0);
  assert_string_equal(throttle_errmsg(a), "");
  throttle_t *b = other_host(fx);
  assert_true(th_remaining(b, "k2") > 0);
  throttle_close(b);
}

/* Blocking commands refused (an ACL, a proxy): a waiter polls a few times
 * a second instead of asking again at once, and says why. */
static void test_redis_faults_blocking_refused_polls_boundedly(void **state) {
  struct th_fx *fx = *state;
  cli("ACL", "SETUSER", "default", "-@blocking", NULL);
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  throttle_ticket_t *t = NULL, *t2 = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  throttle_t *b = other_host(fx);
  long long before = script_calls();
  uint64_t t0 = th_mono_ms();
  assert_int_equal(throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 2000, &t2),
                   THROTTLE_ETIMEDOUT);
  uint64_t took = th_mono_ms() - t0;
  long long looks = script_calls() - before;
  printf("%lld looks in %llu ms\n", looks, (unsigned long long)took);
  /* at most about 5 a second, and a few more to arrive and give up */
  assert_true(looks <= (long long)(took / 200) + 6);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 1000, &t2), 0);
  assert_true(th_contains(throttle_errmsg(b), "BLPOP"));
  assert_int_equal(throttle_leave(b, t2, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* An evicting memory policy is named at open (it may drop a back-off or a
 * held slot); noeviction says nothing; a CONFIG the user may not run is
 * said too. */
static void test_redis_faults_eviction_policy_warned_at_open(void **state) {
  struct th_fx *fx = *state;
  int rc;
  throttle_t *h = host_at(fx, R.url, &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(throttle_errmsg(h), "");
  throttle_close(h);
  cli("CONFIG", "SET", "maxmemory-policy", "allkeys-lru", NULL);
  h = host_at(fx, R.url, &rc);
  assert_int_equal(rc, 0);
  assert_true(th_contains(throttle_errmsg(h), "maxmemory-policy"));
  assert_true(th_contains(throttle_errmsg(h), "allkeys-lru"));
  /* still a warning after calls that succeed */
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  assert_true(th_contains(throttle_errmsg(h), "allkeys-lru"));
  throttle_close(h);
  cli("ACL", "SETUSER", "default", "-config", NULL);
  h = host_at(fx, R.url, &rc);
  assert_int_equal(rc, 0);
  assert_true(th_contains(throttle_errmsg(h), "maxmemory-policy"));
  assert_true(th_contains(throttle_errmsg(h), "NOPERM"));
  throttle_close(h);
  /* INFO refused too: a single Redis is not taken for a Cluster (the
   * probe that replaces INFO's answer), and it serves */
  cli("ACL", "SETUSER", "default", "-info", NULL);
  h = host_at(fx, R.url, &rc);
  assert_int_equal(rc, 0);
  assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
  int up = 0;
  assert_int_equal(throttle_backend_status(h, &up, NULL, NULL), 0);
  assert_int_equal(up, 1);
  throttle_close(h);
}

/* ---- a server that answers anything ------------------------------------- */

/* Answer every RESP command on a listening unix socket with one reply. */
struct anything {
  const char *reply;
  int pong; /* PING answered +PONG, as Redis does */
  int fd;   /* listening */
};

/* The length of the whole command at s (have bytes: *N, then N $len
 * bulk strings) and its name, or 0 while it is not all there. */
static size_t whole_command(const char *s, size_t have, const char **name,
                            size_t *nlen) {
  const char *end = s + have;
  if (have == 0 || s[0] != '*')
    return 0;
  const char *e = memchr(s, '\n', have);
  if (e == NULL)
    return 0;
  long args = strtol(s + 1, NULL, 10);
  const char *q = e + 1;
  for (long j = 0; j < args; j++) {
    const char *le = memchr(q, '\n', (size_t)(end - q));
    if (le == NULL || q[0] != '$')
      return 0;
    long blen = strtol(q + 1, NULL, 10);
    if (end - (le + 1) < blen + 2)
      return 0;
    if (j == 0) {
      *name = le + 1;
      *nlen = (size_t)blen;
    }
    q = le + 1 + blen + 2;
  }
  return (size_t)(q - s);
}

static int serve_anything(void *arg) {
  const struct anything *an = arg;
  const char *reply = an->reply;
  int lfd = an->fd;
  enum { BUF = 1 << 20 };
  struct pollfd p[32] = {{.fd = lfd, .events = POLLIN}};
  char *buf[32];
  size_t have[32] = {0};
  for (int i = 0; i < 32; i++)
    if ((buf[i] = malloc(BUF)) == NULL)
      return 1;
  int n = 1;
  for (;;) {
    if (poll(p, (nfds_t)n, -1) < 0)
      continue;
    if ((p[0].revents & POLLIN) && n < 32) {
      int c = accept(lfd, NULL, NULL);
      if (c >= 0) {
        p[n].fd = c;
        p[n].events = POLLIN;
        have[n] = 0;
        n++;
      }
    }
    for (int i = 1; i < n; i++) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      ssize_t k = read(p[i].fd, buf[i] + have[i], BUF - have[i]);
      if (k <= 0) {
        close(p[i].fd);
        p[i] = p[n - 1];
        have[i] = have[n - 1];
        char *tmp = buf[i];
        buf[i] = buf[n - 1];
        buf[n - 1] = tmp;
        n--;
        i--;
        continue;
      }
      have[i] += (size_t)k;
      /* one reply per complete command */
      const char *name = NULL;
      size_t nlen = 0, len;
      while ((len = whole_command(buf[i], have[i], &name, &nlen)) != 0) {
        const char *r = reply;
        if (an->pong && nlen == 4 && strncmp(name, "PING", 4) == 0)
          r = "+PONG\r\n";
        if (write(p[i].fd, r, strlen(r)) < 0)
          break;
        have[i] -= len;
        memmove(buf[i], buf[i] + len, have[i]);
      }
      if (have[i] == BUF)
        have[i] = 0; /* a command too long for this server: dropped */
    }
  }
  return 0;
}

/* A child serving (serve) on a unix socket NAME in the test's directory,
 * its listening socket in an->fd; url is where to find it. */
static void serve_at(struct th_fx *fx, const char *name, int (*serve)(void *),
                     struct anything *an, char *url, size_t len) {
  char sock[300];
  snprintf(sock, sizeof sock, "%s/%s", R.dir, name);
  unlink(sock);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_true(lfd >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  assert_true(strlen(sock) < sizeof sa.sun_path);
  memcpy(sa.sun_path, sock, strlen(sock) + 1);
  assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(listen(lfd, 16), 0);
  an->fd = lfd;
  th_spawn(fx, serve, an);
  close(lfd);
  snprintf(url, len, "unix://%s", sock);
}

static void anything_server(struct th_fx *fx, const char *reply, int pong,
                            char *url, size_t len) {
  struct anything an = {reply, pong, -1};
  serve_at(fx, "fake.sock", serve_anything, &an, url, len);
}

/* A server that answers +OK (or :0) to every command admits nobody: each
 * reply's shape is checked, a wrong one is said, and the segment serves
 * (here its cap of 1 holds). */
/* A proxy to the test's Redis that closes a client's connection on FCALL
 * and FUNCTION, as twemproxy does with every command it does not know; all
 * else passes through as it is, both ways (one poll loop, no parsing of
 * replies: a client sends its next command after the last reply). */
static int proxy_no_functions(void *arg) {
  const struct anything *an = arg;
  enum { MAXC = 16, BUF = 1 << 20 };
  struct pollfd p[1 + 2 * MAXC] = {{.fd = an->fd, .events = POLLIN}};
  static char buf[MAXC][BUF], tmp[1 << 16];
  size_t have[MAXC] = {0};
  int n = 0;
  for (;;) {
    if (poll(p, (nfds_t)(1 + 2 * n), -1) < 0)
      continue;
    if ((p[0].revents & POLLIN) && n < MAXC) {
      int c = accept(an->fd, NULL, NULL);
      int u = socket(AF_UNIX, SOCK_STREAM, 0);
      struct sockaddr_un sa = {.sun_family = AF_UNIX};
      memcpy(sa.sun_path, R.sock, strlen(R.sock) + 1);
      if (c >= 0 && u >= 0 &&
          connect(u, (struct sockaddr *)&sa, sizeof sa) == 0) {
        p[1 + 2 * n] = (struct pollfd){.fd = c, .events = POLLIN};
        p[2 + 2 * n] = (struct pollfd){.fd = u, .events = POLLIN};
        have[n++] = 0;
      } else {
        if (c >= 0)
          close(c);
        if (u >= 0)
          close(u);
      }
    }
    for (int i = 0; i < n; i++) {
      struct pollfd *pc = &p[1 + 2 * i], *pu = &p[2 + 2 * i];
      int drop = 0;
      if (pu->revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t k = read(pu->fd, tmp, sizeof tmp);
        drop = k <= 0 || write(pc->fd, tmp, (size_t)k) != k;
      }
      if (!drop && (pc->revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t k = read(pc->fd, buf[i] + have[i], BUF - have[i]);
        drop = k <= 0;
        if (!drop)
          have[i] += (size_t)k;
        const char *name = NULL;
        size_t nlen = 0, len;
        while (!drop && (len = whole_command(buf[i], have[i], &name, &nlen))) {
          if ((nlen == 5 && strncasecmp(name, "FCALL", 5) == 0) ||
              (nlen == 8 && strncasecmp(name, "FUNCTION", 8) == 0) ||
              write(pu->fd, buf[i], len) != (ssize_t)len) {
            drop = 1;
            break;
          }
          have[i] -= len;
          memmove(buf[i], buf[i] + len, have[i]);
        }
      }
      pc->revents = pu->revents = 0;
      if (drop) {
        close(pc->fd);
        close(pu->fd);
        n--;
        p[1 + 2 * i] = p[1 + 2 * n];
        p[2 + 2 * i] = p[2 + 2 * n];
        memcpy(buf[i], buf[n], have[n]);
        have[i] = have[n];
        i--;
      }
    }
  }
  return 0;
}

/* Through a proxy that closes the connection on FCALL (it names no
 * command unknown: the connection just ends), the scripts go by EVALSHA
 * after a few failed calls, instead of every call failing and the host
 * serving from its segment for good. */
static void test_redis_faults_proxy_closing_on_fcall_gets_evalsha(
    void **state) {
  struct th_fx *fx = *state;
  char url[400];
  struct anything an = {NULL, 0, -1};
  serve_at(fx, "proxy.sock", proxy_no_functions, &an, url, sizeof url);
  int rc;
  throttle_t *h = host_at(fx, url, &rc);
  assert_int_equal(rc, 0);
  for (int i = 0; i < 6; i++) {
    throttle_ticket_t *t = NULL;
    rc = throttle_enter(h, "k", THROTTLE_CLASS_LIVE, 2000, &t);
    printf("call %d: %s: %s\n", i, throttle_err_name(rc), throttle_errmsg(h));
    if (rc == 0)
      assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
    th_sleep_ms(i < 3 ? 1100 : 0); /* past the second of a down Redis */
  }
  /* now held through the proxy, seen in Redis by a host beside it */
  throttle_ticket_t *t = NULL;
  long long evalsha = calls_of("evalsha");
  assert_int_equal(throttle_enter(h, "k", THROTTLE_CLASS_LIVE, 2000, &t), 0);
  throttle_t *a = th_open(fx);
  assert_int_equal(th_field(a, "k", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_true(calls_of("evalsha") > evalsha);
  assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(h);
}

static void test_redis_faults_server_answering_anything_admits_nobody(
    void **state) {
  struct th_fx *fx = *state;
  static const char *const replies[] = {"+OK\r\n", "+OK\r\n", ":0\r\n",
                                        "*0\r\n", "*4\r\n:0\r\n:1\r\n:0\r\n:0\r\n"};
  for (size_t i = 0; i < sizeof replies / sizeof *replies; i++) {
    char url[400];
    anything_server(fx, replies[i], i > 0, url, sizeof url);
    int rc;
    throttle_t *h = host_at(fx, url, &rc);
    assert_int_equal(throttle_set_max_parallel(h, "k", 1), 0);
    throttle_ticket_t *t = NULL, *t2 = NULL;
    assert_int_equal(throttle_try_enter(h, "k", THROTTLE_CLASS_LIVE, &t, NULL),
                     0);
    assert_int_equal(
        throttle_try_enter(h, "k", THROTTLE_CLASS_LIVE, &t2, NULL),
        THROTTLE_EWOULDBLOCK);
    assert_int_equal(throttle_leave(h, t, THROTTLE_OUTCOME_OK, 0), 0);
    assert_int_equal(throttle_backoff(h, "k", 100), 0);
    printf("%s\n", throttle_errmsg(h));
    assert_true(th_contains(throttle_errmsg(h), "segment serves"));
    assert_true(th_contains(throttle_errmsg(h), "unexpected reply"));
    throttle_close(h);
    for (int k = 0; k < fx->nkids; k++) {
      kill(fx->kids[k], SIGKILL);
      waitpid(fx->kids[k], NULL, 0);
    }
    fx->nkids = 0;
  }
}

/* ---- URLs, passwords, users --------------------------------------------- */

static void test_redis_faults_url_forms_and_passwords(void **state) {
  struct th_fx *fx = *state;
  int rc;
  /* never printed, whatever goes wrong */
  throttle_t *h = host_at(fx, "redis://:s3cret@127.0.0.1:1/2", &rc);
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  assert_true(th_contains(throttle_errmsg(h), "segment serves"));
  assert_false(th_contains(throttle_errmsg(h), "s3cret"));
  throttle_close(h);
  /* an ACL user, an IPv6 host */
  h = host_at(fx, "redis://thr:s3cret@127.0.0.1:1", &rc);
  assert_int_equal(rc, 0);
  assert_string_equal(throttle_backend(h), "redis://thr:***@127.0.0.1:1");
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  assert_false(th_contains(throttle_errmsg(h), "s3cret"));
  throttle_close(h);
  h = host_at(fx, "redis://[::1]:1/3", &rc);
  assert_int_equal(rc, 0);
  throttle_close(h);
  /* TLS: refused, and said why */
  h = host_at(fx, "rediss://127.0.0.1:6380", &rc);
  assert_int_equal(rc, THROTTLE_EINVAL);
  assert_true(th_contains(throttle_errmsg(h), "TLS"));
  throttle_close(h);

  /* a Redis that wants a password */
  cli6("ACL", "SETUSER", "thr", "on", ">s3cret", "~*");
  cli("ACL", "SETUSER", "thr", "+@all", NULL);
  cli("CONFIG", "SET", "requirepass", "0ther", NULL);
  char url[400];
  h = host_at(fx, R.url, &rc);
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  assert_true(th_contains(throttle_errmsg(h), "NOAUTH"));
  throttle_close(h);
  snprintf(url, sizeof url, "unix://thr:wrong@%s", R.sock);
  h = host_at(fx, url, &rc);
  assert_int_equal(throttle_backoff(h, "k", 1000), 0);
  assert_true(th_contains(throttle_errmsg(h), "WRONGPASS"));
  assert_false(th_contains(throttle_errmsg(h), "wrong@"));
  throttle_close(h);
  snprintf(url, sizeof url, "unix://thr:s3cret@%s", R.sock);
  throttle_t *a = host_at(fx, url, &rc);
  assert_int_equal(rc, 0);
  snprintf(url, sizeof url, "unix://:0ther@%s", R.sock);
  throttle_t *b = host_at(fx, url, &rc);
  assert_int_equal(rc, 0);
  assert_int_equal(throttle_backoff(a, "k", TH_LONG_MS), 0);
  assert_string_equal(throttle_errmsg(a), "");
  assert_true(th_remaining(b, "k") > 0);
  throttle_close(a);
  throttle_close(b);
}

/* ---- Cluster ------------------------------------------------------------ */

static int setup_cluster(void **state) {
  if (th_setup(state) != 0)
    return -1;
  memset(&R, 0, sizeof R);
  static const char *const extra[] = {"--cluster-enabled", "yes",
                                      "--cluster-config-file", "nodes.conf",
                                      NULL};
  R.extra = extra;
  return th_redis_start(&R);
}

/* A Cluster node is refused at open, clearly; the handle works on its
 * segment. */
static void test_redis_faults_cluster_refused_at_open(void **state) {
  struct th_fx *fx = *state;
  int rc;
  throttle_t *h = host_at(fx, R.url, &rc);
  assert_int_equal(rc, THROTTLE_EBACKEND);
  assert_true(th_contains(throttle_errmsg(h), "Cluster"));
  assert_int_equal(throttle_backoff(h, "k", TH_LONG_MS), 0);
  assert_true(th_remaining(h, "k") > 0);
  throttle_close(h);
}

/* ---- the heartbeat ------------------------------------------------------ */

/* One process holds more admissions than one heartbeat round used to
 * refresh: every one stays alive past several liveness bounds. */
static void test_redis_faults_heartbeat_keeps_every_holding(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1500", 1);
  enum { N = 80 };
  throttle_t *a = th_open(fx);
  throttle_ticket_t *t[N];
  for (int i = 0; i < N; i++) {
    char key[16];
    snprintf(key, sizeof key, "m%02d", i);
    assert_int_equal(throttle_enter(a, key, THROTTLE_CLASS_LIVE, 1000, &t[i]),
                     0);
  }
  th_sleep_ms(4500); /* three liveness bounds */
  throttle_t *b = other_host(fx);
  int lost = 0;
  for (int i = 0; i < N; i++) {
    char key[16];
    snprintf(key, sizeof key, "m%02d", i);
    lost += field(b, key, THROTTLE_FIELD_IN_FLIGHT) != 1;
  }
  assert_int_equal(lost, 0);
  for (int i = 0; i < N; i++)
    assert_int_equal(throttle_leave(a, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* Redis restarts empty beneath two holders of a key of cap 2: their
 * heartbeats register them again (counted as held), so a newcomer waits
 * and their reports free their slots as usual. */
static void test_redis_faults_restart_heartbeat_registers_holders_again(
    void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "ws/k", 2), 0);
  throttle_ticket_t *t[2] = {NULL, NULL}, *t3 = NULL;
  /* (the second waits up to 1 s: the cold-scope rule holds it behind the
   * first) */
  for (int i = 0; i < 2; i++)
    assert_int_equal(
        throttle_enter(a, "ws/k", THROTTLE_CLASS_LIVE, 10000, &t[i]), 0);
  th_redis_stop(&R, 1);
  assert_int_equal(th_redis_start(&R), 0); /* empty */
  throttle_t *b = other_host(fx);
  th_wait_field(b, "ws/k", THROTTLE_FIELD_IN_FLIGHT, 2, HANG_GUARD_MS);
  /* the cap set before the restart is gone with it (a, which keeps a
   * copy, enters nothing more to put it back); the learned cap starts at
   * 1, and the two held slots count */
  assert_int_equal(throttle_try_enter(b, "ws/k", THROTTLE_CLASS_LIVE, &t3,
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_leave(a, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(th_field(b, "ws/k", THROTTLE_FIELD_IN_FLIGHT), 0);
  throttle_close(b);
}

/* Redis restarts empty: the settings made through it (a key's cap and a
 * pool's cap above it) come back from a host that used them: for a key it
 * holds, with the heartbeat that registers its holder again; for another,
 * at its next enter and before that enter is decided; and another host
 * then finds them.  A host whose copy is older than the idle TTL (the key
 * idle that long in Redis, where its settings may have been dropped on
 * purpose and the key lapsed since) puts nothing back. */
static void test_redis_faults_restart_settings_put_back(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1); /* a heartbeat each 250 ms */
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "ws/k", 1), 0);
  assert_int_equal(throttle_set_max_parallel(a, "ws/e", 1), 0);
  assert_int_equal(throttle_set_max_parallel(a, "ws", 2), 0);
  throttle_ticket_t *t = NULL, *t2 = NULL;
  assert_int_equal(throttle_enter(a, "ws/e", THROTTLE_CLASS_LIVE, 10000, &t),
                   0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(a, "ws/k", THROTTLE_CLASS_LIVE, 10000, &t),
                   0);
  th_redis_stop(&R, 1);
  assert_int_equal(th_redis_start(&R), 0); /* empty */
  throttle_t *b = other_host(fx);
  th_wait_field(b, "ws/k", THROTTLE_FIELD_IN_FLIGHT, 1, HANG_GUARD_MS);
  assert_int_equal(th_field(b, "ws/k", THROTTLE_FIELD_CAP), 1);
  assert_int_equal(th_field(b, "ws/k", THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(th_field(b, "ws", THROTTLE_FIELD_CAP), 2);
  assert_int_equal(th_field(b, "ws", THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(
      throttle_try_enter(b, "ws/k", THROTTLE_CLASS_LIVE, &t2, NULL),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_enter(a, "ws/e", THROTTLE_CLASS_LIVE, 10000, &t),
                   0);
  assert_int_equal(th_field(b, "ws/e", THROTTLE_FIELD_CAP_AUTO), 0);
  assert_int_equal(
      throttle_try_enter(b, "ws/e", THROTTLE_CLASS_LIVE, &t2, NULL),
      THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);

  /* c's copy of x's cap, older than the TTL: d dropped it, x lapsed */
  setenv("THROTTLE_REDIS_TTL_MS", "1000", 1); /* the least it takes */
  throttle_t *c = other_host(fx), *d = other_host(fx);
  unsetenv("THROTTLE_REDIS_TTL_MS");
  assert_int_equal(throttle_set_max_parallel(c, "x", 1), 0);
  assert_int_equal(throttle_enter(c, "x", THROTTLE_CLASS_LIVE, 10000, &t), 0);
  assert_int_equal(throttle_leave(c, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_set_max_parallel(d, "x", 0), 0);
  th_sleep_ms(2500); /* the TTL, twice, and a margin */
  throttle_info_t *info = NULL;
  assert_int_equal(throttle_info(d, "x", &info), THROTTLE_ENOKEY);
  assert_int_equal(throttle_enter(c, "x", THROTTLE_CLASS_LIVE, 10000, &t), 0);
  assert_int_equal(th_field(d, "x", THROTTLE_FIELD_CAP_AUTO), 1);
  assert_int_equal(throttle_leave(c, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(d);
  throttle_close(c);
  throttle_close(b);
}

/* A clear (or reset) on one host is not undone by another host's healing:
 * its copy of the back-off, published before the clear, is dropped, not
 * published again, and its callers go through. */
static void test_redis_faults_clear_on_one_host_not_healed_back(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  for (int reset = 0; reset < 2; reset++) {
    assert_int_equal(throttle_backoff(a, "ws/k", TH_LONG_MS), 0);
    assert_true(th_remaining(b, "ws/k") > 0);
    assert_int_equal(reset ? throttle_reset(b) : throttle_clear(b, "ws/k"),
                     0);
    /* a's next calls heal from its segment: the copy is older */
    assert_int_equal(throttle_wait(a, "ws/k", 10000), 0);
    throttle_ticket_t *t = NULL;
    assert_int_equal(throttle_try_enter(a, "ws/k", THROTTLE_CLASS_LIVE, &t,
                                        NULL),
                     0);
    assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
    assert_int_equal(th_remaining(b, "ws/k"), 0);
  }
  /* a back-off told after the clear and lost by Redis still heals */
  assert_int_equal(throttle_backoff(a, "ws/k", TH_LONG_MS), 0);
  cli("FLUSHALL", NULL, NULL, NULL, NULL);
  assert_int_equal(throttle_wait(a, "ws/k", 0), THROTTLE_ETIMEDOUT);
  assert_true(th_remaining(b, "ws/k") > 0);
  throttle_close(b);
}

/* A pause and a cap set through Redis by one host reach another host's
 * segment with its next enter, so they still hold there while Redis is
 * away; a resume reaches it the same way. */
static void test_redis_faults_settings_mirrored_for_an_outage(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  assert_int_equal(throttle_pause(a, "p"), 0);
  assert_int_equal(throttle_set_max_parallel(a, "c", 2), 0);
  throttle_ticket_t *t[3] = {NULL, NULL, NULL};
  assert_int_equal(throttle_try_enter(b, "p", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  th_redis_stop(&R, 1);
  /* b's segment serves: paused, and a cap of 2 */
  assert_int_equal(throttle_try_enter(b, "p", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[i],
                                        NULL),
                     0);
  assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[2],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_leave(b, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* A scope's settings set through Redis (a pool's cap and rate, a
 * workspace's pause) reach another host's segment with its next enter
 * beneath them, so they still hold there while Redis is away. */
static void test_redis_faults_pool_settings_mirrored_for_an_outage(
    void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  assert_int_equal(throttle_set_max_parallel(a, "ws", 2), 0);
  assert_int_equal(throttle_set_rate(a, "rt", 1, 3600000), 0);
  assert_int_equal(throttle_pause(a, "pz"), 0);
  throttle_ticket_t *t[3] = {NULL, NULL, NULL};
  assert_int_equal(throttle_try_enter(b, "ws/t1", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(b, "rt/t1", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(b, "pz/t1", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  th_redis_stop(&R, 1);
  /* b's segment serves: a pool of 2 over every table of ws (once ws, a
   * scope this segment has heard nothing of, has its first answer) */
  const char *const keys[] = {"ws/t1", "ws/t2", "ws/t3"};
  assert_int_equal(throttle_try_enter(b, keys[0], THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_try_enter(b, keys[i], THROTTLE_CLASS_LIVE,
                                        &t[i], NULL),
                     0);
  int up = 1;
  assert_int_equal(throttle_backend_status(b, &up, NULL, NULL), 0);
  assert_int_equal(up, 0);
  assert_int_equal(throttle_try_enter(b, keys[2], THROTTLE_CLASS_LIVE, &t[2],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_leave(b, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  /* a rate of 1 an hour on rt: one more on the host, then none */
  assert_int_equal(throttle_try_enter(b, "rt/t2", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(b, "rt/t3", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  /* pz paused: every table beneath it too */
  assert_int_equal(throttle_try_enter(b, "pz/t2", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  throttle_close(b);
}

struct fork_hold {
  throttle_t *h;
  int fd;
};

static int hold_in_child(void *arg) {
  struct fork_hold *fh = arg;
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(fh->h, "f", THROTTLE_CLASS_LIVE, 5000, &t) ==
                 0);
  th_send_u64(fh->fd, 1);
  th_sleep_ms(4000);
  TH_CHILD_CHECK(throttle_leave(fh->h, t, THROTTLE_OUTCOME_OK, 0) == 0);
  execl("/bin/true", "true", (char *)NULL); /* what the parent held */
  return 0;
}

/* A child forked from a process whose heartbeat runs inherits no thread:
 * it starts a heartbeat of its own when it holds something, and its
 * holding stays alive. */
static void test_redis_faults_forked_child_keeps_its_holding_alive(
    void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1); /* beats every 250 ms */
  throttle_t *a = th_open(fx);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "g", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct fork_hold fh = {a, fds[1]};
  pid_t kid = th_spawn(fx, hold_in_child, &fh);
  uint64_t v;
  assert_int_equal(th_recv_u64(fds[0], &v), 0);
  th_sleep_ms(3000); /* three liveness bounds */
  throttle_t *b = other_host(fx);
  assert_int_equal(th_field(b, "f", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(th_field(b, "f", THROTTLE_FIELD_RECLAIMS), 0);
  th_reap_ok(fx, kid, HANG_GUARD_MS);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
  close(fds[0]);
  close(fds[1]);
}

/* The host's segment stuck (its mutex held by a stopped process) while
 * Redis answers: Redis serves, and no call is later than its timeout. */
static void test_redis_faults_stuck_segment_makes_no_call_late(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 2), 0);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &t), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  pid_t pid = th_spawn(fx, th_child_sits_on_mutex, fx);
  th_wait_stopped(fx, pid, HANG_GUARD_MS);
  a = th_open(fx);
  /* an admission, a leave that publishes (the segment keeps a copy), a
   * wait that outlasts it and one more admission: each as Redis answers */
  uint64_t t0 = th_now_ns() / 1000000;
  int rc = throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 300, &t);
  uint64_t t1 = th_now_ns() / 1000000;
  int lrc =
      rc == 0 ? throttle_leave(a, t, THROTTLE_OUTCOME_LOCKED, 200) : rc;
  uint64_t t2 = th_now_ns() / 1000000;
  int wrc = throttle_wait(a, "k", 1000);
  uint64_t t3 = th_now_ns() / 1000000;
  int erc = throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 300, &t);
  uint64_t t4 = th_now_ns() / 1000000;
  if (erc == 0)
    erc = throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0);
  kill(pid, SIGKILL);
  th_reap_killed(fx, pid, HANG_GUARD_MS);
  print_message("enter %d in %llu ms, leave %d in %llu ms, wait %d in %llu "
                "ms, enter %d in %llu ms\n",
                rc, (unsigned long long)(t1 - t0), lrc,
                (unsigned long long)(t2 - t1), wrc,
                (unsigned long long)(t3 - t2), erc,
                (unsigned long long)(t4 - t3));
  assert_int_equal(rc, 0);
  assert_int_equal(lrc, 0);
  assert_int_equal(wrc, 0);
  assert_int_equal(erc, 0);
  assert_true(t1 - t0 < 300 + 100);
  assert_true(t2 - t1 < 100);
  assert_true(t3 - t2 < 1000 + 100);
  assert_true(t4 - t3 < 300 + 100);
}

/* A caller Redis admitted is kept in its host's segment as held: when
 * Redis goes away while it holds a cap-1 key, the host's segment admits
 * nobody beside it, and admits the next once it is gone (killed: its slot
 * reclaimed as any dead holder's). */
static void held_through_an_outage(struct th_fx *fx, const char *capped,
                                   const char *held, const char *next) {
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, capped, 1), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct th_hold ha = {fx, held, fds[1]};
  pid_t kid = th_spawn(fx, th_child_holds, &ha);
  uint64_t v;
  assert_int_equal(th_recv_u64(fds[0], &v), 0);
  th_redis_stop(&R, 1);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_enter(a, next, THROTTLE_CLASS_LIVE, 300, &t),
                   THROTTLE_ETIMEDOUT);
  assert_null(t);
  assert_int_equal(th_field(a, held, THROTTLE_FIELD_IN_FLIGHT), 1);
  kill(kid, SIGKILL);
  th_reap_killed(fx, kid, HANG_GUARD_MS);
  assert_int_equal(throttle_enter(a, next, THROTTLE_CLASS_LIVE, 5000, &t), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  close(fds[0]);
  close(fds[1]);
}

static void test_redis_faults_own_admission_held_through_an_outage(
    void **state) {
  held_through_an_outage(*state, "k", "k", "k");
}

/* The same beneath a pool of 1: the kept admission holds its place in
 * the pool, so another table of the workspace waits too. */
static void test_redis_faults_own_pooled_admission_held_through_an_outage(
    void **state) {
  held_through_an_outage(*state, "ws", "ws/t1", "ws/t2");
}

/* The segment's copy of a Redis admission is not told to Redis as one of
 * the host's own (it would count twice): with a cap of 2 and one held,
 * the host's next caller is admitted; its leave frees its copy, so the
 * segment is empty again. */
static void test_redis_faults_kept_admission_not_counted_twice(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_t *a2 = NULL; /* another caller of the same host */
  assert_int_equal(throttle_open(fx->cfg, &a2), 0);
  assert_int_equal(throttle_set_max_parallel(a, "k", 2), 0);
  throttle_ticket_t *t = NULL, *u = NULL;
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 5000, &t), 0);
  assert_int_equal(throttle_try_enter(a2, "k", THROTTLE_CLASS_LIVE, &u, NULL),
                   0);
  assert_int_equal(throttle_leave(a2, u, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  th_redis_stop(&R, 1);
  /* the segment serves now: nothing of the two left in it */
  assert_int_equal(th_field(a, "k", THROTTLE_FIELD_IN_FLIGHT), 0);
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &t, NULL),
                   0);
  assert_int_equal(throttle_try_enter(a2, "k", THROTTLE_CLASS_LIVE, &u, NULL),
                   0);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_leave(a2, u, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(a2);
}

/* Redis back after an outage while a host's segment still holds what it
 * admitted meanwhile: the host's next caller goes to Redis and has those
 * counted there as the host's, so another host is not admitted beside
 * them; once the segment has drained, the count goes with the next look. */
static void test_redis_faults_host_rejoins_while_segment_drains(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "1000", 1);
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t[3] = {NULL, NULL, NULL};
  assert_int_equal(throttle_set_max_parallel(a, "c", 2), 0);
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0); /* the cap mirrored in a's segment */
  assert_int_equal(throttle_leave(a, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  th_redis_stop(&R, 1);
  for (int i = 0; i < 2; i++) /* a's segment admits */
    assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[i],
                                        NULL),
                     0);
  assert_int_equal(th_redis_start(&R), 0); /* empty */
  assert_int_equal(throttle_set_max_parallel(b, "c", 2), 0);
  th_sleep_ms(1200); /* past a's retry pause: Redis is asked again */
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[2],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  for (int round = 0; round < 2; round++) {
    assert_int_equal(th_field(b, "c", THROTTLE_FIELD_IN_FLIGHT), 2);
    assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[2],
                                        NULL),
                     THROTTLE_EWOULDBLOCK);
    /* no caller of a looks meanwhile: its heartbeat keeps them */
    if (round == 0)
      th_sleep_ms(3000); /* three liveness bounds */
  }
  for (int i = 0; i < 2; i++)
    assert_int_equal(throttle_leave(a, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  /* drained: the heartbeat drops them, and b gets in */
  th_wait_field(b, "c", THROTTLE_FIELD_IN_FLIGHT, 0, HANG_GUARD_MS);
  assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[2],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[2], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[2],
                                      NULL),
                   0);
  assert_int_equal(th_field(b, "c", THROTTLE_FIELD_IN_FLIGHT), 1);
  assert_int_equal(throttle_leave(a, t[2], THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* The holder fields of key c's state hash, each on its own line of out
 * (HKEYS, those beginning "h:"); returns their number. */
static int holder_fields(char *out, size_t len) {
  char buf[8192], *save = NULL;
  const char *args[] = {"HKEYS", "thr1:{c}:k:c", NULL};
  assert_int_equal(th_redis_cli_out(&R, args, buf, sizeof buf), 0);
  int n = 0;
  out[0] = 0;
  for (char *l = strtok_r(buf, "\n", &save); l != NULL;
       l = strtok_r(NULL, "\n", &save))
    if (strncmp(l, "h:", 2) == 0) {
      n++;
      snprintf(out + strlen(out), len - strlen(out), "%s\n", l);
    }
  return n;
}

/* What a host's segment holds while it rejoins is one field of the key's
 * hash however many it counts (a look reads the hash whole, so 20 fields
 * cost a look about 3x): other hosts see all 20 as held.  Fields of the
 * earlier form (one per caller, h:r:NAME:I) count one each; the host's
 * own go when it writes its count again. */
static void test_redis_faults_reservations_are_one_field(void **state) {
  struct th_fx *fx = *state;
  setenv("THROTTLE_LIVENESS_MS", "10000", 1);
  enum { N = 20 };
  throttle_t *a = th_open(fx);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *t[N + 1] = {NULL};
  assert_int_equal(throttle_set_max_parallel(a, "c", N), 0);
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[0],
                                      NULL),
                   0); /* the cap mirrored in a's segment */
  assert_int_equal(throttle_leave(a, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  th_redis_stop(&R, 1);
  for (int i = 0; i < N; i++) /* a's segment admits */
    assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[i],
                                        NULL),
                     0);
  assert_int_equal(th_redis_start(&R), 0); /* empty */
  assert_int_equal(throttle_set_max_parallel(b, "c", N), 0);
  th_sleep_ms(1200); /* past a's retry pause: Redis is asked again */
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[N],
                                      NULL),
                   THROTTLE_EWOULDBLOCK);
  char hs[4096];
  assert_int_equal(holder_fields(hs, sizeof hs), 1);
  assert_true(strncmp(hs, "h:R:", 4) == 0);
  assert_int_equal(th_field(b, "c", THROTTLE_FIELD_IN_FLIGHT), N);
  /* the earlier form beside it: two of a's own, one of another host's */
  char name[512], f1[600], f2[600];
  snprintf(name, sizeof name, "%.*s", (int)(strcspn(hs + 4, "\n")), hs + 4);
  snprintf(f1, sizeof f1, "h:r:%s:1", name);
  snprintf(f2, sizeof f2, "h:r:%s:2", name);
  const char *far = "0 0 1 1 99999999999999 99999999999999 10000 10000 x 0 -";
  const char *old[] = {"HSET", "thr1:{c}:k:c", f1, far, f2, far,
                       "h:r:old@/seg:1", far, NULL};
  assert_int_equal(th_redis_cli(&R, 0, old), 0);
  assert_int_equal(th_field(b, "c", THROTTLE_FIELD_IN_FLIGHT), N + 3);
  /* one of a's leaves: its next look writes 19, and drops its old two */
  assert_int_equal(throttle_leave(a, t[0], THROTTLE_OUTCOME_OK, 0), 0);
  assert_int_equal(throttle_try_enter(a, "c", THROTTLE_CLASS_LIVE, &t[N],
                                      NULL),
                   THROTTLE_EWOULDBLOCK); /* 19 and the other host's 1 */
  assert_int_equal(holder_fields(hs, sizeof hs), 2);
  assert_false(th_contains(hs, f1));
  assert_true(th_contains(hs, "h:r:old@/seg:1"));
  assert_int_equal(th_field(b, "c", THROTTLE_FIELD_IN_FLIGHT), N);
  const char *gone[] = {"HDEL", "thr1:{c}:k:c", "h:r:old@/seg:1", NULL};
  assert_int_equal(th_redis_cli(&R, 0, gone), 0);
  for (int i = 1; i < N; i++)
    assert_int_equal(throttle_leave(a, t[i], THROTTLE_OUTCOME_OK, 0), 0);
  /* drained: the heartbeat drops the field, and b gets in */
  th_wait_field(b, "c", THROTTLE_FIELD_IN_FLIGHT, 0, HANG_GUARD_MS);
  assert_int_equal(holder_fields(hs, sizeof hs), 0);
  assert_int_equal(throttle_try_enter(b, "c", THROTTLE_CLASS_LIVE, &t[N],
                                      NULL),
                   0);
  assert_int_equal(throttle_leave(b, t[N], THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

static int wait_canceled_in_segment(void *arg) {
  struct th_fx *fx = arg;
  throttle_t *h = NULL;
  throttle_open(fx->cfg, &h); /* Redis is down: the segment serves */
  TH_CHILD_CHECK(h != NULL);
  throttle_ticket_t *t = NULL;
  TH_CHILD_CHECK(throttle_enter(h, "q", THROTTLE_CLASS_LIVE, THROTTLE_FOREVER,
                                &t) == THROTTLE_ECANCELED);
  throttle_close(h);
  return 0;
}

/* A cancel through Redis also ends this host's waiters that queued in the
 * segment while Redis was away. */
static void test_redis_faults_cancel_reaches_segment_waiters(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  th_redis_stop(&R, 1);
  throttle_ticket_t *t = NULL;
  assert_int_equal(throttle_try_enter(a, "q", THROTTLE_CLASS_LIVE, &t, NULL),
                   0); /* the segment admits */
  pid_t kid = th_spawn(fx, wait_canceled_in_segment, fx);
  /* queued in the segment, as a handle without a backend sees it */
  throttle_config_t *cfg = throttle_config_new();
  assert_int_equal(throttle_config_set_segment(cfg, fx->name), 0);
  throttle_t *seg = NULL;
  assert_int_equal(throttle_open(cfg, &seg), 0);
  throttle_config_free(cfg);
  th_wait_field(seg, "q", THROTTLE_FIELD_WAITING_LIVE, 1, HANG_GUARD_MS);
  throttle_close(seg);
  assert_int_equal(th_redis_start(&R), 0);
  th_sleep_ms(1200); /* past a's retry pause: Redis is asked again */
  assert_int_equal(throttle_cancel(a, "q"), 0);
  th_reap_ok(fx, kid, HANG_GUARD_MS);
  assert_int_equal(throttle_leave(a, t, THROTTLE_OUTCOME_OK, 0), 0);
}

/* ---- time --------------------------------------------------------------- */

/* A stall longer than the caller's timeout, while the caller waits in
 * Redis: it returns by its timeout, the backend's part and the segment's
 * together. */
struct stall_arg {
  const char *seg;
  int fd;
  int stay_ms; /* how long the waiter's handle stays open after its enter */
};

static int wait_through_stall(void *p) {
  struct stall_arg *sa = p;
  int stay_ms = sa->stay_ms;
  throttle_config_t *cfg = throttle_config_new();
  TH_CHILD_CHECK(throttle_config_set_segment(cfg, sa->seg) == 0);
  TH_CHILD_CHECK(throttle_config_set_backend(cfg, R.url) == 0);
  throttle_t *b = NULL;
  TH_CHILD_CHECK(throttle_open(cfg, &b) == 0);
  throttle_config_free(cfg);
  throttle_ticket_t *t = NULL;
  uint64_t t0 = th_mono_ms();
  int rc = throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 2000, &t);
  uint64_t took = th_mono_ms() - t0;
  printf("enter(2000): %s after %llu ms: %s\n", throttle_err_name(rc),
         (unsigned long long)took, throttle_errmsg(b));
  th_send_u64(sa->fd, took);
  TH_CHILD_CHECK(rc == THROTTLE_ETIMEDOUT);
  th_sleep_ms(stay_ms); /* open: its heartbeat sends its give-backs */
  throttle_close(b);
  return 0;
}

/* A waiter of the paused key k in a child (its handle kept open stay_ms
 * after its enter(2000) returns, *kid), that Redis stalls for 3 s after
 * it has waited look_ms; how long its enter took. */
static uint64_t waiter_through_stall(struct th_fx *fx, throttle_t *a,
                                     int stay_ms, int look_ms, pid_t *kid) {
  /* paused through Redis: b waits there, and its segment (which mirrors
   * the pause) holds it too when it falls back */
  assert_int_equal(throttle_pause(a, "k"), 0);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  struct stall_arg sa = {th_extra_name(fx), fds[1], stay_ms};
  *kid = th_spawn(fx, wait_through_stall, &sa);
  th_wait_field(a, "k", THROTTLE_FIELD_WAITING_LIVE, 1, HANG_GUARD_MS);
  th_sleep_ms(look_ms);
  const char *args[] = {"DEBUG", "SLEEP", "3", NULL};
  int cli_pid = th_redis_cli(&R, 1, args);
  assert_true(cli_pid > 0);
  uint64_t took = 0;
  assert_int_equal(th_recv_u64(fds[0], &took), 0);
  th_reap(fx, cli_pid, HANG_GUARD_MS);
  close(fds[0]);
  close(fds[1]);
  return took;
}

static void test_redis_faults_stall_never_exceeds_timeout(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  pid_t kid;
  uint64_t took = waiter_through_stall(fx, a, 0, 0, &kid);
  th_reap_ok(fx, kid, HANG_GUARD_MS);
  printf("enter(2000) through a 3 s stall returned after %llu ms\n",
         (unsigned long long)took);
  /* (today's figure is the timeout to the ms; before, 1.25 s of Redis
   * and then the whole timeout again in the segment) */
  assert_true(took < 2000 + 500);
}

/* A waiter whose look failed in a stall (its number known to its
 * caller) is given back by that number and its token once Redis answers:
 * its place does not stand until its liveness (10 s) lapses. */
static void test_redis_faults_stalled_waiter_given_back(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  pid_t kid;
  /* a look after its arrival first: its number is known to it */
  (void)waiter_through_stall(fx, a, 8000, 1200, &kid);
  /* Redis answers again; its last look was at most 1 s before the stall,
   * so liveness would drop the record 6 s from now at the earliest */
  uint64_t t0 = th_mono_ms();
  th_wait_field(a, "k", THROTTLE_FIELD_WAITING_LIVE, 0, 4500);
  printf("waiter given back %llu ms after the stall\n",
         (unsigned long long)(th_mono_ms() - t0));
  th_reap_ok(fx, kid, HANG_GUARD_MS);
}

/* A Redis that answers, but late (as under load: many waiters arriving
 * at once), is no outage: a caller whose command timed out while Redis
 * still answers a PING goes on in Redis, never to the host's segment,
 * which would admit beside a holder only Redis knows.  Redis answers late
 * here because a client keeps putting it to sleep (DEBUG SLEEP 0.3 s,
 * with 50 ms between), against a command timeout of 60 ms. */
struct busy_arg {
  const char *seg;
  int fd;
  struct th_gate gate;
  int open_first; /* opened (and connected) before Redis is busy */
};

static int enter_while_busy(void *p) {
  struct busy_arg *ba = p;
  throttle_config_t *cfg = throttle_config_new();
  TH_CHILD_CHECK(throttle_config_set_segment(cfg, ba->seg) == 0);
  TH_CHILD_CHECK(throttle_config_set_backend(cfg, R.url) == 0);
  throttle_t *b = NULL;
  if (!ba->open_first)
    th_gate_wait(&ba->gate);
  TH_CHILD_CHECK(throttle_open(cfg, &b) == 0);
  throttle_config_free(cfg);
  if (ba->open_first)
    th_gate_wait(&ba->gate);
  throttle_ticket_t *t = NULL;
  uint64_t t0 = th_mono_ms();
  int rc = throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 2500, &t);
  uint64_t took = th_mono_ms() - t0;
  if (rc != THROTTLE_ETIMEDOUT)
    printf("enter(2500): %s after %llu ms: %s\n", throttle_err_name(rc),
           (unsigned long long)took, throttle_errmsg(b));
  th_send_u64(ba->fd, took * 2 + (rc == 0)); /* one write: not interleaved */
  if (rc == 0)
    (void)throttle_leave(b, t, THROTTLE_OUTCOME_OK, 0);
  throttle_close(b);
  return 0;
}

static int keep_redis_busy(void *p) {
  struct busy_arg *ba = p;
  th_gate_open(&ba->gate); /* its copy of the gate's write end */
  const char *args[] = {"DEBUG", "SLEEP", "0.3", NULL};
  for (int i = 0; i < 10; i++) {
    TH_CHILD_CHECK(th_redis_cli(&R, 0, args) == 0);
    th_sleep_ms(50);
  }
  return 0;
}

static void test_redis_faults_busy_redis_never_admits_beside_holder(
    void **state) {
  struct th_fx *fx = *state;
  enum { N = 24 };
  setenv("THROTTLE_REDIS_TIMEOUT_MS", "60", 1);
  throttle_ticket_t *ta = NULL, *tb = NULL;
  throttle_t *a = th_hold_only_slot(fx, "k", &ta);
  /* host b has seen the key's cap of 1 (mirrored in its segment) */
  throttle_t *b = other_host(fx);
  const char *seg = throttle_segment_name(b);
  assert_int_equal(throttle_try_enter(b, "k", THROTTLE_CLASS_LIVE, &tb, NULL),
                   THROTTLE_EWOULDBLOCK);
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  /* half of them open before Redis is busy (their commands time out),
   * half while it is (their connections' greetings are late) */
  struct busy_arg ba = {seg, fds[1], {{-1, -1}}, 1};
  th_gate_init(&ba.gate);
  pid_t kids[N];
  for (int i = 0; i < N; i++) {
    ba.open_first = i % 2;
    kids[i] = th_spawn(fx, enter_while_busy, &ba);
  }
  th_sleep_ms(300); /* the first half opened */
  pid_t busy = th_spawn(fx, keep_redis_busy, &ba);
  th_sleep_ms(20);
  th_gate_open(&ba.gate);
  uint64_t admitted = 0, longest = 0;
  for (int i = 0; i < N; i++) {
    uint64_t v = 0;
    assert_int_equal(th_recv_u64(fds[0], &v), 0);
    uint64_t took = v / 2;
    admitted += v % 2;
    if (took > longest)
      longest = took;
  }
  for (int i = 0; i < N; i++)
    th_reap_ok(fx, kids[i], HANG_GUARD_MS);
  th_reap_ok(fx, busy, HANG_GUARD_MS);
  printf("%d waiters on a held cap-1 key through a busy Redis: %llu "
         "admitted beside the holder, the longest call %llu ms\n",
         N, (unsigned long long)admitted, (unsigned long long)longest);
  assert_int_equal(admitted, 0);
  assert_true(longest < 2500 + 500);
  assert_int_equal(throttle_leave(a, ta, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
  th_gate_close(&ba.gate);
  close(fds[0]);
  close(fds[1]);
}

/* b enters k while Redis sleeps for a second, giving up after 200 ms:
 * its FCALL runs when Redis wakes (returns once it has). */
static void enter_into_stall(struct th_fx *fx, throttle_t *b) {
  throttle_ticket_t *tb = NULL;
  /* the library loaded: the stalled command is the enter's FCALL */
  assert_int_equal(throttle_enter(b, "warm", THROTTLE_CLASS_LIVE, 1000, &tb),
                   0);
  assert_int_equal(throttle_leave(b, tb, THROTTLE_OUTCOME_OK, 0), 0);
  const char *args[] = {"DEBUG", "SLEEP", "1", NULL};
  int cli_pid = th_redis_cli(&R, 1, args);
  assert_true(cli_pid > 0);
  th_sleep_ms(300); /* the server asleep: 700 ms left */
  int rc = throttle_enter(b, "k", THROTTLE_CLASS_LIVE, 200, &tb);
  printf("enter into the stall: %s: %s\n", throttle_err_name(rc),
         throttle_errmsg(b));
  if (rc == 0) /* the segment served it */
    assert_int_equal(throttle_leave(b, tb, THROTTLE_OUTCOME_OK, 0), 0);
  th_reap(fx, cli_pid, HANG_GUARD_MS);
}

/* An enter sent into a stalled Redis runs when it resumes, after its
 * caller gave up: the admission it grants nobody holds is given back by
 * the call's token, long before the liveness bound would reclaim it. */
static void test_redis_faults_stalled_enter_leaves_no_phantom(void **state) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  throttle_t *b = other_host(fx);
  throttle_ticket_t *ta = NULL;
  enter_into_stall(fx, b);
  printf("after the stall: %lld in flight\n",
         (long long)th_field(a, "k", THROTTLE_FIELD_IN_FLIGHT));
  /* the liveness bound is 10 s: a phantom would hold the slot past 8 s */
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 8000, &ta), 0);
  assert_int_equal(th_field(a, "k", THROTTLE_FIELD_RECLAIMS), 0);
  assert_int_equal(throttle_leave(a, ta, THROTTLE_OUTCOME_OK, 0), 0);
  throttle_close(b);
}

/* The same while the key is held: the enter that runs after its caller
 * gave up queues a waiter nobody is, which the give-back removes by the
 * call's token (through the token's index: one read, however many wait),
 * before it could be granted the slot and hold it for nobody. */
static void phantom_waiter(void **state, int close_at_once) {
  struct th_fx *fx = *state;
  throttle_t *a = th_open(fx);
  throttle_ticket_t *ta = NULL;
  assert_int_equal(throttle_set_max_parallel(a, "k", 1), 0);
  assert_int_equal(throttle_enter(a, "k", THROTTLE_CLASS_LIVE, 1000, &ta), 0);
  throttle_t *b = other_host(fx);
  enter_into_stall(fx, b);
  uint64_t t0 = th_mono_ms();
  if (close_at_once) {
    /* before its heartbeat's first round: the close gives back */
    throttle_close(b);
    b = NULL;
    assert_int_equal(th_field(a, "k", THROTTLE_FIELD_WAITING_LIVE), 0);
  }
  /* given back within a heartbeat round or two (2.5 s each), long before
   * the waiter's liveness (10 s) would drop it */
  th_wait_field(a, "k", THROTTLE_FIELD_WAITING_LIVE, 0, 7000);
  printf("phantom waiter gone after %llu ms\n",
         (unsigned long long)(th_mono_ms() - t0));
  assert_int_equal(throttle_leave(a, ta, THROTTLE_OUTCOME_OK, 0), 0);
  /* the slot is free for a caller, not granted to the phantom */
  assert_int_equal(throttle_try_enter(a, "k", THROTTLE_CLASS_LIVE, &ta, NULL),
                   0);
  assert_int_equal(throttle_leave(a, ta, THROTTLE_OUTCOME_OK, 0), 0);
  if (b != NULL)
    throttle_close(b);
}

static void test_redis_faults_stalled_enter_leaves_no_phantom_waiter(
    void **state) {
  phantom_waiter(state, 0);
}

/* The same when the caller closes its handle at once: what its failed
 * calls left is given back by the close, not by the liveness bound. */
static void test_redis_faults_closed_handle_gives_back(void **state) {
  phantom_waiter(state, 1);
}

int main(int argc, char **argv) {
  if (!th_redis_available()) {
    printf("SKIP test_redis_faults: redis-server is not installed\n");
    return 0;
  }
  th_redis_use_module(argv[0]);
  if (argc > 1) /* one test, or those a pattern names */
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_redis_faults_dead_holder_beneath_pool_poisons_nothing, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_script_error_is_no_outage, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_idle_closed_connection_reconnects, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_blocking_refused_polls_boundedly, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_eviction_policy_warned_at_open, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_server_answering_anything_admits_nobody, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_url_forms_and_passwords, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_foreign_waiter_record_is_dropped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_faults_cluster_refused_at_open,
                                      setup_cluster, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_heartbeat_keeps_every_holding, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_restart_heartbeat_registers_holders_again, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_restart_settings_put_back, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_forked_child_keeps_its_holding_alive, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_clear_on_one_host_not_healed_back, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_settings_mirrored_for_an_outage, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_pool_settings_mirrored_for_an_outage, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_host_rejoins_while_segment_drains, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_reservations_are_one_field, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_own_admission_held_through_an_outage, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_kept_admission_not_counted_twice, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_stuck_segment_makes_no_call_late, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_own_pooled_admission_held_through_an_outage, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_cancel_reaches_segment_waiters, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_stall_never_exceeds_timeout, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_stalled_enter_leaves_no_phantom, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_stalled_enter_leaves_no_phantom_waiter, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_stalled_waiter_given_back, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_closed_handle_gives_back, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_proxy_closing_on_fcall_gets_evalsha, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_busy_redis_never_admits_beside_holder, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_functions_called_and_loaded_again, setup,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_redis_faults_functions_refused_evalsha, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_faults_no_functions_evalsha,
                                      setup_no_functions, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
