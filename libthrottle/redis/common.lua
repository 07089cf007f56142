-- common.lua: prepended to every script (see libthrottle/redis.h for the
-- gate rules mirrored here).  KEYS: 1 state hash, 2 holders hash,
-- 3 waiters zset, 4 waiter info hash, 5 fence counter, 6 watchers zset.
-- ARGV 1..4: queue key prefix, idle TTL ms, this caller's max delay ms,
-- the key's name (kept in the state hash for listings).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local K, H, W, WI, SEQ, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local QP, TTL, MAXD = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local NAME = ARGV[4]
local SLOTS, DEFAULT_DELAY, MAX_FAILS = 32, 5000, 10

local s, dirty = {}, {}
do
  local a = redis.call('HGETALL', K)
  for i = 1, #a, 2 do s[a[i]] = a[i + 1] end
end
local function g(f) return tonumber(s[f] or '0') or 0 end
local function p(f, v)
  local str = type(v) == 'number' and string.format('%.0f', v) or v
  s[f] = str
  dirty[#dirty + 1] = f
  dirty[#dirty + 1] = str
end
local function inc(f) p(f, g(f) + 1) end
local function fmt(v) return string.format('%.0f', v) end

-- Fence numbers: never repeat, even after Redis lost its state (the
-- counter restarts at Redis's clock in microseconds, past anything issued).
local function fence()
  local c = redis.call('INCR', SEQ)
  if c <= now_us then
    c = now_us + 1
    redis.call('SET', SEQ, fmt(c), 'PX', TTL)
  end
  return fmt(c)
end

local function words(v)
  local w = {}
  for x in string.gmatch(v, '%S+') do w[#w + 1] = x end
  return w
end

local function push(id)
  local q = QP .. id
  redis.call('RPUSH', q, 'w')
  redis.call('PEXPIRE', q, 60000)
end

-- Wake every waiter and watcher so they look at the gate again.
local function wake_all()
  for _, id in ipairs(redis.call('ZRANGE', W, 0, -1)) do push(id) end
  for _, id in ipairs(redis.call('ZRANGE', X, 0, -1)) do push(id) end
end

local function clamp_nb()
  local nb = g('nb')
  if nb > now + MAXD then nb = now + MAXD end
  return nb
end

local function cap_of()
  local c = g('fixed_cap')
  if c == 0 then c = g('auto_cap') end
  if c < 1 then c = 1 end
  if c > SLOTS then c = SLOTS end
  return c
end

local function share_of()
  if g('share_set') == 0 then return 1000 end
  local v = g('share')
  if v > 1000 then v = 1000 end
  return v
end

-- holder value: cls probe concurrent since live_until lease_until lease
-- liveness host pid
local function reap()
  local hs = redis.call('HGETALL', H)
  for i = 1, #hs, 2 do
    local w = words(hs[i + 1])
    if (tonumber(w[5]) or 0) < now or (tonumber(w[6]) or 0) < now then
      redis.call('HDEL', H, hs[i])
      inc('reclaims')
      if s['probe'] == hs[i] then p('probe', '0') end
    end
  end
  local ws = redis.call('HGETALL', WI)
  for i = 1, #ws, 2 do
    local w = words(ws[i + 1])
    if (tonumber(w[2]) or 0) < now then
      redis.call('HDEL', WI, ws[i])
      redis.call('ZREM', W, ws[i])
    end
  end
  redis.call('ZREMRANGEBYSCORE', X, '-inf', '(' .. fmt(now))
end

-- A caller that arrives at an empty queue is tried before it is
-- registered (no waiter records to write and delete when it is admitted
-- at once): {id, words} or nil.
local pending = nil
local touched = {[K] = true}

-- Oldest waiting id of class cls (waiter value: cls live_until lease
-- liveness host pid state).
local function oldest(cls)
  if pending then
    if pending[2][1] == cls then return pending[1], pending[2] end
    return nil
  end
  for _, id in ipairs(redis.call('ZRANGE', W, 0, -1)) do
    local v = redis.call('HGET', WI, id)
    if v then
      local w = words(v)
      if w[1] == cls and w[7] == 'w' then return id, w end
    end
  end
  return nil
end

-- Grant as many waiters as the gate allows now; returns the next instant
-- time alone could open it (nil if none).  Granted waiters other than
-- `self` are woken through their own lists.
local function grant(self)
  if g('paused') == 1 then return nil end
  local nb = clamp_nb()
  if nb > now then return nb end
  if not pending and redis.call('ZCARD', W) == 0 then return nil end
  local probe = s['probe'] or '0'
  if probe ~= '0' and redis.call('HEXISTS', H, probe) == 0 then
    p('probe', '0'); probe = '0'
  end
  local cap = cap_of()
  local holders, bf = 0, 0
  local hs = redis.call('HVALS', H)
  for _, v in ipairs(hs) do
    holders = holders + 1
    if words(v)[1] == '1' then bf = bf + 1 end
  end
  local share = share_of()
  local bf_cap = 0
  if share > 0 then
    bf_cap = math.floor(cap * share / 1000)
    if bf_cap < 1 then bf_cap = 1 end
  end
  while holders < cap do
    if g('episode') == 1 and probe ~= '0' then return nil end
    local id, w = oldest('0')
    if id == nil and bf < bf_cap then id, w = oldest('1') end
    if id == nil then return nil end
    local rn = g('rate_n')
    if rn > 0 then
      local T = math.floor(g('rate_period') / rn)
      local tau = T * (rn - 1)
      local tat = g('rate_tat')
      if tat - tau > now then return tat - tau end
      if tat < now then tat = now end
      p('rate_tat', tat + T)
    end
    holders = holders + 1
    if w[1] == '1' then bf = bf + 1 end
    local isprobe = '0'
    inc('admitted')
    if g('episode') == 1 then
      isprobe = '1'; probe = id; p('probe', id); inc('probes')
    end
    local lease, live = tonumber(w[3]), tonumber(w[4])
    redis.call('HSET', H, id, table.concat({w[1], isprobe, holders, fmt(now),
      fmt(now + live), fmt(now + lease), w[3], w[4], w[5], w[6]}, ' '))
    touched[H] = true
    if pending and id == pending[1] then
      pending = nil
    else
      redis.call('HDEL', WI, id)
      redis.call('ZREM', W, id)
    end
    if id ~= self then push(id) end
  end
  return nil
end

local function publish(ms, pid)
  if ms > MAXD then ms = MAXD end
  local want = now + ms
  if want > clamp_nb() then p('nb', want) end
  p('episode', 1)
  inc('publishes')
  p('last_delay', ms)
  p('last_pid', pid)
end

-- Store what changed and give every key of the operation its TTL: an idle
-- key disappears (TTL past its not-before and past any lease).
local function store(extra)
  dirty[#dirty + 1] = 'last_use'
  dirty[#dirty + 1] = fmt(now)
  dirty[#dirty + 1] = 'key'
  dirty[#dirty + 1] = NAME
  redis.call('HSET', K, unpack(dirty))
  local ttl = TTL + (extra or 0)
  local nb = g('nb')
  if nb > now then ttl = ttl + (nb - now) end
  for k, _ in pairs(touched) do redis.call('PEXPIRE', k, ttl) end
end
