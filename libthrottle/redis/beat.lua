-- beat: ARGV 5 = fence.  Keeps a holder's liveness record fresh.  Returns
-- 1, or 0 when the admission is gone (lapsed or reclaimed): it is never
-- re-acquired here.
local id = ARGV[5]
local v = hget(id)
if not v then return 0 end
local w = words(v)
w[5] = fmt(now + tonumber(w[8]))
redis.call('HSET', K, 'h:' .. id, table.concat(w, ' '))
-- its places in the scopes above (a probe's, a pool's); a capped pool it
-- has no place in (made a pool, or its cap set, while this admission was
-- in flight) gets one now: a new cap counts what is in flight beneath it
-- (scope.c throttle__scope_pool_set_locked), here within one heartbeat
for _, sc in ipairs(SC) do
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
