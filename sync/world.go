package sync

import (
	"context"
	"fmt"
	"github.com/elastictrain/elastictrain/sync/mesh"
)

// World is one round's membership as this rank sees it, a plain value that
// the rendezvous (package elastic) provides or a test builds by hand: JobID,
// Round, Rank and Addrs (see mesh.World, which it is).
type World = mesh.World

// Op is a reduction operator for allreduce.
type Op uint8

// Reduction operators.
const (
	OpSum Op = iota // element-wise sum
	OpAvg           // element-wise sum divided by the world size
	OpMax           // element-wise maximum
	OpMin           // element-wise minimum
)

// String names the operator.
func (o Op) String() string {
	switch o {
	case OpSum:
		return "sum"
	case OpAvg:
		return "avg"
	case OpMax:
		return "max"
	case OpMin:
		return "min"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

func (o Op) valid() bool { return o <= OpMin }

// Synchronizer moves numbers between the ranks of one round. The trainer uses
// it for gradients (AllReduce) and state (Broadcast); a ring (*Ring), a
// parameter server and the world-size-1 NewLocal are interchangeable behind it.
//
// Contract: one Synchronizer per round. Its methods are called from one
// goroutine (Close may be called from any goroutine, and aborts an operation
// in flight). Every rank calls the same collectives in the same order with
// buffers of the same length (and the same op, root); a disagreement is an
// error on every rank (ErrMismatch), or at worst ErrTimeout, never a hang.
// After any error the Synchronizer is broken for good: every later call
// returns the same error; form a new round.
type Synchronizer interface {
	// Rank returns this process's rank in the round.
	Rank() int
	// Size returns the world size.
	Size() int
	// AllReduceFloat32 reduces buf element-wise over all ranks with op and
	// leaves the result in buf on every rank (bit-identical on all ranks).
	AllReduceFloat32(ctx context.Context, buf []float32, op Op) error
	// AllReduceFloat64 is AllReduceFloat32 for float64.
	AllReduceFloat64(ctx context.Context, buf []float64, op Op) error
	// Broadcast copies root's buf into buf on every other rank; len(buf)
	// must be equal on all ranks.
	Broadcast(ctx context.Context, buf []byte, root int) error
	// Barrier returns once every rank has entered it.
	Barrier(ctx context.Context) error
	// Close releases the Synchronizer and stops its goroutines; an operation
	// in flight (on any rank) fails.
	Close() error
}

// AllGatherer is the optional allgather capability of a Synchronizer, found
// by type assertion (*Ring and NewLocal have it): recv (len Size()*len(send))
// receives every rank's send buffer in rank order.
type AllGatherer interface {
	AllGather(ctx context.Context, send, recv []byte) error
}

var _ AllGatherer = (*Ring)(nil)
var _ AllGatherer = (*local)(nil)

// OrderedReducer is the optional ordered-allreduce capability of a
// Synchronizer, found by type assertion (*Ring, NewLocal and the ranks of
// package synctest have it): a float32 sum whose bits depend only on the
// global sequence of summands, not on the world size nor on how the
// summands are split among the ranks.
//
// AllReduceOrderedFloat32 leaves in out, on every rank, the sum of every
// rank's parts taken over the ranks in rank order and, within a rank,
// over its parts in order, strictly sequentially and starting from +0:
//
//	out[i] = ((((+0 + p[0][0][i]) + p[0][1][i]) + ... + p[1][0][i]) + ...) + p[W-1][k][i]
//
// where p[r][j] is part j of rank r, each addition rounded to float32
// (IEEE 754, round to nearest). The result is bit-identical on every rank and,
// for the same global sequence of parts, equal at every world size and
// however the parts are divided among the ranks, since a rank may pass
// any number of parts, none included: the global batch's micro-batches
// m_0 ... m_{K-1}, held by the ranks in contiguous runs in rank order, sum
// to (((0 + m_0) + m_1) + ... + m_{K-1}) whatever the runs. That is
// exact, not approximately so: a rank adds its parts one by one to the
// running sum it receives, as it lies in memory, never to a partial sum of
// its own (float addition is not associative: (1 + 1e8) - 1e8 is 0 in
// float32, 1 + (1e8 - 1e8) is 1), the running sum travels bit for bit,
// and the result is copied to every rank; element i never meets element
// j, so how the buffer is cut into chunks and lanes does not matter
// either. (Where two NaNs meet, which payload survives may vary between
// machines and compilers; all ranks of a round still hold the same bits,
// since the result is computed once and copied, or, in the two-rank
// exchange of a *Ring whose rank 1 holds one part, computed on both ranks
// from the same two operands in the same order, which differ only where
// the two ranks' machines propagate NaN payloads differently.)
//
// Every part must have len(out) elements, and out must share no memory
// with a part (else ErrInvalid on this rank, and the operation fails on
// every rank); len(out) must be the same on every rank (else ErrMismatch,
// as for the other collectives). The parts are only read. The contract of
// Synchronizer applies: it is one collective in the sequence that every
// rank calls in the same order, and its failures (abort, *PeerError,
// *TimeoutError, busy peers) are those of the other collectives.
type OrderedReducer interface {
	AllReduceOrderedFloat32(ctx context.Context, parts [][]float32, out []float32) error
}

var _ OrderedReducer = (*local)(nil)
