package dataloader

import "fmt"

// Config holds a Loader's settings. Start from DefaultConfig and change what
// you need; New calls Validate.
type Config struct {
	// GlobalBatch is the number of samples in one global batch (one step of
	// the whole world, summed over ranks). Must be > 0. Default 64.
	GlobalBatch int
	// Seed keys the per-epoch shuffle (see Order). Default 0.
	Seed uint64
	// Shuffle selects the order of each epoch: Order(Seed, epoch, n) when
	// true, the identity 0..n-1 when false. Default true.
	Shuffle bool
	// DropLast drops the last, partial global batch of each epoch (the
	// final n%GlobalBatch positions of the order are not served that epoch)
	// when true; when false that batch is served smaller and
	// Batch.GlobalSize says how big. Default true.
	DropLast bool
	// Prefetch is the number of batches prepared ahead of Next by worker
	// goroutines, in batches. 0 builds each batch synchronously inside Next
	// (no goroutines). With prefetch, a Next that finds its batch unclaimed
	// builds it itself, so a step faster than the loading shares the work
	// with the workers instead of waiting on them. Prefetch pays when Get
	// or collate read files, decode or augment; for an in-memory dataset
	// whose Get indexes a slice, 0 is cheapest (building a batch there is
	// a memory copy, and two cores copying at once contend for memory
	// bandwidth: see BenchmarkLoaderOverhead). Must be >= 0. Default 2.
	Prefetch int
	// Workers is the number of goroutines that build prefetched batches
	// (call Dataset.Get and collate) in parallel, one batch each; at most
	// Prefetch of them are started (more could never all be busy), and none
	// when Prefetch is 0. Must be >= 1. Default 1.
	Workers int
	// MicroBatch, when > 0, cuts every global batch into micro-batches of
	// MicroBatch samples (the last one of a global batch may be smaller;
	// see MicroBatches) and gives each rank whole micro-batches (see
	// MicroShareOf). collate is then called once per micro-batch and the
	// results are in Batch.Micro, so every micro-batch has the same samples
	// and shape whatever the world size (deterministic training). 0 turns
	// micro-batching off: a rank's share is ShareOf the global batch and is
	// collated once into Batch.Data. Must be >= 0. Default 0.
	MicroBatch int
	// Cost, when set, gives each sample's cost from its dataset index (a
	// sequence's length, say; non-negative and finite, else counted as 0):
	// every global batch is then split so that ranks get equal cost, or
	// cost in proportion to Loader.SetWeights, rather than equal counts
	// (CostShares over the samples, or over the micro-batches with
	// MicroBatch, each costing the sum of its samples). Shares stay
	// contiguous runs of the same global batch. It is called from the
	// goroutines that plan batches (Next's and the prefetch workers'),
	// so it must be safe for concurrent use and a pure function of the
	// index: every rank must compute the same cuts. Default nil (every
	// sample costs 1).
	Cost func(index int) float64
}

// DefaultConfig returns GlobalBatch 64, Seed 0, Shuffle true, DropLast true,
// Prefetch 2, Workers 1, MicroBatch 0.
func DefaultConfig() Config {
	return Config{GlobalBatch: 64, Shuffle: true, DropLast: true, Prefetch: 2, Workers: 1}
}

// Validate returns an error wrapping ErrInvalidConfig naming the first bad
// field, or nil.
func (c Config) Validate() error {
	switch {
	case c.GlobalBatch <= 0:
		return fmt.Errorf("%w: GlobalBatch %d, want > 0", ErrInvalidConfig, c.GlobalBatch)
	case c.Prefetch < 0:
		return fmt.Errorf("%w: Prefetch %d, want >= 0", ErrInvalidConfig, c.Prefetch)
	case c.Workers < 1:
		return fmt.Errorf("%w: Workers %d, want >= 1", ErrInvalidConfig, c.Workers)
	case c.MicroBatch < 0:
		return fmt.Errorf("%w: MicroBatch %d, want >= 0", ErrInvalidConfig, c.MicroBatch)
	}
	return nil
}
