package sync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
	"github.com/elastictrain/elastictrain/sync/mesh"
)

const (
	// verdictGrace is how long a rank whose data connection to a peer broke
	// waits for the control connections to say which rank really failed
	// (the peer may only have closed because a third rank died).
	verdictGrace = mesh.VerdictGrace
	// ctrlWriteTimeout bounds writing abort and close notices.
	ctrlWriteTimeout = 500 * time.Millisecond
	readerBytes      = 64 << 10
)

// peerLink holds the per-peer connections of a Ring.
type peerLink struct {
	rank   int
	ctrl   net.Conn
	ctrlMu gosync.Mutex
	ctrlW  [2 * wire.HeaderSize]byte // a header and an Abort or announced header
	mesh   net.Conn
	meshR  *bufio.Reader
	meshW  []byte // header + DirectBytes
	meshH  [wire.HeaderSize]byte
	// closed is set when the peer announced a graceful Close.
	closed atomic.Bool
}

// lane is one stream of the ring: it sends to the right neighbour and
// receives from the left one, each side driven by its own goroutine.
type lane struct {
	idx        int
	right      net.Conn
	left       net.Conn
	leftR      *bufio.Reader
	hdrW, hdrR [wire.HeaderSize]byte
	scratch    []byte
	sendJobs   chan laneJob
	recvJobs   chan laneJob
	// progress counters: step<<32 | chunks done within the step
	sendProg, recvProg atomic.Int64
	sendNote, recvNote chan struct{}
	// shared memory (nil when the lane uses the socket for payloads)
	tx, rx    []byte
	slotBytes int
	txNext    uint64
	rxNext    uint64
	wakeBuf   [64]byte
	wake      [1]byte
	hdrBatch  []byte // headers of a two-rank exchange's chunks, sent together (pairSendShm)
	// ordTx: in an ordered allreduce of two ranks on rank 0 (ordered.go,
	// orderedInSlots), the offset in tx of the slot chunk k's S_0 was
	// summed into, for the receive half to add rank 1's part to.
	ordTx [shmSlots]int
}

// Lane algorithms.
const (
	algoRing    = iota // ring reduce-scatter and/or allgather steps s0..s1-1 (allreduce)
	algoChain          // pipelined chain from root: copy (broadcast) or reduce (red set) at every hop
	algoGather         // ring allgather of per-rank blocks
	algoPair           // two ranks: each sends its whole part and reduces the other's into it (allreduce)
	algoOrdered        // chain 0 -> ... -> n-1 adding each rank's parts in order, then chain n-1 -> 0 -> ... copying (ordered.go)
)

type laneJob struct {
	kind  wire.Kind // of the frame headers
	algo  uint8
	opb   uint8 // op byte of the frame header
	op    Op
	elem  int // element size in bytes (1 for byte collectives)
	buf   []byte
	lo    int // lane's range: elements for allreduce, bytes otherwise
	hi    int
	block int // allgather: bytes per rank block
	root  int // chain: the group position that starts the chain
	aux   uint64
	seq   uint64
	total uint64
	red   reduceFunc   // ring: reduction; chain: nil copies, else reduces at every hop
	parts [][]float32  // ordered: this rank's parts, each of the buffer's length
	redTo reduceToFunc // pair: the reduction out = a op b
	vec   *vecBuf      // pair on shared memory: the buffer as tensors (buf is nil), see allReduceTensors; ordered: the last part, and the result (AllReduceOrderedTensors)
	scale scaleFunc
	// ring steps s0 <= s < s1 of 2(n-1): [0, n-1) reduce-scatter, [n-1,
	// 2(n-1)) allgather.
	s0, s1 int
	div    int // OpAvg: divide by div at the last reduce-scatter step; 0 = no division
	// segMajor: [lo, hi) is the whole extent, split into n segments first
	// and each segment into the lanes' parts (li of nl), so that after a
	// reduce-scatter position q holds one contiguous segment (q+1) mod n.
	// Otherwise the lane's part [lo, hi) splits into n segments.
	segMajor bool
	li, nl   int
}

// segment returns the element (or byte) range of segment seg of n of the
// lane's job.
func (j *laneJob) segment(seg, n int) (int, int) {
	lo, hi := span(j.lo, j.hi, seg, n)
	if j.segMajor {
		return span(lo, hi, j.li, j.nl)
	}
	return lo, hi
}

// Lane groups of a round: the ring over every rank and, when the round's
// ranks share hosts, the rings of the hierarchical allreduce.
const (
	groupFlat  = 0 // all ranks in rank order
	groupHost  = 1 // the ranks of this rank's host
	groupCross = 2 // one rank of every host
	numGroups  = 3
)

// group is one ring over some ranks of the round, with its lanes: lane l
// sends to the next member and receives from the previous one. A group
// runs one job at a time (start, then wait), from the operation's
// goroutine; several groups may run jobs at once.
type group struct {
	id      int
	members []int // ranks, in ring order
	pos     int   // this rank's index in members
	lanes   []*lane
	done    chan struct{} // signalled by the lane half that finishes last
	pending atomic.Int32  // lane halves still running the current job
	errMu   gosync.Mutex
	err     error // first error of the current job's lane halves
	started int   // lane halves dispatched by the current start
	used    int   // lanes of the current job
}

func (g *group) n() int     { return len(g.members) }
func (g *group) right() int { return g.members[(g.pos+1)%len(g.members)] }
func (g *group) left() int  { return g.members[(g.pos-1+len(g.members))%len(g.members)] }

// Ring is the communicator of one round: the bandwidth-optimal ring
// allreduce (reduce-scatter then allgather, Patarasuk & Yuan, "Bandwidth
// optimal all-reduce algorithms for clusters of workstations", JPDC 2009),
// split over Config.Streams lanes and pipelined in chunks of
// Config.ChunkBytes, with a direct-exchange latency path for buffers of at
// most Config.DirectBytes, and in rounds whose ranks share hosts the
// hierarchical allreduce (Config.Hierarchy); pipelined chain broadcast;
// ring allgather; barrier.
//
// Ring implements Synchronizer. Operations are called from one goroutine;
// Close may be called from any goroutine. After any error the Ring is broken
// and every later call returns that error.
//
// Failure semantics: every rank holds a control connection to every other
// rank, read by a goroutine at all times. A rank whose process dies is seen
// by all others when its connections close, and the first rank to see a
// failure also sends an abort notice naming the failed rank to all others;
// every rank then fails with a *PeerError naming that rank. A rank whose
// context is cancelled (or that is closed during an operation) aborts the
// operation on every rank (PeerError naming it, wrapping ErrAborted). A peer
// that stops sending without closing (hung, stopped) makes the operation fail
// after Config.OpTimeout with a *TimeoutError (ErrTimeout) naming the silent
// ranks: those neither waiting in the operation nor marked busy. A rank in a
// phase marked with Busy holds the others' operations up to
// Config.BusyTimeout instead (busy.go).
type Ring struct {
	t     *Transport
	cfg   Config
	round uint64
	rank  int
	size  int
	peers []*peerLink // by rank; nil for self

	// groups: [groupFlat] always (when size > 1); [groupHost] and
	// [groupCross] when the hierarchical allreduce runs and this rank is in
	// such a ring of at least two ranks.
	groups [numGroups]*group
	lanes  []*lane // the flat ring's lanes
	all    []*lane // every lane of every group
	layout layout

	seq     uint64
	watched bool
	vec     vecBuf // allReduceTensors' and AllReduceOrderedTensors' tensors, reused
	// AllReduceOrderedTensors where the tensors are copied: the last part
	// and the result, flat, and the parts with it.
	ordFlat, ordOut []float32
	ordParts        [][]float32
	scratch         [][]byte // by rank: DirectBytes each, 8-byte aligned
	watchCh         chan context.Context
	unwatchCh       chan struct{}

	// agree, opSeq and opStart (Unix ns) let announceLoop tell the peers
	// of an operation that waits (agree.go).
	agree   agreement
	opSeq   atomic.Uint64
	opStart atomic.Int64
	// busy holds this rank's and the peers' busy marks and the deadline
	// of the operation in flight (busy.go).
	busy busyState

	mu        gosync.Mutex
	cause     error
	dead      chan struct{}
	inOp      atomic.Bool
	closing   atomic.Bool
	closeOnce gosync.Once
	quit      chan struct{}
	wg        gosync.WaitGroup
}

var _ Synchronizer = (*Ring)(nil)

func alignedBytes(n int) []byte {
	if n == 0 {
		return nil
	}
	return f64Bytes(make([]float64, (n+7)/8))[:n]
}

func newRing(t *Transport, w World, lay layout, rc *ringConns, tx, rx [numGroups][][]byte) *Ring {
	cfg := t.cfg
	n := w.Size()
	r := &Ring{
		t: t, cfg: cfg, round: w.Round, rank: w.Rank, size: n, layout: lay,
		peers:     make([]*peerLink, n),
		dead:      make(chan struct{}),
		quit:      make(chan struct{}),
		watchCh:   make(chan context.Context),
		unwatchCh: make(chan struct{}),
	}
	if n == 1 {
		return r
	}
	r.scratch = make([][]byte, n)
	for i := range r.scratch {
		r.scratch[i] = alignedBytes(cfg.DirectBytes)
	}
	for p := 0; p < n; p++ {
		if p == w.Rank {
			continue
		}
		r.peers[p] = &peerLink{
			rank:  p,
			ctrl:  rc.ctrl[p],
			mesh:  rc.mesh[p],
			meshR: bufio.NewReaderSize(rc.mesh[p], readerBytes),
			meshW: make([]byte, wire.HeaderSize+cfg.DirectBytes),
		}
	}
	for gi, members := range lay.groups(w.Rank) {
		if len(members) < 2 {
			continue
		}
		g := &group{id: gi, members: members, pos: slices.Index(members, w.Rank), done: make(chan struct{}, 1),
			lanes: make([]*lane, len(rc.right[gi]))}
		for i := range g.lanes {
			l := &lane{
				idx:       i,
				right:     rc.right[gi][i],
				left:      rc.left[gi][i],
				leftR:     bufio.NewReaderSize(rc.left[gi][i], readerBytes),
				scratch:   alignedBytes(cfg.chunkBytes()),
				sendJobs:  make(chan laneJob),
				recvJobs:  make(chan laneJob),
				sendNote:  make(chan struct{}, 1),
				recvNote:  make(chan struct{}, 1),
				slotBytes: cfg.chunkBytes(),
				wake:      [1]byte{1},
				hdrBatch:  make([]byte, 0, shmSlots*wire.HeaderSize),
			}
			if tx[gi] != nil {
				l.tx, l.rx = tx[gi][i], rx[gi][i]
			}
			g.lanes[i] = l
			r.all = append(r.all, l)
		}
		r.groups[gi] = g
	}
	r.lanes = r.groups[groupFlat].lanes
	// Before any goroutine starts: a peer's announcement or busy frame can
	// arrive on a control connection the moment its loop runs (a panic,
	// index out of range in noteSeen, found by the soak).
	r.agree.init(n)
	r.busy.init(n)
	for _, p := range r.peers {
		if p != nil {
			r.wg.Add(1)
			go r.ctrlLoop(p)
		}
	}
	for _, g := range r.groups {
		if g == nil {
			continue
		}
		for _, l := range g.lanes {
			r.wg.Add(2)
			go r.sendLoop(g, l)
			go r.recvLoop(g, l)
		}
	}
	r.wg.Add(3)
	go r.watchLoop()
	go r.announceLoop()
	go r.busyLoop()
	return r
}

// Rank returns this process's rank in the round.
func (r *Ring) Rank() int { return r.rank }

// Size returns the world size.
func (r *Ring) Size() int { return r.size }

// Hierarchical reports whether this round's AllReduce of more than
// Config.DirectBytes runs the hierarchical algorithm (Config.Hierarchy:
// the round spans several hosts and some host holds several ranks), and
// which (HierarchyLeaders or HierarchyStriped; HierarchyOff for the flat
// ring). The same on every rank of the round.
func (r *Ring) Hierarchical() bool { return r.layout.mode != HierarchyOff }

// Hierarchy returns the allreduce this round runs for large buffers:
// HierarchyOff (the flat ring), HierarchyLeaders or HierarchyStriped.
func (r *Ring) Hierarchy() Hierarchy { return r.layout.mode }

// Round returns the round this Ring belongs to.
func (r *Ring) Round() uint64 { return r.round }

// Err returns the error that broke the Ring, or nil while it works. It does
// not block.
func (r *Ring) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cause
}

func (r *Ring) causeNow() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cause
}

// Close releases the Ring: if no operation is in flight it tells every peer
// it leaves gracefully; if one is, the operation is aborted on every rank
// (they see a *PeerError naming this rank, wrapping ErrAborted). It closes
// every connection and waits for the Ring's goroutines. Safe to call more
// than once and from any goroutine; always returns nil.
func (r *Ring) Close() error {
	r.closeOnce.Do(func() {
		r.closing.Store(true)
		if r.inOp.Load() {
			r.fail(fmt.Errorf("%w: Ring closed during an operation", ErrAborted), wire.ReasonCanceled, r.rank)
		} else {
			r.mu.Lock()
			first := r.cause == nil
			if first {
				r.cause = fmt.Errorf("%w: Ring of round %d", ErrClosed, r.round)
				close(r.dead)
			}
			r.mu.Unlock()
			if first {
				r.sendCtrl(wire.KindClose, nil)
			}
		}
		close(r.quit)
		for _, p := range r.peers {
			if p != nil {
				p.ctrl.Close()
				p.mesh.Close()
			}
		}
		for _, l := range r.all {
			l.right.Close()
			l.left.Close()
		}
		r.wg.Wait()
		for _, l := range r.all {
			shmUnmap(l.tx)
			shmUnmap(l.rx)
			l.tx, l.rx = nil, nil
		}
		if r.t != nil {
			r.t.forget(r)
		}
	})
	return nil
}

// fail records cause as the reason the Ring is broken (the first cause
// wins; the winning cause is returned), tells the other ranks with an abort
// notice when reason is not 0, and closes the data connections so that any
// blocked operation returns, here and on the peers.
func (r *Ring) fail(cause error, reason uint8, blamed int) error {
	r.mu.Lock()
	if r.cause != nil {
		c := r.cause
		r.mu.Unlock()
		return c
	}
	r.cause = cause
	close(r.dead)
	r.mu.Unlock()
	if reason != 0 {
		r.sendCtrl(wire.KindAbort, abortFor(cause, r.rank, reason, blamed))
	}
	for _, p := range r.peers {
		if p != nil {
			p.mesh.Close()
		}
	}
	for _, l := range r.all {
		l.right.Close()
		l.left.Close()
	}
	return cause
}

// abortFor is the abort notice of a Ring failing with cause: from this
// rank, unless cause is a timeout this rank learnt of from another's
// notice; a timeout carries its verdict (the silent and busy ranks, how
// long it waited), so every rank that hears of it, first or second hand,
// names the same ranks.
func abortFor(cause error, rank int, reason uint8, blamed int) *wire.Abort {
	a := &wire.Abort{Origin: int32(rank), Blamed: int32(blamed), Reason: reason}
	var te *TimeoutError
	if reason == wire.ReasonTimeout && errors.As(cause, &te) {
		a.Origin, a.Verdict = int32(te.From), true
		a.Waited, a.Silent, a.Busy = int64(te.Waited), te.Silent, te.Busy
	}
	return a
}

// sendCtrl writes a control frame (an abort notice when a is not nil,
// otherwise an empty frame of kind) to every peer, bounded by
// ctrlWriteTimeout.
func (r *Ring) sendCtrl(kind wire.Kind, a *wire.Abort) {
	deadline := time.Now().Add(ctrlWriteTimeout)
	var frame []byte // an abort: built once (it is sent once in a Ring's life)
	if a != nil {
		h := wire.Header{Kind: kind, Round: r.round, Length: uint32(a.Size())}
		frame = make([]byte, wire.HeaderSize, wire.HeaderSize+a.Size())
		h.Put(frame)
		frame = wire.AppendAbort(frame, a)
	}
	for _, p := range r.peers {
		if p == nil {
			continue
		}
		p.ctrlMu.Lock()
		b := frame
		if b == nil {
			h := wire.Header{Kind: kind, Round: r.round}
			h.Put(p.ctrlW[:])
			b = p.ctrlW[:wire.HeaderSize]
		}
		p.ctrl.SetWriteDeadline(deadline)
		p.ctrl.Write(b)
		p.ctrlMu.Unlock()
	}
}

// ctrlLoop reads the control connection of peer p for the Ring's life.
func (r *Ring) ctrlLoop(p *peerLink) {
	defer r.wg.Done()
	br := bufio.NewReaderSize(p.ctrl, 256)
	var hb [wire.HeaderSize]byte
	var pb [wire.HeaderSize]byte
	// The longest control payload: an announced header, or an abort
	// notice with a timeout's verdict (read into a buffer of its own).
	maxLen := max(len(pb), wire.MaxAbortSize(r.size))
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			if r.closing.Load() || p.closed.Load() {
				return
			}
			r.fail(&PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("control connection: %w", err)}, wire.ReasonPeerLost, p.rank)
			return
		}
		h, err := wire.ParseHeader(hb[:], maxLen)
		if err == nil && h.Round != r.round {
			err = fmt.Errorf("control frame of round %d in round %d", h.Round, r.round)
		}
		if err == nil && h.Kind == wire.KindAbort {
			ab := pb[:min(int(h.Length), len(pb))]
			if int(h.Length) > len(pb) {
				ab = make([]byte, h.Length) // bounded by maxLen
			}
			if _, err = io.ReadFull(br, ab); err == nil {
				var a wire.Abort
				if a, err = wire.ParseAbort(ab, r.size); err == nil {
					// Pass the notice on (a timeout with its origin and
					// verdict), so a rank whose link to the origin is
					// slow still learns the cause.
					r.fail(r.abortCause(p.rank, a), a.Reason, int(a.Blamed))
					return
				}
			}
		} else if err == nil && h.Kind == wire.KindAnnounce && h.Length == wire.HeaderSize {
			if _, err = io.ReadFull(br, pb[:]); err == nil {
				var op wire.Header
				if op, err = wire.ParseHeader(pb[:], 0); err == nil && (op.Kind > wire.KindBarrier || op.Seq != h.Seq || op.Round != r.round) {
					err = fmt.Errorf("announced %v #%d of round %d in an announcement of #%d", op.Kind, op.Seq, op.Round, h.Seq)
				}
				if err == nil {
					r.announcedBy(p.rank, op)
					continue
				}
			}
		} else if err == nil && h.Kind == wire.KindBusy && h.Length == 0 {
			r.peerBusy(p.rank)
			continue
		} else if err == nil && h.Kind == wire.KindClose && h.Length == 0 {
			p.closed.Store(true)
			continue
		} else if err == nil {
			err = fmt.Errorf("unexpected %v frame of %d bytes on the control connection", h.Kind, h.Length)
		}
		if r.closing.Load() {
			return
		}
		r.fail(&PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: %v", ErrBadFrame, err)}, wire.ReasonPeerLost, p.rank)
		return
	}
}

// abortCause turns an abort notice from peer `from` into this rank's error.
func (r *Ring) abortCause(from int, a wire.Abort) error {
	switch a.Reason {
	case wire.ReasonPeerLost:
		return &PeerError{Rank: int(a.Blamed), Round: r.round, Err: fmt.Errorf("connection lost (reported by rank %d)", from)}
	case wire.ReasonTimeout:
		te := &TimeoutError{Round: r.round, From: int(a.Origin)}
		if a.Verdict {
			te.Silent, te.Busy, te.Waited = a.Silent, a.Busy, time.Duration(a.Waited)
		} else if a.Blamed >= 0 {
			te.Silent = []int{int(a.Blamed)}
		}
		return te
	case wire.ReasonCanceled:
		if a.Blamed >= 0 {
			return &PeerError{Rank: int(a.Blamed), Round: r.round, Err: fmt.Errorf("%w by the rank (context cancelled or closed)", ErrAborted)}
		}
	}
	return fmt.Errorf("%w: rank %d saw a mismatched or malformed frame", ErrMismatch, from)
}

// watchLoop turns the cancellation of an operation's context into an abort
// without allocating per operation.
func (r *Ring) watchLoop() {
	defer r.wg.Done()
	for {
		var ctx context.Context
		select {
		case <-r.quit:
			return
		case ctx = <-r.watchCh:
		}
		select {
		case <-ctx.Done():
			r.fail(ctxCause(ctx.Err()), wire.ReasonCanceled, r.rank)
			select {
			case <-r.unwatchCh:
			case <-r.quit:
				return
			}
		case <-r.unwatchCh:
		case <-r.quit:
			return
		}
	}
}

func ctxCause(err error) error { return mesh.Aborted(err) }

// begin starts an operation: checks the Ring, sets the deadlines of the data
// connections and arms the context watch.
func (r *Ring) begin(ctx context.Context) error {
	if c := r.causeNow(); c != nil {
		return c
	}
	if err := ctx.Err(); err != nil {
		return r.fail(ctxCause(err), wire.ReasonCanceled, r.rank)
	}
	for _, p := range r.peers {
		if p != nil && p.closed.Load() {
			return r.fail(&PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: the rank closed its Ring", ErrClosed)}, wire.ReasonPeerLost, p.rank)
		}
	}
	r.seq++
	r.inOp.Store(true)
	if r.size == 1 {
		return nil
	}
	now := time.Now()
	r.opSeq.Store(r.seq)
	r.opStart.Store(now.UnixNano())
	select {
	case r.agree.wake <- struct{}{}:
	default:
	}
	ctxDl, hasCtxDl := ctx.Deadline()
	r.beginDeadline(r.seq, now, ctxDl, hasCtxDl)
	r.watched = false
	if ctx.Done() != nil {
		select {
		case r.watchCh <- ctx:
			r.watched = true
		case <-r.quit:
			r.endDeadline()
			r.inOp.Store(false)
			return r.fail(fmt.Errorf("%w: Ring", ErrClosed), 0, -1)
		}
	}
	return nil
}

// end finishes an operation begun by begin.
func (r *Ring) end(err error) error {
	if r.watched {
		select {
		case r.unwatchCh <- struct{}{}:
		case <-r.quit:
		}
		r.watched = false
	}
	if r.size > 1 {
		r.endDeadline()
	}
	r.inOp.Store(false)
	if err != nil {
		if c := r.causeNow(); c != nil {
			return c
		}
	}
	return err
}

// connErr classifies a failed read or write on a data connection to peer.
func (r *Ring) connErr(peer int, err error) error {
	if c := r.causeNow(); c != nil {
		return c
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return r.timedOut()
	}
	if p := r.peers[peer]; p != nil && p.closed.Load() {
		return r.fail(&PeerError{Rank: peer, Round: r.round, Err: fmt.Errorf("%w: the rank closed its Ring: %v", ErrClosed, err)}, wire.ReasonPeerLost, peer)
	}
	// The peer may have closed only because a third rank failed: give the
	// control connections a moment to name the rank at fault.
	tm := time.NewTimer(verdictGrace)
	select {
	case <-r.dead:
	case <-tm.C:
	}
	tm.Stop()
	var bad error = fmt.Errorf("data connection: %w", err)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		bad = fmt.Errorf("%w: truncated frame: %w", ErrBadFrame, err)
	}
	return r.fail(&PeerError{Rank: peer, Round: r.round, Err: bad}, wire.ReasonPeerLost, peer)
}

// protoErr fails the Ring for a malformed or mismatched frame from peer.
func (r *Ring) protoErr(err error) error {
	if c := r.causeNow(); c != nil {
		return c
	}
	return r.fail(err, wire.ReasonProtocol, -1)
}

// writeFrame sends header h and payload on c (two writes, no copy).
func (r *Ring) writeFrame(c net.Conn, hb []byte, h *wire.Header, payload []byte, peer int, length ...int) error {
	h.Length = uint32(len(payload))
	if len(length) > 0 {
		h.Length = uint32(length[0])
	}
	h.Put(hb)
	if _, err := c.Write(hb[:wire.HeaderSize]); err != nil {
		return r.connErr(peer, err)
	}
	if len(payload) > 0 {
		if _, err := c.Write(payload); err != nil {
			return r.connErr(peer, err)
		}
	}
	return nil
}

// readFrame reads one frame from br into dst, checking that it is exactly
// the frame this rank expects (want, with len(dst) payload bytes).
func (r *Ring) readFrame(br *bufio.Reader, hb []byte, want *wire.Header, dst []byte, peer int) error {
	if err := r.readHeader(br, hb, want, len(dst), peer); err != nil {
		return err
	}
	return r.readBody(br, dst, peer)
}

// readBody reads a frame's payload, whose header was read, into dst.
func (r *Ring) readBody(br *bufio.Reader, dst []byte, peer int) error {
	if _, err := io.ReadFull(br, dst); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return r.connErr(peer, err)
	}
	return nil
}

// readHeader reads one frame header from br and checks that it is exactly
// the one this rank expects (want, with a payload of length bytes).
func (r *Ring) readHeader(br *bufio.Reader, hb []byte, want *wire.Header, length int, peer int) error {
	_, err := r.readHeaderAux(br, hb, want, want.Aux, length, peer)
	return err
}

// readHeaderAux is readHeader accepting either want.Aux or alt in the aux
// field; it tells whether the header had alt (and not want.Aux).
func (r *Ring) readHeaderAux(br *bufio.Reader, hb []byte, want *wire.Header, alt uint64, length int, peer int) (bool, error) {
	if _, err := io.ReadFull(br, hb[:wire.HeaderSize]); err != nil {
		return false, r.connErr(peer, err)
	}
	h, err := wire.ParseHeader(hb[:wire.HeaderSize], r.cfg.MaxFrameBytes)
	if err != nil {
		return false, r.protoErr(fmt.Errorf("%w: from rank %d: %v", ErrBadFrame, peer, err))
	}
	if h.Kind != want.Kind || h.Op != want.Op || h.Round != want.Round || h.Seq != want.Seq ||
		h.Total != want.Total || (h.Aux != want.Aux && h.Aux != alt) || int(h.Length) != length {
		return false, r.protoErr(fmt.Errorf("%w: rank %d sent %v #%d (op %#x, round %d, %d of %d bytes, aux %d), rank %d expected %v #%d (op %#x, round %d, %d of %d bytes, aux %d)",
			ErrMismatch, peer, h.Kind, h.Seq, h.Op, h.Round, h.Length, h.Total, h.Aux,
			r.rank, want.Kind, want.Seq, want.Op, want.Round, length, want.Total, want.Aux))
	}
	return h.Aux == alt && alt != want.Aux, nil
}

func prog(step, chunk int) int64 { return int64(step)<<32 | int64(chunk+1) }

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// waitProg waits until *p reaches need or the Ring breaks.
func (r *Ring) waitProg(p *atomic.Int64, note chan struct{}, need int64) error {
	for p.Load() < need {
		select {
		case <-note:
		case <-r.dead:
			return r.causeNow()
		}
	}
	return nil
}

func mod(a, n int) int { return ((a % n) + n) % n }

// span returns the i-th of parts balanced contiguous pieces of [lo, hi).
func span(lo, hi, i, parts int) (int, int) {
	m := hi - lo
	return lo + int(int64(m)*int64(i)/int64(parts)), lo + int(int64(m)*int64(i+1)/int64(parts))
}

func (r *Ring) sendLoop(g *group, l *lane) {
	defer r.wg.Done()
	for {
		select {
		case <-r.quit:
			return
		case j := <-l.sendJobs:
			r.laneFinished(g, r.laneSend(g, l, &j))
		}
	}
}

func (r *Ring) recvLoop(g *group, l *lane) {
	defer r.wg.Done()
	for {
		select {
		case <-r.quit:
			return
		case j := <-l.recvJobs:
			r.laneFinished(g, r.laneRecv(g, l, &j))
		}
	}
}

func (r *Ring) header(j *laneJob) wire.Header {
	return wire.Header{Kind: j.kind, Op: j.opb, Round: r.round, Seq: j.seq, Total: j.total, Aux: j.aux}
}

// laneSend is the sending half of lane l's part of a job of group g.
func (r *Ring) laneSend(g *group, l *lane, j *laneJob) error {
	n, rank := g.n(), g.pos
	right := g.right()
	h := r.header(j)
	chunk := r.cfg.chunkBytes() / j.elem
	switch j.algo {
	case algoRing:
		// Step s < n-1 (reduce-scatter) sends segment rank-s, which this
		// rank reduced at step s-1; step s >= n-1 (allgather) sends segment
		// rank+1-(s-n+1), final.
		for s := j.s0; s < j.s1; s++ {
			seg := mod(rank-s, n)
			if s >= n-1 {
				seg = mod(rank+1-(s-n+1), n)
			}
			lo, hi := j.segment(seg, n)
			for k, c := 0, lo; c < hi; k, c = k+1, c+chunk {
				e := min(c+chunk, hi)
				if s > j.s0 {
					if err := r.waitProg(&l.recvProg, l.recvNote, prog(s-1, k)); err != nil {
						return err
					}
				}
				if err := r.laneWrite(l, &h, j.buf[c*j.elem:e*j.elem], right); err != nil {
					return err
				}
				l.sendProg.Store(prog(s, k))
				notify(l.sendNote)
			}
		}
	case algoChain:
		pos := mod(rank-j.root, n)
		if pos == n-1 {
			return nil
		}
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			if pos > 0 {
				if err := r.waitProg(&l.recvProg, l.recvNote, prog(0, k)); err != nil {
					return err
				}
			}
			if err := r.laneWrite(l, &h, j.buf[c*j.elem:e*j.elem], right); err != nil {
				return err
			}
		}
	case algoOrdered:
		return r.orderedSend(g, l, j, chunk)
	case algoPair:
		if l.tx != nil {
			return r.pairSendShm(l, j, &h, chunk, right)
		}
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			if err := r.laneWrite(l, &h, j.buf[c*j.elem:e*j.elem], right); err != nil {
				return err
			}
			l.sendProg.Store(prog(0, k))
			notify(l.sendNote)
		}
	case algoGather:
		for s := 0; s < n-1; s++ {
			base := mod(rank-s, n) * j.block
			for k, c := 0, base+j.lo; c < base+j.hi; k, c = k+1, c+chunk {
				e := min(c+chunk, base+j.hi)
				if s > 0 {
					if err := r.waitProg(&l.recvProg, l.recvNote, prog(s-1, k)); err != nil {
						return err
					}
				}
				if err := r.laneWrite(l, &h, j.buf[c:e], right); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// laneRecv is the receiving half of lane l's part of a job of group g.
func (r *Ring) laneRecv(g *group, l *lane, j *laneJob) error {
	n, rank := g.n(), g.pos
	left := g.left()
	h := r.header(j)
	chunk := r.cfg.chunkBytes() / j.elem
	switch j.algo {
	case algoRing:
		for s := j.s0; s < j.s1; s++ {
			seg := mod(rank-s-1, n)
			if s >= n-1 {
				seg = mod(rank-(s-n+1), n)
			}
			lo, hi := j.segment(seg, n)
			for k, c := 0, lo; c < hi; k, c = k+1, c+chunk {
				e := min(c+chunk, hi)
				dst := j.buf[c*j.elem : e*j.elem]
				if s < n-1 {
					if err := r.laneRecvInto(l, &h, dst, j.red, left); err != nil {
						return err
					}
					if s == n-2 && j.div > 0 {
						j.scale(dst, j.div)
					}
				} else {
					// Allgather step t overwrites the segment this rank sent
					// at reduce-scatter step t: wait until that send is done
					// (when this job sent it; an earlier job has finished).
					if j.s0 == 0 {
						if err := r.waitProg(&l.sendProg, l.sendNote, prog(s-n+1, k)); err != nil {
							return err
						}
					}
					if err := r.laneRecvInto(l, &h, dst, nil, left); err != nil {
						return err
					}
				}
				l.recvProg.Store(prog(s, k))
				notify(l.recvNote)
			}
		}
	case algoChain:
		if mod(rank-j.root, n) == 0 {
			return nil
		}
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			if err := r.laneRecvInto(l, &h, j.buf[c*j.elem:e*j.elem], j.red, left); err != nil {
				return err
			}
			l.recvProg.Store(prog(0, k))
			notify(l.recvNote)
		}
	case algoOrdered:
		return r.orderedRecv(g, l, j, chunk)
	case algoPair:
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			// The chunk is reduced in place only once this rank's own
			// copy of it has been sent.
			sent := func() error { return r.waitProg(&l.sendProg, l.sendNote, prog(0, k)) }
			if j.vec != nil {
				if err := r.laneRecvPairVec(l, &h, j, c*j.elem, e*j.elem, rank == 1, left, sent); err != nil {
					return err
				}
			} else {
				dst := j.buf[c*j.elem : e*j.elem]
				if err := r.laneRecvPair(l, &h, dst, j.redTo, rank == 1, left, sent); err != nil {
					return err
				}
				if j.div > 0 {
					j.scale(dst, j.div)
				}
			}
			l.recvProg.Store(prog(0, k))
			notify(l.recvNote)
		}
	case algoGather:
		for s := 0; s < n-1; s++ {
			base := mod(rank-s-1, n) * j.block
			for k, c := 0, base+j.lo; c < base+j.hi; k, c = k+1, c+chunk {
				e := min(c+chunk, base+j.hi)
				if err := r.laneRecvInto(l, &h, j.buf[c:e], nil, left); err != nil {
					return err
				}
				l.recvProg.Store(prog(s, k))
				notify(l.recvNote)
			}
		}
	}
	return nil
}

// runLanes runs job on `used` lanes of g and waits for all of them.
func (r *Ring) runLanes(g *group, j laneJob, extent, used int) error {
	r.startLanes(g, j, extent, used)
	return r.waitLanes(g)
}

// startLanes dispatches job to `used` lanes of g, lane i taking the i-th
// balanced part of [0, extent) (with j.segMajor: the whole extent, and the
// i-th part of each segment). The group must be idle; waitLanes waits.
func (r *Ring) startLanes(g *group, j laneJob, extent, used int) {
	g.err = nil // no lane half of g runs between jobs
	g.used = used
	g.pending.Store(int32(2 * used))
	g.started = 0
	j.nl = used
dispatch:
	for i := 0; i < used; i++ {
		l := g.lanes[i]
		l.sendProg.Store(0)
		l.recvProg.Store(0)
		if j.segMajor {
			j.lo, j.hi, j.li = 0, extent, i
		} else {
			j.lo, j.hi = span(0, extent, i, used)
		}
		for _, c := range [2]chan laneJob{l.sendJobs, l.recvJobs} {
			select {
			case c <- j:
				g.started++
			case <-r.dead:
				break dispatch
			}
		}
	}
}

// waitLanes waits for the job startLanes dispatched on g and returns its
// first error.
func (r *Ring) waitLanes(g *group) error {
	// One wake-up for the caller: the last lane half to finish signals.
	if rest := int32(2*g.used - g.started); rest == 0 || g.pending.Add(-rest) != 0 {
		<-g.done
	}
	g.errMu.Lock()
	first := g.err
	g.errMu.Unlock()
	if g.started < 2*g.used && first == nil {
		first = r.causeNow()
	}
	return first
}

// laneFinished records the result of one lane half of g's current job.
func (r *Ring) laneFinished(g *group, err error) {
	if err != nil {
		g.errMu.Lock()
		if g.err == nil {
			g.err = err
		}
		g.errMu.Unlock()
	}
	if g.pending.Add(-1) == 0 {
		g.done <- struct{}{}
	}
}

// lanesFor picks how many lanes to use for an operation of the given bytes.
func (r *Ring) lanesFor(bytes int) int { return r.groupLanesFor(r.groups[groupFlat], bytes) }

// allReduceLanes picks how many lanes a flat allreduce of the given bytes
// uses. The two-rank exchange (algoPair) splits over lanes only when each
// lane gets at least shmSlots chunks: below that one lane moves the buffer
// in as few chunks, and a lane costs each rank two goroutine hand-offs
// and a frame per chunk, which cost more than they overlap (measured with
// examples/mnist's MLP, 814 KB of gradients: fewer context switches and
// less CPU per step with one lane).
func (r *Ring) allReduceLanes(bytes int) int {
	if r.size != 2 {
		return r.lanesFor(bytes)
	}
	g := r.groups[groupFlat]
	return max(1, min(len(g.lanes), bytes/(shmSlots*r.cfg.chunkBytes())))
}

func (r *Ring) groupLanesFor(g *group, bytes int) int {
	per := max(r.cfg.chunkBytes(), 64<<10)
	return max(1, min(len(g.lanes), bytes/per))
}

// exchange sends payload to every other rank over the mesh connections, then
// reads one frame from each rank into recv(rank); frames are small enough
// (at most DirectBytes) that the writes never wait for the reads.
func (r *Ring) exchange(h wire.Header, payload []byte, sendTo func(int) bool, recv func(int) ([]byte, bool)) error {
	for i := 1; i < r.size; i++ {
		if p := (r.rank + i) % r.size; sendTo(p) {
			if err := r.meshSend(p, h, payload); err != nil {
				return err
			}
		}
	}
	for i := 1; i < r.size; i++ {
		p := (r.rank - i + r.size) % r.size
		if dst, ok := recv(p); ok {
			if err := r.meshRecv(p, h, dst); err != nil {
				return err
			}
		}
	}
	return nil
}

func always(int) bool { return true }

// AllReduceFloat32 reduces buf element-wise over all ranks with op, in
// place; every rank ends with bit-identical values. Buffers of at most
// Config.DirectBytes use the direct exchange (each rank reduces all inputs
// in rank order 0..n-1), as do larger ones in a world of two ranks (x_0
// op x_1, see the package doc); larger ones the pipelined ring, where the element
// at index i of lane part p, segment s is reduced in ring order starting at
// rank s: ((x_s + x_{s+1}) + ...) + x_{s-1}. In a hierarchical round
// (Hierarchical) large buffers follow the rings of the hierarchy instead,
// in an order fixed by the layout, the length and the Config. Small
// buffers in worlds of more than 8 ranks use recursive doubling (see the
// package doc). OpAvg divides the sum by the world size. It does not
// allocate. Errors: see Ring.
func (r *Ring) AllReduceFloat32(ctx context.Context, buf []float32, op Op) error {
	return r.allReduce(ctx, f32Bytes(buf), 4, op)
}

// AllReduceFloat64 is AllReduceFloat32 for float64 values.
func (r *Ring) AllReduceFloat64(ctx context.Context, buf []float64, op Op) error {
	return r.allReduce(ctx, f64Bytes(buf), 8, op)
}

func (r *Ring) allReduce(ctx context.Context, b []byte, elem int, op Op) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	return r.end(r.allReduceIn(b, nil, elem, op))
}

// allReduceTensors is AllReduceFloat32 of the tensors' concatenation,
// with the results written back into the tensors, without copying them
// into one buffer: the two-rank exchange over shared memory copies each
// chunk from the tensors into its slot and reduces the other rank's chunk
// from its slot into the tensors (the same wire traffic and bits as
// AllReduceFloat32 of the concatenation). handled is false, before any
// communication, where that exchange would not run (another world size or
// layout, a buffer for the direct path, a lane without shared memory):
// the caller then fuses the tensors itself. The choice is this rank's
// alone; the other rank may fuse. Buckets.AllReduce calls it.
func (r *Ring) allReduceTensors(ctx context.Context, tensors [][]float32, op Op) (handled bool, err error) {
	if r.size != 2 || r.layout.mode != HierarchyOff || !op.valid() {
		return false, nil
	}
	total := 0
	for _, t := range tensors {
		total += 4 * len(t)
	}
	if total <= r.cfg.DirectBytes {
		return false, nil
	}
	for _, l := range r.groups[groupFlat].lanes[:r.allReduceLanes(total)] {
		if l.tx == nil || l.rx == nil {
			return false, nil
		}
	}
	r.vec.set(tensors)
	defer r.vec.set(nil)
	if err := r.begin(ctx); err != nil {
		return true, err
	}
	return true, r.end(r.allReduceIn(nil, &r.vec, 4, op))
}

// allReduceIn runs an allreduce of b, or with vec non-nil (only from
// allReduceTensors: two ranks, more than DirectBytes) of vec's tensors.
func (r *Ring) allReduceIn(b []byte, vec *vecBuf, elem int, op Op) error {
	if !op.valid() {
		return r.protoErr(fmt.Errorf("%w: unknown reduction %v", ErrInvalid, op))
	}
	if r.size == 1 {
		return nil
	}
	size := len(b)
	if vec != nil {
		size = vec.total
	}
	red, scale := kernels(elem, op)
	opb := uint8(op) | uint8(elem)<<4
	h := wire.Header{Kind: wire.KindAllReduce, Op: opb, Round: r.round, Seq: r.seq, Total: uint64(size)}
	if err := r.note(h); err != nil {
		return err
	}
	if size <= r.cfg.DirectBytes && r.size > directMaxWorld {
		return r.recursiveDoubling(h, b, red, scale, op)
	}
	if size <= r.cfg.DirectBytes {
		err := r.exchange(h, b, always, func(p int) ([]byte, bool) { return r.scratch[p][:len(b)], true })
		if err != nil {
			return err
		}
		copy(r.scratch[r.rank], b)
		copy(b, r.scratch[0][:len(b)])
		for p := 1; p < r.size; p++ {
			red(b, r.scratch[p][:len(b)])
		}
		if op == OpAvg {
			scale(b, r.size)
		}
		return nil
	}
	if r.layout.mode != HierarchyOff {
		return r.hierAllReduce(h, b, elem, op, red, scale)
	}
	j := laneJob{kind: wire.KindAllReduce, algo: algoRing, opb: opb, op: op, elem: elem, buf: b, seq: r.seq, total: uint64(size),
		red: red, scale: scale, s0: 0, s1: 2 * (r.size - 1)}
	if r.size == 2 {
		// Two ranks: one exchange instead of the ring's two steps (see
		// the package doc). Each rank sends and reduces the whole buffer
		// instead of half of it, but no rank waits for the other's
		// reduction: the rank that arrives last finds the other's data
		// already there, and the one that waits is woken once.
		j.algo, j.redTo, j.vec = algoPair, reduceTo(elem, op), vec
	}
	if op == OpAvg {
		j.div = r.size
	}
	return r.runLanes(r.groups[groupFlat], j, size/elem, r.allReduceLanes(size))
}

// directMaxWorld is the largest world size whose small allreduces use the
// direct exchange; larger worlds use recursive doubling (log2 steps instead
// of one step with size-1 messages per rank). A variable for tests.
var directMaxWorld = 8

// recursiveDoubling is the latency path for large worlds (Thakur,
// Rabenseifner & Gropp, "Optimization of collective communication
// operations in MPICH", 2005): with p the largest power of two <= n, rank
// q+p (q < n-p) first folds its buffer into rank q; ranks 0..p-1 then
// exchange with rank^1, rank^2, ... rank^(p/2), each combining the two
// buffers (addition is commutative, so both partners get the same bits);
// finally rank q sends the result back to rank q+p.
func (r *Ring) recursiveDoubling(h wire.Header, b []byte, red reduceFunc, scale scaleFunc, op Op) error {
	n, rank := r.size, r.rank
	p := 1
	for p*2 <= n {
		p *= 2
	}
	tmp := r.scratch[rank][:len(b)]
	if rank >= p {
		if err := r.meshSend(rank-p, h, b); err != nil {
			return err
		}
		return r.meshRecv(rank-p, h, b)
	}
	if rank < n-p {
		if err := r.meshRecv(rank+p, h, tmp); err != nil {
			return err
		}
		red(b, tmp)
	}
	for mask := 1; mask < p; mask <<= 1 {
		partner := rank ^ mask
		if err := r.meshSend(partner, h, b); err != nil {
			return err
		}
		if err := r.meshRecv(partner, h, tmp); err != nil {
			return err
		}
		red(b, tmp)
	}
	if op == OpAvg {
		scale(b, n)
	}
	if rank < n-p {
		return r.meshSend(rank+p, h, b)
	}
	return nil
}

// meshSend writes one frame (header and payload of at most DirectBytes, in
// one write) to peer over its mesh connection.
func (r *Ring) meshSend(peer int, h wire.Header, payload []byte) error {
	pl := r.peers[peer]
	h.Length = uint32(len(payload))
	h.Put(pl.meshW)
	n := wire.HeaderSize + copy(pl.meshW[wire.HeaderSize:], payload)
	if _, err := pl.mesh.Write(pl.meshW[:n]); err != nil {
		return r.connErr(peer, err)
	}
	return nil
}

// meshRecv reads the expected frame from peer's mesh connection into dst.
func (r *Ring) meshRecv(peer int, h wire.Header, dst []byte) error {
	pl := r.peers[peer]
	return r.readFrame(pl.meshR, pl.meshH[:], &h, dst, peer)
}

// Broadcast copies root's buf to buf on every other rank. len(buf) must be
// equal on all ranks (else ErrMismatch). Buffers of at most DirectBytes go
// straight from the root to every rank; larger ones along the pipelined
// chain root -> root+1 -> ... over all lanes. It does not allocate.
func (r *Ring) Broadcast(ctx context.Context, buf []byte, root int) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	return r.end(r.broadcastIn(buf, root))
}

func (r *Ring) broadcastIn(buf []byte, root int) error {
	if root < 0 || root >= r.size {
		return r.protoErr(fmt.Errorf("%w: broadcast root %d outside world size %d", ErrInvalid, root, r.size))
	}
	if r.size == 1 {
		return nil
	}
	h := wire.Header{Kind: wire.KindBroadcast, Round: r.round, Seq: r.seq, Total: uint64(len(buf)), Aux: uint64(root)}
	if err := r.note(h); err != nil {
		return err
	}
	if len(buf) <= r.cfg.DirectBytes {
		if r.rank == root {
			return r.exchange(h, buf, always, func(int) ([]byte, bool) { return nil, false })
		}
		return r.exchange(h, nil, func(int) bool { return false }, func(p int) ([]byte, bool) { return buf, p == root })
	}
	j := laneJob{kind: wire.KindBroadcast, algo: algoChain, elem: 1, buf: buf, root: root, aux: uint64(root), seq: r.seq, total: uint64(len(buf))}
	return r.runLanes(r.groups[groupFlat], j, len(buf), r.lanesFor(len(buf)))
}

// AllGather concatenates every rank's send buffer in rank order into recv
// on every rank: len(recv) must be Size()*len(send), and len(send) equal on
// all ranks (else ErrMismatch / ErrInvalid). Ring allgather over all lanes;
// direct exchange for blocks of at most DirectBytes. It does not allocate.
func (r *Ring) AllGather(ctx context.Context, send, recv []byte) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	return r.end(r.allGatherIn(send, recv))
}

func (r *Ring) allGatherIn(send, recv []byte) error {
	b := len(send)
	if len(recv) != b*r.size {
		return r.protoErr(fmt.Errorf("%w: allgather recv of %d bytes, want %d x %d", ErrInvalid, len(recv), r.size, b))
	}
	copy(recv[r.rank*b:], send)
	if r.size == 1 {
		return nil
	}
	h := wire.Header{Kind: wire.KindAllGather, Round: r.round, Seq: r.seq, Total: uint64(b)}
	if err := r.note(h); err != nil {
		return err
	}
	if b <= r.cfg.DirectBytes {
		return r.exchange(h, send, always, func(p int) ([]byte, bool) { return recv[p*b : (p+1)*b], true })
	}
	j := laneJob{kind: wire.KindAllGather, algo: algoGather, elem: 1, buf: recv, block: b, seq: r.seq, total: uint64(b)}
	return r.runLanes(r.groups[groupFlat], j, b, r.lanesFor(b))
}

// Barrier returns once every rank of the round has entered it (a direct
// exchange of empty frames). It does not allocate.
func (r *Ring) Barrier(ctx context.Context) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	var err error
	if r.size > 1 {
		h := wire.Header{Kind: wire.KindBarrier, Round: r.round, Seq: r.seq}
		if err = r.note(h); err == nil {
			err = r.exchange(h, nil, always, func(int) ([]byte, bool) { return nil, true })
		}
	}
	return r.end(err)
}
