package store

// Lua scripts of the Redis store. Each state transition is one script, run
// atomically by Redis. They mirror core.go function by function; keep the two
// in step (the same tests run against both stores, and TestStoresAgree
// compares their answers).
//
// The job state is split so that a call touches only what it changes: every
// operation costs O(1) Redis commands (O(log n) for sorted-set updates),
// except the close of a round and the opening of the round after it, which
// are O(n) once per round, and a re-registration after a loss, O(peers).
//
// KEYS (all carry the job's hash tag, so they live in one Cluster slot):
//
//	1 state     string: JSON of the scalar fields of coreState (inc, round,
//	            prev, floor, open, reform, fin, dl, seq, ver) and size (of
//	            the closed round: HLEN of rank, checked on every load)
//	2 meta      hash: inc, ver, fin, round, open, for the cheap heartbeat; last, credit
//	            (the job's time, see tick); ttlat (store time of the last
//	            renewal of the keys' TTL); rdig (SHA-1 hex of the last
//	            close's hint after its version line, "" if its roster was
//	            left out; checked by the hub before it trusts a hint)
//	3 members   hash: member ID -> JSON of Member
//	4 leases    sorted set: member ID scored by lease expiry (ms, Redis' clock)
//	5 ord       hash: member ID -> arrival order
//	6 since     hash: member ID -> first round it held a rank in
//	7 arrived   set: forming round, arrived members
//	8 expected  set: forming round, survivors not yet arrived
//	9 back      set: forming round, survivors that arrived
//	10 pending  set: closed round, waiting joiners
//	11 rank     hash: closed round, member ID -> rank (0-based)
//	12 roster   string: closed round, the member records in rank order,
//	            one per line (JSON never contains a raw newline)
//
// ARGV (all scripts): 1 Pub/Sub channel, 2 MinWorkers, 3 MaxWorkers,
// 4 LastCall ms, 5 LeaseTTL ms, 6 StateTTL ms, 7 caller member ID,
// 8 caller incarnation, 9 the round whose World the caller holds (0 = none:
// a view ranked in it leaves the roster out); then the script's own
// arguments.
//
// Replies: view = {code, inc, ver, round, open, role, rank, size, pending,
// wait_ms, order, since[, roster]} (pending is the count of arrived members
// while open); heartbeat = {code, inc, ver} or, on a renewal, {code, inc,
// ver, now_ms, leases, round, open} (the store's clock, Beat.StoreTime; the
// number of leases held, Beat.Leases; the latest round and 1 while it
// forms, Beat.Round and Beat.Open).
//
// Pub/Sub message on a visible change: "<ver>"; when the change closed a
// round, "<ver>\n<round>\n<inc>\n<roster>" (records in rank order) if the
// roster is at most hintRosterMax bytes (see core.go), else
// "<ver>\n<round>\n<inc>" (a process reads the roster once, luaRoster); when
// it opened a round after a closed one, "<ver>\n<round>\n<inc>\nopen".

// hintRosterMaxLua is hintRosterMax spelled for the scripts.
const hintRosterMaxLua = "65536"

// beatLastStepLua is beatLastStep spelled for the scripts.
const beatLastStepLua = "10"

const luaPrelude = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local K_STATE, K_META, K_MEMBERS, K_LEASES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_ORD, K_SINCE, K_ARRIVED, K_EXPECTED = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_BACK, K_PENDING, K_RANK, K_ROSTER = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local CHANNEL = ARGV[1]
local P = {min = tonumber(ARGV[2]), max = tonumber(ARGV[3]), lastcall = tonumber(ARGV[4]),
  lease = tonumber(ARGV[5]), ttl = tonumber(ARGV[6])}
local ID, INC, HAVE = ARGV[7], ARGV[8], tonumber(ARGV[9]) or 0
local OK, FENCED, LOST, FINISHED = 0, 1, 2, 3
local HINT_ROSTER_MAX = ` + hintRosterMaxLua + `
local ROLE_NONE, ROLE_RANKED, ROLE_ARRIVED, ROLE_EXPECTED, ROLE_PENDING = 0, 1, 2, 3, 4

local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- created: the call may have created a key of the job (a set's first
-- member, the first member record), which must get the job's TTL now.
local C = {changed = false, reopen = false, closed = false, opened = false, created = false}
-- META: fields of the meta hash this call writes, all in one HSET at its end.
local META = {}

-- The job's time (core.go, tick): leases and the last-call deadline run on
-- VNOW = NOW - credit; a gap between two calls of the job longer than
-- LeaseTTL/2 is credited beyond that, up to LeaseTTL per gap. last and
-- credit live in the meta hash, written with the call's other meta fields.
local VNOW = NOW
` + luaCredit + `
local function tick(last, credit)
  credit = job_credit(NOW, P.lease, last, credit)
  META.last, META.credit = NOW, credit
  VNOW = NOW - credit
end

-- The job's keys get StateTTL when a call may have created one, on a
-- visible change, and otherwise once half of it is spent (ttlat in the
-- meta hash: the store time of the last renewal), not on every call: twelve
-- PEXPIREs were most of a call's writes.
local TTLAT = nil
local function ttl_due() return TTLAT == nil or NOW - TTLAT >= P.ttl / 2 end
local function write_meta()
  local args = {}
  for k, v in pairs(META) do args[#args + 1] = k; args[#args + 1] = v end
  if #args > 0 then redis.call('HSET', K_META, unpack(args)) end
end

local function num(x) if type(x) == 'number' then return x end return 0 end
local function is(key, id) return redis.call('SISMEMBER', key, id) == 1 end
local function hnum(key, id) return tonumber(redis.call('HGET', key, id) or '0') or 0 end

-- each calls redis command cmd on key with the items of list, in chunks
-- (Lua's unpack has a stack limit); it returns the replies concatenated.
local function each(cmd, key, list)
  local out = {}
  for i = 1, #list, 1000 do
    local r = redis.call(cmd, key, unpack(list, i, math.min(#list, i + 999)))
    if type(r) == 'table' then for _, x in ipairs(r) do out[#out + 1] = x end end
  end
  return out
end

local function load()
  local raw = redis.call('GET', K_STATE)
  if not raw then return nil end
  local ok, st = pcall(cjson.decode, raw)
  if not ok or type(st) ~= 'table' or type(st.inc) ~= 'string' then return nil end
  st.raw = raw
  st.round, st.prev, st.floor = num(st.round), num(st.prev), num(st.floor)
  st.dl, st.seq, st.ver = num(st.dl), num(st.seq), num(st.ver)
  st.open, st.reform, st.fin = st.open == true, st.reform == true, st.fin == true
  st.size = num(st.size)
  -- The closed round's rank hash is written with its size: if they disagree
  -- the keys were damaged, and the job re-forms as after a loss (O(1) check).
  if not st.open and redis.call('HLEN', K_RANK) ~= st.size then return nil end
  return st
end

local function evict(st, id)
  redis.call('HDEL', K_MEMBERS, id)
  redis.call('ZREM', K_LEASES, id)
  redis.call('HDEL', K_ORD, id)
  redis.call('HDEL', K_SINCE, id)
  if not st.open and redis.call('HDEL', K_RANK, id) == 1 then C.reopen = true end
  redis.call('SREM', K_ARRIVED, id)
  redis.call('SREM', K_EXPECTED, id)
  redis.call('SREM', K_BACK, id)
  redis.call('SREM', K_PENDING, id)
  C.changed = true
end

local function open_next(st, present)
  st.round = math.max(st.round + 1, st.floor)
  st.open = true
  local survivors = redis.call('HKEYS', K_RANK)
  st.reform = #survivors > 0
  st.dl, st.size = 0, 0
  redis.call('DEL', K_EXPECTED, K_BACK, K_ARRIVED, K_RANK, K_ROSTER)
  if redis.call('EXISTS', K_PENDING) == 1 then redis.call('RENAME', K_PENDING, K_ARRIVED) end
  local back, expected = {}, survivors
  if present and #survivors > 0 then
    -- survivors that renewed within the last LeaseTTL/2 have arrived
    -- (core.go, settle)
    local recent = VNOW + P.lease - math.floor(P.lease / 2)
    local scores = each('ZMSCORE', K_LEASES, survivors)
    expected = {}
    for i, id in ipairs(survivors) do
      if (tonumber(scores[i]) or 0) >= recent then back[#back + 1] = id else expected[#expected + 1] = id end
    end
  end
  each('SADD', K_BACK, back)
  each('SADD', K_ARRIVED, back)
  each('SADD', K_EXPECTED, expected)
  C.changed, C.opened = true, true
end

local function settle(st, present)
  if C.reopen then C.reopen = false; open_next(st, present) end
end

local function sweep(st)
  local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', VNOW)
  table.sort(expired)
  for _, id in ipairs(expired) do evict(st, id) end
  settle(st, true)
end

local function try_close(st)
  if not st.open or redis.call('SCARD', K_EXPECTED) > 0 then return end
  local n = redis.call('SCARD', K_ARRIVED)
  if n == 0 then st.dl = 0; st.reform = false; return end
  local close = false
  if st.reform and redis.call('SCARD', K_BACK) > 0 and n >= P.min then close = true
  elseif n >= P.max then close = true
  elseif n >= P.min then
    if st.dl == 0 then st.dl = VNOW + P.lastcall end
    close = VNOW >= st.dl
  else st.dl = 0 end
  if not close then return end
  local a = redis.call('SMEMBERS', K_ARRIVED)
  -- An arrival without a member record (a key written outside the
  -- protocol) holds no lease either, so no sweep would remove it: drop it
  -- here and decide again, or every later roster holds an empty line
  -- (core.go, tryClose)
  local rs, rec, ghosts = each('HMGET', K_MEMBERS, a), {}, {}
  for i, id in ipairs(a) do
    if rs[i] then rec[id] = rs[i] else ghosts[#ghosts + 1] = id end
  end
  if #ghosts > 0 then
    each('SREM', K_ARRIVED, ghosts)
    each('SREM', K_BACK, ghosts)
    C.changed = true
    return try_close(st)
  end
  local ords, sinces = each('HMGET', K_ORD, a), each('HMGET', K_SINCE, a)
  local ord, since = {}, {}
  for i, id in ipairs(a) do
    ord[id] = tonumber(ords[i] or '0') or 0
    since[id] = tonumber(sinces[i] or '0') or 0
  end
  table.sort(a, function(x, y)
    local sx, sy = since[x], since[y]
    if sx ~= sy then
      if sx == 0 then return false end
      if sy == 0 then return true end
      return sx < sy
    end
    local ox, oy = ord[x], ord[y]
    if ox ~= oy then return ox < oy end
    return x < y
  end)
  local k = math.min(n, P.max)
  local ranked, rest, rankArgs, sinceArgs = {}, {}, {}, {}
  for i = 1, n do
    local id = a[i]
    if i <= k then
      ranked[#ranked + 1] = id
      rankArgs[#rankArgs + 1] = id
      rankArgs[#rankArgs + 1] = i - 1
      if since[id] == 0 then
        sinceArgs[#sinceArgs + 1] = id
        sinceArgs[#sinceArgs + 1] = st.round
      end
    else
      rest[#rest + 1] = id
    end
  end
  redis.call('DEL', K_EXPECTED, K_ARRIVED, K_BACK, K_PENDING, K_RANK)
  each('HSET', K_RANK, rankArgs)
  each('HSET', K_SINCE, sinceArgs)
  each('SADD', K_PENDING, rest)
  local recs = {}
  for j = 1, #ranked do recs[j] = rec[ranked[j]] end
  redis.call('SET', K_ROSTER, table.concat(recs, '\n'))
  st.open, st.reform, st.dl, st.prev, st.size = false, false, 0, st.round, k
  C.changed, C.closed = true, true
end

local function expire_all()
  for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], P.ttl) end
end

local function save(st)
  if C.changed then st.ver = st.ver + 1 end
  local enc = cjson.encode({inc = st.inc, round = st.round, prev = st.prev, floor = st.floor,
    open = st.open, reform = st.reform, fin = st.fin, dl = st.dl, seq = st.seq, ver = st.ver, size = st.size})
  local renew = C.changed or C.created or ttl_due()
  if renew or enc ~= st.raw then redis.call('SET', K_STATE, enc, 'PX', P.ttl) end
  META.inc, META.ver, META.fin = st.inc, st.ver, st.fin and '1' or '0'
  META.round, META.open = st.round, st.open and '1' or '0'
  if renew then META.ttlat = NOW end
  -- The hint: the version, and when a round closed, the round, the
  -- incarnation and the member records in rank order, one per line. A
  -- close records the SHA-1 of what follows the version (rdig in the meta
  -- hash; empty when the roster is too large to travel in the hint), so
  -- a subscriber takes a World only from a roster the store formed
  -- (Redis' hub checks it with one HMGET): a PUBLISH on the channel
  -- alone cannot hand members a round.
  local msg = nil
  if C.changed then
    msg = tostring(st.ver)
    if C.closed and not st.open then
      local roster = redis.call('GET', K_ROSTER) or ''
      local tail = tostring(st.round) .. '\n' .. st.inc
      if #roster <= HINT_ROSTER_MAX then
        tail = tail .. '\n' .. roster
        META.rdig = redis.sha1hex(tail)
      else
        META.rdig = ''
      end
      msg = msg .. '\n' .. tail
    elseif C.opened and st.open then
      msg = msg .. '\n' .. tostring(st.round) .. '\n' .. st.inc .. '\nopen'
    end
  end
  write_meta() -- first: it may create the meta hash, which needs its TTL too
  if renew then expire_all() end
  if msg then redis.call('PUBLISH', CHANNEL, msg) end
end

local function view(st, code)
  if not st then return {code, '', 0, 0, 0, ROLE_NONE, -1, 0, 0, 0, 0, 0} end
  local r = {code, st.inc, st.ver, st.round, st.open and 1 or 0, ROLE_NONE, -1, 0, 0, 0, hnum(K_ORD, ID), hnum(K_SINCE, ID)}
  if code ~= OK then return r end
  if st.open then
    if is(K_ARRIVED, ID) then r[6] = ROLE_ARRIVED
    elseif is(K_EXPECTED, ID) then r[6] = ROLE_EXPECTED end
    if st.dl > 0 then r[10] = math.max(0, st.dl - VNOW) end
    r[9] = redis.call('SCARD', K_ARRIVED) -- the pending slot carries the arrivals while open
    return r
  end
  local size = redis.call('HLEN', K_RANK)
  r[8] = size
  r[9] = math.max(0, math.min(redis.call('SCARD', K_PENDING), P.max - size))
  local rank = redis.call('HGET', K_RANK, ID)
  if rank then
    r[6], r[7] = ROLE_RANKED, tonumber(rank) or -1
    -- A large roster is left out too: the client reads it once per
    -- process (Redis.rosterOf), not once per member that asks.
    if HAVE ~= st.round and redis.call('STRLEN', K_ROSTER) <= HINT_ROSTER_MAX then
      r[13] = redis.call('GET', K_ROSTER) or ''
    end
  elseif is(K_PENDING, ID) then
    r[6] = ROLE_PENDING
  end
  return r
end

local function member_pre(st)
  if not st then return LOST end
  if st.fin then return FINISHED end
  if st.inc ~= INC then return LOST end
  local m = redis.call('HMGET', K_META, 'last', 'credit', 'ttlat')
  TTLAT = tonumber(m[3] or '')
  tick(m[1], m[2])
  sweep(st)
  if redis.call('HEXISTS', K_MEMBERS, ID) == 0 then return FENCED end
  redis.call('ZADD', K_LEASES, VNOW + P.lease, ID)
  return OK
end
`

// luaCredit is the silence credit of core.go's tick, shared by the prelude
// and luaBeat: the credit after a call at now, given the meta hash's last
// and credit fields (strings or false).
const luaCredit = `
local function job_credit(now, lease, last, credit)
  last, credit = tonumber(last or ''), tonumber(credit or '0') or 0
  -- a credit outside [0, now) was not written by a call (NaN fails both):
  -- negative, every lease would lapse at once; start it over
  if not (credit >= 0 and credit < now) then credit = 0 end
  local thr = math.floor(lease / 2)
  if last and now - last > thr then credit = credit + math.min(now - last - thr, lease) end
  return credit
end
`

// ARGV 10 new incarnation, 11 member record, 12 order, 13 round hint,
// 14 arrive (0/1), 15 since, 16 the round whose World the caller holds
// (JoinRequest.HaveRound), 17.. peers.
const luaJoin = luaPrelude + `
local NEWINC, REC, ORDER, HINT, ARRIVE = ARGV[10], ARGV[11], tonumber(ARGV[12]), tonumber(ARGV[13]), ARGV[14] == '1'
local SINCE, HELD = tonumber(ARGV[15]), tonumber(ARGV[16]) or 0
local PEERS = {}
for i = 17, #ARGV do PEERS[#PEERS + 1] = ARGV[i] end
local st = load()
if not st then
  redis.call('DEL', K_MEMBERS, K_LEASES, K_ORD, K_SINCE, K_ARRIVED, K_EXPECTED, K_BACK, K_PENDING, K_RANK, K_ROSTER)
  st = {inc = NEWINC, round = HINT, prev = HINT, floor = HINT + 1, open = false, reform = false,
    fin = false, dl = 0, seq = 0, ver = 0, size = 0}
  C.changed = true
  st.fresh = true
end
if st.fin then return view(st, FINISHED) end
if st.fresh then
  META.last, META.credit = NOW, 0
else
  local m = redis.call('HMGET', K_META, 'last', 'credit', 'ttlat')
  TTLAT = tonumber(m[3] or '')
  tick(m[1], m[2])
end
sweep(st)
local known = redis.call('HEXISTS', K_MEMBERS, ID) == 1
if INC ~= '' and INC == st.inc and not known then
  save(st)
  return view(st, FENCED)
end
st.floor = math.max(st.floor, HINT + 1)
if not known then
  local order = ORDER
  if order <= 0 then
    st.seq = st.seq + 1
    order = st.seq
  else
    st.seq = math.max(st.seq, order)
  end
  redis.call('HSET', K_MEMBERS, ID, REC)
  redis.call('HSET', K_ORD, ID, order)
  if redis.call('HLEN', K_MEMBERS) == 1 then C.created = true end -- and ord's, leases' first entry
  if SINCE > 0 and SINCE <= HINT then
    redis.call('HSET', K_SINCE, ID, SINCE)
    C.created = true
  end
end
redis.call('ZADD', K_LEASES, VNOW + P.lease, ID)
if st.open and st.round < st.floor then st.round = st.floor end
if #PEERS > 0 and INC ~= '' and INC ~= st.inc then
  if not st.open and redis.call('HLEN', K_RANK) == 0 then open_next(st, false) end
  if st.open then
    local all = {ID}
    for _, p in ipairs(PEERS) do all[#all + 1] = p end
    for _, p in ipairs(all) do
      if not is(K_ARRIVED, p) and not is(K_EXPECTED, p) then
        if not redis.call('ZSCORE', K_LEASES, p) then redis.call('ZADD', K_LEASES, VNOW + P.lease, p) end
        redis.call('SADD', K_EXPECTED, p)
      end
    end
    st.reform = true
    C.changed = true
  end
end
if ARRIVE then
  if not st.open then
    local ranked = redis.call('HEXISTS', K_RANK, ID) == 1
    local leaves = HELD == 0 or HELD >= st.round
    if (ranked and leaves) or redis.call('HLEN', K_RANK) == 0 then
      open_next(st, false)
    elseif not ranked and redis.call('SADD', K_PENDING, ID) == 1 then
      C.changed = true
    end
  end
  if st.open then
    if redis.call('SREM', K_EXPECTED, ID) == 1 and redis.call('SADD', K_BACK, ID) == 1 and
        redis.call('SCARD', K_BACK) == 1 then C.created = true end
    if redis.call('SADD', K_ARRIVED, ID) == 1 and redis.call('SCARD', K_ARRIVED) == 1 then C.created = true end
  end
end
try_close(st)
save(st)
return view(st, OK)
`
const luaCheck = luaPrelude + `
local st = load()
local code = member_pre(st)
if code == OK then try_close(st) end
if st and (code == OK or code == FENCED) then save(st) end
return view(st, code)
`

// ARGV 10 round, 11 target member ID.
const luaReport = luaPrelude + `
local ROUND, TARGET = tonumber(ARGV[10]), ARGV[11]
local st = load()
local code = member_pre(st)
if code == OK then
  if not st.open and st.round == ROUND and redis.call('HEXISTS', K_RANK, TARGET) == 1 then
    evict(st, TARGET)
  elseif st.open and st.prev == ROUND and is(K_EXPECTED, TARGET) then
    evict(st, TARGET)
  end
  settle(st, true)
  try_close(st)
end
if st and (code == OK or code == FENCED) then save(st) end
return view(st, code)
`

// ARGV 10 keep ranked (MemberRequest.KeepRanked: 0/1), 11 the round whose
// World the caller holds (MemberRequest.HaveRound, as sent: ARGV 9 may name
// a later round whose roster the process has read).
const luaLeave = luaPrelude + `
local KEEP, HELD = ARGV[10] == '1', tonumber(ARGV[11]) or 0
local st = load()
local code = member_pre(st)
local stays = code == OK and KEEP and not st.open and st.round > HELD and redis.call('HEXISTS', K_RANK, ID) == 1
if code == OK and not stays then
  evict(st, ID)
  settle(st, false) -- a leave re-forms as before (core.go, leave)
  try_close(st)
end
if st and (code == OK or code == FENCED) then save(st) end
return view(st, code)
`

const luaFinish = luaPrelude + `
local st = load()
local code = member_pre(st)
if code == OK then
  st.fin = true
  C.changed = true
end
if st and (code == OK or code == FENCED) then save(st) end
return view(st, code)
`

// luaBeat is the heartbeat of a job with no expired lease: a few commands,
// without the prelude (its closures and its state decoding were most of a
// heartbeat's cost, and a round of thousands renews thousands of leases a
// second). When a lease expired it writes nothing and answers {-1}: the
// caller then runs luaHeartbeat, which sweeps. Replies as luaHeartbeat's.
// It also answers {-1} when the job's keys are due for their TTL renewal
// (at half of StateTTL), which luaHeartbeat does. KEYS and ARGV are only
// what it reads (Redis.Heartbeat; every argument costs Redis an
// object to build, and a round of 4096 sends 4096 heartbeats a second):
// KEYS 1 meta, 2 members, 3 leases; ARGV 1 LeaseTTL ms, 2 StateTTL ms,
// 3 caller member ID, 4 caller incarnation.
const luaBeat = `
local K_META, K_MEMBERS, K_LEASES = KEYS[1], KEYS[2], KEYS[3]
local LEASE, TTL, ID, INC = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
` + luaCredit + `
local m = redis.call('HMGET', K_META, 'inc', 'ver', 'fin', 'last', 'credit', 'ttlat', 'round', 'open')
local inc = m[1]
if not inc then return {2, '', 0} end
local ver = tonumber(m[2] or '0') or 0
if m[3] == '1' then return {3, inc, ver} end
if inc ~= INC then return {2, inc, ver} end
local credit = job_credit(NOW, LEASE, m[4], m[5])
local VNOW = NOW - credit
if #redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', VNOW, 'LIMIT', 0, 1) > 0 then return {-1} end
local ttlat = tonumber(m[6] or '')
local last = tonumber(m[4] or '')
if ttlat == nil or NOW - ttlat >= TTL / 2 then return {-1} end
if last == nil or NOW - last >= ` + beatLastStepLua + ` or credit ~= (tonumber(m[5] or '0') or 0) then
  -- The job's last call moves in steps (core.go, heartbeat): thousands
  -- of beats a second need not each rewrite it.
  redis.call('HSET', K_META, 'last', NOW, 'credit', credit)
end
-- Every lease belongs to a registered member here (the grace leases of a
-- re-registration are for members of another incarnation, whose beats
-- answer {2}), so a renewal that changed a score is the fencing check too;
-- 0 (absent, or renewed already at this very time) asks the members hash.
if redis.call('ZADD', K_LEASES, 'XX', 'CH', VNOW + LEASE, ID) == 0 and
    redis.call('HEXISTS', K_MEMBERS, ID) == 0 then return {1, inc, ver} end
return {0, inc, ver, NOW, redis.call('ZCARD', K_LEASES), tonumber(m[7] or '0') or 0, m[8] == '1' and 1 or 0}
`

// luaHeartbeat is the heartbeat that sweeps (luaBeat answered {-1}).
const luaHeartbeat = luaPrelude + `
local m = redis.call('HMGET', K_META, 'inc', 'ver', 'fin', 'last', 'credit', 'ttlat', 'round', 'open')
TTLAT = tonumber(m[6] or '')
local round, open = tonumber(m[7] or '0') or 0, m[8] == '1'
local inc = m[1]
if not inc then return {LOST, '', 0} end
local ver = tonumber(m[2] or '0') or 0
if m[3] == '1' then return {FINISHED, inc, ver} end
if inc ~= INC then return {LOST, inc, ver} end
tick(m[4], m[5])
local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', VNOW, 'LIMIT', 0, 1)
if #expired > 0 then
  local st = load()
  if not st then return {LOST, '', 0} end
  sweep(st)
  try_close(st) -- the survivors of a lapsed lease re-form at once
  save(st)
  ver, round, open = st.ver, st.round, st.open
else
  -- As luaBeat: the job's last call moves in steps.
  local last0, credit0 = tonumber(m[4] or ''), tonumber(m[5] or '0') or 0
  if last0 and NOW - last0 < ` + beatLastStepLua + ` and META.credit == credit0 then
    META.last, META.credit = nil, nil
  end
  -- Renew the job's TTL once it is half spent, not on every beat: a
  -- heartbeat stays a handful of commands.
  local due = ttl_due()
  if due then META.ttlat = NOW end
  write_meta()
  if due then expire_all() end
end
if redis.call('HEXISTS', K_MEMBERS, ID) == 0 then return {FENCED, inc, ver} end
redis.call('ZADD', K_LEASES, VNOW + P.lease, ID)
return {OK, inc, ver, NOW, redis.call('ZCARD', K_LEASES), round, open and 1 or 0}
`

// luaRoster reads a closed round's roster for a hint that did not carry it.
// KEYS 1 state, 2 roster. Reply {inc, round, roster}, or {} while a round
// forms or when there is no state. Read-only.
const luaRoster = `
local raw = redis.call('GET', KEYS[1])
if not raw then return {} end
local ok, st = pcall(cjson.decode, raw)
if not ok or type(st) ~= 'table' or type(st.inc) ~= 'string' or st.open == true or type(st.round) ~= 'number' then return {} end
local roster = redis.call('GET', KEYS[2])
if not roster then return {} end
return {st.inc, st.round, roster}
`
