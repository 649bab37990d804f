package sync

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCancelAbortsEveryRank: cancelling one rank's context during an
// allreduce fails it there (context error) and on every other rank with a
// *PeerError naming that rank, including a rank that is not in an operation.
func TestCancelAbortsEveryRank(t *testing.T) {
	w := newTestWorld(t, 3, smallConfig(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	entered := make(chan struct{})
	done := make(chan error, 2)
	// Ranks 0 and 1 start an allreduce that cannot finish (rank 2 never joins).
	go func() {
		done <- w.rings[0].AllReduceFloat32(context.Background(), make([]float32, 10000), OpSum)
	}()
	go func() {
		close(entered)
		done <- w.rings[1].AllReduceFloat32(ctx, make([]float32, 10000), OpSum)
	}()
	<-entered
	// Wait until rank 1 is inside the operation, then cancel.
	waitFor(t, time.Second, func() bool { return w.rings[1].inOp.Load() })
	start := time.Now()
	cancel()
	for i := 0; i < 2; i++ {
		err := <-done
		if err == nil {
			t.Fatal("allreduce returned nil")
		}
		var pe *PeerError
		switch {
		case errors.Is(err, context.Canceled):
			if !errors.Is(err, ErrAborted) {
				t.Errorf("cancelled rank: %v does not wrap ErrAborted", err)
			}
		case errors.As(err, &pe):
			if pe.Rank != 1 || !errors.Is(err, ErrAborted) {
				t.Errorf("peer: %v, want PeerError naming rank 1 wrapping ErrAborted", err)
			}
		default:
			t.Errorf("unexpected error %v", err)
		}
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("abort took %v", el)
	}
	// Rank 2 was idle: its Ring is broken too, naming rank 1.
	waitFor(t, 2*time.Second, func() bool { return w.rings[2].Err() != nil })
	var pe *PeerError
	if err := w.rings[2].Barrier(context.Background()); !errors.As(err, &pe) || pe.Rank != 1 {
		t.Errorf("idle rank: %v, want PeerError naming rank 1", err)
	}
}

// TestCloseDuringOperation: Close from another goroutine aborts the
// operation in flight on this rank and on the others.
func TestCloseDuringOperation(t *testing.T) {
	w := newTestWorld(t, 2, smallConfig(t))
	done := make(chan error, 1)
	go func() { done <- w.rings[0].AllReduceFloat64(context.Background(), make([]float64, 5000), OpSum) }()
	waitFor(t, time.Second, func() bool { return w.rings[0].inOp.Load() })
	w.rings[0].Close()
	if err := <-done; err == nil {
		t.Fatal("allreduce on the closed rank returned nil")
	}
	var pe *PeerError
	err := w.rings[1].AllReduceFloat64(context.Background(), make([]float64, 5000), OpSum)
	if !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("peer: %v, want PeerError naming rank 0", err)
	}
}

// TestGracefulClose: a rank that closes between operations makes the next
// operation on the others fail naming it (ErrClosed), promptly.
func TestGracefulClose(t *testing.T) {
	w := newTestWorld(t, 3, smallConfig(t))
	w.must(t, "barrier", func(_ int, r *Ring) error { return r.Barrier(context.Background()) })
	w.rings[2].Close()
	if err := w.rings[2].Barrier(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed rank: %v, want ErrClosed", err)
	}
	for r := 0; r < 2; r++ {
		start := time.Now()
		err := w.rings[r].AllReduceFloat32(context.Background(), make([]float32, 3000), OpSum)
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != 2 {
			t.Fatalf("rank %d: %v, want PeerError naming rank 2", r, err)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Fatalf("rank %d took %v", r, el)
		}
	}
}

// TestContextDeadline: an operation whose context deadline passes fails
// with context.DeadlineExceeded and aborts the others.
func TestContextDeadline(t *testing.T) {
	w := newTestWorld(t, 2, smallConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := w.rings[0].Barrier(ctx) // rank 1 never enters
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	var pe *PeerError
	if err := w.rings[1].Barrier(context.Background()); !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("peer: %v, want PeerError naming rank 0", err)
	}
}

// TestOpTimeoutInProcess: OpTimeout bounds an operation whose peer never
// joins, on every rank that is in it.
func TestOpTimeoutInProcess(t *testing.T) {
	cfg := smallConfig(t)
	cfg.OpTimeout = 300 * time.Millisecond
	w := newTestWorld(t, 2, cfg)
	start := time.Now()
	err := w.rings[0].AllReduceFloat32(context.Background(), make([]float32, 100000), OpSum)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el > cfg.OpTimeout+time.Second {
		t.Fatalf("took %v", el)
	}
}

func waitFor(t testing.TB, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %v", d)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}
