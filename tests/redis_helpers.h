/* SPDX-License-Identifier: MIT */
/*
 * redis_helpers.h — a throw-away redis-server for one test: started on a
 * unix socket in a fresh temporary directory (--port 0: no TCP at all,
 * never 6379; no persistence), stopped by its pid; with
 * TH_REDIS_NO_FUNCTIONS set, one without Functions (FCALL and FUNCTION
 * renamed away), as before Redis 7.  The shell tests have the same in
 * tests/redis_lib.sh.
 */
#ifndef THROTTLE_TEST_REDIS_HELPERS_H
#define THROTTLE_TEST_REDIS_HELPERS_H

#include <stddef.h>
#include <sys/types.h>

struct th_redis {
  char dir[256];
  char sock[300];
  char url[320]; /* unix:///.../redis.sock */
  pid_t pid;
  /* more redis-server arguments (NULL-terminated), or NULL */
  const char *const *extra;
};

/* 1 when redis-server is on PATH (tests skip otherwise). */
int th_redis_available(void);
/* Start (or restart on the same socket); 0 when it answers, -1 if not. */
int th_redis_start(struct th_redis *r);
/* SIGTERM (or SIGKILL when hard) and reap; the directory stays until
 * th_redis_cleanup. */
void th_redis_stop(struct th_redis *r, int hard);
void th_redis_cleanup(struct th_redis *r);
/* Run redis-cli against it with the given arguments, in the background
 * when bg (returns its pid then), else waited for (returns its status). */
int th_redis_cli(const struct th_redis *r, int bg, const char *const *args);
/* The same, waited for, its standard output (up to len - 1 bytes) in out;
 * returns its status. */
int th_redis_cli_out(const struct th_redis *r, const char *const *args,
                     char *out, size_t len);
/* The integer after "NAME:" in the server's INFO SECTION (-1 if absent). */
long long th_redis_info_int(const struct th_redis *r, const char *section,
                            const char *name);
/* Point the library at the module built next to the tests. */
void th_redis_use_module(const char *argv0);
/* THROTTLE_BACKEND_MODULE set again as th_redis_use_module set it (a test
 * may have pointed it elsewhere). */
void th_redis_module_again(void);

#endif
