# SPDX-License-Identifier: MIT
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
#   make install PREFIX=/usr/local DESTDIR=   (LIBDIR=/usr/lib/x86_64-linux-gnu
#                        for a multiarch layout); make uninstall, same vars
#   make WERROR=1        warnings are errors (CI and development; local.mk)
#
# Every build flavour lives in its own directory (B=build, build/asan, ...),
# so switching flavours never mixes objects.

MAJOR   := 1
VERSION := 1.1.0
# A git-ignored local.mk may set WERROR=1 (or anything else) for a
# developer's every build; CI passes WERROR=1 itself.
-include local.mk

PREFIX  ?= /usr/local
LIBDIR  ?= $(PREFIX)/lib
BINDIR  ?= $(PREFIX)/bin
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
MANDIR  ?= $(DATADIR)/man
B       ?= build

CC      ?= cc
OPT     ?= -O2 -g
SAN     ?=
# -Werror only where asked (WERROR=1: CI, development): a user's newer
# compiler may add a warning, and that must not break their build.
# Positional initialisers that leave trailing fields zero are C and the
# option tables use them; clang's -Wextra flags them, gcc's does not.
WERROR  ?= 0
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wformat=2 \
           -Wno-missing-field-initializers $(if $(filter 1,$(WERROR)),-Werror)
# CPPFLAGS, CFLAGS and LDFLAGS are the user's (dpkg-buildflags sets all
# three) and come last, so they win.
# Dependencies through pkg-config (PKG_CONFIG: a cross build's
# <triplet>-pkg-config), with the plain -l flags where it has no answer.
PKG_CONFIG ?= pkg-config
pc = $(or $(shell $(PKG_CONFIG) $(1) $(2) 2>/dev/null),$(3))
DEP_CFLAGS := $(call pc,--cflags,libcurl jansson zlib,)
CFLAGS_ALL := -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) $(SAN) -fPIC \
              -fvisibility=hidden -Iinclude -Ilibthrottle $(DEP_CFLAGS) \
              $(CPPFLAGS) $(CFLAGS)
LDLIBS_CORE := -lpthread -lrt

# The library's layers, each a folder of libthrottle/ (README.md there, and
# the README's Layout): core/ (errors, clock, faults, text), shm/ (the
# segment backend), api/ (the public entry points and the choice of
# backend), each calling only downward; http/ and redis/ below.
CORE_SRC := $(addprefix libthrottle/core/,error.c clock.c fault.c text.c) \
            $(addprefix libthrottle/shm/,segment.c table.c gate_rec.c \
              gate_grant.c gate_live.c gate_learn.c gate_info.c scope.c \
              repair.c segment_ops.c segment_backoff.c gate_enter.c \
              segment_settings.c segment_table.c) \
            $(addprefix libthrottle/api/,handle.c backoff.c gate.c \
              settings.c refusal.c backend.c)
CORE_HDR := include/throttle.h libthrottle/internal.h libthrottle/core/rng.h \
            libthrottle/backend.h libthrottle/core/env.h \
            libthrottle/shm/segment_fast.h

# The http layer (libcurl + jansson) is a library of its own, so programs
# that only need the core do not pull in libcurl.
HTTP_SRC := $(sort $(wildcard libthrottle/http/http_*.c))
HTTP_HDR := include/throttle_curl.h libthrottle/http/http_internal.h
LDLIBS_HTTP := $(call pc,--libs,libcurl jansson zlib,-lcurl -ljansson -lz)

# The Redis backend: a module of its own (hiredis), dlopen()ed by the core
# only when THROTTLE_BACKEND asks for it.  Its C files and its Lua scripts
# live in libthrottle/redis/; each script is built into a C string with
# common.lua in front of it.
REDIS_SRC := $(sort $(wildcard libthrottle/redis/redis_*.c))
REDIS_LUA := enter leave peek set info beat
REDIS_OBJ := $(REDIS_SRC:libthrottle/%.c=$(B)/obj/%.o) $(if $(REDIS_SRC),$(B)/obj/redis/redis_lua.o)
LDLIBS_REDIS := $(call pc,--libs,hiredis,-lhiredis) -lpthread
REDIS_CFLAGS := $(call pc,--cflags,hiredis,)

CORE_OBJ := $(CORE_SRC:libthrottle/%.c=$(B)/obj/%.o)
HTTP_OBJ := $(HTTP_SRC:libthrottle/%.c=$(B)/obj/%.o)
TEST_OBJ := $(CORE_SRC:libthrottle/%.c=$(B)/tobj/%.o) $(HTTP_SRC:libthrottle/%.c=$(B)/tobj/%.o)

TESTS    := $(sort $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c)))
TEST_HELPERS := $(wildcard tests/helpers.c tests/redis_helpers.c)

.PHONY: all check deps asan tsan valgrind bench install uninstall man clean tidy cppcheck torture demo tests-build examples

all: $(B)/libthrottle.a $(B)/libthrottle.so.$(MAJOR) $(B)/throttlectl \
     $(B)/libthrottle-curl.a $(B)/libthrottle-curl.so.$(MAJOR) examples \
     $(if $(REDIS_SRC),$(B)/libthrottle-redis.so.$(MAJOR))

$(B)/obj/%.o: libthrottle/%.c $(CORE_HDR) $(wildcard $(HTTP_HDR))
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_BUILDING -c -o $@ $<

# Test objects: the same sources with the crash points compiled in.
$(B)/tobj/%.o: libthrottle/%.c $(CORE_HDR) $(wildcard $(HTTP_HDR))
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_BUILDING -DTHROTTLE_TESTING -c -o $@ $<

$(B)/tests $(B)/bench:
	mkdir -p $@

$(B)/libthrottle.a: $(CORE_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(B)/libthrottle-testing.a: $(TEST_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(B)/libthrottle.so.$(MAJOR): $(CORE_OBJ) libthrottle/libthrottle.map
	$(CC) $(SAN) $(LDFLAGS) -shared -Wl,-soname,libthrottle.so.$(MAJOR) \
	  -Wl,--version-script=libthrottle/libthrottle.map -o $@ $(CORE_OBJ) $(LDLIBS_CORE)
	ln -sf libthrottle.so.$(MAJOR) $(B)/libthrottle.so

$(B)/gen:
	mkdir -p $@

# Every script line becomes a line of a C string literal, in two forms
# (redis.h, Scripts): each script with common.lua in front of it, for
# EVAL; and one Functions library of common.lua and a function per
# script, named after a digest of the sources, so that two versions of
# the module never call each other's.  Each script calls begin() itself.
LUA_C = sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/  "/' -e 's/$$/\\n"/'
$(B)/gen/redis_lua.c: $(REDIS_LUA:%=libthrottle/redis/%.lua) libthrottle/redis/common.lua Makefile | $(B)/gen
	{ echo '#!lua name=libthrottle_@V@'; cat libthrottle/redis/common.lua; \
	  for f in $(REDIS_LUA); do \
	    echo "redis.register_function('thr_@V@_$$f', function(KEYS, ARGV)"; \
	    cat libthrottle/redis/$$f.lua; echo 'end)'; \
	  done; } > $@.lib && \
	v=$$(sha1sum < $@.lib | cut -c1-16) && \
	{ echo '/* generated by the Makefile from libthrottle/redis/ */'; \
	  echo '#include "redis/redis.h"'; \
	  echo 'const char *const rds_scripts[RDS_NSCRIPTS] = {'; \
	  for f in $(REDIS_LUA); do \
	    cat libthrottle/redis/common.lua libthrottle/redis/$$f.lua | $(LUA_C); \
	    echo '  ,'; \
	  done; echo '};'; \
	  echo 'const char *const rds_functions[RDS_NSCRIPTS] = {'; \
	  for f in $(REDIS_LUA); do echo "  \"thr_$${v}_$$f\","; done; echo '};'; \
	  echo 'const char rds_library[] ='; \
	  sed "s/@V@/$$v/g" $@.lib | $(LUA_C); \
	  echo '  ;'; } > $@.tmp && rm -f $@.lib && mv $@.tmp $@

$(B)/obj/redis/redis_lua.o: $(B)/gen/redis_lua.c libthrottle/redis/redis.h libthrottle/backend.h $(CORE_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(REDIS_CFLAGS) -DTHROTTLE_BUILDING -c -o $@ $<

$(B)/obj/redis/redis_%.o: libthrottle/redis/redis_%.c libthrottle/redis/redis.h libthrottle/backend.h $(CORE_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_ALL) $(REDIS_CFLAGS) -DTHROTTLE_BUILDING -c -o $@ $<

# Its one symbol carries a version (libthrottle-redis.map), as the core's do.
$(B)/libthrottle-redis.so.$(MAJOR): $(REDIS_OBJ) libthrottle/libthrottle-redis.map
	$(CC) $(SAN) $(LDFLAGS) -shared -Wl,-soname,libthrottle-redis.so.$(MAJOR) \
	  -Wl,--version-script=libthrottle/libthrottle-redis.map -o $@ \
	  $(REDIS_OBJ) $(LDLIBS_REDIS)

$(B)/libthrottle-curl.a: $(HTTP_OBJ)
	rm -f $@ && $(AR) rcs $@ $^

$(B)/libthrottle-curl.so.$(MAJOR): $(HTTP_OBJ) $(B)/libthrottle.so.$(MAJOR) libthrottle/libthrottle.map
	$(CC) $(SAN) $(LDFLAGS) -shared -Wl,-soname,libthrottle-curl.so.$(MAJOR) \
	  -Wl,--version-script=libthrottle/libthrottle.map -o $@ $(HTTP_OBJ) \
	  -L$(B) -lthrottle $(LDLIBS_HTTP) $(LDLIBS_CORE)
	ln -sf libthrottle-curl.so.$(MAJOR) $(B)/libthrottle-curl.so

# throttlectl links statically by default, so it runs from the build tree
# as installed; THROTTLECTL_LINK=shared links it against libthrottle.so.1
# and libthrottle-curl.so.1 instead (a distribution's package, so that a
# library fix reaches it; from the build tree it then needs
# LD_LIBRARY_PATH=$(B)).
THROTTLECTL_LINK ?= static
CTL_SRC := tools/throttlectl.c $(sort $(wildcard tools/ctl_*.c))
ifeq ($(THROTTLECTL_LINK),shared)
CTL_LIBS := $(B)/libthrottle-curl.so.$(MAJOR) $(B)/libthrottle.so.$(MAJOR)
CTL_LINK := -L$(B) -lthrottle-curl -lthrottle $(LDLIBS_HTTP) $(LDLIBS_CORE)
else
CTL_LIBS := $(B)/libthrottle.a $(if $(HTTP_SRC),$(B)/libthrottle-curl.a)
CTL_LINK := $(if $(HTTP_SRC),$(B)/libthrottle-curl.a) $(B)/libthrottle.a \
            $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)
endif
$(B)/throttlectl: $(CTL_SRC) $(wildcard tools/ctl.h) $(CTL_LIBS) include/throttle.h
	$(CC) $(CFLAGS_ALL) -Itools $(LDFLAGS) -o $@ $(CTL_SRC) $(CTL_LINK)

$(B)/tests/%: tests/%.c $(TEST_HELPERS) tests/helpers.h $(B)/libthrottle-testing.a $(B)/throttlectl | $(B)/tests
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_TESTING -Itests $(LDFLAGS) -o $@ $< $(TEST_HELPERS) \
	  $(B)/libthrottle-testing.a -lcmocka $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)

# The scope contracts on Redis reuse test_scope.c's bodies.
$(B)/tests/test_redis_scope: tests/test_scope.c

# The contract cases, written once, linked into one program per backend.
CONTRACT_TESTS := $(B)/tests/test_contract_shm $(B)/tests/test_contract_redis
$(CONTRACT_TESTS): TEST_HELPERS += tests/contract_cases.c
$(CONTRACT_TESTS): tests/contract_cases.c tests/contract.h

# ---- examples and the demo ----------------------------------------------

# Built as a user of the installed library would build them: public
# headers only, the static libraries, default visibility.
EXAMPLES := $(patsubst examples/%.c,$(B)/examples/%,$(wildcard examples/*.c))

examples: $(EXAMPLES)

$(B)/examples:
	mkdir -p $@

$(B)/examples/%: examples/%.c include/throttle.h include/throttle_curl.h \
                 $(B)/libthrottle-curl.a $(B)/libthrottle.a | $(B)/examples
	$(CC) -std=c11 -D_GNU_SOURCE $(OPT) $(WARN) $(SAN) -Iinclude $(CPPFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $< \
	  $(B)/libthrottle-curl.a $(B)/libthrottle.a $(LDLIBS_HTTP) $(LDLIBS_CORE)

# The main job on a local mock server: naive loaders, then libthrottle.
demo: deps
	@$(MAKE) --no-print-directory B=$(B) all
	@B=$(B) sh tools/demo.sh

# ---- tests -------------------------------------------------------------

# Debian: install what the build needs when root, else print the command.
# DEPS=check only reports (the default in a package build, which has no
# network: DEB_BUILD_OPTIONS is set there).
DEPS ?= $(if $(DEB_BUILD_OPTIONS),check,install)
deps:
	@DEPS_MODE=$(DEPS) sh tools/deps.sh

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
# clang: gcc 12 rejects atomic_thread_fence under -fsanitize=thread.
tsan: deps
	@$(MAKE) --no-print-directory B=build/tsan CC=clang OPT="-O1 -g" SAN="-fsanitize=thread" \
	  tests-build
	@TSAN_OPTIONS=halt_on_error=1 B=build/tsan sh tests/run.sh $(TSAN_TESTS)

valgrind: deps
	@$(MAKE) --no-print-directory B=$(B) tests-build
	@B=$(B) RUN="valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite" \
	  sh tests/run.sh $(TESTS)

# kill -9 torture: TORTURE_KILLS=N for a larger run.
TORTURE_KILLS ?= 2000
$(B)/tests/torture: tests/torture.c $(TEST_HELPERS) tests/helpers.h $(B)/libthrottle-testing.a | $(B)/tests
	$(CC) $(CFLAGS_ALL) -DTHROTTLE_TESTING -Itests $(LDFLAGS) -o $@ $< $(TEST_HELPERS) \
	  $(B)/libthrottle-testing.a -lcmocka $(if $(HTTP_SRC),$(LDLIBS_HTTP)) $(LDLIBS_CORE)

torture: deps $(B)/tests/torture
	$(B)/tests/torture --kills $(TORTURE_KILLS)

# ---- benchmarks --------------------------------------------------------

BENCHES := $(patsubst bench/%.c,$(B)/bench/%,$(wildcard bench/bench_*.c))

$(B)/bench/%: bench/%.c $(wildcard bench/*.h) $(B)/libthrottle.a include/throttle.h | $(B)/bench
	$(CC) $(CFLAGS_ALL) -Ilibthrottle $(LDFLAGS) -o $@ $< $(B)/libthrottle.a $(LDLIBS_CORE) -lm

# The Redis figures start their own redis-server (tests/redis_helpers.c)
# and time PING with hiredis directly.
$(B)/bench/bench_redis: bench/bench_redis.c tests/redis_helpers.c $(B)/libthrottle.a include/throttle.h | $(B)/bench
	$(CC) $(CFLAGS_ALL) -Itests $(LDFLAGS) -o $@ $< tests/redis_helpers.c $(B)/libthrottle.a \
	  $(LDLIBS_REDIS) $(LDLIBS_CORE)

BENCH_QUICK ?= 0
bench: all $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done
	@echo "== bench/http_fleet.sh"; B=$(B) BENCH_QUICK=$(BENCH_QUICK) sh bench/http_fleet.sh
	@echo "== multi-table fleet: a workspace-wide 429, per-table signals vs scoped"
	@B=$(B) sh tests/test_scope_fleet.sh --publish 429=key >$(B)/bench/scope-key.txt 2>&1; head -n 1 $(B)/bench/scope-key.txt
	@B=$(B) sh tests/test_scope_fleet.sh >$(B)/bench/scope-scoped.txt 2>&1; head -n 1 $(B)/bench/scope-scoped.txt
	@echo "== bench/py_fleet.py (Python clients, in the venv of tools/venv.sh)"
	@py=$$(B=$(B) sh tools/venv.sh); rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "skipped: PyPI is not reachable"; \
	elif [ $$rc -ne 0 ]; then exit 1; \
	else LIBTHROTTLE_LIBRARY=$(abspath $(B))/libthrottle.so.1 $$py bench/py_fleet.py; fi

# Real dlt pipelines through the unmodified hotdata-dlt-destination into
# the Hotdata mock, plain and under python -m libthrottle.run, in the venv
# tools/venv.sh makes (PyPI needed once).  DLT_BENCH_ARGS passes options
# (--jobs, --retry-after, --service-ms, --only SCENARIO).
DLT_BENCH_ARGS ?=
.PHONY: dlt-bench
dlt-bench: all
	@py=$$(B=$(B) sh tools/venv.sh) && B=$(B) "$$py" bench/dlt_bench.py $(DLT_BENCH_ARGS)

# ---- analysers ---------------------------------------------------------
# Both must report nothing; .clang-tidy says which check is off and why.

tidy:
	clang-tidy --quiet $(CORE_SRC) $(HTTP_SRC) $(REDIS_SRC) $(CTL_SRC) -- -std=c11 -D_GNU_SOURCE -Iinclude -Ilibthrottle -Itools

cppcheck:
	cppcheck --quiet --error-exitcode=1 --enable=warning,performance,portability \
	  --inline-suppr -D_GNU_SOURCE -Iinclude -Ilibthrottle -Itools libthrottle tools

# The objects' dependency graph: which object uses symbols another defines,
# the circles among them, and the layers' rules (README, Layout): core/ <
# shm/ < api/, each calling only downward; http/ and redis/ use nothing of
# the others but what libthrottle.so.1 exports.  LAYERS_CHECK=1 fails on a
# circle or a broken rule (tests/test_layers.sh in make check).
LAYER_RULES := --order core,shm,api --public http,redis \
               --exports $(B)/libthrottle.so.$(MAJOR)
.PHONY: layers
layers: $(CORE_OBJ) $(HTTP_OBJ) $(REDIS_OBJ) $(B)/libthrottle.so.$(MAJOR)
	python3 tools/objgraph.py $(if $(filter 1,$(LAYERS_CHECK)),--check) \
	  $(LAYER_RULES) $(CORE_OBJ) $(HTTP_OBJ) $(REDIS_OBJ)

# ---- install -----------------------------------------------------------
#
# Honours DESTDIR, PREFIX, LIBDIR (multiarch: LIBDIR=/usr/lib/x86_64-linux-gnu),
# BINDIR, INCLUDEDIR, DATADIR and MANDIR.  Installs the headers, both
# libraries (static and shared, with the soname links), throttlectl, the
# man pages, the .pc files, a CMake package config beside them
# (find_package(libthrottle) -> libthrottle::throttle,
# libthrottle::throttle-curl) and bash completion for throttlectl.
# `make uninstall` with the same variables removes exactly that.

CMAKEDIR := $(LIBDIR)/cmake/libthrottle
# The Redis module: LIBDIR (the default), or a private directory a
# distribution keeps it in, REDIS_MODULE_DIR=$(LIBDIR)/libthrottle; the
# core looks in both (beside libthrottle.so.1, then in its libthrottle/).
REDIS_MODULE_DIR ?= $(LIBDIR)
BASHCOMPDIR ?= $(DATADIR)/bash-completion/completions
# The CMake config finds its headers from where it lies, so a staged
# (DESTDIR) or moved tree works too.
REL_INCLUDEDIR = $(shell realpath -m --relative-to=$(CMAKEDIR) $(INCLUDEDIR))
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
  -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
  -e 's|@MAJOR@|$(MAJOR)|g' -e 's|@REL_INCLUDEDIR@|$(REL_INCLUDEDIR)|g'

install: all man
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(BINDIR) \
	  $(DESTDIR)$(CMAKEDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 \
	  $(DESTDIR)$(BASHCOMPDIR)
	install -m 0644 include/throttle.h include/throttle_curl.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 0755 $(B)/throttlectl $(DESTDIR)$(BINDIR)/
	$(if $(REDIS_SRC),install -d $(DESTDIR)$(REDIS_MODULE_DIR))
	$(if $(REDIS_SRC),install -m 0644 $(B)/libthrottle-redis.so.$(MAJOR) $(DESTDIR)$(REDIS_MODULE_DIR)/)
	set -e; for l in libthrottle libthrottle-curl; do \
	  install -m 0644 $(B)/$$l.a $(DESTDIR)$(LIBDIR)/; \
	  install -m 0755 $(B)/$$l.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/$$l.so.$(VERSION); \
	  ln -sf $$l.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$$l.so.$(MAJOR); \
	  ln -sf $$l.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/$$l.so; \
	  $(SUBST) libthrottle/$$l.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/$$l.pc; \
	done
	$(SUBST) tools/cmake/libthrottle-config.cmake.in > $(DESTDIR)$(CMAKEDIR)/libthrottle-config.cmake
	$(SUBST) tools/cmake/libthrottle-config-version.cmake.in \
	  > $(DESTDIR)$(CMAKEDIR)/libthrottle-config-version.cmake
	install -m 0644 $(MAN1) $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(MAN3) $(DESTDIR)$(MANDIR)/man3/
	install -m 0644 tools/throttlectl.bash $(DESTDIR)$(BASHCOMPDIR)/throttlectl

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/throttle.h $(DESTDIR)$(INCLUDEDIR)/throttle_curl.h \
	  $(DESTDIR)$(BINDIR)/throttlectl $(DESTDIR)$(BASHCOMPDIR)/throttlectl \
	  $(DESTDIR)$(CMAKEDIR)/libthrottle-config.cmake \
	  $(DESTDIR)$(CMAKEDIR)/libthrottle-config-version.cmake \
	  $(addprefix $(DESTDIR)$(MANDIR)/man1/,$(notdir $(MAN1))) \
	  $(addprefix $(DESTDIR)$(MANDIR)/man3/,$(notdir $(MAN3)))
	rm -f $(DESTDIR)$(REDIS_MODULE_DIR)/libthrottle-redis.so.$(MAJOR)
	-rmdir $(DESTDIR)$(LIBDIR)/libthrottle 2>/dev/null
	for l in libthrottle libthrottle-curl; do \
	  rm -f $(DESTDIR)$(LIBDIR)/$$l.a $(DESTDIR)$(LIBDIR)/$$l.so \
	    $(DESTDIR)$(LIBDIR)/$$l.so.$(MAJOR) $(DESTDIR)$(LIBDIR)/$$l.so.$(VERSION) \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/$$l.pc; \
	done
	-rmdir $(DESTDIR)$(CMAKEDIR) 2>/dev/null

# ---- man pages ---------------------------------------------------------
# Written in scdoc (docs/man/*.scd), built with Debian's scdoc.

MAN1 := $(patsubst docs/man/%.1.scd,$(B)/man/%.1,$(wildcard docs/man/*.1.scd))
MAN3 := $(patsubst docs/man/%.3.scd,$(B)/man/%.3,$(wildcard docs/man/*.3.scd))

man: $(MAN1) $(MAN3)

$(B)/man:
	mkdir -p $@

$(B)/man/%: docs/man/%.scd | $(B)/man
	@command -v scdoc >/dev/null || { echo "the man pages need scdoc" \
	  "(Debian: apt-get install scdoc)" >&2; exit 1; }
	scdoc < $< > $@.tmp && mv $@.tmp $@ || { rm -f $@.tmp; exit 1; }

# ---- Python ------------------------------------------------------------
# python/libthrottle (ctypes, standard library only) is installed for each
# interpreter in PYTHONS that exists, always inside PREFIX (and DESTDIR):
# into its package directory under PREFIX/lib when it searches one
# (Debian's /usr/bin/python3), else PREFIX/lib/python3.X/site-packages
# (python/sitedir.py says which).  _installed.py records LIBDIR, so
# `import libthrottle` finds the installed libraries with no environment;
# a .dist-info gives importlib.metadata the version.  pip users build
# the package with the C core inside instead (pyproject.toml, setup.py).
# tests/test_python.sh runs the suite in make check.
PYTHONS ?= python3 /usr/bin/python3
PY_PKG  := $(wildcard python/libthrottle/*.py) python/libthrottle/py.typed
# files of the package's subdirectories (python -m libthrottle.run's _boot)
PY_SUB  := $(wildcard python/libthrottle/*/*.py)
PY_DIST := libthrottle-$(VERSION).dist-info

.PHONY: install-python uninstall-python
install: install-python
install-python: all
	@for py in $(PYTHONS); do \
	  command -v $$py >/dev/null 2>&1 || continue; \
	  dir=$$($$py python/sitedir.py "$(PREFIX)") && [ -n "$$dir" ] || exit 1; \
	  echo "install python package for $$py: $(DESTDIR)$$dir/libthrottle"; \
	  install -d "$(DESTDIR)$$dir/libthrottle" || exit 1; \
	  install -m 0644 $(PY_PKG) "$(DESTDIR)$$dir/libthrottle/" || exit 1; \
	  for f in $(PY_SUB:python/libthrottle/%=%); do \
	    install -d "$(DESTDIR)$$dir/libthrottle/$${f%/*}" && \
	    install -m 0644 "python/libthrottle/$$f" "$(DESTDIR)$$dir/libthrottle/$$f" || exit 1; \
	  done; \
	  printf '# written by make install\nLIBDIR = %s\n' "'$(LIBDIR)'" \
	    > "$(DESTDIR)$$dir/libthrottle/_installed.py" || exit 1; \
	  install -d "$(DESTDIR)$$dir/$(PY_DIST)" || exit 1; \
	  printf 'Metadata-Version: 2.1\nName: libthrottle\nVersion: %s\n' \
	    "$(VERSION)" > "$(DESTDIR)$$dir/$(PY_DIST)/METADATA" || exit 1; \
	  echo make > "$(DESTDIR)$$dir/$(PY_DIST)/INSTALLER" || exit 1; \
	done

# The same directories; only the package's own files (and the bytecode
# an import left) are removed.
uninstall: uninstall-python
uninstall-python:
	@for py in $(PYTHONS); do \
	  command -v $$py >/dev/null 2>&1 || continue; \
	  dir=$$($$py python/sitedir.py "$(PREFIX)" 2>/dev/null) && [ -n "$$dir" ] || exit 1; \
	  d="$(DESTDIR)$$dir/libthrottle"; \
	  [ -d "$$d" ] || continue; \
	  echo "uninstall python package for $$py: $$d"; \
	  for f in $(notdir $(PY_PKG)) _installed.py; do rm -f "$$d/$$f"; done; \
	  for f in $(PY_SUB:python/libthrottle/%=%); do \
	    rm -f "$$d/$$f"; rm -rf "$$d/$${f%/*}/__pycache__"; \
	    rmdir "$$d/$${f%/*}" 2>/dev/null || true; \
	  done; \
	  rm -rf "$$d/__pycache__"; rmdir "$$d" || exit 1; \
	  rm -f "$(DESTDIR)$$dir/$(PY_DIST)/METADATA" "$(DESTDIR)$$dir/$(PY_DIST)/INSTALLER"; \
	  rmdir "$(DESTDIR)$$dir/$(PY_DIST)" 2>/dev/null || true; \
	done

# ---- Debian packages ----------------------------------------------------
# make deb: debian/'s packages, built with dpkg-buildpackage -us -uc -b in a
# copy of the tree ($(DEB_DIR)), where the .debs land too (dpkg-buildpackage
# writes beside the tree it builds), then checked with lintian: any error
# fails.  Needs debhelper, dh-python, lintian (and the build dependencies
# of debian/control); uses no network.
DEB_DIR := $(B)/debian
.PHONY: deb
deb:
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/libthrottle-$(VERSION)
	tar -c --exclude=./build --exclude=./.git --exclude=./local.mk . | \
	  tar -x -C $(DEB_DIR)/libthrottle-$(VERSION)
	cd $(DEB_DIR)/libthrottle-$(VERSION) && dpkg-buildpackage -us -uc -b
	lintian --fail-on error $(DEB_DIR)/*.changes

clean:
	rm -rf build

-include fuzz/fuzz.mk
