/* SPDX-License-Identifier: MIT */
/*
 * redis_url.c — the Redis backend's names: the URL a user gives (forms,
 * users and passwords, percent-escapes, the masked form every message
 * shows) and the key names in Redis (one hash tag per root scope,
 * percent-encoded so that no name can move the tag; redis.h, Keys).
 */
#include "redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_uint(const char *s, size_t n, unsigned long max,
                      unsigned long *out) {
  if (n == 0 || n > 10)
    return -1;
  unsigned long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (unsigned long)(s[i] - '0');
  }
  if (v > max)
    return -1;
  *out = v;
  return 0;
}

/* s[0..n) percent-decoded into out (len bytes); -1 if it does not fit or
 * holds a bad escape. */
static int pct_decode(const char *s, size_t n, char *out, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '%') {
      if (i + 2 >= n)
        return -1;
      char hx[3] = {s[i + 1], s[i + 2], 0}, *e;
      long v = strtol(hx, &e, 16);
      if (*e != 0 || v == 0)
        return -1;
      c = (char)v;
      i += 2;
    }
    if (o + 1 >= len)
      return -1;
    out[o++] = c;
  }
  out[o] = 0;
  return 0;
}

/* [[USER]:PASSWORD@] at p: user and password taken, *pp moved past it.
 * The URL shown in messages gets "***" for the password. */
static int parse_userinfo(struct rds *r, const char **pp, const char *lim) {
  const char *p = *pp;
  const char *at = NULL;
  for (const char *q = p; q < lim; q++)
    if (*q == '@')
      at = q;
  if (at == NULL)
    return 0;
  const char *colon = memchr(p, ':', (size_t)(at - p));
  if (colon == NULL) /* USER@ alone: no password to give */
    return -1;
  if (pct_decode(p, (size_t)(colon - p), r->user, sizeof r->user) != 0 ||
      pct_decode(colon + 1, (size_t)(at - colon - 1), r->password,
                 sizeof r->password) != 0 ||
      r->password[0] == 0)
    return -1;
  *pp = at + 1;
  return 0;
}

/* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (HOST a name, an IPv4
 * address or a bracketed IPv6 one) or unix://[[USER]:PASSWORD@]/PATH[?db=N]
 * (as redis-py spells it). */
int rds_parse_url(struct rds *r, const char *url, char *msg, size_t len) {
  unsigned long v;
  r->port = 6379;
  r->db = 0;
  if (strlen(url) >= sizeof r->url)
    goto bad;
  snprintf(r->url, sizeof r->url, "%s", url);
  const char *sep = strstr(url, "://");
  if (sep == NULL)
    goto bad;
  const char *scheme_end = sep + 3;
  if (strncmp(url, "unix://", 7) == 0) {
    const char *p = url + 7;
    const char *slash = strchr(p, '/');
    if (slash == NULL || parse_userinfo(r, &p, slash) != 0 || p != slash)
      goto bad;
    const char *path = p;
    const char *q = strchr(path, '?');
    size_t n = q ? (size_t)(q - path) : strlen(path);
    if (path[0] != '/' || n >= sizeof r->path || n < 2)
      goto bad;
    memcpy(r->path, path, n);
    r->path[n] = 0;
    if (q != NULL) {
      if (strncmp(q, "?db=", 4) != 0 ||
          parse_uint(q + 4, strlen(q + 4), 1000000, &v) != 0)
        goto bad;
      r->db = (int)v;
    }
    goto shown;
  }
  if (strncmp(url, "redis://", 8) != 0)
    goto bad;
  const char *p = url + 8;
  const char *slash = strchr(p, '/');
  const char *end = slash ? slash : p + strlen(p);
  if (parse_userinfo(r, &p, end) != 0)
    goto bad;
  const char *hs = p, *hend, *after;
  if (*p == '[') { /* [IPv6] */
    hs = p + 1;
    hend = memchr(hs, ']', (size_t)(end - hs));
    if (hend == NULL)
      goto bad;
    after = hend + 1;
    if (after != end && *after != ':')
      goto bad;
  } else {
    hend = memchr(p, ':', (size_t)(end - p));
    if (hend == NULL)
      hend = end;
    after = hend;
  }
  if (hend == hs || (size_t)(hend - hs) >= sizeof r->host)
    goto bad;
  memcpy(r->host, hs, (size_t)(hend - hs));
  r->host[hend - hs] = 0;
  if (after != end) {
    if (parse_uint(after + 1, (size_t)(end - after - 1), 65535, &v) != 0 ||
        v == 0)
      goto bad;
    r->port = (int)v;
  }
  if (slash != NULL && slash[1] != 0) {
    if (parse_uint(slash + 1, strlen(slash + 1), 1000000, &v) != 0)
      goto bad;
    r->db = (int)v;
  }
shown:
  if (r->password[0] != 0) {
    const char *at = strrchr(url, '@');
    snprintf(r->shown, sizeof r->shown, "%.*s%s:***%s",
             (int)(scheme_end - url), url, r->user, at);
  } else {
    snprintf(r->shown, sizeof r->shown, "%s", url);
  }
  return 0;
bad:;
  /* what comes before an '@' may be a password: not repeated */
  const char *at = strrchr(url, '@');
  snprintf(msg, len,
           "THROTTLE_BACKEND: '%s%.200s' is not "
           "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (HOST a name, an IPv4 "
           "address or [IPv6]), unix://[[USER]:PASSWORD@]/PATH[?db=N] or shm",
           at != NULL ? "***" : "", at != NULL ? at : url);
  return THROTTLE_EINVAL;
}

/* ---- key names --------------------------------------------------------- */

static size_t enc(char *out, size_t len, const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < n && o + 4 < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c <= ' ' || c >= 0x7f || c == '{' || c == '}' || c == '%' ||
        c == ':') {
      out[o++] = '%';
      out[o++] = hex[c >> 4];
      out[o++] = hex[c & 15];
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = 0;
  return o;
}

/* thr1:{ROOT}:kind:KEY; for kind "q" the prefix of the key's waiters'
 * wake-up lists, thr1:{ROOT}:q:KEY: (a waiter's id follows). */
void rds_key(char *out, size_t len, const char *kind, const char *key) {
  char root[THROTTLE__KEY_MAX * 3 + 1], k[THROTTLE__KEY_MAX * 3 + 1];
  const char *slash = strchr(key, '/');
  enc(root, sizeof root, key, slash ? (size_t)(slash - key) : strlen(key));
  enc(k, sizeof k, key, strlen(key));
  snprintf(out, len, "thr1:{%s}:%s:%s%s", root, kind, k,
           strcmp(kind, "q") == 0 ? ":" : "");
}

