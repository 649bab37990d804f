package paramserver

import (
	"context"
	"encoding/binary"
	"fmt"
	gosync "sync"

	"github.com/elastictrain/elastictrain/sync/internal/hostaddr"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// Commits in memory
//
// A committed shard lives in memory as an image: its rows and optimizer
// state at the newest commit, and an undo log holding, for the rows that
// commit changed, their values at the commit before it, so that both of
// the two newest commits can be served (ranks may be one commit apart when
// a round fails) while a commit copies only the rows that changed. The
// shard's host keeps one image of each shard it hosts and sends the same
// changed rows to Config.Replicas other ranks (replicasOf), which keep an
// image each: a host's death then loses no committed row as long as one
// replica lives. This is the in-memory checkpoint of Gemini (Wang et al.,
// SOSP 2023) and of DLRover's flash checkpoint, kept per commit.

// memKey names a shard of a layout: shard of shards.
type memKey struct{ shards, shard int }

// image is one shard's committed rows in this process's memory. Safe for
// concurrent use.
type image struct {
	mu       gosync.Mutex
	data     *psShardData // at data.step
	prevStep int64        // the commit before data.step that undo restores; -1 none
	undo     []undoLog    // by table
	prev     *psShardData // prevStep materialised, cached; nil until asked
	// pending: data.step's commit is arriving (begin called, end not
	// yet): data holds only part of it, so only prevStep is served.
	pending bool
}

// undoLog holds rows of one table at the image's previous commit: row
// locals[i] had values vals[i*(dim+sdim):][:dim] and state after them.
type undoLog struct {
	locals []int64
	vals   []float32
}

func newImage(specs []TableSpec, k memKey) *image {
	d := newShardData(specs, k.shard, k.shards)
	d.step = -1
	return &image{data: d, prevStep: -1, undo: make([]undoLog, len(specs))}
}

// begin starts the commit of step on the image, whose rows the following
// puts change from commit base. full says that the puts carry every row:
// an image at another step then starts over; otherwise it must be at base.
func (im *image) begin(step, base int64, full bool) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	for t := range im.undo {
		im.undo[t].locals, im.undo[t].vals = im.undo[t].locals[:0], im.undo[t].vals[:0]
	}
	im.prev = nil
	switch {
	case !im.pending && im.data.step >= 0 && im.data.step == base:
		im.prevStep = base
	case full:
		im.prevStep = -1
	default:
		im.prevStep = -1
		st := im.data.step
		im.data.step = -1 // unusable until a full commit
		return fmt.Errorf("%w: commit of step %d changes step %d, but the copy of shard %d of %d is at step %d",
			ErrCorruptShard, step, base, im.data.shard, im.data.shards, st)
	}
	im.data.step, im.pending = step, true
	return nil
}

// end completes the commit begun: the image serves it from now on.
func (im *image) end() {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.pending = false
}

// arriving returns the step of the commit being received, or -1.
func (im *image) arriving() int64 {
	im.mu.Lock()
	defer im.mu.Unlock()
	if !im.pending {
		return -1
	}
	return im.data.step
}

// put stores rows of table t: locals[i]'s dim values then sdim state
// values at rows[i*(dim+sdim):], keeping the old values in the undo log.
func (im *image) put(t int, locals []int64, rows []float32) error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if t < 0 || t >= len(im.data.tables) {
		return fmt.Errorf("%w: table %d of %d", ErrCorruptShard, t, len(im.data.tables))
	}
	tab := &im.data.tables[t]
	per := int64(tab.dim + tab.sdim)
	if int64(len(rows)) != int64(len(locals))*per {
		return fmt.Errorf("%w: %d values for %d rows of %d", ErrCorruptShard, len(rows), len(locals), per)
	}
	u := &im.undo[t]
	d, sd := int64(tab.dim), int64(tab.sdim)
	for i, l := range locals {
		if l < 0 || l >= tab.n {
			return fmt.Errorf("%w: row %d of a shard of %d rows", ErrCorruptShard, l, tab.n)
		}
		val, st := tab.val[l*d:(l+1)*d], tab.st[l*sd:(l+1)*sd]
		if im.prevStep >= 0 {
			u.locals = append(u.locals, l)
			u.vals = append(append(u.vals, val...), st...)
		}
		src := rows[int64(i)*per:][:per]
		copy(val, src[:d])
		copy(st, src[d:])
	}
	return nil
}

// view calls fn with the rows at commit step (the newest or the one
// before it) and reports whether the image holds that commit. fn runs
// under the image's lock and must neither keep nor modify what it is given.
func (im *image) view(step int64, fn func(d *psShardData)) bool {
	im.mu.Lock()
	defer im.mu.Unlock()
	switch {
	case step < 0:
		return false
	case step == im.data.step && !im.pending:
		fn(im.data)
		return true
	case step == im.prevStep:
		if im.prev == nil {
			im.prev = im.materialise()
		}
		fn(im.prev)
		return true
	}
	return false
}

// materialise returns a copy of the rows at prevStep. im.mu is held.
func (im *image) materialise() *psShardData {
	p := im.data.clone()
	p.step = im.prevStep
	for t := range im.undo {
		u, tab := &im.undo[t], &p.tables[t]
		per := tab.dim + tab.sdim
		d, sd := int64(tab.dim), int64(tab.sdim)
		for i := len(u.locals) - 1; i >= 0; i-- { // newest first: the oldest value wins
			l := u.locals[i]
			src := u.vals[i*per:][:per]
			copy(tab.val[l*d:(l+1)*d], src[:tab.dim])
			copy(tab.st[l*sd:(l+1)*sd], src[tab.dim:])
		}
	}
	return p
}

// steps returns the commits the image can serve: the newest and, if any,
// the one before it (-1 for none).
func (im *image) steps() (newest, prev int64) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.pending {
		return -1, im.prevStep
	}
	return im.data.step, im.prevStep
}

// rollback keeps only the commits at or before step; it reports whether
// one remains.
func (im *image) rollback(step int64) bool {
	im.mu.Lock()
	defer im.mu.Unlock()
	switch {
	case !im.pending && im.data.step >= 0 && im.data.step <= step:
		if im.prevStep > step {
			im.prevStep = -1
		}
		return true
	case im.prevStep >= 0 && im.prevStep <= step:
		if im.prev == nil {
			im.prev = im.materialise()
		}
		im.data, im.prev, im.prevStep, im.pending = im.prev, nil, -1, false
		for t := range im.undo {
			im.undo[t] = undoLog{}
		}
		return true
	}
	return false
}

// dropPrev forgets the commit before the newest.
func (im *image) dropPrev() {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.prevStep, im.prev = -1, nil
	for t := range im.undo {
		im.undo[t] = undoLog{}
	}
}

// replicasOf returns the ranks that keep a copy of the commits of a shard
// hosted by owner, in a round whose ranks advertise addrs: k of them (at
// most len(addrs)-1), ranks on other hosts than owner's first, each group
// taken in rank order starting after owner (so that the shards of one
// host spread their copies over the others). A pure function of its
// arguments: every rank computes the same.
func replicasOf(owner int, addrs []string, k int) []int {
	n := len(addrs)
	k = min(k, n-1)
	if k <= 0 || owner < 0 || owner >= n {
		return nil
	}
	home := hostaddr.Key(addrs[owner])
	out := make([]int, 0, k)
	for pass := 0; pass < 2 && len(out) < k; pass++ {
		for i := 1; i < n && len(out) < k; i++ {
			q := (owner + i) % n
			if (hostaddr.Key(addrs[q]) != home) == (pass == 0) {
				out = append(out, q)
			}
		}
	}
	return out
}

// Gather returns every row of every table at committed step, by table
// (Rows*Dim values, row r at [r*Dim, (r+1)*Dim)), fetched from the commits
// of the round's shards in their hosts' memory: a way for one rank to keep
// the whole tables (to evaluate the model after the job) when no Store
// holds them. Every shard of the round must have committed step. The
// other ranks must keep their round open meanwhile (they may wait in
// Barrier). Called from the round's client goroutine. Errors: ErrRowsLost
// (a shard's host holds no commit of step), the round's errors.
func (r *Round) Gather(ctx context.Context, step int64) ([][]float32, error) {
	if err := r.begin(ctx); err != nil {
		return nil, err
	}
	specs := r.ps.tables
	out := make([][]float32, len(specs))
	for t, sp := range specs {
		out[t] = make([]float32, sp.Rows*int64(sp.Dim))
	}
	copyOut := func(d *psShardData) {
		for t, sp := range specs {
			tab, dim := &d.tables[t], int64(sp.Dim)
			for l := int64(0); l < tab.n; l++ {
				row := l*int64(r.shards) + int64(d.shard)
				copy(out[t][row*dim:(row+1)*dim], tab.val[l*dim:(l+1)*dim])
			}
		}
	}
	var remote []*psShardData
	done := make(chan *psCall, 64)
	inflight := 0
	for s := 0; s < r.shards; s++ {
		if q := r.HostOf(s); q == r.rank {
			im := r.ps.image(memKey{r.shards, s}, false)
			if im == nil || !im.view(step, copyOut) {
				return nil, fmt.Errorf("%w: this rank holds no commit of shard %d of %d at step %d", ErrRowsLost, s, r.shards, step)
			}
			continue
		}
		d := newShardData(specs, s, r.shards)
		remote = append(remote, d)
		for t := range specs {
			tab := &d.tables[t]
			for lo := int64(0); lo < tab.n; lo += int64(r.rows[t]) {
				hi := min(lo+int64(r.rows[t]), tab.n)
				locals := make([]int64, hi-lo)
				ids := make([]byte, 0, 8*len(locals))
				for k := range locals {
					locals[k] = lo + int64(k)
					ids = binary.LittleEndian.AppendUint64(ids, uint64(locals[k]*int64(r.shards)+int64(s)))
				}
				c := &psCall{kind: wire.PSFetch, peer: r.HostOf(s), shard: s, count: len(locals), tab: tab, locals: locals, done: done}
				h := wire.PSHeader{Kind: wire.PSFetch, Step: step, Aux: uint64(r.shards)<<32 | uint64(s), Table: uint32(t), Count: uint32(len(locals))}
				if err := r.send(c, h, ids); err != nil {
					return nil, r.fail(err, wire.ReasonPeerLost, c.peer)
				}
				inflight++
				if inflight == cap(done) {
					if err := r.await(ctx, done, 1, nil); err != nil {
						return nil, err
					}
					inflight--
				}
			}
		}
	}
	if err := r.await(ctx, done, inflight, nil); err != nil {
		return nil, err
	}
	for _, d := range remote {
		copyOut(d)
	}
	return out, nil
}
