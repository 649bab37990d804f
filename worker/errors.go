package worker

import "errors"

// The trainer's errors that decide a worker's exit status. Package trainer
// exports each under the same name, with the conditions under which Run
// returns it; they live here so that a platform (package launch) can tell
// them apart without importing the trainer.
var (
	// ErrInvalidConfig reports a trainer Config or option that fails
	// validation (trainer.ErrInvalidConfig). A restart cannot fix it.
	ErrInvalidConfig = errors.New("trainer: invalid config")
	// ErrShapeMismatch reports parameters whose names or shapes differ from
	// the ones a commit, checkpoint or peer holds (trainer.ErrShapeMismatch).
	// A restart cannot fix it.
	ErrShapeMismatch = errors.New("trainer: parameter shape mismatch")
	// ErrModelMismatch reports that ranks of one round hold different
	// models: names, shapes or optimizer (trainer.ErrModelMismatch). A
	// restart cannot fix it.
	ErrModelMismatch = errors.New("trainer: ranks hold different models")
	// ErrSettingsMismatch reports workers that disagree on a setting every
	// worker of a job must share (trainer.ErrSettingsMismatch). A restart
	// cannot fix it.
	ErrSettingsMismatch = errors.New("trainer: workers disagree on the job's settings")
	// ErrForeignCheckpoint reports a checkpoint store that holds another
	// model's checkpoints (trainer.ErrForeignCheckpoint). A restart cannot
	// fix it.
	ErrForeignCheckpoint = errors.New("trainer: the checkpoint store holds another model's checkpoints")
	// ErrFinishedCheckpoint reports a checkpoint store that holds a job
	// that finished (trainer.ErrFinishedCheckpoint). A restart cannot fix
	// it.
	ErrFinishedCheckpoint = errors.New("trainer: the checkpoint store holds a finished job")
	// ErrCheckpoint wraps a durable checkpoint that the worker had to write
	// and could not (trainer.ErrCheckpoint): the worker did not leave
	// cleanly.
	ErrCheckpoint = errors.New("trainer: checkpoint failed")
	// ErrPreempted reports a worker that left gracefully after a preemption
	// (SIGTERM) with its state committed and checkpointed
	// (trainer.ErrPreempted).
	ErrPreempted = errors.New("trainer: preempted")
	// ErrReleased reports a worker that a scaling decision removed and that
	// left gracefully (trainer.ErrReleased); its platform must not replace
	// it. It does not match ErrPreempted.
	ErrReleased = errors.New("trainer: released by a scaling decision")
	// ErrRefused is matched (errors.Is) by an error that says the job's
	// running members refused this worker for settings or a model that
	// differ from theirs, and train on without it: a *trainer.SettingsError
	// whose Refused is not empty. It is never returned bare.
	ErrRefused = errors.New("trainer: refused by the job's members")
)
