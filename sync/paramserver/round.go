package paramserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
	"github.com/elastictrain/elastictrain/sync/mesh"
)

// Error codes of a PSError frame.
const (
	psCodeInvalid = 1 // the request is malformed or breaks the protocol
	psCodeStale   = 2 // an asynchronous push beyond MaxStaleness
	psCodeLost    = 3 // a fetch of a commit this rank does not hold
	psCodeTimeout = 4 // the shard did not reach the step within OpTimeout
	psCodeClosed  = 5 // the round is over on the serving rank
	psCodeStore   = 6 // the ShardStore failed during a commit
)

// psError is an error a shard answers with.
type psError struct {
	code uint8
	msg  string
}

func (e *psError) Error() string { return e.msg }

func psErrf(code uint8, format string, a ...any) *psError {
	return &psError{code: code, msg: fmt.Sprintf(format, a...)}
}

// sentinel maps a shard's error code to the package's sentinel.
func (e *psError) sentinel() error {
	switch e.code {
	case psCodeStale:
		return ErrStale
	case psCodeLost:
		return ErrRowsLost
	case psCodeTimeout:
		return mesh.ErrTimeout
	case psCodeClosed:
		return mesh.ErrClosed
	case psCodeStore:
		return mesh.ErrAborted
	}
	return mesh.ErrInvalid
}

// Rows names rows of one table and the buffer of their values (Pull) or
// gradients (Push): Values holds len(IDs)*Dim float32, row i at
// Values[i*Dim:(i+1)*Dim]. IDs may repeat (a pull fills each copy; a push
// sums them).
type Rows struct {
	Table  int       // index into the Server's tables
	IDs    []int64   // row IDs, 0 <= ID < TableSpec.Rows
	Values []float32 // len(IDs)*Dim values
}

// Stats counts a Round's traffic as a client, for monitoring and
// benchmarks.
type Stats struct {
	PulledRows, PushedRows int64 // rows requested and sent, local shards included
	SentBytes, RecvBytes   int64 // frame bytes written to and read from peers (headers included)
	StalePushes            int64 // pushes refused with ErrStale
	// RestoredFromPeers and RestoredFromStore count the rows this rank's
	// shards took at the start of the round from commits in memory (their
	// old host's or a replica's, this rank's own included) and from
	// Config.Store.
	RestoredFromPeers, RestoredFromStore int64
	// StoreShards lists the old shards (of the restore step's layout) that
	// the round read from Config.Store because no live rank held them in
	// memory.
	StoreShards []int
	// ReplicatedRows counts the rows this rank's shards sent to replicas
	// at commits, and CommitCopiedRows the rows they copied into their
	// own in-memory commits.
	ReplicatedRows, CommitCopiedRows int64
}

// Round is one round of a parameter server on this process: the shards
// this rank hosts in the round's layout, connections to every other rank,
// and the client calls Pull, Push and Commit. Create it with
// Server.Round, on every rank of the round with the same World.
//
// Pull, Push, Commit and Stats are called from one goroutine; Close, Err
// and Done from any. After an error other than ErrStale the round is
// broken: every later call returns that error; start a new round.
//
// Failure semantics are the Ring's: the parameter server's connections are
// those of a Ring of its own Transport, so a rank that dies is noticed at
// once on every rank, and a rank that hangs turns into ErrTimeout after the
// Transport's Config.OpTimeout. A request or reply of an older round is
// never accepted: connections are authenticated per round and every frame
// carries its round.
type Round struct {
	ps        *Server
	m         mesh.Mesh // the round's streams and failure state
	opTimeout time.Duration
	maxFrame  int
	round     uint64
	rank      int
	size      int
	hosts     []int
	addrs     []string // by rank: the round's advertised addresses
	workers   []int
	widx      []int // by rank: index in workers, or -1
	shards    int
	restore   int64
	local     []*psShard // by shard index; nil when hosted elsewhere
	peers     []*psPeer  // by rank; nil for self
	rows      []int      // by table: rows per frame

	// client state, owned by the calling goroutine
	step    int64
	pulled  []int64 // async: version of each shard's last pull; -1 none
	seen    []bool
	pos     []int32
	gstart  []int
	scratch []byte
	lbuf    []byte // local replies

	stats struct {
		pulled, pushed, sent, recv, stale        atomic.Int64
		fromPeers, fromStore, replicated, copied atomic.Int64
	}
	storeShards []int // old shards read from the store (set by migrate)

	barSeq    int64         // client: barriers entered
	barMu     gosync.Mutex  // guards barIn, barNote
	barIn     int64         // barriers this rank has entered
	barServed int64         // peers' barrier requests answered (reply written)
	barNote   chan struct{} // closed and replaced when barIn moves
	nextID    atomic.Uint64
	mu        gosync.Mutex
	err       error
	dead      chan struct{}
	closing   atomic.Bool
	closeOnce gosync.Once
	doneOnce  gosync.Once
	done      chan struct{}
	gone      atomic.Int32
	wg        gosync.WaitGroup
}

// psPeer is the connection to one other rank of the round.
type psPeer struct {
	rank int
	conn net.Conn
	br   *bufio.Reader
	wmu  gosync.Mutex
	hdr  [wire.PSHeaderSize]byte // under wmu

	pmu     gosync.Mutex
	pending map[uint64]*psCall
	lost    error // set when the connection ended

	main reqQueue // requests but PSReplicate, served in order
	repl reqQueue // PSReplicate requests, served in order by a goroutine of their own
	sbuf []byte   // server reply buffer of main's goroutine
}

// reqQueue is a peer's queue of requests to serve. A replica's copy is
// updated on a queue of its own so that it never waits behind a request
// that waits for a commit (a host's commit waits for its replicas).
type reqQueue struct {
	mu    gosync.Mutex
	items []psReq
	note  chan struct{}
}

type psReq struct {
	h wire.PSHeader
	p []byte
}

// psCall is one request in flight.
type psCall struct {
	id    uint64
	kind  wire.PSKind
	peer  int
	shard int
	count int
	// pull: values land in dst at row positions pos
	dst []float32
	pos []int32
	dim int
	// fetch: rows land in tab at local indices locals
	tab    *psTableData
	locals []int64
	// outcome
	step int64
	err  error
	done chan *psCall
}

// psShard is a shard this rank hosts in the round.
type psShard struct {
	idx     int
	data    *psShardData // data.step is the version
	mu      gosync.Mutex
	changed chan struct{} // closed and replaced when the version moves
	ready   chan struct{} // closed once the rows are in place

	// Sync accumulation of the current step, by worker index
	pend      [][]psPushRec
	pendLast  []bool
	pendCount int
	acc       []psAcc // by table, reused

	commitMu  gosync.Mutex
	committed int64 // last step snapshotted, -1 none

	// Changed rows since the last commit (under mu): by table, a bit per
	// local row and the list of those set.
	dirty   [][]uint64
	dlist   [][]int64
	base    int64        // under commitMu: the commit the image holds, -1 none (the next commit is full)
	replSet []int        // ranks keeping copies of this shard's commits
	sent    map[int]bool // under commitMu: replicas that got a full copy this round
}

// markDirty records that local row l of table t changed. sh.mu is held.
func (sh *psShard) markDirty(t int, l int64) {
	w, b := l>>6, uint64(1)<<(l&63)
	if sh.dirty[t][w]&b == 0 {
		sh.dirty[t][w] |= b
		sh.dlist[t] = append(sh.dlist[t], l)
	}
}

type psPushRec struct {
	table int
	ids   []int64
	grads []float32
}

type psAcc struct {
	slot map[int64]int32
	rows []int64
	g    []float32
}

// Round forms the parameter server's round w and brings every row of every
// table to its value at the committed step restore: from the commit held
// by the rank that hosted it in an earlier round when that rank is in w,
// else from the ShardStore; step 0 with no commit anywhere is the tables'
// initial values. Rows are then re-partitioned over w's hosts (row r lives
// in shard r % Shards). It closes this process's previous round if still
// open.
//
// Every rank of w calls Round with the same w.Hosts, w.Workers, w.Shards
// and restore (a disagreement is ErrMismatch on every rank). It returns
// once this rank's own shards are in place; requests to a shard whose
// rows are still moving wait for it.
//
// Errors: ErrInvalid, the Transport's Connect errors, ErrMismatch,
// ErrRowsLost (some committed shard is on no live rank and not in the
// store; the message names them), ErrCorruptShard, *PeerError,
// ErrTimeout, ctx errors.
func (ps *Server) Round(ctx context.Context, w World, restore int64) (*Round, error) {
	hosts, workers, shards, err := w.layout()
	if err != nil {
		return nil, err
	}
	if restore < 0 {
		return nil, fmt.Errorf("%w: restore step %d is negative", mesh.ErrInvalid, restore)
	}
	ps.mu.Lock()
	prev, closed := ps.round, ps.closed
	ps.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: Server", mesh.ErrClosed)
	}
	if prev != nil {
		prev.Close()
	}
	m, err := ps.tr.ConnectMesh(ctx, w.World)
	if err != nil {
		return nil, err
	}
	r := &Round{
		ps: ps, m: m, opTimeout: m.OpTimeout(), maxFrame: m.MaxFrameBytes(), round: w.Round, rank: w.Rank, size: w.Size(),
		hosts: hosts, addrs: slices.Clone(w.Addrs), workers: workers, shards: shards, restore: restore,
		widx: make([]int, w.Size()), local: make([]*psShard, shards), peers: make([]*psPeer, w.Size()),
		pulled: make([]int64, shards), seen: make([]bool, shards),
		dead: make(chan struct{}), done: make(chan struct{}), step: restore, barNote: make(chan struct{}),
	}
	for i := range r.widx {
		r.widx[i] = -1
	}
	for i, wr := range workers {
		r.widx[wr] = i
	}
	for i := range r.pulled {
		r.pulled[i] = -1
	}
	for _, sp := range ps.tables {
		per := 8 + 4*(sp.Dim+sp.Optimizer.StateDim(sp.Dim))
		n := max(1, r.maxFrame/per)
		if ps.cfg.FrameRows > 0 {
			n = min(n, ps.cfg.FrameRows)
		}
		r.rows = append(r.rows, n)
	}
	plan, err := r.agree(ctx, w)
	if err != nil {
		m.Close()
		return nil, err
	}
	ps.mu.Lock()
	if ps.closed {
		ps.mu.Unlock()
		m.Close()
		return nil, fmt.Errorf("%w: Server", mesh.ErrClosed)
	}
	ps.round, ps.pinned = r, restore
	ps.mu.Unlock()
	r.start()
	if err := r.migrate(ctx, plan); err != nil {
		err = r.fail(err, wire.ReasonCanceled, r.rank)
		r.Close()
		return nil, err
	}
	return r, nil
}

// psPlan says where the rows of the restore step come from.
type psPlan struct {
	init      bool
	oldShards int
	src       []int // by old shard: the rank holding its commit, or -1 for the store
}

const (
	psPlanInit    = 1
	psPlanRestore = 2
	psPlanLost    = 3
)

// agree checks that every rank runs the same parameter server and layout,
// gathers which commits of the restore step each rank holds, and has rank
// 0 decide (and broadcast) where every old shard comes from.
func (r *Round) agree(ctx context.Context, w World) (*psPlan, error) {
	lh := psLayoutHash(r.hosts, r.workers, r.shards)
	// Holdings: the commits of the restore step this process holds.
	var held []ShardKey
	for _, k := range r.ps.held(r.restore) {
		held = append(held, ShardKey{Step: r.restore, Shards: k.shards, Shard: k.shard})
	}
	v := []float64{float64(r.ps.fp), -float64(r.ps.fp), float64(lh), -float64(lh), float64(r.restore), -float64(r.restore), float64(len(held))}
	if err := r.maxOver(ctx, v); err != nil {
		return nil, err
	}
	if v[0] != -v[1] || v[2] != -v[3] || v[4] != -v[5] {
		return nil, fmt.Errorf("%w: ranks of parameter-server round %d differ in tables, mode, hosts, workers, shard count or restore step", mesh.ErrMismatch, r.round)
	}
	maxHeld := int(v[6])
	rec := 8 * maxHeld
	send := make([]byte, rec)
	for i, k := range held {
		binary.LittleEndian.PutUint32(send[8*i:], uint32(k.Shards))
		binary.LittleEndian.PutUint32(send[8*i+4:], uint32(k.Shard))
	}
	all := make([]byte, rec*r.size)
	if rec > 0 {
		if err := r.m.AllGather(ctx, send, all); err != nil {
			return nil, err
		}
	}
	var planBytes []byte
	if r.rank == 0 {
		var err error
		planBytes, err = r.decide(ctx, all, maxHeld)
		if err != nil {
			// Tell the others before failing here.
			planBytes = binary.LittleEndian.AppendUint32(nil, psPlanLost)
			planBytes = append(planBytes, err.Error()...)
		}
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(planBytes)))
	if err := r.m.Broadcast(ctx, lenBuf[:], 0); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 4 || n > 1<<24 {
		return nil, fmt.Errorf("%w: parameter-server plan of %d bytes", mesh.ErrBadFrame, n)
	}
	if r.rank != 0 {
		planBytes = make([]byte, n)
	}
	if err := r.m.Broadcast(ctx, planBytes, 0); err != nil {
		return nil, err
	}
	// Nobody leaves (and closes its connections) before everyone has the plan.
	if err := r.m.Barrier(ctx); err != nil {
		return nil, err
	}
	return parsePlan(planBytes)
}

// maxOver leaves in v its element-wise maximum over the ranks of the
// round, through the mesh's allgather (the agreement needs no other
// reduction).
func (r *Round) maxOver(ctx context.Context, v []float64) error {
	send := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(send[8*i:], math.Float64bits(x))
	}
	all := make([]byte, len(send)*r.size)
	if err := r.m.AllGather(ctx, send, all); err != nil {
		return err
	}
	for q := range r.size {
		for i := range v {
			x := math.Float64frombits(binary.LittleEndian.Uint64(all[len(send)*q+8*i:]))
			if q == 0 || x > v[i] {
				v[i] = x
			}
		}
	}
	return nil
}

func psLayoutHash(hosts, workers []int, shards int) uint64 {
	h := uint64(shards)*0x9e3779b97f4a7c15 + 1
	for _, x := range hosts {
		h = splitmix64(h ^ uint64(x))
	}
	h = splitmix64(h ^ 0xabcdef)
	for _, x := range workers {
		h = splitmix64(h ^ uint64(x))
	}
	return h & (1<<52 - 1)
}

// decide runs on rank 0: it picks a layout of the restore step whose every
// shard is held by a rank of this round or saved in the store.
func (r *Round) decide(ctx context.Context, all []byte, maxHeld int) ([]byte, error) {
	const missing = -2
	cand := map[int][]int{}
	add := func(shards, shard, src int) {
		if shards < 1 || shards > 1<<16 || shard < 0 || shard >= shards {
			return
		}
		s := cand[shards]
		if s == nil {
			s = make([]int, shards)
			for i := range s {
				s[i] = missing
			}
			cand[shards] = s
		}
		if s[shard] == missing || (src >= 0 && s[shard] < 0) {
			s[shard] = src
		}
	}
	rec := 8 * maxHeld
	for q := 0; q < r.size; q++ {
		for i := 0; i < maxHeld; i++ {
			b := all[q*rec+8*i:]
			shards := int(binary.LittleEndian.Uint32(b))
			if shards == 0 {
				continue
			}
			add(shards, int(binary.LittleEndian.Uint32(b[4:])), q)
		}
	}
	if st := r.ps.readStore(); st != nil {
		keys, err := st.ListShards(ctx, r.restore)
		if err != nil {
			return nil, fmt.Errorf("paramserver: store: %w", err)
		}
		for _, k := range keys {
			add(k.Shards, k.Shard, -1)
		}
	}
	best, bestHeld := 0, -1
	layouts := make([]int, 0, len(cand))
	for s := range cand {
		layouts = append(layouts, s)
	}
	slices.Sort(layouts)
	var gaps []string
	for _, s := range layouts {
		srcs := cand[s]
		heldAlive, complete := 0, true
		for j, q := range srcs {
			switch {
			case q == missing:
				complete = false
				if len(gaps) < 8 {
					gaps = append(gaps, fmt.Sprintf("shard %d of %d", j, s))
				}
			case q >= 0:
				heldAlive++
			}
		}
		if complete && (heldAlive > bestHeld || (heldAlive == bestHeld && s == r.shards)) {
			best, bestHeld = s, heldAlive
		}
	}
	out := make([]byte, 0, 8+4*best)
	switch {
	case best > 0:
		out = binary.LittleEndian.AppendUint32(out, psPlanRestore)
		out = binary.LittleEndian.AppendUint32(out, uint32(best))
		for _, q := range cand[best] {
			out = binary.LittleEndian.AppendUint32(out, uint32(int32(q)))
		}
	case r.restore == 0:
		out = binary.LittleEndian.AppendUint32(out, psPlanInit)
	default:
		if len(layouts) == 0 {
			return nil, fmt.Errorf("%w: no rank of round %d and no store holds any shard of step %d", ErrRowsLost, r.round, r.restore)
		}
		return nil, fmt.Errorf("%w: step %d: no live rank of round %d and no store holds %v", ErrRowsLost, r.restore, r.round, gaps)
	}
	return out, nil
}

func parsePlan(b []byte) (*psPlan, error) {
	kind := binary.LittleEndian.Uint32(b)
	switch kind {
	case psPlanInit:
		return &psPlan{init: true}, nil
	case psPlanLost:
		return nil, fmt.Errorf("%w (decided by rank 0: %s)", ErrRowsLost, b[4:])
	case psPlanRestore:
		if len(b) < 8 {
			break
		}
		n := int(binary.LittleEndian.Uint32(b[4:]))
		if n < 1 || len(b) != 8+4*n {
			break
		}
		p := &psPlan{oldShards: n, src: make([]int, n)}
		for j := range p.src {
			p.src[j] = int(int32(binary.LittleEndian.Uint32(b[8+4*j:])))
		}
		return p, nil
	}
	return nil, fmt.Errorf("%w: malformed parameter-server plan", mesh.ErrBadFrame)
}

// start creates this rank's shards (not ready yet) and the goroutines
// serving every peer connection.
func (r *Round) start() {
	for s := 0; s < r.shards; s++ {
		if r.hosts[s%len(r.hosts)] != r.rank {
			continue
		}
		sh := &psShard{idx: s, changed: make(chan struct{}), ready: make(chan struct{}), committed: -1,
			pend: make([][]psPushRec, len(r.workers)), pendLast: make([]bool, len(r.workers)), acc: make([]psAcc, len(r.ps.tables))}
		for i := range sh.acc {
			sh.acc[i].slot = map[int64]int32{}
		}
		sh.base, sh.sent = -1, map[int]bool{}
		for _, sp := range r.ps.tables {
			n := ShardRows(sp.Rows, s, r.shards)
			sh.dirty = append(sh.dirty, make([]uint64, (n+63)/64))
			sh.dlist = append(sh.dlist, nil)
		}
		if r.size > 1 {
			sh.replSet = replicasOf(r.rank, r.addrs, r.ps.cfg.Replicas)
		}
		r.local[s] = sh
	}
	if r.size == 1 {
		return
	}
	for q := range r.size {
		st, ok := r.m.Stream(q)
		if !ok {
			continue
		}
		// The stream's reader, not a new one: it may already hold frames a
		// peer sent right after the last collective of agree.
		p := &psPeer{rank: q, conn: st.Conn, br: st.Reader, pending: map[uint64]*psCall{}}
		p.main.note, p.repl.note = make(chan struct{}, 1), make(chan struct{}, 1)
		r.peers[q] = p
		r.wg.Add(3)
		go r.readLoop(p)
		go r.serveLoop(p, &p.main, &p.sbuf)
		go r.serveLoop(p, &p.repl, new([]byte))
	}
}

// migrate fills this rank's shards with the rows of the restore step.
func (r *Round) migrate(ctx context.Context, plan *psPlan) error {
	specs := r.ps.tables
	loaded := map[int]*psShardData{}
	var calls []*psCall
	done := make(chan *psCall, 64)
	inflight := 0
	for _, sh := range r.local {
		if sh == nil {
			continue
		}
		d := newShardData(specs, sh.idx, r.shards)
		if r.ps.cfg.Mode == Sync {
			d.step = r.restore
		}
		sh.data = d
		if plan.init {
			initShardData(specs, d)
			continue
		}
		S := int64(r.shards)
		for t := range specs {
			tab := &d.tables[t]
			// The rows of this new shard, grouped by the old shard holding them.
			ids := make([][]int64, plan.oldShards)
			for row := int64(sh.idx); row < specs[t].Rows; row += S {
				j := int(row % int64(plan.oldShards))
				ids[j] = append(ids[j], row)
			}
			for j, rows := range ids {
				if len(rows) == 0 {
					continue
				}
				var from *psShardData
				switch src := plan.src[j]; {
				case src == r.rank:
					im := r.ps.image(memKey{plan.oldShards, j}, false)
					if im == nil || !im.view(r.restore, func(od *psShardData) { copyRows(tab, &od.tables[t], rows, plan.oldShards, S) }) {
						return fmt.Errorf("%w: this rank announced shard %d of %d at step %d but lost it", ErrRowsLost, j, plan.oldShards, r.restore)
					}
					r.stats.fromPeers.Add(int64(len(rows)))
					continue
				case src < 0:
					if loaded[j] == nil {
						key := ShardKey{Step: r.restore, Shards: plan.oldShards, Shard: j}
						b, err := r.ps.readStore().LoadShard(ctx, key)
						if err != nil {
							return fmt.Errorf("%w: loading %+v: %w", ErrRowsLost, key, err)
						}
						od, err := decodeShard(b, specs)
						if err != nil {
							return fmt.Errorf("shard %+v: %w", key, err)
						}
						if od.shards != plan.oldShards || od.shard != j {
							return fmt.Errorf("%w: stored %+v holds shard %d of %d", ErrCorruptShard, key, od.shard, od.shards)
						}
						loaded[j] = od
						if !slices.Contains(r.storeShards, j) {
							r.storeShards = append(r.storeShards, j)
						}
					}
					from = loaded[j]
					r.stats.fromStore.Add(int64(len(rows)))
				default:
					for lo := 0; lo < len(rows); lo += r.rows[t] {
						hi := min(lo+r.rows[t], len(rows))
						locals := make([]int64, hi-lo)
						for k, row := range rows[lo:hi] {
							locals[k] = row / S
						}
						c := &psCall{kind: wire.PSFetch, peer: src, shard: j, count: hi - lo, tab: tab, locals: locals, done: done}
						aux := uint64(plan.oldShards)<<32 | uint64(j)
						if err := r.send(c, wire.PSHeader{Kind: wire.PSFetch, Step: r.restore, Aux: aux, Table: uint32(t), Count: uint32(hi - lo)},
							r.idPayload(rows[lo:hi])); err != nil {
							return err
						}
						calls = append(calls, c)
						r.stats.fromPeers.Add(int64(hi - lo))
						inflight++
						if inflight == cap(done) {
							if err := r.await(ctx, done, 1, nil); err != nil {
								return err
							}
							inflight--
						}
					}
					continue
				}
				copyRows(tab, &from.tables[t], rows, plan.oldShards, S)
			}
		}
	}
	if err := r.await(ctx, done, inflight, nil); err != nil {
		return err
	}
	for _, sh := range r.local {
		if sh == nil {
			continue
		}
		// The rows are those of commit restore: a copy of this very shard
		// at that commit lets the next commit send only what changes.
		if im := r.ps.image(memKey{r.shards, sh.idx}, false); im != nil && !plan.init {
			if a, _ := im.steps(); a == r.restore {
				sh.base = r.restore
			}
		}
		close(sh.ready)
	}
	// Return only once every rank's shards are in place, so that Round
	// succeeds or fails on all ranks alike.
	inflight = 0
	for q := range r.peers {
		if r.peers[q] == nil {
			continue
		}
		if err := r.send(&psCall{kind: wire.PSReady, peer: q, done: done}, wire.PSHeader{Kind: wire.PSReady}, nil); err != nil {
			return err
		}
		inflight++
		if inflight == cap(done) {
			if err := r.await(ctx, done, 1, nil); err != nil {
				return err
			}
			inflight--
		}
	}
	return r.await(ctx, done, inflight, nil)
}

// copyRows copies rows (row IDs) of one table from an old shard of
// oldShards shards to a new shard of shards shards.
func copyRows(tab, ot *psTableData, rows []int64, oldShards int, shards int64) {
	for _, row := range rows {
		ol, nl := row/int64(oldShards), row/shards
		copy(tab.val[nl*int64(tab.dim):(nl+1)*int64(tab.dim)], ot.val[ol*int64(ot.dim):(ol+1)*int64(ot.dim)])
		copy(tab.st[nl*int64(tab.sdim):(nl+1)*int64(tab.sdim)], ot.st[ol*int64(ot.sdim):(ol+1)*int64(ot.sdim)])
	}
}

// idPayload encodes row IDs into the round's scratch buffer.
func (r *Round) idPayload(ids []int64) []byte {
	b := r.scratch[:0]
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint64(b, uint64(id))
	}
	r.scratch = b
	return b
}

// Rank returns this process's rank in the round.
func (r *Round) Rank() int { return r.rank }

// Size returns the world size of the round.
func (r *Round) Size() int { return r.size }

// Round returns the round number.
func (r *Round) Round() uint64 { return r.round }

// Shards returns the number of shards of the round's layout.
func (r *Round) Shards() int { return r.shards }

// Step returns this worker's step in Sync mode: the restore step plus
// the pushes made in this round. The next Pull reads the rows as of this
// step; the next Push is this step's.
func (r *Round) Step() int64 { return r.step }

// HostOf returns the rank hosting shard s.
func (r *Round) HostOf(s int) int { return r.hosts[s%len(r.hosts)] }

// Stats returns the traffic counters of this round.
func (r *Round) Stats() Stats {
	return Stats{PulledRows: r.stats.pulled.Load(), PushedRows: r.stats.pushed.Load(),
		SentBytes: r.stats.sent.Load(), RecvBytes: r.stats.recv.Load(), StalePushes: r.stats.stale.Load(),
		RestoredFromPeers: r.stats.fromPeers.Load(), RestoredFromStore: r.stats.fromStore.Load(),
		StoreShards: slices.Clone(r.storeShards), ReplicatedRows: r.stats.replicated.Load(), CommitCopiedRows: r.stats.copied.Load()}
}

// Err returns the error that broke the round, or nil.
func (r *Round) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Done is closed when the round is over for this rank: it failed, was
// closed, or every other rank closed its end. A dedicated parameter-server
// process waits on it and then joins the next round.
func (r *Round) Done() <-chan struct{} { return r.done }

func (r *Round) markDone() { r.doneOnce.Do(func() { close(r.done) }) }

// fail records cause as the reason the round is broken (first wins, and is
// returned), tells the other ranks through the Ring and closes the
// connections.
func (r *Round) fail(cause error, reason uint8, blamed int) error {
	r.mu.Lock()
	if r.err != nil {
		c := r.err
		r.mu.Unlock()
		return c
	}
	r.err = cause
	close(r.dead)
	r.mu.Unlock()
	r.m.Fail(cause, mesh.Reason(reason), blamed)
	r.markDone()
	return cause
}

// Close ends the round on this rank: a graceful close if no request is in
// flight, else an abort seen by the other ranks. Requests other ranks send
// to this rank's shards afterwards fail (a *PeerError wrapping ErrClosed),
// so close only once the other workers are done with the round (see
// Commit). It waits for the round's
// goroutines; the commits taken stay with the Server. Safe to call more
// than once and from any goroutine; returns nil.
func (r *Round) Close() error {
	r.closeOnce.Do(func() {
		r.closing.Store(true)
		r.mu.Lock()
		if r.err == nil {
			r.err = fmt.Errorf("%w: parameter-server round %d", mesh.ErrClosed, r.round)
			close(r.dead)
		}
		r.mu.Unlock()
		r.m.Close()
		r.wg.Wait()
		r.markDone()
		r.ps.mu.Lock()
		if r.ps.round == r {
			r.ps.round = nil
		}
		r.ps.mu.Unlock()
	})
	return nil
}

// begin checks the round before a client call.
func (r *Round) begin(ctx context.Context) error {
	if err := r.Err(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return r.fail(mesh.Aborted(err), wire.ReasonCanceled, r.rank)
	}
	return nil
}

// send registers c with its peer and writes its request frame.
func (r *Round) send(c *psCall, h wire.PSHeader, payload []byte) error {
	p := r.peers[c.peer]
	c.id = r.nextID.Add(1)
	h.ID, h.Round, h.Length = c.id, r.round, uint32(len(payload))
	p.pmu.Lock()
	if p.lost != nil {
		err := p.lost
		p.pmu.Unlock()
		return err
	}
	p.pending[c.id] = c
	p.pmu.Unlock()
	p.wmu.Lock()
	h.Put(p.hdr[:])
	bufs := net.Buffers{p.hdr[:], payload}
	n, err := bufs.WriteTo(p.conn)
	p.wmu.Unlock()
	r.stats.sent.Add(n)
	if err != nil {
		return r.peerErr(p, err)
	}
	return nil
}

// await waits for n calls to complete on done, within ctx and OpTimeout.
// Errors other than ErrStale break the round.
func (r *Round) await(ctx context.Context, done chan *psCall, n int, each func(*psCall)) error {
	if n == 0 {
		return nil
	}
	timer := time.NewTimer(r.opTimeout)
	defer timer.Stop()
	var stale error
	for ; n > 0; n-- {
		select {
		case c := <-done:
			if c.err != nil {
				if errors.Is(c.err, ErrStale) {
					stale = errors.Join(stale, c.err)
					continue
				}
				return r.fail(c.err, wire.ReasonProtocol, -1)
			}
			if each != nil {
				each(c)
			}
		case <-ctx.Done():
			return r.fail(mesh.Aborted(ctx.Err()), wire.ReasonCanceled, r.rank)
		case <-r.dead:
			return r.Err()
		case <-timer.C:
			return r.fail(fmt.Errorf("%w: parameter-server request not answered within OpTimeout %v", mesh.ErrTimeout, r.opTimeout), wire.ReasonTimeout, -1)
		}
	}
	return stale
}

// checkRows validates a batch against the tables.
func (r *Round) checkRows(b *Rows) error {
	if b.Table < 0 || b.Table >= len(r.ps.tables) {
		return fmt.Errorf("%w: table %d of %d", mesh.ErrInvalid, b.Table, len(r.ps.tables))
	}
	sp := &r.ps.tables[b.Table]
	if len(b.Values) != len(b.IDs)*sp.Dim {
		return fmt.Errorf("%w: table %q: %d values for %d rows of dim %d", mesh.ErrInvalid, sp.Name, len(b.Values), len(b.IDs), sp.Dim)
	}
	for _, id := range b.IDs {
		if id < 0 || id >= sp.Rows {
			return fmt.Errorf("%w: table %q: row %d outside 0..%d", mesh.ErrInvalid, sp.Name, id, sp.Rows-1)
		}
	}
	return nil
}

// group sorts the positions of b's rows by shard (counting sort) into
// r.pos, with shard s's positions at r.pos[r.gstart[s]:r.gstart[s+1]].
func (r *Round) group(b *Rows) {
	S := r.shards
	if cap(r.gstart) < S+1 {
		r.gstart = make([]int, S+1)
	}
	r.gstart = r.gstart[:S+1]
	clear(r.gstart)
	for _, id := range b.IDs {
		r.gstart[int(id%int64(S))+1]++
	}
	for s := 1; s <= S; s++ {
		r.gstart[s] += r.gstart[s-1]
	}
	if cap(r.pos) < len(b.IDs) {
		r.pos = make([]int32, len(b.IDs))
	}
	r.pos = r.pos[:len(b.IDs)]
	fill := append([]int(nil), r.gstart[:S]...)
	for i, id := range b.IDs {
		s := int(id % int64(S))
		r.pos[fill[s]] = int32(i)
		fill[s]++
	}
}

// Pull fills every batch's Values with the current values of its rows. It
// sends one request per shard and table (split into frames of at most
// Config.FrameRows rows), all before waiting for any reply, and waits
// for all. In Sync mode the rows are those of step Step(): a shard
// answers once every worker's push of the previous step is applied.
// Errors: ErrInvalid (unknown table, row out of range, Values of the wrong
// length), *PeerError, ErrTimeout, ErrClosed, ctx errors; after one the
// round is broken.
func (r *Round) Pull(ctx context.Context, batches ...Rows) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	for i := range batches {
		if err := r.checkRows(&batches[i]); err != nil {
			return err
		}
	}
	clear(r.seen)
	total := 0
	for i := range batches {
		total += len(batches[i].IDs)
	}
	done := make(chan *psCall, max(1, total/64+len(batches)*r.shards))
	var locals []*psCall
	var localH []wire.PSHeader
	var localP [][]byte
	inflight := 0
	for bi := range batches {
		b := &batches[bi]
		if len(b.IDs) == 0 {
			continue
		}
		r.stats.pulled.Add(int64(len(b.IDs)))
		r.group(b)
		pos := slices.Clone(r.pos) // the calls keep views until they complete
		dim := r.ps.tables[b.Table].Dim
		for s := 0; s < r.shards; s++ {
			part := pos[r.gstart[s]:r.gstart[s+1]]
			for lo := 0; lo < len(part); lo += r.rows[b.Table] {
				hi := min(lo+r.rows[b.Table], len(part))
				c := &psCall{kind: wire.PSPull, peer: r.HostOf(s), shard: s, count: hi - lo, dst: b.Values, pos: part[lo:hi], dim: dim, done: done}
				h := wire.PSHeader{Kind: wire.PSPull, Step: r.step, Aux: uint64(s), Table: uint32(b.Table), Count: uint32(hi - lo)}
				var ids []byte
				if c.peer == r.rank {
					ids = make([]byte, 0, 8*len(c.pos))
				} else {
					ids = r.scratch[:0]
				}
				for _, p := range c.pos {
					ids = binary.LittleEndian.AppendUint64(ids, uint64(b.IDs[p]))
				}
				if c.peer == r.rank {
					locals, localH, localP = append(locals, c), append(localH, h), append(localP, ids)
					continue
				}
				r.scratch = ids
				if err := r.send(c, h, ids); err != nil {
					return r.fail(err, wire.ReasonPeerLost, c.peer)
				}
				inflight++
				if inflight == cap(done) {
					if err := r.await(ctx, done, 1, r.pulledVersion); err != nil {
						return err
					}
					inflight--
				}
			}
		}
	}
	// Local shards while the remote requests are in flight.
	for i, c := range locals {
		h := localH[i]
		h.Length = uint32(len(localP[i]))
		step, reply, err := r.serve(ctx, r.rank, &h, localP[i], &r.lbuf)
		if err != nil {
			return r.fail(r.localErr(err), wire.ReasonProtocol, -1)
		}
		c.step = step
		if err := c.complete(reply); err != nil {
			return r.fail(err, wire.ReasonProtocol, -1)
		}
		r.pulledVersion(c)
	}
	return r.await(ctx, done, inflight, r.pulledVersion)
}

func (r *Round) pulledVersion(c *psCall) {
	if r.ps.cfg.Mode != Async {
		return
	}
	if !r.seen[c.shard] || c.step < r.pulled[c.shard] {
		r.pulled[c.shard] = c.step
	}
	r.seen[c.shard] = true
}

// localErr turns a local shard's refusal into the client's error.
func (r *Round) localErr(err error) error {
	var pe *psError
	if errors.As(err, &pe) {
		return fmt.Errorf("%w: shard on rank %d: %s", pe.sentinel(), r.rank, pe.msg)
	}
	return err
}

// Push sends sparse gradients: every batch's Values holds the gradient of
// its rows (repeated rows are summed). In Sync mode a Push is this
// worker's whole contribution to step Step() and goes to every shard, even
// those it has no rows for (so the shards can count the workers); a shard
// sums the contributions of all workers in worker rank order and applies
// the optimizer once per touched row; Step() then advances. Send the
// gradient of the loss you mean to minimise, already scaled (e.g. divided
// by the global batch size). In Async mode each shard applies the push
// at once unless its version moved more than Config.MaxStaleness updates
// past the version this worker last pulled from it: then it refuses it
// (ErrStale, joined over the shards that refused; the others applied
// theirs, and the round stays usable).
//
// Push returns when every shard has received its part. Errors: as Pull,
// plus ErrStale.
func (r *Round) Push(ctx context.Context, batches ...Rows) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	for i := range batches {
		if err := r.checkRows(&batches[i]); err != nil {
			return err
		}
	}
	if r.widx[r.rank] < 0 {
		return fmt.Errorf("%w: rank %d is not a worker of parameter-server round %d", mesh.ErrInvalid, r.rank, r.round)
	}
	async := r.ps.cfg.Mode == Async
	// Frames by shard: (batch, positions) parts.
	type part struct {
		b   int
		pos []int32
	}
	perShard := make([][]part, r.shards)
	for bi := range batches {
		b := &batches[bi]
		if len(b.IDs) == 0 {
			continue
		}
		r.stats.pushed.Add(int64(len(b.IDs)))
		r.group(b)
		pos := slices.Clone(r.pos)
		for s := 0; s < r.shards; s++ {
			ps := pos[r.gstart[s]:r.gstart[s+1]]
			for lo := 0; lo < len(ps); lo += r.rows[b.Table] {
				perShard[s] = append(perShard[s], part{bi, ps[lo:min(lo+r.rows[b.Table], len(ps))]})
			}
		}
	}
	nframes := 0
	for s := range perShard {
		if len(perShard[s]) == 0 && !async {
			perShard[s] = []part{{b: -1}}
		}
		nframes += len(perShard[s])
	}
	done := make(chan *psCall, max(1, nframes))
	inflight := 0
	var localFirst error
	type localFrame struct {
		h wire.PSHeader
		p []byte
	}
	var locals []localFrame
	for s := 0; s < r.shards; s++ {
		step := r.step
		if async {
			step = max(r.pulled[s], 0)
		}
		host := r.HostOf(s)
		for k, pt := range perShard[s] {
			h := wire.PSHeader{Kind: wire.PSPush, Step: step, Aux: uint64(s)}
			if k == len(perShard[s])-1 {
				h.Flags = wire.PSFlagLast
			}
			var payload []byte
			if pt.b >= 0 {
				b := &batches[pt.b]
				dim := r.ps.tables[b.Table].Dim
				h.Table, h.Count = uint32(b.Table), uint32(len(pt.pos))
				if host == r.rank {
					payload = make([]byte, 0, len(pt.pos)*(8+4*dim))
				} else {
					payload = r.scratch[:0]
				}
				for _, p := range pt.pos {
					payload = binary.LittleEndian.AppendUint64(payload, uint64(b.IDs[p]))
				}
				for _, p := range pt.pos {
					payload = append(payload, f32AsBytes(b.Values[int(p)*dim:(int(p)+1)*dim])...)
				}
			}
			if host == r.rank {
				h.Length = uint32(len(payload))
				locals = append(locals, localFrame{h, payload})
				continue
			}
			if pt.b >= 0 {
				r.scratch = payload
			}
			if err := r.send(&psCall{kind: wire.PSPush, peer: host, shard: s, done: done}, h, payload); err != nil {
				return r.fail(err, wire.ReasonPeerLost, host)
			}
			inflight++
		}
	}
	for i := range locals {
		if _, _, err := r.serve(ctx, r.rank, &locals[i].h, locals[i].p, &r.lbuf); err != nil {
			err = r.localErr(err)
			if !errors.Is(err, ErrStale) {
				return r.fail(err, wire.ReasonProtocol, -1)
			}
			r.stats.stale.Add(1)
			localFirst = errors.Join(localFirst, err)
		}
	}
	err := r.await(ctx, done, inflight, nil)
	if err != nil && !errors.Is(err, ErrStale) {
		return err
	}
	if !async {
		r.step++
	}
	if err != nil {
		n := int64(0)
		for _, e := range unwrapJoined(err) {
			if errors.Is(e, ErrStale) {
				n++
			}
		}
		r.stats.stale.Add(n)
	}
	return errors.Join(localFirst, err)
}

func unwrapJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Barrier returns once every rank of the round has entered it (each rank
// asks every other and is answered only once the other entered the same
// barrier). Every rank calls it, the same number of times. Use it before
// Close so that no rank leaves while others still need its shards.
// Errors: as Pull.
func (r *Round) Barrier(ctx context.Context) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	r.barSeq++
	r.barMu.Lock()
	r.barIn = r.barSeq
	close(r.barNote)
	r.barNote = make(chan struct{})
	r.barMu.Unlock()
	done := make(chan *psCall, max(1, r.size-1))
	inflight := 0
	for q, p := range r.peers {
		if p == nil {
			continue
		}
		if err := r.send(&psCall{kind: wire.PSBarrier, peer: q, done: done}, wire.PSHeader{Kind: wire.PSBarrier, Step: r.barSeq}, nil); err != nil {
			return r.fail(err, wire.ReasonPeerLost, q)
		}
		inflight++
	}
	if err := r.await(ctx, done, inflight, nil); err != nil {
		return err
	}
	// Every peer's request for this barrier must have been answered too, or
	// a peer could still be waiting for this rank's reply when it closes.
	// (A request for the next barrier cannot be answered before this rank
	// enters it, so the count is exact.)
	switch r.waitChange(ctx, func() (bool, <-chan struct{}) {
		r.barMu.Lock()
		defer r.barMu.Unlock()
		return r.barServed >= r.barSeq*int64(r.size-1), r.barNote
	}) {
	case waitCanceled:
		return r.fail(mesh.Aborted(ctx.Err()), wire.ReasonCanceled, r.rank)
	case waitOver:
		return r.Err()
	case waitTimedOut:
		return r.fail(fmt.Errorf("%w: barrier %d: peers' requests not all received within OpTimeout %v", mesh.ErrTimeout, r.barSeq, r.opTimeout), wire.ReasonTimeout, -1)
	}
	return nil
}

// waitBarrier waits until this rank has entered barrier seq.
func (r *Round) waitBarrier(ctx context.Context, seq int64) error {
	switch r.waitChange(ctx, func() (bool, <-chan struct{}) {
		r.barMu.Lock()
		defer r.barMu.Unlock()
		return r.barIn >= seq, r.barNote
	}) {
	case waitCanceled:
		return ctx.Err()
	case waitOver:
		return r.overErr()
	case waitTimedOut:
		return psErrf(psCodeTimeout, "rank %d did not enter barrier %d within OpTimeout %v", r.rank, seq, r.opTimeout)
	}
	return nil
}

// Commit snapshots every shard's rows and optimizer state at step (in
// Sync mode step must be Step(): the state after every worker's pushes
// of the steps before it) and saves each to Config.Store, if set; the
// host keeps it in memory for the next round. Every worker calls Commit
// with the same step at the same point (after its Push of step-1, before
// its Push of step); it returns once every shard is snapshotted and
// stored. In Async mode a shard snapshots whatever it holds when the
// first worker's request arrives: quiesce the workers first (e.g. a
// barrier) for a consistent commit. Errors: as Pull; a store failure
// breaks the round (ErrAborted wrapping the store's error).
//
// A shard answers the commit requests of every worker, so a host must not
// close its round before every worker's Commit returned: end a round with
// Commit, then Barrier (or a barrier on the job's Ring), then Close.
func (r *Round) Commit(ctx context.Context, step int64) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	if r.ps.cfg.Mode == Sync && step != r.step {
		return fmt.Errorf("%w: commit of step %d at sync step %d", mesh.ErrInvalid, step, r.step)
	}
	if r.widx[r.rank] < 0 {
		return fmt.Errorf("%w: rank %d is not a worker of parameter-server round %d", mesh.ErrInvalid, r.rank, r.round)
	}
	done := make(chan *psCall, r.shards)
	inflight := 0
	var locals []int
	for s := 0; s < r.shards; s++ {
		h := wire.PSHeader{Kind: wire.PSCommit, Step: step, Aux: uint64(s)}
		if r.HostOf(s) == r.rank {
			locals = append(locals, s)
			continue
		}
		if err := r.send(&psCall{kind: wire.PSCommit, peer: r.HostOf(s), shard: s, done: done}, h, nil); err != nil {
			return r.fail(err, wire.ReasonPeerLost, r.HostOf(s))
		}
		inflight++
	}
	for _, s := range locals {
		h := wire.PSHeader{Kind: wire.PSCommit, Step: step, Aux: uint64(s)}
		if _, _, err := r.serve(ctx, r.rank, &h, nil, &r.lbuf); err != nil {
			return r.fail(r.localErr(err), wire.ReasonProtocol, -1)
		}
	}
	return r.await(ctx, done, inflight, nil)
}

// complete stores a reply payload into the call's destination.
func (c *psCall) complete(p []byte) error {
	switch c.kind {
	case wire.PSPull:
		if len(p) != c.count*c.dim*4 {
			return fmt.Errorf("%w: pull reply of %d bytes for %d rows of dim %d", mesh.ErrBadFrame, len(p), c.count, c.dim)
		}
		for k, pos := range c.pos {
			copy(f32AsBytes(c.dst[int(pos)*c.dim:(int(pos)+1)*c.dim]), p[k*c.dim*4:])
		}
	case wire.PSFetch:
		t := c.tab
		per := (t.dim + t.sdim) * 4
		if len(p) != c.count*per {
			return fmt.Errorf("%w: fetch reply of %d bytes for %d rows of %d values", mesh.ErrBadFrame, len(p), c.count, t.dim+t.sdim)
		}
		for k, l := range c.locals {
			q := p[k*per:]
			n := copy(f32AsBytes(t.val[l*int64(t.dim):(l+1)*int64(t.dim)]), q)
			copy(f32AsBytes(t.st[l*int64(t.sdim):(l+1)*int64(t.sdim)]), q[n:])
		}
	default:
		if len(p) != 0 {
			return fmt.Errorf("%w: %v reply with %d bytes", mesh.ErrBadFrame, c.kind, len(p))
		}
	}
	return nil
}

// readLoop reads every frame from peer p: replies complete calls, requests
// go to the serving goroutine's queue. It never blocks on anything but the
// connection, so neither side can deadlock on the other's writes.
func (r *Round) readLoop(p *psPeer) {
	defer r.wg.Done()
	var hb [wire.PSHeaderSize]byte
	var rbuf []byte
	for {
		if _, err := io.ReadFull(p.br, hb[:]); err != nil {
			r.peerErr(p, err)
			return
		}
		h, err := wire.ParsePSHeader(hb[:], r.maxFrame)
		if err == nil && h.Round != r.round {
			err = fmt.Errorf("frame of round %d in round %d", h.Round, r.round)
		}
		if err != nil {
			r.fail(&mesh.PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: %v", mesh.ErrBadFrame, err)}, wire.ReasonProtocol, -1)
			return
		}
		r.stats.recv.Add(int64(wire.PSHeaderSize) + int64(h.Length))
		if h.Kind == wire.PSReply || h.Kind == wire.PSError {
			if cap(rbuf) < int(h.Length) {
				rbuf = make([]byte, h.Length)
			}
			buf := rbuf[:h.Length]
			if _, err := io.ReadFull(p.br, buf); err != nil {
				r.peerErr(p, err)
				return
			}
			p.pmu.Lock()
			c := p.pending[h.ID]
			delete(p.pending, h.ID)
			p.pmu.Unlock()
			if c == nil {
				r.fail(&mesh.PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: reply to unknown request %d", mesh.ErrBadFrame, h.ID)}, wire.ReasonProtocol, -1)
				return
			}
			c.step = h.Step
			if h.Kind == wire.PSError {
				pe := &psError{code: h.Flags, msg: string(buf)}
				c.err = fmt.Errorf("%w: shard %d on rank %d: %s", pe.sentinel(), c.shard, p.rank, pe.msg)
			} else if err := c.complete(buf); err != nil {
				c.err = &mesh.PeerError{Rank: p.rank, Round: r.round, Err: err}
			}
			c.done <- c
			continue
		}
		buf := make([]byte, h.Length)
		if _, err := io.ReadFull(p.br, buf); err != nil {
			r.peerErr(p, err)
			return
		}
		q := &p.main
		if h.Kind == wire.PSReplicate {
			q = &p.repl
		}
		q.mu.Lock()
		q.items = append(q.items, psReq{h: h, p: buf})
		q.mu.Unlock()
		select {
		case q.note <- struct{}{}:
		default:
		}
	}
}

// serveLoop answers the requests of peer p on queue rq in order.
func (r *Round) serveLoop(p *psPeer, rq *reqQueue, sbuf *[]byte) {
	defer r.wg.Done()
	var hb [wire.PSHeaderSize]byte
	for {
		rq.mu.Lock()
		var q psReq
		ok := len(rq.items) > 0
		if ok {
			q = rq.items[0]
			rq.items[0] = psReq{}
			rq.items = rq.items[1:]
		}
		rq.mu.Unlock()
		if !ok {
			select {
			case <-rq.note:
				continue
			case <-r.dead:
				return
			}
		}
		ctx := context.Background()
		step, reply, err := r.serve(ctx, p.rank, &q.h, q.p, sbuf)
		out := wire.PSHeader{Kind: wire.PSReply, Round: r.round, ID: q.h.ID, Step: step, Count: q.h.Count, Table: q.h.Table}
		if err != nil {
			var pe *psError
			if !errors.As(err, &pe) {
				pe = psErrf(psCodeInvalid, "%v", err)
			}
			out.Kind, out.Flags, out.Count = wire.PSError, pe.code, 0
			msg := pe.msg
			if len(msg) > wire.MaxRejectText {
				msg = msg[:wire.MaxRejectText]
			}
			reply = []byte(msg)
		}
		out.Length = uint32(len(reply))
		out.Put(hb[:])
		p.wmu.Lock()
		bufs := net.Buffers{hb[:], reply}
		n, werr := bufs.WriteTo(p.conn)
		p.wmu.Unlock()
		r.stats.sent.Add(n)
		if werr != nil {
			r.peerErr(p, werr)
			return
		}
		if q.h.Kind == wire.PSBarrier && err == nil {
			r.barMu.Lock()
			r.barServed++
			close(r.barNote)
			r.barNote = make(chan struct{})
			r.barMu.Unlock()
		}
	}
}

// peerErr handles a failed read or write on peer p's connection: it names
// the cause (the Ring's verdict when there is one), fails the calls in
// flight to p, and fails the round unless p left gracefully with nothing
// pending.
func (r *Round) peerErr(p *psPeer, err error) error {
	if r.closing.Load() {
		return r.Err()
	}
	cause := r.m.Err()
	graceful := false
	if cause == nil {
		if r.m.PeerClosed(p.rank) {
			cause, graceful = &mesh.PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: the rank closed its parameter-server round: %v", mesh.ErrClosed, err)}, true
		} else {
			tm := time.NewTimer(mesh.VerdictGrace)
			select {
			case <-r.m.Dead():
			case <-r.dead:
			case <-tm.C:
			}
			tm.Stop()
			if r.closing.Load() {
				return r.Err()
			}
			if cause = r.m.Err(); cause == nil {
				if r.m.PeerClosed(p.rank) {
					cause, graceful = &mesh.PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("%w: the rank closed its parameter-server round: %v", mesh.ErrClosed, err)}, true
				} else {
					cause = &mesh.PeerError{Rank: p.rank, Round: r.round, Err: fmt.Errorf("parameter-server connection: %w", err)}
				}
			}
		}
	}
	p.pmu.Lock()
	first := p.lost == nil
	if first {
		p.lost = cause
	}
	calls := p.pending
	p.pending = map[uint64]*psCall{}
	p.pmu.Unlock()
	for _, c := range calls {
		c.err = cause
		c.done <- c
	}
	if first {
		p.conn.Close()
		if int(r.gone.Add(1)) == r.size-1 {
			r.markDone()
		}
	}
	if !graceful {
		r.fail(cause, wire.ReasonPeerLost, p.rank)
	}
	return cause
}

// waitEnd is how waitChange ended.
type waitEnd int

const (
	waitDone     waitEnd = iota // the condition holds
	waitCanceled                // ctx is done
	waitOver                    // the round is over (r.dead)
	waitTimedOut                // OpTimeout passed
)

// waitChange waits until check reports that its condition holds. check
// runs at once and again each time the channel it returned is closed (a
// channel closed and replaced on every change of the state it reads,
// taken under the same lock as the state); between checks the wait ends
// on ctx, the end of the round or OpTimeout, counted from the first check
// that found the condition false. It returns waitDone, or which of the
// three ended it; the caller makes the error, in the terms of its own
// operation. A check may return done with a lock still held, which the
// caller then owns (waitVersion).
func (r *Round) waitChange(ctx context.Context, check func() (done bool, changed <-chan struct{})) waitEnd {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		done, changed := check()
		if done {
			return waitDone
		}
		if timer == nil {
			timer = time.NewTimer(r.opTimeout)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return waitCanceled
		case <-r.dead:
			return waitOver
		case <-timer.C:
			return waitTimedOut
		}
	}
}

// overErr is the error of a wait that the end of the round (r.dead) ended.
func (r *Round) overErr() error {
	return psErrf(psCodeClosed, "parameter-server round %d is over on rank %d", r.round, r.rank)
}

// waitReady waits until sh's rows are in place.
func (r *Round) waitReady(ctx context.Context, sh *psShard) error {
	switch r.waitChange(ctx, func() (bool, <-chan struct{}) {
		select {
		case <-sh.ready:
			return true, nil
		default:
			return false, sh.ready // closed once, when the rows are in place
		}
	}) {
	case waitCanceled:
		return ctx.Err()
	case waitOver:
		return r.overErr()
	case waitTimedOut:
		return psErrf(psCodeTimeout, "shard %d on rank %d not ready within OpTimeout %v", sh.idx, r.rank, r.opTimeout)
	}
	return nil
}

// waitVersion waits until sh's version reaches want (Sync); sh.mu is
// held on return without error.
func (r *Round) waitVersion(ctx context.Context, sh *psShard, want int64) error {
	var v int64 // the version the last check saw
	switch r.waitChange(ctx, func() (bool, <-chan struct{}) {
		sh.mu.Lock()
		if v = sh.data.step; v >= want {
			return true, nil // sh.mu stays held: the caller's
		}
		defer sh.mu.Unlock()
		return false, sh.changed
	}) {
	case waitCanceled:
		return ctx.Err()
	case waitOver:
		return r.overErr()
	case waitTimedOut:
		return psErrf(psCodeTimeout, "shard %d on rank %d stayed at step %d, not %d, for OpTimeout %v (a worker did not push)", sh.idx, r.rank, v, want, r.opTimeout)
	}
	return nil
}

// serve answers request h with payload p from rank `from` (this rank for
// local calls). It returns the reply's step and payload (in *buf).
func (r *Round) serve(ctx context.Context, from int, h *wire.PSHeader, p []byte, buf *[]byte) (int64, []byte, error) {
	switch h.Kind {
	case wire.PSFetch:
		return r.serveFetch(h, p, buf)
	case wire.PSReplicate:
		return r.serveReplicate(from, h, p)
	case wire.PSBarrier:
		return 0, nil, r.waitBarrier(ctx, h.Step)
	case wire.PSReady:
		for _, sh := range r.local {
			if sh != nil {
				if err := r.waitReady(ctx, sh); err != nil {
					return 0, nil, err
				}
			}
		}
		return 0, nil, nil
	}
	if h.Kind != wire.PSPull && h.Kind != wire.PSPush && h.Kind != wire.PSCommit {
		return 0, nil, psErrf(psCodeInvalid, "unexpected %v request", h.Kind)
	}
	s := int(min(h.Aux, 1<<31))
	if s >= r.shards || r.local[s] == nil {
		return 0, nil, psErrf(psCodeInvalid, "shard %d is not hosted by rank %d in round %d", h.Aux, r.rank, r.round)
	}
	sh := r.local[s]
	if h.Kind != wire.PSPull && r.widx[from] < 0 {
		return 0, nil, psErrf(psCodeInvalid, "rank %d is not a worker of round %d", from, r.round)
	}
	if err := r.waitReady(ctx, sh); err != nil {
		return 0, nil, err
	}
	switch h.Kind {
	case wire.PSPull:
		return r.servePull(ctx, sh, h, p, buf)
	case wire.PSPush:
		return r.servePush(ctx, sh, from, h, p)
	default:
		return r.serveCommit(ctx, sh, h)
	}
}

// rowsOf decodes and checks the row IDs of a request for shard sh.
func (r *Round) rowsOf(h *wire.PSHeader, p []byte, shards, shard int, need int) ([]int64, *TableSpec, error) {
	if int(h.Table) >= len(r.ps.tables) {
		return nil, nil, psErrf(psCodeInvalid, "table %d of %d", h.Table, len(r.ps.tables))
	}
	sp := &r.ps.tables[h.Table]
	n := int(h.Count)
	if len(p) != n*need {
		return nil, nil, psErrf(psCodeInvalid, "%v of %d rows of table %q with %d payload bytes", h.Kind, n, sp.Name, len(p))
	}
	ids := make([]int64, n)
	for i := range ids {
		id := int64(binary.LittleEndian.Uint64(p[8*i:]))
		if id < 0 || id >= sp.Rows || id%int64(shards) != int64(shard) {
			return nil, nil, psErrf(psCodeInvalid, "row %d of table %q is not in shard %d of %d", id, sp.Name, shard, shards)
		}
		ids[i] = id
	}
	return ids, sp, nil
}

func (r *Round) servePull(ctx context.Context, sh *psShard, h *wire.PSHeader, p []byte, buf *[]byte) (int64, []byte, error) {
	ids, sp, err := r.rowsOf(h, p, r.shards, sh.idx, 8)
	if err != nil {
		return 0, nil, err
	}
	if r.ps.cfg.Mode == Sync {
		if err := r.waitVersion(ctx, sh, h.Step); err != nil {
			return 0, nil, err
		}
		if sh.data.step != h.Step {
			v := sh.data.step
			sh.mu.Unlock()
			return 0, nil, psErrf(psCodeInvalid, "pull of step %d but shard %d is at step %d", h.Step, sh.idx, v)
		}
	} else {
		sh.mu.Lock()
	}
	defer sh.mu.Unlock()
	t := &sh.data.tables[h.Table]
	need := len(ids) * sp.Dim * 4
	if cap(*buf) < need {
		*buf = make([]byte, need)
	}
	out := (*buf)[:need]
	d := int64(sp.Dim)
	for k, id := range ids {
		l := id / int64(r.shards)
		copy(out[k*sp.Dim*4:], f32AsBytes(t.val[l*d:(l+1)*d]))
	}
	return sh.data.step, out, nil
}

func (r *Round) servePush(ctx context.Context, sh *psShard, from int, h *wire.PSHeader, p []byte) (int64, []byte, error) {
	var rec psPushRec
	if h.Count > 0 || len(p) > 0 {
		if int(h.Table) >= len(r.ps.tables) {
			return 0, nil, psErrf(psCodeInvalid, "table %d of %d", h.Table, len(r.ps.tables))
		}
		dim := r.ps.tables[h.Table].Dim
		ids, _, err := r.rowsOf(h, p, r.shards, sh.idx, 8+4*dim)
		if err != nil {
			return 0, nil, err
		}
		// The payload is this request's own buffer: view the gradients in place.
		g := bytesAsF32(p[8*len(ids):])
		for _, x := range g {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return 0, nil, psErrf(psCodeInvalid, "non-finite gradient for table %q", r.ps.tables[h.Table].Name)
			}
		}
		rec = psPushRec{table: int(h.Table), ids: ids, grads: g}
	}
	last := h.Flags&wire.PSFlagLast != 0
	if r.ps.cfg.Mode == Async {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if v := sh.data.step; v-h.Step > r.ps.cfg.MaxStaleness || h.Step > v {
			return v, nil, psErrf(psCodeStale, "push computed at version %d, shard %d is at version %d (MaxStaleness %d)", h.Step, sh.idx, v, r.ps.cfg.MaxStaleness)
		}
		if rec.ids != nil {
			r.applyRecs(sh, [][]psPushRec{{rec}})
		}
		if last {
			sh.data.step++
			close(sh.changed)
			sh.changed = make(chan struct{})
		}
		return sh.data.step, nil, nil
	}
	if err := r.waitVersion(ctx, sh, h.Step); err != nil {
		return 0, nil, err
	}
	defer sh.mu.Unlock()
	if v := sh.data.step; v != h.Step {
		return 0, nil, psErrf(psCodeInvalid, "push of step %d from rank %d but shard %d is at step %d", h.Step, from, sh.idx, v)
	}
	w := r.widx[from]
	if sh.pendLast[w] {
		return 0, nil, psErrf(psCodeInvalid, "rank %d pushed step %d to shard %d twice", from, h.Step, sh.idx)
	}
	if rec.ids != nil {
		sh.pend[w] = append(sh.pend[w], rec)
	}
	if last {
		sh.pendLast[w] = true
		sh.pendCount++
		if sh.pendCount == len(r.workers) {
			r.applyRecs(sh, sh.pend)
			for i := range sh.pend {
				clear(sh.pend[i])
				sh.pend[i] = sh.pend[i][:0]
				sh.pendLast[i] = false
			}
			sh.pendCount = 0
			sh.data.step++
			close(sh.changed)
			sh.changed = make(chan struct{})
		}
	}
	return sh.data.step, nil, nil
}

// applyRecs sums the gradients of recs (outer index: worker rank order)
// per row, then applies the optimizer once per touched row. sh.mu is held.
func (r *Round) applyRecs(sh *psShard, recs [][]psPushRec) {
	S := int64(r.shards)
	need := make([]int, len(sh.acc))
	for _, list := range recs {
		for _, rec := range list {
			need[rec.table] += len(rec.ids)
		}
	}
	for t := range sh.acc {
		a := &sh.acc[t]
		clear(a.slot)
		a.rows, a.g = a.rows[:0], a.g[:0]
		if dim := r.ps.tables[t].Dim; cap(a.g) < need[t]*dim {
			a.g = make([]float32, 0, need[t]*dim)
			a.rows = make([]int64, 0, need[t])
		}
	}
	for _, list := range recs {
		for _, rec := range list {
			a := &sh.acc[rec.table]
			dim := r.ps.tables[rec.table].Dim
			for i, id := range rec.ids {
				g := rec.grads[i*dim : (i+1)*dim]
				k, ok := a.slot[id]
				if !ok {
					k = int32(len(a.rows))
					a.slot[id] = k
					a.rows = append(a.rows, id)
					a.g = append(a.g, g...)
					continue
				}
				dst := a.g[int(k)*dim : (int(k)+1)*dim]
				for j := range dst {
					dst[j] += g[j]
				}
			}
		}
	}
	for t := range sh.acc {
		a := &sh.acc[t]
		sp := &r.ps.tables[t]
		tab := &sh.data.tables[t]
		d, sd := int64(tab.dim), int64(tab.sdim)
		for k, id := range a.rows {
			l := id / S
			psApply(&sp.Optimizer, tab.val[l*d:(l+1)*d], tab.st[l*sd:(l+1)*sd], a.g[k*tab.dim:(k+1)*tab.dim])
			sh.markDirty(t, l)
		}
	}
}

func (r *Round) serveCommit(ctx context.Context, sh *psShard, h *wire.PSHeader) (int64, []byte, error) {
	step := h.Step
	sh.commitMu.Lock()
	defer sh.commitMu.Unlock()
	if sh.committed == step {
		return step, nil, nil
	}
	if r.ps.cfg.Mode == Sync {
		if err := r.waitVersion(ctx, sh, step); err != nil {
			return 0, nil, err
		}
		if v := sh.data.step; v != step {
			sh.mu.Unlock()
			return 0, nil, psErrf(psCodeInvalid, "commit of step %d but shard %d is at step %d", step, sh.idx, v)
		}
	} else {
		sh.mu.Lock()
	}
	// Under the shard's lock: copy out the rows changed since the last
	// commit (every row for a copy that starts over), nothing else.
	ownFull := sh.base < 0
	var deltaTo, fullTo []int
	for _, q := range sh.replSet {
		if sh.sent[q] {
			deltaTo = append(deltaTo, q)
		} else {
			fullTo = append(fullTo, q)
		}
	}
	var delta, full []replFrame
	if !ownFull || len(deltaTo) > 0 {
		delta = r.rowFrames(sh, sh.base, false)
	}
	if ownFull || len(fullTo) > 0 {
		full = r.rowFrames(sh, sh.base, true)
	}
	for t := range sh.dlist {
		clear(sh.dirty[t])
		sh.dlist[t] = sh.dlist[t][:0]
	}
	sh.mu.Unlock()

	// The replicas first (their copies travel while this rank copies its own).
	frames := len(deltaTo)*len(delta) + len(fullTo)*len(full)
	done := make(chan *psCall, max(frames, 1))
	sendAll := func(q int, fs []replFrame, flags uint8) error {
		for i, f := range fs {
			fl := flags
			if i == 0 {
				fl |= wire.PSFlagBegin
			}
			if i == len(fs)-1 {
				fl |= wire.PSFlagEnd
			}
			c := &psCall{kind: wire.PSReplicate, peer: q, shard: sh.idx, done: done}
			hh := wire.PSHeader{Kind: wire.PSReplicate, Flags: fl, Step: step, Aux: uint64(r.shards)<<32 | uint64(sh.idx), Table: uint32(f.table), Count: uint32(f.count)}
			if err := r.send(c, hh, f.p); err != nil {
				return err
			}
			r.stats.replicated.Add(int64(f.count))
		}
		return nil
	}
	for _, q := range deltaTo {
		if err := sendAll(q, delta, 0); err != nil {
			return 0, nil, err
		}
	}
	for _, q := range fullTo {
		if err := sendAll(q, full, wire.PSFlagFull); err != nil {
			return 0, nil, err
		}
	}
	key := memKey{r.shards, sh.idx}
	im := r.ps.image(key, true)
	if im == nil {
		return 0, nil, psErrf(psCodeClosed, "parameter server closed on rank %d", r.rank)
	}
	own := delta
	if ownFull {
		own = full
	}
	if err := im.begin(step, sh.base, ownFull); err != nil {
		return 0, nil, psErrf(psCodeInvalid, "%v", err)
	}
	for _, f := range own {
		if err := applyFrame(im, f.table, f.count, f.p); err != nil {
			return 0, nil, psErrf(psCodeInvalid, "%v", err)
		}
		r.stats.copied.Add(int64(f.count))
	}
	im.end()
	if err := r.await(ctx, done, frames, nil); err != nil {
		return 0, nil, err
	}
	if st := r.ps.cfg.Store; st != nil {
		var b []byte
		im.view(step, func(d *psShardData) { b = encodeShard(nil, r.ps.tables, d) })
		if err := st.SaveShard(ctx, ShardKey{Step: step, Shards: r.shards, Shard: sh.idx}, b); err != nil {
			return 0, nil, psErrf(psCodeStore, "saving shard %d of %d at step %d: %v", sh.idx, r.shards, step, err)
		}
	}
	for _, q := range fullTo {
		sh.sent[q] = true
	}
	sh.base, sh.committed = step, step
	r.ps.mu.Lock()
	r.ps.pruneImages()
	r.ps.mu.Unlock()
	return step, nil, nil
}

// replFrame is one PSReplicate payload: count rows of table.
type replFrame struct {
	table, count int
	p            []byte
}

// rowFrames copies rows of shard sh into PSReplicate payloads: the rows
// changed since the last commit, or every row if all; at least one frame
// (an empty one when nothing changed). sh.mu is held.
func (r *Round) rowFrames(sh *psShard, base int64, all bool) []replFrame {
	var out []replFrame
	for t := range r.ps.tables {
		tab := &sh.data.tables[t]
		var locals []int64
		n := int64(len(sh.dlist[t]))
		if all {
			n = tab.n
		} else {
			locals = sh.dlist[t]
		}
		per := tab.dim + tab.sdim
		d, sd := int64(tab.dim), int64(tab.sdim)
		for lo := int64(0); lo < n; lo += int64(r.rows[t]) {
			hi := min(lo+int64(r.rows[t]), n)
			k := int(hi - lo)
			p := make([]byte, 8+8*k+4*per*k)
			binary.LittleEndian.PutUint64(p, uint64(base))
			vals := bytesAsF32(p[8+8*k:])
			for i := 0; i < k; i++ {
				l := lo + int64(i)
				if !all {
					l = locals[lo+int64(i)]
				}
				binary.LittleEndian.PutUint64(p[8+8*i:], uint64(l))
				copy(vals[i*per:], tab.val[l*d:(l+1)*d])
				copy(vals[i*per+tab.dim:], tab.st[l*sd:(l+1)*sd])
			}
			out = append(out, replFrame{table: t, count: k, p: p})
		}
	}
	if len(out) == 0 {
		p := make([]byte, 8)
		binary.LittleEndian.PutUint64(p, uint64(base))
		out = append(out, replFrame{p: p})
	}
	return out
}

// applyFrame puts the rows of a PSReplicate payload (count rows of table)
// into im. Errors wrap ErrCorruptShard.
func applyFrame(im *image, table, count int, p []byte) error {
	if len(p) < 8 || (len(p)-8)/8 < count {
		return fmt.Errorf("%w: replica frame of %d bytes for %d rows", ErrCorruptShard, len(p), count)
	}
	locals := make([]int64, count)
	for i := range locals {
		locals[i] = int64(binary.LittleEndian.Uint64(p[8+8*i:]))
	}
	rest := p[8+8*count:]
	if len(rest)%4 != 0 {
		return fmt.Errorf("%w: replica frame of %d bytes for %d rows", ErrCorruptShard, len(p), count)
	}
	return im.put(table, locals, bytesAsF32(rest))
}

// serveReplicate keeps the rows of a commit of a shard hosted by rank
// from in this process's copy of it.
func (r *Round) serveReplicate(from int, h *wire.PSHeader, p []byte) (int64, []byte, error) {
	shards, shard := int(h.Aux>>32), int(h.Aux&0xffffffff)
	if shards != r.shards || shard >= shards || r.HostOf(shard) != from {
		return 0, nil, psErrf(psCodeInvalid, "rank %d sent a copy of shard %d of %d, which it does not host in round %d", from, shard, shards, r.round)
	}
	if int(h.Table) >= len(r.ps.tables) || h.Step < 0 || len(p) < 8 {
		return 0, nil, psErrf(psCodeInvalid, "malformed replica frame (table %d, step %d, %d bytes)", h.Table, h.Step, len(p))
	}
	im := r.ps.image(memKey{shards, shard}, true)
	if im == nil {
		return 0, nil, psErrf(psCodeClosed, "parameter server closed on rank %d", r.rank)
	}
	if h.Flags&wire.PSFlagBegin != 0 {
		base := int64(binary.LittleEndian.Uint64(p))
		if err := im.begin(h.Step, base, h.Flags&wire.PSFlagFull != 0); err != nil {
			return 0, nil, psErrf(psCodeInvalid, "%v", err)
		}
		r.ps.mu.Lock()
		r.ps.pruneImages()
		r.ps.mu.Unlock()
	} else if a := im.arriving(); a != h.Step {
		return 0, nil, psErrf(psCodeInvalid, "replica frame of step %d, but the commit arriving is of step %d", h.Step, a)
	}
	if h.Count > 0 {
		if err := applyFrame(im, int(h.Table), int(h.Count), p); err != nil {
			return 0, nil, psErrf(psCodeInvalid, "%v", err)
		}
	}
	if h.Flags&wire.PSFlagEnd != 0 {
		im.end()
	}
	return h.Step, nil, nil
}

// serveFetch answers a fetch of rows of a commit this rank holds.
func (r *Round) serveFetch(h *wire.PSHeader, p []byte, buf *[]byte) (int64, []byte, error) {
	oldShards, oldShard := int(h.Aux>>32), int(h.Aux&0xffffffff)
	im := r.ps.image(memKey{oldShards, oldShard}, false)
	lost := psErrf(psCodeLost, "rank %d holds no commit of shard %d of %d at step %d", r.rank, oldShard, oldShards, h.Step)
	if im == nil || int(h.Table) >= len(r.ps.tables) {
		return 0, nil, lost
	}
	ids, _, err := r.rowsOf(h, p, oldShards, oldShard, 8)
	if err != nil {
		return 0, nil, err
	}
	var out []byte
	ok := im.view(h.Step, func(d *psShardData) {
		t := &d.tables[h.Table]
		per := (t.dim + t.sdim) * 4
		need := len(ids) * per
		if cap(*buf) < need {
			*buf = make([]byte, need)
		}
		out = (*buf)[:need]
		dd, sd := int64(t.dim), int64(t.sdim)
		for k, id := range ids {
			l := id / int64(oldShards)
			n := copy(out[k*per:], f32AsBytes(t.val[l*dd:(l+1)*dd]))
			copy(out[k*per+n:], f32AsBytes(t.st[l*sd:(l+1)*sd]))
		}
	})
	if !ok {
		return 0, nil, lost
	}
	return h.Step, out, nil
}
