/* SPDX-License-Identifier: MIT */
/*
 * redis_helpers.c — see redis_helpers.h.
 */
#include "redis_helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int th_redis_available(void) {
  return system("command -v redis-server >/dev/null 2>&1") == 0;
}

static int answers(const char *sock) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(sock) >= sizeof a.sun_path) {
    close(fd);
    return 0;
  }
  memcpy(a.sun_path, sock, strlen(sock) + 1);
  int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  if (ok) {
    char buf[16];
    ok = write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof buf) > 0 &&
         buf[0] == '+';
  }
  close(fd);
  return ok;
}

int th_redis_start(struct th_redis *r) {
  if (r->dir[0] == 0) {
    snprintf(r->dir, sizeof r->dir, "/tmp/tt-redis-XXXXXX");
    if (mkdtemp(r->dir) == NULL)
      return -1;
    snprintf(r->sock, sizeof r->sock, "%s/redis.sock", r->dir);
    snprintf(r->url, sizeof r->url, "unix://%s", r->sock);
  }
  unlink(r->sock);
  char log[300];
  snprintf(log, sizeof log, "%s/redis.log", r->dir);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 1);
      dup2(null, 2);
    }
    const char *av[64] = {"redis-server", "--port", "0", "--unixsocket",
                          r->sock, "--unixsocketperm", "700", "--save", "",
                          "--appendonly", "no", "--enable-debug-command",
                          "local", "--dir", r->dir, "--logfile", log};
    int n = 17;
    for (int i = 0; r->extra != NULL && r->extra[i] != NULL && n < 63; i++)
      av[n++] = r->extra[i];
    /* a server without Functions, as before Redis 7: the module's scripts
     * then go by EVALSHA (tests/test_redis_eval.sh) */
    if (getenv("TH_REDIS_NO_FUNCTIONS") != NULL && n < 58) {
      static const char *const nofn[] = {"--rename-command", "FCALL", "",
                                         "--rename-command", "FUNCTION", ""};
      for (int i = 0; i < 6; i++)
        av[n++] = nofn[i];
    }
    av[n] = NULL;
    execvp("redis-server", (char *const *)av);
    _exit(127);
  }
  r->pid = pid;
  for (int i = 0; i < 200; i++) {
    if (answers(r->sock))
      return 0;
    if (waitpid(pid, NULL, WNOHANG) == pid) {
      r->pid = 0;
      return -1;
    }
    struct timespec ts = {0, 25 * 1000000};
    nanosleep(&ts, NULL);
  }
  return -1;
}

void th_redis_stop(struct th_redis *r, int hard) {
  if (r->pid <= 0)
    return;
  kill(r->pid, hard ? SIGKILL : SIGTERM);
  waitpid(r->pid, NULL, 0);
  r->pid = 0;
}

void th_redis_cleanup(struct th_redis *r) {
  th_redis_stop(r, 1);
  if (r->dir[0] == 0)
    return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", r->dir);
  r->dir[0] = 0;
}

int th_redis_cli(const struct th_redis *r, int bg, const char *const *args) {
  const char *av[32] = {"redis-cli", "-s", r->sock};
  int n = 3;
  for (int i = 0; args[i] != NULL && n < 31; i++)
    av[n++] = args[i];
  av[n] = NULL;
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    if (null >= 0)
      dup2(null, 1);
    execvp("redis-cli", (char *const *)av);
    _exit(127);
  }
  if (bg)
    return pid;
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

int th_redis_cli_out(const struct th_redis *r, const char *const *args,
                     char *out, size_t len) {
  const char *av[32] = {"redis-cli", "-s", r->sock};
  int n = 3;
  for (int i = 0; args[i] != NULL && n < 31; i++)
    av[n++] = args[i];
  av[n] = NULL;
  int fds[2];
  out[0] = 0;
  if (pipe(fds) != 0)
    return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execvp("redis-cli", (char *const *)av);
    _exit(127);
  }
  close(fds[1]);
  size_t got = 0;
  ssize_t k;
  while ((k = read(fds[0], out + got, len - 1 - got)) > 0 ||
         (k < 0 && errno == EINTR))
    if (k > 0 && (got += (size_t)k) == len - 1)
      break;
  out[got] = 0;
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  return st;
}

long long th_redis_info_int(const struct th_redis *r, const char *section,
                            const char *name) {
  static char buf[1 << 16];
  const char *args[] = {"INFO", section, NULL};
  if (th_redis_cli_out(r, args, buf, sizeof buf) != 0)
    return -1;
  char pat[128];
  snprintf(pat, sizeof pat, "%s:", name);
  for (const char *p = buf; (p = strstr(p, pat)) != NULL; p += strlen(pat))
    if (p == buf || p[-1] == '\n')
      return atoll(p + strlen(pat));
  return -1;
}

static char module_path[4200];

void th_redis_use_module(const char *argv0) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", argv0);
  snprintf(module_path, sizeof module_path, "%s/../libthrottle-redis.so.1",
           dirname(buf));
  setenv("THROTTLE_BACKEND_MODULE", module_path, 1);
}

void th_redis_module_again(void) {
  if (module_path[0] != 0)
    setenv("THROTTLE_BACKEND_MODULE", module_path, 1);
}
