package dataloader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"
)

// LeaseQueue is what a LeasedLoader needs of its shard queue: leases that a
// new round can revoke at once. MemoryQueue and redisqueue.Queue are
// LeaseQueues.
type LeaseQueue interface {
	ShardQueue
	ShardReclaimer
}

// LeasedConfig holds a LeasedLoader's settings. Start from
// DefaultLeasedConfig and change what you need; NewLeased calls Validate.
type LeasedConfig struct {
	// Shards is the layout of each epoch and the lease TTL; it must be the
	// queue's. Shards.DatasetLen has no default and must equal the
	// dataset's Len. Keep Shards.LeaseTTL well above the longest step plus
	// the time a failed round takes to recover: a committed lease that
	// expires before the next round adopts it, or a lease that expires
	// during a step, ends a round (see Restore). Default
	// DefaultShardConfig().
	Shards ShardConfig
	// GlobalBatch is the number of samples of one global batch, summed
	// over the ranks (as planned: a rank that finds no shard free serves
	// fewer). Must be > 0 and at least the world size. Default 64.
	GlobalBatch int
	// Seed keys each epoch's order (see Order). Default 0.
	Seed uint64
	// Shuffle selects Order(Seed, epoch, n) as each epoch's order when
	// true, the identity when false. Default true.
	Shuffle bool
	// WorkerID names this process as lease holder in the queue (the
	// member ID); only for people reading the queue, since tokens decide
	// who holds a lease. Default: "leased-" and 8 random hex digits.
	WorkerID string
	// Epochs, when > 0, is the number of epochs the job trains
	// (trainer.Config.Epochs): from epoch Epochs on, Next serves empty
	// batches without leasing. 0 leases on for as long as Next is called.
	// Must be >= 0. Default 0.
	Epochs int
	// LeaseAhead is the number of steps whose samples State leases ahead
	// for this rank (so that they are part of the commit, and the steps up
	// to the next commit rarely wait for the queue): set it to the
	// trainer's CommitEvery. 0 leases only in Next, when a step needs a
	// shard. Must be >= 0. Default 1.
	LeaseAhead int
	// Balance splits each global batch over the ranks by their measured
	// speed, so a slow rank takes fewer samples and the step waits less
	// for it: a Balancer, the trainer's (Config.Balance), fed every
	// StepOutcome of the round, decides the split, and WeightedShares
	// cuts it. False splits it equally (ShareOf). Default false.
	Balance bool
	// BusyWait bounds how long Next waits for a shard when every shard
	// left is leased and the last global batch trained nothing, so that a
	// pending membership change is still taken at a step boundary. Must be
	// > 0. Default 250 ms.
	BusyWait time.Duration
	// Poll is the interval between lease tries while Next waits (shorter
	// when a lease is due to expire sooner). Must be > 0. Default 50 ms.
	Poll time.Duration
	// RenewEvery is how often Next and State renew this rank's leases.
	// Must be > 0 and below Shards.LeaseTTL. Default Shards.LeaseTTL/4.
	RenewEvery time.Duration
	// Logger receives warnings (leases found lost at Restore) and the
	// count of leases revoked. Default: discard.
	Logger *slog.Logger
}

// DefaultLeasedConfig returns DefaultShardConfig() (set Shards.DatasetLen),
// GlobalBatch 64, Seed 0, Shuffle true, a random WorkerID, Epochs 0,
// LeaseAhead 1, Balance false, BusyWait 250 ms, Poll 50 ms, RenewEvery 0
// (LeaseTTL/4 when the loader is made).
func DefaultLeasedConfig() LeasedConfig {
	return LeasedConfig{Shards: DefaultShardConfig(), GlobalBatch: 64, Shuffle: true, LeaseAhead: 1,
		BusyWait: 250 * time.Millisecond, Poll: 50 * time.Millisecond}
}

// Validate returns an error wrapping ErrInvalidConfig naming the first bad
// field, or nil. A zero RenewEvery and an empty WorkerID are valid (NewLeased
// fills them in).
func (c LeasedConfig) Validate() error {
	if err := c.Shards.Validate(); err != nil {
		return err
	}
	switch {
	case c.GlobalBatch <= 0:
		return fmt.Errorf("%w: GlobalBatch %d, want > 0", ErrInvalidConfig, c.GlobalBatch)
	case c.Epochs < 0:
		return fmt.Errorf("%w: Epochs %d, want >= 0", ErrInvalidConfig, c.Epochs)
	case c.LeaseAhead < 0:
		return fmt.Errorf("%w: LeaseAhead %d, want >= 0", ErrInvalidConfig, c.LeaseAhead)
	case c.BusyWait <= 0:
		return fmt.Errorf("%w: BusyWait %v, want > 0", ErrInvalidConfig, c.BusyWait)
	case c.Poll <= 0:
		return fmt.Errorf("%w: Poll %v, want > 0", ErrInvalidConfig, c.Poll)
	case c.RenewEvery < 0 || c.RenewEvery >= c.Shards.LeaseTTL:
		return fmt.Errorf("%w: RenewEvery %v, want 0 (LeaseTTL/4) or in (0, LeaseTTL %v)", ErrInvalidConfig, c.RenewEvery, c.Shards.LeaseTTL)
	}
	return nil
}

// epochBits is how many low bits of a queue epoch number hold the epoch;
// the bits above hold the generation (see QueueEpoch).
const epochBits = 20

// LeasedLoader serves this rank's share of each global batch from shards
// of the epoch leased from a LeaseQueue (DLRover's dynamic data sharding),
// with the exactly-once protocol of a synchronous elastic job inside: it
// is the driver.StatefulLoader (with StateMerger, CommitListener and
// LineageSetter) for leased shards. See the package documentation,
// section "Leased loader", for the protocol.
//
// Its methods must not be called concurrently; the training loop calls
// them in the order of the trainer's contract: SetLineage and Restore at the start
// of each round, then per step Next and Stepped, and at a commit State and,
// once every rank holds the commit, Committed. MergeStates is a pure
// function, safe from any goroutine. An error from any call but
// MergeStates leaves the loader needing a Restore (ErrOutOfOrder until
// then). A LeasedLoader starts no goroutine and needs no Close.
type LeasedLoader[T, B any] struct {
	q       LeaseQueue
	ds      Dataset[T]
	collate CollateFunc[T, B]
	cfg     LeasedConfig
	log     *slog.Logger
	ns      int // shards per epoch

	lineage    uint64 // given by SetLineage
	lineageSet bool

	// The live state, installed by Restore.
	ready      bool // restored, and no error since
	rank, size int
	hist       uint64 // lineage of the history served
	gen        int    // the queue generation of hist
	epoch      int
	epochStep  int    // global batches of the epoch that trained samples
	order      []int  // the epoch's order
	consumed   []byte // bitmap: consumed in the restored history or by this rank since
	mine       []openLease
	done       []Shard     // consumed by this rank, not yet acked
	resume     map[int]int // shard -> position: trained that far in the history, held by nobody
	bal        Balancer    // Balance: the split of the global batch by speed
	weights    []float64   // Balance: the split's fractions by rank; nil: equal shares
	work       []float64   // Balance: scratch, the step's samples by rank
	wait       bool        // the last global batch trained nothing: wait for a lease (bounded)
	lastRenew  time.Time
	pending    bool // a batch was served and not yet Stepped
	taken      int  // its samples
	tookDone   bool // its EpochDone
	doneState  int  // len(done) at the last State: the leases Committed acks
	samples    []T
	sharesBuf  []int
	sharesSize int
}

type openLease struct {
	s   Shard
	pos int // next position of the epoch's order to serve
}

// NewLeased returns a LeasedLoader over ds, batching with collate, that
// leases shards from q. ds.Len() is read once and must equal
// cfg.Shards.DatasetLen; a q with a Config() ShardConfig method (MemoryQueue)
// must have cfg.Shards' layout. Errors wrap ErrInvalidConfig. It does no
// I/O; call Restore before Next.
func NewLeased[T, B any](q LeaseQueue, ds Dataset[T], collate func(ctx context.Context, samples []T, indices []int) (B, error), cfg LeasedConfig) (*LeasedLoader[T, B], error) {
	if q == nil || ds == nil || collate == nil {
		return nil, fmt.Errorf("%w: nil queue, dataset or collate function", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if n := ds.Len(); n != cfg.Shards.DatasetLen {
		return nil, fmt.Errorf("%w: dataset has %d samples, Shards.DatasetLen is %d", ErrInvalidConfig, n, cfg.Shards.DatasetLen)
	}
	if qc, ok := q.(interface{ Config() ShardConfig }); ok {
		if c := qc.Config(); c.DatasetLen != cfg.Shards.DatasetLen || c.ShardSize != cfg.Shards.ShardSize {
			return nil, fmt.Errorf("%w: queue layout %d samples in shards of %d, loader %d in shards of %d",
				ErrInvalidConfig, c.DatasetLen, c.ShardSize, cfg.Shards.DatasetLen, cfg.Shards.ShardSize)
		}
	}
	if cfg.RenewEvery == 0 {
		cfg.RenewEvery = max(cfg.Shards.LeaseTTL/4, time.Nanosecond)
	}
	if cfg.WorkerID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cfg.WorkerID = "leased-" + hex.EncodeToString(b[:])
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &LeasedLoader[T, B]{q: q, ds: ds, collate: collate, cfg: cfg, log: log, ns: cfg.Shards.NumShards()}, nil
}

// Config returns the loader's configuration, with NewLeased's defaults
// filled in.
func (l *LeasedLoader[T, B]) Config() LeasedConfig { return l.cfg }

// SetLineage gives the lineage ID of the state the next Restore installs
// (driver.LineageSetter; the trainer's AuditEntry.Gen): the same for every
// commit of one history, new when the job starts fresh or restores a
// durable checkpoint. A state of another lineage is continued in a new
// generation of the queue (a fork: see the package documentation), so the
// acks of an abandoned history are never found. Without SetLineage, the
// lineage is the restored state's (0 for a fresh start), and Restore
// returns ErrHistoryDiverged if the queue holds acks the state cannot
// explain.
func (l *LeasedLoader[T, B]) SetLineage(lineage uint64) { l.lineage, l.lineageSet = lineage, true }

// QueueEpoch returns the queue's epoch number that holds the shards of
// epoch e in the generation served since the last Restore: the generation
// (a hash of the lineage) in the high bits, e in the low 20. Use it with
// ShardQueue.Progress.
func (l *LeasedLoader[T, B]) QueueEpoch(e int) int { return l.gen<<epochBits | e }

// genOf maps a lineage to a queue generation that leaves room for the
// epoch below it in a non-negative int.
func genOf(lineage uint64) int {
	bits := strconv.IntSize - 1 - epochBits
	return int(mix64(lineage^0x6c6561736564) & (1<<bits - 1))
}

func (l *LeasedLoader[T, B]) fail(err error) error {
	l.ready = false
	return err
}

func (l *LeasedLoader[T, B]) setEpoch(e int) {
	l.epoch, l.epochStep = e, 0
	if l.cfg.Shuffle {
		l.order = Order(l.cfg.Seed, e, l.cfg.Shards.DatasetLen)
	} else {
		l.order = identityOrder(l.cfg.Shards.DatasetLen)
	}
	l.consumed = make([]byte, bitmapLen(l.ns))
	l.mine, l.done, l.resume = nil, nil, map[int]int{}
}

func (l *LeasedLoader[T, B]) shardOf(e leaseEntry) Shard {
	lo, hi := l.cfg.Shards.ShardRange(e.index)
	return Shard{Epoch: l.QueueEpoch(l.epoch), Index: e.index, Lo: lo, Hi: hi, Token: e.token, Worker: l.cfg.WorkerID}
}

// Restore installs state (a MergeStates result, or nil or empty for a fresh start)
// for rank of size ranks (driver.StatefulLoader). It forgets whatever
// this process leased or served since, hands the state's leases in
// progress to the ranks (lease i to rank i mod size, renewed here), and on
// rank 0, before returning: re-acks the state's consumed leases, revokes
// (Reclaim) every other lease of the state's epoch and the next in the
// queue, and checks that the queue holds no ack the state cannot explain.
// Every rank must call it, and no rank may lease (Next, State) until every
// rank's Restore returned: the trainer holds a barrier in between.
//
// A state of another lineage than SetLineage's continues in a new
// generation of the queue: its consumed shards are not served again when
// they are leased there (they are acked at the next commit), and its
// leases in progress resume at their position. A committed lease found
// lost here (it expired, or the queue lost its keys) is treated the same
// way, so the samples it covers are still served exactly once. Restore is
// idempotent.
//
// Errors: ErrInvalidWorld (rank, size, or a world larger than
// GlobalBatch), ErrCorruptState or ErrCursorMismatch for the state,
// ErrHistoryDiverged, the queue's errors.
func (l *LeasedLoader[T, B]) Restore(ctx context.Context, state []byte, rank, size int) error {
	l.ready = false
	if size < 1 || rank < 0 || rank >= size {
		return fmt.Errorf("%w: rank %d of %d", ErrInvalidWorld, rank, size)
	}
	if size > l.cfg.GlobalBatch {
		return fmt.Errorf("%w: %d ranks share a global batch of %d samples; every rank needs one", ErrInvalidWorld, size, l.cfg.GlobalBatch)
	}
	sc := l.cfg.Shards
	st := &leasedState{kind: kindMerged, shuffle: l.cfg.Shuffle, lineage: l.lineage, seed: l.cfg.Seed,
		datasetLen: sc.DatasetLen, shardSize: sc.ShardSize, size: 1, consumed: make([]byte, bitmapLen(l.ns))}
	if len(state) > 0 {
		var err error
		if st, err = decodeState(state, kindMerged, sc, l.cfg.Seed, l.cfg.Shuffle); err != nil {
			return err
		}
	}
	fork := l.lineageSet && st.lineage != l.lineage
	l.rank, l.size, l.hist = rank, size, st.lineage
	if fork {
		l.hist = l.lineage
	}
	l.gen = genOf(l.hist)
	l.setEpoch(st.epoch)
	l.epochStep = st.epochStep
	copy(l.consumed, st.consumed)
	for _, e := range st.resume {
		l.resume[e.index] = e.pos
	}
	var keep []Shard
	for i, e := range st.open {
		s := l.shardOf(e)
		switch {
		case !fork && i%size == rank:
			l.mine = append(l.mine, openLease{s: s, pos: e.pos})
		case e.pos > s.Lo:
			l.resume[e.index] = e.pos
		}
		if !fork {
			keep = append(keep, s)
		}
	}
	if rank == 0 {
		if err := l.cleanQueue(ctx, st, fork, keep); err != nil {
			return err
		}
	}
	mine := l.mine[:0]
	for _, o := range l.mine {
		s, err := l.q.Renew(ctx, o.s)
		if errors.Is(err, ErrLeaseLost) {
			l.log.Warn("committed data shard lease lost before this round adopted it; whoever leases the shard resumes it",
				"epoch", l.epoch, "shard", o.s.Index, "position", o.pos, "err", err)
			if o.pos > o.s.Lo {
				l.resume[o.s.Index] = o.pos
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("dataloader: renewing committed lease of shard %d: %w", o.s.Index, err)
		}
		o.s.Deadline = s.Deadline
		mine = append(mine, o)
	}
	l.mine = mine
	l.lastRenew = time.Now()
	l.bal.Reset(size)
	l.weights, l.sharesBuf = nil, nil
	l.wait, l.pending, l.taken, l.tookDone, l.doneState = false, false, 0, false, 0
	l.ready = true
	return nil
}

// cleanQueue is rank 0's part of Restore: re-ack the committed consumed
// leases, revoke every lease of the epoch and the next that the commit
// does not hold, and check that every ack in the queue is explained by the
// committed consumed shards.
func (l *LeasedLoader[T, B]) cleanQueue(ctx context.Context, st *leasedState, fork bool, keep []Shard) error {
	if !fork {
		for _, e := range st.done {
			err := l.q.Ack(ctx, l.shardOf(e))
			if errors.Is(err, ErrLeaseLost) {
				// Consumed in the history: whoever leases it again does not
				// serve it and acks it at the next commit.
				l.log.Warn("committed consumed data shard could not be acked (its lease was lost); it is acked when leased again",
					"epoch", l.epoch, "shard", e.index, "err", err)
				continue
			}
			if err != nil {
				return fmt.Errorf("dataloader: acking committed shard %d of epoch %d: %w", e.index, l.epoch, err)
			}
		}
	}
	// Every lease not in the commit was taken after it, by anyone, dead or
	// alive, in its epoch or (once every shard of that epoch was acked) in
	// the next: none of its samples is in the restored history.
	for _, e := range []int{l.epoch, l.epoch + 1} {
		n, err := l.q.Reclaim(ctx, l.QueueEpoch(e), keep)
		if err != nil {
			return fmt.Errorf("dataloader: revoking the leases taken after the restored commit: %w", err)
		}
		if n > 0 {
			l.log.Info("revoked data shard leases taken after the restored commit", "epoch", e, "leases", n)
		}
	}
	// Acks happen only for commits every rank holds, and a round restores
	// the newest of those: every ack of this generation is of a shard the
	// state counts as consumed.
	p, err := l.q.Progress(ctx, l.QueueEpoch(l.epoch))
	if err != nil {
		return fmt.Errorf("dataloader: progress of epoch %d: %w", l.epoch, err)
	}
	next, err := l.q.Progress(ctx, l.QueueEpoch(l.epoch+1))
	if err != nil {
		return fmt.Errorf("dataloader: progress of epoch %d: %w", l.epoch+1, err)
	}
	if c := popcount(st.consumed); p.Acked > c || next.Acked > 0 {
		return fmt.Errorf("%w: epoch %d has %d shards acked, the restored state consumed %d; epoch %d has %d acked (lineage %d)",
			ErrHistoryDiverged, l.epoch, p.Acked, c, l.epoch+1, next.Acked, l.hist)
	}
	return nil
}

// shares returns the samples of each rank's share of a global batch: by
// the Balancer's fractions (Balance, once it moved the split), or equal
// (ShareOf). Kept until the split or the world size changes.
func (l *LeasedLoader[T, B]) shares() []int {
	if l.sharesBuf != nil && l.sharesSize == l.size {
		return l.sharesBuf
	}
	if l.weights != nil {
		l.sharesBuf = WeightedShares(l.cfg.GlobalBatch, l.weights)
	} else {
		l.sharesBuf = make([]int, l.size)
		for r := range l.sharesBuf {
			lo, hi := ShareOf(l.cfg.GlobalBatch, r, l.size)
			l.sharesBuf[r] = hi - lo
		}
	}
	l.sharesSize = l.size
	return l.sharesBuf
}

func (l *LeasedLoader[T, B]) finished() bool { return l.cfg.Epochs > 0 && l.epoch >= l.cfg.Epochs }

// Next returns this rank's share of the next global batch
// (driver.StatefulLoader): up to its share of GlobalBatch samples (equal
// shares, or by speed with Balance) from the leases it holds, leasing more
// as it needs. It serves fewer when no shard is free, and none, with
// Batch.EpochDone set, when the queue says every shard of the epoch is
// acked and this rank holds none. When the last global batch trained
// nothing it waits up to BusyWait for a shard. Batch.Indices is a new
// slice; Step counts the global batches of the epoch that trained
// samples; GlobalSize and Offset are as planned (GlobalBatch, the shares
// of lower ranks); Next is the zero Cursor. Every rank's Batch.Epoch moves
// on at the same step (see Stepped).
//
// Errors: ErrOutOfOrder, ErrLeaseLost (a lease expired and was taken by
// another worker: the round must restore), the queue's, the dataset's and
// collate's errors, ctx's.
func (l *LeasedLoader[T, B]) Next(ctx context.Context) (Batch[B], error) {
	if !l.ready {
		return Batch[B]{}, fmt.Errorf("%w: Next without a Restore since the last error", ErrOutOfOrder)
	}
	if l.pending {
		return Batch[B]{}, l.fail(fmt.Errorf("%w: Next twice without Stepped", ErrOutOfOrder))
	}
	shares := l.shares()
	b := Batch[B]{Epoch: l.epoch, Step: l.epochStep, GlobalSize: l.cfg.GlobalBatch}
	for _, n := range shares[:l.rank] {
		b.Offset += n
	}
	var idx []int
	if !l.finished() {
		if err := l.renewIfDue(ctx); err != nil {
			return Batch[B]{}, l.fail(err)
		}
		var err error
		idx, b.EpochDone, err = l.take(ctx, shares[l.rank])
		if err != nil {
			return Batch[B]{}, l.fail(err)
		}
	}
	l.samples = slices.Grow(l.samples[:0], len(idx))[:len(idx)]
	for i, x := range idx {
		v, err := l.ds.Get(ctx, x)
		if err != nil {
			return Batch[B]{}, l.fail(fmt.Errorf("dataloader: sample %d: %w", x, err))
		}
		l.samples[i] = v
	}
	data, err := l.collate(ctx, l.samples, idx)
	clear(l.samples)
	if err != nil {
		return Batch[B]{}, l.fail(fmt.Errorf("dataloader: collate: %w", err))
	}
	b.Indices, b.Data = idx, data
	l.pending, l.taken, l.tookDone = true, len(idx), b.EpochDone
	return b, nil
}

// take serves up to want positions from this rank's leases, leasing more
// as needed; epochDone is true when the queue says the epoch is done and
// nothing was served.
func (l *LeasedLoader[T, B]) take(ctx context.Context, want int) (idx []int, epochDone bool, err error) {
	idx = make([]int, 0, want)
	wait := l.wait
	for len(idx) < want {
		if len(l.mine) == 0 {
			o, got, err := l.lease(ctx, wait)
			wait = false
			if err != nil {
				return nil, false, err
			}
			switch got {
			case leaseBusy:
				return idx, false, nil
			case leaseDone:
				return idx, len(idx) == 0, nil
			}
			l.mine = append(l.mine, o)
		}
		o := &l.mine[0]
		n := min(want-len(idx), o.s.Hi-o.pos)
		idx = append(idx, l.order[o.pos:o.pos+n]...)
		o.pos += n
		if o.pos >= o.s.Hi {
			setBit(l.consumed, o.s.Index)
			l.done = append(l.done, o.s)
			l.mine = l.mine[1:]
		}
	}
	return idx, false, nil
}

type leaseResult int

const (
	leaseGot  leaseResult = iota
	leaseBusy             // every shard left is leased
	leaseDone             // every shard of the epoch is acked
)

// lease leases one shard of the epoch to serve. A shard the history
// already consumed (a fork, or a lost ack) joins this rank's consumed
// leases, to be acked at the next commit like them, and the next one is
// leased; a shard the history trained partly resumes where it
// stopped. With wait, it tries for up to BusyWait while every shard is
// leased; each Lease call runs to its end (a lease granted as its ctx
// ended would be held by nobody until the next Restore).
func (l *LeasedLoader[T, B]) lease(ctx context.Context, wait bool) (openLease, leaseResult, error) {
	qe := l.QueueEpoch(l.epoch)
	var deadline time.Time
	if wait {
		deadline = time.Now().Add(l.cfg.BusyWait)
	}
	for {
		s, err := l.q.Lease(ctx, qe, l.cfg.WorkerID)
		var busy *BusyError
		switch {
		case errors.Is(err, ErrEpochDone):
			return openLease{}, leaseDone, nil
		case errors.As(err, &busy):
			left := time.Until(deadline)
			if left <= 0 {
				return openLease{}, leaseBusy, nil
			}
			d := min(left, l.cfg.Poll)
			if r := time.Until(busy.RetryAt); r > 0 && r < d {
				d = r
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return openLease{}, 0, fmt.Errorf("dataloader: waiting for a shard of epoch %d: %w", l.epoch, ctx.Err())
			case <-t.C:
			}
			continue
		case err != nil:
			return openLease{}, 0, fmt.Errorf("dataloader: leasing a shard of epoch %d: %w", l.epoch, err)
		}
		if lo, hi := l.cfg.Shards.ShardRange(s.Index); s.Epoch != qe || hi == 0 || s.Lo != lo || s.Hi != hi || s.Token == 0 {
			return openLease{}, 0, fmt.Errorf("%w: the queue leased epoch %d shard %d [%d, %d) token %d; the loader's layout has [%d, %d) in epoch %d",
				ErrShardMismatch, s.Epoch, s.Index, s.Lo, s.Hi, s.Token, lo, hi, qe)
		}
		if bitSet(l.consumed, s.Index) {
			// Consumed in the history this rank restored: nothing of it to
			// serve; acked with this rank's other consumed leases.
			l.done = append(l.done, s)
			continue
		}
		pos := s.Lo
		if p, ok := l.resume[s.Index]; ok {
			pos = p
			delete(l.resume, s.Index)
		}
		return openLease{s: s, pos: pos}, leaseGot, nil
	}
}

// renewIfDue renews every lease this rank holds, consumed ones too, when
// RenewEvery has passed since the last renewal. A lease lost here was
// taken by another worker after it expired; the round must restore
// (ErrLeaseLost), which sorts out who serves what.
func (l *LeasedLoader[T, B]) renewIfDue(ctx context.Context) error {
	if time.Since(l.lastRenew) < l.cfg.RenewEvery {
		return nil
	}
	for i := range l.mine {
		s, err := l.q.Renew(ctx, l.mine[i].s)
		if err != nil {
			return fmt.Errorf("dataloader: renewing shard %d of epoch %d: %w", l.mine[i].s.Index, l.epoch, err)
		}
		l.mine[i].s.Deadline = s.Deadline
	}
	for i := range l.done {
		s, err := l.q.Renew(ctx, l.done[i])
		if err != nil {
			return fmt.Errorf("dataloader: renewing consumed shard %d of epoch %d: %w", l.done[i].Index, l.epoch, err)
		}
		l.done[i].Deadline = s.Deadline
	}
	l.lastRenew = time.Now()
	return nil
}

// Stepped takes the outcome of the step (or empty global batch) every rank
// agreed on (driver.StatefulLoader): it feeds the Balancer (Balance), and
// when every rank reported EpochDone, moves to the next epoch. It asks for
// a commit when the epoch moved on, and when the global batch trained
// nothing (so that consumed shards are acked and the epoch can end). Both
// decisions depend on o alone, so every rank takes them at the same step.
//
// Errors: ErrOutOfOrder, ErrInvalidStep (slices not one per rank, or this
// rank's entries are not the batch it served), ErrCorruptState (the epoch
// ended while this rank holds leases of it).
func (l *LeasedLoader[T, B]) Stepped(ctx context.Context, o StepOutcome) (commit bool, err error) {
	if !l.ready || !l.pending {
		return false, l.fail(fmt.Errorf("%w: Stepped without a batch served", ErrOutOfOrder))
	}
	if len(o.Samples) != l.size || len(o.EpochDone) != l.size || (l.cfg.Balance && len(o.ComputeSeconds) != l.size) {
		return false, l.fail(fmt.Errorf("%w: %d samples, %d compute times and %d epoch flags for %d ranks",
			ErrInvalidStep, len(o.Samples), len(o.ComputeSeconds), len(o.EpochDone), l.size))
	}
	if o.Samples[l.rank] != l.taken || o.EpochDone[l.rank] != l.tookDone {
		return false, l.fail(fmt.Errorf("%w: rank %d served %d samples (epoch done %v), the outcome says %d (%v)",
			ErrInvalidStep, l.rank, l.taken, l.tookDone, o.Samples[l.rank], o.EpochDone[l.rank]))
	}
	l.pending = false
	if l.cfg.Balance {
		l.work = l.work[:0]
		for _, n := range o.Samples {
			l.work = append(l.work, float64(n))
		}
		if w := l.bal.Observe(l.work, o.ComputeSeconds); w != nil {
			l.weights, l.sharesBuf = w, nil
		}
	}
	total, allDone := 0, true
	for r := range o.Samples {
		total += o.Samples[r]
		allDone = allDone && o.EpochDone[r]
	}
	l.wait = total == 0
	if total > 0 {
		l.epochStep++
	}
	if allDone {
		if len(l.mine) > 0 || len(l.done) > 0 {
			return false, l.fail(fmt.Errorf("%w: epoch %d done everywhere while rank %d holds %d leases", ErrCorruptState, l.epoch, l.rank, len(l.mine)+len(l.done)))
		}
		if l.epoch+1 > maxEpoch-1 {
			return false, l.fail(fmt.Errorf("%w: epoch %d is the last one a leased loader numbers", ErrInvalidConfig, l.epoch))
		}
		l.setEpoch(l.epoch + 1)
		l.wait = false
		return true, nil
	}
	return total == 0, nil
}

// State returns this rank's part of the loader state after the last batch
// Stepped took (driver.StatefulLoader): first it leases shards until this
// rank holds LeaseAhead steps of its share (or none is free), so that
// those leases are in the commit; then it encodes its leases in progress
// with their positions, its consumed leases not yet acked, the shards the
// history consumed in the epoch and the resume points. MergeStates
// combines the parts of every rank.
//
// Errors: ErrOutOfOrder, ErrLeaseLost, the queue's and ctx's.
func (l *LeasedLoader[T, B]) State(ctx context.Context) ([]byte, error) {
	if !l.ready || l.pending {
		return nil, l.fail(fmt.Errorf("%w: State with a batch not yet Stepped", ErrOutOfOrder))
	}
	if !l.finished() {
		if err := l.renewIfDue(ctx); err != nil {
			return nil, l.fail(err)
		}
		need, have := l.cfg.LeaseAhead*l.shares()[l.rank], 0
		for _, o := range l.mine {
			have += o.s.Hi - o.pos
		}
		for have < need {
			o, got, err := l.lease(ctx, false)
			if err != nil {
				return nil, l.fail(err)
			}
			if got != leaseGot {
				break
			}
			l.mine = append(l.mine, o)
			have += o.s.Hi - o.pos
		}
	}
	st := &leasedState{kind: kindPart, shuffle: l.cfg.Shuffle, lineage: l.hist, seed: l.cfg.Seed,
		datasetLen: l.cfg.Shards.DatasetLen, shardSize: l.cfg.Shards.ShardSize,
		epoch: l.epoch, epochStep: l.epochStep, rank: l.rank, size: l.size, consumed: l.consumed}
	for _, o := range l.mine {
		st.open = append(st.open, leaseEntry{index: o.s.Index, token: o.s.Token, pos: o.pos})
	}
	for _, s := range l.done {
		st.done = append(st.done, leaseEntry{index: s.Index, token: s.Token, pos: s.Hi})
	}
	for i, p := range l.resume {
		st.resume = append(st.resume, leaseEntry{index: i, pos: p})
	}
	slices.SortFunc(st.resume, func(a, b leaseEntry) int { return a.index - b.index })
	if err := st.check(l.cfg.Shards); err != nil {
		return nil, l.fail(err) // a bug of this loader: never commit it
	}
	l.doneState = len(l.done)
	return st.encode(), nil
}

// MergeStates merges every rank's State, in rank order, into the state to
// commit (driver.StateMerger). It is a pure function of parts and the
// loader's configuration, safe for concurrent use: every rank computes the
// same bytes. Errors: ErrCorruptState (a part that does not decode, is not
// rank i of len(parts), or does not fit the others), ErrCursorMismatch (a
// part of another layout, seed or shuffle setting). It never panics.
func (l *LeasedLoader[T, B]) MergeStates(parts [][]byte) ([]byte, error) {
	return mergeStates(parts, l.cfg.Shards, l.cfg.Seed, l.cfg.Shuffle)
}

// Committed acks the consumed leases of the last State (driver.CommitListener):
// the trainer calls it once every rank holds that commit, so no later
// round goes on from an older one and an acked shard is never rolled
// back. Acking after this rank's own commit alone would lose samples: a
// peer that dies during the commit leaves survivors that hold only the
// previous commit, and the next round rolls the shards' last steps back.
// If the round fails first, the next Restore acks them if the commit it
// restores holds them. Errors: ErrOutOfOrder, ErrLeaseLost (the round must
// restore), the queue's and ctx's.
func (l *LeasedLoader[T, B]) Committed(ctx context.Context) error {
	if !l.ready {
		return fmt.Errorf("%w: Committed without a Restore since the last error", ErrOutOfOrder)
	}
	for i, s := range l.done[:l.doneState] {
		if err := l.q.Ack(ctx, s); err != nil {
			l.done = l.done[i:]
			l.doneState -= i
			return l.fail(fmt.Errorf("dataloader: acking shard %d of epoch %d: %w", s.Index, l.epoch, err))
		}
	}
	l.done = l.done[l.doneState:]
	l.doneState = 0
	return nil
}
