/* SPDX-License-Identifier: MIT */
/*
 * error.c — the error table (generated from THROTTLE_ERRNO_MAP), the
 * per-thread "last error" message with context, and the version calls.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The message belongs to the calling thread and names the handle it was
 * about, so threads sharing a handle never read each other's half-written
 * text. */
static THROTTLE__TLS const throttle_t *msg_owner;
static THROTTLE__TLS char msg_buf[512];

THROTTLE_EXTERN const char *throttle_strerror(int err) {
  switch (err) {
#define XX(name, value, desc)                                                  \
  case value:                                                                  \
    return desc;
    THROTTLE_ERRNO_MAP(XX)
#undef XX
  }
  return "unknown error";
}

THROTTLE_EXTERN const char *throttle_err_name(int err) {
  switch (err) {
#define XX(name, value, desc)                                                  \
  case value:                                                                  \
    return "THROTTLE_" #name;
    THROTTLE_ERRNO_MAP(XX)
#undef XX
  }
  return "THROTTLE_UNKNOWN";
}

int throttle__fail(const throttle_t *h, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg_buf, sizeof msg_buf, fmt, ap);
  va_end(ap);
  msg_owner = h;
  return err;
}

void throttle__clear_msg(const throttle_t *h) {
  if (msg_owner == h) {
    msg_owner = NULL;
    msg_buf[0] = 0;
  }
}

/* A failed open frees its handle; its message moves to "no handle". */
void throttle__orphan_msg(const throttle_t *h) {
  if (msg_owner == h)
    msg_owner = NULL;
  else
    msg_buf[0] = 0;
}

THROTTLE_EXTERN const char *throttle_errmsg(const throttle_t *h) {
  if (msg_owner == h)
    return msg_buf;
  if (h != NULL)
    return h->open_msg;
  return "";
}

THROTTLE_EXTERN unsigned throttle_version(void) {
  return THROTTLE_VERSION_NUM;
}

THROTTLE_EXTERN const char *throttle_version_string(void) {
  return THROTTLE_VERSION_STRING;
}
