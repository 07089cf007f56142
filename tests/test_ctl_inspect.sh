#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_inspect.sh — what operators and their tools read: `metrics`
# parsed by a real Prometheus parser (python3-prometheus-client) and
# compared with `show --json`; `metrics -o FILE` written atomically; the
# JSON contract (schema, true/false, non-UTF-8 keys with their bytes in
# base64); `segments`; `watch` off a terminal; warnings for clamped values.
. "$(dirname "$0")/ctl_lib.sh"

# A key with the characters the exposition format escapes that a key may
# hold (a newline is a control byte: no key has one), one with a byte that
# is not UTF-8, and one with admissions and a refusal.
q='we"ird\key x'
bad=$(printf 'raw\377key')
"$T" backoff "$q" 30
"$T" backoff "$bad" 30
"$T" set hot --max-parallel 3
"$T" run hot -- true
"$T" run hot -- true
"$T" pause hot

# ---- metrics, through the parser ----
"$T" metrics >"$tmp/m.txt"
check "metrics exits 0" 0 $?
"$PY" - "$tmp/m.txt" "$SEG" <<'PYEOF' >"$tmp/parsed" 2>&1
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1], encoding="utf-8").read()
seg = sys.argv[2]
fams = {f.name: f for f in text_string_to_metric_families(text)}
# Every family announced with HELP and TYPE, once.
for line in text.splitlines():
    if line.startswith("# TYPE "):
        name, typ = line.split()[2:4]
        base = name[:-6] if typ == "counter" and name.endswith("_total") else name
        assert base in fams, name
        assert fams[base].type == typ, (name, typ, fams[base].type)
        assert fams[base].documentation, name
def value(metric, **labels):
    base = metric[:-6] if metric.endswith("_total") else metric
    for s in fams[base].samples:
        if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((metric, labels))
assert value("throttle_segment_keys", segment=seg) == 3
assert value("throttle_segment_capacity", segment=seg) == 4096
assert value("throttle_segment_evictions_total", segment=seg) == 0
assert value("throttle_key_admissions_total", segment=seg, key="hot") == 2
assert value("throttle_key_cap", key="hot") == 3
assert value("throttle_key_cap_learned", key="hot") == 0
assert value("throttle_key_paused", key="hot") == 1
assert value("throttle_key_waiting", key="hot", **{"class": "live"}) == 0
assert value("throttle_key_in_flight", key="hot") == 0
left = value("throttle_key_seconds_left", key='we"ird\\key x')
assert 0 < left <= 30, left
assert value("throttle_key_seconds_left", key="raw\\xffkey") > 0
print("parsed", len(fams), "families")
PYEOF
rc=$?
cat "$tmp/parsed"
check "metrics parsed and its values right" 0 $rc

# Counters end in _total, gauges do not; no family is empty of samples.
check "every counter ends in _total" "" \
  "$(awk '$1=="#" && $2=="TYPE" && $4=="counter" && $3 !~ /_total$/ {print $3}' "$tmp/m.txt")"

# -o FILE: written whole, readable by a collector, no temporary left.
mkdir "$tmp/textfile"
"$T" metrics -o "$tmp/textfile/throttle.prom"
check "metrics -o exits 0" 0 $?
check "metrics -o writes what stdout shows" \
  "$(grep -v seconds_left "$tmp/m.txt" | grep -v '^throttle_key_waited' | wc -l)" \
  "$(grep -v seconds_left "$tmp/textfile/throttle.prom" | grep -v '^throttle_key_waited' | wc -l)"
check "metrics -o leaves only the file" "throttle.prom" "$(ls "$tmp/textfile")"
check "metrics -o file is world-readable" "644" "$(stat -c %a "$tmp/textfile/throttle.prom")"
"$T" metrics -o "$tmp/no/such/dir/x.prom" 2>"$tmp/err"
check "metrics -o into a missing directory fails" 1 $?

# Which build, and whether the segment was read; a pool's row is marked,
# so that summing the rows without it counts each request once.
check_true "throttle_build_info names the versions" \
  grep -q '^throttle_build_info{throttlectl="[0-9.]*",libthrottle="[0-9.]*"} 1$' "$tmp/m.txt"
check_true "throttle_up is 1" grep -q "^throttle_up{segment=\"$SEG\"} 1\$" "$tmp/m.txt"
pseg="$SEG-pool"
rm_pool() { "$T" --segment "$pseg" rm >/dev/null 2>&1; }
cleanup_hooks="$cleanup_hooks rm_pool"
"$T" --segment "$pseg" set mpool --max-parallel 3 >/dev/null &&
  "$T" --segment "$pseg" set mpool/t --max-parallel 2 >/dev/null
"$T" --segment "$pseg" metrics >"$tmp/m2.txt"
check_true "a pool's row has pool=\"true\"" \
  grep -q "^throttle_key_cap{segment=\"$pseg\",key=\"mpool\",pool=\"true\"} 3\$" "$tmp/m2.txt"
check_true "  a key's below it has not" \
  grep -q "^throttle_key_cap{segment=\"$pseg\",key=\"mpool/t\",scope=\"mpool\"} 2\$" "$tmp/m2.txt"
# One request held beneath the pool: the pool's own families name it by
# its scope, and summing the key rows without pool="true" counts it once.
"$T" --segment "$pseg" run mpool/t -- sh -c "echo \$\$ >'$tmp/held.tmp'; mv '$tmp/held.tmp' '$tmp/held'; exec sleep 30" >/dev/null 2>&1 &
held=$!
i=0
until [ -f "$tmp/held" ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
"$T" --segment "$pseg" metrics >"$tmp/m3.txt"
kill "$(cat "$tmp/held")" 2>/dev/null; wait "$held" 2>/dev/null
check_true "throttle_pool_in_flight by scope: the request held beneath" \
  grep -q "^throttle_pool_in_flight{segment=\"$pseg\",scope=\"mpool\"} 1\$" "$tmp/m3.txt"
check_true "throttle_pool_cap by scope" \
  grep -q "^throttle_pool_cap{segment=\"$pseg\",scope=\"mpool\"} 3\$" "$tmp/m3.txt"
check "sum of throttle_key_in_flight without the pool rows: 1" 1 \
  "$(grep '^throttle_key_in_flight{' "$tmp/m3.txt" | grep -v 'pool="true"' | awk '{s += $2} END {print s}')"
check "no pool family names a key that is no pool" 0 \
  "$(grep -c '^throttle_pool_[a-z_]*{.*scope="mpool/t"' "$tmp/m3.txt")"
rm_pool
# A segment that is gone: FILE is rewritten with throttle_up 0 and no
# figure, not left with the last ones looking current.
cp "$tmp/textfile/throttle.prom" "$tmp/before.prom"
"$T" --segment "$SEG-gone" metrics -o "$tmp/textfile/throttle.prom" 2>"$tmp/err"
check "metrics -o of a segment that is gone: exit 1" 1 $?
check_true "  FILE says throttle_up 0" \
  grep -q "^throttle_up{segment=\"$SEG-gone\"} 0\$" "$tmp/textfile/throttle.prom"
check "  and holds no key figure" 0 "$(lines '^throttle_key_' "$tmp/textfile/throttle.prom")"
check "  no temporary left" "throttle.prom" "$(ls "$tmp/textfile")"
if command -v promtool >/dev/null 2>&1; then
  promtool check metrics <"$tmp/textfile/throttle.prom" >"$tmp/promtool.out" 2>&1
  check "  promtool accepts it" 0 $?
fi

# ---- JSON ----
"$T" ls --json >"$tmp/ls.json"
"$T" show hot --json >"$tmp/show.json"
"$PY" - "$tmp/ls.json" "$tmp/show.json" "$SEG" <<'PYEOF'
import base64, json, sys
ls = json.load(open(sys.argv[1], encoding="utf-8"))
show = json.load(open(sys.argv[2], encoding="utf-8"))
assert ls["schema"] == 1 and show["schema"] == 1
assert ls["segment"] == sys.argv[3] and ls["readonly"] is False
keys = {k["key"]: k for k in ls["keys"]}
assert 'we"ird\\key x' in keys
raw = [k for k in ls["keys"] if "key_base64" in k]
assert len(raw) == 1, raw
assert base64.b64decode(raw[0]["key_base64"]) == b"raw\xffkey"
assert raw[0]["key"] == "raw\ufffdkey"
for k in ls["keys"] + [show]:
    for f in ("cap_auto", "probe_out", "lock_episode", "paused"):
        assert k[f] is True or k[f] is False, (f, k[f])
    for h in k["holders"]:
        assert h["probe"] is True or h["probe"] is False
assert show["paused"] is True and show["cap_auto"] is False
assert show["admitted"] == 2
PYEOF
check "JSON: schema, booleans, base64 for non-UTF-8 keys" 0 $?

# ---- segments ----
out=$("$T" segments)
check "segments exits 0" 0 $?
line=$(printf '%s\n' "$out" | awk -v s="$SEG" '$1==s')
check "segments lists the segment with its keys" "$SEG root 0600 3/4096" \
  "$(printf '%s\n' "$line" | awk '{print $1, $2, $3, $5}')"
"$T" segments --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
s = [x for x in d["segments"] if x["name"] == sys.argv[1]][0]
assert d["schema"] == 1 and s["used"] == 3 and s["readable"] is True
assert s["idle_ms"] >= 0' "$SEG"
check "segments --json" 0 $?

# ---- watch off a terminal: repeated plain blocks, clean exit on SIGINT ----
"$T" watch hot --interval 0.2 >"$tmp/watch.txt" 2>&1 &
w=$!
i=0
while [ "$(lines '^KEY' "$tmp/watch.txt")" -lt 3 ] && [ $i -lt 200 ]; do
  sleep 0.05; i=$((i + 1)); done
kill -INT $w
wait $w
check "watch exits 0 on SIGINT" 0 $?
check "watch off a terminal writes no escape sequences" 0 \
  "$(grep -c "$(printf '\033')" "$tmp/watch.txt")"
check "watch shows only the keys named" "hot" \
  "$(awk '$1!="KEY" && !/ segment / && NF>=8 {print $1}' "$tmp/watch.txt" | sort -u)"

# ---- values the library bounds are clamped with a warning ----
"$T" backoff far 99999999999999999999 2>"$tmp/err"
check "backoff beyond the maximum exits 0" 0 $?
check_true "backoff beyond the maximum warns" contains "$(cat "$tmp/err")" \
  "out of range; the segment's maximum delay, 15m00s, is used"
# A process's own maximum bounds only what it honours: no warning, 5 s kept.
THROTTLE_MAX_DELAY_MS=2000 "$T" backoff near 5 2>"$tmp/err"
check "a process's own maximum does not clamp what it stores" "" "$(cat "$tmp/err")"
"$T" max-delay 2 >/dev/null
"$T" backoff near 5 2>"$tmp/err"
check_true "the maximum follows the segment's (max-delay)" contains \
  "$(cat "$tmp/err")" "the segment's maximum delay, 2.0s, is used"
"$T" max-delay 900 >/dev/null
"$T" backoff fine 5 2>"$tmp/err"
check "a delay within the maximum is not warned about" "" "$(cat "$tmp/err")"
"$T" set fine --backfill-share 0.0004 2>"$tmp/err"
check_true "a share finer than thousandths warns" contains "$(cat "$tmp/err")" \
  "0.000 is used (backfill gets no slot)"
"$T" watch --interval 0.001 >"$tmp/w2" 2>"$tmp/err" &
w=$!
i=0
while [ "$(lines '^KEY' "$tmp/w2")" -lt 1 ] && [ $i -lt 200 ]; do
  sleep 0.05; i=$((i + 1)); done
kill -INT $w; wait $w
check_true "watch --interval below the minimum warns" contains \
  "$(cat "$tmp/err")" "the minimum, 0.1 s, is used"
# ---- show lists the waiters, in arrival order, with pid and class ----
"$T" pause queue
"$T" run queue --class backfill --timeout 30 -- true &
w1=$!
i=0
while ! "$T" show queue --json 2>/dev/null | grep -q '"waiting_backfill":1' &&
  [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
"$T" run queue --timeout 30 -- true &
w2=$!
i=0
while ! "$T" show queue --json 2>/dev/null | grep -q '"waiting_live":1' &&
  [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
out=$("$T" show queue)
check_true "show has a waiters section" contains "$out" "
waiters:"
check_true "the first to arrive is listed first, with pid and class" \
  contains "$(printf '%s\n' "$out" | sed -n '/^waiters:/,$p' | sed -n 3p)" \
  "$w1  throttlectl  backfill"
check_true "then the next" contains \
  "$(printf '%s\n' "$out" | sed -n '/^waiters:/,$p' | sed -n 4p)" "$w2  throttlectl  live"
check_true "show --json carries them" contains "$("$T" show queue --json)" \
  "\"waiters\":[{\"pid\":$w1,\"class\":\"backfill\""
"$T" resume queue
wait $w1
check "the waiters go once resumed (backfill)" 0 $?
wait $w2
check "the waiters go once resumed (live)" 0 $?
check_true "and are no longer listed" test -z "$("$T" show queue | grep '^waiters:')"
# ---- a segment writable by others: refused for writing, shown read-only ----
chmod 666 "/dev/shm$SEG"
cp "/dev/shm$SEG" "$tmp/before"
out=$("$T" ls 2>"$tmp/err")
check "ls on an other-writable segment exits 0" 0 $?
check_true "it is shown read-only" contains "$out" "(read-only)"
check_true "with a note on why" contains "$(cat "$tmp/err")" \
  "writable by group or others, which loaders refuse"
"$T" backoff x 1 2>"$tmp/err"
check "a writing command is refused" 1 $?
cmp "$tmp/before" "/dev/shm$SEG"
check "the segment is unchanged by the read" 0 $?
finish
