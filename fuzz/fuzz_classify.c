/* SPDX-License-Identifier: MIT */
/*
 * fuzz_classify.c — throttle_classify() on arbitrary answers.
 *
 * Input: the status as a big-endian 16-bit number modulo 1024 (so that
 * 0-99 and 1000-1023 probe the refusal of bad statuses), then the body.
 * The body is passed three ways: in a buffer of exactly its length (no
 * terminator, so AddressSanitizer sees any read past it), with a NUL byte
 * appended and counted, and NUL-terminated but not counted.  Each is
 * classified with the default policy (NULL and a fresh policy object), a
 * custom set of locked codes, and the empty set.
 *
 * Invariants (I2 — right class):
 *   - the result is 0, THROTTLE_EINVAL (exactly when the status is outside
 *     100-999) or THROTTLE_ENOMEM;
 *   - the outcome is one a classifier can give (never ABANDONED);
 *   - 2xx is OK, and its body is not read (code "");
 *   - 409 is never OK, and is LOCKED only when the code names a locked
 *     code of the policy (never with the empty set), FAILED only with a
 *     non-empty set (a body that did not parse but names a locked code);
 *   - only 409 is LOCKED, 429 exactly RATE_LIMITED, 503 exactly
 *     UNAVAILABLE;
 *   - the code is NUL-terminated within its buffer, and a short buffer
 *     holds a prefix of what a long one holds;
 *   - NULL and a default policy object agree.
 */
#include "throttle_curl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

static throttle_curl_policy_t *dflt, *custom, *none;
static const char *const custom_codes[] = {"TABLE_LOCKED", "BUSY",
                                           "VERROUILL\xc3\x89"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (throttle_curl_policy_new(&dflt) != 0 ||
      throttle_curl_policy_new(&custom) != 0 ||
      throttle_curl_policy_new(&none) != 0 ||
      throttle_curl_policy_set_locked_codes(custom, custom_codes, 3) != 0 ||
      throttle_curl_policy_set_locked_codes(none, NULL, 0) != 0) {
    fprintf(stderr, "policy setup failed\n");
    abort();
  }
  return 0;
}

static int in_set(const char *code, const char *const *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(code, set[i]) == 0)
      return 1;
  return 0;
}

struct answer {
  int rc;
  throttle_outcome_t outcome;
  char code[300];
};

static struct answer classify(const throttle_curl_policy_t *p, long status,
                              const char *body, size_t len) {
  struct answer a;
  memset(a.code, 'x', sizeof a.code);
  a.outcome = (throttle_outcome_t)-1;
  a.rc = throttle_classify(p, status, body, len, &a.outcome, a.code,
                           sizeof a.code);
  if (a.rc != THROTTLE_EINVAL)
    CHECK(memchr(a.code, 0, sizeof a.code) != NULL, "code not terminated");
  return a;
}

static void check(const throttle_curl_policy_t *p, const char *const *set,
                  size_t nset, long status, const char *body, size_t len) {
  struct answer a = classify(p, status, body, len);
  int valid = status >= 100 && status <= 999;
  if (!valid) {
    CHECK(a.rc == THROTTLE_EINVAL, "status %ld: rc %d", status, a.rc);
    return;
  }
  CHECK(a.rc == 0 || a.rc == THROTTLE_ENOMEM, "status %ld: rc %d (%s)",
        status, a.rc, throttle_err_name(a.rc));
  throttle_outcome_t o = a.outcome;
  CHECK(o == THROTTLE_OUTCOME_OK || o == THROTTLE_OUTCOME_LOCKED ||
            o == THROTTLE_OUTCOME_RATE_LIMITED ||
            o == THROTTLE_OUTCOME_UNAVAILABLE ||
            o == THROTTLE_OUTCOME_PERMANENT || o == THROTTLE_OUTCOME_FAILED,
        "status %ld: outcome %d", status, (int)o);
  if (status >= 200 && status <= 299) {
    CHECK(o == THROTTLE_OUTCOME_OK, "2xx %ld: outcome %d", status, (int)o);
    CHECK(a.code[0] == 0, "2xx %ld: code \"%s\"", status, a.code);
  } else {
    CHECK(o != THROTTLE_OUTCOME_OK, "%ld: OK", status);
  }
  if (status == 409) {
    /* FAILED: a body that did not parse but names a locked code */
    CHECK(o == THROTTLE_OUTCOME_LOCKED || o == THROTTLE_OUTCOME_PERMANENT ||
              (o == THROTTLE_OUTCOME_FAILED && nset > 0),
          "409: outcome %d", (int)o);
    if (o == THROTTLE_OUTCOME_LOCKED)
      CHECK(nset > 0 && in_set(a.code, set, nset),
            "409 LOCKED with code \"%s\" not in the policy's set", a.code);
  } else {
    CHECK(o != THROTTLE_OUTCOME_LOCKED, "%ld: LOCKED", status);
  }
  CHECK((status == 429) == (o == THROTTLE_OUTCOME_RATE_LIMITED),
        "%ld: outcome %d", status, (int)o);
  CHECK((status == 503) == (o == THROTTLE_OUTCOME_UNAVAILABLE),
        "%ld: outcome %d", status, (int)o);

  /* A short code buffer: truncated, terminated, a prefix of the long one,
   * and the same outcome (the comparison uses the whole code). */
  char small[4] = {'x', 'x', 'x', 'x'};
  throttle_outcome_t o2 = (throttle_outcome_t)-1;
  int rc2 = throttle_classify(p, status, body, len, &o2, small, sizeof small);
  CHECK(rc2 == a.rc || rc2 == THROTTLE_ENOMEM || a.rc == THROTTLE_ENOMEM,
        "rc %d then %d", a.rc, rc2);
  if (rc2 == a.rc) {
    CHECK(o2 == o, "outcome %d with a long code buffer, %d with a short one",
          (int)o, (int)o2);
    CHECK(memchr(small, 0, sizeof small) != NULL, "short code not terminated");
    CHECK(strncmp(small, a.code, strlen(small)) == 0 &&
              strlen(small) == (strlen(a.code) < 3 ? strlen(a.code) : 3),
          "short code \"%s\", long \"%s\"", small, a.code);
  }
  /* No code buffer at all. */
  throttle_outcome_t o3 = (throttle_outcome_t)-1;
  int rc3 = throttle_classify(p, status, body, len, &o3, NULL, 0);
  if (rc3 == a.rc)
    CHECK(o3 == o, "outcome %d with a code buffer, %d without", (int)o,
          (int)o3);
}

static const char *const default_set[] = {"RESOURCE_LOCKED"};

static void check_all(long status, const char *body, size_t len) {
  check(NULL, default_set, 1, status, body, len);
  check(dflt, default_set, 1, status, body, len);
  check(custom, custom_codes, 3, status, body, len);
  check(none, NULL, 0, status, body, len);
  struct answer a = classify(NULL, status, body, len);
  struct answer b = classify(dflt, status, body, len);
  if (a.rc == 0 && b.rc == 0)
    CHECK(a.outcome == b.outcome && strcmp(a.code, b.code) == 0,
          "NULL policy and default policy disagree");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  long status = (long)(((unsigned)data[0] << 8 | data[1]) % 1024);
  size_t len = size - 2;

  /* Exactly len bytes: no terminator to lean on. */
  char *exact = malloc(len ? len : 1);
  if (exact == NULL)
    return 0;
  memcpy(exact, data + 2, len);
  check_all(status, len ? exact : NULL, len);
  free(exact);

  /* NUL-terminated, with and without the NUL counted. */
  char *z = malloc(len + 1);
  if (z == NULL)
    return 0;
  memcpy(z, data + 2, len);
  z[len] = 0;
  check_all(status, z, len + 1);
  check_all(status, z, len);
  free(z);

  /* Argument checks. */
  throttle_outcome_t o;
  CHECK(throttle_classify(NULL, status, NULL, 1, &o, NULL, 0) ==
            THROTTLE_EINVAL,
        "body NULL with len 1");
  CHECK(throttle_classify(NULL, status, "", 0, NULL, NULL, 0) ==
            THROTTLE_EINVAL,
        "outcome NULL");
  CHECK(throttle_classify(NULL, status, "", 0, &o, NULL, 5) ==
            THROTTLE_EINVAL,
        "code NULL with code_len 5");
  return 0;
}
