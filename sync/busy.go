package sync

import (
	"context"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// Busy peers (issue 14: long phases that are not hangs).
//
// A rank in a long phase outside any operation (a data load before its
// first step, a synchronous checkpoint write, an evaluation) holds its
// peers up in their next operation. Without more, they would fail with
// ErrTimeout after Config.OpTimeout, and a phase longer than that could
// never complete. So a rank marks such a phase (Ring.Busy); once the phase
// has lasted busyAfter, the rank sends a KindBusy frame on its control
// connections every busyRefresh until it ends. A rank waiting in an
// operation that hears a busy peer moves its operation's deadline to
// OpTimeout after that moment (capped at BusyTimeout after the operation's
// start, and at the context's deadline), so OpTimeout counts only time no
// peer is marked busy.
//
// A busy peer must not hide a hung one: once an operation has run for
// OpTimeout, it is extended only while every peer is either marked busy
// (heard within busyFresh, or OpTimeout when shorter) or waiting in this operation or a later one (it
// announced one, agree.go); a peer that is neither is silent, and the
// operation fails at once with a *TimeoutError naming it, as it would
// have without the busy peer. An operation that times out without busy
// peers names its silent peers the same way.

const (
	// busyAfter is how long a marked phase lasts before the rank tells
	// its peers (shorter phases, such as a step's data fetch from memory,
	// cost nothing on the wire).
	busyAfter = 100 * time.Millisecond
	// busyRefresh is the period of KindBusy frames while a phase lasts
	// (a quarter of OpTimeout when that is shorter: see refresh).
	busyRefresh = 500 * time.Millisecond
	// busyFresh is how long after its last KindBusy frame a peer still
	// counts as busy (a few refresh periods of scheduling slack; it also
	// covers the moment between a phase's end and the peer's entry into
	// the operation).
	busyFresh = 2 * time.Second
)

// BusyMarker is an optional capability of a Synchronizer, found by type
// assertion (*Ring has it): Busy marks the start of a long phase of this
// rank outside any collective operation (a data load, a checkpoint write,
// an evaluation) during which its peers' operations wait for it instead
// of timing out after Config.OpTimeout (up to Config.BusyTimeout). Call
// the returned done when the phase ends (more than once is harmless).
type BusyMarker interface {
	Busy() (done func())
}

var _ BusyMarker = (*Ring)(nil)

// busyState holds both sides of the busy marks of a Ring.
type busyState struct {
	// This rank's marks.
	open  atomic.Int32 // marked phases not yet done
	since atomic.Int64 // Unix ns when open last went from 0 to 1
	wake  chan struct{}

	// The peers'.
	peerAt   []atomic.Int64  // by rank: Unix ns of the last KindBusy heard; 0: never
	peerSeen []atomic.Uint64 // by rank: the highest operation sequence number announced

	// The deadline of the operation in flight, under mu.
	mu       gosync.Mutex
	active   bool      // an operation is in flight
	seq      uint64    // its sequence number
	start    time.Time // its start
	dl       time.Time // the data connections' deadline
	hard     time.Time // the latest deadline it may get (context, BusyTimeout)
	hardCtx  bool      // hard is the context's deadline
	extended bool      // dl was moved for a busy peer
}

func (b *busyState) init(n int) {
	b.wake = make(chan struct{}, 1)
	b.peerAt = make([]atomic.Int64, n)
	b.peerSeen = make([]atomic.Uint64, n)
}

// Busy implements BusyMarker: it marks a long phase of this rank outside
// any operation, so that peers waiting for it in an operation extend
// their deadline (see Config.OpTimeout). Marks nest and may come from any
// goroutine; a phase shorter than 100 ms costs no network traffic. Call
// done when the phase ends (more than once is harmless).
func (r *Ring) Busy() (done func()) {
	if r.size <= 1 {
		return func() {}
	}
	b := &r.busy
	if b.open.Add(1) == 1 {
		b.since.Store(time.Now().UnixNano())
		notify(b.wake)
	}
	var ended atomic.Bool
	return func() {
		if ended.CompareAndSwap(false, true) {
			b.open.Add(-1)
		}
	}
}

// refresh is the period of this rank's KindBusy frames: busyRefresh, or
// a quarter of OpTimeout when that is shorter, so that a peer's deadline
// (OpTimeout after the last frame) never runs out between two frames.
func (c Config) refresh() time.Duration { return min(busyRefresh, c.OpTimeout/4) }

// fresh is how long after its last KindBusy frame a peer counts as busy:
// busyFresh, or OpTimeout when that is shorter, so that a peer gone quiet
// mid-phase is silent by the time the deadline its last frame set (OpTimeout
// after it) passes, and is named.
func (c Config) fresh() time.Duration { return min(busyFresh, c.OpTimeout) }

// busyLoop sends KindBusy frames while a phase marked busy lasts.
func (r *Ring) busyLoop() {
	defer r.wg.Done()
	b := &r.busy
	every := r.cfg.refresh()
	tm := time.NewTimer(time.Hour)
	tm.Stop()
	var last time.Time // when the last KindBusy frame went out
	for {
		select {
		case <-r.quit:
			tm.Stop()
			return
		case <-b.wake:
		}
		for b.open.Load() > 0 {
			now := time.Now()
			wait := time.Unix(0, b.since.Load()).Add(busyAfter).Sub(now)
			if wait <= 0 {
				if d := now.Sub(last); d >= every {
					r.sendCtrl(wire.KindBusy, nil)
					last = now
					wait = every
				} else {
					wait = every - d
				}
			}
			tm.Reset(wait)
			select {
			case <-r.quit:
				tm.Stop()
				return
			case <-tm.C:
			}
		}
	}
}

// beginDeadline sets the deadline of operation seq starting at now on
// every data connection: OpTimeout, or the context's deadline when that
// is sooner.
func (r *Ring) beginDeadline(seq uint64, now time.Time, ctxDl time.Time, hasCtxDl bool) {
	b := &r.busy
	b.mu.Lock()
	b.active, b.seq, b.start, b.extended = true, seq, now, false
	b.dl = now.Add(r.cfg.OpTimeout)
	b.hard, b.hardCtx = now.Add(r.cfg.busyTimeout()), false
	if hasCtxDl && ctxDl.Before(b.hard) {
		b.hard, b.hardCtx = ctxDl, true
	}
	if b.dl.After(b.hard) {
		b.dl = b.hard
	}
	r.setDeadlines(b.dl)
	b.mu.Unlock()
}

// endDeadline records that no operation is in flight.
func (r *Ring) endDeadline() {
	b := &r.busy
	b.mu.Lock()
	b.active = false
	b.mu.Unlock()
}

// setDeadlines sets dl on every data connection (safe while operations
// read and write them).
func (r *Ring) setDeadlines(dl time.Time) {
	for _, p := range r.peers {
		if p != nil {
			p.mesh.SetDeadline(dl)
		}
	}
	for _, l := range r.all {
		l.right.SetDeadline(dl) // writes; reads of shared-memory credits
		l.left.SetDeadline(dl)  // reads; writes of credits
	}
}

// peerBusy handles a KindBusy frame from peer (on its control loop): the
// operation in flight waits OpTimeout from now, unless it has run for
// OpTimeout and a peer is silent (then it fails, naming it).
func (r *Ring) peerBusy(peer int) {
	now := time.Now()
	b := &r.busy
	b.peerAt[peer].Store(now.UnixNano())
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.active {
		return
	}
	if now.Sub(b.start) >= r.cfg.OpTimeout {
		if silent, _ := r.classify(now, b.seq); len(silent) > 0 {
			r.fail(&TimeoutError{Round: r.round, From: r.rank, Silent: silent, Waited: now.Sub(b.start)}, wire.ReasonTimeout, silent[0])
			return
		}
	}
	nd := now.Add(r.cfg.OpTimeout)
	if nd.After(b.hard) {
		nd = b.hard
	}
	if nd.After(b.dl) {
		b.dl, b.extended = nd, true
		r.setDeadlines(nd)
	}
}

// noteSeen records that peer announced operation seq (it waits in it).
func (b *busyState) noteSeen(peer int, seq uint64) {
	for {
		old := b.peerSeen[peer].Load()
		if seq <= old || b.peerSeen[peer].CompareAndSwap(old, seq) {
			return
		}
	}
}

// classify sorts the peers at now for operation seq: silent ones (neither
// marked busy within Config.fresh nor waiting in seq or a later operation)
// and busy ones, each ascending.
func (r *Ring) classify(now time.Time, seq uint64) (silent, busy []int) {
	b := &r.busy
	for p := range r.size {
		if p == r.rank {
			continue
		}
		if at := b.peerAt[p].Load(); at != 0 && now.Sub(time.Unix(0, at)) < r.cfg.fresh() {
			busy = append(busy, p)
		} else if b.peerSeen[p].Load() < seq {
			silent = append(silent, p)
		}
	}
	return silent, busy
}

// timedOut turns a data connection's deadline into the operation's error:
// the context's deadline, or a *TimeoutError naming the silent peers (and
// the busy ones, when the wait for them hit BusyTimeout).
func (r *Ring) timedOut() error {
	now := time.Now()
	b := &r.busy
	b.mu.Lock()
	atHard := !b.dl.Before(b.hard)
	ctxFired, busyCap := atHard && b.hardCtx, atHard && !b.hardCtx && b.extended
	start, seq := b.start, b.seq
	b.mu.Unlock()
	if ctxFired {
		return r.fail(ctxCause(context.DeadlineExceeded), wire.ReasonCanceled, r.rank)
	}
	te := &TimeoutError{Round: r.round, From: r.rank, Waited: now.Sub(start)}
	var busy []int
	te.Silent, busy = r.classify(now, seq)
	if busyCap {
		te.Busy = busy
	}
	blamed := -1
	if len(te.Silent) > 0 {
		blamed = te.Silent[0]
	}
	return r.fail(te, wire.ReasonTimeout, blamed)
}
