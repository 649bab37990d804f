package sync

import (
	"context"
	"fmt"
	gosync "sync"
)

// local is the world-size-1 Synchronizer.
type local struct {
	mu     gosync.Mutex
	closed bool
}

// NewLocal returns a Synchronizer for a world of size 1 (rank 0): no
// network; AllReduce leaves buffers unchanged (OpAvg divides by 1),
// Broadcast accepts only root 0, Barrier returns at once. Operations check
// the context first (returning ctx.Err() wrapped) and return ErrClosed after
// Close. Safe for concurrent use.
func NewLocal() Synchronizer { return &local{} }

func (l *local) check(ctx context.Context) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return fmt.Errorf("%w: local synchronizer", ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrAborted, err)
	}
	return nil
}

// Rank returns 0.
func (l *local) Rank() int { return 0 }

// Size returns 1.
func (l *local) Size() int { return 1 }

// AllReduceFloat32 leaves buf unchanged (the reduction over one rank).
func (l *local) AllReduceFloat32(ctx context.Context, buf []float32, op Op) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if !op.valid() {
		return fmt.Errorf("%w: unknown reduction %v", ErrInvalid, op)
	}
	return nil
}

// AllReduceFloat64 leaves buf unchanged (the reduction over one rank).
func (l *local) AllReduceFloat64(ctx context.Context, buf []float64, op Op) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if !op.valid() {
		return fmt.Errorf("%w: unknown reduction %v", ErrInvalid, op)
	}
	return nil
}

// Broadcast accepts root 0 only and leaves buf unchanged.
func (l *local) Broadcast(ctx context.Context, buf []byte, root int) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if root != 0 {
		return fmt.Errorf("%w: broadcast root %d outside world size 1", ErrInvalid, root)
	}
	return nil
}

// AllGather copies send into recv (world size 1).
func (l *local) AllGather(ctx context.Context, send, recv []byte) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if len(recv) != len(send) {
		return fmt.Errorf("%w: allgather recv of %d bytes, want %d", ErrInvalid, len(recv), len(send))
	}
	copy(recv, send)
	return nil
}

// AllReduceOrderedFloat32 implements OrderedReducer for a world of one
// rank: out = (((+0 + parts[0]) + parts[1]) + ...), element-wise, each
// addition rounded to float32. Errors: as the other operations, and
// ErrInvalid for a part whose length is not len(out) or that shares memory
// with out.
func (l *local) AllReduceOrderedFloat32(ctx context.Context, parts [][]float32, out []float32) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	if err := checkParts(parts, out); err != nil {
		return err
	}
	orderedSum(out, nil, parts, 0)
	return nil
}

// AllReduceOrderedTensors is Ring.AllReduceOrderedTensors for a world of
// one rank: each of last's tensors becomes, element-wise, the ordered sum
// of parts then itself, (((+0 + parts[0]) + ...) + last), in place.
// Errors: as AllReduceOrderedFloat32, and ErrInvalid for tensors that
// share memory with each other or with a part.
func (l *local) AllReduceOrderedTensors(ctx context.Context, parts [][]float32, last [][]float32) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	n := 0
	for _, t := range last {
		n += len(t)
	}
	if err := checkTensors(parts, last, n); err != nil {
		return err
	}
	orderedSumTensors(parts, last)
	return nil
}

// Barrier returns at once (after the context and Close checks).
func (l *local) Barrier(ctx context.Context) error { return l.check(ctx) }

// Close makes every later call return ErrClosed.
func (l *local) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return nil
}
