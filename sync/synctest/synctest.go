// Package synctest provides in-memory ranks behind sync.Synchronizer, so
// that code built on package sync (a trainer, a strategy, a partition) can
// be tested with N ranks in one process, without TCP, and with faults
// injected where a test wants them. (It is unrelated to the standard
// library's testing/synctest.)
//
// # Use
//
//	g := synctest.NewGroup(3, synctest.Config{})
//	// rank r's goroutine:
//	err := g.Rank(r).AllReduceFloat64(ctx, buf, sync.OpSum)
//
// A Group is one round. Its ranks honour the sync.Synchronizer contract
// as the ring does: every rank calls the same collectives in the same
// order; a disagreement (kind, length, op, root) fails every rank with
// sync.ErrMismatch; after any failure every rank's Synchronizer is broken
// for good; Close or a cancelled context on one rank aborts the operation
// on every rank (its peers get a *sync.PeerError naming it, wrapping
// sync.ErrAborted); an operation that cannot complete fails with
// sync.ErrTimeout after Config.OpTimeout, never hangs. Reductions add in
// rank order, so results are the same bits on every rank and every run.
//
// # Faults
//
// Kill(r) makes rank r vanish as a killed process does: its peers' current
// and later operations fail with a *sync.PeerError naming r (not wrapping
// ErrAborted, so a trainer reports it to the rendezvous), r's own with
// sync.ErrClosed. FailAt(r, k, err) fails rank r's k-th operation with
// err (its peers get a *sync.PeerError naming r). Delay(r, d) makes each
// operation of rank r start d later (a slow rank). Drop(r) loses rank r's
// messages from now on (a hung or partitioned rank): every rank's
// operation then waits until OpTimeout and fails with sync.ErrTimeout.
//
// Every method is safe for concurrent use.
package synctest

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"time"
	"unsafe"

	"github.com/elastictrain/elastictrain/sync"
)

// Config tunes a Group. The zero value is valid.
type Config struct {
	// Round is the round number that *sync.PeerError values carry. Default 0.
	Round uint64
	// OpTimeout bounds every operation: one that cannot complete (a rank
	// that never arrives, a dropped rank) fails with sync.ErrTimeout
	// after it. Default 10 s. As on a *sync.Ring, time during which a
	// rank is marked busy (Rank.Busy) does not count: the operation fails
	// OpTimeout after the last moment a rank was busy, or after its start.
	OpTimeout time.Duration
	// BusyTimeout bounds how long an operation waits for busy ranks, from
	// its start (sync.Config.BusyTimeout). Default sync.DefaultBusyTimeout.
	BusyTimeout time.Duration
}

// ErrKilled is the cause inside the *sync.PeerError that peers of a
// killed rank get.
var ErrKilled = errors.New("synctest: rank killed")

// Group is N in-memory ranks of one round. Create it with NewGroup.
type Group struct {
	cfg   Config
	ranks []*Rank

	mu      gosync.Mutex
	ops     map[uint64]*op // in flight, by sequence number
	broken  chan struct{}  // closed at the first failure
	blame   int            // the rank that failed first (-1: none, or all timed out)
	cause   error          // what the blamed rank did, or the error every rank gets
	peerErr bool           // peers get a *sync.PeerError naming blame
	faults  []faults       // per rank
	busy    []int          // per rank: phases marked busy and not done
	busyEnd []time.Time    // per rank: when its last busy phase ended
}

type faults struct {
	delay  time.Duration
	failAt int // 1-based operation count; 0: none
	failE  error
	drop   bool
	killed bool
	closed bool
}

// op is one collective in flight: what the first rank to arrive asked
// for, and every rank's buffer.
type op struct {
	kind    string
	n       int // element count (bytes for broadcast and allgather send)
	reduce  sync.Op
	root    int
	arrived int
	f32     [][]float32
	f64     [][]float64
	parts   [][][]float32 // ordered allreduce: every rank's parts (its out is f32)
	bytes   [][]byte      // broadcast: every rank's buf; allgather: sends
	recv    [][]byte      // allgather
	done    chan struct{}
	err     error // set when the operation itself failed (mismatch)
}

// NewGroup returns a Group of n ranks (n >= 1).
func NewGroup(n int, cfg Config) *Group {
	if n < 1 {
		panic(fmt.Sprintf("synctest: group of %d ranks", n))
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	if cfg.BusyTimeout <= 0 {
		cfg.BusyTimeout = sync.DefaultBusyTimeout
	}
	g := &Group{cfg: cfg, ops: map[uint64]*op{}, broken: make(chan struct{}), blame: -1, faults: make([]faults, n),
		busy: make([]int, n), busyEnd: make([]time.Time, n)}
	for r := range n {
		g.ranks = append(g.ranks, &Rank{g: g, rank: r})
	}
	return g
}

// Size returns the number of ranks.
func (g *Group) Size() int { return len(g.ranks) }

// Rank returns rank r's Synchronizer (it also implements sync.AllGatherer
// and sync.OrderedReducer).
// Each rank's methods are meant for one goroutine, as sync.Synchronizer
// says; Close may be called from any.
func (g *Group) Rank(r int) *Rank { return g.ranks[r] }

// Synchronizers returns every rank's Synchronizer, in rank order.
func (g *Group) Synchronizers() []sync.Synchronizer {
	out := make([]sync.Synchronizer, len(g.ranks))
	for i, r := range g.ranks {
		out[i] = r
	}
	return out
}

// Kill makes rank r vanish (see the package doc).
func (g *Group) Kill(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[r].killed = true
	g.breakLocked(r, ErrKilled, true)
}

// FailAt makes rank r's k-th operation (counting from 1, over the Group's
// life) fail with err; its peers get a *sync.PeerError naming r.
func (g *Group) FailAt(r, k int, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[r].failAt, g.faults[r].failE = k, err
}

// Delay makes every later operation of rank r start d later.
func (g *Group) Delay(r int, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[r].delay = d
}

// Drop loses rank r's messages from now on: operations it takes part in
// wait until Config.OpTimeout and fail with sync.ErrTimeout.
func (g *Group) Drop(r int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.faults[r].drop = true
}

// Err returns the error that broke the Group (nil while it works).
func (g *Group) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause
}

// breakLocked records the first failure and wakes every waiter. With
// peer, the peers of blame get a *sync.PeerError naming it.
func (g *Group) breakLocked(blame int, cause error, peer bool) {
	if g.cause != nil {
		return
	}
	g.blame, g.cause, g.peerErr = blame, cause, peer
	close(g.broken)
}

// errFor is the error rank r gets once the Group is broken.
func (g *Group) errFor(r int) error {
	f := g.faults[r]
	switch {
	case f.killed || f.closed:
		return fmt.Errorf("%w: synctest rank %d", sync.ErrClosed, r)
	case !g.peerErr || r == g.blame:
		return g.cause
	}
	return &sync.PeerError{Rank: g.blame, Round: g.cfg.Round, Err: g.cause}
}

// Rank is one rank of a Group: a sync.Synchronizer, sync.AllGatherer and
// sync.OrderedReducer.
type Rank struct {
	g    *Group
	rank int
	seq  uint64 // operations started; owned by the rank's goroutine
}

// Rank returns this rank.
func (r *Rank) Rank() int { return r.rank }

// Size returns the world size.
func (r *Rank) Size() int { return len(r.g.ranks) }

// Close releases the rank; an operation in flight on any rank fails
// (ErrAborted on its peers, as a closed ring's do).
func (r *Rank) Close() error {
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.faults[r.rank].closed {
		g.faults[r.rank].closed = true
		g.breakLocked(r.rank, fmt.Errorf("%w: rank closed: %w", sync.ErrAborted, sync.ErrClosed), true)
	}
	return nil
}

// AllReduceFloat32 implements sync.Synchronizer.
func (r *Rank) AllReduceFloat32(ctx context.Context, buf []float32, o sync.Op) error {
	return r.do(ctx, &op{kind: "allreduce-f32", n: len(buf), reduce: o}, func(p *op) { p.f32[r.rank] = buf })
}

// AllReduceFloat64 implements sync.Synchronizer.
func (r *Rank) AllReduceFloat64(ctx context.Context, buf []float64, o sync.Op) error {
	return r.do(ctx, &op{kind: "allreduce-f64", n: len(buf), reduce: o}, func(p *op) { p.f64[r.rank] = buf })
}

// Broadcast implements sync.Synchronizer.
func (r *Rank) Broadcast(ctx context.Context, buf []byte, root int) error {
	if root < 0 || root >= r.Size() {
		return fmt.Errorf("%w: broadcast root %d outside world size %d", sync.ErrInvalid, root, r.Size())
	}
	return r.do(ctx, &op{kind: "broadcast", n: len(buf), root: root}, func(p *op) { p.bytes[r.rank] = buf })
}

// AllGather implements sync.AllGatherer.
func (r *Rank) AllGather(ctx context.Context, send, recv []byte) error {
	if len(recv) != len(send)*r.Size() {
		return fmt.Errorf("%w: allgather recv of %d bytes, want %d", sync.ErrInvalid, len(recv), len(send)*r.Size())
	}
	return r.do(ctx, &op{kind: "allgather", n: len(send)}, func(p *op) { p.bytes[r.rank], p.recv[r.rank] = send, recv })
}

// AllReduceOrderedFloat32 implements sync.OrderedReducer: every rank's
// out receives the sum of all parts in rank order, then in the order of
// each rank's parts, added one by one from +0 in float32. A part whose
// length is not len(out), or that shares memory with out, fails this
// rank with sync.ErrInvalid and every other rank's operation with
// sync.ErrMismatch, as on a *sync.Ring.
func (r *Rank) AllReduceOrderedFloat32(ctx context.Context, parts [][]float32, out []float32) error {
	for i, p := range parts {
		if len(p) != len(out) || len(p) > 0 && overlap(p, out) {
			err := fmt.Errorf("%w: ordered allreduce part %d of %d values (out has %d), or sharing memory with out", sync.ErrInvalid, i, len(p), len(out))
			g := r.g
			g.mu.Lock()
			g.breakLocked(-1, fmt.Errorf("%w: rank %d: %w", sync.ErrMismatch, r.rank, err), false)
			g.mu.Unlock()
			return err
		}
	}
	return r.do(ctx, &op{kind: "allreduce-ordered-f32", n: len(out)}, func(p *op) { p.f32[r.rank], p.parts[r.rank] = out, parts })
}

// overlap tells whether two non-empty slices share memory.
func overlap(a, b []float32) bool {
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}

// Barrier implements sync.Synchronizer.
func (r *Rank) Barrier(ctx context.Context) error {
	return r.do(ctx, &op{kind: "barrier"}, func(*op) {})
}

var (
	_ sync.AllGatherer    = (*Rank)(nil)
	_ sync.OrderedReducer = (*Rank)(nil)
)

// do runs one collective: the faults, the arrival, the wait.
func (r *Rank) do(ctx context.Context, want *op, put func(*op)) error {
	g := r.g
	if want.kind != "barrier" && want.kind != "broadcast" && want.kind != "allgather" && want.reduce > sync.OpMin {
		return fmt.Errorf("%w: unknown reduction %v", sync.ErrInvalid, want.reduce)
	}
	r.seq++
	seq := r.seq
	g.mu.Lock()
	f := g.faults[r.rank]
	if g.cause != nil {
		err := g.errFor(r.rank)
		g.mu.Unlock()
		return err
	}
	if f.failAt > 0 && int(seq) == f.failAt {
		g.breakLocked(r.rank, f.failE, true)
		g.mu.Unlock()
		return f.failE
	}
	g.mu.Unlock()
	if f.delay > 0 {
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return r.abort(ctx, nil)
		case <-g.broken:
			t.Stop()
		}
	}
	if err := ctx.Err(); err != nil {
		return r.abort(ctx, nil)
	}

	g.mu.Lock()
	if g.cause != nil {
		err := g.errFor(r.rank)
		g.mu.Unlock()
		return err
	}
	var p *op
	if !g.faults[r.rank].drop {
		p = g.ops[seq]
		if p == nil {
			p = want
			W := len(g.ranks)
			p.f32, p.f64, p.bytes, p.recv = make([][]float32, W), make([][]float64, W), make([][]byte, W), make([][]byte, W)
			p.parts = make([][][]float32, W)
			p.done = make(chan struct{})
			g.ops[seq] = p
		} else if p.kind != want.kind || p.n != want.n || p.reduce != want.reduce || p.root != want.root {
			err := fmt.Errorf("%w: operation %d: rank %d asks for %s of %d (op %v, root %d), another rank for %s of %d (op %v, root %d)",
				sync.ErrMismatch, seq, r.rank, want.kind, want.n, want.reduce, want.root, p.kind, p.n, p.reduce, p.root)
			g.breakLocked(-1, err, false)
			g.mu.Unlock()
			return err
		}
		put(p)
		p.arrived++
		if p.arrived == len(g.ranks) {
			p.complete()
			delete(g.ops, seq)
			close(p.done)
			g.mu.Unlock()
			return nil
		}
	}
	g.mu.Unlock()

	var done chan struct{}
	if p != nil {
		done = p.done
	}
	start := time.Now()
	timer := time.NewTimer(g.cfg.OpTimeout)
	defer timer.Stop()
wait:
	for {
		select {
		case <-done:
			return nil
		case <-g.broken:
		case <-ctx.Done():
			return r.abort(ctx, p)
		case <-timer.C:
			g.mu.Lock()
			if left := time.Until(g.deadlineLocked(start)); left > 0 {
				g.mu.Unlock()
				timer.Reset(left)
				continue wait
			}
			g.breakLocked(-1, fmt.Errorf("%w: synctest operation %d (%s) did not complete within %v", sync.ErrTimeout, seq, want.kind, g.cfg.OpTimeout), false)
			g.mu.Unlock()
		}
		break
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if p != nil && p.arrived == len(g.ranks) {
		return nil // completed just as the Group broke
	}
	return g.errFor(r.rank)
}

// abort fails the Group because this rank's context ended (its peers get
// a *sync.PeerError naming it, wrapping sync.ErrAborted), unless the
// operation p completed meanwhile.
func (r *Rank) abort(ctx context.Context, p *op) error {
	g := r.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if p != nil && p.arrived == len(g.ranks) {
		return nil
	}
	err := fmt.Errorf("%w: %w", sync.ErrAborted, ctx.Err())
	g.breakLocked(r.rank, err, true)
	if g.blame == r.rank {
		return err
	}
	return g.errFor(r.rank)
}

// complete computes the result into every rank's buffers (every rank is
// waiting, so nobody reads them meanwhile). Called under the Group's lock.
func (p *op) complete() {
	W := len(p.f32)
	switch p.kind {
	case "allreduce-f32":
		acc := make([]float32, p.n)
		for i := range acc {
			v := p.f32[0][i]
			for r := 1; r < W; r++ {
				switch x := p.f32[r][i]; p.reduce {
				case sync.OpSum, sync.OpAvg:
					v += x
				case sync.OpMax:
					v = max(v, x)
				case sync.OpMin:
					v = min(v, x)
				}
			}
			if p.reduce == sync.OpAvg {
				v /= float32(W)
			}
			acc[i] = v
		}
		for r := range W {
			copy(p.f32[r], acc)
		}
	case "allreduce-ordered-f32":
		acc := make([]float32, p.n) // +0
		for _, parts := range p.parts {
			for _, part := range parts {
				for i, x := range part {
					acc[i] += x
				}
			}
		}
		for r := range W {
			copy(p.f32[r], acc)
		}
	case "allreduce-f64":
		acc := make([]float64, p.n)
		reduce64(acc, func(r, i int) float64 { return p.f64[r][i] }, W, p.reduce)
		for r := range W {
			copy(p.f64[r], acc)
		}
	case "broadcast":
		for r := range W {
			if r != p.root {
				copy(p.bytes[r], p.bytes[p.root])
			}
		}
	case "allgather":
		for r := range W {
			for s := range W {
				copy(p.recv[r][s*p.n:], p.bytes[s])
			}
		}
	}
}

// reduce64 reduces element i of every rank, in rank order, into acc.
func reduce64(acc []float64, at func(r, i int) float64, W int, o sync.Op) {
	for i := range acc {
		v := at(0, i)
		for r := 1; r < W; r++ {
			x := at(r, i)
			switch o {
			case sync.OpSum, sync.OpAvg:
				v += x
			case sync.OpMax:
				v = max(v, x)
			case sync.OpMin:
				v = min(v, x)
			}
		}
		if o == sync.OpAvg {
			v /= float64(W)
		}
		acc[i] = v
	}
}

var _ sync.BusyMarker = (*Rank)(nil)

// Busy implements sync.BusyMarker: while the phase lasts, and for
// OpTimeout after it ends, the other ranks' operations wait for this one
// (up to BusyTimeout from their start). Call done when the phase ends
// (more than once is harmless).
func (r *Rank) Busy() (done func()) {
	g := r.g
	g.mu.Lock()
	g.busy[r.rank]++
	g.mu.Unlock()
	var once gosync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.busy[r.rank]--
			g.busyEnd[r.rank] = time.Now()
			g.mu.Unlock()
		})
	}
}

// deadlineLocked is the deadline of an operation begun at start: OpTimeout
// after the later of start and the last moment a rank was busy, at most
// BusyTimeout after start.
func (g *Group) deadlineLocked(start time.Time) time.Time {
	last, now := start, time.Now()
	for x, n := range g.busy {
		if n > 0 {
			last = now
		} else if g.busyEnd[x].After(last) {
			last = g.busyEnd[x]
		}
	}
	dl := last.Add(g.cfg.OpTimeout)
	if limit := start.Add(max(g.cfg.BusyTimeout, g.cfg.OpTimeout)); dl.After(limit) {
		dl = limit
	}
	return dl
}
