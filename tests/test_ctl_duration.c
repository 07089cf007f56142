/* SPDX-License-Identifier: MIT */
/*
 * test_ctl_duration.c — throttlectl's one duration syntax
 * (tools/ctl_duration.c), called directly: what it accepts and to how many
 * milliseconds (rounded up, saturating), what it refuses and the reason it
 * gives, and every short string over its alphabet (no crash, no read past
 * the end, an accepted one is made only of digits, '.' and units).  The
 * commands that take a duration are test_throttlectl's
 * durations_everywhere.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tools/ctl_duration.c"

static void accepts(const char *s, uint64_t want) {
  uint64_t ms = 12345;
  char why[128] = "";
  int rc = ctl_parse_duration(s, &ms, why, sizeof why);
  if (rc != 0 || ms != want)
    print_message("'%s': rc %d, %llu ms (want %llu), %s\n", s, rc,
                  (unsigned long long)ms, (unsigned long long)want, why);
  assert_int_equal(rc, 0);
  assert_true(ms == want);
}

static void refuses(const char *s, const char *because) {
  uint64_t ms = 12345;
  char why[128] = "";
  int rc = ctl_parse_duration(s, &ms, why, sizeof why);
  if (rc == 0 || strstr(why, because) == NULL)
    print_message("'%s': rc %d, why '%s' (want '%s')\n", s, rc, why, because);
  assert_int_equal(rc, -1);
  assert_non_null(strstr(why, because));
  assert_true(ms == 12345); /* untouched */
  /* why may be NULL */
  assert_int_equal(ctl_parse_duration(s, &ms, NULL, 0), -1);
}

static void test_ctl_duration_accepts_units_and_seconds(void **state) {
  (void)state;
  accepts("5", 5000);
  accepts("0", 0);
  accepts("007", 7000);
  accepts("1.5", 1500);
  accepts("1.5s", 1500);
  accepts("250ms", 250);
  accepts("5m", 300000);
  accepts("1h", 3600000);
  accepts("2d", 172800000);
  accepts("1h30m", 5400000);
  accepts("1d2h3m4s5ms", 93784005);
  accepts("0.5m", 30000);
  accepts("1.25h", 4500000);
  accepts("0s", 0);
}

static void test_ctl_duration_rounds_up_and_saturates(void **state) {
  (void)state;
  accepts("0.0001", 1);      /* never shortened to nothing */
  accepts("0.5ms", 1);
  accepts("1.001ms", 2);
  accepts("0.0000000000000000001s", 1); /* past 18 digits still counts */
  accepts("1.0000000000000000000s", 1000);
  accepts("18446744073709551615ms", UINT64_MAX);
  accepts("18446744073709551616ms", UINT64_MAX);
  accepts("99999999999999999999999999999999d", UINT64_MAX);
  accepts("18446744073709551d1ms", UINT64_MAX);
  accepts("18446744073709551", UINT64_C(18446744073709551000));
  accepts("18446744073709552", UINT64_MAX); /* seconds, saturated */
}

static void test_ctl_duration_refuses_with_the_reason(void **state) {
  (void)state;
  refuses("", "empty");
  refuses("-5", "no negative");
  refuses("+5", "no sign");
  refuses(" 5", "no spaces");
  refuses("5 m", "no spaces");
  refuses("5s ", "no spaces");
  refuses(".5", "a digit must come before '.'");
  refuses("1.", "a digit must follow '.'");
  refuses("1.s", "a digit must follow '.'");
  refuses("5x", "unknown unit 'x'");
  refuses("5min", "unknown unit 'min'");
  refuses("5sec", "unknown unit 'sec'");
  refuses("1e3", "unknown unit 'e'");
  refuses("0x10", "unknown unit 'x'");
  refuses("1h30", "'30' needs a unit");
  refuses("30m1h", "largest first");
  refuses("1m1m", "largest first");
  refuses("1ms1s", "largest first");
  refuses("abc", "where a number must be");
  refuses("m", "where a number must be");
  refuses("5m-1s", "no negative");
  refuses("5,5", "needs a unit");
  refuses("inf", "where a number must be");
}

/* Every string of up to 4 characters over the syntax's alphabet and a few
 * strangers: no crash, and whatever is accepted uses only that alphabet
 * and begins with a digit.  (fuzz/fuzz_duration.c goes further.) */
static void test_ctl_duration_every_short_string(void **state) {
  (void)state;
  static const char alpha[] = "09.msdhx -";
  const size_t na = sizeof alpha - 1;
  char s[5];
  unsigned long accepted = 0, total = 0;
  for (size_t len = 0; len <= 4; len++) {
    size_t n = 1;
    for (size_t i = 0; i < len; i++)
      n *= na;
    for (size_t k = 0; k < n; k++) {
      size_t v = k;
      for (size_t i = 0; i < len; i++, v /= na)
        s[i] = alpha[v % na];
      s[len] = 0;
      uint64_t ms;
      char why[128];
      total++;
      if (ctl_parse_duration(s, &ms, why, sizeof why) == 0) {
        accepted++;
        assert_true(s[0] >= '0' && s[0] <= '9');
        assert_null(strpbrk(s, "x -"));
      } else {
        assert_true(strlen(why) > 0);
      }
    }
  }
  print_message("%lu strings, %lu accepted\n", total, accepted);
  assert_true(accepted > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ctl_duration_accepts_units_and_seconds),
      cmocka_unit_test(test_ctl_duration_rounds_up_and_saturates),
      cmocka_unit_test(test_ctl_duration_refuses_with_the_reason),
      cmocka_unit_test(test_ctl_duration_every_short_string),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
