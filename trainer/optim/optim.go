package optim

import (
	"errors"

	"github.com/elastictrain/elastictrain/worker"
)

// Param is one named, shaped parameter tensor of the user's model, shared
// with the user's framework without copying: Value and Grad alias the
// framework's own backing arrays. It is trainer.Param, the same type.
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

// Errors of the optimizers, wrapped with detail; test them with errors.Is.
// They are the trainer's errors of the same names (trainer.ErrCorruptState
// is ErrCorruptState), so their messages start with "trainer:".
var (
	// ErrCorruptState reports an encoded optimizer state (or a trainer
	// snapshot) that fails its checks: short, trailing bytes, lengths that
	// do not match the parameters.
	ErrCorruptState = errors.New("trainer: corrupt state")
	// ErrShapeMismatch reports parameters whose number or sizes differ from
	// the ones an optimizer's state was built for.
	ErrShapeMismatch = worker.ErrShapeMismatch
)

// Optimizer applies one update to the parameters from their averaged
// gradients. The trainer calls every method from the goroutine that runs the
// loop, never concurrently.
//
// An optimizer's whole state (moments, step count, learning rate) is part of
// every commit and checkpoint through AppendState and LoadState, so that a
// rollback or a restore continues bit for bit where the commit was taken.
type Optimizer interface {
	// Name identifies the algorithm in checkpoints ("sgd", "momentum", "adam").
	Name() string
	// Step updates every Param.Value from Param.Grad, which already holds the
	// mean gradient over the global batch. It returns an error wrapping
	// ErrShapeMismatch when the parameters do not match the ones the state
	// was built for.
	Step(params []Param) error
	// AppendState appends the encoded state to dst and returns the result.
	AppendState(dst []byte) []byte
	// LoadState replaces the state with one produced by AppendState for the
	// same parameters; it returns ErrCorruptState on malformed or mismatched
	// input and leaves the state unchanged then.
	LoadState(src []byte, params []Param) error
	// LearningRate returns the current learning rate.
	LearningRate() float64
	// SetLearningRate sets the learning rate used from the next Step on (an
	// OnRescale hook may scale it with the world size).
	SetLearningRate(lr float64)
}

// ScaledStepper is an Optimizer that can scale the gradients in its update
// pass (Adam). The trainer finds it by type assertion and, when the step's
// gradients need a factor (the mean of a global batch's sum: 1/N, or W/N
// for a LocalStepper's share), calls StepScaled instead of scaling every
// Param.Grad itself and calling Step.
type ScaledStepper interface {
	// StepScaled is Param.Grad[i] *= scale for every gradient value
	// (all of len(Grad), which stays scaled), followed by Step, with the
	// same bits, in one pass over the memory. Errors as Step's.
	StepScaled(params []Param, scale float32) error
}

// StateFreezer is an Optimizer whose state a commit can hold without
// encoding it (Adam): FreezeState returns the state of that moment, which
// the optimizer never writes again (its next Step writes its new state into
// other buffers). A commit thus costs no copy of the optimizer's state.
//
// The trainer calls FreezeState where it would otherwise call AppendState
// to take a commit, and the FrozenState's AppendState whenever it needs
// that commit's encoding (a broadcast to a joiner, a checkpoint), both from
// the loop goroutine; Steps and LoadStates run between them. So a frozen
// state must not change once returned, and the optimizer must not write
// the buffers it holds, until it is given back as reuse (or dropped).
type StateFreezer interface {
	// FreezeState returns the current state as a frozen one. reuse is a
	// frozen state that FreezeState returned earlier and that nothing
	// holds any more (the commit being retaken), or nil; when it is this
	// optimizer's, its buffers may be recycled. Step and LoadState after
	// it leave every frozen state unchanged.
	FreezeState(reuse FrozenState) FrozenState
}

// FrozenState is an optimizer's state held by a commit (StateFreezer): it
// never changes while the commit holds it.
type FrozenState interface {
	// AppendState appends the state's encoding, the bytes the optimizer's
	// AppendState gave at the moment it was frozen, to dst.
	AppendState(dst []byte) []byte
}
