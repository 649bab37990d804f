package sync

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/elastictrain/elastictrain/sync/internal/sumk"
	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// The ordered allreduce (OrderedReducer) on a Ring. Every frame is an
// allreduce frame (wire.KindAllReduce) of op byte opbOrdered, which no Op
// has, so a rank in AllReduceFloat32 under the same sequence number fails
// with ErrMismatch as for any other disagreement; the aux field tells the
// two phases apart. No new frame kind: the protocol version is unchanged.
//
// Buffers of more than Config.DirectBytes run one lane job (algoOrdered)
// on the ring of all ranks, in which each link r -> r+1 carries first the
// running sums of the reduce phase, chunk by chunk, then the final sums of
// the spread phase, and link n-1 -> 0 carries the spread phase:
//
//	reduce: rank 0 sends S_0 = (0 + its parts) chunk by chunk; rank r > 0
//	        receives S_{r-1}, adds its parts one by one and sends S_r on
//	        (rank n-1 keeps it: the result);
//	spread: the chain n-1 -> 0 -> 1 -> ... -> n-2 copies the result, as
//	        Broadcast from root n-1 does.
//
// Both phases are pipelined in chunks of Config.ChunkBytes over the lanes
// of the ring (each lane takes a contiguous part of the elements), and
// they overlap: rank n-1 sends a chunk's result as soon as it has added
// its parts to it. One job rather than a reduce job and a Broadcast keeps
// that overlap and costs each rank one hand-off to its lanes and one
// wake-up instead of two. Smaller buffers take the same chain over the
// mesh connections, one frame per hop, and rank n-1 sends the result to
// every rank directly.
//
// The two halves of a lane on rank r run, for chunk k of the lane's part:
//
//	send half, reduce (r < n-1): rank 0 sums its parts into out, or
//	    straight into the shared-memory slot where the lane has one, and
//	    sends the chunk; others wait until the receive half has added
//	    theirs (recvProg 0,k) and send out's chunk (sendProg 0,k).
//	receive half, reduce (r > 0): receive the running sum into out (from
//	    a shared-memory slot: summed with the first part on the way) and
//	    add the parts (recvProg 0,k).
//	send half, spread (r != n-2): wait for the result's chunk (recvProg
//	    0,k on rank n-1, 1,k elsewhere); send it.
//	receive half, spread (r != n-1): wait until the reduce phase's send of
//	    the chunk is done (sendProg 0,k), since the result overwrites it;
//	    receive it into out (recvProg 1,k).
//
// Every wait is on an earlier item of the same link or on this rank's
// other half for an earlier item, and every link's receiver takes the
// items in the order they were sent, so the job cannot deadlock.
//
// Two ranks, rank 1 with exactly one part b: the sum is S_0 + b, where
// S_0 = (0 + rank 0's parts), and float32 addition is commutative, so
// both ranks can compute it at once, as the two-rank exchange of
// AllReduceFloat32 does: rank 1 sends b (aux orderedPart) while rank 0
// sends S_0, and each adds the other's chunk to its own (rank 0 computes
// S_0 + b, rank 1 S_0 + b: the same operands, the same bits). No rank
// waits for another's additions, where the chain has rank 1 add only
// after S_0 arrived and rank 0 wait for the result to come back. Only
// rank 1 knows its number of parts: rank 0 sends S_0 either way and
// takes what comes back by its aux (orderedPart: add it; orderedSpread:
// the result), so the choice costs no message. With more parts, or none,
// rank 1 runs the chain (sending k parts would move k times the bytes).

// opbOrdered is the op byte of the ordered allreduce's frames: float32
// elements (4<<4) and 0xf, which is no Op.
const opbOrdered = 0xf | 4<<4

// Phases of the ordered allreduce, in the aux field of its frames.
const (
	orderedReduce = 1<<62 | 1
	orderedSpread = 1<<62 | 2
	orderedPart   = 1<<62 | 3 // two ranks: rank 1's one part, for rank 0 to add
)

// orderedPair tells whether this rank of an ordered allreduce of group g,
// holding nparts parts, takes the two-rank exchange: rank 1 of two, with
// one part.
func orderedPair(g *group, nparts int) bool { return g.n() == 2 && g.pos == 1 && nparts == 1 }

// nparts is the number of this rank's parts in an ordered job: j.parts,
// and j.vec's tensors as one more (AllReduceOrderedTensors).
func (j *laneJob) nparts() int {
	if j.vec != nil {
		return len(j.parts) + 1
	}
	return len(j.parts)
}

var _ OrderedReducer = (*Ring)(nil)

// AllReduceOrderedFloat32 implements OrderedReducer: out receives, on
// every rank, the float32 sum of every rank's parts, in rank order and
// within a rank in the order of parts, taken strictly sequentially from
// +0 (see OrderedReducer for the contract and why the bits depend only on
// the global sequence of parts). Buffers of more than Config.DirectBytes
// are summed along the chain 0 -> 1 -> ... -> n-1 over the ring's lanes,
// pipelined in chunks, and the result returns along the chain n-1 -> 0 ->
// ... -> n-2, the two phases overlapping; each rank sends and receives
// the whole buffer at most twice (rank 0 receives it once, rank n-2
// sends it once, rank n-1 does each once), where the ring allreduce
// moves 2(n-1)/n of it each way; of two ranks where rank 1 holds one
// part, each sends the buffer once and receives it once, at the same
// time, as AllReduceFloat32 does. Smaller buffers take the same
// chain over the mesh connections (n-1 hops, then one). A hierarchical
// round (Hierarchical) runs the same flat chain: the order is the ranks'
// order, whatever the hosts. It does not allocate. Errors: see Ring; a
// part whose length is not len(out), or that shares memory with out, is
// ErrInvalid here and fails the operation on every rank (ErrMismatch
// there).
func (r *Ring) AllReduceOrderedFloat32(ctx context.Context, parts [][]float32, out []float32) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	return r.end(r.orderedIn(parts, out))
}

func (r *Ring) orderedIn(parts [][]float32, out []float32) error {
	if err := checkParts(parts, out); err != nil {
		return r.protoErr(err)
	}
	if r.size == 1 {
		orderedSum(out, nil, parts, 0)
		return nil
	}
	b := f32Bytes(out)
	h := wire.Header{Kind: wire.KindAllReduce, Op: opbOrdered, Round: r.round, Seq: r.seq, Total: uint64(len(b))}
	if err := r.note(h); err != nil {
		return err
	}
	if len(b) > r.cfg.DirectBytes {
		j := laneJob{kind: wire.KindAllReduce, algo: algoOrdered, opb: opbOrdered, elem: 4, buf: b, parts: parts,
			seq: r.seq, total: uint64(len(b))}
		return r.runLanes(r.groups[groupFlat], j, len(out), r.lanesFor(len(b)))
	}
	n, rank := r.size, r.rank
	hr, hs := h, h
	hr.Aux, hs.Aux = orderedReduce, orderedSpread
	if rank == 0 {
		orderedSum(out, nil, parts, 0)
	} else {
		if err := r.meshRecv(rank-1, hr, b); err != nil {
			return err
		}
		orderedSum(out, out, parts, 0)
	}
	if rank < n-1 {
		if err := r.meshSend(rank+1, hr, b); err != nil {
			return err
		}
		return r.meshRecv(n-1, hs, b)
	}
	for p := 0; p < n-1; p++ {
		if err := r.meshSend(p, hs, b); err != nil {
			return err
		}
	}
	return nil
}

// AllReduceOrderedTensors is AllReduceOrderedFloat32 with this rank's last
// part given as tensors and the result written into them: the last part
// is the concatenation of last, in order (len(last[0]) + ... +
// len(last[m-1]) values, the length of every part in parts), and on
// return the same tensors hold the sum, every rank's, with the bits of
// AllReduceOrderedFloat32 (the frames are the same, so ranks may mix the
// two calls in one operation). A trainer's last micro-batch is in its
// gradient buffers; this spares it a copy of them into one buffer and of
// the sum back. Where the two-rank exchange runs over shared memory
// (both ranks on one host, more than Config.DirectBytes, and, on rank 1,
// no part but the tensors; on rank 0, a lane's part in at most shmSlots
// chunks), the tensors are copied straight into the slots and the sum
// written straight into them; elsewhere they are copied into a buffer
// the Ring keeps (allocated on the first call of a new length) and the
// result back. Errors: as AllReduceOrderedFloat32; a tensor that shares
// memory with another tensor or with a part is ErrInvalid here and fails
// the operation on every rank.
func (r *Ring) AllReduceOrderedTensors(ctx context.Context, parts [][]float32, last [][]float32) error {
	if err := r.begin(ctx); err != nil {
		return err
	}
	return r.end(r.orderedTensorsIn(parts, last))
}

func (r *Ring) orderedTensorsIn(parts, last [][]float32) error {
	r.vec.set(last)
	defer r.vec.set(nil)
	n := r.vec.total / 4
	if err := checkTensors(parts, last, n); err != nil {
		return r.protoErr(err)
	}
	if r.size == 1 {
		orderedSumTensors(parts, last)
		return nil
	}
	if used, ok := r.orderedVec(len(parts), n); ok {
		h := wire.Header{Kind: wire.KindAllReduce, Op: opbOrdered, Round: r.round, Seq: r.seq, Total: uint64(4 * n)}
		if err := r.note(h); err != nil {
			return err
		}
		j := laneJob{kind: wire.KindAllReduce, algo: algoOrdered, opb: opbOrdered, elem: 4, parts: parts, vec: &r.vec,
			seq: r.seq, total: uint64(4 * n)}
		return r.runLanes(r.groups[groupFlat], j, n, used)
	}
	if len(r.ordFlat) != n {
		r.ordFlat, r.ordOut = make([]float32, n), make([]float32, n)
	}
	off := 0
	for _, t := range last {
		off += copy(r.ordFlat[off:], t)
	}
	r.ordParts = append(append(r.ordParts[:0], parts...), r.ordFlat)
	err := r.orderedIn(r.ordParts, r.ordOut)
	clear(r.ordParts) // no reference to the caller's buffers stays
	if err != nil {
		return err
	}
	off = 0
	for _, t := range last {
		off += copy(t, r.ordOut[off:])
	}
	return nil
}

// orderedVec tells whether an ordered allreduce of n values whose last
// part is r.vec, after nflat other parts, runs on this rank over the
// tensors themselves, and on how many lanes: two ranks, a buffer for the
// lanes, every lane on shared memory; on rank 1 the two-rank exchange
// (the tensors its one part); on rank 0, S_0 summed into the slots
// (orderedInSlots), since the result overwrites the tensors.
func (r *Ring) orderedVec(nflat, n int) (int, bool) {
	if r.size != 2 || 4*n <= r.cfg.DirectBytes || (r.rank == 1 && nflat > 0) {
		return 0, false
	}
	g := r.groups[groupFlat]
	used := r.lanesFor(4 * n)
	chunk := r.cfg.chunkBytes() / 4
	for i, l := range g.lanes[:used] {
		if l.tx == nil || l.rx == nil {
			return 0, false
		}
		lo, hi := span(0, n, i, used)
		if r.rank == 0 && !orderedInSlots(l, 2, &laneJob{lo: lo, hi: hi}, chunk) {
			return 0, false
		}
	}
	return used, true
}

// checkTensors returns an error wrapping ErrInvalid unless every part has
// n values, the concatenation of last, and no two of the tensors and the
// parts share memory.
func checkTensors(parts, last [][]float32, n int) error {
	for i, p := range parts {
		if len(p) != n {
			return fmt.Errorf("%w: ordered allreduce part %d of %d values, the tensors of %d", ErrInvalid, i, len(p), n)
		}
	}
	for i, t := range last {
		if len(t) == 0 {
			continue
		}
		for k, p := range parts {
			if len(p) > 0 && overlap(t, p) {
				return fmt.Errorf("%w: ordered allreduce tensor %d shares memory with part %d", ErrInvalid, i, k)
			}
		}
		for k, u := range last[:i] {
			if len(u) > 0 && overlap(t, u) {
				return fmt.Errorf("%w: ordered allreduce tensors %d and %d share memory", ErrInvalid, k, i)
			}
		}
	}
	return nil
}

// checkParts returns an error wrapping ErrInvalid unless every part has
// len(out) elements and shares no memory with out.
func checkParts(parts [][]float32, out []float32) error {
	for i, p := range parts {
		if len(p) != len(out) {
			return fmt.Errorf("%w: ordered allreduce part %d of %d values, out of %d", ErrInvalid, i, len(p), len(out))
		}
		if len(p) > 0 && overlap(p, out) {
			return fmt.Errorf("%w: ordered allreduce part %d shares memory with out", ErrInvalid, i)
		}
	}
	return nil
}

// overlap tells whether two non-empty slices share memory.
func overlap(a, b []float32) bool {
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}

// orderedSum sets dst[i] to (((src[i] + p_0[c+i]) + p_1[c+i]) + ...) over
// parts p, in order, with src nil meaning +0: each addition rounds to
// float32, one after the other. src may be dst.
func orderedSum(dst, src []float32, parts [][]float32, c int) {
	n := len(dst)
	if len(parts) == 0 {
		if src == nil {
			clear(dst)
		} else {
			copy(dst, src)
		}
		return
	}
	// sumk.To32 is one vector pass where the CPU has AVX, each element
	// the same float32 addition as the Go loops (src's or the running
	// sum's NaN kept of two, as src[i] + p[i] and dst[i] += p[i] do).
	if src == nil {
		plusZero(dst, parts[0][c:c+n])
	} else {
		sumk.To32(dst, src[:n], parts[0][c:c+n])
	}
	for _, p := range parts[1:] {
		sumk.To32(dst, dst, p[c:c+n])
	}
}

// zeros is plusZero's addend.
var zeros [4096]float32

// plusZero sets dst to +0 + p, element by element, in one pass: p's bits,
// except that -0 becomes +0 (p + +0 is the same addition: with one
// operand a NaN, that NaN, quieted, either way).
func plusZero(dst, p []float32) {
	for len(dst) > 0 {
		m := min(len(dst), len(zeros))
		sumk.To32(dst[:m], p[:m], zeros[:m])
		dst, p = dst[m:], p[m:]
	}
}

// orderedSumTensors sets the tensors of last, in place, to the ordered sum
// of parts then last's concatenation: one rank's AllReduceOrderedTensors.
func orderedSumTensors(parts, last [][]float32) {
	off := 0
	for _, t := range last {
		orderedSumLast(t, parts, t, off)
		off += len(t)
	}
}

// orderedSumLast sets dst to ((+0 + p_0[c:]) + ...) + last, parts p in
// order, then last (len(dst) values): the ordered sum of a rank whose last
// part is given apart. dst may be last (not a part): the parts' sum is
// taken in blocks of a buffer on the stack, then last added to it.
func orderedSumLast(dst []float32, parts [][]float32, last []float32, c int) {
	if len(parts) == 0 {
		plusZero(dst, last)
		return
	}
	var blk [1024]float32
	for o := 0; o < len(dst); o += len(blk) {
		m := min(len(blk), len(dst)-o)
		orderedSum(blk[:m], nil, parts, c+o)
		sumk.To32(dst[o:o+m], blk[:m], last[o:o+m])
	}
}

// orderedSend is the sending half of lane l's part of an ordered
// allreduce (see the comment at the top of this file).
func (r *Ring) orderedSend(g *group, l *lane, j *laneJob, chunk int) error {
	n, rank, right := g.n(), g.pos, g.right()
	h := r.header(j)
	out := b32(j.buf)
	if orderedPair(g, j.nparts()) {
		// Rank 1 of two: its part, raw, to rank 0, which adds it to S_0.
		h.Aux = orderedPart
		if l.tx != nil {
			// Chunk by chunk into the slots, the headers in one write, as
			// the two-rank exchange sends: the tensors (orderedVec), whose
			// chunks' sendProg lets the receive half write the result
			// over them, or the part.
			if j.vec == nil {
				pj := *j
				pj.buf = f32Bytes(j.parts[0])
				return r.pairSendShm(l, &pj, &h, chunk, right)
			}
			return r.pairSendShm(l, j, &h, chunk, right)
		}
		p := f32Bytes(j.parts[0])
		for c := j.lo; c < j.hi; c += chunk {
			if err := r.laneWrite(l, &h, p[4*c:4*min(c+chunk, j.hi)], right); err != nil {
				return err
			}
		}
		return nil
	}
	if rank < n-1 {
		h.Aux = orderedReduce
		inSlots := orderedInSlots(l, n, j, chunk)
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			switch {
			case rank == 0 && inSlots:
				// Summed straight into the shared-memory slot: out is
				// overwritten by the spread phase anyway, and with two
				// ranks the slot keeps S_0 for rank 1's part to be
				// added to (orderedInSlots).
				if err := r.shmWaitSlot(l, right); err != nil {
					return err
				}
				off := shmHeader + int(l.txNext%shmSlots)*l.slotBytes
				slot := b32(l.tx[off : off+4*(e-c)])
				if j.vec == nil {
					orderedSum(slot, nil, j.parts, c)
				} else {
					j.vec.each(4*c, 4*e, func(p []byte, o int) {
						orderedSumLast(slot[o/4:o/4+len(p)/4], j.parts, b32(p), c+o/4)
					})
				}
				if n == 2 {
					l.ordTx[k] = off
				}
				l.txNext++
				if err := r.writeFrame(l.right, l.hdrW[:], &h, nil, right, 4*(e-c)); err != nil {
					return err
				}
			case rank == 0:
				orderedSum(out[c:e], nil, j.parts, c)
				if err := r.laneWrite(l, &h, j.buf[4*c:4*e], right); err != nil {
					return err
				}
			default:
				if err := r.waitProg(&l.recvProg, l.recvNote, prog(0, k)); err != nil {
					return err
				}
				if err := r.laneWrite(l, &h, j.buf[4*c:4*e], right); err != nil {
					return err
				}
			}
			l.sendProg.Store(prog(0, k))
			notify(l.sendNote)
		}
	}
	if rank == n-2 {
		return nil // the spread chain ends here
	}
	h.Aux = orderedSpread
	step := 1
	if rank == n-1 {
		step = 0 // the result is this rank's reduce phase
	}
	for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
		e := min(c+chunk, j.hi)
		if err := r.waitProg(&l.recvProg, l.recvNote, prog(step, k)); err != nil {
			return err
		}
		if err := r.laneWrite(l, &h, j.buf[4*c:4*e], right); err != nil {
			return err
		}
	}
	return nil
}

// orderedRecv is the receiving half of lane l's part of an ordered
// allreduce (see the comment at the top of this file).
func (r *Ring) orderedRecv(g *group, l *lane, j *laneJob, chunk int) error {
	n, rank, left := g.n(), g.pos, g.left()
	h := r.header(j)
	out := b32(j.buf)
	if rank > 0 {
		h.Aux = orderedReduce
		for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
			e := min(c+chunk, j.hi)
			var err error
			if j.vec != nil {
				err = r.laneRecvOrderedVec(l, &h, j.vec, c, e, left, k)
			} else {
				err = r.laneRecvOrdered(l, &h, out[c:e], j.parts, c, left)
			}
			if err != nil {
				return err
			}
			l.recvProg.Store(prog(0, k))
			notify(l.recvNote)
		}
	}
	if rank == n-1 {
		return nil // the spread chain starts here (or, in the two-rank exchange, ends)
	}
	h.Aux = orderedSpread
	inSlots := orderedInSlots(l, n, j, chunk)
	for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
		e := min(c+chunk, j.hi)
		// The result, or rank 1's part added to S_0, overwrites what the
		// reduce phase sent from out.
		if err := r.waitProg(&l.sendProg, l.sendNote, prog(0, k)); err != nil {
			return err
		}
		var err error
		if n == 2 {
			var s0 []float32 // S_0: in out, or in the slot it was sent from
			if inSlots {
				s0 = b32(l.tx[l.ordTx[k] : l.ordTx[k]+4*(e-c)])
			}
			if j.vec != nil {
				err = r.laneRecvPairOrderedVec(l, &h, j.vec, c, e, s0, left)
			} else {
				err = r.laneRecvPairOrdered(l, &h, out[c:e], s0, left)
			}
		} else {
			err = r.laneRecvInto(l, &h, j.buf[4*c:4*e], nil, left)
		}
		if err != nil {
			return err
		}
		l.recvProg.Store(prog(1, k))
		notify(l.recvNote)
	}
	return nil
}

// orderedInSlots tells whether rank 0 of an ordered allreduce sums its
// parts straight into the shared-memory slots of lane l: when the lane
// has them and, with two ranks, when the lane's part takes at most
// shmSlots chunks, so that no slot is written twice in the job and each
// keeps its chunk's S_0 until rank 1's part arrives to be added to it.
func orderedInSlots(l *lane, n int, j *laneJob, chunk int) bool {
	return l.tx != nil && (n > 2 || (j.hi-j.lo+chunk-1)/chunk <= shmSlots)
}

// laneRecvPairOrdered is rank 0's receive, of two ranks, of elements
// [c, c+len(dst)) of an ordered allreduce whose S_0 is in s0, or in dst
// when s0 is nil: the result (aux orderedSpread), copied into dst, or
// rank 1's one part (orderedPart), added to S_0 into dst as rank 1 adds
// it.
func (r *Ring) laneRecvPairOrdered(l *lane, h *wire.Header, dst, s0 []float32, peer int) error {
	db := f32Bytes(dst)
	part, err := r.readHeaderAux(l.leftR, l.hdrR[:], h, orderedPart, len(db), peer)
	if err != nil {
		return err
	}
	if s0 == nil {
		s0 = dst
	}
	if l.rx != nil {
		off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
		src := l.rx[off : off+len(db)]
		if part {
			sumk.To32(dst, s0, b32(src))
		} else {
			copy(db, src)
		}
		return r.shmConsume(l, peer)
	}
	if !part {
		return r.readBody(l.leftR, db, peer)
	}
	tmp := l.scratch[:len(db)]
	if err := r.readBody(l.leftR, tmp, peer); err != nil {
		return err
	}
	sumk.To32(dst, s0, b32(tmp))
	return nil
}

// laneRecvOrdered receives the running sum of elements [c, c+len(dst)) of
// an ordered allreduce on lane l and adds parts to it in order, into dst.
// From a shared-memory slot the first addition reads the slot, so the
// running sum is not copied first.
func (r *Ring) laneRecvOrdered(l *lane, h *wire.Header, dst []float32, parts [][]float32, c, peer int) error {
	db := f32Bytes(dst)
	if l.rx == nil || len(parts) == 0 {
		if err := r.laneRecvInto(l, h, db, nil, peer); err != nil {
			return err
		}
		orderedSum(dst, dst, parts, c)
		return nil
	}
	if err := r.readHeader(l.leftR, l.hdrR[:], h, len(db), peer); err != nil {
		return err
	}
	off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
	orderedSum(dst, b32(l.rx[off:off+len(db)]), parts, c)
	return r.shmConsume(l, peer)
}

// laneRecvPairOrderedVec is laneRecvPairOrdered for rank 0 of an ordered
// allreduce over tensors (AllReduceOrderedTensors on shared memory):
// elements [c, e) of their concatenation receive the result, or S_0 (in
// s0, its slot) plus rank 1's part.
func (r *Ring) laneRecvPairOrderedVec(l *lane, h *wire.Header, v *vecBuf, c, e int, s0 []float32, peer int) error {
	part, err := r.readHeaderAux(l.leftR, l.hdrR[:], h, orderedPart, 4*(e-c), peer)
	if err != nil {
		return err
	}
	off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
	src := l.rx[off : off+4*(e-c)]
	v.each(4*c, 4*e, func(p []byte, o int) {
		if part {
			sumk.To32(b32(p), s0[o/4:o/4+len(p)/4], b32(src[o:o+len(p)]))
		} else {
			copy(p, src[o:])
		}
	})
	return r.shmConsume(l, peer)
}

// laneRecvOrderedVec is rank 1's receive of S_0, of two ranks, in an
// ordered allreduce over tensors whose one part is the tensors
// (AllReduceOrderedTensors on shared memory): elements [c, e) of their
// concatenation, chunk k of the lane, become S_0 + part, the addition
// rank 0 makes, once the send half has copied the chunk out.
func (r *Ring) laneRecvOrderedVec(l *lane, h *wire.Header, v *vecBuf, c, e, peer, k int) error {
	if err := r.readHeader(l.leftR, l.hdrR[:], h, 4*(e-c), peer); err != nil {
		return err
	}
	if err := r.waitProg(&l.sendProg, l.sendNote, prog(0, k)); err != nil {
		return err
	}
	off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
	src := l.rx[off : off+4*(e-c)]
	v.each(4*c, 4*e, func(p []byte, o int) {
		sumk.To32(b32(p), b32(src[o:o+len(p)]), b32(p))
	})
	return r.shmConsume(l, peer)
}
