package dataloader

// StepOutcome is one step, or one empty global batch (no rank got a
// sample), as every rank of a round agreed on it: the trainer reduces each
// rank's numbers into it, so every rank holds the same values, and hands
// it to its loader (driver.LoaderStep is this type). A loader whose ranks
// decide separately (LeasedLoader) takes every decision that must agree
// between ranks (epoch advance, shares of the next global batch, whether
// to commit) from it alone.
type StepOutcome struct {
	// Step is the global step count after it (unchanged by an empty
	// global batch).
	Step int64
	// Samples is how many samples each rank trained in it, by rank.
	Samples []int
	// ComputeSeconds is each rank's step function time in it, in seconds,
	// by rank.
	ComputeSeconds []float64
	// EpochDone is each rank's Batch.EpochDone, by rank: that rank found no
	// sample of the epoch left to lease.
	EpochDone []bool
}
