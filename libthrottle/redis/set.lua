-- set: ARGV 5.. what (cap, auto, rate, share, pause, resume, cancel,
-- clear, wait), a, b.  Returns 0, or -1 when the key does not exist and the
-- operation needs it (resume, cancel, clear), nor any waiter beneath it.
begin(KEYS, ARGV)
local what, a, b = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local exists = redis.call('EXISTS', K) == 1
touched[W], touched[WI], touched[X] = true, true, true
if (what == 'resume' or what == 'cancel' or what == 'clear') and not exists then
  -- a scope without a record of its own (its keys publish on themselves)
  -- still reaches the keys beneath: their waiters are woken, and a cancel
  -- (a cancel generation, hence a record) ends them
  if redis.call('HLEN', KB) == 0 then return -1 end
  if what ~= 'cancel' then
    wake_beneath()
    return 0
  end
end
if what == 'cap' then
  -- a fixed cap keeps what was learned; auto (0) drops a bound too
  p('fixed_cap', a)
  if a == 0 then p('auto_max', 0) end
elseif what == 'auto' then
  -- learned, never above a: the cap comes down at once (settings.c)
  p('fixed_cap', 0); p('auto_max', a)
  store_learned(learned())
elseif what == 'rate' then
  p('rate_n', a); p('rate_period', a > 0 and b or 0); p('rate_tat', 0)
elseif what == 'share' then
  p('share', a); p('share_set', 1)
elseif what == 'pause' then
  p('paused', 1)
elseif what == 'resume' then
  p('paused', 0)
elseif what == 'cancel' then
  p('cancel_gen', g('cancel_gen') + 1)
  local ws = redis.call('HGETALL', WI)
  for i = 1, #ws, 2 do
    local w = words(ws[i + 1])
    if w[7] == 'w' then
      w[7] = 'c'
      redis.call('HSET', WI, ws[i], table.concat(w, ' '))
      redis.call('ZREM', W, ws[i]) -- off the queue; woken, its look is told
      push(ws[i])
    end
  end
elseif what == 'clear' then
  -- 'cleared': a host's copy published before it is never healed back
  p('nb', 0); zero('episode'); zero('probe'); inc('clears'); p('cleared', now)
elseif what == 'wait' then
  -- a caller that had to sleep: counters only
  inc('waits'); p('waited_ms', g('waited_ms') + a)
  store()
  return 0
end
reap()
reap_waiters()
grant(nil)
wake_all()
wake_beneath()
store()
return 0
