#!/bin/sh
# The kill -9 torture at the size CI affords (about a second): 200 workers
# killed at random, and at named crash points, while the others work.
# `make torture` runs the full 2,000 kills; TORTURE_KILLS=N for more.
exec "${B:-build}/tests/torture" --kills "${TORTURE_CI_KILLS:-200}"
