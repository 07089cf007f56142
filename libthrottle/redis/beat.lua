-- beat: ARGV 5 = fence.  Keeps a holder's liveness record fresh.  Returns
-- 1, or 0 when the admission is gone (lapsed or reclaimed): it is never
-- re-acquired here.
local id = ARGV[5]
local v = hget(id)
if not v then return 0 end
local w = words(v)
w[5] = fmt(now + tonumber(w[8]))
redis.call('HSET', K, 'h:' .. id, table.concat(w, ' '))
return 1
