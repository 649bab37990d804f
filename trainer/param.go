package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/dataloader"
)

// Param is one named, shaped parameter tensor of the user's model, shared
// with the user's framework without copying: Value and Grad alias the
// framework's own backing arrays.
//
// len(Value) and len(Grad) must both equal the product of Shape. The trainer
// reads Grad after each StepFunc call and writes Value when it applies an
// optimizer step or restores a commit, always from the goroutine that runs
// the loop.
type Param struct {
	// Name identifies the tensor in checkpoints and error messages; unique per model.
	Name string
	// Shape is the tensor's shape, outermost dimension first.
	Shape []int
	// Value holds the parameter values (float32, row-major).
	Value []float32
	// Grad receives the gradient of the summed loss with respect to Value.
	Grad []float32
}

// StepFunc runs forward and backward on this rank's share of one global
// batch (or one micro-batch of it).
//
// It must fill every Param.Grad with the SUM over the batch's samples of the
// per-sample gradient and return the SUM of the per-sample losses; the
// trainer divides by the global batch size after the allreduce, so uneven
// shares still give the true mean. With zero samples it must zero the
// gradients and return 0. A returned error aborts the step on every rank.
type StepFunc[B any] func(ctx context.Context, b dataloader.Batch[B]) (loss float64, err error)
