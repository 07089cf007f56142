#!/bin/sh
# SPDX-License-Identifier: MIT
# test_install.sh — the installed library as a distribution and its users
# meet it: `make install DESTDIR=... PREFIX=/usr` with a multiarch LIBDIR,
# then, out of tree, with nothing but what was installed: a C program
# built with pkg-config alone (core shared, core static, curl glue), a C++
# program, a CMake project (find_package -> libthrottle::throttle and
# libthrottle::throttle-curl); every man page renders with man -l, bash
# completion completes, and `make uninstall` leaves no file behind.
# Needs pkg-config, g++, cmake, man-db, bash-completion (tools/deps.sh).
. "$(dirname "$0")/ctl_lib.sh"
D="$tmp/root"
# the release the Makefile builds (installed file names carry it)
version=$(sed -n 's/^VERSION *:= *//p' "$top/Makefile")
LIBDIR=/usr/lib/x86_64-linux-gnu
for tool in pkg-config g++ cmake man; do
  command -v $tool >/dev/null || { echo "FAIL $tool is missing (tools/deps.sh)"; exit 1; }
done
make -C "$top" --no-print-directory B="$B" DESTDIR="$D" PREFIX=/usr \
  LIBDIR="$LIBDIR" install >"$tmp/install.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -20 "$tmp/install.log"
check "make install DESTDIR PREFIX=/usr LIBDIR=multiarch" 0 $rc
for f in usr/include/throttle.h usr/include/throttle_curl.h usr/bin/throttlectl \
         "${LIBDIR#/}/libthrottle.so.1" "${LIBDIR#/}/libthrottle.a" \
         "${LIBDIR#/}/libthrottle-curl.so.1" "${LIBDIR#/}/pkgconfig/libthrottle.pc" \
         "${LIBDIR#/}/pkgconfig/libthrottle-curl.pc" \
         "${LIBDIR#/}/cmake/libthrottle/libthrottle-config.cmake" \
         usr/share/man/man1/throttlectl.1 usr/share/man/man3/libthrottle.3 \
         usr/share/man/man3/throttle_curl.3 \
         usr/share/bash-completion/completions/throttlectl; do
  check_true "installed $f" test -e "$D/$f"
done
check "soname of the installed library" "libthrottle.so.1" \
  "$(objdump -p "$D$LIBDIR/libthrottle.so.$version" | awk '$1=="SONAME" {print $2}')"

# ---- the build honours the user's flags; -Werror only when asked ----
# As a user builds: no WERROR in the environment (CI exports it).
env -u WERROR -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n -B -C "$top" --no-print-directory B="$tmp/flags" CC=cc \
  CPPFLAGS=-DSEEN_CPPFLAGS CFLAGS=-DSEEN_CFLAGS LDFLAGS=-Wl,-zSEEN_LDFLAGS \
  all >"$tmp/dry" 2>&1
compiles=$(grep -c '^cc .* -c ' "$tmp/dry")
check_true "dry run shows the compiles" test "$compiles" -gt 10
check "every compile has CPPFLAGS and CFLAGS" "$compiles" \
  "$(grep '^cc .* -c ' "$tmp/dry" | grep 'SEEN_CPPFLAGS' | grep -c 'SEEN_CFLAGS')"
check "every link has LDFLAGS (libraries, throttlectl, examples)" \
  "$(grep -c -e '-shared' -e 'throttlectl tools/' -e 'examples/[a-z]*\.c' "$tmp/dry")" \
  "$(grep -e '-shared' -e 'throttlectl tools/' -e 'examples/[a-z]*\.c' "$tmp/dry" | grep -c 'SEEN_LDFLAGS')"
if [ -f "$top/local.mk" ]; then
  echo "note: $top/local.mk exists; the default -Werror check is skipped"
else
  check "no -Werror by default" 0 "$(grep -c -- '-Werror' "$tmp/dry")"
fi
check "WERROR=1 turns it on" "$compiles" \
  "$(make -n -B -C "$top" --no-print-directory B="$tmp/flags" CC=cc WERROR=1 all 2>&1 |
     grep '^cc .* -c ' | grep -c -- '-Werror')"

# ---- consumers, out of tree, with pkg-config alone ----
export PKG_CONFIG_PATH="$D$LIBDIR/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$D"
export PKG_CONFIG_LIBDIR="$D$LIBDIR/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/share/pkgconfig"
mkdir "$tmp/app"
cat >"$tmp/app/core.c" <<'C'
#include <throttle.h>
#include <stdio.h>
int main(void) {
  throttle_t *h;
  int rc = throttle_open(NULL, &h);
  if (rc != 0 || !throttle_is_shared(h)) {
    fprintf(stderr, "open: %s\n", throttle_errmsg(h));
    return 1;
  }
  rc = throttle_backoff(h, "consumer", 5000);
  uint64_t left = 0;
  if (rc == 0)
    rc = throttle_remaining(h, "consumer", &left);
  printf("%s %d %d\n", throttle_version_string(), rc, left > 0);
  throttle_close(h);
  return rc != 0;
}
C
cat >"$tmp/app/curl.c" <<'C'
#include <throttle_curl.h>
#include <stdio.h>
int main(void) {
  uint64_t ms = 0;
  CURL *easy;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  easy = curl_easy_init(); /* libcurl itself, as the README's example does */
  int rc = throttle_parse_retry_after("7", 0, &ms);
  printf("%d %llu %d\n", rc, (unsigned long long)ms, easy != NULL);
  curl_easy_cleanup(easy);
  curl_global_cleanup();
  return rc != 0;
}
C
cd "$tmp/app" || exit 1
run_env() { LD_LIBRARY_PATH="$D$LIBDIR" "$@"; }
cc -Wall -Werror -o core-shared core.c $(pkg-config --cflags --libs libthrottle)
check "C, core, shared: builds with pkg-config alone" 0 $?
check "C, core, shared: runs" "$version 0 1" "$(run_env ./core-shared)"
check_true "C, core, shared: linked against libthrottle.so.1" \
  contains "$(objdump -p core-shared | awk '$1=="NEEDED"{print $2}')" libthrottle.so.1
cc -static -Wall -Werror -o core-static core.c \
  $(pkg-config --static --cflags --libs libthrottle) 2>"$tmp/static.err"
rc=$?
[ $rc -eq 0 ] || cat "$tmp/static.err"
check "C, core, static: builds with pkg-config --static alone" 0 $rc
check "C, core, static: runs with no shared libthrottle" "$version 0 1" "$(./core-static)"
check "C, core, static: needs no shared library" "" \
  "$(objdump -p core-static | awk '$1=="NEEDED"{print $2}')"
# The static curl glue, linked as the README's line says (the perform
# loop pulls in what needs jansson and zlib).
cat >"$tmp/app/glue-static.c" <<'C'
#include <throttle_curl.h>
#include <stdio.h>
int main(void) {
  int (*perform)(throttle_t *, CURL *, const char *,
                 const throttle_curl_policy_t *, throttle_curl_result_t **) =
      throttle_curl_perform;
  throttle_curl_policy_t *p = NULL;
  int rc = throttle_curl_policy_new(&p);
  printf("%d %d\n", rc, perform != NULL);
  throttle_curl_policy_free(p);
  return rc != 0;
}
C
line=$(tr '\n' ' ' <"$top/README.md" | sed -n 's/.*with the static libraries *`\([^`]*\)`.*/\1/p')
check_true "README gives the static link line" contains "$line" "-lthrottle-curl"
libs=$(echo "$line" | sed "s|-lthrottle-curl -lthrottle|$D$LIBDIR/libthrottle-curl.a $D$LIBDIR/libthrottle.a|")
cc -Wall -Werror -I"$D/usr/include" -o glue-static glue-static.c $libs 2>"$tmp/glue.err"
rc=$?
[ $rc -eq 0 ] || cat "$tmp/glue.err"
check "C, curl glue, static: builds with the README's line ($line)" 0 $rc
check "C, curl glue, static: runs" "0 1" "$(./glue-static)"
cc -Wall -Werror -o curl-glue curl.c $(pkg-config --cflags --libs libthrottle-curl)
check "C, curl glue: builds with pkg-config alone (libcurl in Requires)" 0 $?
check "C, curl glue: runs" "0 7000 1" "$(run_env ./curl-glue)"
cat >"$tmp/app/both.cpp" <<'C'
#include <throttle.h>
#include <throttle_curl.h>
#include <cstdio>
int main() {
  throttle_t *h = nullptr;
  int rc = throttle_open(nullptr, &h);
  std::printf("%s %d\n", throttle_err_name(rc), THROTTLE_AT_LEAST_VERSION(1, 0, 0));
  throttle_close(h);
  return rc != 0;
}
C
g++ -std=c++11 -Wall -Wextra -Werror -pedantic -o cxx both.cpp \
  $(pkg-config --cflags --libs libthrottle-curl)
check "C++: builds with -Wall -Wextra -Werror -pedantic" 0 $?
check "C++: runs" "THROTTLE_OK 1" "$(run_env ./cxx)"

# ---- CMake ----
mkdir "$tmp/cm"
cp core.c curl.c "$tmp/cm/"
cat >"$tmp/cm/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.13)
project(consumer C)
find_package(libthrottle 1.0 REQUIRED)
add_executable(core core.c)
target_link_libraries(core PRIVATE libthrottle::throttle)
add_executable(glue curl.c)
target_link_libraries(glue PRIVATE libthrottle::throttle-curl)
C
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR PKG_CONFIG_PATH
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_PREFIX_PATH="$D/usr" \
  -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu >"$tmp/cmake.log" 2>&1 &&
  cmake --build "$tmp/cm/b" >>"$tmp/cmake.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -30 "$tmp/cmake.log"
check "CMake: find_package(libthrottle) and both targets build" 0 $rc
check "CMake: core runs" "$version 0 1" "$(run_env "$tmp/cm/b/core")"
check "CMake: curl glue runs" "0 7000 1" "$(run_env "$tmp/cm/b/glue")"
# The static archives: libthrottle-curl.a's own dependencies come along.
cp "$tmp/app/glue-static.c" "$tmp/cm/"
cat >"$tmp/cm/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.13)
project(consumer C)
set(LIBTHROTTLE_USE_STATIC_LIBS ON)
find_package(libthrottle 1.0 REQUIRED)
add_executable(glue-static glue-static.c)
target_link_libraries(glue-static PRIVATE libthrottle::throttle-curl)
C
rm -rf "$tmp/cm/b"
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_PREFIX_PATH="$D/usr" \
  -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu >"$tmp/cmake3.log" 2>&1 &&
  cmake --build "$tmp/cm/b" >>"$tmp/cmake3.log" 2>&1
rc=$?
[ $rc -eq 0 ] || tail -30 "$tmp/cmake3.log"
check "CMake, LIBTHROTTLE_USE_STATIC_LIBS: the static curl glue links" 0 $rc
check "CMake, static: it runs" "0 1" "$("$tmp/cm/b/glue-static")"
cat >"$tmp/cm/CMakeLists.txt" <<'C'
cmake_minimum_required(VERSION 3.13)
project(consumer C)
find_package(libthrottle 2 QUIET)
if(libthrottle_FOUND)
  message(FATAL_ERROR "version 2 accepted")
endif()
C
rm -rf "$tmp/cm/b"
cmake -S "$tmp/cm" -B "$tmp/cm/b" -DCMAKE_PREFIX_PATH="$D/usr" >"$tmp/cmake2.log" 2>&1
check "CMake: a request for major version 2 is refused" 0 $?

# ---- man pages and completion ----
for m in man1/throttlectl.1 man3/libthrottle.3 man3/throttle_curl.3; do
  out=$(MANWIDTH=80 man -l "$D/usr/share/man/$m" 2>"$tmp/man.err")
  check "man -l $m renders" 0 $?
  check "man -l $m: no warnings" "" "$(cat "$tmp/man.err")"
  check_true "man -l $m: has a NAME section" contains "$out" "NAME"
done
check_true "man throttlectl documents watch, metrics and segments" contains \
  "$(MANWIDTH=80 man -l "$D/usr/share/man/man1/throttlectl.1" 2>/dev/null | grep -c -E '^       (watch|metrics|segments) ')" 3
check_true "man(1) finds the page by name under the prefix" contains \
  "$(MANPATH="$D/usr/share/man" man -w throttlectl 2>&1)" "$D/usr/share/man/man1/throttlectl.1"
if [ -f /usr/share/bash-completion/bash_completion ]; then
  got=$(PATH="$D/usr/bin:$PATH" bash -c '
    . /usr/share/bash-completion/bash_completion
    . "$1"
    COMP_WORDS=(throttlectl me); COMP_CWORD=1; COMP_LINE="throttlectl me"; COMP_POINT=14
    _throttlectl; echo "${COMPREPLY[*]}"
    COMP_WORDS=(throttlectl watch --int); COMP_CWORD=2; COMP_LINE="throttlectl watch --int"; COMP_POINT=23
    _throttlectl; echo "${COMPREPLY[*]}"' sh "$D/usr/share/bash-completion/completions/throttlectl")
  check "bash completion: commands and options" "metrics
--interval" "$got"
else
  echo "FAIL bash-completion is missing (tools/deps.sh)"; fails=$((fails + 1))
fi

# ---- uninstall ----
make -C "$top" --no-print-directory B="$B" DESTDIR="$D" PREFIX=/usr \
  LIBDIR="$LIBDIR" uninstall >"$tmp/uninstall.log" 2>&1
check "make uninstall" 0 $?
check "make uninstall leaves no file" "" "$(find "$D" -type f -o -type l)"
finish
