#!/bin/sh
# SPDX-License-Identifier: MIT
# Check the build dependencies; on Debian install the missing ones when run
# as root, otherwise print the exact command to run.
set -u
need=""
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
# python3-pytest, python3-requests: the Python suite (python3-venv: its
# venv of pinned PyPI packages, tools/venv.sh); scdoc: the man pages;
# the rest: the operator and install tests (Prometheus parser, a
# pseudo-terminal, man -l, C++ and CMake consumers, bash completion);
# libhiredis-dev, redis-server, faketime: the Redis backend and its tests;
# prometheus: promtool checks the metrics text.
for p in libcmocka-dev libcurl4-openssl-dev libjansson-dev zlib1g-dev python3 python3-venv pkg-config curl \
         python3-pytest python3-requests \
         scdoc python3-prometheus-client tmux man-db cmake g++ bash-completion \
         libhiredis-dev redis-server faketime prometheus; do
  have_pkg "$p" || need="$need $p"
done
[ -z "$need" ] && exit 0
if [ "${DEPS_MODE:-install}" = check ]; then
  echo "deps: missing:$need (not installed: DEPS=check)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "deps: missing:$need (install them with your package manager)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing:$need" >&2
  echo "deps: run: sudo apt-get update && sudo apt-get install -y$need" >&2
  exit 1
fi
echo "deps: installing$need" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 && apt-get install -y -qq $need >&2
