package elastic

// Lua scripts of the Redis store. Each state transition is one script, run
// atomically by Redis. They mirror core.go function by function; keep the two
// in step (the same tests run against both stores).
//
// KEYS: 1 state (JSON of coreState, string), 2 meta (hash: inc, ver, fin, for
// the cheap heartbeat), 3 members (hash: member ID -> JSON of Member),
// 4 leases (sorted set: member ID scored by lease expiry, ms of Redis' clock).
// All four carry the job's hash tag, so they live in one Cluster slot.
//
// ARGV (all scripts): 1 Pub/Sub channel, 2 MinWorkers, 3 MaxWorkers,
// 4 LastCall ms, 5 LeaseTTL ms, 6 StateTTL ms, 7 caller member ID,
// 8 caller incarnation; then the script's own arguments.
//
// Replies: view = {code, inc, ver, round, open, role, rank, size, pending,
// wait_ms, order, since, record...}; heartbeat = {code, inc, ver}.
//
// Pub/Sub message on a visible change: "<ver>", or, when the change closed a
// round, "<ver>\n<round>\n<inc>\n<record>\n<record>..." (records in rank
// order; JSON never contains a raw newline).

const luaPrelude = `
if redis.replicate_commands then pcall(redis.replicate_commands) end
local K_STATE, K_META, K_MEMBERS, K_LEASES = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local CHANNEL = ARGV[1]
local P = {min = tonumber(ARGV[2]), max = tonumber(ARGV[3]), lastcall = tonumber(ARGV[4]),
  lease = tonumber(ARGV[5]), ttl = tonumber(ARGV[6])}
local ID, INC = ARGV[7], ARGV[8]
local OK, FENCED, LOST, FINISHED = 0, 1, 2, 3
local ROLE_NONE, ROLE_RANKED, ROLE_ARRIVED, ROLE_EXPECTED, ROLE_PENDING = 0, 1, 2, 3, 4

local t = redis.call('TIME')
local NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local C = {changed = false, reopen = false, closed = false}

local function index(list, id)
  for i = 1, #list do if list[i] == id then return i end end
  return 0
end
local function contains(list, id) return index(list, id) > 0 end
local function remove(list, id)
  local i = index(list, id)
  if i > 0 then table.remove(list, i); return true end
  return false
end
local function arr(x)
  local out = {}
  if type(x) ~= 'table' then return out end
  for i = 1, #x do if type(x[i]) == 'string' then out[#out + 1] = x[i] end end
  return out
end
local function num(x) if type(x) == 'number' then return x end return 0 end
local function nummap(x)
  local out = {}
  if type(x) == 'table' then
    for k, v in pairs(x) do if type(k) == 'string' and type(v) == 'number' then out[k] = v end end
  end
  return out
end

local function load()
  local raw = redis.call('GET', K_STATE)
  if not raw then return nil end
  local ok, st = pcall(cjson.decode, raw)
  if not ok or type(st) ~= 'table' or type(st.inc) ~= 'string' then return nil end
  st.round, st.prev, st.floor = num(st.round), num(st.prev), num(st.floor)
  st.dl, st.seq, st.ver = num(st.dl), num(st.seq), num(st.ver)
  st.open, st.reform, st.fin = st.open == true, st.reform == true, st.fin == true
  st.ranked, st.arrived = arr(st.ranked), arr(st.arrived)
  st.expected, st.pending, st.back = arr(st.expected), arr(st.pending), arr(st.back)
  st.ord, st.since = nummap(st.ord), nummap(st.since)
  return st
end

local function evict(st, id)
  redis.call('HDEL', K_MEMBERS, id)
  redis.call('ZREM', K_LEASES, id)
  st.ord[id] = nil
  st.since[id] = nil
  if not st.open and remove(st.ranked, id) then C.reopen = true end
  remove(st.arrived, id)
  remove(st.expected, id)
  remove(st.back, id)
  remove(st.pending, id)
  C.changed = true
end

local function open_next(st)
  st.round = math.max(st.round + 1, st.floor)
  st.open = true
  st.reform = #st.ranked > 0
  st.dl = 0
  st.expected = st.ranked
  st.back = {}
  st.ranked = {}
  st.arrived = st.pending
  st.pending = {}
  C.changed = true
end

local function settle(st)
  if C.reopen then C.reopen = false; open_next(st) end
end

local function sweep(st)
  local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', NOW)
  table.sort(expired)
  for _, id in ipairs(expired) do evict(st, id) end
  local orphans = {}
  for _, list in ipairs({st.ranked, st.arrived, st.expected, st.pending}) do
    for _, id in ipairs(list) do
      if not redis.call('ZSCORE', K_LEASES, id) then orphans[#orphans + 1] = id end
    end
  end
  for _, id in ipairs(orphans) do evict(st, id) end
  settle(st)
end

local function try_close(st)
  if not st.open or #st.expected > 0 then return end
  local n = #st.arrived
  if n == 0 then st.dl = 0; st.reform = false; return end
  local close = false
  if st.reform and #st.back > 0 and n >= P.min then close = true
  elseif n >= P.max then close = true
  elseif n >= P.min then
    if st.dl == 0 then st.dl = NOW + P.lastcall end
    close = NOW >= st.dl
  else st.dl = 0 end
  if not close then return end
  local a = {}
  for i, id in ipairs(st.arrived) do a[i] = id end
  table.sort(a, function(x, y)
    local sx, sy = st.since[x] or 0, st.since[y] or 0
    if sx ~= sy then
      if sx == 0 then return false end
      if sy == 0 then return true end
      return sx < sy
    end
    local ox, oy = st.ord[x] or 0, st.ord[y] or 0
    if ox ~= oy then return ox < oy end
    return x < y
  end)
  local k = math.min(n, P.max)
  st.ranked, st.pending = {}, {}
  for i = 1, n do
    if i <= k then st.ranked[#st.ranked + 1] = a[i] else st.pending[#st.pending + 1] = a[i] end
  end
  for _, id in ipairs(st.ranked) do
    if (st.since[id] or 0) == 0 then st.since[id] = st.round end
  end
  st.open, st.reform, st.dl, st.prev = false, false, 0, st.round
  st.expected, st.arrived, st.back = {}, {}, {}
  C.changed, C.closed = true, true
end

local function save(st)
  if C.changed then st.ver = st.ver + 1 end
  redis.call('SET', K_STATE, cjson.encode(st), 'PX', P.ttl)
  redis.call('HSET', K_META, 'inc', st.inc, 'ver', st.ver, 'fin', st.fin and '1' or '0')
  redis.call('PEXPIRE', K_META, P.ttl)
  redis.call('PEXPIRE', K_MEMBERS, P.ttl)
  redis.call('PEXPIRE', K_LEASES, P.ttl)
  if C.changed then
    -- The hint: the version, and when a round closed, the round, the
    -- incarnation and the member records in rank order, one per line.
    local msg = tostring(st.ver)
    if C.closed and not st.open then
      msg = msg .. '\n' .. tostring(st.round) .. '\n' .. st.inc
      local recs = redis.call('HMGET', K_MEMBERS, unpack(st.ranked))
      for j = 1, #st.ranked do msg = msg .. '\n' .. (recs[j] or '') end
    end
    redis.call('PUBLISH', CHANNEL, msg)
  end
end

local function view(st, code)
  if not st then return {code, '', 0, 0, 0, ROLE_NONE, -1, 0, 0, 0, 0, 0} end
  local r = {code, st.inc, st.ver, st.round, st.open and 1 or 0, ROLE_NONE, -1, 0, 0, 0, st.ord[ID] or 0, st.since[ID] or 0}
  if code ~= OK then return r end
  if st.open then
    if contains(st.arrived, ID) then r[6] = ROLE_ARRIVED
    elseif contains(st.expected, ID) then r[6] = ROLE_EXPECTED end
    if st.dl > 0 then r[10] = math.max(0, st.dl - NOW) end
    return r
  end
  r[8] = #st.ranked
  r[9] = math.max(0, math.min(#st.pending, P.max - #st.ranked))
  local i = index(st.ranked, ID)
  if i > 0 then
    r[6], r[7] = ROLE_RANKED, i - 1
    local recs = redis.call('HMGET', K_MEMBERS, unpack(st.ranked))
    for j = 1, #st.ranked do r[#r + 1] = recs[j] or '' end
  elseif contains(st.pending, ID) then
    r[6] = ROLE_PENDING
  end
  return r
end

local function member_pre(st)
  if not st then return LOST end
  if st.fin then return FINISHED end
  if st.inc ~= INC then return LOST end
  sweep(st)
  if redis.call('HEXISTS', K_MEMBERS, ID) == 0 then return FENCED end
  redis.call('ZADD', K_LEASES, NOW + P.lease, ID)
  return OK
end
`

// ARGV 9 new incarnation, 10 member record, 11 order, 12 round hint,
// 13 arrive (0/1), 14 since, 15.. peers.
const luaJoin = luaPrelude + `
local NEWINC, REC, ORDER, HINT, ARRIVE = ARGV[9], ARGV[10], tonumber(ARGV[11]), tonumber(ARGV[12]), ARGV[13] == '1'
local SINCE = tonumber(ARGV[14])
local PEERS = {}
for i = 15, #ARGV do PEERS[#PEERS + 1] = ARGV[i] end
local st = load()
if not st then
  redis.call('DEL', K_MEMBERS, K_LEASES)
  st = {inc = NEWINC, round = HINT, prev = HINT, floor = HINT + 1, open = false, reform = false,
    fin = false, dl = 0, seq = 0, ver = 0, ranked = {}, arrived = {}, expected = {}, back = {}, pending = {}, ord = {}, since = {}}
  C.changed = true
end
if st.fin then return view(st, FINISHED) end
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
  st.ord[ID] = order
  if SINCE > 0 and SINCE <= HINT then st.since[ID] = SINCE end
end
redis.call('ZADD', K_LEASES, NOW + P.lease, ID)
if st.open and st.round < st.floor then st.round = st.floor end
if #PEERS > 0 and INC ~= '' and INC ~= st.inc then
  if not st.open and #st.ranked == 0 then open_next(st) end
  if st.open then
    local all = {ID}
    for _, p in ipairs(PEERS) do all[#all + 1] = p end
    for _, p in ipairs(all) do
      if not contains(st.arrived, p) and not contains(st.expected, p) then
        if not redis.call('ZSCORE', K_LEASES, p) then redis.call('ZADD', K_LEASES, NOW + P.lease, p) end
        st.expected[#st.expected + 1] = p
      end
    end
    st.reform = true
    C.changed = true
  end
end
if ARRIVE then
  if not st.open then
    if contains(st.ranked, ID) or #st.ranked == 0 then
      open_next(st)
    elseif not contains(st.pending, ID) then
      st.pending[#st.pending + 1] = ID
      C.changed = true
    end
  end
  if st.open then
    if remove(st.expected, ID) then st.back[#st.back + 1] = ID end
    if not contains(st.arrived, ID) then st.arrived[#st.arrived + 1] = ID end
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

// ARGV 9 round, 10 target member ID.
const luaReport = luaPrelude + `
local ROUND, TARGET = tonumber(ARGV[9]), ARGV[10]
local st = load()
local code = member_pre(st)
if code == OK then
  if not st.open and st.round == ROUND and contains(st.ranked, TARGET) then
    evict(st, TARGET)
  elseif st.open and st.prev == ROUND and contains(st.expected, TARGET) then
    evict(st, TARGET)
  end
  settle(st)
  try_close(st)
end
if st and (code == OK or code == FENCED) then save(st) end
return view(st, code)
`

const luaLeave = luaPrelude + `
local st = load()
local code = member_pre(st)
if code == OK then
  evict(st, ID)
  settle(st)
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

const luaHeartbeat = luaPrelude + `
local inc = redis.call('HGET', K_META, 'inc')
if not inc then return {LOST, '', 0} end
local ver = tonumber(redis.call('HGET', K_META, 'ver') or '0') or 0
if redis.call('HGET', K_META, 'fin') == '1' then return {FINISHED, inc, ver} end
if inc ~= INC then return {LOST, inc, ver} end
local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', NOW, 'LIMIT', 0, 1)
if #expired > 0 then
  local st = load()
  if not st then return {LOST, '', 0} end
  sweep(st)
  save(st)
  ver = st.ver
end
redis.call('PEXPIRE', K_STATE, P.ttl)
redis.call('PEXPIRE', K_META, P.ttl)
redis.call('PEXPIRE', K_MEMBERS, P.ttl)
redis.call('PEXPIRE', K_LEASES, P.ttl)
if redis.call('HEXISTS', K_MEMBERS, ID) == 0 then return {FENCED, inc, ver} end
redis.call('ZADD', K_LEASES, NOW + P.lease, ID)
return {OK, inc, ver}
`
