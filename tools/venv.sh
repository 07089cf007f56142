#!/bin/sh
# SPDX-License-Identifier: MIT
# venv.sh — the Python test environment: a venv of Debian's /usr/bin/python3
# in $B/venv with every python/requirements-*.txt installed (pinned
# versions, from PyPI).  Prints the venv's interpreter on stdout.  Reused
# while the requirement files are unchanged (a stamp holds their checksum).
# Exit 3 (and a message naming the cause) when PyPI cannot be reached, so a
# caller can tell "no registry" from a broken environment.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
PY=${VENV_PYTHON:-/usr/bin/python3}
venv="$B/venv"
reqs=$(ls "$top"/python/requirements-*.txt 2>/dev/null)
sum=$(cat $reqs /dev/null | cksum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$sum" ]; then
  echo "$venv/bin/python"; exit 0
fi
rm -rf "$venv"
if ! "$PY" -m venv "$venv" >&2; then
  echo "venv: $PY -m venv failed (install python3-venv)" >&2; exit 1
fi
# One resolver run over every file: two files pinning one package
# differently is an error here, not a silent downgrade by the later one.
set --
for r in $reqs; do set -- "$@" -r "$r"; done
if [ $# -gt 0 ] && ! "$venv/bin/python" -m pip install -q \
     --disable-pip-version-check "$@" >&2; then
  if ! "$venv/bin/python" -m pip download -q --no-deps -d "$venv/.probe" \
       pip >/dev/null 2>&1; then
    echo "venv: PyPI is not reachable; cannot install" $reqs >&2; exit 3
  fi
  echo "venv: pip install $* failed" >&2; exit 1
fi
echo "$sum" > "$venv/.stamp"
echo "$venv/bin/python"
