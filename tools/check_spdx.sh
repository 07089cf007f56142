#!/bin/sh
# SPDX-License-Identifier: MIT
# check_spdx.sh — every tracked source file carries an SPDX licence line
# ("SPDX-License-Identifier: MIT") within its first 5 lines.  Source files:
# C (*.c *.h), C++ (*.cpp), Python (*.py), shell (*.sh, .ci/run, shell
# scripts without a suffix found by their #! line), scdoc (*.scd), CMake
# (*.cmake, *.cmake.in, CMakeLists.txt), Makefiles (Makefile, *.mk), the
# linker map (*.map), pkg-config templates (*.pc.in) and bash completion
# (*.bash).  Data (test corpora, crashers, dictionaries) and prose (*.md,
# LICENSE) are not sources.  Prints each file without one; exit 1 if any.
# Run from anywhere inside the work tree: tools/check_spdx.sh
set -u
cd "$(git rev-parse --show-toplevel)" || exit 2
missing=0
is_source() {
  case "$1" in
    fuzz/corpus/* | fuzz/crashers/* | fuzz/dict/*) return 1 ;;
    *.c | *.h | *.cpp | *.py | *.sh | *.scd | *.cmake | *.cmake.in | *.mk | \
    *.map | *.pc.in | *.bash | Makefile | */Makefile | CMakeLists.txt | \
    */CMakeLists.txt | .ci/run) return 0 ;;
  esac
  # A script without a suffix: its first line says so.
  case "$(head -c 64 "$1" 2>/dev/null | head -n 1)" in
    '#!'*sh* | '#!'*python*) return 0 ;;
  esac
  return 1
}
for f in $(git ls-files); do
  [ -f "$f" ] || continue
  is_source "$f" || continue
  if ! head -n 5 "$f" | grep -q 'SPDX-License-Identifier: MIT'; then
    echo "$f"
    missing=$((missing + 1))
  fi
done
if [ "$missing" -gt 0 ]; then
  echo "check_spdx: $missing source file(s) without an SPDX-License-Identifier line" >&2
  exit 1
fi
echo "check_spdx: every source file has its SPDX line"
