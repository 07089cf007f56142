# SPDX-License-Identifier: MIT
# fuzz/fuzz.mk — libFuzzer targets; included by the top-level Makefile.
#
#   make fuzz            build every target and run each for FUZZ_SECONDS
#                        (default 60) on its corpus and dictionary
#   make fuzz-smoke      the same for 10 s each (CI)
#   make fuzz-regress    replay fuzz/crashers/<target>/* and the seed corpus
#                        through each target once; fails on any crash
#
#   FUZZ_SECONDS=600 make fuzz        a longer run
#   FUZZ_TARGETS="segment" make fuzz  one target
#   FUZZ_ARGS="-jobs=1 -workers=1"    extra libFuzzer flags
#
# Each target fuzzes a working corpus in $(B)/fuzz/corpus/<target> (grown by
# the run, never committed) seeded from fuzz/corpus/<target>.  A crash is
# written to $(B)/fuzz/artifacts/<target>/; once the bug is fixed, copy the
# file to fuzz/crashers/<target>/ so fuzz-regress replays it for good.
#
# clang with libFuzzer is required (Debian: clang-14 libclang-rt-14-dev).
# UBSan findings abort (-fno-sanitize-recover) so that the fuzzer counts
# them as crashes instead of printing them and moving on.

FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= retry_after classify segment mutex duration
FUZZ_ARGS    ?=
FUZZ_B       := $(B)/fuzz
FUZZ_CFLAGS  := -g -O1 -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=all -fno-omit-frame-pointer \
                -DTHROTTLE_BUILDING -Iinclude -Ilibthrottle -std=c11 \
                -D_GNU_SOURCE
FUZZ_LDLIBS  := -lcurl -ljansson -lz -lpthread -lrt
FUZZ_LIB_OBJ := $(patsubst libthrottle/%.c,$(FUZZ_B)/obj/%.o,$(CORE_SRC) $(HTTP_SRC))
FUZZ_BINS    := $(patsubst %,$(FUZZ_B)/fuzz_%,$(FUZZ_TARGETS))
# Per target: -max_len (the segment images need room for a few records).
FUZZ_MAXLEN_retry_after := 256
FUZZ_MAXLEN_classify    := 4096
FUZZ_MAXLEN_segment     := 32768
FUZZ_MAXLEN_mutex       := 64
FUZZ_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 \
            UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-regress

$(FUZZ_B)/obj $(FUZZ_B)/corpus $(FUZZ_B)/artifacts:
	mkdir -p $@

$(FUZZ_B)/obj/%.o: libthrottle/%.c $(CORE_HDR) $(wildcard $(HTTP_HDR))
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c -o $@ $<

$(FUZZ_B)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_check.h $(FUZZ_LIB_OBJ) $(CORE_HDR) $(wildcard $(HTTP_HDR))
	$(FUZZ_CC) $(FUZZ_CFLAGS) -Wall -Wextra -Werror -o $@ $< $(FUZZ_LIB_OBJ) $(FUZZ_LDLIBS)

# Built by a pattern chain, the objects would count as intermediate (and be
# deleted after every build).
.SECONDARY: $(FUZZ_LIB_OBJ)

# The duration target includes throttlectl's parser.
$(FUZZ_B)/fuzz_duration: tools/ctl_duration.c tools/ctl.h

fuzz-build: $(FUZZ_BINS)

# $(call fuzz_run,SECONDS): run every target in turn; report the final
# "#N DONE cov: ... exec/s: ..." line of each; fail if any target crashed.
define fuzz_run
	@fail=0; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_B)/corpus/$$t $(FUZZ_B)/artifacts/$$t; \
	  case $$t in \
	    retry_after) ml=$(FUZZ_MAXLEN_retry_after);; \
	    classify) ml=$(FUZZ_MAXLEN_classify);; \
	    segment) ml=$(FUZZ_MAXLEN_segment);; \
	    *) ml=$(FUZZ_MAXLEN_mutex);; \
	  esac; \
	  echo "== fuzz_$$t ($(1) s)"; \
	  $(FUZZ_ENV) $(FUZZ_B)/fuzz_$$t -max_total_time=$(1) -timeout=5 \
	    -max_len=$$ml -dict=fuzz/dict/$$t.dict -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_B)/artifacts/$$t/ $(FUZZ_ARGS) \
	    $(FUZZ_B)/corpus/$$t fuzz/corpus/$$t > $(FUZZ_B)/$$t.log 2>&1; \
	  rc=$$?; \
	  grep -a 'DONE' $(FUZZ_B)/$$t.log | tail -n 1; \
	  if [ $$rc -ne 0 ]; then \
	    fail=1; tail -n 40 $(FUZZ_B)/$$t.log; \
	    echo "fuzz_$$t FAILED (exit $$rc); input in $(FUZZ_B)/artifacts/$$t/, log in $(FUZZ_B)/$$t.log"; \
	  fi; \
	done; exit $$fail
endef

fuzz: fuzz-build
	$(call fuzz_run,$(FUZZ_SECONDS))

# CI: a fixed seed, so a failure there is one anyone can replay.
fuzz-smoke: FUZZ_ARGS += -seed=1
fuzz-smoke: fuzz-build
	$(call fuzz_run,10)

# Each file given to a libFuzzer binary is run once; a crash, a failed
# invariant or a hang (-timeout) exits non-zero.
fuzz-regress: fuzz-build
	@fail=0; for t in $(FUZZ_TARGETS); do \
	  files=$$(find fuzz/crashers/$$t fuzz/corpus/$$t -type f 2>/dev/null | sort); \
	  [ -n "$$files" ] || continue; \
	  n=$$(echo "$$files" | wc -l); \
	  if $(FUZZ_ENV) $(FUZZ_B)/fuzz_$$t -timeout=5 $$files > $(FUZZ_B)/$$t-regress.log 2>&1; then \
	    echo "fuzz_$$t: $$n inputs replayed, no crash"; \
	  else \
	    fail=1; tail -n 40 $(FUZZ_B)/$$t-regress.log; echo "fuzz_$$t: REGRESSION"; \
	  fi; \
	done; exit $$fail
