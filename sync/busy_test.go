package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// allReduceOnes allreduces n ones with OpSum and checks every element is
// the world size.
func allReduceOnes(ctx context.Context, r *Ring, n int) error {
	buf := make([]float32, n)
	for i := range buf {
		buf[i] = 1
	}
	if err := r.AllReduceFloat32(ctx, buf, OpSum); err != nil {
		return err
	}
	for i, v := range buf {
		if v != float32(r.Size()) {
			return fmt.Errorf("element %d is %v, want %d", i, v, r.Size())
		}
	}
	return nil
}

// TestBusyPeerExtendsOperation (issue 14, Must show 3 at the transport): a
// rank that marks a phase busy for four times OpTimeout before it enters
// an allreduce holds its peers up without failing them: they wait in the
// operation, and it completes on every rank once the busy rank joins. On
// the direct path (mesh connections) and the ring lanes.
func TestBusyPeerExtendsOperation(t *testing.T) {
	const opTimeout = 400 * time.Millisecond
	for _, tc := range []struct {
		name string
		n    int
	}{{"direct", 100}, {"ring", 20000}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.OpTimeout = opTimeout
			w := newTestWorld(t, 3, cfg)
			start := time.Now()
			errs := w.each(func(rank int, r *Ring) error {
				if rank == 1 {
					done := r.Busy()
					time.Sleep(4 * opTimeout) // the long phase itself
					done()
				}
				return allReduceOnes(context.Background(), r, tc.n)
			})
			for rank, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", rank, err)
				}
			}
			took := time.Since(start)
			t.Logf("the allreduce waited %v for a busy peer (OpTimeout %v)", took, opTimeout)
			if took < 4*opTimeout {
				t.Errorf("took %v, less than the busy phase", took)
			}
			// The Rings still work.
			w.must(t, "allreduce after", func(_ int, r *Ring) error { return allReduceOnes(context.Background(), r, tc.n) })
		})
	}
}

// TestSilentPeerIsNamed (issue 14, Must show 4 at the transport): a rank
// that neither enters the operation nor marks itself busy is named in the
// *TimeoutError of every other rank within OpTimeout (plus slack), also
// while a third rank is marked busy, which must not hide it.
func TestSilentPeerIsNamed(t *testing.T) {
	const opTimeout = 500 * time.Millisecond
	for _, withBusy := range []bool{false, true} {
		name := "alone"
		if withBusy {
			name = "beside-a-busy-peer"
		}
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.OpTimeout = opTimeout
			w := newTestWorld(t, 4, cfg)
			const silent, busy = 2, 1
			release := make(chan struct{})
			start := time.Now()
			took := make([]time.Duration, 4)
			errs := w.each(func(rank int, r *Ring) error {
				switch {
				case rank == silent:
					<-release // stuck outside any operation, not marked
					return nil
				case rank == busy && withBusy:
					done := r.Busy()
					defer done()
					<-release
					return nil
				}
				err := allReduceOnes(context.Background(), r, 100)
				took[rank] = time.Since(start)
				if err != nil && rank == 0 {
					close(release)
				}
				return err
			})
			for rank, err := range errs {
				if rank == silent || (rank == busy && withBusy) {
					continue
				}
				var te *TimeoutError
				if !errors.As(err, &te) || !errors.Is(err, ErrTimeout) {
					t.Fatalf("rank %d: %v, want a *TimeoutError", rank, err)
				}
				t.Logf("rank %d after %v: %v", rank, took[rank].Round(time.Millisecond), err)
				if !slices.Contains(te.Silent, silent) {
					t.Errorf("rank %d: %v does not name rank %d as silent", rank, err, silent)
				}
				if slices.Contains(te.Silent, busy) && withBusy {
					t.Errorf("rank %d: %v names the busy rank as silent", rank, err)
				}
				if took[rank] > opTimeout+time.Second {
					t.Errorf("rank %d failed after %v, want within OpTimeout + 1 s", rank, took[rank])
				}
			}
		})
	}
}

// TestBusyTimeoutBoundsTheWait: a phase marked busy for good holds its
// peers for Config.BusyTimeout, not for ever: they fail with a
// *TimeoutError naming the busy rank; and an operation whose context
// deadline comes first ends at it, with the context's error.
func TestBusyTimeoutBoundsTheWait(t *testing.T) {
	cfg := smallConfig(t)
	cfg.OpTimeout = 300 * time.Millisecond
	cfg.BusyTimeout = 1500 * time.Millisecond
	for _, tc := range []struct {
		name     string
		deadline time.Duration // of the waiting ranks' context; 0: none
		want     time.Duration
	}{{"busy-timeout", 0, cfg.BusyTimeout}, {"context", 900 * time.Millisecond, 900 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTestWorld(t, 3, cfg)
			release := make(chan struct{})
			start := time.Now()
			took := make([]time.Duration, 3)
			errs := w.each(func(rank int, r *Ring) error {
				if rank == 1 {
					done := r.Busy()
					defer done()
					<-release
					return nil
				}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				err := allReduceOnes(ctx, r, 100)
				took[rank] = time.Since(start)
				if rank == 0 {
					close(release)
				}
				return err
			})
			for _, rank := range []int{0, 2} {
				err := errs[rank]
				t.Logf("rank %d after %v: %v", rank, took[rank].Round(time.Millisecond), err)
				if took[rank] < tc.want-100*time.Millisecond || took[rank] > tc.want+time.Second {
					t.Errorf("rank %d failed after %v, want about %v", rank, took[rank], tc.want)
				}
				var te *TimeoutError
				if tc.deadline == 0 {
					// The first rank to give up names the busy rank; the
					// other may learn of the timeout from its notice.
					if !errors.As(err, &te) || (te.From == rank && !slices.Contains(te.Busy, 1)) {
						t.Errorf("rank %d: %v, want a *TimeoutError naming busy rank 1", rank, err)
					}
				} else if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrAborted) {
					t.Errorf("rank %d: %v, want the context's deadline", rank, err)
				}
			}
		})
	}
}

// A peer whose busy phase ends (or whose process stops mid-phase, so its
// frames stop) without entering the operation is silent once the deadline
// its last frame set has passed, and is named, also when OpTimeout is below
// the 2 s a busy frame otherwise stays fresh (a breaker found the timeout
// naming nobody at OpTimeout 400 ms).
func TestAPeerQuietAfterBusyIsNamed(t *testing.T) {
	cfg := smallConfig(t)
	cfg.OpTimeout = 400 * time.Millisecond
	cfg.BusyTimeout = 20 * time.Second
	w := newTestWorld(t, 3, cfg)
	const quiet = 1
	release := make(chan struct{})
	errs := w.each(func(rank int, r *Ring) error {
		if rank == quiet {
			done := r.Busy()
			time.Sleep(time.Second) // the phase under test: its frames go out
			done()
			<-release // then quiet, outside any operation
			return nil
		}
		err := allReduceOnes(context.Background(), r, 100)
		if rank == 0 {
			close(release)
		}
		return err
	})
	for _, rank := range []int{0, 2} {
		var te *TimeoutError
		if !errors.As(errs[rank], &te) || !slices.Equal(te.Silent, []int{quiet}) {
			t.Errorf("rank %d: %v, want a *TimeoutError naming rank %d silent", rank, errs[rank], quiet)
		}
	}
}
