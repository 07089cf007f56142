#!/bin/sh
# SPDX-License-Identifier: MIT
# test_layers.sh — the library stays layered: no circle among its objects
# (which object uses symbols another defines), core/ < shm/ < api/ each
# calling only downward, and http/ and redis/ using nothing of the others
# but what libthrottle.so.1 exports (make layers, tools/objgraph.py; the
# README's Layout says why).  Fails with the report when any is broken.
set -u
here=$(dirname "$0")
top=$(cd "$here/.." && pwd)
B=${B:-build}
case $B in /*) ;; *) B="$top/$B" ;; esac
if ! command -v nm >/dev/null 2>&1; then
  echo "SKIP no nm (binutils)"
  exit 0
fi
# A make of its own: not the jobserver or the flags of a make check above.
unset MAKEFLAGS MFLAGS MAKELEVEL
out=$(${MAKE:-make} -s --no-print-directory -C "$top" B="$B" LAYERS_CHECK=1 \
  layers 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  printf '%s\n' "$out"
  echo "FAIL the library's layers are broken (above: a circle or a 'layer:' line)"
  exit 1
fi
printf '%s\n' "$out" | head -n 1
printf '%s\n' "$out" | tail -n 1
echo "PASS no circle, every layer calls only downward"
