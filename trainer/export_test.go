package trainer

import (
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
)

// SetAfterReduceHook lets tests make a rank fail a step after its gradient
// allreduce succeeded (so other ranks may have applied it).
func SetAfterReduceHook[B any](t *Trainer[B], f func(rank int, step int64) error) { t.afterReduce = f }

// SetComputeTimeHook makes t take a step's compute time from f (given the
// batch and the measured time) instead of the clock.
func SetComputeTimeHook[B any](t *Trainer[B], f func(b dataloader.Batch[B], measured time.Duration) time.Duration) {
	t.computeTime = f
}

// WithOptimizerState returns a checkpoint's bytes (an encoded snapshot of a
// model with params) with the optimizer state replaced by opt, checksum
// recomputed: state that only the optimizer can find wrong.
func WithOptimizerState(data []byte, params []Param, opt []byte) ([]byte, error) {
	sn, err := decodeSnapshot(data, params)
	if err != nil {
		return nil, err
	}
	sn.opt, sn.optFrozen = opt, nil
	return sn.encode(nil, params), nil
}
