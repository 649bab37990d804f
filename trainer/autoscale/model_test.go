package autoscale

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// The noise-scale estimator recovers B_noise = tr(Σ)/|G|² from the
// squared norms of per-rank and global mean gradients drawn from a known
// distribution (McCandlish et al. appendix A).
func TestNoiseScaleFromGradientNorms(t *testing.T) {
	const dim, B, W = 200, 64, 4
	rng := rand.New(rand.NewPCG(1, 2))
	G := make([]float64, dim)
	for i := range G {
		G[i] = 0.05
	}
	const sigma = 1.0 // per-sample noise per coordinate: tr(Σ) = dim·sigma²
	want := dim * sigma * sigma / (dim * 0.05 * 0.05)
	var e noise
	b := make([]float64, W)
	small := make([]float64, W)
	for range 4000 {
		big := make([]float64, dim)
		for r := range W {
			g := make([]float64, dim)
			for range B / W {
				for i := range g {
					x := G[i] + sigma*rng.NormFloat64()
					g[i] += x
					big[i] += x
				}
			}
			b[r], small[r] = B/W, sqNorm(g)/float64((B/W)*(B/W))
		}
		e.observe(b, small, sqNorm(big)/(B*B), B)
	}
	got := e.scale()
	if math.Abs(got-want)/want > 0.25 {
		t.Fatalf("noise scale %v, want about %v", got, want)
	}
	if eff := e.efficiency(B); math.Abs(eff-want/(want+B)) > 0.05 {
		t.Fatalf("efficiency %v, want about %v", eff, want/(want+B))
	}
	// One rank: no second batch size, nothing estimated.
	var one noise
	one.observe([]float64{B}, []float64{1}, 1, B)
	if one.scale() != 0 || one.efficiency(B) != 1 {
		t.Fatalf("one rank: scale %v, efficiency %v; want 0 and 1", one.scale(), one.efficiency(B))
	}
}

func sqNorm(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return s
}

// The step-time model recovers compute and sync parameters from exact
// measurements at three sizes and predicts a fourth.
func TestModelFit(t *testing.T) {
	const B = 120.0
	alpha, beta, gamma, delta, other := 0.001, 0.0001, 0.002, 0.0005, 0.0003
	sizes := make([]sizeRecord, 4)
	for w := 1; w <= 3; w++ {
		c := alpha + beta*B/float64(w)
		s := 0.0
		if w >= 2 {
			s = gamma + delta*float64(w-2)
		}
		sizes[w] = sizeRecord{steps: 10, stepTime: other + c + s, compute: c, sync: s, batch: B}
	}
	m := fit(sizes)
	want := other + alpha + beta*B/4 + gamma + 2*delta
	if got := m.stepTime(4, B); math.Abs(got-want) > 1e-9 {
		t.Fatalf("predicted step time at 4: %v, want %v (model %+v)", got, want, m)
	}
	// One size measured: compute proportional to the share, sync unknown (0).
	one := fit(sizes[:2])
	if got, want := one.stepTime(2, B), other+(alpha+beta*B)/2; math.Abs(got-want) > 1e-9 {
		t.Fatalf("one size: predicted %v at 2, want %v", got, want)
	}
}

// Corrupt policy state is an error, never a panic, and leaves the state
// as it was.
func TestUnmarshalCorrupt(t *testing.T) {
	p := New(Config{Enabled: true})
	for s := range int64(200) {
		p.Observe(Observation{Step: s + 1, Round: 1, WorldSize: 2, GlobalBatch: 64, Interval: []float64{0.01, 0.01},
			Compute: []float64{0.008, 0.007}, Samples: []float64{32, 32}, Sync: []float64{0.001, 0.001}})
	}
	good, _ := p.MarshalBinary()
	q := New(Config{Enabled: true})
	before, _ := q.MarshalBinary()
	for n := range len(good) {
		if err := q.UnmarshalBinary(good[:n]); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("%d of %d bytes: %v, want ErrCorruptState", n, len(good), err)
		}
	}
	if err := q.UnmarshalBinary(append(good, 0)); !errors.Is(err, ErrCorruptState) {
		t.Fatalf("a trailing byte: %v", err)
	}
	after, _ := q.MarshalBinary()
	if string(before) != string(after) {
		t.Fatal("a failed UnmarshalBinary changed the state")
	}
	huge := append([]byte(stateMagic), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)
	if err := q.UnmarshalBinary(huge); !errors.Is(err, ErrCorruptState) {
		t.Fatalf("a huge count: %v", err)
	}
	if err := q.UnmarshalBinary(good); err != nil {
		t.Fatal(err)
	}
}

// Bad observations are skipped, never a panic.
func TestObserveBadInput(t *testing.T) {
	p := New(Config{Enabled: true})
	for _, o := range []Observation{
		{}, {WorldSize: -1}, {WorldSize: 3, Compute: []float64{1}}, {WorldSize: 1 << 20},
		{Step: 25, WorldSize: 1, Interval: []float64{math.NaN()}, Compute: []float64{math.Inf(1)}, GlobalBatch: math.NaN()},
	} {
		if d := p.Observe(o); d != nil {
			t.Fatalf("%+v: decision %+v", o, d)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero value: %v", err)
	}
	if err := (Config{Enabled: true}).Validate(); err != nil {
		t.Fatalf("enabled with defaults: %v", err)
	}
	for _, c := range []Config{
		{Enabled: true, DecisionInterval: -1}, {Enabled: true, Hysteresis: 1}, {Enabled: true, ProbeTolerance: math.NaN()},
		{Enabled: true, ChangeCost: math.Inf(1)}, {Enabled: true, ChangeCost: -1},
	} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
}

// Any input to UnmarshalBinary is an error or a state that marshals back
// to the same bytes; never a panic.
func FuzzUnmarshalBinary(f *testing.F) {
	p := New(Config{Enabled: true})
	for s := range int64(120) {
		p.Observe(Observation{Step: s + 1, Round: 1, WorldSize: 2, GlobalBatch: 64, Interval: []float64{0.01, 0.01},
			Compute: []float64{0.008, 0.007}, Samples: []float64{32, 32}, Sync: []float64{0.001, 0.001}})
	}
	good, _ := p.MarshalBinary()
	f.Add(good)
	f.Add([]byte(stateMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		q := New(Config{Enabled: true})
		if err := q.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrCorruptState) {
				t.Fatalf("error %v does not wrap ErrCorruptState", err)
			}
			return
		}
		again, _ := q.MarshalBinary()
		if string(again) != string(b) {
			t.Fatal("a decoded state does not encode to its input")
		}
		q.Observe(Observation{Step: 125, Round: 2, WorldSize: 3, GlobalBatch: 64, Interval: []float64{0.01, 0.01, 0.01},
			Compute: []float64{0.008, 0.007, 0.007}, Samples: []float64{22, 21, 21}})
	})
}
