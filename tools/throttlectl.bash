# SPDX-License-Identifier: MIT
# bash completion for throttlectl; installed by `make install` into
# $(DATADIR)/bash-completion/completions/throttlectl.
#
# Completes commands, each command's options (from the same table as
# `throttlectl COMMAND --help`, so it cannot drift from the tool), segment
# names from /dev/shm, keys from `throttlectl ls --json`, and the values of
# --class and --max-parallel.

_throttlectl_keys() {
  local seg=$1
  throttlectl ${seg:+--segment "$seg"} ls --json 2>/dev/null |
    grep -o '"key":"[^"]*"' | sed 's/^"key":"//; s/"$//'
}

_throttlectl() {
  local cur prev words cword
  _init_completion || return
  local commands="ls show backoff wait clear reset max-delay set pause resume cancel run http rm watch metrics segments"
  local cmd="" seg="" i
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in
      --segment) seg=${words[i + 1]}; ((i++)) ;;
      --segment=*) seg=${words[i]#--segment=} ;;
      -*) ;;
      *) [[ -z $cmd ]] && cmd=${words[i]} ;;
    esac
  done
  case $prev in
    --segment)
      local s
      s=$(cd /dev/shm 2>/dev/null && ls -1 2>/dev/null | sed 's|^|/|')
      COMPREPLY=($(compgen -W "$s" -- "$cur"))
      return ;;
    --class) COMPREPLY=($(compgen -W "live backfill" -- "$cur")); return ;;
    --max-parallel) COMPREPLY=($(compgen -W "auto $(seq 1 32)" -- "$cur")); return ;;
    --rate) COMPREPLY=($(compgen -W "off" -- "$cur")); return ;;
    -o | --output) _filedir; return ;;
    -X | --request) COMPREPLY=($(compgen -W "GET POST PUT PATCH DELETE HEAD" -- "$cur")); return ;;
    --timeout | --retries | --interval | --backfill-share | -H | --header | -d | --data | --data-binary | \
    --status | --code | --message)
      return ;;
  esac
  if [[ -z $cmd ]]; then
    COMPREPLY=($(compgen -W "$commands --segment --help --version" -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    local opts
    opts=$(throttlectl "$cmd" --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)
    COMPREPLY=($(compgen -W "$opts --segment --help" -- "$cur"))
    return
  fi
  case $cmd in
    show | backoff | wait | clear | set | pause | resume | cancel | run | http | watch)
      local IFS=$'\n'
      COMPREPLY=($(compgen -W "$(_throttlectl_keys "$seg")" -- "$cur"))
      ;;
  esac
} &&
  complete -F _throttlectl throttlectl
