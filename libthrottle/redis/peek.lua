-- peek: ARGV 5.. watcher id (0 = new, '-' = do not watch), liveness ms.
-- Returns {ms until the not-before passes (0 = passed), held (1 paused,
-- 2 probe of a lock episode out, 0 neither), watcher id}.  A watcher is
-- woken through its list by a clear, a resume or the probe's answer.
begin(KEYS, ARGV)
local wid, live = ARGV[5], tonumber(ARGV[6])
local nb = math.max(clamp_nb(), scope_nb())
local left = 0
if nb > now then left = nb - now end
local held = 0
if g('paused') == 1 then
  held = 1
elseif g('episode') == 1 and (s['probe'] or '0') ~= '0' then
  reap()
  if (s['probe'] or '0') ~= '0' then held = 2 end
end
if held == 0 and left == 0 then
  -- a scope's pause, or its probe out (scope.c throttle__scope_gate_locked)
  local sv = scope_gate()
  if sv == 1 then
    held = 2
    for si = 1, #SC do local sc = SC[si] if sg(sc, 'paused') == 1 then held = 1 end end
  end
end
if wid ~= '-' then
  if left == 0 and held == 0 then
    if wid ~= '0' then redis.call('ZREM', X, wid); beneath_del(wid) end
  else
    if wid == '0' then wid = fence() end
    redis.call('ZADD', X, fmt(now + live), wid)
    beneath_add(wid, 'w', now + live, nil)
    touched[X] = true
  end
end
if #dirty > 0 or wid ~= '-' then store() end
return {left, held, wid}
