-- beat: ARGV 5 = fence.  Keeps a holder's liveness record fresh.  Returns
-- 1, or 0 when the admission is gone (lapsed or reclaimed): it is never
-- re-acquired here.
local id = ARGV[5]
local v = redis.call('HGET', H, id)
if not v then return 0 end
local w = words(v)
w[5] = fmt(now + tonumber(w[8]))
redis.call('HSET', H, id, table.concat(w, ' '))
redis.call('PEXPIRE', H, TTL + tonumber(w[7]))
return 1
