package sync

import (
	"fmt"
	gosync "sync"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// Operation agreement across paths.
//
// A rank checks every frame header it reads against the operation it runs,
// but two ranks in different operations may not read each other's frames at
// all: a rank that skipped a large allreduce (ring lanes) and entered the
// next small one (mesh connections) or a barrier waits on connections its
// peers do not read, and both would wait until OpTimeout. So a rank that has
// been waiting in an operation for announceAfter announces it on the
// control connections, which every rank reads at all times: a KindAnnounce
// frame whose payload is the operation's header. Each rank keeps the headers
// of its last agreeSlots operations and of the peers' announcements; when
// both sides of one sequence number are known and differ, the rank that
// sees it fails the Ring with ErrMismatch and its abort notice
// (ReasonProtocol) makes every other rank fail with ErrMismatch too. An
// operation that finishes within announceAfter costs nothing on the wire.

const (
	// announceAfter is how long an operation runs before its rank
	// announces it to the peers.
	announceAfter = 100 * time.Millisecond
	// agreeSlots is how many recent operations (own and announced by each
	// peer) a rank remembers, by sequence number modulo agreeSlots. A peer
	// further ahead than that (a broadcast root can run ahead) overwrites
	// slots unchecked; the disagreement then ends in ErrTimeout as before.
	agreeSlots = 16
)

// agreement holds the operation headers compared across ranks.
type agreement struct {
	mu   gosync.Mutex
	own  [agreeSlots]wire.Header   // by Seq % agreeSlots; Kind 0: none
	peer [][agreeSlots]wire.Header // by rank, then Seq % agreeSlots
	// announced is the sequence number of the last own announcement.
	announced uint64
	// wake is signalled (without blocking) when an operation begins.
	wake chan struct{}
}

func (a *agreement) init(n int) {
	a.peer = make([][agreeSlots]wire.Header, n)
	a.wake = make(chan struct{}, 1)
}

// sameOp reports whether two operation headers describe the same operation.
func sameOp(a, b wire.Header) bool {
	return a.Kind == b.Kind && a.Op == b.Op && a.Seq == b.Seq && a.Total == b.Total && a.Aux == b.Aux
}

func opMismatch(peer int, theirs wire.Header, rank int, ours wire.Header) error {
	return fmt.Errorf("%w: rank %d is in %v #%d (op %#x, %d bytes, aux %d), rank %d in %v #%d (op %#x, %d bytes, aux %d)",
		ErrMismatch, peer, theirs.Kind, theirs.Seq, theirs.Op, theirs.Total, theirs.Aux,
		rank, ours.Kind, ours.Seq, ours.Op, ours.Total, ours.Aux)
}

// note records the header of the operation this rank runs now (called on
// the operation's goroutine, once its header is known) and checks it
// against what peers announced for the same sequence number.
func (r *Ring) note(h wire.Header) error {
	if r.size == 1 {
		return nil
	}
	h.Length = 0
	a := &r.agree
	a.mu.Lock()
	a.own[h.Seq%agreeSlots] = h
	var err error
	for p := range a.peer {
		if theirs := a.peer[p][h.Seq%agreeSlots]; theirs.Kind != 0 && theirs.Seq == h.Seq && !sameOp(theirs, h) {
			err = opMismatch(p, theirs, r.rank, h)
			break
		}
	}
	a.mu.Unlock()
	if err != nil {
		return r.protoErr(err)
	}
	return nil
}

// announcedBy handles a peer's KindAnnounce (on its control loop): it records
// the peer's operation and fails the Ring when this rank ran or runs
// another operation under the same sequence number.
func (r *Ring) announcedBy(peer int, h wire.Header) {
	h.Length = 0
	r.busy.noteSeen(peer, h.Seq)
	a := &r.agree
	a.mu.Lock()
	a.peer[peer][h.Seq%agreeSlots] = h
	ours := a.own[h.Seq%agreeSlots]
	a.mu.Unlock()
	if ours.Kind != 0 && ours.Seq == h.Seq && !sameOp(ours, h) {
		r.protoErr(opMismatch(peer, h, r.rank, ours))
	}
}

// announceLoop announces an operation that has run for announceAfter.
func (r *Ring) announceLoop() {
	defer r.wg.Done()
	a := &r.agree
	tm := time.NewTimer(time.Hour)
	tm.Stop()
	for {
		select {
		case <-r.quit:
			tm.Stop()
			return
		case <-a.wake:
		}
		for r.inOp.Load() {
			seq := r.opSeq.Load()
			wait := time.Until(time.Unix(0, r.opStart.Load()).Add(announceAfter))
			if wait <= 0 {
				a.mu.Lock()
				h := a.own[seq%agreeSlots]
				done := a.announced == seq
				a.mu.Unlock()
				if done {
					break // until the next operation begins
				}
				if h.Kind != 0 && h.Seq == seq {
					a.mu.Lock()
					a.announced = seq
					a.mu.Unlock()
					r.sendAnnounce(h)
					break
				}
				wait = announceAfter / 10 // its header is not noted yet
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

// sendAnnounce writes a KindAnnounce frame carrying op to every peer.
func (r *Ring) sendAnnounce(op wire.Header) {
	deadline := time.Now().Add(ctrlWriteTimeout)
	for _, p := range r.peers {
		if p == nil {
			continue
		}
		p.ctrlMu.Lock()
		h := wire.Header{Kind: wire.KindAnnounce, Round: r.round, Seq: op.Seq, Length: wire.HeaderSize}
		h.Put(p.ctrlW[:])
		op.Put(p.ctrlW[wire.HeaderSize:])
		p.ctrl.SetWriteDeadline(deadline)
		p.ctrl.Write(p.ctrlW[:2*wire.HeaderSize])
		p.ctrlMu.Unlock()
	}
}
