package localsgd

import (
	"context"
	"errors"
	"math"
	stdsync "sync"
	"testing"

	"github.com/elastictrain/elastictrain/sync/synctest"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/ring"
)

// twoRanks makes one Strategy per rank over its own two parameters of one
// value each, all starting at start, with plain SGD (lr 1) inside, so a
// local step with gradient g moves a value by -g.
func twoRanks(t *testing.T, cfg Config, start []float32) []*Strategy {
	t.Helper()
	out := make([]*Strategy, 2)
	for r := range out {
		ps := []trainer.Param{
			{Name: "a", Shape: []int{1}, Value: []float32{start[0]}, Grad: make([]float32, 1)},
			{Name: "b", Shape: []int{1}, Value: []float32{start[1]}, Grad: make([]float32, 1)},
		}
		s, err := New(ps, optim.NewSGD(1), ring.NewBackend("127.0.0.1:0", trainer.DefaultConfig().Sync), cfg)
		if err != nil {
			t.Fatal(err)
		}
		out[r] = s
	}
	return out
}

// localStep gives rank s the gradients g and takes one local step.
func localStep(t *testing.T, s *Strategy, g ...float32) {
	t.Helper()
	for k, p := range s.params {
		p.Grad[0] = g[k]
	}
	if err := s.Optimizer().Step(s.params); err != nil {
		t.Fatal(err)
	}
}

// outer runs the outer step on both ranks of an in-memory round.
func outer(t *testing.T, ss []*Strategy, final bool) []bool {
	t.Helper()
	g := synctest.NewGroup(len(ss), synctest.Config{})
	synced := make([]bool, len(ss))
	errs := make([]error, len(ss))
	var wg stdsync.WaitGroup
	for r, s := range ss {
		wg.Go(func() { synced[r], errs[r] = s.outerStep(context.Background(), g.Rank(r), final) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return synced
}

func values(s *Strategy) []float32 { return []float32{s.params[0].Value[0], s.params[1].Value[0]} }

func near(t *testing.T, what string, got []float32, want ...float64) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i])-want[i]) > 1e-6 {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
	}
}

// Hand-computed: both ranks start at (1, 2); rank 0 steps to (0.8, 2.2),
// rank 1 to (0.6, 1.8): changes (0.2, -0.2) and (0.4, 0.2), mean delta
// (0.3, 0). Then both step by (0.1, 0.1): mean delta (0.1, 0.1).
func TestOuterStepHandComputed(t *testing.T) {
	for _, c := range []struct {
		name          string
		cfg           Config
		first, second []float64
	}{
		// The mean: (0.7, 2), then (0.6, 1.9).
		{"localsgd", Config{Every: 1, Outer: Average}, []float64{0.7, 2.0}, []float64{0.6, 1.9}},
		// u = (0.3, 0); theta = anchor - 0.7*(delta + 0.9*u) = (1 - 0.7*0.57, 2).
		// Then u = 0.9*(0.3, 0) + (0.1, 0.1) = (0.37, 0.1);
		// theta = (0.601, 2) - 0.7*((0.1, 0.1) + 0.9*u) = (0.601 - 0.3031, 2 - 0.133).
		{"diloco", Config{Every: 1, Outer: Nesterov, LR: 0.7, Momentum: 0.9}, []float64{0.601, 2.0}, []float64{0.2979, 1.867}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ss := twoRanks(t, c.cfg, []float32{1, 2})
			localStep(t, ss[0], 0.2, -0.2)
			localStep(t, ss[1], 0.4, 0.2)
			outer(t, ss, false)
			for _, s := range ss {
				near(t, "first outer step", values(s), c.first...)
			}
			localStep(t, ss[0], 0.1, 0.1)
			localStep(t, ss[1], 0.1, 0.1)
			outer(t, ss, false)
			for _, s := range ss {
				near(t, "second outer step", values(s), c.second...)
				if c.cfg.Outer == Nesterov {
					near(t, "momentum", s.u[0], 0.37)
					near(t, "momentum", s.u[1], 0.1)
				}
			}
		})
	}
}

// Between outer steps OuterStep reports unsynced without communicating;
// final synchronises what is pending.
func TestOuterStepEveryAndFinal(t *testing.T) {
	ss := twoRanks(t, Config{Every: 3, Outer: Average}, []float32{1, 2})
	g := synctest.NewGroup(2, synctest.Config{})
	for range 2 {
		localStep(t, ss[0], 0.1, 0)
		localStep(t, ss[1], 0.3, 0)
		for r, s := range ss {
			// One rank alone: a collective would wait for the other.
			synced, err := s.outerStep(context.Background(), g.Rank(r), false)
			if err != nil || synced {
				t.Fatalf("rank %d after %d local steps of 3: synced %v, err %v; want false, nil", r, s.count, synced, err)
			}
		}
	}
	if got := outer(t, ss, true); !got[0] || !got[1] {
		t.Fatalf("final outer step: synced %v", got)
	}
	for _, s := range ss {
		near(t, "final outer step", values(s), 0.6, 2.0) // 1 - mean(0.2, 0.6)
		if st := s.Stats(); st.OuterSteps != 1 || st.ReducedBytes != 8 {
			t.Fatalf("stats %+v, want 1 outer step of 8 bytes", st)
		}
	}
	if got := outer(t, ss, true); !got[0] || !got[1] {
		t.Fatalf("nothing pending: synced %v", got)
	}
	if st := ss[0].Stats(); st.OuterSteps != 1 {
		t.Fatalf("an outer step with nothing pending communicated: %+v", st)
	}
}

// The outer momentum and the pending count travel in the optimizer's
// state: a strategy loaded from it continues with the same bits.
func TestStateRoundTrip(t *testing.T) {
	cfg := Config{Every: 1, Outer: Nesterov, LR: 0.7, Momentum: 0.9}
	ss := twoRanks(t, cfg, []float32{1, 2})
	localStep(t, ss[0], 0.2, -0.2)
	localStep(t, ss[1], 0.4, 0.2)
	outer(t, ss, false)
	state := ss[0].Optimizer().AppendState(nil)

	loaded := twoRanks(t, cfg, values(ss[0]))
	for _, s := range loaded {
		if err := s.Optimizer().LoadState(state, s.params); err != nil {
			t.Fatal(err)
		}
	}
	for _, pair := range [][]*Strategy{ss, loaded} {
		localStep(t, pair[0], 0.1, 0.1)
		localStep(t, pair[1], 0.1, 0.1)
		outer(t, pair, false)
	}
	for r := range ss {
		a, b := values(ss[r]), values(loaded[r])
		if math.Float32bits(a[0]) != math.Float32bits(b[0]) || math.Float32bits(a[1]) != math.Float32bits(b[1]) {
			t.Fatalf("rank %d: continued %v, loaded and continued %v", r, a, b)
		}
	}

	other := twoRanks(t, Config{Every: 2, Outer: Nesterov, LR: 0.7, Momentum: 0.9}, []float32{1, 2})[0]
	avg := twoRanks(t, Config{Every: 1, Outer: Average}, []float32{1, 2})[0]
	for name, c := range map[string]struct {
		s   *Strategy
		src []byte
	}{
		"another H":     {other, state},
		"another outer": {avg, state},
		"truncated":     {loaded[0], state[:len(state)-3]},
		"empty":         {loaded[0], nil},
	} {
		before := c.s.Optimizer().AppendState(nil)
		if err := c.s.Optimizer().LoadState(c.src, c.s.params); !errors.Is(err, trainer.ErrCorruptState) {
			t.Errorf("%s: LoadState = %v, want ErrCorruptState", name, err)
		}
		if after := c.s.Optimizer().AppendState(nil); string(after) != string(before) {
			t.Errorf("%s: a refused LoadState changed the state", name)
		}
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	ps := []trainer.Param{{Name: "a", Shape: []int{1}, Value: []float32{1}, Grad: []float32{0}}}
	base := ring.NewBackend("127.0.0.1:0", trainer.DefaultConfig().Sync)
	for name, c := range map[string]struct {
		ps    []trainer.Param
		inner optim.Optimizer
		base  driver.Backend
		cfg   Config
	}{
		"H 0":           {ps, optim.NewSGD(1), base, Config{Every: 0}},
		"outer lr 0":    {ps, optim.NewSGD(1), base, Config{Every: 1, Outer: Nesterov, Momentum: 0.9}},
		"momentum 1":    {ps, optim.NewSGD(1), base, Config{Every: 1, Outer: Nesterov, LR: 0.7, Momentum: 1}},
		"NaN lr":        {ps, optim.NewSGD(1), base, Config{Every: 1, Outer: Nesterov, LR: math.NaN()}},
		"unknown outer": {ps, optim.NewSGD(1), base, Config{Every: 1, Outer: 7}},
		"no params":     {nil, optim.NewSGD(1), base, DefaultConfig()},
		"no optimizer":  {ps, nil, base, DefaultConfig()},
		"no backend":    {ps, optim.NewSGD(1), nil, DefaultConfig()},
	} {
		if _, err := New(c.ps, c.inner, c.base, c.cfg); !errors.Is(err, trainer.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
}
