-- common.lua: the helpers every script shares (see libthrottle/redis/redis.h
-- for the gate rules mirrored here), and begin(KEYS, ARGV), which sets up
-- one call's state.  Defined once: a Redis Functions library is this file
-- and one function per script; for EVAL (a server without Functions) this
-- file is in front of each script (the Makefile builds both forms).  Each
-- script calls begin() first; enter and leave try their lean path (at the
-- end of this file) before it, which answers the common case alone.  The
-- call's state lives in the locals below, every one of them set anew by
-- begin(), so nothing of a call survives into the next (a script runs
-- alone and is never reentered); what a library keeps between calls is
-- fixed tables, a cache of a pure function (argn's) and the lean path's
-- one table of what it read, cleared at each call (PRE).  No redis.call
-- outside a call: Redis refuses them while it loads a library.
-- KEYS: 1 state hash (with the holders, as
-- fields h:FENCE, so an uncontended admission reads and writes one key),
-- 2 waiters zset, 3 waiter info hash, 4 watchers zset, 5 beneath hash,
-- then a state and a beneath hash per scope (see the scopes section; the
-- last scope's state hash is also where the learned cap seeds its
-- siblings: see seed below).
-- ARGV 1..4: queue key prefix, idle TTL ms, HONOUR/STORE (this caller's
-- own max delay ms, which bounds only what it waits out, and the most it
-- may store for the others: its host segment's max delay), the key's name
-- (kept in the state hash for listings).
local now, now_us, K, W, WI, X, QP, TTL, MAXD, MAXS, NAME
-- ARGV 3 as given; MAXD and MAXS are read from it by limits(), when a
-- call first needs them (most calls meet no not-before and need neither)
local LIMITS
local function limits()
  if not MAXD then
    MAXD, MAXS = string.match(LIMITS, '^(%d+)/(%d+)$')
    MAXD, MAXS = tonumber(MAXD), tonumber(MAXS)
  end
  return MAXD, MAXS
end
local SLOTS, DEFAULT_DELAY, MAX_FAILS = 32, 5000, 10

-- The state hash, read once by begin(); fields written back (or deleted)
-- by store().
local s, dirty, gone
-- The state hash is new here: stored with 'born' (Redis's clock in us),
-- so that a holder admitted before it (a fence below born, or no hash at
-- all) is known to be one Redis lost (beat.lua).
local K_NEW
-- The integers 0..SLOTS by their decimal spelling, and back (SMALL['12']
-- is 12, NSTR[12] is '12'): most stored counts, caps and flags are one of
-- these, told by a table lookup where tonumber() would parse the string
-- twice (strtod) and a concatenation would print the number.  Written
-- out: a script sent by EVAL makes them at each call, from its constants.
local SMALL = {
  ['0'] = 0, ['1'] = 1, ['2'] = 2, ['3'] = 3, ['4'] = 4, ['5'] = 5,
  ['6'] = 6, ['7'] = 7, ['8'] = 8, ['9'] = 9, ['10'] = 10, ['11'] = 11,
  ['12'] = 12, ['13'] = 13, ['14'] = 14, ['15'] = 15, ['16'] = 16,
  ['17'] = 17, ['18'] = 18, ['19'] = 19, ['20'] = 20, ['21'] = 21,
  ['22'] = 22, ['23'] = 23, ['24'] = 24, ['25'] = 25, ['26'] = 26,
  ['27'] = 27, ['28'] = 28, ['29'] = 29, ['30'] = 30, ['31'] = 31,
  ['32'] = 32}
local NSTR = {
  [0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12',
  '13', '14', '15', '16', '17', '18', '19', '20', '21', '22', '23', '24',
  '25', '26', '27', '28', '29', '30', '31', '32'}
-- tonumber(v) or 0 for v a string or nil
local function n0(v)
  if v == nil then return 0 end
  return SMALL[v] or tonumber(v) or 0
end
-- A field as a number (absent or no number: 0; absent is the common
-- case, told without a call into C)
local function g(f) return n0(s[f]) end
-- The holder list ({fence, value} each), made by begin() from the hash
-- as read: a write of a holder field makes a new one (never changed in
-- place: a caller may be walking the old one), the field's entry last,
-- where its writer may set what hparse() would read from the value.
local HL
local function is_h(f)
  local a, b = string.byte(f, 1, 2)
  return a == 104 and b == 58
end
local function hl_set(f, v)
  local id, out = string.sub(f, 3), {}
  for hi = 1, #HL do local hv = HL[hi]
    if hv[1] ~= id then out[#out + 1] = hv end
  end
  if v ~= nil then out[#out + 1] = {id, v, false, 0, 0, 0} end
  HL = out
end
-- A number as the hash stores it: an integer, no exponent.  '%d' prints
-- an integral value (v % 1 == 0: not NaN nor an infinity) as '%.0f'
-- does, at half the cost (no float conversion); zero (which may be -0),
-- fractions and magnitudes past 2^53 go by '%.0f'.  (The libraries are read at each
-- call: a Functions library may not use them while it loads.)
local function fmt(v)
  if v % 1 == 0 and v ~= 0 and v > -9007199254740992 and
     v < 9007199254740992 then
    return string.format('%d', v)
  end
  return string.format('%.0f', v)
end
-- A field written back by store(); one that keeps its value is not (each
-- field Redis writes costs as much as a few Lua lines).
local function p(f, v)
  local str = type(v) == 'number' and fmt(v) or v
  if s[f] == str and not gone[f] then return end
  if is_h(f) then hl_set(f, str) end
  s[f] = str
  dirty[f] = true
  gone[f] = nil
end
local function del(f)
  if is_h(f) then hl_set(f, nil) end
  s[f] = nil; dirty[f] = nil; gone[f] = true
end
local function inc(f) p(f, g(f) + 1) end
-- A field whose 0 (or '0') every reader takes an absent one for (the
-- probe, the episode, the learned cap's fields) is not stored at 0: the
-- hash every call reads whole stays small.
local function zero(f) if s[f] ~= nil then del(f) end end

-- Holders: field h:FENCE of the state hash.
local function hget(id) return s['h:' .. id] end
local function holders() return HL end

-- Fence numbers (admissions and waiters of the key): never repeat, even
-- after Redis lost its state (they restart at Redis's clock in
-- microseconds, past anything issued before).
local function fence()
  local c = g('seq')
  if c < now_us then c = now_us end
  c = c + 1
  p('seq', c)
  return s['seq'] -- fmt(c), as p() stored it
end

local function words(v)
  local w = {}
  for x in string.gmatch(v, '%S+') do w[#w + 1] = x end
  return w
end
-- words(v)[n] without the table (most readers want one field): the nth
-- run of non-space characters, or nil
local WORD = {}
do
  local skip = '^%s*'
  for n = 1, 11 do WORD[n] = skip .. '(%S+)'; skip = skip .. '%S+%s+' end
end
local function word(v, n) return string.match(v, WORD[n]) end

-- A holder's class and its since, live_until and lease_until (words 1, 4,
-- 5, 6 of its value) as numbers (0: none), read once per call into [3] ..
-- [6] of its entry of the holder list ([3] false: not yet; the entries
-- are made with those slots, so that filling them allocates nothing):
-- every call walks the key's holders, and a host rejoining after an
-- outage keeps up to SLOTS of them.
local HWORDS = '^%s*(%S+)%s+%S+%s+%S+%s+(%S+)%s+(%S+)%s+(%S+)'
local function hwords(v) -- class, since, live_until, lease_until
  local c, a, b, d = string.match(v, HWORDS)
  if not c then c, a, b, d = word(v, 1), word(v, 4), word(v, 5), word(v, 6) end
  return c or '', tonumber(a) or 0, tonumber(b) or 0, tonumber(d) or 0
end
local function hparse(hv)
  if not hv[3] then hv[3], hv[4], hv[5], hv[6] = hwords(hv[2]) end
  return hv
end
-- A count within 1..SLOTS: below 1 or no number (NaN) 1, above SLOTS
-- SLOTS, else its integer part (a cap, a host's reservations).
local function in_slots(c)
  if not (c >= 1) then return 1 end
  if c > SLOTS then return SLOTS end
  if c % 1 == 0 then return c end
  return math.floor(c)
end
-- How many holders a holder's value counts as: 1, or for a host's
-- reservations (field h:R:RNAME, reserve) their number, word 3 of the
-- value, in_slots (the hash is input too); hcount: of an entry of the
-- holder list, and nheld(): of the key.
local function hcount_v(v) return in_slots(n0(word(v, 3))) end
local function hcount(hv)
  if string.byte(hv[1], 1) ~= 82 then return 1 end
  return hcount_v(hv[2])
end
local function nheld()
  local n, hl = 0, holders()
  for hi = 1, #hl do n = n + hcount(hl[hi]) end
  return n
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
  if nb > now and nb > now + limits() then nb = now + MAXD end
  return nb
end

-- The cap now (internal.h throttle__cap_of): fixed, else learned and
-- bounded by auto:MAX.  A stored value that is no number in 1..SLOTS
-- (negative, huge, 'nan') means 1, or SLOTS when too large.  cap_from:
-- of the fields fixed_cap, auto_cap and auto_max as g() reads them.
local function cap_from(c, auto, m)
  if c == 0 then
    c = auto
    if m >= 1 and m <= SLOTS and c > m then c = m end
  end
  return in_slots(c)
end
local function cap_of() return cap_from(g('fixed_cap'), g('auto_cap'), g('auto_max')) end

local function share_of()
  if g('share_set') == 0 then return 1000 end
  local v = g('share')
  if v > 1000 then v = 1000 end
  return v
end

-- holder value: cls probe concurrent since live_until lease_until lease
-- liveness host pid token.  Dead holders go (and the watchers whose liveness
-- lapsed); dead waiters go when they reach the head of the queue
-- (oldest), so that a look costs O(log N) in the waiters, not O(N).
local function reap()
  local hl = holders()
  for hi = 1, #hl do local hv = hparse(hl[hi])
    if hv[5] < now or hv[6] < now then
      del('h:' .. hv[1])
      p('reclaims', g('reclaims') + hcount(hv))
      if s['probe'] == hv[1] then zero('probe') end
    end
  end
  redis.call('ZREMRANGEBYSCORE', X, '-inf', '(' .. fmt(now))
end

-- The index field of a waiter's token in the waiter info hash (t:TOKEN
-- -> its id), or nil for a record without a token: the give-back of an
-- arrival whose caller did not hear its number finds it there (leave.lua)
-- in one read, however many wait.  Written with the record of an arrival
-- that waits (enter.lua; the record's word 9 is then 'i'), dropped with it
-- or at the waiter's next look, which shows that its caller knows its
-- number (a give-back then names it), so the hash keeps about one field
-- per waiter: Redis keeps a small hash as a list it reads through.
local function tok_field(tok)
  if tok and tok ~= '-' and tok ~= '' then return 't:' .. tok end
end
local function is_index(f)
  local a, b = string.byte(f, 1, 2)
  return a == 116 and b == 58
end
-- A waiter's record goes, with its token's index if it has one (w: the
-- record's words).
local function record_del(id, w)
  local tf = w[9] == 'i' and tok_field(w[8])
  if tf then redis.call('HDEL', WI, id, tf) else redis.call('HDEL', WI, id) end
end

-- Every dead waiter at once (O(N): info and settings only), and every
-- index whose record is gone.
local function reap_waiters()
  local ws = redis.call('HGETALL', WI)
  local kept = {}
  for i = 1, #ws, 2 do
    if not is_index(ws[i]) then
      local w = words(ws[i + 1])
      if (tonumber(w[2]) or 0) < now then
        record_del(ws[i], w)
        redis.call('ZREM', W, ws[i])
      else
        kept[ws[i]] = true
      end
    end
  end
  for i = 1, #ws, 2 do
    if is_index(ws[i]) and not kept[ws[i + 1]] then redis.call('HDEL', WI, ws[i]) end
  end
end

-- A waiter's score in W: its arrival id, plus BF for a backfill one, so
-- the oldest of a class is the first of its score range (one
-- ZRANGEBYSCORE ... LIMIT 0 1).  Ids are Redis's clock in us (about
-- 1.8e15 now); BF = 2^52; both stay exact in a double (2^53) until 2112.
local BF = 4503599627370496
local function wscore(cls, id)
  if cls == '1' then return fmt((tonumber(id) or 0) + BF) end
  return id
end

-- The callers of the key a host's segment still holds or queues (rsv,
-- admitted there while Redis was away; rname: that segment's name), kept
-- as one holder h:R:RNAME of the host that counts as rsv holders (word 3
-- of its value: hcount), lapsing with the liveness unless a look
-- (enter.lua) or the heartbeat (beat.lua) of the host keeps it; 0 drops
-- it.  One field however many it counts, so that a look, which reads the
-- hash whole, costs the same with 1 or SLOTS kept.  (An earlier build
-- kept them as rsv holders h:r:RNAME:I, one each: those count as one
-- holder each, lapse unless their host keeps them, and a host's own go
-- when it writes or drops its field.)
local function reserve(rsv, rname, live, host)
  if not (rsv and rname and live) then return end
  local f = 'h:R:' .. rname
  local e = s[f]
  if rsv >= 1 then rsv = in_slots(rsv) else rsv = 0 end -- (NaN: 0)
  if rsv == 0 and not e then return end -- the common case: none kept
  if rsv > 0 then
    local head = '0 0 ' .. fmt(rsv) .. ' ' -- class, probe, count
    local since, lu, ld = now, 0, 0
    if e then
      local _
      _, since, lu, ld = hwords(e)
    end
    -- kept as it is while more than half its liveness is left: every
    -- look of the host's callers would otherwise write it
    if e and string.sub(e, 1, #head) == head and lu - now > live / 2 and
       ld - now > live / 2 then
      return
    end
    p(f, table.concat({'0', '0', fmt(rsv), fmt(since), fmt(now + live),
      fmt(now + live), fmt(live), fmt(live), host, '0', '-'}, ' '))
  else
    del(f)
  end
  local old = 'r:' .. rname .. ':' -- its own of the earlier form
  local hl = holders()
  for hi = 1, #hl do local id = hl[hi][1]
    if string.sub(id, 1, #old) == old then del('h:' .. id) end
  end
end

-- ---- scopes (libthrottle/shm/scope.c) -------------------------------------
-- A key's scopes are its prefixes at '/' (not a leading one), root first;
-- each is an ordinary key's state hash (its not-before, pause, cancel
-- generation, episode and probe, cap and rate), read here so that its
-- rules reach the keys beneath.  KEYS 5 is the key's own beneath hash
-- (the waiters and watchers of the keys below it, when it is itself a
-- scope); then two per scope: its state hash and its beneath hash.  A
-- beneath entry: field = the list its waiter or watcher sleeps on, value =
-- class ('w' for a watcher), arrival id, live_until, eligible (1: at its
-- last look its own key and every scope deeper than this one would let it
-- go, so this scope's pool's turn is its to take: hold_depth),
-- the scope's cancel generation at its arrival.  A holder's place in a
-- scope (its probe, or its place in a pool) is a holder field of the
-- scope's hash, h:KEY#FENCE, with the holder's own value: the scope's
-- reap and lease judge it as the key's do, and beat.lua refreshes it.
local KB
local COLD_HOLD = 1000 -- ms (scope.c THROTTLE__COLD_HOLD_NS)
-- The scopes, root first: {name, k, b, s, dirty, gone} (begin()).
local SC
local function sg(sc, f)
  local v = sc.s[f]
  if v == nil then return 0 end
  return tonumber(v) or 0
end
local function sp(sc, f, v)
  local str = type(v) == 'number' and fmt(v) or v
  if sc.s[f] == str and not sc.gone[f] then return end
  sc.s[f] = str
  sc.dirty[f] = true
  sc.gone[f] = nil
end
local function sdel(sc, f) sc.s[f] = nil; sc.dirty[f] = nil; sc.gone[f] = true end
local function szero(sc, f) if sc.s[f] ~= nil then sdel(sc, f) end end -- zero()
local function place_of(id) return NAME .. '#' .. id end
local function sc_nb(sc)
  local nb = sg(sc, 'nb')
  if nb > now and nb > now + limits() then nb = now + MAXD end
  return nb
end
local function is_pool(sc) return sg(sc, 'fixed_cap') ~= 0 or sg(sc, 'rate_n') ~= 0 end

-- Does a scope hold the key (scope.c throttle__scope_gate_locked)?
-- Returns 0 open, 1 held (and when time alone may open it, or nil), or 2:
-- a scope's episode wants one probe, and the next grant beneath is it.
local scope_held -- the last grant() stopped at a scope or a pool
local function scope_gate()
  local verdict = 0
  for si = 1, #SC do local sc = SC[si]
    if sg(sc, 'paused') == 1 then return 1, nil end
    local nb = sc_nb(sc)
    if nb > now then return 1, nb end
    if sg(sc, 'episode') == 1 then
      local pr = sc.s['probe'] or '0'
      local pv = pr ~= '0' and sc.s['h:' .. pr]
      if pv then
        -- a cold scope's first request holds the keys at most COLD_HOLD
        -- after its grant; then they go, its episode kept
        if sg(sc, 'answered') == 1 then return 1, nil end
        local hold_end = (tonumber(word(pv, 4)) or 0) + COLD_HOLD
        if hold_end > now then return 1, hold_end end
      else
        if pr ~= '0' then szero(sc, 'probe') end
        verdict = 2
      end
    end
  end
  return verdict, nil
end

-- The latest not-before of the scopes (0: none).
local function scope_nb()
  local m = 0
  for si = 1, #SC do local sc = SC[si]
    local nb = sc_nb(sc)
    if nb > m then m = nb end
  end
  return m
end

local function sc_places(sc)
  local n, bf = 0, 0
  for f, v in pairs(sc.s) do
    if string.sub(f, 1, 2) == 'h:' then
      n = n + 1
      if word(v, 1) == '1' then bf = bf + 1 end
    end
  end
  return n, bf
end

local function sc_beneath(sc)
  if not sc.bl then
    sc.bl = {}
    local a = redis.call('HGETALL', sc.b)
    for i = 1, #a, 2 do sc.bl[#sc.bl + 1] = {a[i], words(a[i + 1])} end
  end
  return sc.bl
end

-- An eligible waiter of another key beneath sc that goes before (cls,
-- id): live before backfill, then the older arrival.
local function someone_ahead(sc, cls, id)
  local me = tonumber(id)
  for _, e in ipairs(sc_beneath(sc)) do
    local w = e[2]
    if w[1] ~= 'w' and w[4] == '1' and (tonumber(w[3]) or 0) >= now and
       string.sub(e[1], 1, #QP) ~= QP and
       (w[1] < cls or (w[1] == cls and (tonumber(w[2]) or 0) < me)) then
      return true
    end
  end
  return false
end

-- Is the pool sc full for a waiter of class cls (scope.c pool_full): its
-- rate spent (and when time alone may allow it), its cap reached, or
-- backfill at its share?
local function pool_full(sc, cls)
  local rn = sg(sc, 'rate_n')
  if rn > 0 then
    local T = math.floor(sg(sc, 'rate_period') / rn)
    local tat = sg(sc, 'rate_tat')
    if tat - T * (rn - 1) > now then return true, tat - T * (rn - 1) end
  end
  local cap = sg(sc, 'fixed_cap')
  if cap > SLOTS then cap = SLOTS end
  if cap > 0 then
    local n, bf = sc_places(sc)
    if n >= cap then return true end
    if cls == '1' then
      local share = 1000
      if sg(sc, 'share_set') == 1 then share = math.min(sg(sc, 'share'), 1000) end
      local bf_cap = 0
      if share > 0 then bf_cap = math.max(1, math.floor(cap * share / 1000)) end
      if bf >= bf_cap then return true end
    end
  end
  return false
end

-- May a waiter (class cls, arrival id) take a place in every pool above
-- the key now (scope.c throttle__scope_pool_allows_locked)?  false and,
-- when a rate is what holds it, when time alone may allow it.
local function pool_allows(cls, id)
  for si = 1, #SC do local sc = SC[si]
    if is_pool(sc) then
      local full, ready = pool_full(sc, cls)
      if full then return false, ready end
      if someone_ahead(sc, cls, id) then return false end
    end
  end
  return true
end

-- The deepest scope (its index in SC, root 1) that holds a waiter of
-- class cls by itself (scope.c could_go): a pause, a not-before, a probe
-- out (a cold scope's first request within its hold), a pool that is full
-- (cap, backfill share, rate); 0 when none.  A waiter held by a scope
-- deeper than a pool does not hold that pool's turn (scope.c someone_ahead).
local function hold_depth(cls)
  for i = #SC, 1, -1 do
    local sc = SC[i]
    if sg(sc, 'paused') == 1 or sc_nb(sc) > now then return i end
    if sg(sc, 'episode') == 1 then
      local pv = (sc.s['probe'] or '0') ~= '0' and sc.s['h:' .. sc.s['probe']]
      if pv and (sg(sc, 'answered') == 1 or
                 (tonumber(word(pv, 4)) or 0) + COLD_HOLD > now) then
        return i
      end
    end
    if is_pool(sc) and pool_full(sc, cls) then return i end
  end
  return 0
end

-- id was just granted with holder value v: it takes its place in every
-- capped pool above and, when probe, becomes the probe of every scope in
-- an episode (scope.c throttle__scope_take_locked).  A pool with places
-- left wakes its other waiters: the next may go too.
local function scope_take(id, v, probe)
  local pl = place_of(id)
  for si = 1, #SC do local sc = SC[si]
    local probes = probe and sg(sc, 'episode') == 1 and (sc.s['probe'] or '0') == '0'
    if probes or is_pool(sc) then
      local rn = sg(sc, 'rate_n')
      if rn > 0 then
        local T = math.floor(sg(sc, 'rate_period') / rn)
        local tat = sg(sc, 'rate_tat')
        if tat < now then tat = now end
        sp(sc, 'rate_tat', tat + T)
        sc.wake = true -- the next may go when the rate allows
      end
      local cap = sg(sc, 'fixed_cap')
      if probes or cap ~= 0 then
        local w = words(v)
        if probes then w[2] = '1' else w[2] = '0' end
        sp(sc, 'h:' .. pl, table.concat(w, ' '))
        if probes then
          sp(sc, 'probe', pl)
          sp(sc, 'probes', sg(sc, 'probes') + 1)
        end
        if cap ~= 0 and sc_places(sc) < cap then sc.wake = true end
      end
    end
  end
end

-- The report of admission id (outcome; pub_at: the length of the name
-- its back-off went to): its places go, the probe's answer ends the
-- scope's episode unless the scope itself was refused, and the keys
-- beneath look again (scope.c throttle__scope_report_locked).
local function scope_leave(id, outcome, pub_at)
  local pl = place_of(id)
  local answer = outcome >= 0 and outcome <= 4
  for si = 1, #SC do local sc = SC[si]
    -- any answer from beneath marks an existing scope answered for good
    if answer and next(sc.s) and sg(sc, 'answered') == 0 then sp(sc, 'answered', 1) end
    if sc.s['h:' .. pl] then
      sdel(sc, 'h:' .. pl)
      sc.wake = true
    end
    if sc.s['probe'] == pl then
      szero(sc, 'probe')
      local here = outcome >= 1 and outcome <= 3 and pub_at == #sc.name
      if answer and not here and sc_nb(sc) <= now then szero(sc, 'episode') end
      sc.wake = true
    end
  end
end

-- A back-off published on the scope of length pub_at: true, or false
-- when there is no such scope here (the caller publishes on the key).
local function scope_publish(ms, pid, pub_at)
  for si = 1, #SC do local sc = SC[si]
    if #sc.name == pub_at then
      limits()
      if ms > MAXS then ms = MAXS end
      if now + ms > sc_nb(sc) then sp(sc, 'nb', now + ms) end
      sp(sc, 'episode', 1)
      sp(sc, 'publishes', sg(sc, 'publishes') + 1)
      sp(sc, 'last_delay', ms)
      sp(sc, 'last_pid', pid)
      return true
    end
  end
  return false
end

-- The cold-scope rule (scope.c throttle__scope_enter_locked): a scope a
-- 429 or a 503 of this caller would be published on (l429, l503: the
-- lengths of those names) that no answer has come back to yet opens an
-- episode with no not-before, so that ONE first admission beneath goes as
-- its probe and the others follow its answer.
local function scope_cold(l429, l503)
  for si = 1, #SC do local sc = SC[si]
    if (#sc.name == l429 or #sc.name == l503) and sg(sc, 'answered') == 0 and
       sg(sc, 'episode') == 0 then
      sp(sc, 'episode', 1)
    end
  end
end

-- Waiters and watchers of this key in the beneath hash of every scope:
-- registered (or refreshed, keeping the cancel generation of their
-- arrival), marked, dropped, or canceled by a scope since they came.
-- Eligible at the scope of index i (its pool's turn is the waiter's to
-- take): held by nothing deeper than that scope (depth, hold_depth()), its
-- own key letting it go (depth nil: held by its key, eligible nowhere).
local function elig_at(i, depth)
  return (depth ~= nil and depth <= i) and '1' or '0'
end
local function beneath_add(id, cls, live_until, depth)
  for i = 1, #SC do local sc = SC[i]
    local f = QP .. id
    local old = redis.call('HGET', sc.b, f)
    local cg = old and word(old, 5) or fmt(sg(sc, 'cancel_gen'))
    redis.call('HSET', sc.b, f, table.concat({cls, id, fmt(live_until),
      elig_at(i, depth), cg}, ' '))
    sc.touch_b = true
  end
end
local function beneath_del(id)
  for si = 1, #SC do local sc = SC[si] redis.call('HDEL', sc.b, QP .. id) end
end
-- A waiter goes: its record and its token's index (w: the record's
-- words), its place in the queue and in the scopes' beneath hashes.
local function waiter_del(id, w)
  record_del(id, w)
  redis.call('ZREM', W, id)
  beneath_del(id)
end
local function beneath_elig(id, depth)
  for i = 1, #SC do local sc = SC[i]
    local old = redis.call('HGET', sc.b, QP .. id)
    if old then
      local w = words(old)
      local e = elig_at(i, depth)
      if w[4] ~= e then
        w[4] = e
        redis.call('HSET', sc.b, QP .. id, table.concat(w, ' '))
      end
    end
  end
end
local function scope_canceled(id)
  for si = 1, #SC do local sc = SC[si]
    local e = redis.call('HGET', sc.b, QP .. id)
    if e and (tonumber(word(e, 5)) or 0) < sg(sc, 'cancel_gen') then return true end
  end
  return false
end

-- Push every list of a beneath hash (dropping entries whose owner is gone).
local function wake_list(b)
  local a = redis.call('HGETALL', b)
  for i = 1, #a, 2 do
    if (tonumber(word(a[i + 1], 3)) or 0) < now then
      redis.call('HDEL', b, a[i])
    else
      redis.call('RPUSH', a[i], 'w')
      redis.call('PEXPIRE', a[i], 60000)
    end
  end
end
-- This key as a scope: its resume, cancel, clear, back-off or setting
-- reaches the keys beneath.
local function wake_beneath() wake_list(KB) end

-- The settings an operator made on a key or a scope, as enter's reply
-- mirrors them (enter.lua) and as store() keeps them.
local SETTINGS = {'fixed_cap', 'auto_max', 'paused', 'rate_n', 'rate_period',
  'share_set', 'share'}
local UNSET = '0 0 0 0 0 0 0' -- most keys and scopes set none of them
local function settings_of(h)
  -- (SETTINGS, spelled out: the common case in a few instructions)
  if h.fixed_cap == nil and h.auto_max == nil and h.paused == nil and
     h.rate_n == nil and h.rate_period == nil and h.share_set == nil and
     h.share == nil then
    return UNSET
  end
  local v = {}
  for i = 1, #SETTINGS do local f = SETTINGS[i]
    local x = h[f]
    v[i] = x == nil and '0' or fmt(tonumber(x) or 0)
  end
  return table.concat(v, ' ')
end
-- Settings an operator made keep their hash for good (PERSIST, exp -1),
-- as a segment never evicts a record with settings (gate_rec.c
-- rec_holds): a cap or a pause set through Redis must not lapse with a
-- day without traffic.  Unset, the hash has the idle TTL again.
local function kept(h) return settings_of(h) ~= UNSET end

-- What the caller's host keeps of the settings of the key and its scopes
-- (enter's ARGV 17: each as settings_of() tells them, '-' for none, ';'
-- between, the key first, then the scopes root first), put back in each
-- of those hashes that is new at this call, which only a Redis that lost
-- it has: with settings a hash has no idle TTL (kept()), and a host sends
-- them only for names it used within the TTL (redis_ops.c settings_kept).
-- Bounded as a setting made here is (the argument is input too, I8).
local HEAL = '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$'
local function heal_settings(v)
  if not v or v == '' then return end
  local any = K_NEW
  for si = 1, #SC do any = any or SC[si].new end
  if not any then return end
  local i = 0
  for part in string.gmatch(v, '[^;]+') do
    local sc = SC[i]
    local put
    if i == 0 and K_NEW then
      put = p
    elseif sc and sc.new then
      put = function(f, x) sp(sc, f, x) end
    end
    local c, m, pz, rn, rp, ss, sh = string.match(part, HEAL)
    if put and c then
      c, m, rn, rp = tonumber(c), tonumber(m), tonumber(rn), tonumber(rp)
      if c >= 1 then put('fixed_cap', math.min(c, SLOTS))
      elseif m >= 1 then put('auto_max', math.min(m, SLOTS)) end
      if pz == '1' then put('paused', 1) end
      if rn >= 1 and rp >= 1 and rp <= 31622400000 then
        put('rate_n', rn); put('rate_period', rp)
      end
      if ss == '1' then put('share_set', 1); put('share', math.min(tonumber(sh), 1000)) end
    end
    i = i + 1
  end
end

-- Store the scopes that changed (called by store()); each gets the idle
-- TTL past its not-before and its places' leases, as a key does (none
-- when it keeps settings: kept()).
local function scope_store()
  for si = 1, #SC do local sc = SC[si]
    if next(sc.dirty) or next(sc.gone) then
      sp(sc, 'key', sc.name)
      sp(sc, 'last_use', now)
      local last = now
      if sg(sc, 'nb') > last then last = sg(sc, 'nb') end
      for f, v in pairs(sc.s) do
        if string.sub(f, 1, 2) == 'h:' then
          local lu = tonumber(word(v, 6)) or 0
          if lu > last then last = lu end
        end
      end
      local keep = kept(sc.s)
      sp(sc, 'exp', keep and -1 or now + TTL + (last - now))
      local args = {}
      for f, _ in pairs(sc.dirty) do args[#args + 1] = f; args[#args + 1] = sc.s[f] end
      if #args > 0 then redis.call('HSET', sc.k, unpack(args)) end
      local dels = {}
      for f, _ in pairs(sc.gone) do dels[#dels + 1] = f end
      if #dels > 0 then redis.call('HDEL', sc.k, unpack(dels)) end
      if keep then
        redis.call('PERSIST', sc.k)
      else
        redis.call('PEXPIRE', sc.k, TTL + (last - now))
      end
      sc.touch_b = true
    end
    if sc.touch_b then redis.call('PEXPIRE', sc.b, TTL) end
    if sc.wake then wake_list(sc.b) end
  end
end

-- A caller that arrives at an empty queue is tried before it is
-- registered (no waiter records to write and delete when it is admitted
-- at once): {id, words} or nil.
local pending
-- true while the queue is known to be empty (the uncontended path saw
-- ZCARD 0 and adds nobody): oldest() then asks Redis nothing
local queue_empty
-- the keys store() gives their TTL
local touched

-- Oldest waiting id of class cls (waiter value: cls live_until lease
-- liveness host pid state token).  A head that is gone, canceled or dead is
-- taken off the queue on the way (a canceled one keeps its record: its
-- next look is told).
local function oldest(cls)
  if pending then
    if pending[2][1] == cls then return pending[1], pending[2] end
    return nil
  end
  if queue_empty then return nil end
  local lo, hi = '-inf', '(' .. fmt(BF)
  if cls == '1' then lo, hi = fmt(BF), '+inf' end
  while true do
    local id = redis.call('ZRANGEBYSCORE', W, lo, hi, 'LIMIT', 0, 1)[1]
    if not id then return nil end
    local v = redis.call('HGET', WI, id)
    local w = v and words(v)
    -- a class no script writes (a record that is not ours) is dropped:
    -- scored again, it would be read again here, forever
    local alive = w and w[7] == 'w' and (tonumber(w[2]) or 0) >= now and
      (w[1] == '0' or w[1] == '1')
    if alive and w[1] == cls then return id, w end
    if alive then
      -- scored as the other class (a record of an earlier version)
      redis.call('ZADD', W, wscore(w[1], id), id)
    elseif w and w[7] ~= 'c' then
      waiter_del(id, w)
    else
      redis.call('ZREM', W, id)
    end
  end
end

-- Grant as many waiters as the gate allows now; returns the next instant
-- time alone could open it (nil if none).  Granted waiters other than
-- `self` are woken through their own lists.
local function grant(self)
  scope_held = false
  if g('paused') == 1 then return nil end
  local nb = clamp_nb()
  if nb > now then return nb end
  if not pending and redis.call('ZCARD', W) == 0 then return nil end
  local sv, snext = scope_gate()
  if sv == 1 then scope_held = true; return snext end
  local probe = s['probe'] or '0'
  if probe ~= '0' and not hget(probe) then
    zero('probe'); probe = '0'
  end
  local cap = cap_of()
  local nh, bf = 0, 0
  local hl = holders()
  for hi = 1, #hl do local hv = hl[hi]
    nh = nh + hcount(hv)
    if hparse(hv)[3] == '1' then bf = bf + 1 end
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
    local pok, pnext = pool_allows(w[1], id)
    if not pok then
      scope_held = true
      beneath_elig(id, hold_depth(w[1]))
      return pnext
    end
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
      fmt(now + live), fmt(now + lease), w[3], w[4], w[5], w[6],
      w[8] or '-'}, ' '))
    local e = HL[#HL] -- (hl_set) what hparse() would read
    e[3], e[4], e[5], e[6] = w[1], now, now + live, now + lease
    if pending and id == pending[1] then
      pending = nil
    else
      waiter_del(id, w)
    end
    if id ~= self then push(id) end
    if #SC > 0 then
      scope_take(id, s['h:' .. id], sv == 2)
      if sv == 2 then return nil end -- the scope's probe is out: one only
    end
  end
  return nil
end

local function publish(ms, pid)
  limits()
  if ms > MAXS then ms = MAXS end
  local want = now + ms
  if want > clamp_nb() then p('nb', want) end
  p('episode', 1)
  -- a back-off is an answer, whoever publishes it: as a scope, this key's
  -- probe then holds the keys beneath until its own answer (gate_grant.c)
  if g('answered') ~= 1 then p('answered', 1) end
  inc('publishes')
  p('last_delay', ms)
  p('last_pid', pid)
end

-- Store what changed and give every key of the operation its TTL: an idle
-- key disappears (TTL past its not-before and past any lease).
local function store()
  p('last_use', now)
  p('key', NAME)
  if K_NEW then p('born', now_us) end
  -- idle TTL past the not-before and past every holder's lease
  local last = now
  local nb = g('nb')
  if nb > last then last = nb end
  local hl = holders()
  for hi = 1, #hl do local hv = hl[hi]
    local lu = hparse(hv)[6]
    if lu > last then last = lu end
  end
  local ttl = TTL + (last - now)
  -- The state hash's expiry is renewed when it moved by a tenth of the
  -- idle TTL (each call into Lua costs as much as a round trip's work);
  -- its field exp goes with the others' write.  With settings it has
  -- none (kept()): exp -1, made so once.
  local persist = false
  if touched[K] and kept(s) then
    touched[K] = nil
    if g('exp') ~= -1 then p('exp', -1); persist = true end
  elseif touched[K] and math.abs(now + ttl - g('exp')) < TTL / 10 then
    touched[K] = nil
  elseif touched[K] then
    p('exp', now + ttl)
  end
  local args = {}
  for f, _ in pairs(dirty) do args[#args + 1] = f; args[#args + 1] = s[f] end
  if #args > 0 then redis.call('HSET', K, unpack(args)) end
  local dels = {}
  for f, _ in pairs(gone) do dels[#dels + 1] = f end
  if #dels > 0 then redis.call('HDEL', K, unpack(dels)) end
  if persist then redis.call('PERSIST', K) end
  for k, _ in pairs(touched) do redis.call('PEXPIRE', k, ttl) end
  scope_store()
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

-- A stored integer in lo..hi, or nil (absent counts as 0): of field f,
-- or (in_range_v) of a value as stored.
local function in_range_v(v, lo, hi)
  if v == nil then v = 0 else v = SMALL[v] or tonumber(v) end
  if v == nil or not (v >= lo and v <= hi) then return nil end
  if v % 1 == 0 then return v end -- (math.floor's answer, without a call)
  return math.floor(v)
end
local function in_range(f, lo, hi) return in_range_v(s[f], lo, hi) end

-- Every learned field, bounded before use (I8: the hash is input too, as
-- the segment is for gate_learn.c's throttle__learn_bound_locked): a value
-- out of range resets as the design's table says, the cap never exceeds
-- the bound, R never exceeds 7 days (so the price of a raise stays a
-- finite number of ms), the learned time never lies ahead.
local function learned_cap_v(auto_cap, auto_max) -- values as stored
  local max = in_range_v(auto_max, 0, SLOTS) or 0
  local bound = max >= 1 and max or SLOTS
  local cap = in_range_v(auto_cap, 1, SLOTS) or 1
  if cap > bound then cap = bound end
  return cap, bound, max
end
-- the cap, its bound, auto_max
local function learned_cap() return learned_cap_v(s['auto_cap'], s['auto_max']) end
local function learned()
  local L = {}
  L.cap, L.bound, L.max = learned_cap()
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

local function pz(f, v) if v ~= 0 then p(f, v) else zero(f) end end
local function store_learned(L)
  pz('auto_cap', L.cap); pz('auto_good', L.good); pz('auto_fail_cap', L.fail)
  pz('auto_fails', L.fails); pz('auto_max', L.max); pz('auto_ra_ms', L.ra)
  pz('auto_work_us', L.work); pz('auto_learned', L.learned)
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
-- The parent scope's state hash (begin()): the last scope passed (root
-- first), if it is the key's parent; nil for a key without one.
local PK

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
-- its holder value (for its hold: since when), the Retry-After it
-- reported (0 none).  Only while no fixed cap is set.
local function learn(outcome, concurrent, others, hv, ra_ms)
  if g('fixed_cap') ~= 0 then return end
  -- (the common case, a success below the cap, decided before the rest
  -- of the learned state is read)
  if outcome ~= 1 and (outcome ~= 0 or concurrent < learned_cap()) then
    return
  end
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
    local mx = limits() < MAX_RA_MS and MAXD or MAX_RA_MS
    L.ra = ra < mx and ra or mx
    L.work = 0
    L.learned = now > 0 and now or 1
    store_learned(L)
    seed_record(L)
    return
  end
  -- Only a success at the cap says anything about a larger one.
  if outcome ~= 0 or concurrent < L.cap then return end
  local since = tonumber(word(hv, 4)) or now
  if not (since >= 0 and since <= now) then since = now end
  L.work = L.work + math.floor((now - since) * 1000 / L.cap)
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

-- ---- enter's reply ---------------------------------------------------------
-- The settings of the key and of its scopes (enter.lua), one string:
-- the key's, then each scope's, root first, ';' before each.
local function settings()
  local v = ';' .. settings_of(s)
  for i = 1, #SC do v = v .. ';' .. settings_of(SC[i].s) end
  return v
end
-- 1 when admission id is the probe of its key's episode or of a scope's
-- (gate.c: throttle_ticket_is_probe())
local function probe_of(id)
  if s['probe'] == id then return 1 end
  for si = 1, #SC do local sc = SC[si]
    local pr = sc.s['probe']
    if pr ~= nil and pr == place_of(id) then return 1 end
  end
  return 0
end
-- enter's reply: one bulk string, 'enter STATUS ID PROBE HINT' and the
-- settings (settings()).  A string, not an array: Redis turns a table
-- into its reply by looking for half a dozen named fields first, which
-- costs an uncontended admission more than its writes.  hint is whole
-- ms, toward zero (as a number in an array reply was).
local function answer(st, id, probe, hint)
  if hint % 1 ~= 0 then
    if hint < 0 then hint = math.ceil(hint) else hint = math.floor(hint) end
  end
  return 'enter ' .. st .. ' ' .. id .. ' ' .. probe .. ' ' .. fmt(hint) ..
    settings()
end

-- ---- one call's state -----------------------------------------------------
-- now and now_us from TIME's reply
local function set_clock(t)
  -- (TIME answers digits: arithmetic converts each once, where tonumber
  -- would twice; both are integers below 2^53, so each step is exact)
  now_us = t[1] * 1000000 + t[2]
  now = (now_us - now_us % 1000) / 1000
end

-- Every per-call local above, set anew: Redis's clock, the key names and
-- common arguments, the key's state hash and holder list and its scopes'
-- hashes (read whole), the dead places of the scopes reaped, and a key
-- new to a scope seeded.  pre: what the lean path read before it left the
-- call to the whole script (below), used rather than read again: TIME's
-- reply (t), the key's hash (k) and the scopes' (pre[1] the root's ...),
-- each as its command answered.
local NO_PRE = {}
local function begin(KEYS, ARGV, pre)
  pre = pre or NO_PRE
  set_clock(pre.t or redis.call('TIME'))
  K, W, WI, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  QP, TTL = ARGV[1], tonumber(ARGV[2])
  MAXD, MAXS, LIMITS = nil, nil, ARGV[3]
  NAME = ARGV[4]
  -- the hash and its holder list, in one walk of the reply
  s, dirty, gone, HL = {}, {}, {}, {}
  local a, byte = pre.k or redis.call('HGETALL', K), string.byte
  for i = 1, #a, 2 do
    local f, v = a[i], a[i + 1]
    s[f] = v
    local b1, b2 = byte(f, 1, 2) -- is_h(f), inline: once per field
    if b1 == 104 and b2 == 58 then HL[#HL + 1] = {string.sub(f, 3), v, false, 0, 0, 0} end
  end
  K_NEW = next(s) == nil
  scope_held, pending, queue_empty, touched = false, nil, false, {[K] = true}

  -- The scopes' hashes.  Places of dead holders (liveness or lease
  -- lapsed) go, as reap() does for a key's own holders; a probe's place
  -- gone lets the next probe go.  The dead are listed first and dropped
  -- after the walk: a script that failed on a table changed while it is
  -- walked ('invalid key to next') would fail the same way on every
  -- later call.
  KB, SC = KEYS[5], {}
  local at, j = 2, 6
  while KEYS[j + 1] do
    local pos = string.find(NAME, '/', at, true)
    if not pos then break end
    local sc = {name = string.sub(NAME, 1, pos - 1), k = KEYS[j],
                b = KEYS[j + 1], s = {}, dirty = {}, gone = {}}
    a = pre[#SC + 1] or redis.call('HGETALL', sc.k)
    sc.new = #a == 0 -- (settings a host kept go back: heal_settings)
    local dead = {}
    local ss = sc.s
    for i = 1, #a, 2 do
      local f, v = a[i], a[i + 1]
      ss[f] = v
      local b1, b2 = byte(f, 1, 2)
      if b1 == 104 and b2 == 58 and ((tonumber(word(v, 5)) or 0) < now or
                                     (tonumber(word(v, 6)) or 0) < now) then
        dead[#dead + 1] = f
      end
    end
    for di = 1, #dead do
      local f = dead[di]
      sdel(sc, f)
      sp(sc, 'reclaims', sg(sc, 'reclaims') + 1)
      if sc.s['probe'] == string.sub(f, 3) then szero(sc, 'probe') end
      sc.wake = true
    end
    SC[#SC + 1] = sc
    at = pos + 1
    j = j + 2
  end

  -- the last scope is the key's parent when no '/' follows it
  PK = nil
  if #SC > 0 and not string.find(NAME, '/', at, true) then PK = SC[#SC].k end

  -- A key new to a scope: seeded before the script runs (stored with the
  -- rest by store(); a script that stores nothing creates no key).  Its
  -- own work at the cap counts from now; every copied field is bounded.
  if PK ~= nil and PK ~= K and K_NEW then
    local v = redis.call('HMGET', PK, 'seed_cap', 'seed_good', 'seed_fail_cap',
      'seed_ra_ms')
    if v[1] then
      s['auto_cap'], s['auto_good'] = v[1], v[2] or '0'
      s['auto_fail_cap'], s['auto_ra_ms'] = v[3] or '0', v[4] or '0'
      local L = learned()
      L.learned = now > 0 and now or 1
      -- read for learned() only: the hash has none of them yet
      s['auto_cap'], s['auto_good'], s['auto_fail_cap'], s['auto_ra_ms'] = nil, nil, nil, nil
      store_learned(L)
    end
  end
end

-- ---- the lean path --------------------------------------------------------
-- The common cases decided from the replies alone, with no table but
-- theirs and the write's: an arrival at an empty queue admitted at once
-- (lean_enter), an OK report of a holder with nobody queued (lean_leave),
-- for a key and scopes that hold nothing of an episode, a pause, a pool,
-- a rate, a share or a host's reservations (a key's cap, fixed or
-- learned, and its auto:MAX are read).  Each makes exactly the writes and
-- the reply the whole script makes in that case.  Any other state goes to
-- the whole script before anything is written: nil, and what was read
-- (begin()'s pre), so that nothing is read twice.  Most of a fleet's calls
-- are these, and the whole script's tables and helper calls cost several
-- times its commands (bench_redis: the server-cost ratios).
-- What the lean path makes of a field of a key's or a scope's hash, by
-- name (one lookup a field): F_SKIP read by neither path here, F_OUT one
-- only the whole script handles (a probe, and the settings of a pause, a
-- rate or a share); a name not here is a holder's (h:...) or unknown.
local F_SKIP, F_OUT, F_SEQ, F_ADM, F_EXP, F_USED, F_KEY, F_NB, F_AUTO,
  F_FIXED, F_MAX, F_EPISODE, F_ANSWERED = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
local LEAN_F = {seq = F_SEQ, admitted = F_ADM, exp = F_EXP, last_use = F_USED,
  key = F_KEY, nb = F_NB, auto_cap = F_AUTO, fixed_cap = F_FIXED,
  auto_max = F_MAX, episode = F_EPISODE, answered = F_ANSWERED, probe = F_OUT,
  born = F_SKIP, auto_good = F_SKIP, probes = F_SKIP, reclaims = F_SKIP,
  publishes = F_SKIP, last_delay = F_SKIP, last_pid = F_SKIP}
for i = 1, #SETTINGS do
  local f = SETTINGS[i]
  if not LEAN_F[f] then LEAN_F[f] = F_OUT end
end
-- (tonumber(v) or 0) == 1, the usual values told without strtod
local function is1(v) return n0(v) == 1 end

-- A number an argument gives, for the arguments that repeat call after
-- call (the idle TTL, a lease, a liveness, the lengths of the cold-scope
-- rule): tonumber(v) or false, parsed once and then looked up; and true
-- when v is a whole number of ms that a holder record may hold as given:
-- 1 to 13 digits, no leading zero (so it is spelled as joining the
-- number to a string spells it, and a sum of it and a time is below
-- 2^53, which fmt() prints with '%d').  A cache of a function of its
-- argument only, not a call's state: it holds at most ARGN_MAX strings,
-- then starts again.  Only a library kept between calls keeps it (KEPT:
-- a Functions library, loaded once; a script sent by EVAL runs this file
-- at each call, where a cache would cost more than it saves).
local KEPT = redis.register_function ~= nil
local ARGN, ARGOK, argn_n, ARGN_MAX = {}, {}, 0, 64
local function ms_digits(v)
  return #v <= 13 and string.find(v, '^%d+$') ~= nil and
    (string.byte(v, 1) ~= 48 or v == '0')
end
local function argn(v)
  if v == nil then return false, false end
  if not KEPT then return tonumber(v) or false, ms_digits(v) end
  local x = ARGN[v]
  if x == nil then
    if argn_n >= ARGN_MAX then ARGN, ARGOK, argn_n = {}, {}, 0 end
    x = tonumber(v) or false
    ARGN[v], ARGOK[v] = x, ms_digits(v)
    argn_n = argn_n + 1
  end
  return x, ARGOK[v]
end

-- What the lean path read, for the whole script when it leaves the call
-- to it (begin()'s pre): one table, cleared in each call's first step.
local PRE = {t = false, k = false, n = 0}
local function lean_now()
  local pre = PRE
  for i = 1, pre.n do pre[i] = nil end
  pre.n, pre.k = 0, false
  local t = redis.call('TIME')
  pre.t = t
  set_clock(t)
  return pre
end

-- The scopes' hashes read into pre (root first, as begin() walks them);
-- their number, or false when one holds a place, a probe or a setting;
-- for enter, a not-before or an episode, or when the cold-scope rule
-- (scope_cold: the lengths l429 and l503) or settings a host kept (heal:
-- heal_settings) would write; for leave, when no answer reached it yet
-- (scope_leave marks it).
local function lean_scopes(KEYS, name, pre, enter, l429, l503, heal)
  local at, j, n = 2, 6, 0
  while KEYS[j + 1] do
    local pos = string.find(name, '/', at, true)
    if not pos then break end
    local a = redis.call('HGETALL', KEYS[j])
    n = n + 1
    pre[n], pre.n = a, n
    local cold = pos - 1 == l429 or pos - 1 == l503
    if #a == 0 then
      if enter and (heal or cold) then return false end
    else
      local answered, episode = false, false
      for i = 1, #a, 2 do
        local f = a[i]
        local k = LEAN_F[f]
        if k == nil then
          if is_h(f) then return false end
        elseif k == F_ANSWERED then answered = n0(a[i + 1]) ~= 0
        elseif k == F_EPISODE then episode = is1(a[i + 1])
        elseif k == F_OUT or k == F_FIXED or k == F_MAX then return false
        elseif k == F_NB and enter and (tonumber(a[i + 1]) or 0) > now then
          return false
        end
      end
      if enter then
        if episode or (cold and not answered) then return false end
      elseif not answered then
        return false
      end
    end
    at = pos + 1
    j = j + 2
  end
  return n
end

-- What store() writes of a key that keeps its settings or its idle TTL,
-- after the fields the caller writes (w, from w[n + 1]): last_use, key,
-- exp; returns the settings (as settings_of() tells them), the length of
-- w, and PERSIST's or PEXPIRE's want ('persist', a ttl, or nil), sent
-- after the HSET (lean_expire).  used, key, exp: the hash's last_use, key
-- and exp as read; set: its settings (a table for settings_of(), nil when
-- none); last: the latest lease or not-before; nu: fmt(now).
local function lean_store(w, n, used, key, name, exp, set, last, TTL, nu)
  local ks = set and settings_of(set) or UNSET
  if used ~= nu then w[n + 1], w[n + 2], n = 'last_use', nu, n + 2 end
  if key ~= name then w[n + 1], w[n + 2], n = 'key', name, n + 2 end
  local ttl = TTL + (last - now)
  if ks ~= UNSET then
    if exp ~= -1 then
      w[n + 1], w[n + 2] = 'exp', '-1'
      return ks, n + 2, 'persist'
    end
  elseif not (math.abs(now + ttl - exp) < TTL / 10) then
    w[n + 1], w[n + 2] = 'exp', fmt(now + ttl)
    return ks, n + 2, ttl
  end
  return ks, n, nil
end
local function lean_expire(K, want)
  if want == 'persist' then
    redis.call('PERSIST', K)
  elseif want then
    redis.call('PEXPIRE', K, want)
  end
end

-- enter's reply's settings of the scopes when none has any (settings():
-- ';' and UNSET for each), by their number
local PARTS = {[0] = ''}
local function parts_of(n)
  local v = PARTS[n]
  if not v then
    v = string.rep(';' .. UNSET, n)
    PARTS[n] = v
  end
  return v
end

-- The writes of lean_enter and lean_leave, one table each made once:
-- each call fills it from the start and sends what it filled
-- (unpack(w, 1, n)).
local LW = {'seq', false, 'admitted', false, false, false, false, false,
  false, false, false, false}
local LL = {false, false, false, false, false, false}
-- enter.lua's uncontended admission: its reply, or nil and pre.
local function lean_enter(KEYS, ARGV)
  local pre = lean_now()
  local cls = ARGV[6]
  local lease, lease_ok = argn(ARGV[7])
  local live, live_ok = argn(ARGV[8])
  local rsv = ARGV[15] ~= '0' and tonumber(ARGV[15] or '')
  if ARGV[5] ~= '0' or (cls ~= '0' and cls ~= '1') or not lease_ok or
     not live_ok or ARGV[10] == nil or (rsv and not (rsv <= 0)) or
     redis.call('ZCARD', KEYS[2]) ~= 0 then -- (a look beside waiters: no walk)
    return nil, pre
  end
  local K = KEYS[1]
  local a = redis.call('HGETALL', K)
  pre.k = a
  if #a == 0 then return nil, pre end -- new: born, seeded, healed
  local seq, adm, exp, nb, fixed, auto, max = 0, 0, 0, 0, 0, 0, 0
  local used, key, set
  local nh, last = 0, now
  for i = 1, #a, 2 do
    local f = a[i]
    local k = LEAN_F[f]
    if k == F_SKIP then -- (most fields are one of these)
    elseif k == F_SEQ then seq = tonumber(a[i + 1]) or 0
    elseif k == F_ADM then adm = n0(a[i + 1])
    elseif k == F_EXP then exp = tonumber(a[i + 1]) or 0
    elseif k == F_USED then used = a[i + 1]
    elseif k == F_KEY then key = a[i + 1]
    elseif k == F_AUTO then auto = n0(a[i + 1])
    elseif k == F_NB then nb = tonumber(a[i + 1]) or 0
    elseif k == F_FIXED or k == F_MAX then
      set = set or {}
      set[f] = a[i + 1]
      if k == F_FIXED then fixed = n0(a[i + 1]) else max = n0(a[i + 1]) end
    elseif k == F_OUT or (k == F_EPISODE and is1(a[i + 1])) then
      return nil, pre
    elseif k == nil and is_h(f) then
      if string.byte(f, 3) ~= 82 then
        nh = nh + 1
      elseif string.sub(f, 5) == ARGV[16] then -- its host's own (reserve)
        return nil, pre
      else -- another host's reservations: as many holders as they count
        nh = nh + hcount_v(a[i + 1])
      end
      local _, _, _, lu = hwords(a[i + 1])
      if lu > last then last = lu end
    end
  end
  if nb > now then return nil, pre end
  local n = lean_scopes(KEYS, ARGV[4], pre, true, argn(ARGV[12]),
    argn(ARGV[13]), (ARGV[17] or '') ~= '')
  if not n or nh >= cap_from(fixed, auto, max) then return nil, pre end
  -- fence(), grant() and store() as the whole script runs them here (the
  -- numbers fmt() would print with '%d' printed so, two at once)
  if seq < now_us then seq = now_us end
  local id, snow = fmt(seq + 1), string.format('%d', now)
  if now + lease > last then last = now + lease end
  local w = LW
  w[2], w[4], w[5] = id, NSTR[adm + 1] or fmt(adm + 1), 'h:' .. id
  w[6] = cls .. ' 0 ' .. (NSTR[nh + 1] or fmt(nh + 1)) .. ' ' .. snow .. ' ' ..
    string.format('%d %d', now + live, now + lease) .. ' ' .. ARGV[7] .. ' ' ..
    ARGV[8] .. ' ' .. ARGV[9] .. ' ' .. ARGV[10] .. ' ' .. (ARGV[14] or '-')
  local ks, nw, want = lean_store(w, 6, used, key, ARGV[4], exp, set, last,
    argn(ARGV[2]), snow)
  redis.call('HSET', K, unpack(w, 1, nw))
  lean_expire(K, want)
  return 'enter 0 ' .. id .. ' 0 0;' .. ks .. parts_of(n) -- answer()
end

-- leave.lua's OK report of a holder with nobody queued that teaches the
-- learned cap nothing: its reply, or nil and pre.
local function lean_leave(KEYS, ARGV)
  local pre = lean_now()
  local id = ARGV[5]
  if (SMALL[ARGV[6]] or tonumber(ARGV[6])) ~= 0 or id == nil or id == '-' or
     ARGV[9] == 'pub' or ARGV[9] == 'heal' or
     redis.call('ZCARD', KEYS[2]) ~= 0 then
    return nil, pre
  end
  local K = KEYS[1]
  local a = redis.call('HGETALL', K)
  pre.k = a
  local hf = 'h:' .. id
  local mine, exp, nb, fixed, acap, amax = nil, 0, 0, 0, nil, nil
  local used, key, set
  local last = now
  for i = 1, #a, 2 do
    local f = a[i]
    local k = LEAN_F[f]
    if k == F_SKIP or k == F_SEQ or k == F_ADM or k == F_EPISODE or
       k == F_ANSWERED then -- (read by neither path here)
    elseif k == F_EXP then exp = tonumber(a[i + 1]) or 0
    elseif k == F_USED then used = a[i + 1]
    elseif k == F_KEY then key = a[i + 1]
    elseif k == F_NB then nb = tonumber(a[i + 1]) or 0
    elseif k == F_AUTO then acap = a[i + 1]
    elseif f == 'probe' then return nil, pre
    elseif k ~= nil then -- a setting: kept() reads them all
      set = set or {}
      set[f] = a[i + 1]
      if k == F_FIXED then fixed = n0(a[i + 1])
      elseif k == F_MAX then amax = a[i + 1] end
    elseif f == hf then
      mine = a[i + 1]
    elseif is_h(f) then
      local _, _, _, lu = hwords(a[i + 1])
      if lu > last then last = lu end
    end
  end
  if not mine then return nil, pre end
  if fixed == 0 then -- learn(): a success below the cap teaches nothing
    local conc = n0(word(mine, 3))
    if not (conc >= 0 and conc <= SLOTS) then conc = 0 end
    if conc >= learned_cap_v(acap, amax) then return nil, pre end
  end
  if not lean_scopes(KEYS, ARGV[4], pre, false) then return nil, pre end
  if nb > last then last = nb end
  local w = LL
  local _, nw, want = lean_store(w, 0, used, key, ARGV[4], exp, set, last,
    argn(ARGV[2]), string.format('%d', now))
  if nw > 0 then redis.call('HSET', K, unpack(w, 1, nw)) end
  redis.call('HDEL', K, hf)
  lean_expire(K, want)
  return 'leave 0'
end
