package trainer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/optim"
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
	// ErrSettingsMismatch is returned by Run on a worker whose settings differ
	// from the job's, on a setting that must be the same on every worker of a
	// job. Who stops depends on who holds the job's trained state (state
	// installed in an earlier round of this Run, from a commit, a checkpoint
	// or the initial values: a member that has taken part in the job):
	//
	//   - When the members of a round that hold that state agree with one
	//     another, they are the job: every member that holds none and differs
	//     from them (a late joiner with another learning rate, a stale pod of
	//     a rolling update) is refused, the way a stranger with the wrong
	//     secret is, and Run returns this error there (SettingsError.Refused
	//     names it); the others end the round before any state moves, and
	//     train on without it.
	//   - When no member holds trained state (a new job, or a whole-job
	//     restart) or the holders disagree among themselves, nobody can tell
	//     which settings are the job's: every member stops in that round with
	//     this error.
	//   - The sync transport's wire layout (Config.Sync's ChunkBytes,
	//     DirectBytes, Streams and Hierarchy: "sync chunk bytes", "sync direct
	//     bytes", "sync streams", "sync hierarchy") cannot be compared over
	//     the round's collectives, since members whose layouts differ cannot
	//     connect: the transport's handshake compares it (sync.LayoutError).
	//     The members that share a layout and are more than half of the round
	//     (or exactly half and hold trained state) are the job: they evict the
	//     others and train on, and each of those stops with this error,
	//     Refused naming it. When no group is (a new job split evenly), every
	//     member stops with this error, Refused empty, once it has waited
	//     Sync.LayoutGrace and a lease (Config.Elastic.LeaseTTL) for an
	//     eviction that nobody sends.
	//
	// The round ends before any state moves, and a stopped worker is not
	// retried: restarted, it would differ again (launch.ExitStatus gives
	// launch.StatusPermanent; a refused one launch.StatusRefused). The error
	// is a *SettingsError naming the settings with the values as each member
	// configured them, and the members; when their models differ, it matches
	// ErrModelMismatch too. The settings compared are the model (parameter
	// names, shapes, optimizer), Config.Epochs, the
	// optimizer's learning rate when New was called (the configured base rate,
	// not the current one, which hooks and restored commits change), the
	// loader's global batch, dataset length and shuffle seed (a Loader's
	// NewCursor, or DataSettings), Config.CommitEvery,
	// Config.Deterministic and Config.BucketBytes (the gradient allreduce's
	// layout: a member with another one made every step's collective fail, and
	// the job's failure budget ran out).
	ErrSettingsMismatch = worker.ErrSettingsMismatch
	// ErrCorruptState reports an encoded snapshot or optimizer state that fails
	// its checks (bad magic, checksum, lengths).
	ErrCorruptState = optim.ErrCorruptState
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
