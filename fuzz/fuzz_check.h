/* SPDX-License-Identifier: MIT */
/*
 * fuzz_check.h — the invariant check every harness uses: on failure, say
 * which invariant and why, then abort so libFuzzer keeps the input.
 */
#ifndef THROTTLE_FUZZ_CHECK_H
#define THROTTLE_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "invariant failed: %s: ", #cond);                        \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#endif
