package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
)

// Config holds a Queue's settings.
type Config struct {
	// Shards is the layout of each epoch (dataset length, shard size) and
	// the lease TTL. Its DatasetLen has no default; see
	// dataloader.DefaultShardConfig for the others.
	Shards dataloader.ShardConfig
	// JobID names the job; every key carries it as a hash tag. Required;
	// must not contain '{' or '}'.
	JobID string
	// Prefix starts every key. Default "elastictrain:". Must not contain
	// '{' or '}': a brace in it would take the place of the JobID as the
	// keys' hash tag (with "{}" the keys of one epoch fall in different
	// Redis Cluster slots and every script fails with CROSSSLOT).
	Prefix string
	// KeyTTL is how long an epoch's keys live after their last write.
	// Must be >= Shards.LeaseTTL. Default 7 days.
	KeyTTL time.Duration
}

// DefaultConfig returns dataloader.DefaultShardConfig(), Prefix
// "elastictrain:" and KeyTTL 7 days; set Shards.DatasetLen and JobID.
func DefaultConfig() Config {
	return Config{Shards: dataloader.DefaultShardConfig(), Prefix: "elastictrain:", KeyTTL: 7 * 24 * time.Hour}
}

// Validate returns an error wrapping dataloader.ErrInvalidConfig naming the
// first bad field, or nil.
func (c Config) Validate() error {
	if err := c.Shards.Validate(); err != nil {
		return err
	}
	switch {
	case c.JobID == "" || strings.ContainsAny(c.JobID, "{}"):
		return fmt.Errorf("%w: redisqueue: JobID %q must be non-empty without braces", dataloader.ErrInvalidConfig, c.JobID)
	case strings.ContainsAny(c.Prefix, "{}"):
		return fmt.Errorf("%w: redisqueue: Prefix %q must not contain braces (the JobID is the keys' hash tag)", dataloader.ErrInvalidConfig, c.Prefix)
	case c.KeyTTL < c.Shards.LeaseTTL:
		return fmt.Errorf("%w: redisqueue: KeyTTL %v shorter than LeaseTTL %v", dataloader.ErrInvalidConfig, c.KeyTTL, c.Shards.LeaseTTL)
	}
	return nil
}

// Queue is a dataloader.ShardQueue in Redis. Safe for concurrent use by
// many goroutines, processes and hosts; it starts no goroutine and holds no
// state besides its configuration, so it needs no Close (the caller owns
// the client).
type Queue struct {
	c   redis.UniversalClient
	cfg Config
}

var (
	_ dataloader.ShardQueue     = (*Queue)(nil)
	_ dataloader.ShardReclaimer = (*Queue)(nil)
)

// New returns a Queue using client. Errors wrap
// dataloader.ErrInvalidConfig (a nil client or a Config failing Validate).
// New does no I/O.
func New(client redis.UniversalClient, cfg Config) (*Queue, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: redisqueue: nil client", dataloader.ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Queue{c: client, cfg: cfg}, nil
}

// Config returns the queue's configuration.
func (q *Queue) Config() Config { return q.cfg }

// keys returns the meta, leases and state keys of epoch.
func (q *Queue) keys(epoch int) []string {
	base := q.cfg.Prefix + "{" + q.cfg.JobID + "}:shards:" + strconv.Itoa(epoch) + ":"
	return []string{base + "meta", base + "leases", base + "state"}
}

// memberLua is shared by the scripts that walk an epoch's leases set:
// shardOf(m, total) is the shard index member m names, or nil when m is
// not the canonical decimal of an index below total; drop(m) removes a
// member that names no lease (garbage, or a shard already acked) from the
// set, and the state fields of a garbage one.
const memberLua = `
local function shardOf(m, total)
  if not string.match(m, '^[0-9]+$') or (#m > 1 and string.sub(m, 1, 1) == '0') then return nil end
  local i = tonumber(m)
  if i >= total then return nil end
  return i
end
local function drop(m, total)
  redis.call('ZREM', KEYS[2], m)
  if not shardOf(m, total) then
    redis.call('HDEL', KEYS[3], 't:' .. m, 'w:' .. m, 'a:' .. m, 'k:' .. m)
  end
end
local function isLease(m, total)
  return shardOf(m, total) ~= nil and redis.call('HEXISTS', KEYS[3], 'k:' .. m) == 0
end
`

// leaseScript: ARGV n, size, ttl ms, worker, key ttl ms.
// Replies: {"ok", shard, token, deadline ms, attempt} | {"busy", earliest
// deadline} | {"done"} | {"mismatch", n, size}. Members of the leases set
// that name no lease are dropped on the way, never granted.
var leaseScript = redis.NewScript(memberLua + `
local n = tonumber(ARGV[1])
local size = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local keyttl = tonumber(ARGV[5])
local total = math.floor((n + size - 1) / size)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = redis.call('HMGET', KEYS[1], 'n', 'size', 'next')
local nxt
if not m[1] then
  redis.call('HSET', KEYS[1], 'n', n, 'size', size, 'total', total, 'next', 0, 'seq', 0, 'acked', 0)
  nxt = 0
else
  nxt = tonumber(m[3])
  if tonumber(m[1]) ~= n or tonumber(m[2]) ~= size or nxt == nil or nxt < 0 or nxt ~= math.floor(nxt) then
    return {'mismatch', tostring(m[1]), tostring(m[2])}
  end
end
local shard
while true do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 1)
  if #expired == 0 then break end
  if isLease(expired[1], total) then
    shard = expired[1]
    break
  end
  drop(expired[1], total)
end
if not shard then
  while nxt < total and redis.call('HEXISTS', KEYS[3], 'k:' .. nxt) == 1 do nxt = nxt + 1 end
  if nxt < total then
    shard = tostring(nxt)
    redis.call('HSET', KEYS[1], 'next', nxt + 1)
  else
    while true do
      local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      if #first == 0 then
        return {'done'}
      end
      if isLease(first[1], total) then
        return {'busy', first[2]}
      end
      drop(first[1], total)
    end
  end
end
local tok = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local deadline = now + ttl
redis.call('ZADD', KEYS[2], deadline, shard)
redis.call('HSET', KEYS[3], 't:' .. shard, tok, 'w:' .. shard, ARGV[4])
local att = redis.call('HINCRBY', KEYS[3], 'a:' .. shard, 1)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], keyttl) end
return {'ok', shard, tok, deadline, att}
`)

// ackScript: ARGV shard, token, key ttl ms. Replies "ok" | "lost".
var ackScript = redis.NewScript(`
local shard = ARGV[1]
local acked = redis.call('HGET', KEYS[3], 'k:' .. shard)
if acked then
  if acked == ARGV[2] then return 'ok' end
  return 'lost'
end
if redis.call('HGET', KEYS[3], 't:' .. shard) ~= ARGV[2] then return 'lost' end
if redis.call('ZREM', KEYS[2], shard) == 0 then return 'lost' end
redis.call('HSET', KEYS[3], 'k:' .. shard, ARGV[2])
redis.call('HDEL', KEYS[3], 't:' .. shard)
redis.call('HINCRBY', KEYS[1], 'acked', 1)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[3])) end
return 'ok'
`)

// renewScript: ARGV shard, token, ttl ms, key ttl ms.
// Replies {"ok", deadline ms, attempt, worker} | {"lost"}.
var renewScript = redis.NewScript(`
local shard = ARGV[1]
if redis.call('HEXISTS', KEYS[3], 'k:' .. shard) == 1 then return {'lost'} end
if redis.call('HGET', KEYS[3], 't:' .. shard) ~= ARGV[2] then return {'lost'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], deadline, shard)
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[4])) end
local s = redis.call('HMGET', KEYS[3], 'a:' .. shard, 'w:' .. shard)
return {'ok', deadline, s[1], s[2]}
`)

// reclaimScript: ARGV key ttl ms, n, size, then the leases to keep as
// "shard:token". Replies {"ok", leases revoked} | {"mismatch", n, size}. A revoked
// shard stays in the leases set with deadline 0 (free before any expired
// lease) and without a token, so the old token's Renew and Ack fail;
// Lease gives it a new one. Members that name no lease (garbage, or a
// shard already acked) are dropped, not revoked: revoking them would make
// Lease pick them first.
var reclaimScript = redis.NewScript(memberLua + `
local n, size = tonumber(ARGV[2]), tonumber(ARGV[3])
local m = redis.call('HMGET', KEYS[1], 'n', 'size')
if m[1] and (tonumber(m[1]) ~= n or tonumber(m[2]) ~= size) then
  return {'mismatch', tostring(m[1]), tostring(m[2])}
end
local total = math.floor((n + size - 1) / size)
local keep = {}
for i = 4, #ARGV do keep[ARGV[i]] = true end
local revoked = 0
local changed = false
for _, shard in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if not isLease(shard, total) then
    drop(shard, total)
    changed = true
  else
    local tok = redis.call('HGET', KEYS[3], 't:' .. shard)
    if tok and not keep[shard .. ':' .. tok] then
      redis.call('ZADD', KEYS[2], 0, shard)
      redis.call('HDEL', KEYS[3], 't:' .. shard)
      revoked = revoked + 1
    end
  end
end
if revoked > 0 or changed then
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], tonumber(ARGV[1])) end
end
return {'ok', revoked}
`)

// progressScript replies {n, size, acked, leased} (n false if the epoch is new).
var progressScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'n', 'size', 'acked')
return {m[1], m[2], m[3], redis.call('ZCARD', KEYS[2])}
`)

// Lease implements dataloader.ShardQueue.
func (q *Queue) Lease(ctx context.Context, epoch int, workerID string) (dataloader.Shard, error) {
	if epoch < 0 {
		return dataloader.Shard{}, fmt.Errorf("%w: redisqueue: epoch %d", dataloader.ErrInvalidConfig, epoch)
	}
	sc := q.cfg.Shards
	reply, err := leaseScript.Run(ctx, q.c, q.keys(epoch),
		sc.DatasetLen, sc.ShardSize, sc.LeaseTTL.Milliseconds(), workerID, q.cfg.KeyTTL.Milliseconds()).Slice()
	if err != nil {
		return dataloader.Shard{}, fmt.Errorf("redisqueue: lease epoch %d: %w", epoch, err)
	}
	r := replyOf(reply)
	switch r.str(0) {
	case "ok":
		idx, tok, deadline, att := r.int(1), r.int(2), r.int(3), r.int(4)
		if r.err != nil || idx < 0 || idx >= int64(sc.NumShards()) || tok <= 0 {
			return dataloader.Shard{}, fmt.Errorf("redisqueue: lease epoch %d: malformed reply %v: %v", epoch, reply, r.err)
		}
		lo, hi := sc.ShardRange(int(idx))
		return dataloader.Shard{
			Epoch: epoch, Index: int(idx), Lo: lo, Hi: hi, Token: uint64(tok), Worker: workerID,
			Attempt: int(att), Deadline: time.UnixMilli(deadline),
		}, nil
	case "busy":
		ms := r.float(1)
		if r.err != nil {
			return dataloader.Shard{}, fmt.Errorf("redisqueue: lease epoch %d: malformed reply %v: %v", epoch, reply, r.err)
		}
		return dataloader.Shard{}, &dataloader.BusyError{Epoch: epoch, RetryAt: time.UnixMilli(int64(ms))}
	case "done":
		return dataloader.Shard{}, fmt.Errorf("%w: epoch %d", dataloader.ErrEpochDone, epoch)
	case "mismatch":
		return dataloader.Shard{}, fmt.Errorf("%w: redisqueue: epoch %d is stored with dataset length %s and shard size %s, this queue has %d and %d",
			dataloader.ErrShardMismatch, epoch, r.str(1), r.str(2), sc.DatasetLen, sc.ShardSize)
	}
	return dataloader.Shard{}, fmt.Errorf("redisqueue: lease epoch %d: unexpected reply %v", epoch, reply)
}

// Renew implements dataloader.ShardQueue.
func (q *Queue) Renew(ctx context.Context, s dataloader.Shard) (dataloader.Shard, error) {
	reply, err := renewScript.Run(ctx, q.c, q.keys(s.Epoch),
		s.Index, strconv.FormatUint(s.Token, 10), q.cfg.Shards.LeaseTTL.Milliseconds(), q.cfg.KeyTTL.Milliseconds()).Slice()
	if err != nil {
		return dataloader.Shard{}, fmt.Errorf("redisqueue: renew epoch %d shard %d: %w", s.Epoch, s.Index, err)
	}
	r := replyOf(reply)
	switch r.str(0) {
	case "ok":
		deadline, att := r.int(1), r.int(2)
		if r.err != nil {
			return dataloader.Shard{}, fmt.Errorf("redisqueue: renew epoch %d shard %d: malformed reply %v: %v", s.Epoch, s.Index, reply, r.err)
		}
		s.Deadline, s.Attempt = time.UnixMilli(deadline), int(att)
		return s, nil
	case "lost":
		return dataloader.Shard{}, fmt.Errorf("%w: epoch %d shard %d token %d", dataloader.ErrLeaseLost, s.Epoch, s.Index, s.Token)
	}
	return dataloader.Shard{}, fmt.Errorf("redisqueue: renew epoch %d shard %d: unexpected reply %v", s.Epoch, s.Index, reply)
}

// Ack implements dataloader.ShardQueue.
func (q *Queue) Ack(ctx context.Context, s dataloader.Shard) error {
	reply, err := ackScript.Run(ctx, q.c, q.keys(s.Epoch),
		s.Index, strconv.FormatUint(s.Token, 10), q.cfg.KeyTTL.Milliseconds()).Text()
	if err != nil {
		return fmt.Errorf("redisqueue: ack epoch %d shard %d: %w", s.Epoch, s.Index, err)
	}
	switch reply {
	case "ok":
		return nil
	case "lost":
		return fmt.Errorf("%w: epoch %d shard %d token %d", dataloader.ErrLeaseLost, s.Epoch, s.Index, s.Token)
	}
	return fmt.Errorf("redisqueue: ack epoch %d shard %d: unexpected reply %q", s.Epoch, s.Index, reply)
}

// Reclaim implements dataloader.ShardReclaimer. It reads every lease of
// the epoch in one script (at most the epoch's shard count), so keep an
// epoch's shards in the thousands, not millions. Members of the epoch's
// leases set that name no lease of this layout (written by something
// else, or by a queue of another shard size) are removed, not counted.
func (q *Queue) Reclaim(ctx context.Context, epoch int, keep []dataloader.Shard) (int, error) {
	sc := q.cfg.Shards
	args := []any{q.cfg.KeyTTL.Milliseconds(), sc.DatasetLen, sc.ShardSize}
	for _, s := range keep {
		if s.Epoch == epoch {
			args = append(args, strconv.Itoa(s.Index)+":"+strconv.FormatUint(s.Token, 10))
		}
	}
	reply, err := reclaimScript.Run(ctx, q.c, q.keys(epoch), args...).Slice()
	if err != nil {
		return 0, fmt.Errorf("redisqueue: reclaim epoch %d: %w", epoch, err)
	}
	r := replyOf(reply)
	switch r.str(0) {
	case "ok":
		n := r.int(1)
		if r.err != nil || n < 0 {
			return 0, fmt.Errorf("redisqueue: reclaim epoch %d: malformed reply %v: %v", epoch, reply, r.err)
		}
		return int(n), nil
	case "mismatch":
		return 0, fmt.Errorf("%w: redisqueue: epoch %d is stored with dataset length %s and shard size %s, this queue has %d and %d",
			dataloader.ErrShardMismatch, epoch, r.str(1), r.str(2), sc.DatasetLen, sc.ShardSize)
	}
	return 0, fmt.Errorf("redisqueue: reclaim epoch %d: unexpected reply %v", epoch, reply)
}

// Progress implements dataloader.ShardQueue.
func (q *Queue) Progress(ctx context.Context, epoch int) (dataloader.ShardProgress, error) {
	reply, err := progressScript.Run(ctx, q.c, q.keys(epoch)).Slice()
	if err != nil {
		return dataloader.ShardProgress{}, fmt.Errorf("redisqueue: progress epoch %d: %w", epoch, err)
	}
	sc := q.cfg.Shards
	p := dataloader.ShardProgress{Total: sc.NumShards()}
	r := replyOf(reply)
	if len(reply) != 4 {
		return p, fmt.Errorf("redisqueue: progress epoch %d: unexpected reply %v", epoch, reply)
	}
	if reply[0] != nil {
		n, size, acked, leased := r.int(0), r.int(1), r.int(2), r.int(3)
		if r.err != nil {
			return p, fmt.Errorf("redisqueue: progress epoch %d: malformed reply %v: %v", epoch, reply, r.err)
		}
		if n != int64(sc.DatasetLen) || size != int64(sc.ShardSize) {
			return p, fmt.Errorf("%w: redisqueue: epoch %d is stored with dataset length %d and shard size %d, this queue has %d and %d",
				dataloader.ErrShardMismatch, epoch, n, size, sc.DatasetLen, sc.ShardSize)
		}
		if acked < 0 || leased < 0 || acked+leased > int64(p.Total) {
			return p, fmt.Errorf("redisqueue: progress epoch %d: corrupt counters (%d acked, %d leased of %d shards)",
				epoch, acked, leased, p.Total)
		}
		p.Acked, p.Leased = int(acked), int(leased)
	}
	p.Pending = p.Total - p.Acked - p.Leased
	return p, nil
}

// reply reads a script's array reply without ever panicking: the first
// bad element sets err and later reads return zero values.
type reply struct {
	v   []any
	err error
}

func replyOf(v []any) *reply { return &reply{v: v} }

func (r *reply) at(i int) any {
	if i >= len(r.v) {
		if r.err == nil {
			r.err = fmt.Errorf("reply has %d elements, want more than %d", len(r.v), i)
		}
		return nil
	}
	return r.v[i]
}

func (r *reply) str(i int) string {
	switch x := r.at(i).(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return ""
}

func (r *reply) int(i int) int64 {
	switch x := r.at(i).(type) {
	case int64:
		return x
	case string:
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("element %d: %w", i, err)
		}
		return v
	}
	if r.err == nil {
		r.err = errors.New("element " + strconv.Itoa(i) + " is not an integer")
	}
	return 0
}

func (r *reply) float(i int) float64 {
	switch x := r.at(i).(type) {
	case int64:
		return float64(x)
	case string:
		v, err := strconv.ParseFloat(x, 64)
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("element %d: %w", i, err)
		}
		return v
	}
	if r.err == nil {
		r.err = errors.New("element " + strconv.Itoa(i) + " is not a number")
	}
	return 0
}
