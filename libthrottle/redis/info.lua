-- info: no ARGV beyond the common ones.  Returns -1 for a key that does
-- not exist, else {fields in throttle_field_t order up to
-- CAP_LEARNED_AGO_MS, then one 'pid age_ms cls probe host' string per holder,
-- then one 'w pid age_ms cls host' per waiter in arrival order (the first
-- 32; the age from its arrival number, which is Redis's clock in us)}.
-- (a hash with no name holds only what keys beneath it left: seed_*)
begin(KEYS, ARGV)
if redis.call('EXISTS', K) == 0 or not s['key'] then return -1 end
reap()
reap_waiters()
local nb = clamp_nb()
local left = 0
if nb > now then left = nb - now end
local wl, wb = 0, 0
for _, v in ipairs(redis.call('HVALS', WI)) do
  local w = words(v)
  if w[7] == 'w' then
    if w[1] == '0' then wl = wl + 1 else wb = wb + 1 end
  end
end
local hs = {}
local hl = holders()
for hi = 1, #hl do local hv = hl[hi]
  for _ = 1, hcount(hv) do hs[#hs + 1] = hv[2] end -- (reserve: one per caller)
end
local probe = s['probe'] or '0'
local out = {left, g('publishes'), g('waits'), g('waited_ms'), g('last_delay'),
  g('last_pid'), now - g('last_use'), g('clears'), #hs, cap_of(),
  g('fixed_cap') == 0 and 1 or 0, wl, wb, probe ~= '0' and 1 or 0,
  g('episode'), g('paused'), g('rate_n'), g('rate_period'), share_of(),
  g('admitted'), g('locked'), g('probes'), g('reclaims'), g('canceled'),
  g('permanent')}
-- the learner's fields (gate_info.c): CAP_GOOD .. CAP_LEARNED_AGO_MS
local L = learned()
local nr = next_raise_us(L)
for _, x in ipairs({L.good, L.fail, L.fails, L.max, L.ra,
    math.floor(L.work / 1000), nr < 0 and -1 or math.floor(nr / 1000),
    L.learned == 0 and -1 or now - L.learned}) do
  out[#out + 1] = x
end
for i = 1, #out do out[i] = fmt(out[i]) end
for _, v in ipairs(hs) do
  local w = words(v)
  out[#out + 1] = table.concat({w[10], fmt(now - tonumber(w[4])), w[1], w[2], w[9]}, ' ')
end
-- in arrival order across the classes (W orders live before backfill)
local ids = redis.call('ZRANGE', W, 0, -1)
table.sort(ids, function(a, b) return (tonumber(a) or 0) < (tonumber(b) or 0) end)
local nw = 0
for _, id in ipairs(ids) do
  if nw >= SLOTS then break end
  local v = redis.call('HGET', WI, id)
  local w = v and words(v)
  if w and w[7] == 'w' then
    nw = nw + 1
    local age = math.floor((now_us - (tonumber(id) or now_us)) / 1000)
    if age < 0 then age = 0 end
    out[#out + 1] = table.concat({'w', w[6], fmt(age), w[1], w[5]}, ' ')
  end
end
store()
return out
