#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_watch.sh — `watch` on a real terminal: run in a tmux pseudo-
# terminal, it shows a key, redraws in place as the key's counters change
# (the admissions column goes from 1 to 3 while it runs), highlights the
# change, and exits 0 when q is typed, giving the terminal back (the
# alternate screen is left, so the shell's screen is visible again).
# Needs tmux (Debian: tmux).
. "$(dirname "$0")/ctl_lib.sh"
command -v tmux >/dev/null || { echo "FAIL tmux is missing (tools/deps.sh)"; exit 1; }
sock="tt-watch-$$"
tm() { tmux -L "$sock" "$@"; }
stop_tmux() { tm kill-server 2>/dev/null; }
cleanup_hooks="stop_tmux"
screen() { tm capture-pane -p -t w; }
# Poll the screen (every 50 ms, at most 10 s) until it shows the text.
until_screen() {
  i=0
  while ! screen | grep -q -- "$1"; do
    i=$((i + 1))
    [ $i -gt 200 ] && { echo "FAIL screen never showed [$1]:"; screen; return 1; }
    sleep 0.05
  done
  return 0
}
# The ADMIT column of key hot on the screen.
admit() { screen | awk '$1=="hot" {print $7}'; }

"$T" run hot -- true
tm -f /dev/null new-session -d -s w -x 120 -y 30 \
  "echo before-watch; THROTTLE_SEGMENT=$SEG '$T' watch --interval 1; echo \"watch-exit=\$?\"; sleep 30"
check_true "watch draws the key" until_screen "^hot "
check "the key's admissions before" 1 "$(admit)"
check_true "the header names the segment" until_screen "segment $SEG: 1/4096 keys"
"$T" run hot -- true
"$T" run hot -- true
i=0
while [ "$(admit)" != 3 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
check "the key's admissions change in place" 3 "$(admit)"
check "one frame on the screen, not a scroll of them" 1 \
  "$(screen | grep -c '^KEY ')"
# The first frame after a change shows the changed cell in bold reverse
# (SGR 1;7) for one interval; tmux's capture -e keeps the attributes.
esc=$(printf '\033')
hot_cell() { tm capture-pane -p -e -t w | grep "^hot " | grep -c "$esc\[1;7m4$esc\[0m"; }
"$T" run hot -- true
i=0
while [ "$(hot_cell)" != 1 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
check "the changed cell is highlighted" 1 "$(hot_cell)"
check "unchanged cells are not" 0 \
  "$(tm capture-pane -p -e -t w | grep '^hot ' | grep -c "$esc\[1;7m0/")"
tm send-keys -t w q
check_true "q ends watch with status 0" until_screen "watch-exit=0"
check_true "the terminal is given back (the screen before watch shows)" \
  until_screen "before-watch"
finish
