package dataloader

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The Balancer's tests (moved from trainer, whose balancer it was).

// linearRanks is a world whose rank r computes n units in
// overhead + n/speed[r] seconds (times noise).
type linearRanks struct {
	speed    []float64
	overhead float64
	noise    float64
	rng      *rand.Rand
}

// step returns each rank's work and compute seconds for a global batch of
// global units split by frac.
func (l *linearRanks) step(global int, frac []float64) (work, compute []float64) {
	for r, f := range frac {
		n := math.Round(f * float64(global))
		t := l.overhead + n/l.speed[r]
		if l.noise > 0 {
			t *= 1 + l.noise*(2*l.rng.Float64()-1)
		}
		work, compute = append(work, n), append(compute, t)
	}
	return work, compute
}

// run runs a Balancer from equal shares over steps steps of global units
// and returns the split it ends with and how often it changed.
func (l *linearRanks) run(steps, global int) (frac []float64, updates int) {
	var b Balancer
	b.Reset(len(l.speed))
	frac = equalFrac(len(l.speed))
	for range steps {
		work, compute := l.step(global, frac)
		if w := b.Observe(work, compute); w != nil {
			frac = w
			updates++
		}
	}
	return frac, updates
}

func equalFrac(W int) []float64 {
	f := make([]float64, W)
	for i := range f {
		f[i] = 1 / float64(W)
	}
	return f
}

// The balancer moves the split to the speeds within a few steps, by
// bounded steps, and then holds it.
func TestBalancerConverges(t *testing.T) {
	for _, tc := range []struct {
		name  string
		speed []float64
	}{
		{"one at half speed", []float64{1000, 500}},
		{"three ranks", []float64{1000, 1000, 250}},
		{"one fast", []float64{300, 300, 300, 1200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			W := len(tc.speed)
			l := &linearRanks{speed: tc.speed}
			var b Balancer
			b.Reset(W)
			frac := equalFrac(W)
			updates, last := 0, 0
			for step := 1; step <= 100; step++ {
				work, compute := l.step(1000, frac)
				w := b.Observe(work, compute)
				if w == nil {
					continue
				}
				for r := range w {
					if d := math.Abs(w[r] - frac[r]); d > balanceMaxStep+1e-9 {
						t.Fatalf("step %d: rank %d moved by %.3f, above the bound %.2f", step, r, d, balanceMaxStep)
					}
				}
				frac, last = w, step
				updates++
			}
			sum := 0.0
			for _, s := range tc.speed {
				sum += s
			}
			// Settled: the slowest rank's time is within balanceMinGain of
			// the ideal (every rank busy for the same time).
			slowest := 0.0
			for r, s := range tc.speed {
				slowest = max(slowest, frac[r]/s*sum)
			}
			if slowest > 1+balanceMinGain {
				t.Errorf("fractions %.3f: the slowest rank takes %.3f of the ideal time", frac, slowest)
			}
			if last > 40 || updates > 5 {
				t.Errorf("%d updates, the last at step %d: want settled within 40 steps (a move every trial)", updates, last)
			}
		})
	}
}

// With equal ranks and noisy times, the split barely moves: no update
// unless it would shorten the slowest rank's time by balanceMinGain.
func TestBalancerIgnoresNoise(t *testing.T) {
	l := &linearRanks{speed: []float64{1000, 1000, 1000}, overhead: 0.001, noise: 0.1, rng: rand.New(rand.NewPCG(1, 1))}
	frac, updates := l.run(500, 96)
	if updates > 3 {
		t.Errorf("%d updates over 500 steps of equal ranks with 10%% noise", updates)
	}
	for r, f := range frac {
		if math.Abs(f-1.0/3) > 0.05 {
			t.Errorf("rank %d: fraction %.3f drifted from 1/3", r, f)
		}
	}
}

// Every rank runs the balancer on the same agreed values: the same
// splits, bit for bit; and a rank without a measurement holds the split.
func TestBalancerAgreesAndWaitsForEveryRank(t *testing.T) {
	l := &linearRanks{speed: []float64{800, 400, 1200}, overhead: 0.0005, noise: 0.2, rng: rand.New(rand.NewPCG(2, 2))}
	var a, b Balancer
	a.Reset(3)
	b.Reset(3)
	frac := equalFrac(3)
	for step := range 200 {
		work, compute := l.step(64, frac)
		if step < 3 { // step 0 is the warm-up; then rank 1 had no sample
			work[1] = 0
			if a.Observe(work, compute) != nil {
				t.Fatal("split changed before every rank was measured")
			}
			b.Observe(work, compute)
			continue
		}
		wa, wb := a.Observe(work, compute), b.Observe(work, compute)
		if len(wa) != len(wb) {
			t.Fatalf("step %d: %v vs %v", step, wa, wb)
		}
		for r := range wa {
			if math.Float64bits(wa[r]) != math.Float64bits(wb[r]) {
				t.Fatalf("step %d: %v vs %v", step, wa, wb)
			}
		}
		if wa != nil {
			frac = wa
		}
	}
	a.Reset(2)
	if got := a.Speeds(); len(got) != 2 || got[0] != 0 || got[1] != 0 {
		t.Errorf("reset: speeds %v", got)
	}
}

// With a fixed cost per step that no share changes (the step function's
// set-up, a loaded host's wake-ups), moving samples buys little: equal
// ranks stay near equal shares instead of drifting to the floor, and a
// rank twice as slow in both parts still gets its share cut to where the
// predicted times meet.
func TestBalancerWithFixedOverhead(t *testing.T) {
	t.Run("equal ranks do not drift", func(t *testing.T) {
		l := &linearRanks{speed: []float64{20000, 20000}, overhead: 0.002, noise: 0.3, rng: rand.New(rand.NewPCG(3, 3))}
		frac, updates := l.run(1000, 64)
		if math.Abs(frac[0]-0.5) > 0.1 || updates > 10 {
			t.Errorf("%d updates, fractions %.3f: equal ranks whose time is mostly fixed drifted", updates, frac)
		}
	})
	t.Run("a rank twice as slow", func(t *testing.T) {
		// Rank 1 takes 2*(overhead + n/speed): equal times at
		// 0.0005 + n0/20000 = 0.001 + 2*(64-n0)/20000, n0 = 52.
		const overhead = 0.0005
		var b Balancer
		b.Reset(2)
		frac := equalFrac(2)
		for range 200 {
			var work, compute []float64
			for r, f := range frac {
				n := math.Round(f * 64)
				c := overhead + n/20000
				if r == 1 {
					c *= 2
				}
				work, compute = append(work, n), append(compute, c)
			}
			if w := b.Observe(work, compute); w != nil {
				frac = w
			}
		}
		t0 := overhead + math.Round(frac[0]*64)/20000
		t1 := 2 * (overhead + math.Round(frac[1]*64)/20000)
		ideal := overhead + 52.0/20000
		if max(t0, t1) > ideal*(1+balanceMinGain)+1e-4 {
			t.Errorf("fractions %.3f: times %.2f ms and %.2f ms, ideal %.2f ms", frac, t0*1e3, t1*1e3, ideal*1e3)
		}
	})
}
