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
