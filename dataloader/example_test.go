package dataloader_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
)

// A job of 2 ranks trains 3 steps, checkpoints the committed cursor, and
// resumes on 3 ranks: the global batches are the same, only split
// differently, and nothing is skipped or repeated.
func Example() {
	ctx := context.Background()
	samples := make([]string, 10)
	for i := range samples {
		samples[i] = fmt.Sprintf("s%d", i)
	}
	ds := dataloader.FromSlice(samples)
	collate := func(_ context.Context, s []string, _ []int) ([]string, error) { return slices.Clone(s), nil }
	cfg := dataloader.DefaultConfig()
	cfg.GlobalBatch, cfg.Seed, cfg.DropLast = 4, 1, false

	// run trains steps global batches on world size w from cursor c and
	// returns the committed cursor.
	run := func(c dataloader.Cursor, w, steps int) dataloader.Cursor {
		ranks := make([]*dataloader.Loader[string, []string], w)
		for r := range ranks {
			l, err := dataloader.New(ds, collate, cfg)
			if err != nil {
				panic(err)
			}
			defer l.Close()
			if err := l.Reset(c, r, w); err != nil {
				panic(err)
			}
			ranks[r] = l
		}
		for range steps {
			var shares [][]string
			var b dataloader.Batch[[]string]
			for _, l := range ranks {
				var err error
				if b, err = l.Next(ctx); err != nil {
					panic(err)
				}
				shares = append(shares, b.Data)
			}
			fmt.Printf("epoch %d step %d (%d samples): %v\n", b.Epoch, b.Step, b.GlobalSize, shares)
			for _, l := range ranks { // the step was applied everywhere
				l.Commit(b)
			}
		}
		return ranks[0].Cursor()
	}

	start := dataloader.Cursor{Seed: 1, DatasetLen: 10, GlobalBatch: 4, Shuffle: true} // = Loader.NewCursor()
	c := run(start, 2, 3)
	saved, _ := c.MarshalBinary() // store with the checkpoint
	fmt.Printf("checkpoint at %v (%d bytes)\n", c, len(saved))

	var restored dataloader.Cursor
	if err := restored.UnmarshalBinary(saved); err != nil {
		panic(err)
	}
	run(restored, 3, 2)
	// Output:
	// epoch 0 step 0 (4 samples): [[s3 s6] [s4 s7]]
	// epoch 0 step 1 (4 samples): [[s9 s5] [s2 s1]]
	// epoch 0 step 2 (2 samples): [[s8] [s0]]
	// checkpoint at epoch 1 position 0 (step 0) (52 bytes)
	// epoch 1 step 0 (4 samples): [[s4 s3] [s0] [s8]]
	// epoch 1 step 1 (4 samples): [[s2 s5] [s1] [s7]]
}

// Each rank owns whole micro-batches of a global batch, whatever the world
// size.
func ExampleMicroShareOf() {
	const global, micro = 10, 3 // micro-batches: [0,3) [3,6) [6,9) [9,10)
	for _, w := range []int{1, 2, 3} {
		fmt.Printf("world size %d:", w)
		for r := range w {
			first, n := dataloader.MicroShareOf(global, micro, r, w)
			fmt.Printf(" rank %d micro-batches %d..%d;", r, first, first+n-1)
		}
		fmt.Println()
	}
	// Output:
	// world size 1: rank 0 micro-batches 0..3;
	// world size 2: rank 0 micro-batches 0..1; rank 1 micro-batches 2..3;
	// world size 3: rank 0 micro-batches 0..1; rank 1 micro-batches 2..2; rank 2 micro-batches 3..3;
}

// Workers lease shards of an epoch, train on their samples and ack them.
func ExampleMemoryQueue() {
	ctx := context.Background()
	q, err := dataloader.NewMemoryQueue(dataloader.ShardConfig{DatasetLen: 10, ShardSize: 4, LeaseTTL: time.Minute})
	if err != nil {
		panic(err)
	}
	order := dataloader.Order(7, 0, 10)
	for {
		s, err := dataloader.LeaseWait(ctx, q, 0, "worker-1", 0)
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Printf("shard %d: samples %v\n", s.Index, s.Indices(order))
		if err := q.Ack(ctx, s); err != nil {
			panic(err)
		}
	}
	// Output:
	// shard 0: samples [6 2 8 7]
	// shard 1: samples [5 4 9 0]
	// shard 2: samples [1 3]
	// dataloader: every shard of the epoch is acked: epoch 0
}

// A LeasedLoader driven by hand in the trainer's order, for one rank: each
// step serves up to the rank's share of the global batch from the shards
// it leases; a global batch that trains nothing asks for a commit, whose
// Committed acks the consumed shards, after which every rank reports the
// epoch done and the next global batch is of the next epoch.
func ExampleLeasedLoader() {
	ctx := context.Background()
	sc := dataloader.ShardConfig{DatasetLen: 10, ShardSize: 4, LeaseTTL: time.Minute}
	q, err := dataloader.NewMemoryQueue(sc)
	if err != nil {
		panic(err)
	}
	cfg := dataloader.DefaultLeasedConfig()
	cfg.Shards, cfg.GlobalBatch, cfg.Shuffle, cfg.Epochs, cfg.LeaseAhead = sc, 3, false, 1, 0
	ds := dataloader.FromFunc(10, func(_ context.Context, i int) (int, error) { return i, nil })
	sum := func(_ context.Context, s []int, _ []int) (int, error) {
		t := 0
		for _, x := range s {
			t += x
		}
		return t, nil
	}
	l, err := dataloader.NewLeased(q, ds, sum, cfg)
	if err != nil {
		panic(err)
	}
	l.SetLineage(1)
	if err := l.Restore(ctx, nil, 0, 1); err != nil { // a fresh start, rank 0 of 1
		panic(err)
	}
	for {
		b, err := l.Next(ctx)
		if err != nil {
			panic(err)
		}
		if b.Epoch >= cfg.Epochs {
			fmt.Println("done")
			return
		}
		fmt.Printf("epoch %d step %d: %v (sum %d) epoch done %v\n", b.Epoch, b.Step, b.Indices, b.Data, b.EpochDone)
		commit, err := l.Stepped(ctx, dataloader.StepOutcome{
			Samples: []int{len(b.Indices)}, ComputeSeconds: []float64{0.01}, EpochDone: []bool{b.EpochDone}})
		if err != nil {
			panic(err)
		}
		if commit {
			part, err := l.State(ctx)
			if err != nil {
				panic(err)
			}
			if _, err := l.MergeStates([][]byte{part}); err != nil { // the state the trainer commits
				panic(err)
			}
			if err := l.Committed(ctx); err != nil { // every rank holds the commit
				panic(err)
			}
			fmt.Println("commit")
		}
	}
	// Output:
	// epoch 0 step 0: [0 1 2] (sum 3) epoch done false
	// epoch 0 step 1: [3 4 5] (sum 12) epoch done false
	// epoch 0 step 2: [6 7 8] (sum 21) epoch done false
	// epoch 0 step 3: [9] (sum 9) epoch done false
	// epoch 0 step 4: [] (sum 0) epoch done false
	// commit
	// epoch 0 step 4: [] (sum 0) epoch done true
	// commit
	// done
}
