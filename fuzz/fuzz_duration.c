/* SPDX-License-Identifier: MIT */
/*
 * fuzz_duration.c — throttlectl's duration syntax (tools/ctl_duration.c)
 * on arbitrary bytes (a NUL-terminated copy is parsed).
 *
 * A misread duration becomes a back-off, a deadline or a rate, so besides
 * "no crash" the harness checks what the syntax promises:
 *   - the result is 0 or -1; on -1 *ms is untouched and a reason is given;
 *   - an accepted input begins with a digit and holds only digits, '.' and
 *     the letters of the units (d h m s);
 *   - all digits parse as seconds, to the value computed here (saturating
 *     at UINT64_MAX ms); the same digits with "s" or "000ms" appended
 *     give the same value;
 *   - appending "0" to a fraction changes nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"

#include "../tools/ctl_duration.c"

#define SENTINEL UINT64_C(0xdeadbeefcafef00d)

static int parse(const char *s, uint64_t *ms) {
  char why[128] = "";
  *ms = SENTINEL;
  int rc = ctl_parse_duration(s, ms, why, sizeof why);
  CHECK(rc == 0 || rc == -1, "'%s': rc %d", s, rc);
  if (rc != 0) {
    CHECK(*ms == SENTINEL, "'%s': refused but *ms changed", s);
    CHECK(why[0] != 0, "'%s': refused without a reason", s);
  }
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 200)
    return 0;
  char s[256];
  memcpy(s, data, size);
  s[size] = 0;
  uint64_t ms;
  if (parse(s, &ms) != 0)
    return 0;
  CHECK(s[0] >= '0' && s[0] <= '9', "'%s' accepted", s);
  CHECK(strspn(s, "0123456789.dhms") == strlen(s), "'%s' accepted", s);
  size_t n = strlen(s);
  if (strspn(s, "0123456789") == n) {
    uint64_t want = 0;
    int sat = 0;
    for (size_t i = 0; i < n; i++) {
      unsigned d = (unsigned)(s[i] - '0');
      if (want > (UINT64_MAX - d) / 10)
        sat = 1;
      else
        want = want * 10 + d;
    }
    want = sat || want > UINT64_MAX / 1000 ? UINT64_MAX : want * 1000;
    CHECK(ms == want, "'%s': %llu, want %llu", s, (unsigned long long)ms,
          (unsigned long long)want);
    char t[264];
    uint64_t ms2;
    snprintf(t, sizeof t, "%ss", s);
    CHECK(parse(t, &ms2) == 0 && ms2 == ms, "'%s' and '%s' differ", s, t);
    snprintf(t, sizeof t, "%s000ms", s);
    if (ms != UINT64_MAX)
      CHECK(parse(t, &ms2) == 0 && ms2 == ms, "'%s' and '%s' differ", s, t);
  }
  if (strchr(s, '.') != NULL && n > 0 && s[n - 1] >= '0' && s[n - 1] <= '9') {
    char t[264];
    uint64_t ms2;
    snprintf(t, sizeof t, "%s0", s);
    /* only when the number with the fraction is the last one */
    const char *last = s + n;
    while (last > s && ((last[-1] >= '0' && last[-1] <= '9') || last[-1] == '.'))
      last--;
    if (strchr(last, '.') != NULL)
      CHECK(parse(t, &ms2) == 0 && ms2 == ms, "'%s' and '%s' differ", s, t);
  }
  return 0;
}
