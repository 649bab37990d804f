package dataloader

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// Batch is one rank's share of one global batch.
//
// Step s of epoch e covers positions [s*GlobalBatch, s*GlobalBatch +
// GlobalSize) of that epoch's order; this rank's share is the contiguous
// part of it given by ShareOf (or, with Config.MicroBatch, by MicroShareOf),
// starting Offset positions into the global batch. Concatenating the
// Indices of ranks 0..W-1 gives the whole global batch in order, for any
// world size W.
type Batch[B any] struct {
	// Epoch is the epoch this global batch belongs to, from 0.
	Epoch int
	// Step is the index of the global batch within its epoch, from 0.
	Step int
	// Indices are this rank's sample indices (dataset indices) in order; it
	// may be empty when the global batch has fewer samples (or
	// micro-batches) than there are ranks. It shares memory with the
	// Loader's copy of the epoch's order: read it, never modify it.
	Indices []int
	// GlobalSize is the number of samples in the whole global batch, over
	// all ranks: Config.GlobalBatch, or less for a kept last partial batch
	// (DropLast false). Divide summed gradients by it to get the mean.
	GlobalSize int
	// Offset is the position within the global batch of Indices[0] (the
	// number of samples held by lower ranks).
	Offset int
	// Cost is this rank's share's cost: the sum of Config.Cost over its
	// Indices, or len(Indices) without Config.Cost. The trainer divides
	// it by the step's compute time to measure the rank's speed.
	Cost float64
	// Next is the cursor after this global batch: the Loader's committed
	// cursor once the trainer has applied this step everywhere and calls
	// Commit. After the last step of an epoch it is (Epoch+1, 0).
	Next Cursor
	// Data is collate(samples, Indices) when Config.MicroBatch is 0; the
	// zero value of B when micro-batching is on (see Micro).
	Data B
	// Micro holds this rank's whole micro-batches, in order, when
	// Config.MicroBatch > 0 (nil otherwise; empty when the rank owns none).
	Micro []Micro[B]
	// EpochDone is set by loaders of leased shards when this rank found no
	// sample of the epoch left to lease (every shard is leased or acked);
	// its Indices are then empty. The Loader of static shards never sets
	// it. The trainer moves every rank to the next epoch together once
	// every rank reported it (see driver.StatefulLoader).
	EpochDone bool
}

// Micro is one micro-batch of a rank's share (see Config.MicroBatch).
type Micro[B any] struct {
	// Index is the micro-batch's index within the global batch: it covers
	// global batch positions [Index*M, min((Index+1)*M, GlobalSize)) for
	// micro-batch size M, whatever the world size.
	Index int
	// Lo and Hi delimit its samples within the rank's share:
	// Batch.Indices[Lo:Hi].
	Lo, Hi int
	// Data is collate of the micro-batch's samples.
	Data B
}

// MicroBatch returns micro-batch k of b (0 <= k < len(b.Micro)) as a Batch
// of its own, for a step function that takes a Batch: Indices is
// b.Indices[Lo:Hi], Offset moves by Lo, Data is the micro-batch's Data, and
// Epoch, Step, GlobalSize and Next are b's. It returns the zero Batch for k
// out of range.
func (b Batch[B]) MicroBatch(k int) Batch[B] {
	if k < 0 || k >= len(b.Micro) {
		return Batch[B]{}
	}
	m := b.Micro[k]
	return Batch[B]{
		Epoch:      b.Epoch,
		Step:       b.Step,
		Indices:    b.Indices[m.Lo:m.Hi:m.Hi],
		GlobalSize: b.GlobalSize,
		Offset:     b.Offset + m.Lo,
		Next:       b.Next,
		Data:       m.Data,
	}
}

// CollateFunc turns one rank's samples of a batch (or of a micro-batch) into
// the value the step function consumes, e.g. by copying them into one
// tensor. samples[i] is sample indices[i]. Both slices are only valid during
// the call (the Loader reuses them): copy what must outlive it. It may be
// called with zero samples (a rank with an empty share) and concurrently
// from several workers. ctx is cancelled when the Loader is Reset or
// Closed, and when Next's ctx ends for a batch Next builds itself (always
// with Prefetch 0; with prefetch, when no worker had claimed it); a long
// collate should honour it.
type CollateFunc[T, B any] func(ctx context.Context, samples []T, indices []int) (B, error)

// Loader serves this rank's share of each global batch, in order, epoch
// after epoch, from a committed Cursor it can be Reset to for any rank and
// world size.
//
// Next, Reset and Commit must be called from one goroutine (the training
// loop). Cursor and Close are safe to call from any goroutine; Close also
// unblocks a Next waiting for a prefetched batch (it returns ErrClosed).
// With Config.Prefetch > 0 the Loader starts min(Workers, Prefetch)
// goroutines on the first Next after New or Reset; Reset and Close stop
// them and wait for them to exit.
type Loader[T, B any] struct {
	ds      Dataset[T]
	collate CollateFunc[T, B]
	cfg     Config
	n       int // dataset length, read once
	end     int // positions served per epoch: n, or n rounded down to GlobalBatch with DropLast

	mu        sync.Mutex // guards committed, closed, pipe
	committed Cursor
	closed    bool
	pipe      *pipeline[T, B]

	// Owned by the goroutine calling Next/Reset (lent to the pipeline's
	// dispatcher while it runs).
	plan    planner
	read    Cursor // cursor of the next batch Next hands out
	scratch []T    // samples buffer for Prefetch == 0
}

// New returns a Loader over ds that batches with collate, for rank 0 of a
// world of 1 at epoch 0 position 0 (NewCursor); call Reset to place it
// elsewhere. ds.Len() is read once, here. Errors wrap ErrInvalidConfig: a
// nil ds or collate, a Config that fails Validate, an empty dataset, or
// DropLast with fewer samples than one global batch (an epoch would have no
// step). New starts no goroutine.
func New[T, B any](ds Dataset[T], collate func(ctx context.Context, samples []T, indices []int) (B, error), cfg Config) (*Loader[T, B], error) {
	if ds == nil || collate == nil {
		return nil, fmt.Errorf("%w: nil dataset or collate function", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := ds.Len()
	if n <= 0 {
		return nil, fmt.Errorf("%w: dataset has %d samples", ErrInvalidConfig, n)
	}
	end := n
	if cfg.DropLast {
		end = n / cfg.GlobalBatch * cfg.GlobalBatch
		if end == 0 {
			return nil, fmt.Errorf("%w: DropLast with %d samples and a global batch of %d leaves no step per epoch",
				ErrInvalidConfig, n, cfg.GlobalBatch)
		}
	}
	l := &Loader[T, B]{ds: ds, collate: collate, cfg: cfg, n: n, end: end}
	l.plan = planner{
		seed: cfg.Seed, shuffle: cfg.Shuffle, n: n, end: end,
		batch: cfg.GlobalBatch, micro: cfg.MicroBatch, rank: 0, world: 1, cost: cfg.Cost,
	}
	l.committed = l.NewCursor()
	l.read = l.committed
	return l, nil
}

// Len returns the dataset length the Loader was built with, in samples.
func (l *Loader[T, B]) Len() int { return l.n }

// StepsPerEpoch returns the number of global batches per epoch:
// floor(n/GlobalBatch) with DropLast, ceil(n/GlobalBatch) without.
func (l *Loader[T, B]) StepsPerEpoch() int {
	return (l.end + l.cfg.GlobalBatch - 1) / l.cfg.GlobalBatch
}

// NewCursor returns the cursor of epoch 0 position 0 for this Loader's
// dataset and Config: where a new job starts.
func (l *Loader[T, B]) NewCursor() Cursor {
	return Cursor{Seed: l.cfg.Seed, DatasetLen: l.n, GlobalBatch: l.cfg.GlobalBatch, Shuffle: l.cfg.Shuffle}
}

// Cursor returns the committed cursor: the one given to the last Reset, or
// the Next of the last committed Batch. Safe from any goroutine.
func (l *Loader[T, B]) Cursor() Cursor {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.committed
}

// Commit records that b's step has been applied by every rank: the
// committed cursor becomes b.Next. b must come from this Loader's Next since
// the last Reset. Reading a batch does not move the committed cursor; only
// Commit does, so a batch read (or prefetched) but not committed is served
// again after a Reset to the committed cursor.
func (l *Loader[T, B]) Commit(b Batch[B]) {
	l.mu.Lock()
	l.committed = b.Next
	l.mu.Unlock()
}

// check validates c for this Loader and returns it normalised (a position
// inside the dropped tail of an epoch moves to the next epoch's start).
func (l *Loader[T, B]) check(c Cursor) (Cursor, error) {
	if err := c.Validate(); err != nil {
		return c, err
	}
	switch {
	case c.DatasetLen != l.n:
		return c, fmt.Errorf("%w: cursor is for a dataset of %d samples, this one has %d", ErrCursorMismatch, c.DatasetLen, l.n)
	case c.Seed != l.cfg.Seed:
		return c, fmt.Errorf("%w: cursor seed %d, loader seed %d", ErrCursorMismatch, c.Seed, l.cfg.Seed)
	case c.GlobalBatch != l.cfg.GlobalBatch:
		return c, fmt.Errorf("%w: cursor global batch %d, loader global batch %d", ErrCursorMismatch, c.GlobalBatch, l.cfg.GlobalBatch)
	case c.Shuffle != l.cfg.Shuffle:
		return c, fmt.Errorf("%w: cursor shuffle %t, loader shuffle %t", ErrCursorMismatch, c.Shuffle, l.cfg.Shuffle)
	}
	if c.Position >= l.end {
		c.Epoch++
		c.Position = 0
	}
	return c, nil
}

// Reset places the Loader at cursor c for rank of worldSize ranks: c
// becomes the committed cursor, and the next Next returns this rank's share
// of the global batch at c. Batches prefetched before the Reset are dropped
// (they were never committed, so nothing is lost or served twice); Reset
// waits for the worker goroutines to stop.
//
// c must pass Cursor.Validate (else ErrInvalidCursor) and match the
// Loader's dataset length, seed, global batch size and shuffle setting (else
// ErrCursorMismatch, saying which). A cursor inside the tail an epoch drops
// (possible only when DropLast changed since it was saved) moves to the
// start of the next epoch. rank must be in 0..worldSize-1 (else
// ErrInvalidWorld). After Close it returns ErrClosed.
func (l *Loader[T, B]) Reset(c Cursor, rank, worldSize int) error {
	if worldSize < 1 || rank < 0 || rank >= worldSize {
		return fmt.Errorf("%w: rank %d of world size %d", ErrInvalidWorld, rank, worldSize)
	}
	c, err := l.check(c)
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	p := l.pipe
	l.pipe = nil
	l.committed = c
	l.mu.Unlock()
	if p != nil {
		p.stop()
	}
	l.plan.rank, l.plan.world = rank, worldSize
	l.plan.weights = nil
	l.read = c
	return nil
}

// sameCuts reports whether weights cut every global batch as the current
// weights do: without Config.Cost the cut depends only on the batch's size
// (GlobalBatch, or the last one's when an epoch keeps a partial batch).
// Safe while the pipeline runs: it only reads the planner's settings,
// which only the goroutine calling Next writes.
func (l *Loader[T, B]) sameCuts(weights []float64) bool {
	if l.plan.cost != nil {
		return false
	}
	sizes := []int{l.cfg.GlobalBatch}
	if r := l.end % l.cfg.GlobalBatch; r != 0 {
		sizes = append(sizes, r)
	}
	for _, g := range sizes {
		units := g
		if l.cfg.MicroBatch > 0 {
			units = MicroBatches(g, l.cfg.MicroBatch)
		}
		if !slices.Equal(l.plan.units(units, l.plan.weights), l.plan.units(units, weights)) {
			return false
		}
	}
	return true
}

// SetWeights splits the global batches that Next serves from now on over
// the ranks in proportion to weights (by rank: relative speeds, in samples
// or cost units per second), with WeightedShares over the samples (or
// over the micro-batches with Config.MicroBatch; CostShares with
// Config.Cost); nil returns to equal shares (ShareOf, MicroShareOf, or
// equal cost). Each rank's share is still a contiguous run of the same
// global batch, in the same order, so which samples form a step does not
// change, only which rank trains them. Every rank of the world must call
// it with the same weights before the same Next, or shares overlap and
// leave gaps. Batches prefetched with other weights are dropped (they
// were never committed) and built again. Reset returns to equal shares.
// Errors: ErrInvalidWorld when len(weights) is not the world size;
// ErrClosed after Close. Call it from the goroutine that calls Next.
func (l *Loader[T, B]) SetWeights(weights []float64) error {
	if weights != nil && len(weights) != l.plan.world {
		return fmt.Errorf("%w: %d weights for a world of %d", ErrInvalidWorld, len(weights), l.plan.world)
	}
	if slices.Equal(weights, l.plan.weights) && (weights == nil) == (l.plan.weights == nil) {
		return nil
	}
	if l.sameCuts(weights) {
		// Every global batch is cut as before (the units are too few to
		// move, say): the prefetched batches stand.
		l.mu.Lock()
		p := l.pipe
		l.mu.Unlock()
		if p != nil {
			p.planMu.Lock() // the workers plan with l.plan under it
			defer p.planMu.Unlock()
		}
		l.plan.weights = slices.Clone(weights)
		return nil
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	p := l.pipe
	l.pipe = nil
	l.mu.Unlock()
	if p != nil {
		p.stop() // the workers borrow l.plan: stop them before changing it
	}
	l.plan.weights = slices.Clone(weights)
	return nil
}

// Next returns this rank's share of the next global batch, moving on into
// following epochs forever (the caller decides when to stop). It does not
// move the committed cursor (see Commit).
//
// With Prefetch > 0 it takes the batch prepared by the workers, builds it
// itself when no worker has started it, or waits for the worker building
// it; with Prefetch 0 it builds it on the calling goroutine. Errors: ctx's error
// (wrapped) if ctx ends first (the batch stays queued for the next call);
// ErrClosed; or a Dataset.Get or collate error, wrapped with the epoch and
// step: the prefetched batches are then dropped and the next call retries
// the same batch.
func (l *Loader[T, B]) Next(ctx context.Context) (Batch[B], error) {
	var zero Batch[B]
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return zero, ErrClosed
	}
	if l.cfg.Prefetch == 0 {
		l.mu.Unlock()
		pl := l.plan.plan(l.read)
		b, err := l.build(ctx, &pl, &l.scratch)
		if err != nil {
			return zero, err
		}
		l.read = b.Next
		return b, nil
	}
	p := l.pipe
	if p == nil {
		p = l.startPipeline(l.read)
		l.pipe = p
	}
	l.mu.Unlock()

	b, err, at := p.take(ctx, l)
	if err != nil {
		if errors.Is(err, errNextCtx) {
			return zero, fmt.Errorf("dataloader: next: %w", ctx.Err())
		}
		if errors.Is(err, ErrClosed) {
			return zero, ErrClosed
		}
		l.mu.Lock()
		if l.pipe == p {
			l.pipe = nil
		}
		l.mu.Unlock()
		p.stop()
		l.read = at
		return zero, err
	}
	l.read = b.Next
	return b, nil
}

// Close stops the worker goroutines and waits for them to exit. Next and
// Reset return ErrClosed afterwards; Cursor still works. Calls after the
// first return nil.
func (l *Loader[T, B]) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	p := l.pipe
	l.pipe = nil
	l.mu.Unlock()
	if p != nil {
		p.stop()
	}
	return nil
}

// build reads the samples of pl and collates them.
func (l *Loader[T, B]) build(ctx context.Context, pl *plan, scratch *[]T) (Batch[B], error) {
	b := Batch[B]{
		Epoch:      pl.at.Epoch,
		Step:       pl.at.Position / l.cfg.GlobalBatch,
		Indices:    pl.indices,
		GlobalSize: pl.global,
		Offset:     pl.lo,
		Cost:       pl.cost,
		Next:       pl.next,
	}
	if err := ctx.Err(); err != nil {
		return b, fmt.Errorf("dataloader: epoch %d step %d: %w", b.Epoch, b.Step, err)
	}
	s := (*scratch)[:0]
	for _, i := range pl.indices {
		v, err := l.ds.Get(ctx, i)
		if err != nil {
			clear(s)
			*scratch = s[:0]
			return b, fmt.Errorf("dataloader: epoch %d step %d: get sample %d: %w", b.Epoch, b.Step, i, err)
		}
		s = append(s, v)
	}
	*scratch = s
	defer clear(s) // drop references to samples; the buffer is reused
	var err error
	if l.cfg.MicroBatch == 0 {
		b.Data, err = l.collate(ctx, s, pl.indices)
		if err != nil {
			return b, fmt.Errorf("dataloader: epoch %d step %d: collate: %w", b.Epoch, b.Step, err)
		}
		return b, nil
	}
	m := l.cfg.MicroBatch
	b.Micro = make([]Micro[B], pl.nMicro)
	for k := range b.Micro {
		idx := pl.firstMicro + k
		lo := idx*m - pl.lo
		hi := min((idx+1)*m, pl.global) - pl.lo
		data, err := l.collate(ctx, s[lo:hi:hi], pl.indices[lo:hi:hi])
		if err != nil {
			return b, fmt.Errorf("dataloader: epoch %d step %d micro-batch %d: collate: %w", b.Epoch, b.Step, idx, err)
		}
		b.Micro[k] = Micro[B]{Index: idx, Lo: lo, Hi: hi, Data: data}
	}
	return b, nil
}

// plan is what one rank serves for one global batch.
type plan struct {
	at         Cursor // cursor of this global batch
	next       Cursor // cursor after it
	global     int    // samples in the global batch
	lo, hi     int    // this rank's positions within the global batch
	firstMicro int    // with micro-batching: first micro-batch index
	nMicro     int    // with micro-batching: number of micro-batches
	indices    []int  // order[at.Position+lo : at.Position+hi]
	cost       float64
}

// planner turns cursors into plans: the deterministic core of the Loader
// (no goroutines, no I/O). It caches the orders of the two most recently
// used epochs.
type planner struct {
	seed        uint64
	shuffle     bool
	n, end      int
	batch       int
	micro       int
	rank, world int
	weights     []float64               // SetWeights; nil: equal shares
	cost        func(index int) float64 // Config.Cost

	epochs [2]int
	orders [2][]int
}

// order returns the order of epoch, from the cache when possible.
func (p *planner) order(epoch int) []int {
	for i := range p.orders {
		if p.orders[i] != nil && p.epochs[i] == epoch {
			return p.orders[i]
		}
	}
	var o []int
	if p.shuffle {
		o = Order(p.seed, epoch, p.n)
	} else {
		o = identityOrder(p.n)
	}
	// Replace the entry of the older epoch (or an empty one).
	victim := 0
	if p.orders[0] != nil && (p.orders[1] == nil || p.epochs[1] < p.epochs[0]) {
		victim = 1
	}
	p.epochs[victim], p.orders[victim] = epoch, o
	return o
}

// plan returns the plan for the global batch at c (a cursor that passed
// Loader.check).
func (p *planner) plan(c Cursor) plan {
	pl := plan{at: c}
	pl.global = min(p.batch, p.end-c.Position)
	o := p.order(c.Epoch)
	switch {
	case p.weights != nil || p.cost != nil:
		p.weightedShare(&pl, o[c.Position:c.Position+pl.global])
	case p.micro > 0:
		pl.firstMicro, pl.nMicro = MicroShareOf(pl.global, p.micro, p.rank, p.world)
		pl.lo = min(pl.firstMicro*p.micro, pl.global)
		pl.hi = min((pl.firstMicro+pl.nMicro)*p.micro, pl.global)
	default:
		pl.lo, pl.hi = ShareOf(pl.global, p.rank, p.world)
	}
	lo, hi := c.Position+pl.lo, c.Position+pl.hi
	pl.indices = o[lo:hi:hi]
	pl.cost = float64(len(pl.indices))
	if p.cost != nil {
		pl.cost = 0
		for _, i := range pl.indices {
			pl.cost += sampleCost(p.cost, i)
		}
	}
	pl.next = c
	pl.next.Position += pl.global
	if pl.next.Position >= p.end {
		pl.next.Epoch++
		pl.next.Position = 0
	}
	return pl
}

// weightedShare sets pl's share of the global batch whose indices are
// global by the planner's weights (equal when nil) and costs: in units of
// samples, or of micro-batches with micro-batching.
func (p *planner) weightedShare(pl *plan, global []int) {
	units, size := len(global), 1
	if p.micro > 0 {
		units, size = MicroBatches(len(global), p.micro), p.micro
	}
	w := p.weights
	if w == nil {
		w = make([]float64, p.world)
		for r := range w {
			w[r] = 1
		}
	}
	var shares []int
	if p.cost == nil {
		shares = WeightedShares(units, w)
	} else {
		costs := make([]float64, units)
		for k, i := range global {
			costs[k/size] += sampleCost(p.cost, i)
		}
		shares = CostShares(costs, w)
	}
	first := 0
	for r := range p.rank {
		first += shares[r]
	}
	pl.firstMicro, pl.nMicro = first, shares[p.rank]
	pl.lo, pl.hi = min(first*size, len(global)), min((first+shares[p.rank])*size, len(global))
	if p.micro == 0 {
		pl.firstMicro, pl.nMicro = 0, 0
	}
}

// units returns the shares of units units by weights without a cost
// function: WeightedShares, or the equal split of ShareOf for nil.
func (p *planner) units(units int, weights []float64) []int {
	out := make([]int, p.world)
	if weights == nil {
		for r := range out {
			lo, hi := ShareOf(units, r, p.world)
			out[r] = hi - lo
		}
		return out
	}
	return WeightedShares(units, weights)
}

// sampleCost is cost(i), or 0 when that is not finite and non-negative.
func sampleCost(cost func(int) float64, i int) float64 {
	c := cost(i)
	if !(c >= 0) || math.IsInf(c, 1) {
		return 0
	}
	return c
}

// Slot states (the low bits of slot.word; the high bits hold the batch
// number the state is about).
const (
	slotFree     = 0 // may be claimed to build its batch
	slotBuilding = 1 // a worker or Next is building it
	slotReady    = 2 // built (b and err are set), waiting for Next
	slotBits     = 2
)

func slotWord(k int64, state int64) int64 { return k<<slotBits | state }

// slot holds one prefetched batch: batch number k (counted from the
// pipeline's start cursor) uses slot k % Prefetch.
type slot[B any] struct {
	word atomic.Int64  // slotWord(batch number, state)
	pl   plan          // written by the claimer, read by Next once ready
	b    Batch[B]      // likewise
	err  error         // likewise
	done chan struct{} // capacity 1: signalled after a worker made it ready
}

// pipeline is the set of prefetch workers for one run between Reset/Close.
//
// Batches next..next+Prefetch-1 (next: the batch Next delivers next) each
// have their slot; slot.word says which batch number a slot is for and
// whether it is free, being built or ready, and whoever moves it from free
// to building with a compare-and-swap builds that batch, so each batch is
// built once and slots never hold a batch outside the window. Workers build
// the lowest free batch of the window. Next takes its batch when ready,
// builds it itself when nobody has claimed it (no hand-off between
// goroutines, and the samples are hot in this core's cache); when a worker
// is building it, Next builds a later unclaimed batch of the window into its
// slot meanwhile, and waits only when there is none. While Next is inside,
// workers leave its batch to it and build the ones after. So a consumer
// faster than the workers shares the building with them instead of paying
// a wake-up for each batch, and a slower one finds every batch ready.
type pipeline[T, B any] struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	slots   []*slot[B]
	next    atomic.Int64  // next batch number Next delivers (written by Next)
	waiting atomic.Bool   // Next is inside take
	wake    chan struct{} // tokens for idle workers: the window moved

	start     Cursor // cursor of batch 0
	startStep int    // its step within the epoch
	steps     int    // steps per epoch

	planMu sync.Mutex // guards plan (its order cache)
	plan   *planner

	// The ctx of the batches Next builds itself: cancelled with ctx (Reset,
	// Close) and, while Next builds, with Next's own ctx; renewed after
	// that. Owned by Next.
	inlineCtx    context.Context
	inlineCancel context.CancelFunc

	// helping is set while Next builds a later batch for want: the worker
	// that makes batch want ready cancels that build (its own child of
	// inlineCtx, so a late cancel can hurt no other build), so a ready
	// batch is never held up behind a slow one.
	helping atomic.Pointer[helpNote]
}

// helpNote says which batch Next waits for while it helps, and how to stop
// its help.
type helpNote struct {
	want   int64
	cancel context.CancelFunc
}

// ready stores batch k's build result in its slot s, marks it ready,
// signals a Next waiting for it and stops a help Next runs meanwhile.
func (p *pipeline[T, B]) ready(s *slot[B], k int64, b Batch[B], err error) {
	s.b, s.err = b, err
	s.word.Store(slotWord(k, slotReady))
	select {
	case s.done <- struct{}{}:
	default:
	}
	if h := p.helping.Load(); h != nil && h.want == k {
		h.cancel() // Next is building a later batch: its own is here
	}
}

// giveBack returns batch k, which Next stopped building, to the window
// unbuilt, and says why Next stopped: ErrClosed (the pipeline stopped),
// errNextCtx (Next's ctx ended) or nil (a worker made Next's own batch
// ready during a help).
func (p *pipeline[T, B]) giveBack(ctx context.Context, s *slot[B], k int64) error {
	s.word.Store(slotWord(k, slotFree))
	switch {
	case p.ctx.Err() != nil:
		return ErrClosed
	case ctx.Err() != nil:
		return errNextCtx
	}
	return nil
}

// errNextCtx marks a batch Next gave up building because its ctx ended.
var errNextCtx = errors.New("dataloader: next's context ended")

// startPipeline starts the workers, serving from cursor c. They borrow
// l.plan until stop returns.
func (l *Loader[T, B]) startPipeline(c Cursor) *pipeline[T, B] {
	n := l.cfg.Prefetch
	ctx, cancel := context.WithCancel(context.Background())
	workers := min(l.cfg.Workers, n) // more could never all be busy
	p := &pipeline[T, B]{
		ctx: ctx, cancel: cancel,
		slots: make([]*slot[B], n),
		wake:  make(chan struct{}, workers),
		start: c, startStep: c.Position / l.cfg.GlobalBatch, steps: l.StepsPerEpoch(),
		plan: &l.plan,
	}
	p.inlineCtx, p.inlineCancel = context.WithCancel(ctx)
	for i := range p.slots {
		p.slots[i] = &slot[B]{done: make(chan struct{}, 1)}
		p.slots[i].word.Store(slotWord(int64(i), slotFree))
	}
	p.wg.Add(workers)
	for range workers {
		go p.work(l)
	}
	return p
}

// planAt returns the plan of batch number k.
func (p *pipeline[T, B]) planAt(k int64) plan {
	c := p.start
	step := int64(p.startStep) + k
	c.Epoch += int(step / int64(p.steps))
	c.Position = int(step%int64(p.steps)) * c.GlobalBatch
	p.planMu.Lock()
	defer p.planMu.Unlock()
	return p.plan.plan(c)
}

// claim moves batch k's slot from free to building; false if it was not
// free for k (claimed by another, or k is outside the window).
func (p *pipeline[T, B]) claim(k int64) (*slot[B], bool) {
	s := p.slots[k%int64(len(p.slots))]
	return s, s.word.CompareAndSwap(slotWord(k, slotFree), slotWord(k, slotBuilding))
}

// work builds batches of the window until the pipeline stops.
func (p *pipeline[T, B]) work(l *Loader[T, B]) {
	defer p.wg.Done()
	var scratch []T
	for {
		if p.ctx.Err() != nil {
			return
		}
		n := p.next.Load()
		built := false
		for k := n; k < n+int64(len(p.slots)); k++ {
			if k == n && p.waiting.Load() {
				continue // Next is there and builds it itself
			}
			s, ok := p.claim(k)
			if !ok {
				continue
			}
			s.pl = p.planAt(k)
			b, err := l.build(p.ctx, &s.pl, &scratch)
			p.ready(s, k, b, err)
			built = true
			break
		}
		if built {
			continue
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.wake:
		}
	}
}

// take returns the next batch (and the cursor it was built at, for a
// retry after an error). Errors: errNextCtx when ctx ended first (the batch
// stays in the window for the next call), ErrClosed when the pipeline was
// stopped, or the batch's build error.
func (p *pipeline[T, B]) take(ctx context.Context, l *Loader[T, B]) (Batch[B], error, Cursor) {
	k := p.next.Load()
	s := p.slots[k%int64(len(p.slots))]
	p.waiting.Store(true)
	defer p.waiting.Store(false)
	for {
		switch s.word.Load() {
		case slotWord(k, slotReady):
			b, err, at := s.b, s.err, s.pl.at
			s.b, s.err = Batch[B]{}, nil
			select {
			case <-s.done: // drop the signal that made it ready
			default:
			}
			p.advance(s, k)
			return b, err, at
		case slotWord(k, slotFree):
			if _, ok := p.claim(k); !ok {
				continue // a worker took it a moment ago
			}
			pl := p.planAt(k)
			bctx := p.inline()
			b, err := p.buildInline(ctx, bctx, l, &pl)
			if err != nil && bctx.Err() != nil {
				if gerr := p.giveBack(ctx, s, k); gerr != nil {
					return Batch[B]{}, gerr, pl.at
				}
				// Neither Next's ctx nor the pipeline ended: the build
				// was stopped by an earlier call's ctx, whose cancel of
				// the inline ctx (an AfterFunc, run on a goroutine of its
				// own) landed after that call had returned. Build the
				// batch again under a renewed ctx (inline).
				continue
			}
			p.advance(s, k)
			return b, err, pl.at
		}
		// A worker is building it: rather than wait, build a later batch
		// of the window that nobody has claimed; wait only when there is
		// none.
		helped, err := p.help(ctx, l, k)
		if err != nil {
			return Batch[B]{}, err, Cursor{}
		}
		if helped || s.word.Load() != slotWord(k, slotBuilding) {
			continue
		}
		select {
		case <-s.done:
		case <-ctx.Done():
			return Batch[B]{}, errNextCtx, Cursor{}
		case <-p.ctx.Done():
			return Batch[B]{}, ErrClosed, Cursor{}
		}
	}
}

// help builds the first unclaimed batch after k in the window into its
// slot, as a worker would, on Next's goroutine; it reports whether it built
// one. When batch k becomes ready meanwhile, the build is abandoned (the
// batch given back unbuilt) and help returns false; when Next's ctx or the
// pipeline's ends, likewise, with errNextCtx or ErrClosed.
func (p *pipeline[T, B]) help(ctx context.Context, l *Loader[T, B], k int64) (bool, error) {
	for j := k + 1; j < k+int64(len(p.slots)); j++ {
		s, ok := p.claim(j)
		if !ok {
			continue
		}
		s.pl = p.planAt(j)
		hctx, cancel := context.WithCancel(p.inline())
		p.helping.Store(&helpNote{want: k, cancel: cancel})
		if p.slots[k%int64(len(p.slots))].word.Load() == slotWord(k, slotReady) {
			cancel() // it became ready before the note was up
		}
		b, err := p.buildInline(ctx, hctx, l, &s.pl)
		p.helping.Store(nil)
		stopped := hctx.Err() != nil
		cancel()
		if err != nil && stopped {
			return false, p.giveBack(ctx, s, j) // nil: batch k is ready, deliver it first
		}
		p.ready(s, j, b, err)
		return true, nil
	}
	return false, nil
}

// buildInline builds pl on Next's goroutine under bctx (p.inline() or a
// child of it), which also ends with Next's ctx, so Next's cancellation and
// the pipeline's (Close still unblocks Next) both stop the build. The
// registration on Next's ctx is skipped when it can never end.
func (p *pipeline[T, B]) buildInline(ctx, bctx context.Context, l *Loader[T, B], pl *plan) (Batch[B], error) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, p.inlineCancel)
		defer stop()
	}
	return l.build(bctx, pl, &l.scratch)
}

// inline returns the ctx of the batches Next builds itself, renewed when
// Next's ctx ended an earlier build while the pipeline still runs.
func (p *pipeline[T, B]) inline() context.Context {
	if p.inlineCtx.Err() != nil && p.ctx.Err() == nil {
		p.inlineCtx, p.inlineCancel = context.WithCancel(p.ctx)
	}
	return p.inlineCtx
}

// advance frees slot s (batch k was delivered) for batch k+Prefetch, moves
// the window and wakes the idle workers.
func (p *pipeline[T, B]) advance(s *slot[B], k int64) {
	s.word.Store(slotWord(k+int64(len(p.slots)), slotFree))
	p.next.Store(k + 1)
	for range cap(p.wake) {
		select {
		case p.wake <- struct{}{}:
		default:
			return
		}
	}
}

// stop cancels the workers and waits for them; safe to call more than once
// and from several goroutines.
func (p *pipeline[T, B]) stop() {
	p.cancel()
	p.wg.Wait()
}
