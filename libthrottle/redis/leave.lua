-- leave: ARGV 5.. fence, outcome (throttle_outcome_t), retry-after ms
-- (0 = the default), pid, 'pub' for a plain throttle_backoff() (the
-- delay as given, no outcome counted), 'heal' for what a host's segment
-- knew (backend.h) or '', and the length of the name the back-off goes
-- to (the key's, or one of its scopes'; none: the key).  Returns the
-- string 'leave 1' when the fence no longer held a slot (lapsed or
-- reclaimed): its report then only pushes the not-before later; it frees
-- nothing and ends no probe's episode.  'leave 0' otherwise.
-- Fence '-' and a token (ARGV 11): the give-back of an enter whose caller
-- did not hear its answer (the command failed, it may have run since): the
-- holder of that token leaves (ABANDONED), or its waiter record goes
-- ('leave 2'), or nothing is found ('leave 1': it may not have run yet).
-- ARGV 12: the waiter's number when its caller had one ('0' for an
-- arrival).  'heal' answers 'leave 3' for a copy older than the key's
-- last clear.  (Strings, not arrays: common.lua answer.)
-- the common case first (common.lua lean_leave), else the whole script
local lean, pre = lean_leave(KEYS, ARGV)
if lean then return lean end
begin(KEYS, ARGV, pre)
local id, outcome, ms, pid = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local heal = ARGV[9] == 'heal'
local plain = ARGV[9] == 'pub' or heal
local pub_at = tonumber(ARGV[10] or '') or #NAME
if id == '-' then
  local token = ARGV[11] or ''
  local hl = holders()
  for hi = 1, #hl do local hv = hl[hi]
    if word(hv[2], 11) == token then id = hv[1] end
  end
  if id == '-' then
    -- its waiter: the one the caller names (ARGV 12), else an arrival's,
    -- by its token's index (one read each, however many wait)
    local tf, wid, by_index = tok_field(token), ARGV[12], false
    if not wid or wid == '0' or wid == '' then
      wid, by_index = tf and redis.call('HGET', WI, tf), true
    end
    if wid then
      local v = redis.call('HGET', WI, wid)
      local w = v and words(v)
      if w and w[8] == token then
        waiter_del(wid, w)
        return 'leave 2'
      end
      if by_index then redis.call('HDEL', WI, tf) end -- its record went
    end
    return 'leave 1'
  end
end
local v = hget(id)
local publish_it = outcome == 1 or outcome == 2 or outcome == 3
if v then
  local concurrent = tonumber(word(v, 3)) or 0
  local others = nheld() - 1
  del('h:' .. id)
  local was_probe = s['probe'] == id
  if was_probe then
    zero('probe')
    for _, x in ipairs(redis.call('ZRANGE', X, 0, -1)) do push(x) end
    if outcome == 0 then zero('episode') end
  end
  -- the learned cap (common.lua learn); a hostile holder record counts
  -- as granted alone, held for no time
  if not (concurrent >= 0 and concurrent <= SLOTS) then concurrent = 0 end
  learn(outcome, concurrent, others, v, ms)
end
if outcome == 1 and not plain then inc('locked') end
if outcome == 4 then inc('permanent') end
if publish_it then
  if ms == 0 and not plain then ms = DEFAULT_DELAY end
  if heal then
    -- what another host's segment knew: only a not-before Redis lost
    -- (later than its own by more than a round trip), counted nowhere,
    -- and never one published before the key's last clear or reset
    -- (ARGV 11: how long ago the host's copy was written, by its clock;
    -- it was written after Redis had the back-off, so that time is late
    -- by a round trip or a scheduling delay: a second of slack, as for
    -- the not-before above)
    limits()
    if ms > MAXS then ms = MAXS end
    local age = tonumber(ARGV[11] or '') or 0
    if g('cleared') > 0 and now - age <= g('cleared') + 1000 then
      return 'leave 3'
    end
    if now + ms > clamp_nb() + 1000 then p('nb', now + ms); p('episode', 1) end
  elseif pub_at >= #NAME or not scope_publish(ms, pid, pub_at) then
    publish(ms, pid)
  end
end
if plain and not heal then wake_beneath() elseif #SC > 0 then scope_leave(id, outcome, pub_at) end
if redis.call('ZCARD', W) > 0 then
  reap()
  grant(nil)
end
store()
if v then return 'leave 0' end
return 'leave 1'
