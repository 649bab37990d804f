package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

// Param is one named, shaped parameter tensor of the user's model, shared
// with the user's framework without copying: Value and Grad alias the
// framework's own backing arrays. It is optim.Param, the same type, so that
// an optimizer (package trainer/optim) steps it without importing the
// trainer.
//
// len(Value) and len(Grad) must both equal the product of Shape. The trainer
// reads Grad after each StepFunc call and writes Value when it applies an
// optimizer step or restores a commit, always from the goroutine that runs
// the loop. Fields: Name (unique per model; in checkpoints and error
// messages), Shape (outermost dimension first), Value (float32,
// row-major) and Grad (the gradient of the summed loss with respect to
// Value).
type Param = optim.Param

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

// MicroStepFunc is the one-call form of a StepFunc for deterministic mode
// (Config.Deterministic; given with WithMicroStep): it runs forward and
// backward on all of this rank's micro-batches (b.Micro, K >= 1 of them)
// at once, keeping each one's sums apart, so a rank pays a call's fixed
// costs once per step instead of once per micro-batch.
//
// Afterwards grads[k][i] (k < K-1; len(grads) = K-1, grads[k][i] as long
// as Param i's Grad) must hold the SUM over micro-batch k's samples of
// parameter i's gradient, the Params' Grad buffers the last micro-batch's,
// and losses[k] (len K) micro-batch k's loss sum. Each must be the same
// bits the StepFunc gives for b.MicroBatch(k) alone, whatever else is in
// the call: that is what keeps a step's result independent of which rank
// computed which micro-batch (gorgoniastep.Model.StepMicro is such a
// function; the trainer cannot check it). The buffers are the trainer's,
// valid during the call only. It is called from the loop goroutine, only
// in deterministic mode and only with micro-batches; errors as for
// StepFunc.
type MicroStepFunc[B any] func(ctx context.Context, b dataloader.Batch[B], grads [][][]float32, losses []float64) error
