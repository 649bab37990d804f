package dataloader_test

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
)

func TestWeightedShares(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		global  int
		weights []float64
		want    []int
	}{
		{60, []float64{1, 1, 1}, []int{20, 20, 20}},
		{10, []float64{1, 1, 1}, []int{4, 3, 3}},
		// floor 100/16 = 6 each, the other 88 split 1:3.
		{100, []float64{1, 3}, []int{28, 72}},
		// A rank 1000 times slower keeps its floor of 60/(8*3) = 2.
		{60, []float64{1000, 1, 1000}, []int{29, 2, 29}},
		// Bad weights count as the smallest good one.
		{80, []float64{nan, 2, 4, -1}, []int{17, 16, 31, 16}},
		{60, []float64{0, inf, 0}, []int{20, 20, 20}},
		{12, []float64{math.MaxFloat64, math.MaxFloat64, 1}, []int{6, 5, 1}},
		// Fewer samples than ranks: whole samples to the first ranks.
		{2, []float64{1, 1, 1}, []int{1, 1, 0}},
		{0, []float64{1, 2}, []int{0, 0}},
		{5, nil, nil},
		{-1, []float64{1}, nil},
	} {
		got := dataloader.WeightedShares(c.global, c.weights)
		if !slices.Equal(got, c.want) {
			t.Errorf("WeightedShares(%d, %v) = %v, want %v", c.global, c.weights, got, c.want)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + rng.IntN(16)
		g := rng.IntN(5000)
		w := make([]float64, n)
		for i := range w {
			w[i] = rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(12)-6))
		}
		got := dataloader.WeightedShares(g, w)
		sum := 0
		for _, x := range got {
			if x < 0 || (g >= n && x < 1) {
				t.Fatalf("WeightedShares(%d, %v) = %v: a share below 1", g, w, got)
			}
			sum += x
		}
		if sum != g || !slices.Equal(got, dataloader.WeightedShares(g, slices.Clone(w))) {
			t.Fatalf("WeightedShares(%d, %v) = %v: sums to %d or is not a function of its arguments", g, w, got, sum)
		}
	}
}

func TestSpeeds(t *testing.T) {
	s := dataloader.NewSpeeds(3)
	if got := s.Values(); !slices.Equal(got, []float64{1, 1, 1}) {
		t.Fatalf("NewSpeeds: %v", got)
	}
	s.Observe([]int{100, 0, 100}, []float64{1, 1, math.NaN()}) // rank 1 trained nothing, rank 2's time is bad
	if got := s.Values(); got[0] != 0.7+0.3*100 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("after one step: %v", got)
	}
	s.Observe([]int{1}, []float64{1e9}) // short slices and slow steps: the floor of 1
	if got := s.Values(); got[0] < 1 || got[1] != 1 {
		t.Fatalf("after a short outcome: %v", got)
	}
	if got := s.Shares(60); len(got) != 3 {
		t.Fatalf("Shares: %v", got)
	}
}

func leasedConfig(sc dataloader.ShardConfig) dataloader.LeasedConfig {
	cfg := dataloader.DefaultLeasedConfig()
	cfg.Shards, cfg.GlobalBatch, cfg.Seed = sc, 10, 3
	cfg.BusyWait, cfg.Poll = 20*time.Millisecond, 5*time.Millisecond
	return cfg
}

func TestLeasedConfig(t *testing.T) {
	sc := dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute}
	q, err := dataloader.NewMemoryQueue(sc)
	if err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(c *dataloader.LeasedConfig){
		"GlobalBatch":   func(c *dataloader.LeasedConfig) { c.GlobalBatch = 0 },
		"Epochs":        func(c *dataloader.LeasedConfig) { c.Epochs = -1 },
		"LeaseAhead":    func(c *dataloader.LeasedConfig) { c.LeaseAhead = -1 },
		"BusyWait":      func(c *dataloader.LeasedConfig) { c.BusyWait = 0 },
		"Poll":          func(c *dataloader.LeasedConfig) { c.Poll = -time.Second },
		"RenewEvery":    func(c *dataloader.LeasedConfig) { c.RenewEvery = time.Minute },
		"Shards":        func(c *dataloader.LeasedConfig) { c.Shards.ShardSize = 0 },
		"DatasetLen":    func(c *dataloader.LeasedConfig) { c.Shards.DatasetLen = 99 },
		"QueueLayout":   func(c *dataloader.LeasedConfig) { c.Shards.ShardSize = 20 },
		"NegativeRenew": func(c *dataloader.LeasedConfig) { c.RenewEvery = -1 },
	} {
		cfg := leasedConfig(sc)
		change(&cfg)
		if _, err := dataloader.NewLeased(q, samples(100), collateSamples, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := dataloader.NewLeased[int, []int](nil, samples(100), collateSamples, leasedConfig(sc)); !errors.Is(err, dataloader.ErrInvalidConfig) {
		t.Errorf("nil queue: %v", err)
	}
	l, err := dataloader.NewLeased(q, samples(100), collateSamples, leasedConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	if c := l.Config(); c.RenewEvery != 15*time.Second || c.WorkerID == "" {
		t.Errorf("defaults not filled in: RenewEvery %v, WorkerID %q", c.RenewEvery, c.WorkerID)
	}
}

// oneRank returns a loader of rank 0 of 1 over 100 samples in shards of
// 10, restored fresh.
func oneRank(t *testing.T, q dataloader.LeaseQueue) *dataloader.LeasedLoader[int, []int] {
	t.Helper()
	sc := dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute}
	l, err := dataloader.NewLeased(q, samples(100), collateSamples, leasedConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	l.SetLineage(42)
	if err := l.Restore(context.Background(), nil, 0, 1); err != nil {
		t.Fatal(err)
	}
	return l
}

func memQueue(t testing.TB) *dataloader.MemoryQueue {
	q, err := dataloader.NewMemoryQueue(dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func outcome(samples ...int) dataloader.StepOutcome {
	return dataloader.StepOutcome{Samples: samples, ComputeSeconds: make([]float64, len(samples)), EpochDone: make([]bool, len(samples))}
}

func TestLeasedContractOrder(t *testing.T) {
	ctx := context.Background()
	q := memQueue(t)
	sc := dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute}
	fresh, err := dataloader.NewLeased(q, samples(100), collateSamples, leasedConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Next(ctx); !errors.Is(err, dataloader.ErrOutOfOrder) {
		t.Fatalf("Next before Restore: %v", err)
	}
	for _, w := range [][2]int{{1, 1}, {-1, 2}, {0, 0}, {0, 11}} {
		if err := fresh.Restore(ctx, nil, w[0], w[1]); !errors.Is(err, dataloader.ErrInvalidWorld) {
			t.Fatalf("Restore rank %d of %d: %v", w[0], w[1], err)
		}
	}

	l := oneRank(t, q)
	b, err := l.Next(ctx)
	if err != nil || len(b.Indices) != 10 || b.Epoch != 0 || b.Step != 0 {
		t.Fatalf("Next: %+v, %v", b, err)
	}
	if _, err := l.State(ctx); !errors.Is(err, dataloader.ErrOutOfOrder) {
		t.Fatalf("State before Stepped: %v", err)
	}
	if _, err := l.Next(ctx); !errors.Is(err, dataloader.ErrOutOfOrder) {
		t.Fatalf("after an error, Next before Restore: %v", err)
	}

	l = oneRank(t, q)
	if _, err := l.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Next(ctx); !errors.Is(err, dataloader.ErrOutOfOrder) {
		t.Fatalf("Next twice: %v", err)
	}
	for name, o := range map[string]dataloader.StepOutcome{
		"two ranks":     outcome(10, 10),
		"other samples": outcome(9),
		"epoch done":    {Samples: []int{10}, ComputeSeconds: []float64{0}, EpochDone: []bool{true}},
	} {
		l = oneRank(t, q)
		if _, err := l.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Stepped(ctx, o); !errors.Is(err, dataloader.ErrInvalidStep) {
			t.Fatalf("Stepped with %s: %v", name, err)
		}
	}
	l = oneRank(t, q)
	if _, err := l.Stepped(ctx, outcome(10)); !errors.Is(err, dataloader.ErrOutOfOrder) {
		t.Fatalf("Stepped without a batch: %v", err)
	}
}

// TestLeasedRestoreIsIdempotent: restoring the same commit twice serves
// the same batches as restoring it once.
func TestLeasedRestoreIsIdempotent(t *testing.T) {
	ctx := context.Background()
	l := oneRank(t, memQueue(t))
	for range 3 {
		if _, err := l.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Stepped(ctx, outcome(10)); err != nil {
			t.Fatal(err)
		}
	}
	part, err := l.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	state, err := l.MergeStates([][]byte{part})
	if err != nil {
		t.Fatal(err)
	}
	var first [][]int
	for i := range 3 {
		if err := l.Restore(ctx, state, 0, 1); err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		var got [][]int
		for range 4 {
			b, err := l.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b.Indices)
			if _, err := l.Stepped(ctx, outcome(len(b.Indices))); err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			first = got
		} else if !slices.EqualFunc(first, got, slices.Equal) {
			t.Fatalf("restore %d serves %v, the first served %v", i, got, first)
		}
	}
}

// TestLeasedBusyWaitIsBounded: with every shard leased to another worker
// for a minute, Next after a global batch that trained nothing returns an
// empty batch (not EpochDone) instead of waiting for the lease to expire,
// so the trainer can still take a membership change at the step boundary.
func TestLeasedBusyWaitIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q := memQueue(t)
	l := oneRank(t, q)
	for {
		_, err := q.Lease(ctx, l.QueueEpoch(0), "other")
		if errors.Is(err, dataloader.ErrNoShardFree) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		b, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Indices) != 0 || b.EpochDone {
			t.Fatalf("batch %d: %d samples, epoch done %v; want an empty batch", i, len(b.Indices), b.EpochDone)
		}
		commit, err := l.Stepped(ctx, outcome(0))
		if err != nil || !commit {
			t.Fatalf("Stepped of an empty global batch: commit %v, %v; want a commit", commit, err)
		}
	}
}

// reseal recomputes the checksum of an edited state.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// twoRankParts runs two ranks over 100 samples for a few steps and
// returns their parts of the commit.
func twoRankParts(t testing.TB) (*dataloader.LeasedLoader[int, []int], [][]byte) {
	ctx := context.Background()
	q := memQueue(t)
	sc := dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute}
	var ls []*dataloader.LeasedLoader[int, []int]
	for r := range 2 {
		cfg := leasedConfig(sc)
		cfg.GlobalBatch = 6
		l, err := dataloader.NewLeased(q, samples(100), collateSamples, cfg)
		if err != nil {
			t.Fatal(err)
		}
		l.SetLineage(7)
		if err := l.Restore(ctx, nil, r, 2); err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	for range 5 {
		o := outcome(0, 0)
		for r, l := range ls {
			b, err := l.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			o.Samples[r] = len(b.Indices)
		}
		for _, l := range ls {
			if _, err := l.Stepped(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	var parts [][]byte
	for _, l := range ls {
		p, err := l.State(ctx)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, p)
	}
	return ls[0], parts
}

func TestLeasedStateIsStrict(t *testing.T) {
	ctx := context.Background()
	l, parts := twoRankParts(t)
	merged, err := l.MergeStates(parts)
	if err != nil {
		t.Fatal(err)
	}
	// Every byte matters: a flip anywhere fails the checksum or a check.
	for i := range merged {
		b := slices.Clone(merged)
		b[i] ^= 0x10
		if _, err := l.MergeStates([][]byte{b}); err == nil {
			t.Fatalf("byte %d flipped: merged", i)
		}
		if err := l.Restore(ctx, b, 0, 1); !errors.Is(err, dataloader.ErrCorruptState) {
			t.Fatalf("byte %d flipped: restore %v", i, err)
		}
	}
	for n := 1; n < len(merged); n++ { // (0 bytes is a fresh start)
		if err := l.Restore(ctx, merged[:n], 0, 1); !errors.Is(err, dataloader.ErrCorruptState) {
			t.Fatalf("cut to %d bytes: restore %v", n, err)
		}
	}
	if err := l.Restore(ctx, parts[0], 0, 1); !errors.Is(err, dataloader.ErrCorruptState) {
		t.Fatalf("a part restored: %v", err)
	}
	if _, err := l.MergeStates([][]byte{merged}); !errors.Is(err, dataloader.ErrCorruptState) {
		t.Fatalf("a merged state merged: %v", err)
	}
	for name, ps := range map[string][][]byte{
		"reversed":      {parts[1], parts[0]},
		"one missing":   {parts[0]},
		"twice rank 0":  {parts[0], parts[0]},
		"none":          nil,
		"empty part":    {parts[0], {}},
		"garbage":       {parts[0], []byte("ETLS garbage of some length, long enough to be looked at.............")},
		"extra":         {parts[0], parts[1], parts[1]},
		"trailing byte": {parts[0], reseal(append(slices.Clone(parts[1]), 0, 0, 0, 0))},
	} {
		if _, err := l.MergeStates(ps); !errors.Is(err, dataloader.ErrCorruptState) {
			t.Errorf("merge of %s: %v, want ErrCorruptState", name, err)
		}
	}
	// Semantic garbage under a good checksum: a lease in progress on a
	// consumed shard (the bitmap follows the 56-byte header).
	b := slices.Clone(merged)
	b[56] = 0xff
	b[57] = 0x03
	if err := l.Restore(ctx, reseal(b), 0, 1); !errors.Is(err, dataloader.ErrCorruptState) {
		t.Fatalf("every shard consumed with leases in progress: %v", err)
	}
	// Another seed: a mismatch, not corruption.
	sc := dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute}
	cfg := leasedConfig(sc)
	cfg.Seed = 4
	other, err := dataloader.NewLeased(memQueue(t), samples(100), collateSamples, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Restore(ctx, merged, 0, 1); !errors.Is(err, dataloader.ErrCursorMismatch) {
		t.Fatalf("state of another seed: %v, want ErrCursorMismatch", err)
	}
	if err := l.Restore(ctx, merged, 1, 3); err != nil {
		t.Fatalf("the good state at another world size: %v", err)
	}
}

// FuzzLeasedState feeds arbitrary bytes to MergeStates and Restore: each
// returns an error or a result, never a panic, and a state that merges
// restores and serves.
func FuzzLeasedState(f *testing.F) {
	l, parts := twoRankParts(f)
	merged, err := l.MergeStates(parts)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(parts[0], parts[1], merged)
	f.Add(parts[0], []byte{}, []byte("ETLS"))
	f.Add([]byte(nil), parts[1], merged[:60])
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l := oneRank(t, memQueue(t))
		serve := func(state []byte, size int) {
			l := oneRank(t, memQueue(t)) // a queue of its own: no acks of another history
			if err := l.Restore(ctx, state, 0, size); err != nil {
				if !errors.Is(err, dataloader.ErrCorruptState) && !errors.Is(err, dataloader.ErrCursorMismatch) {
					t.Fatalf("restore of a state that merged: %v", err)
				}
				return
			}
			bt, err := l.Next(ctx)
			if err != nil {
				t.Fatalf("Next after restoring a merged state: %v", err)
			}
			o := dataloader.StepOutcome{Samples: make([]int, size), ComputeSeconds: make([]float64, size), EpochDone: make([]bool, size)}
			o.Samples[0], o.EpochDone[0] = len(bt.Indices), bt.EpochDone
			if _, err := l.Stepped(ctx, o); err != nil {
				t.Fatalf("Stepped after restoring a merged state: %v", err)
			}
			if _, err := l.State(ctx); err != nil {
				t.Fatalf("State after restoring a merged state: %v", err)
			}
		}
		for _, ps := range [][][]byte{{a}, {a, b}, {b, a}} {
			m, err := l.MergeStates(ps)
			if err == nil {
				serve(m, 1)
			}
		}
		if err := l.Restore(ctx, c, 0, 2); err == nil {
			if _, err := l.Next(ctx); err != nil {
				t.Fatalf("Next after a restore that succeeded: %v", err)
			}
		}
	})
}
