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
// gradients and return 0.
//
// A rank whose share of a global batch is empty (no Indices; a leased
// loader waiting for a shard) normally skips the StepFunc. With partitions
// (WithPartition) the StepFunc runs there too, with the empty batch (its
// Data as the loader collated it, possibly the zero value of B): a
// partition's step needs every rank's part (the parameter server's shards
// wait for every rank's push, rows or none).
//
// A returned error aborts the step on every rank and ends Run on this one
// with ErrStepFailed, except an error of the round's communication (a
// partition's pull or push: a *sync.PeerError, sync.ErrPeerLost,
// ErrTimeout, ErrAborted, ErrClosed, ErrBadFrame, or the round's ctx
// done), which ends the round as a failure, as a failed collective does,
// and the job recovers.
type StepFunc[B any] func(ctx context.Context, b dataloader.Batch[B]) (loss float64, err error)
