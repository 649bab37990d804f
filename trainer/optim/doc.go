// Package optim holds the optimizers the trainer applies after every
// gradient allreduce (SGD, Momentum, Adam) and the Optimizer interface a
// user implements for an algorithm of their own. It has the standard
// library beneath it (and package worker, for the shared errors); package
// trainer imports it, never the reverse.
//
// # Use
//
// Give an optimizer to trainer.New with the model's parameters:
//
//	tr, err := trainer.New(params, optim.NewAdam(1e-3), loader, step, store, cfg)
//
// trainer.Param is Param, the same type. The trainer calls every method of
// an Optimizer from the goroutine that runs its loop, never concurrently;
// nothing here is safe for concurrent use otherwise.
//
// # State
//
// An optimizer's whole state (moments, step count, learning rate) is part
// of every commit and checkpoint through AppendState and LoadState, so a
// rollback or a restore continues bit for bit where the commit was taken.
// The encodings are little-endian: float64 hyper-parameters, then each
// state tensor as a count and float32 values, the same as the trainer's
// snapshots (a checkpoint written before this package existed loads).
//
// # Optional capabilities
//
// Beside Optimizer, the trainer looks for two capabilities by type
// assertion (optim.go holds their contracts); Adam has both, SGD and
// Momentum neither:
//
//   - ScaledStepper: StepScaled multiplies the gradients by a factor (the
//     trainer's 1/global batch) in the update's own pass, with the same
//     bits as scaling first and then calling Step.
//   - StateFreezer: FreezeState hands a commit the current state without
//     copying or encoding it (the largest part of a commit otherwise); the
//     optimizer writes its next state elsewhere.
//
// An optimizer that wraps another (trainer/localsgd) hides them, and the
// trainer then scales the gradients itself and encodes the state at every
// commit: the same bits, more passes over the memory.
package optim
