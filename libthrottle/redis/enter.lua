-- enter: ARGV 5.. wid (0 = arrive now), class, lease ms, liveness ms, host,
-- pid, the ms left before the caller's deadline (-1 = none; 'n': a look
-- that does not wait, nowait), the lengths of the names a 429 and a 503
-- go to (the cold-scope rule), and the call's token (kept in its waiter
-- and holder records: a caller whose command failed gives back by it
-- what the command did, leave.lua).
-- Returns one string (common.lua answer): 'enter STATUS ID PROBE HINT',
-- STATUS 0 admitted (ID is the fence), 1 wait (HINT: ms until time alone
-- may open the gate, -1: a slot), 2 canceled, 3 the waiter record is gone
-- (arrive again), 4 not admitted and not waiting (nowait, or the
-- not-before lies past the deadline); then the key's own settings and
-- its scopes' (mirrored in the host's segment), ';' before each:
-- 'fixed_cap auto_max paused rate_n rate_period share_set share' for the
-- key, and the same for each scope, root first.
-- ARGV 15, 16: how many callers of the key the caller's host's segment
-- still holds or queues (admitted there while Redis was away), and that
-- segment's name: kept as that many reservations, one holder h:R:NAME of
-- the host counted as that many, which lapses with the liveness unless
-- its next look keeps it,
-- so that the host rejoins while its segment drains and every host
-- counts what it admitted.  ARGV 17 (may be absent): the settings the
-- host keeps of the key and its scopes, put back where Redis lost them
-- (common.lua heal_settings), before anything is decided.
-- the common case first (common.lua lean_enter), else the whole script
local lean, pre = lean_enter(KEYS, ARGV)
if lean then return lean end
begin(KEYS, ARGV, pre)
local wid, cls, lease, live = ARGV[5], ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
local host, pid, nowait, left = ARGV[9], ARGV[10], ARGV[11] == 'n', tonumber(ARGV[11])
local rec = {cls, fmt(now + live), lease, live, host, pid, 'w', ARGV[14] or '-'}
local fresh = wid == '0'
heal_settings(ARGV[17])
scope_cold(tonumber(ARGV[12] or ''), tonumber(ARGV[13] or ''))
reserve(tonumber(ARGV[15] or ''), ARGV[16], live, host)
if fresh and redis.call('ZCARD', W) == 0 then
  -- the uncontended path: try it before registering (and reaping)
  wid = fence()
  pending, queue_empty = {wid, rec}, true
  grant(wid)
  queue_empty = false
  if not pending then
    store()
    return answer(0, wid, probe_of(wid), 0)
  end
  pending = nil
end
touched[W], touched[WI] = true, true
reap()
local v -- a waiter's record as its last look left it
if fresh then
  if wid == '0' then wid = fence() end
  redis.call('ZADD', W, wscore(cls, wid), wid)
else
  v = redis.call('HGET', WI, wid)
  if not v then
    store()
    if hget(wid) then
      return answer(0, wid, probe_of(wid), 0)
    end
    return answer(3, wid, 0, 0)
  end
  if word(v, 7) == 'c' or scope_canceled(wid) then
    waiter_del(wid, words(v))
    inc('canceled')
    store()
    return answer(2, wid, 0, 0)
  end
end
do -- the record, and an arrival's token index (common.lua tok_field)
  local tf = tok_field(rec[8])
  if fresh and not nowait and tf then
    rec[9] = 'i'
    redis.call('HSET', WI, wid, table.concat(rec, ' '), tf, wid)
  else
    redis.call('HSET', WI, wid, table.concat(rec, ' '))
    -- its caller knows its number now: the index of the record's token goes
    local otf = not fresh and word(v, 9) == 'i' and tok_field(word(v, 8))
    if otf then redis.call('HDEL', WI, otf) end
  end
end
local nxt = grant(wid)
if hget(wid) then
  store()
  return answer(0, wid, probe_of(wid), 0)
end
local nb = math.max(clamp_nb(), scope_nb())
local hint = -1
if nxt then hint = nxt - now end
if nowait or (left >= 0 and (left == 0 or (nb > now and nb - now > left))) then
  waiter_del(wid, rec)
  grant(nil)
  store()
  -- how long until time alone could admit it (a not-before, a rate of
  -- the key or a pool); 0 when it waits for a slot or a resume
  hint = 0
  if nb > now then hint = nb - now end
  if nxt and nxt - now > hint then hint = nxt - now end
  return answer(4, wid, 0, hint)
end
beneath_add(wid, cls, now + live, scope_held and hold_depth(cls) or nil)
store()
return answer(1, wid, 0, hint)
