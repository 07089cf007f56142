/* SPDX-License-Identifier: MIT */
/*
 * loader.c — load files into one table of the Hotdata API, politely.
 *
 *   loader [--key KEY] [--class live|backfill] [--retries N] [--timeout SEC]
 *          [-v] URL TABLE FILE...
 *
 * POSTs each FILE's bytes to URL/v1/tables/TABLE/load, one after the
 * other, through throttle_curl_perform().  Run eight of these against one
 * table and they share what the server says: a 409 RESOURCE_LOCKED with
 * "Retry-After: 5" seen by one holds back all eight for 5 s, then one of
 * them probes and the others follow only once it got in.  A 409 CONFLICT
 * is never retried.
 *
 * Prints one line per file:
 *
 *   FILE: ok (HTTP 200, 1 attempt, 0.02 s)
 *   FILE: permanent (HTTP 409 CONFLICT: table 'x' already exists)
 *   FILE: gave up (HTTP 409 RESOURCE_LOCKED after 11 attempts; server
 *         asks for 5.0 s)
 *
 * Options: --key KEY replaces the default throttle key (below); --class
 * backfill lets live loaders of the same key go first; --retries N re-sends
 * a refused file at most N times (default 10; waiting for the table is not
 * a re-send); --timeout SEC gives up on a file after SEC seconds, waiting
 * included; -v logs every attempt, answer and wait on stderr.
 *
 * Exit status: 0 when every file loaded, 1 when any was refused for good
 * (or could not be read or sent), else 75 (EX_TEMPFAIL) when any was still
 * refused for now at the end of its retry budget or timeout: run the
 * loader again later for those.
 *
 * `make` builds it as build/examples/loader; by hand, from the top of the
 * tree once the libraries are built:
 *   cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude \
 *      -o build/examples/loader examples/loader.c \
 *      build/libthrottle-curl.a build/libthrottle.a \
 *      -lcurl -ljansson -lpthread -lrt
 *
 * The throttle key defaults to "hotdata:HOST/TABLE", HOST being the URL's
 * host name: every loader of that table on this machine shares it, and
 * `throttlectl show hotdata:HOST/TABLE` shows what they are waiting for.
 * THROTTLE_SEGMENT in the environment selects another segment.
 */
#include <throttle.h>
#include <throttle_curl.h>

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EX_TEMPFAIL 75

static void usage(FILE *f) {
  fprintf(f,
          "usage: loader [--key KEY] [--class live|backfill] [--retries N]\n"
          "              [--timeout SEC] [-v] URL TABLE FILE...\n");
}

/* ---- the upload: a file streamed from disk ------------------------------- */

/* libcurl pulls the request body through this (CURLOPT_READFUNCTION), so a
 * large file is never held in memory. */
static size_t read_file(char *buf, size_t size, size_t nitems, void *userdata) {
  FILE *f = userdata;
  size_t n = fread(buf, size, nitems, f);
  if (n == 0 && ferror(f))
    return CURL_READFUNC_ABORT;
  return n;
}

/* A request refused with 409 RESOURCE_LOCKED is sent again, and its body
 * must then start from the beginning.  libcurl cannot rewind a read
 * callback between two transfers by itself; throttle_curl_perform() calls
 * this (registered with throttle_curl_policy_set_rewind()) before each
 * re-send. */
static int rewind_file(void *userdata, curl_off_t offset, int origin) {
  FILE *f = userdata;
  return fseeko(f, (off_t)offset, origin) == 0 ? CURL_SEEKFUNC_OK
                                               : CURL_SEEKFUNC_FAIL;
}

/* The server's 200 answer ({"loaded": N, ...}) is not needed here. */
static size_t discard(char *ptr, size_t size, size_t nmemb, void *userdata) {
  (void)ptr;
  (void)userdata;
  return size * nmemb;
}

/* ---- one file ------------------------------------------------------------ */

enum fate { FATE_OK, FATE_PERMANENT, FATE_TRANSIENT };

/* Load one file; prints its line and returns what became of it. */
static enum fate load(throttle_t *h, throttle_curl_policy_t *policy,
                      const char *url, const char *key, const char *path,
                      long timeout_s) {
  FILE *f = fopen(path, "rb");
  struct stat st;
  if (f == NULL || fstat(fileno(f), &st) != 0) {
    printf("%s: cannot read: %s\n", path, strerror(errno));
    if (f != NULL)
      fclose(f);
    return FATE_PERMANENT;
  }

  CURL *easy = curl_easy_init();
  if (easy == NULL) {
    printf("%s: out of memory\n", path);
    fclose(f);
    return FATE_PERMANENT;
  }
  curl_easy_setopt(easy, CURLOPT_URL, url);
  curl_easy_setopt(easy, CURLOPT_POST, 1L);
  curl_easy_setopt(easy, CURLOPT_READFUNCTION, read_file);
  curl_easy_setopt(easy, CURLOPT_READDATA, f);
  curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)st.st_size);
  /* The body goes as is; curl's default content type for a POST would be
   * application/x-www-form-urlencoded. */
  struct curl_slist *headers =
      curl_slist_append(NULL, "Content-Type: application/octet-stream");
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  /* One transfer may take this long; the throttle's waiting is separate. */
  curl_easy_setopt(easy, CURLOPT_TIMEOUT, timeout_s > 0 ? timeout_s : 300L);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  /* Where to seek the file to before a re-send (see rewind_file). */
  throttle_curl_policy_set_rewind(policy, rewind_file, f);

  throttle_curl_result_t *r = NULL;
  int rc = throttle_curl_perform(h, easy, key, policy, &r);
  enum fate fate;
  if (r == NULL) { /* only on bad arguments or no memory */
    printf("%s: error: %s\n", path, throttle_strerror(rc));
    fate = FATE_PERMANENT;
  } else {
    long status = throttle_curl_result_http_status(r);
    unsigned attempts = throttle_curl_result_attempts(r);
    double secs = (double)throttle_curl_result_elapsed(r) / 1000.0;
    const char *code = throttle_curl_result_error_code(r);
    switch (throttle_curl_result_status(r)) {
    case THROTTLE_CURL_OK:
      printf("%s: ok (HTTP %ld, %u attempt%s, %.2f s)\n", path, status,
             attempts, attempts == 1 ? "" : "s", secs);
      fate = FATE_OK;
      break;
    case THROTTLE_CURL_PERMANENT:
      /* e.g. 409 CONFLICT: sent once, never again */
      printf("%s: permanent (HTTP %ld %s: %s)\n", path, status, code,
             throttle_curl_result_error_message(r));
      fate = FATE_PERMANENT;
      break;
    case THROTTLE_CURL_GAVE_UP:
    case THROTTLE_CURL_CANCELED:
      /* still locked / overloaded when the budget ran out */
      if (status != 0)
        printf("%s: gave up (HTTP %ld %s after %u attempts; server asks for "
               "%.1f s)\n",
               path, status, code, attempts,
               (double)throttle_curl_result_retry_after(r) / 1000.0);
      else
        printf("%s: gave up (%s after %u attempts)\n", path,
               attempts > 0 ? throttle_curl_result_curl_error(r)
                            : throttle_strerror(throttle_curl_result_error(r)),
               attempts);
      fate = FATE_TRANSIENT;
      break;
    case THROTTLE_CURL_TRANSPORT:
      printf("%s: failed (%s)\n", path, throttle_curl_result_curl_error(r));
      fate = FATE_PERMANENT;
      break;
    default: /* THROTTLE_CURL_ERROR: a bad key, out of memory */
      printf("%s: error (%s: %s)\n", path,
             throttle_err_name(throttle_curl_result_error(r)),
             throttle_errmsg(h));
      fate = FATE_PERMANENT;
      break;
    }
    /* The throttle failed open: the file was sent without admission, its
     * back-off honoured by this process alone.  Say so, once per file. */
    if (!throttle_curl_result_admitted(r))
      fprintf(stderr,
              "loader: warning: %s sent without admission (%s); other "
              "loaders were not told to wait\n",
              path, throttle_err_name(throttle_curl_result_error(r)));
  }
  throttle_curl_result_free(r);
  curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  fclose(f);
  fflush(stdout);
  return fate;
}

/* ---- main ---------------------------------------------------------------- */

/* "hotdata:HOST/TABLE" for the URL's host. */
static int default_key(const char *url, const char *table, char *buf,
                       size_t len) {
  CURLU *u = curl_url();
  char *host = NULL;
  int ok = u != NULL && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK;
  if (ok)
    ok = snprintf(buf, len, "hotdata:%s/%s", host, table) < (int)len;
  curl_free(host);
  curl_url_cleanup(u);
  return ok ? 0 : -1;
}

static void log_line(void *userdata, const char *line) {
  fprintf(userdata, "loader[%ld]: %s\n", (long)getpid(), line);
}

int main(int argc, char **argv) {
  const char *key = NULL;
  throttle_class_t cls = THROTTLE_CLASS_LIVE;
  long retries = -1, timeout_s = 0;
  int verbose = 0, i = 1;

  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "-v") == 0) {
      verbose = 1;
    } else if (strcmp(a, "--key") == 0 && v != NULL) {
      key = v;
      i++;
    } else if (strcmp(a, "--class") == 0 && v != NULL) {
      if (strcmp(v, "live") == 0)
        cls = THROTTLE_CLASS_LIVE;
      else if (strcmp(v, "backfill") == 0)
        cls = THROTTLE_CLASS_BACKFILL;
      else {
        usage(stderr);
        return 64;
      }
      i++;
    } else if ((strcmp(a, "--retries") == 0 || strcmp(a, "--timeout") == 0) &&
               v != NULL) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*v == 0 || *end != 0 || n < 0 || n > 1000000) {
        usage(stderr);
        return 64;
      }
      if (a[2] == 'r')
        retries = n;
      else
        timeout_s = n;
      i++;
    } else {
      usage(stderr);
      return 64;
    }
  }
  if (argc - i < 3) {
    usage(stderr);
    return 64;
  }
  const char *base = argv[i], *table = argv[i + 1];
  char **files = argv + i + 2;
  int nfiles = argc - i - 2;

  char url[2048], keybuf[512];
  if (snprintf(url, sizeof url, "%s/v1/tables/%s/load", base, table) >=
      (int)sizeof url) {
    fprintf(stderr, "loader: URL too long\n");
    return 64;
  }
  if (key == NULL) {
    if (default_key(base, table, keybuf, sizeof keybuf) != 0) {
      fprintf(stderr, "loader: cannot read a host from %s\n", base);
      return 64;
    }
    key = keybuf;
  }

  /* The application owns libcurl's global state. */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    fprintf(stderr, "loader: curl_global_init failed\n");
    return 1;
  }

  /* Fail open: when the segment cannot be used, throttle_open() says why
   * and still returns a handle that works within this process.  A loader
   * must not stop loading because its throttle is broken. */
  throttle_t *h = NULL;
  if (throttle_open(NULL, &h) != 0) {
    if (h == NULL) {
      fprintf(stderr, "loader: out of memory\n");
      return 1;
    }
    fprintf(stderr,
            "loader: warning: %s (continuing; back-off holds within this "
            "process only)\n",
            throttle_errmsg(h));
  }

  /* One policy for every file: 10 re-sends by default, no deadline. */
  throttle_curl_policy_t *policy = NULL;
  if (throttle_curl_policy_new(&policy) != 0) {
    fprintf(stderr, "loader: out of memory\n");
    return 1;
  }
  throttle_curl_policy_set_class(policy, cls);
  throttle_curl_policy_set_sink(policy, discard, NULL);
  if (retries >= 0)
    throttle_curl_policy_set_retries(policy, (unsigned)retries);
  if (timeout_s > 0)
    throttle_curl_policy_set_deadline(policy, (uint64_t)timeout_s * 1000u);
  if (verbose)
    throttle_curl_policy_set_log(policy, log_line, stderr);

  int permanent = 0, transient = 0;
  for (int k = 0; k < nfiles; k++) {
    switch (load(h, policy, url, key, files[k], timeout_s)) {
    case FATE_OK:
      break;
    case FATE_PERMANENT:
      permanent++;
      break;
    case FATE_TRANSIENT:
      transient++;
      break;
    }
  }

  throttle_curl_policy_free(policy);
  throttle_close(h);
  curl_global_cleanup();
  return permanent ? 1 : transient ? EX_TEMPFAIL : 0;
}
