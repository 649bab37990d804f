package trainer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/worker"
)

// Sentinel errors returned by the trainer, wrapped with detail; test them with
// errors.Is.
var (
	// ErrInvalidConfig reports a Config or option that fails validation.
	ErrInvalidConfig = worker.ErrInvalidConfig
	// ErrShapeMismatch reports parameters whose names or shapes differ from
	// the ones a commit, checkpoint or peer holds.
	ErrShapeMismatch = worker.ErrShapeMismatch
	// ErrModelMismatch reports that ranks of one round hold different models
	// (names, shapes or optimizer); every rank of the round returns it, or
	// only a newcomer whose model differs from that of the members holding
	// the job's trained state, which refuse it and train on (see
	// ErrSettingsMismatch).
	ErrModelMismatch = worker.ErrModelMismatch
	// ErrCorruptState reports an encoded snapshot or optimizer state that fails
	// its checks (bad magic, checksum, lengths).
	ErrCorruptState = errors.New("trainer: corrupt state")
	// ErrCorruptCheckpoint reports a durable checkpoint that is truncated or
	// fails its checksum; LocalDir skips such files for the previous good one.
	ErrCorruptCheckpoint = driver.ErrCorruptCheckpoint
	// ErrCheckpoint wraps a failed durable checkpoint that Run had to write
	// (the final one of the job, or a preempted worker's): Run returns it,
	// joined with the outcome, so lost durability is never silent.
	// Periodic checkpoints that fail are logged and reported to
	// Hooks.OnCheckpoint, and training goes on.
	ErrCheckpoint = worker.ErrCheckpoint
	// ErrNoCheckpoint is returned by CheckpointStore.Latest when none exists.
	ErrNoCheckpoint = driver.ErrNoCheckpoint
	// ErrPreempted is returned by Run on a worker that left gracefully after
	// Preempt (SIGTERM): its state was committed and checkpointed first.
	ErrPreempted = worker.ErrPreempted
	// ErrFailureBudget is returned when more recoveries than
	// Config.MaxRecoveries happened within Config.RecoveryWindow, or when
	// more than MaxRecoveries rounds in a row failed on this worker before
	// training a step (a peer that never authenticates, an address nobody
	// can reach).
	ErrFailureBudget = errors.New("trainer: failure budget exhausted")
	// ErrStranger is returned, as a *BudgetError (so errors.Is(err,
	// ErrFailureBudget) holds too), by a worker that the job shut out: in
	// its last round no member proved the job secret to it, a peer it
	// dialed failed to prove this worker's secret, and the members that
	// authenticate one another then evicted it. Its secret is not the
	// job's (a stale Secret); fix it and restart the worker.
	ErrStranger = errors.New("trainer: shut out of the job (wrong job secret)")
	// ErrStepFailed wraps an error returned by the user's StepFunc.
	ErrStepFailed = errors.New("trainer: step function failed")
	// ErrDiverged is returned by every rank of a deterministic-mode round
	// when a step's gradients are not finite (the training diverged; a
	// smaller learning rate may help): exact fixed-point sums cannot hold
	// them, and retrying the step would give the same result. In the
	// default mode, every rank returns it when the loss summed over the
	// global batch is NaN or infinite (checked before the optimizer step,
	// so the parameters stay those of the step before).
	ErrDiverged = errors.New("trainer: training diverged")
	// ErrReleased is returned by Run on a worker that a scaling decision
	// (Config.Autoscale) removed: it told the Platform (Release),
	// committed with the others and left gracefully, as a preempted worker
	// does; nothing is lost or trained twice, and no recovery is counted.
	// It does not match ErrPreempted: a launcher must not restart it.
	ErrReleased = worker.ErrReleased
	// ErrEvicted is returned on a worker that the job evicted as a straggler.
	ErrEvicted = errors.New("trainer: evicted as straggler")
	// ErrPartitionLost is wrapped by a Partition's error when no round can
	// restore its state (parts that are on no live rank and in no durable
	// storage); Run returns it instead of forming round after round.
	ErrPartitionLost = errors.New("trainer: partitioned state lost")
	// ErrFinishedCheckpoint is returned by Run, on every rank of the round,
	// when the newest readable checkpoint in the CheckpointStore already
	// completes Config.Epochs: the store holds a job that finished (restored
	// under a new job ID, it would train nothing and report success). Run
	// refuses to start before it changes anything in the store. Raise
	// Config.Epochs to train more epochs from it, or point the worker at an
	// empty directory for a new job. A restart fails the same way
	// (launch.ExitStatus gives launch.StatusPermanent).
	ErrFinishedCheckpoint = worker.ErrFinishedCheckpoint
	// ErrForeignCheckpoint is returned by Run, on every rank of the round,
	// when the newest readable checkpoint in the CheckpointStore was written
	// by another model (other parameter names, shapes or optimizer): the
	// directory belongs to another job. Run refuses to start before it changes
	// anything in the store (it would train from scratch and rotate the other
	// model's checkpoints out). It wraps ErrShapeMismatch with the tensor that
	// differs, or ErrSettingsMismatch when the newest checkpoint's position is
	// past this job's Config.Epochs (a job with more epochs wrote it). Point
	// the worker at an empty directory, or at the right model.
	ErrForeignCheckpoint = worker.ErrForeignCheckpoint
)

// BudgetError is returned (wrapping ErrFailureBudget) when the failure budget
// is exhausted; it names the most recent failures.
type BudgetError struct {
	// Recoveries is how many recoveries happened within the window.
	Recoveries int
	// Unformed, when > 0, is how many rounds in a row failed on this worker
	// before it trained a step; that is the budget that ran out.
	Unformed int
	// Last holds the most recent failure causes, newest last.
	Last []string
	// Stranger is true when this worker was shut out of the job
	// (ErrStranger): the members that authenticate one another evicted it.
	Stranger bool
}

func (e *BudgetError) Error() string {
	if e.Stranger {
		return fmt.Sprintf("trainer: failure budget exhausted: shut out of the job (wrong job secret): no member proved the job secret to this worker and the members that authenticate one another evicted it; last failures: %s",
			strings.Join(e.Last, "; "))
	}
	if e.Unformed > 0 {
		return fmt.Sprintf("trainer: failure budget exhausted: %d rounds in a row failed before training a step; last failures: %s",
			e.Unformed, strings.Join(e.Last, "; "))
	}
	return fmt.Sprintf("trainer: failure budget exhausted: %d recoveries within the window; last failures: %s",
		e.Recoveries, strings.Join(e.Last, "; "))
}

// Unwrap lets errors.Is(err, ErrFailureBudget) match.
func (e *BudgetError) Unwrap() error { return ErrFailureBudget }

// Is lets errors.Is(err, ErrStranger) match when e.Stranger.
func (e *BudgetError) Is(target error) bool { return e.Stranger && target == ErrStranger }
