package trainer

import "fmt"

// MicroBatcher is the optional capability of a loader that cuts global
// batches into fixed micro-batches (*dataloader.Loader has it):
// MicroBatchSize is the micro-batch size in samples, 0 when the loader does
// not cut them. Config.Deterministic needs micro-batches; with this
// capability New refuses a loader without them at once. A loader without
// the capability is checked at its first batch instead.
type MicroBatcher interface {
	MicroBatchSize() int
}

// checkDeterministic refuses Config.Deterministic with a loader that says
// it has no micro-batches.
func checkDeterministic(cfg Config, loader any) error {
	if !cfg.Deterministic {
		return nil
	}
	if m, ok := loader.(MicroBatcher); ok && m.MicroBatchSize() <= 0 {
		return fmt.Errorf("%w: Deterministic needs the loader's micro-batches: set dataloader.Config.MicroBatch "+
			"(fixed micro-batches are what keeps the sums the same at every world size)", ErrInvalidConfig)
	}
	return nil
}
