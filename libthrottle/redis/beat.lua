-- beat: ARGV 5 = fence, then the holder's class, lease ms, liveness ms,
-- host, pid and ms held so far (on its own clock).  Keeps a holder's
-- liveness record fresh.  Returns 1; 2 when the holder was one Redis had
-- lost (a restart, a failover, an eviction: the key's state is younger
-- than the admission, or gone) and is registered again, counted as held
-- beside whoever came meanwhile, with its places in the pools above; 0
-- when the admission was taken back (lapsed or reclaimed): it is never
-- re-acquired then.  Fence '-r': a host's reservations kept (see below).
-- The last argument (ARGV 12, or 10 after '-r'; may be absent): the
-- settings the host keeps of the key and its scopes, put back where Redis
-- lost them, as enter's ARGV 17 (common.lua heal_settings): a held key's
-- state is made again here first after an empty restart.
begin(KEYS, ARGV)
local id = ARGV[5]
if id == '-r' then
  -- ARGV 6..9: the reservations of a host's segment (common.lua reserve)
  heal_settings(ARGV[10])
  reserve(tonumber(ARGV[6] or ''), ARGV[7], tonumber(ARGV[8] or ''), ARGV[9])
  store()
  return 1
end
local v = hget(id)
if not v then
  local fid = tonumber(id) or 0
  local lease, live = tonumber(ARGV[7] or ''), tonumber(ARGV[8] or '')
  local held = tonumber(ARGV[11] or '')
  if not (lease and live and held) or not (K_NEW or g('born') > fid) then
    return 0
  end
  local since = now - held
  if since + lease < now then return 0 end -- its lease is over anyway
  heal_settings(ARGV[12])
  local rec = table.concat({ARGV[6], '0', fmt(nheld() + 1), fmt(since),
    fmt(now + live), fmt(since + lease), fmt(lease), fmt(live), ARGV[9],
    ARGV[10]}, ' ')
  p('h:' .. id, rec)
  inc('reregistered')
  for si = 1, #SC do local sc = SC[si]
    if sg(sc, 'fixed_cap') ~= 0 and not sc.s['h:' .. place_of(id)] then
      sp(sc, 'h:' .. place_of(id), rec)
    end
  end
  store()
  return 2
end
local w = words(v)
w[5] = fmt(now + tonumber(w[8]))
redis.call('HSET', K, 'h:' .. id, table.concat(w, ' '))
-- its places in the scopes above (a probe's, a pool's); a capped pool it
-- has no place in (made a pool, or its cap set, while this admission was
-- in flight) gets one now: a new cap counts what is in flight beneath it
-- (scope.c throttle__scope_pool_set_locked), here within one heartbeat
for si = 1, #SC do local sc = SC[si]
  local f = 'h:' .. place_of(id)
  local pv = redis.call('HGET', sc.k, f)
  if pv then
    local pw = words(pv)
    pw[5] = w[5]
    redis.call('HSET', sc.k, f, table.concat(pw, ' '))
  elseif sg(sc, 'fixed_cap') ~= 0 then
    local pw = words(v)
    pw[2] = '0' -- a place, not the scope's probe
    pw[5] = w[5]
    redis.call('HSET', sc.k, f, table.concat(pw, ' '))
  end
end
return 1
