# libthrottle — build, test, install.
#
#   make                 libthrottle(-curl).a/.so.1, throttlectl, examples (in build/)
#   make demo            naive loaders vs libthrottle on a local mock server
#   make check           install missing build dependencies (Debian), run the tests
#   make torture         kill -9 torture (TORTURE_KILLS=N)
#   make asan | tsan     the tests under AddressSanitizer+UBSan / ThreadSanitizer
#   make valgrind        the tests under valgrind memcheck
#   make bench           benchmarks, printed as ratios to a baseline of the same run
#                        (BENCH_QUICK=1: smaller HTTP fleets, about half the time)
#   make install PREFIX=/usr/local DESTDIR=
#
# Every build flavour lives in its own directory (B=build, build/asan, ...),
# so switching flavours never mixes objects.

MAJOR   := 1
VERSION := 1.0.0
PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
B       ?= build

CC      ?= cc
OPT     ?= -O2 -g
SAN     ?=
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wformat=2
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) $(SAN) -fPIC \
              -fvisibility=hidden -Iinclude -Ilibthrottle $(CFLAGS)
LDLIBS_CORE := -lpthread -lrt

CORE_SRC := libthrottle/error.c libthrottle/clock.c libthrottle/segment.c \
            libthrottle/table.c libthrottle/handle.c libthrottle/backoff.c \
            libthrottle/gate.c libthrottle/gate_live.c libthrottle/gate_learn.c \
            libthrottle/gate_info.c libthrottle/scope.c \
            libthrottle/settings.c libthrottle/fault.c
CORE_HDR := include/throttle.h libthrottle/internal.h libthrottle/rng.h

# The http layer (libcurl + jansson) is a library of its own, so programs
# that only need the core do not pull in libcurl.
HTTP_SRC := $(sort $(wildcard libthrottle/http*.c))
HTTP_HDR := include/throttle_curl.h libthrottle/http_internal.h
LDLIBS_HTTP := -lcurl -ljansson

CORE_OBJ := $(CORE_SRC:libthrottle/%.c=$(B)/obj/%.o)
HTTP_OBJ := $(HTTP_SRC:libthrottle/%.c=$(B)/obj/%.o)
TEST_OBJ := $(CORE_SRC:libthrottle/%.c=$(B)/tobj/%.o) $(HTTP_SRC:libthrottle/%.c=$(B)/tobj/%.o)

TESTS    := $(sort $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c)))
TEST_HELPERS := $(wildcard tests/helpers.c)

.PHONY: all check deps asan tsan valgrind bench install clean tidy cppcheck torture demo tests-build examples

all: $(B)/libthrottle.a $(B)/libthrottle.so.$(MAJOR) $(B)/throttlectl \
     $(B)/libthrottle-curl.a $(B)/libthrottle-curl.so.$(MAJOR) examples

$(B)/obj/%.o: libthrottle/%.c $(CORE_HDR) $(wildcard $(HTTP_HDR)) | $(B)/obj
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_BUILDING -c -o $@ $<

# Test objects: the same sources with the crash points compiled in.
$(B)/tobj/%.o: libthrottle/%.c $(CORE_HDR) $(wildcard $(HTTP_HDR)) | $(B)/tobj
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_BUILDING -DTHROTTLE_TESTING -c -o $@ $<

$(B)/obj $(B)/tobj $(B)/tests $(B)/bench:
	mkdir -p $@

$(B)/libthrottle.a: $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(B)/libthrottle-testing.a: $(TEST_OBJ)
	rm -f $@ && ar rcs $@ $^

$(B)/libthrottle.so.$(MAJOR): $(CORE_OBJ) libthrottle/libthrottle.map
	$(CC) $(SAN) -shared -Wl,-soname,libthrottle.so.$(MAJOR) \
	  -Wl,--version-script=libthrottle/libthrottle.map -o $@ $(CORE_OBJ) $(LDLIBS_CORE)
	ln -sf libthrottle.so.$(MAJOR) $(B)/libthrottle.so

$(B)/libthrottle-curl.a: $(HTTP_OBJ)
	rm -f $@ && ar rcs $@ $^

$(B)/libthrottle-curl.so.$(MAJOR): $(HTTP_OBJ) $(B)/libthrottle.so.$(MAJOR) libthrottle/libthrottle.map
	$(CC) $(SAN) -shared -Wl,-soname,libthrottle-curl.so.$(MAJOR) \
	  -Wl,--version-script=libthrottle/libthrottle.map -o $@ $(HTTP_OBJ) \
	  -L$(B) -lthrottle $(LDLIBS_HTTP) $(LDLIBS_CORE)
	ln -sf libthrottle-curl.so.$(MAJOR) $(B)/libthrottle-curl.so

# throttlectl links statically, so it runs from the build tree as installed.
CTL_SRC := tools/throttlectl.c $(sort $(wildcard tools/ctl_*.c))
$(B)/throttlectl: $(CTL_SRC) $(wildcard tools/ctl.h) $(B)/libthrottle.a $(if $(HTTP_SRC),$(B)/libthrottle-curl.a) include/throttle.h
	$(CC) $(CFLAGS_ALL) -Itools -o $@ $(CTL_SRC) $(if $(HTTP_SRC),$(B)/libthrottle-curl.a) \
	  $(B)/libthrottle.a $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)

$(B)/tests/%: tests/%.c $(TEST_HELPERS) tests/helpers.h $(B)/libthrottle-testing.a $(B)/throttlectl | $(B)/tests
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_TESTING -Itests -o $@ $< $(TEST_HELPERS) \
	  $(B)/libthrottle-testing.a -lcmocka $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)

# ---- examples and the demo ----------------------------------------------

# Built as a user of the installed library would build them: public
# headers only, the static libraries, default visibility.
EXAMPLES := $(patsubst examples/%.c,$(B)/examples/%,$(wildcard examples/*.c))

examples: $(EXAMPLES)

$(B)/examples:
	mkdir -p $@

$(B)/examples/%: examples/%.c include/throttle.h include/throttle_curl.h \
                 $(B)/libthrottle-curl.a $(B)/libthrottle.a | $(B)/examples
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) $(SAN) -Iinclude $(CFLAGS) -o $@ $< \
	  $(B)/libthrottle-curl.a $(B)/libthrottle.a $(LDLIBS_HTTP) $(LDLIBS_CORE)

# The main job on a local mock server: naive loaders, then libthrottle.
demo: deps
	@$(MAKE) --no-print-directory B=$(B) all
	@B=$(B) sh tools/demo.sh

# ---- tests -------------------------------------------------------------

# Debian: install what the build needs when root, else print the command.
deps:
	@sh tools/deps.sh

RUN ?=
TEST_SCRIPTS := $(sort $(wildcard tests/test_*.sh))
check: deps
	@$(MAKE) --no-print-directory B=$(B) tests-build
	@B=$(B) RUN="$(RUN)" sh tests/run.sh $(TESTS) $(TEST_SCRIPTS)

tests-build: all $(TESTS) $(B)/tests/torture

asan: deps
	@$(MAKE) --no-print-directory B=build/asan OPT="-O1 -g" \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  tests-build
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  B=build/asan sh tests/run.sh $(patsubst $(B)/%,build/asan/%,$(TESTS))

# ThreadSanitizer covers the threaded tests (threads of one process sharing
# one mapping); TSan does not model futexes shared between processes.
TSAN_TESTS := $(sort $(patsubst tests/%.c,build/tsan/tests/%,$(wildcard tests/test_*thread*.c)))
# clang: gcc 12 rejects atomic_thread_fence under -fsanitize=thread.  (clang
# also flags positional initialisers that leave trailing fields to zero,
# which C defines and the option tables rely on.)
tsan: deps
	@$(MAKE) --no-print-directory B=build/tsan CC=clang OPT="-O1 -g" SAN="-fsanitize=thread" \
	  CFLAGS="-Wno-missing-field-initializers" tests-build
	@TSAN_OPTIONS=halt_on_error=1 B=build/tsan sh tests/run.sh $(TSAN_TESTS)

valgrind: deps
	@$(MAKE) --no-print-directory B=$(B) tests-build
	@B=$(B) RUN="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite" \
	  sh tests/run.sh $(TESTS)

# kill -9 torture: TORTURE_KILLS=N for a larger run.
TORTURE_KILLS ?= 2000
$(B)/tests/torture: tests/torture.c $(TEST_HELPERS) tests/helpers.h $(B)/libthrottle-testing.a | $(B)/tests
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_TESTING -Itests -o $@ $< $(TEST_HELPERS) \
	  $(B)/libthrottle-testing.a -lcmocka $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)

torture: deps $(B)/tests/torture
	$(B)/tests/torture --kills $(TORTURE_KILLS)

# ---- benchmarks --------------------------------------------------------

BENCHES := $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/bench_*.c))

$(B)/bench/%: bench/%.c $(wildcard bench/*.h) $(B)/libthrottle.a include/throttle.h | $(B)/bench
	$(CC) $(CFLAGS_ALL) -Ilibthrottle -o $@ $< $(B)/libthrottle.a $(LDLIBS_CORE) -lm

BENCH_QUICK ?= 0
bench: all $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done
	@echo "== bench/http_fleet.sh"; B=$(B) BENCH_QUICK=$(BENCH_QUICK) sh bench/http_fleet.sh
	@echo "== multi-table fleet: a workspace-wide 429, per-table signals vs scoped"
	@B=$(B) sh tests/test_scope_fleet.sh --publish 429=key | head -1
	@B=$(B) sh tests/test_scope_fleet.sh | head -1

# ---- analysers ---------------------------------------------------------
# Both must report nothing; .clang-tidy says which check is off and why.

tidy:
	clang-tidy --quiet $(CORE_SRC) $(HTTP_SRC) $(CTL_SRC) -- -std=c11 -D_GNU_SOURCE -Iinclude -Ilibthrottle -Itools

cppcheck:
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --inline-suppr -D_GNU_SOURCE -Iinclude -Ilibthrottle -Itools libthrottle tools

# ---- install -----------------------------------------------------------

install: all
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 0644 include/throttle.h $(DESTDIR)$(PREFIX)/include/
	install -m 0644 $(B)/libthrottle.a $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(B)/libthrottle.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/libthrottle.so.$(VERSION)
	ln -sf libthrottle.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libthrottle.so.$(MAJOR)
	ln -sf libthrottle.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/libthrottle.so
	install -m 0755 $(B)/throttlectl $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	  libthrottle/libthrottle.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/libthrottle.pc
	install -m 0644 include/throttle_curl.h $(DESTDIR)$(PREFIX)/include/
	install -m 0644 $(B)/libthrottle-curl.a $(DESTDIR)$(LIBDIR)/
	install -m 0755 $(B)/libthrottle-curl.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/libthrottle-curl.so.$(VERSION)
	ln -sf libthrottle-curl.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libthrottle-curl.so.$(MAJOR)
	ln -sf libthrottle-curl.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/libthrottle-curl.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@VERSION@|$(VERSION)|' \
	  libthrottle/libthrottle-curl.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/libthrottle-curl.pc

clean:
	rm -rf build

-include fuzz/fuzz.mk
