package dataloader

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
)

func TestCostSharesTable(t *testing.T) {
	ones := func(n int) []float64 {
		c := make([]float64, n)
		for i := range c {
			c[i] = 1
		}
		return c
	}
	cases := []struct {
		name    string
		costs   []float64
		weights []float64
		want    []int
	}{
		{"equal costs, equal weights", ones(8), []float64{1, 1}, []int{4, 4}},
		{"equal costs, twice as fast", ones(9), []float64{2, 1}, []int{6, 3}},
		{"long samples first", []float64{4, 4, 1, 1, 1, 1, 1, 1, 1, 1}, []float64{1, 1}, []int{2, 8}},
		{"tie goes to the lower cut", []float64{1, 2, 1}, []float64{1, 1}, []int{1, 2}},
		{"floor keeps a rank busy", []float64{100, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, []float64{1, 1}, []int{1, 15}},
		{"zero costs: counts", []float64{0, 0, 0, 0}, []float64{3, 1}, WeightedShares(4, []float64{3, 1})},
		{"bad costs count as 0", []float64{math.NaN(), -1, 1, 1}, []float64{1, 1}, []int{3, 1}},
		{"fewer units than ranks", ones(2), []float64{1, 1, 1}, []int{1, 0, 1}},
		{"no units", nil, []float64{1, 1}, []int{0, 0}},
		{"bad weights as the smallest", ones(6), []float64{math.Inf(1), 2, 0}, []int{2, 2, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mustEqual(t, c.want, CostShares(c.costs, c.weights))
		})
	}
	mustTrue(t, CostShares([]float64{1}, nil) == nil, "no weights: nil")
}

// TestCostSharesProperties: the shares always add up, respect the floor,
// and put each rank's cost within one unit's cost of its target.
func TestCostSharesProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n := 1 + r.IntN(6)
		units := r.IntN(80)
		costs := make([]float64, units)
		big := 0.0
		for i := range costs {
			costs[i] = float64(1 + r.IntN(20))
			big = max(big, costs[i])
		}
		w := make([]float64, n)
		for i := range w {
			w[i] = 0.2 + r.Float64()*3
		}
		got := CostShares(costs, w)
		sum := 0
		floor := max(1, units/(8*n))
		if floor*n > units {
			floor = units / n
		}
		for _, s := range got {
			sum += s
			mustTrue(t, s >= floor, "trial %d: share %d below floor %d: %v", trial, s, floor, got)
		}
		mustEqual(t, units, sum, "trial %d", trial)
		if units < 8*n { // the floor may bind; check the targets only when it cannot
			continue
		}
		total, wsum := 0.0, 0.0
		for _, c := range costs {
			total += c
		}
		for _, x := range w {
			wsum += x
		}
		cut, acc, tw := 0, 0.0, 0.0
		for k := range n - 1 {
			cut += got[k]
			tw += w[k]
			for _, c := range costs[cut-got[k] : cut] {
				acc += c
			}
			target := total * tw / wsum
			if math.Abs(acc-target) > big && got[k] > floor && got[k+1] > floor {
				t.Fatalf("trial %d: cut %d at cost %v, target %v (shares %v)", trial, k, acc, target, got)
			}
		}
	}
}

// TestSetWeightsKeepsEveryGlobalBatch: with weights that change between
// steps (prefetched batches dropped), every global batch is the same
// samples in the same order as one rank alone serves, split by
// WeightedShares of the weights; a micro-batched loader moves whole
// micro-batches, each at its fixed place in the global batch.
func TestSetWeightsKeepsEveryGlobalBatch(t *testing.T) {
	for _, micro := range []int{0, 4} {
		cfg := DefaultConfig()
		cfg.GlobalBatch, cfg.Seed, cfg.DropLast, cfg.MicroBatch = 24, 7, false, micro
		ds := idDataset(250)
		ref, err := New(ds, collateIDs, cfg)
		mustNoError(t, err)
		defer ref.Close()
		const W = 3
		ls := make([]*Loader[int, []int], W)
		for r := range ls {
			ls[r], err = New(ds, collateIDs, cfg)
			mustNoError(t, err)
			defer ls[r].Close()
			mustNoError(t, ls[r].Reset(ls[r].NewCursor(), r, W))
		}
		rng := rand.New(rand.NewPCG(3, 4))
		var weights []float64
		for step := range 30 {
			want, err := ref.Next(context.Background())
			mustNoError(t, err)
			var all []int
			units := want.GlobalSize
			if micro > 0 {
				units = MicroBatches(want.GlobalSize, micro)
			}
			shares := WeightedShares(units, weights)
			if weights == nil {
				shares = nil
			}
			for r, l := range ls {
				b, err := l.Next(context.Background())
				mustNoError(t, err, "step %d rank %d", step, r)
				mustEqual(t, want.Epoch, b.Epoch)
				mustEqual(t, want.Step, b.Step)
				mustEqual(t, want.GlobalSize, b.GlobalSize)
				mustEqual(t, len(all), b.Offset, "step %d rank %d offset", step, r)
				mustEqual(t, float64(len(b.Indices)), b.Cost, "cost without Config.Cost is the count")
				if shares != nil {
					n := len(b.Indices)
					if micro > 0 {
						n = len(b.Micro)
					}
					mustEqual(t, shares[r], n, "step %d rank %d share (weights %v)", step, r, weights)
				}
				for _, m := range b.Micro {
					mustEqual(t, b.Offset+m.Lo, m.Index*micro, "micro-batch at its fixed place")
					ids := make([]int, 0, m.Hi-m.Lo)
					for _, x := range b.Indices[m.Lo:m.Hi] {
						ids = append(ids, idOf(x))
					}
					mustEqual(t, ids, append([]int{}, m.Data...))
				}
				all = append(all, b.Indices...)
				l.Commit(b)
			}
			mustEqual(t, want.Indices, all, "step %d: the same global batch", step)
			switch step % 4 {
			case 3:
				weights = nil
			default:
				weights = []float64{0.2 + rng.Float64()*3, 0.2 + rng.Float64()*3, 0.2 + rng.Float64()*3}
			}
			for _, l := range ls {
				mustNoError(t, l.SetWeights(weights))
			}
		}
	}
}

// TestCostSplitsEqualCost: with Config.Cost, equal weights give each rank
// about the same cost of samples, where equal counts would not.
func TestCostSplitsEqualCost(t *testing.T) {
	cost := func(i int) float64 { return float64(1 + i%7*i%7) } // 1..37, uneven
	cfg := DefaultConfig()
	cfg.GlobalBatch, cfg.Cost = 128, cost
	ds := idDataset(1024)
	const W = 4
	ls := make([]*Loader[int, []int], W)
	for r := range ls {
		var err error
		ls[r], err = New(ds, collateIDs, cfg)
		mustNoError(t, err)
		defer ls[r].Close()
		mustNoError(t, ls[r].Reset(ls[r].NewCursor(), r, W))
	}
	for step := range 8 {
		var costs []float64
		big := 0.0
		for r, l := range ls {
			b, err := l.Next(context.Background())
			mustNoError(t, err)
			c := 0.0
			for _, x := range b.Indices {
				c += cost(x)
				big = max(big, cost(x))
			}
			mustEqual(t, c, b.Cost, "step %d rank %d: Batch.Cost", step, r)
			costs = append(costs, c)
			l.Commit(b)
		}
		lo, hi := slices.Min(costs), slices.Max(costs)
		mustTrue(t, hi-lo <= 2*big, "step %d: costs %v differ by more than two samples' cost", step, costs)
	}
}

func TestSetWeightsErrors(t *testing.T) {
	l, err := New(idDataset(100), collateIDs, DefaultConfig())
	mustNoError(t, err)
	mustNoError(t, l.Reset(l.NewCursor(), 0, 2))
	mustTrue(t, errors.Is(l.SetWeights([]float64{1}), ErrInvalidWorld))
	mustNoError(t, l.SetWeights([]float64{1, 2}))
	mustNoError(t, l.Close())
	mustTrue(t, errors.Is(l.SetWeights([]float64{2, 1}), ErrClosed))
}

// TestSetWeightsKeepsPrefetchWhenCutsStay: weights that cut every global
// batch as before (two micro-batches over two ranks: one each, whatever
// the weights) leave the prefetched batches alone, and the batches are
// still those of equal shares.
func TestSetWeightsKeepsPrefetchWhenCutsStay(t *testing.T) {
	cfg := DefaultConfig()
	cfg.GlobalBatch, cfg.MicroBatch, cfg.Prefetch = 8, 4, 2
	var built atomic.Int64
	collate := func(ctx context.Context, s []int, idx []int) ([]int, error) {
		built.Add(1)
		return collateIDs(ctx, s, idx)
	}
	l, err := New(idDataset(80), collate, cfg)
	mustNoError(t, err)
	defer l.Close()
	mustNoError(t, l.Reset(l.NewCursor(), 1, 2))
	want, err := New(idDataset(80), collateIDs, cfg)
	mustNoError(t, err)
	defer want.Close()
	mustNoError(t, want.Reset(want.NewCursor(), 1, 2))
	for step := range 6 {
		b, err := l.Next(context.Background())
		mustNoError(t, err)
		w, err := want.Next(context.Background())
		mustNoError(t, err)
		mustEqual(t, w.Indices, b.Indices, "step %d", step)
		mustNoError(t, l.SetWeights([]float64{3, float64(step + 1)}))
	}
	// One micro-batch each per step: 6 built and delivered, at most
	// Prefetch more ahead, none built twice.
	mustTrue(t, built.Load() <= 6+2, "%d micro-batches built for 6 steps: prefetched batches were dropped", built.Load())
}
