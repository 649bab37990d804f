package sync

import (
	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// The hierarchical allreduce (Config.Hierarchy) runs on two of the round's
// rings: the ranks of this rank's host (groupHost) and a ring between hosts
// (groupCross). The buffer is cut into pieces; piece p goes through
//
//	1. within the host: a chain reduce to the leader (HierarchyLeaders) or a
//	   reduce-scatter (HierarchyStriped);
//	2. between hosts: a ring allreduce of what phase 1 left on the leader
//	   (the whole piece) or on this rank (its stripe of the piece);
//	3. within the host: a chain broadcast from the leader, or an allgather.
//
// The host ring runs phases 1 and 3 of successive pieces in one fixed order
// on every member (1 of piece 0, then 1 of p+1 and 3 of p for each p), while
// the ring between hosts runs phase 2 of piece p at the same time, so the
// two kinds of links work at once and only phase 1 of the first piece and
// phase 3 of the last are not overlapped. The order of the reductions, and
// so the float bits of the result, depends on the layout (which ranks share
// hosts) and on the buffer length and the Config, never on timing.

// Pieces of a hierarchical allreduce: about hierPieceBytes each, at most
// hierMaxPieces. Variables for tests and benchmarks.
var (
	hierPieceBytes = 4 << 20
	hierMaxPieces  = 8
)

// Phases of a piece, tagged in the frame headers' aux field so that ranks
// that disagree on the plan fail with ErrMismatch.
const (
	phaseReduce = 1
	phaseCross  = 2
	phaseSpread = 3
)

func hierAux(phase, piece int) uint64 { return 1<<63 | uint64(phase)<<32 | uint64(piece) }

// hierAllReduce is the allreduce of b (of elements of elem bytes) for a
// round whose layout is hierarchical. It does not allocate.
func (r *Ring) hierAllReduce(h wire.Header, b []byte, elem int, op Op, red reduceFunc, scale scaleFunc) error {
	host, cross := r.groups[groupHost], r.groups[groupCross]
	nel := len(b) / elem
	pieces := max(1, min(hierMaxPieces, len(b)/hierPieceBytes))
	div := 0
	if op == OpAvg {
		div = r.size
	}
	striped := r.layout.mode == HierarchyStriped
	base := laneJob{kind: wire.KindAllReduce, opb: h.Op, op: op, elem: elem, seq: r.seq, scale: scale}
	piece := func(p int) (lo, hi int) { return span(0, nel, p, pieces) }

	// hostJob starts phase 1 or 3 of piece p on the host ring.
	hostJob := func(p, phase int) {
		lo, hi := piece(p)
		j := base
		j.buf, j.total, j.aux = b[lo*elem:hi*elem], uint64((hi-lo)*elem), hierAux(phase, p)
		L := host.n()
		switch {
		case striped && phase == phaseReduce:
			j.algo, j.red, j.s0, j.s1, j.segMajor = algoRing, red, 0, L-1, true
		case striped:
			j.algo, j.s0, j.s1, j.segMajor = algoRing, L-1, 2*(L-1), true
		case phase == phaseReduce:
			// The chain starts at position 1 and ends at the leader
			// (position 0), each hop adding its own buffer.
			j.algo, j.red, j.root = algoChain, red, 1
		default:
			j.algo, j.root = algoChain, 0
		}
		r.startLanes(host, j, hi-lo, r.groupLanesFor(host, len(j.buf)))
	}
	// crossJob starts phase 2 of piece p on the ring between hosts.
	crossJob := func(p int) {
		lo, hi := piece(p)
		if striped {
			// After the reduce-scatter, position q of the host ring holds
			// the host's sum of stripe (q+1) mod L of the piece.
			L := host.n()
			slo, shi := span(lo, hi, (host.pos+1)%L, L)
			lo, hi = slo, shi
		}
		j := base
		j.buf, j.total, j.aux = b[lo*elem:hi*elem], uint64((hi-lo)*elem), hierAux(phaseCross, p)
		j.algo, j.red, j.s0, j.s1, j.div = algoRing, red, 0, 2*(cross.n()-1), div
		r.startLanes(cross, j, hi-lo, r.groupLanesFor(cross, len(j.buf)))
	}

	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	hostBusy, crossBusy := false, false
	startHost := func(p, phase int) {
		if host != nil && first == nil {
			hostJob(p, phase)
			hostBusy = true
		}
	}
	waitHost := func() {
		if hostBusy {
			keep(r.waitLanes(host))
			hostBusy = false
		}
	}
	startCross := func(p int) {
		if cross != nil && first == nil {
			crossJob(p)
			crossBusy = true
		}
	}
	waitCross := func() {
		if crossBusy {
			keep(r.waitLanes(cross))
			crossBusy = false
		}
	}
	startHost(0, phaseReduce)
	waitHost()
	startCross(0)
	for p := 0; p < pieces && first == nil; p++ {
		if p+1 < pieces {
			startHost(p+1, phaseReduce) // overlaps phase 2 of piece p
			waitHost()
		}
		waitCross()
		if p+1 < pieces {
			startCross(p + 1)
		}
		startHost(p, phaseSpread) // overlaps phase 2 of piece p+1
		waitHost()
	}
	// After an error the Ring is failed and every lane ends its job soon.
	waitHost()
	waitCross()
	return first
}
