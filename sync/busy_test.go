package sync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
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
					// other may learn of the timeout from its notice,
					// which carries the same verdict.
					if !errors.As(err, &te) || !slices.Contains(te.Busy, 1) {
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

// newMixedWorld is an in-process world whose ranks have their own
// Configs (the same job and secret), so one rank gives up before the
// others and they learn of it only from its abort notice.
func newMixedWorld(t *testing.T, cfgs []Config) *testWorld {
	t.Helper()
	ts := make([]*Transport, len(cfgs))
	addrs := make([]string, len(cfgs))
	for i, cfg := range cfgs {
		tr, err := Listen(context.Background(), "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		ts[i], addrs[i] = tr, tr.Addr()
		t.Cleanup(func() { tr.Close() })
	}
	return &testWorld{cfg: cfgs[0], ts: ts, rings: connectAll(t, ts, addrs, 1)}
}

// TestRelayedTimeoutNamesTheSameRanks: the ranks that learn of a timeout
// from the abort notice of the rank that gave up report the same verdict
// as it (the same From, Silent, Busy and Waited), for a wait that hit
// BusyTimeout on a busy rank and for one that hit OpTimeout on two silent
// ranks. Rank 0 alone has the short limit, so every other rank's error
// comes from its notice (the notice used to carry one silent rank and no
// busy ones; a trial under load saw a relayed error without the names).
func TestRelayedTimeoutNamesTheSameRanks(t *testing.T) {
	base := smallConfig(t)
	base.OpTimeout = 300 * time.Millisecond
	base.BusyTimeout = time.Minute
	t.Run("busy", func(t *testing.T) {
		cfgs := []Config{base, base, base}
		cfgs[0].BusyTimeout = 1200 * time.Millisecond
		w := newMixedWorld(t, cfgs)
		release := make(chan struct{})
		errs := w.each(func(rank int, r *Ring) error {
			if rank == 1 {
				done := r.Busy()
				defer done()
				<-release
				return nil
			}
			err := allReduceOnes(context.Background(), r, 100)
			if rank == 0 {
				close(release)
			}
			return err
		})
		checkSameVerdict(t, errs, []int{0, 2}, 0, nil, []int{1})
	})
	t.Run("silent", func(t *testing.T) {
		cfgs := []Config{base, base, base, base}
		cfgs[3].OpTimeout = time.Minute
		w := newMixedWorld(t, cfgs)
		release := make(chan struct{})
		errs := w.each(func(rank int, r *Ring) error {
			if rank == 1 || rank == 2 {
				<-release // stuck outside any operation, not marked
				return nil
			}
			err := allReduceOnes(context.Background(), r, 100)
			if rank == 0 {
				close(release)
			}
			return err
		})
		checkSameVerdict(t, errs, []int{0, 3}, 0, []int{1, 2}, nil)
	})
}

// checkSameVerdict checks that the errors of ranks are *TimeoutErrors of
// rank from naming silent and busy, all with the same Waited.
func checkSameVerdict(t *testing.T, errs []error, ranks []int, from int, silent, busy []int) {
	t.Helper()
	var waited time.Duration
	for i, rank := range ranks {
		var te *TimeoutError
		if !errors.As(errs[rank], &te) {
			t.Errorf("rank %d: %v, want a *TimeoutError", rank, errs[rank])
			continue
		}
		t.Logf("rank %d: %v", rank, te)
		if te.From != from || !slices.Equal(te.Silent, silent) || !slices.Equal(te.Busy, busy) {
			t.Errorf("rank %d: from %d silent %v busy %v, want from %d silent %v busy %v", rank, te.From, te.Silent, te.Busy, from, silent, busy)
		}
		if i == 0 {
			waited = te.Waited
		} else if te.Waited != waited {
			t.Errorf("rank %d: waited %v, rank %d %v", rank, te.Waited, ranks[0], waited)
		}
	}
}

// TestAbortNoticePassesTheVerdictOn: a rank that passes on a timeout's
// notice (its own cause came from it) sends the origin and the verdict
// unchanged, not a notice of its own with the first silent rank only.
func TestAbortNoticePassesTheVerdictOn(t *testing.T) {
	r := &Ring{rank: 3, size: 5, round: 7}
	in := wire.Abort{Origin: 1, Blamed: 2, Reason: wire.ReasonTimeout, Verdict: true, Waited: int64(2 * time.Second), Silent: []int{2, 4}, Busy: []int{0}}
	cause := r.abortCause(1, in)
	out := abortFor(cause, r.rank, in.Reason, int(in.Blamed))
	if out.Origin != in.Origin || out.Blamed != in.Blamed || !out.Verdict || out.Waited != in.Waited ||
		!slices.Equal(out.Silent, in.Silent) || !slices.Equal(out.Busy, in.Busy) {
		t.Fatalf("passed on %+v, want %+v", *out, in)
	}
	got, err := wire.ParseAbort(wire.AppendAbort(nil, out), r.size)
	if err != nil || !slices.Equal(got.Silent, in.Silent) || !slices.Equal(got.Busy, in.Busy) {
		t.Fatalf("the passed-on notice decodes to %+v, %v", got, err)
	}
}
