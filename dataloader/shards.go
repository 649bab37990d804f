package dataloader

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// ShardConfig describes how each epoch is cut into shards for dynamic
// sharding (see ShardQueue): shard i of an epoch covers positions
// [i*ShardSize, min((i+1)*ShardSize, DatasetLen)) of the epoch's order.
type ShardConfig struct {
	// DatasetLen is the number of samples per epoch. Must be > 0; no default.
	DatasetLen int
	// ShardSize is the number of samples per shard (the last shard of an
	// epoch may be smaller). Must be > 0. Default 1024.
	ShardSize int
	// LeaseTTL is how long a lease lasts before the shard returns to the
	// queue, unless renewed or acked. Must be >= 1 ms. Default 30 s.
	LeaseTTL time.Duration
}

// DefaultShardConfig returns ShardSize 1024 and LeaseTTL 30 s; set
// DatasetLen.
func DefaultShardConfig() ShardConfig {
	return ShardConfig{ShardSize: 1024, LeaseTTL: 30 * time.Second}
}

// Validate returns an error wrapping ErrInvalidConfig naming the first bad
// field, or nil.
func (c ShardConfig) Validate() error {
	switch {
	case c.DatasetLen <= 0:
		return fmt.Errorf("%w: DatasetLen %d, want > 0", ErrInvalidConfig, c.DatasetLen)
	case c.ShardSize <= 0:
		return fmt.Errorf("%w: ShardSize %d, want > 0", ErrInvalidConfig, c.ShardSize)
	case c.LeaseTTL < time.Millisecond:
		return fmt.Errorf("%w: LeaseTTL %v, want >= 1ms", ErrInvalidConfig, c.LeaseTTL)
	}
	return nil
}

// NumShards returns the number of shards per epoch:
// ceil(DatasetLen/ShardSize), or 0 for an invalid config.
func (c ShardConfig) NumShards() int {
	if c.DatasetLen <= 0 || c.ShardSize <= 0 {
		return 0
	}
	return (c.DatasetLen + c.ShardSize - 1) / c.ShardSize
}

// ShardRange returns the positions [lo, hi) of shard i, or (0, 0) for i
// outside 0..NumShards()-1.
func (c ShardConfig) ShardRange(i int) (lo, hi int) {
	if i < 0 || i >= c.NumShards() {
		return 0, 0
	}
	lo = i * c.ShardSize
	return lo, min(lo+c.ShardSize, c.DatasetLen)
}

// Shard is a lease on one shard of an epoch: the positions [Lo, Hi) of
// that epoch's order (Order(seed, Epoch, DatasetLen), or the identity
// without shuffle), held by Worker until Deadline.
type Shard struct {
	// Epoch is the epoch the shard belongs to.
	Epoch int
	// Index is the shard's index within the epoch, 0..NumShards()-1.
	Index int
	// Lo and Hi are the positions [Lo, Hi) of the epoch's order it covers.
	Lo, Hi int
	// Token identifies this lease (unique within the epoch); Ack and Renew
	// must present it.
	Token uint64
	// Worker is the worker ID the lease was granted to.
	Worker string
	// Attempt is 1 the first time the shard is leased in its epoch and
	// grows by one each time it is leased again after a lease expired.
	Attempt int
	// Deadline is when the lease expires, by the queue's clock (the Redis
	// server's clock for the Redis queue).
	Deadline time.Time
}

// Indices returns the dataset indices the shard covers, given its epoch's
// order: order[Lo:Hi] (capacity-limited; do not modify). It returns nil if
// the order is too short for the shard.
func (s Shard) Indices(order []int) []int {
	if s.Lo < 0 || s.Hi < s.Lo || s.Hi > len(order) {
		return nil
	}
	return order[s.Lo:s.Hi:s.Hi]
}

// ShardProgress counts the shards of one epoch by state.
type ShardProgress struct {
	// Total is the number of shards in the epoch.
	Total int
	// Acked is the number of shards acked: done, exactly once each.
	Acked int
	// Leased is the number of shards held by a lease, expired (or revoked
	// by ShardReclaimer.Reclaim) or not, and not acked.
	Leased int
	// Pending is the number never leased yet: Total - Acked - Leased.
	Pending int
}

// Done reports whether every shard of the epoch is acked.
func (p ShardProgress) Done() bool { return p.Total > 0 && p.Acked == p.Total }

// BusyError is returned by ShardQueue.Lease when every shard not yet acked
// is under a live lease. RetryAt is the earliest lease deadline: the
// earliest time a shard could come back. errors.Is(err, ErrNoShardFree)
// holds.
type BusyError struct {
	// Epoch is the epoch asked for.
	Epoch int
	// RetryAt is the earliest deadline among the live leases (queue clock).
	RetryAt time.Time
}

// Error implements error.
func (e *BusyError) Error() string {
	return fmt.Sprintf("%v (epoch %d; earliest lease expires %s)", ErrNoShardFree, e.Epoch, e.RetryAt.Format(time.RFC3339Nano))
}

// Unwrap returns ErrNoShardFree.
func (e *BusyError) Unwrap() error { return ErrNoShardFree }

// ShardQueue hands out the shards of each epoch to workers under leases
// (dynamic data sharding, as in DLRover): a worker leases a shard, trains
// on its samples, and acks it once its samples are applied; a shard whose
// lease expires (its worker died or stalled) is leased again to another
// worker; faster workers simply lease more shards. Exactly once counts
// acked shards: each shard of an epoch is acked exactly once, and a worker
// whose lease was lost gets ErrLeaseLost from Ack (its work on the shard
// does not count).
//
// The layout of an epoch's shards is the queue's ShardConfig; epochs are
// independent and created on first use. Implementations must be safe for
// concurrent use by many goroutines and processes, and every method's
// effect must be atomic.
type ShardQueue interface {
	// Lease grants workerID a lease of LeaseTTL on one shard of epoch:
	// first a shard whose lease has expired (earliest deadline first), then
	// the next never-leased shard in index order. Errors: ErrEpochDone when
	// every shard of the epoch is acked; a *BusyError (ErrNoShardFree)
	// when the rest are all under live leases; ErrShardMismatch when the
	// stored layout differs from this queue's ShardConfig; ctx or
	// transport errors.
	Lease(ctx context.Context, epoch int, workerID string) (Shard, error)
	// Renew extends s's lease to LeaseTTL from now and returns the shard
	// with its new Deadline. It succeeds while s.Token is the shard's
	// current lease (even past the deadline, if nobody leased it again).
	// Errors: ErrLeaseLost, ctx or transport errors.
	Renew(ctx context.Context, s Shard) (Shard, error)
	// Ack marks s done. It succeeds while s.Token is the shard's current
	// lease (even past the deadline, if nobody leased it again), and again
	// (idempotently, counted once) if the shard was already acked with
	// the same token. Errors: ErrLeaseLost, ctx or transport errors.
	Ack(ctx context.Context, s Shard) error
	// Progress counts epoch's shards by state.
	Progress(ctx context.Context, epoch int) (ShardProgress, error)
}

// ShardReclaimer is the optional capability of a ShardQueue to take leases
// back at once instead of waiting for them to expire, found by type
// assertion (MemoryQueue and the Redis queue have it). A job whose workers
// agree on which leases are still theirs (e.g. the leases recorded in the
// commit a new round restores) uses it when a round forms after a failure:
// the shards a dead worker held return to the queue at once, not LeaseTTL
// later.
type ShardReclaimer interface {
	// Reclaim revokes every lease of epoch that is not acked and not in
	// keep (matched by Index and Token): each such shard is free at once,
	// ahead of any other (as if its lease had expired long ago), and is
	// granted by the next Lease with a new token and the next Attempt; the
	// revoked token's Renew and Ack fail with ErrLeaseLost from then on,
	// so the old holder's late ack is refused. Acked shards, shards in
	// keep and never-leased shards are untouched. It returns how many
	// leases it revoked (a lease already revoked is not counted again).
	// The effect is atomic. Errors: ctx or transport errors.
	Reclaim(ctx context.Context, epoch int, keep []Shard) (int, error)
}

// LeaseWait calls q.Lease until it grants a shard, waiting between tries
// while every remaining shard is leased (until the earliest deadline, or
// poll, whichever is sooner; poll <= 0 means 100 ms). It returns
// ErrEpochDone when the epoch is finished, and any other error at once;
// ctx's error (wrapped) if ctx ends first.
func LeaseWait(ctx context.Context, q ShardQueue, epoch int, workerID string, poll time.Duration) (Shard, error) {
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		s, err := q.Lease(ctx, epoch, workerID)
		var busy *BusyError
		if err == nil || !errors.As(err, &busy) {
			return s, err
		}
		wait := poll
		if d := time.Until(busy.RetryAt); d > 0 && d < wait {
			wait = d
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return Shard{}, fmt.Errorf("dataloader: waiting for a shard of epoch %d: %w", epoch, ctx.Err())
		case <-timer.C:
		}
	}
}

// MemoryQueue is an in-process ShardQueue with the same semantics as the
// Redis one (package dataloader/redisqueue), for unit tests and
// single-process jobs. Safe for concurrent use.
type MemoryQueue struct {
	cfg ShardConfig
	now func() time.Time

	mu     sync.Mutex
	epochs map[int]*memEpoch
}

type memLease struct {
	token    uint64
	worker   string
	deadline time.Time
}

type memEpoch struct {
	next     int              // next never-leased shard index
	seq      uint64           // last token issued
	leases   map[int]memLease // shard -> live or expired lease, not acked
	acked    map[int]uint64   // shard -> token it was acked with
	attempts map[int]int      // shard -> times leased
}

var (
	_ ShardQueue     = (*MemoryQueue)(nil)
	_ ShardReclaimer = (*MemoryQueue)(nil)
)

// NewMemoryQueue returns an empty MemoryQueue for cfg using the wall
// clock. Errors wrap ErrInvalidConfig.
func NewMemoryQueue(cfg ShardConfig) (*MemoryQueue, error) {
	return NewMemoryQueueWithClock(cfg, time.Now)
}

// NewMemoryQueueWithClock is NewMemoryQueue with an injected clock (now must
// be safe for concurrent use), so tests can expire leases without waiting.
func NewMemoryQueueWithClock(cfg ShardConfig, now func() time.Time) (*MemoryQueue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &MemoryQueue{cfg: cfg, now: now, epochs: map[int]*memEpoch{}}, nil
}

// Config returns the queue's ShardConfig.
func (q *MemoryQueue) Config() ShardConfig { return q.cfg }

func (q *MemoryQueue) epoch(e int) *memEpoch {
	st := q.epochs[e]
	if st == nil {
		st = &memEpoch{leases: map[int]memLease{}, acked: map[int]uint64{}, attempts: map[int]int{}}
		q.epochs[e] = st
	}
	return st
}

func (q *MemoryQueue) shard(e, i int, l memLease, attempt int) Shard {
	lo, hi := q.cfg.ShardRange(i)
	return Shard{Epoch: e, Index: i, Lo: lo, Hi: hi, Token: l.token, Worker: l.worker, Attempt: attempt, Deadline: l.deadline}
}

// Lease implements ShardQueue.
func (q *MemoryQueue) Lease(ctx context.Context, epoch int, workerID string) (Shard, error) {
	if err := ctx.Err(); err != nil {
		return Shard{}, err
	}
	if epoch < 0 {
		return Shard{}, fmt.Errorf("%w: epoch %d", ErrInvalidConfig, epoch)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	st := q.epoch(epoch)
	pick, found := -1, false
	var earliest time.Time
	// Expired leases first, earliest deadline first (ties: lowest index).
	idx := make([]int, 0, len(st.leases))
	for i := range st.leases {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		l := st.leases[i]
		if !l.deadline.After(now) && (!found || l.deadline.Before(earliest)) {
			pick, found, earliest = i, true, l.deadline
		}
	}
	if !found {
		if st.next < q.cfg.NumShards() {
			pick = st.next
			st.next++
		} else if len(st.leases) == 0 {
			return Shard{}, fmt.Errorf("%w: epoch %d", ErrEpochDone, epoch)
		} else {
			var retry time.Time
			for _, l := range st.leases {
				if retry.IsZero() || l.deadline.Before(retry) {
					retry = l.deadline
				}
			}
			return Shard{}, &BusyError{Epoch: epoch, RetryAt: retry}
		}
	}
	st.seq++
	l := memLease{token: st.seq, worker: workerID, deadline: now.Add(q.cfg.LeaseTTL)}
	st.leases[pick] = l
	st.attempts[pick]++
	return q.shard(epoch, pick, l, st.attempts[pick]), nil
}

// Renew implements ShardQueue.
func (q *MemoryQueue) Renew(ctx context.Context, s Shard) (Shard, error) {
	if err := ctx.Err(); err != nil {
		return Shard{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.epochs[s.Epoch]
	if st == nil {
		return Shard{}, fmt.Errorf("%w: epoch %d shard %d: no such lease", ErrLeaseLost, s.Epoch, s.Index)
	}
	l, ok := st.leases[s.Index]
	if !ok || l.token != s.Token {
		return Shard{}, fmt.Errorf("%w: epoch %d shard %d token %d", ErrLeaseLost, s.Epoch, s.Index, s.Token)
	}
	l.deadline = q.now().Add(q.cfg.LeaseTTL)
	st.leases[s.Index] = l
	return q.shard(s.Epoch, s.Index, l, st.attempts[s.Index]), nil
}

// Ack implements ShardQueue.
func (q *MemoryQueue) Ack(ctx context.Context, s Shard) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.epochs[s.Epoch]
	if st == nil {
		return fmt.Errorf("%w: epoch %d shard %d: no such lease", ErrLeaseLost, s.Epoch, s.Index)
	}
	if tok, ok := st.acked[s.Index]; ok {
		if tok == s.Token {
			return nil // a repeated ack of the same lease
		}
		return fmt.Errorf("%w: epoch %d shard %d was acked under another lease", ErrLeaseLost, s.Epoch, s.Index)
	}
	l, ok := st.leases[s.Index]
	if !ok || l.token != s.Token {
		return fmt.Errorf("%w: epoch %d shard %d token %d", ErrLeaseLost, s.Epoch, s.Index, s.Token)
	}
	delete(st.leases, s.Index)
	st.acked[s.Index] = s.Token
	return nil
}

// Reclaim implements ShardReclaimer.
func (q *MemoryQueue) Reclaim(ctx context.Context, epoch int, keep []Shard) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.epochs[epoch]
	if st == nil {
		return 0, nil
	}
	kept := map[int]uint64{}
	for _, s := range keep {
		if s.Epoch == epoch {
			kept[s.Index] = s.Token
		}
	}
	n := 0
	for i, l := range st.leases {
		if tok, ok := kept[i]; (ok && tok == l.token) || l.token == 0 {
			continue
		}
		// Token 0 is never issued, so the old holder's Renew and Ack fail;
		// the zero deadline puts the shard ahead of every expired lease.
		st.leases[i] = memLease{}
		n++
	}
	return n, nil
}

// Progress implements ShardQueue.
func (q *MemoryQueue) Progress(ctx context.Context, epoch int) (ShardProgress, error) {
	if err := ctx.Err(); err != nil {
		return ShardProgress{}, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	p := ShardProgress{Total: q.cfg.NumShards()}
	if st := q.epochs[epoch]; st != nil {
		p.Acked, p.Leased = len(st.acked), len(st.leases)
	}
	p.Pending = p.Total - p.Acked - p.Leased
	return p, nil
}
