package paramserver

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	gosync "sync"
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
	case im.data.step >= 0 && im.data.step == base:
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
	im.data.step = step
	return nil
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
	case step == im.data.step:
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
	return im.data.step, im.prevStep
}

// rollback keeps only the commits at or before step; it reports whether
// one remains.
func (im *image) rollback(step int64) bool {
	im.mu.Lock()
	defer im.mu.Unlock()
	switch {
	case im.data.step >= 0 && im.data.step <= step:
		if im.prevStep > step {
			im.prevStep = -1
		}
		return true
	case im.prevStep >= 0 && im.prevStep <= step:
		if im.prev == nil {
			im.prev = im.materialise()
		}
		im.data, im.prev, im.prevStep = im.prev, nil, -1
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

// hostOfAddr is the host part of a rank's advertised address (host:port),
// normalised so that equal hosts compare equal.
func hostOfAddr(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return strings.ToLower(host)
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
	home := hostOfAddr(addrs[owner])
	out := make([]int, 0, k)
	for pass := 0; pass < 2 && len(out) < k; pass++ {
		for i := 1; i < n && len(out) < k; i++ {
			q := (owner + i) % n
			if (hostOfAddr(addrs[q]) != home) == (pass == 0) {
				out = append(out, q)
			}
		}
	}
	return out
}
