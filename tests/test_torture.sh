#!/bin/sh
# SPDX-License-Identifier: MIT
# The kill -9 torture at the size CI affords (about a second each): 200
# workers killed at random, and at named crash points, while the others
# work; then a tiny table (2 records, one of them kept by a fixed-cap key)
# where every new key must evict, reap the dead, or find the table full.
# `make torture` runs the full 2,000 kills; TORTURE_KILLS=N for more.
set -e
"${B:-build}/tests/torture" --kills "${TORTURE_CI_KILLS:-200}"
exec "${B:-build}/tests/torture" --kills "${TORTURE_CI_KILLS:-200}" \
  --capacity 2 --keys 1 --transient 6 --seed 20261201
