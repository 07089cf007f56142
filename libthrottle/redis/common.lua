-- common.lua: prepended to every script (see libthrottle/redis.h for the
-- gate rules mirrored here).  KEYS: 1 state hash (with the holders, as
-- fields h:FENCE, so an uncontended admission reads and writes one key),
-- 2 waiters zset, 3 waiter info hash, 4 watchers zset, 5 the parent
-- scope's state hash (KEYS[1] for a key without one: see seed below).
-- ARGV 1..4: queue key prefix, idle TTL ms, this caller's max delay ms,
-- the key's name (kept in the state hash for listings).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local K, W, WI, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local QP, TTL, MAXD = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local NAME = ARGV[4]
local SLOTS, DEFAULT_DELAY, MAX_FAILS = 32, 5000, 10

-- The state hash, read once; fields written back (or deleted) by store().
local s, dirty, gone = {}, {}, {}
do
  local a = redis.call('HGETALL', K)
  for i = 1, #a, 2 do s[a[i]] = a[i + 1] end
end
local function g(f) return tonumber(s[f] or '0') or 0 end
local function p(f, v)
  local str = type(v) == 'number' and string.format('%.0f', v) or v
  s[f] = str
  dirty[f] = true
  gone[f] = nil
end
local function del(f) s[f] = nil; dirty[f] = nil; gone[f] = true end
local function inc(f) p(f, g(f) + 1) end
local function fmt(v) return string.format('%.0f', v) end

-- Holders: field h:FENCE of the state hash.
local function hget(id) return s['h:' .. id] end
local function holders()
  local out = {}
  for f, v in pairs(s) do
    if string.sub(f, 1, 2) == 'h:' then out[#out + 1] = {string.sub(f, 3), v} end
  end
  return out
end

-- Fence numbers (admissions and waiters of the key): never repeat, even
-- after Redis lost its state (they restart at Redis's clock in
-- microseconds, past anything issued before).
local function fence()
  local c = g('seq')
  if c < now_us then c = now_us end
  c = c + 1
  p('seq', c)
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

-- The cap now (internal.h throttle__cap_of): fixed, else learned and
-- bounded by auto:MAX.  A stored value that is no number in 1..SLOTS
-- (negative, huge, 'nan') means 1, or SLOTS when too large.
local function cap_of()
  local c = g('fixed_cap')
  if c == 0 then
    c = g('auto_cap')
    local m = g('auto_max')
    if m >= 1 and m <= SLOTS and c > m then c = m end
  end
  if not (c >= 1) then c = 1 end
  if c > SLOTS then c = SLOTS end
  return math.floor(c)
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
  for _, hv in ipairs(holders()) do
    local w = words(hv[2])
    if (tonumber(w[5]) or 0) < now or (tonumber(w[6]) or 0) < now then
      del('h:' .. hv[1])
      inc('reclaims')
      if s['probe'] == hv[1] then p('probe', '0') end
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
  if probe ~= '0' and not hget(probe) then
    p('probe', '0'); probe = '0'
  end
  local cap = cap_of()
  local nh, bf = 0, 0
  for _, hv in ipairs(holders()) do
    nh = nh + 1
    if words(hv[2])[1] == '1' then bf = bf + 1 end
  end
  local share = share_of()
  local bf_cap = 0
  if share > 0 then
    bf_cap = math.floor(cap * share / 1000)
    if bf_cap < 1 then bf_cap = 1 end
  end
  while nh < cap do
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
    nh = nh + 1
    if w[1] == '1' then bf = bf + 1 end
    local isprobe = '0'
    inc('admitted')
    if g('episode') == 1 then
      isprobe = '1'; probe = id; p('probe', id); inc('probes')
    end
    local lease, live = tonumber(w[3]), tonumber(w[4])
    p('h:' .. id, table.concat({w[1], isprobe, nh, fmt(now),
      fmt(now + live), fmt(now + lease), w[3], w[4], w[5], w[6]}, ' '))
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
local function store()
  p('last_use', now)
  p('key', NAME)
  local args = {}
  for f, _ in pairs(dirty) do args[#args + 1] = f; args[#args + 1] = s[f] end
  redis.call('HSET', K, unpack(args))
  local dels = {}
  for f, _ in pairs(gone) do dels[#dels + 1] = f end
  if #dels > 0 then redis.call('HDEL', K, unpack(dels)) end
  -- idle TTL past the not-before and past every holder's lease
  local last = now
  local nb = g('nb')
  if nb > last then last = nb end
  for _, hv in ipairs(holders()) do
    local lu = tonumber(words(hv[2])[6]) or 0
    if lu > last then last = lu end
  end
  local ttl = TTL + (last - now)
  -- The state hash's expiry is renewed when it moved by a tenth of the
  -- idle TTL (each call into Lua costs as much as a round trip's work).
  if touched[K] and math.abs(now + ttl - g('exp')) < TTL / 10 then
    touched[K] = nil
  elseif touched[K] then
    redis.call('HSET', K, 'exp', fmt(now + ttl))
    s['exp'] = fmt(now + ttl)
  end
  for k, _ in pairs(touched) do redis.call('PEXPIRE', k, ttl) end
end

-- The learned cap (gate_learn.c: the rules, and why; docs/LEARNED-CAP.md:
-- the design).  Fields of the state hash: auto_cap, auto_good (largest cap
-- used in full with no refusal since; 0 none), auto_fail_cap (the cap
-- whose raise was refused last), auto_fails (failed raises since the last
-- good one: the doubling), auto_max (auto:MAX; 0 = SLOTS), auto_ra_ms (R:
-- the Retry-After of the refusal that set the cap), auto_work_us (work at
-- the cap since then), auto_learned (Redis ms of that refusal; 0 = never:
-- slow start).  Redis is the clock of hold times and of auto_learned.
local MAX_RA_MS, NEED_FACTOR, MAX_WORK_US = 604800000, 20, 2 ^ 64

-- A stored integer in lo..hi, or nil (absent counts as 0).
local function in_range(f, lo, hi)
  local v = tonumber(s[f] or '0')
  if v == nil or not (v >= lo and v <= hi) then return nil end
  return math.floor(v)
end

-- Every learned field, bounded before use (I8: the hash is input too, as
-- the segment is for gate_learn.c's throttle__learn_bound_locked): a value
-- out of range resets as the design's table says, the cap never exceeds
-- the bound, R never exceeds 7 days (so the price of a raise stays a
-- finite number of ms), the learned time never lies ahead.
local function learned()
  local L = {}
  L.max = in_range('auto_max', 0, SLOTS) or 0
  L.bound = L.max >= 1 and L.max or SLOTS
  L.cap = in_range('auto_cap', 1, SLOTS) or 1
  if L.cap > L.bound then L.cap = L.bound end
  L.good = in_range('auto_good', 0, SLOTS) or 0
  if L.good > L.bound then L.good = L.bound end
  L.fail = in_range('auto_fail_cap', 0, SLOTS) or 0
  L.fails = in_range('auto_fails', 0, MAX_FAILS) or MAX_FAILS
  L.ra = in_range('auto_ra_ms', 0, MAX_RA_MS) or MAX_RA_MS
  L.work = in_range('auto_work_us', 0, MAX_WORK_US)
  if L.work == nil then
    L.work = tonumber(s['auto_work_us']) or 0
    L.work = L.work > MAX_WORK_US and MAX_WORK_US or 0 -- saturated, or junk
  end
  L.learned = in_range('auto_learned', 0, now) or now
  return L
end

local function store_learned(L)
  p('auto_cap', L.cap); p('auto_good', L.good); p('auto_fail_cap', L.fail)
  p('auto_fails', L.fails); p('auto_max', L.max); p('auto_ra_ms', L.ra)
  p('auto_work_us', L.work); p('auto_learned', L.learned)
  -- the fields of the rule before this one
  if s['auto_ssthresh'] then del('auto_ssthresh') end
  if s['auto_oks'] then del('auto_oks') end
end

-- Work still due before the next raise, in us: 0 in slow start, -1 never
-- (a fixed cap, or at the bound).
local function next_raise_us(L)
  if g('fixed_cap') ~= 0 or L.cap >= L.bound then return -1 end
  if L.learned == 0 then return 0 end
  local need = NEED_FACTOR * L.ra * 1000 * 2 ^ L.fails
  if L.work >= need then return 0 end
  return need - L.work
end

-- A key new to a scope starts from what its siblings learned (scope.c
-- throttle__scope_seed_locked): each refusal that sets a cap leaves the
-- learned state in the parent scope's hash (seed_* fields: the last one
-- wins, as the segment seeds from the sibling that learned last), and a
-- key whose hash does not exist yet copies it.  The parent's own fields
-- are left alone, and its expiry only ever moves later.
local PK = KEYS[5]

local function seed_record(L)
  if PK == nil or PK == K then return end
  local existed = redis.call('EXISTS', PK) == 1
  redis.call('HSET', PK, 'seed_cap', fmt(L.cap), 'seed_good', fmt(L.good),
    'seed_fail_cap', fmt(L.fail), 'seed_ra_ms', fmt(L.ra))
  local left = redis.call('PTTL', PK)
  if not existed or (left >= 0 and left < TTL) then
    redis.call('PEXPIRE', PK, TTL)
  end
end

-- One admission's report (gate_learn.c throttle__learn_locked): outcome,
-- the holders (with it) when it was granted, the holders besides it now,
-- its hold in ms, the Retry-After it reported (0 none).  Only while no
-- fixed cap is set.
local function learn(outcome, concurrent, others, hold_ms, ra_ms)
  if g('fixed_cap') ~= 0 then return end
  local L = learned()
  local k = concurrent > 0 and concurrent - 1 or 0
  if others > k and others < SLOTS then k = others end
  if outcome == 1 then
    if k < 1 then return end -- somebody else's lock: nothing learned
    local to = k < L.bound and k or L.bound
    if L.cap > L.good then -- a raise (or slow start) refused
      L.fail = L.cap
      if L.fails < MAX_FAILS then L.fails = L.fails + 1 end
    elseif to > L.cap then
      to = L.cap -- the same burst: a refusal only ever lowers it
    end
    L.cap, L.good = to, to
    local ra = ra_ms > 0 and ra_ms or DEFAULT_DELAY
    local mx = MAXD < MAX_RA_MS and MAXD or MAX_RA_MS
    L.ra = ra < mx and ra or mx
    L.work = 0
    L.learned = now > 0 and now or 1
    store_learned(L)
    seed_record(L)
    return
  end
  -- Only a success at the cap says anything about a larger one.
  if outcome ~= 0 or concurrent < L.cap then return end
  L.work = L.work + math.floor(hold_ms * 1000 / L.cap)
  if L.work > MAX_WORK_US then L.work = MAX_WORK_US end
  if L.cap > L.good then -- the raised cap held: price from here
    L.good, L.fails, L.work = L.cap, 0, 0
  end
  if L.cap < L.bound then
    if L.learned == 0 then
      L.cap = L.cap + 1
    elseif next_raise_us(L) == 0 then
      L.cap = L.good + 1
    end
  end
  store_learned(L)
end

-- A key new to a scope: seeded before the script runs (stored with the
-- rest by store(); a script that stores nothing creates no key).  Its
-- own work at the cap counts from now; every copied field is bounded.
if PK ~= nil and PK ~= K and next(s) == nil then
  local v = redis.call('HMGET', PK, 'seed_cap', 'seed_good', 'seed_fail_cap',
    'seed_ra_ms')
  if v[1] then
    s['auto_cap'], s['auto_good'] = v[1], v[2] or '0'
    s['auto_fail_cap'], s['auto_ra_ms'] = v[3] or '0', v[4] or '0'
    local L = learned()
    L.learned = now > 0 and now or 1
    store_learned(L)
  end
end
