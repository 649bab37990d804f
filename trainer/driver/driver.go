package driver

import (
	"context"
	"errors"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
)

// Source is what New needs of a data loader: this rank's share of the next
// global batch, from the loop goroutine only. It must also implement
// Loader[B] or StatefulLoader[B].
type Source[B any] interface {
	Next(ctx context.Context) (dataloader.Batch[B], error)
}

// EndpointSync is the name under which a worker advertises its Backend's
// address in the rendezvous (elastic.Member.Endpoints). Partitions
// advertise theirs under their own Name.
const EndpointSync = "sync"

// Backend gives every round of a job its collective communicator: the
// sync.Synchronizer that carries the trainer's control values, state
// agreement and state broadcast, and the gradient allreduce.
//
// The default Backend is the ring of package sync over authenticated TCP
// (NewRingBackend, built from Config.ListenAddr and Config.Sync); WithBackend
// plugs in another one (a hierarchical allreduce, a user's own, or the
// in-memory ranks of package trainertest for tests without TCP).
//
// Contract (all calls from Run's goroutine, in this order):
//
//  1. Listen, once, before the first rendezvous. It opens whatever peers
//     will dial and returns the address to advertise (host:port, or any
//     string the Backend's own Connect understands). An error ends Run.
//  2. Connect, at the start of every round, with the round's World: job
//     ID, round number, this worker's rank and every rank's advertised
//     address, in rank order. It returns once every rank of the round is
//     connected, or with an error: a *sync.PeerError naming the rank that
//     could not be reached or authenticated lets the trainer report it to
//     the rendezvous; any error ends the round as a failure (a new round
//     follows), never the job. ctx is cancelled when the rendezvous moves
//     on (a member was lost while connecting); Connect must then return.
//  3. The returned Synchronizer is used by the loop goroutine for that
//     round only and closed by the trainer when the round ends. Its
//     contract is sync.Synchronizer's: every rank calls the same
//     collectives in the same order, an error breaks it for good, Close
//     (from any goroutine) aborts an operation in flight on every rank.
//     A collective that cannot complete must fail within the Backend's
//     own timeout, never hang.
//  4. Close, once, when Run returns.
//
// Optional capabilities of the round's Synchronizer, found by type
// assertion: sync.AllGatherer (needed by loaders and partitions whose
// state differs per rank; the trainer falls back to broadcasts without
// it) and GradientReducer.
type Backend interface {
	Listen(ctx context.Context) (addr string, err error)
	Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error)
	Close() error
}

// GradientReducer is an optional capability of a round's Synchronizer: a
// Synchronizer that reduces gradients its own way (compression, a
// hierarchy, a parameter server for dense tensors) implements it, and the
// trainer calls it instead of allreducing its fused buckets with
// AllReduceFloat32.
//
// SumGradients replaces every tensor of grads (the model's Param.Grad
// buffers, in model order, the same lengths on every rank) with its
// element-wise sum over the ranks of the round, identical on every rank.
// It is not used in deterministic mode, whose exact fixed-point sums need
// AllReduceFloat64.
type GradientReducer interface {
	SumGradients(ctx context.Context, grads [][]float32) error
}

// LocalStepper is an optional capability of a round's Synchronizer: a
// low-communication strategy (LocalSGD, DiLoCo; package trainer/localsgd)
// whose ranks step on their own gradients and reconcile their parameters
// only at some steps, its outer steps. With it the trainer:
//
//   - reduces no gradient: each rank's optimizer steps on the gradient sum
//     of its own share of the global batch times W/N (W ranks, N samples
//     in the global batch), which is its share's mean when the shares are
//     even, and makes the mean of the ranks' updates the synchronous
//     update for plain SGD with one local step between outer steps. The
//     shares are not balanced (Config.Balance does not apply): what a
//     rank trains on depends only on the global batch and the world size;
//   - calls OuterStep after the optimizer's update of every applied step,
//     with the step count after it and final false, and once more with
//     final true at the end of the job when the last step was not
//     committed; synced reports that every rank's parameters are the same
//     now (an outer step took place, or none was pending), and must be the
//     same answer on every rank (a function of the step count and the
//     strategy's committed state); with final true it must be true;
//   - commits and checkpoints only at synced step boundaries: a round that
//     ends anywhere else (a failure, a join, a preemption) rolls back to
//     the last commit, so every commit (parameters, optimizer, loader
//     cursor) is one of an outer step and exactly-once holds across it.
//
// OuterStep is called from the loop goroutine, like every collective, and
// must make the same calls on the Synchronizer on every rank. An error
// ends the round as a failure, like a failed collective. Set
// Config.CheckpointEvery to a multiple of the strategy's period: a
// checkpoint due at an unsynced boundary is skipped.
type LocalStepper interface {
	OuterStep(ctx context.Context, step int64, final bool) (synced bool, err error)
}

// CheckpointStore keeps durable checkpoints: opaque byte blobs named by the
// global step they were taken after. The trainer writes at most one
// checkpoint at a time, from a goroutine it owns, and reads them only when a
// round starts with no live state (a whole-job restart). Implementations
// must be safe for use by several processes of one job sharing the store
// (each writes whole files under unique names) and must never expose a
// partially written checkpoint as complete.
//
// checkpoint.LocalDir is the local-directory implementation; the module
// github.com/elastictrain/elastictrain/objstore/s3 (a module of its own, so
// its S3 client is compiled only by those who use it) keeps checkpoints in
// S3-compatible object storage.
type CheckpointStore interface {
	// Save stores data durably as the checkpoint of step; when it returns
	// nil, a crash at any later instant leaves the checkpoint readable.
	Save(ctx context.Context, step int64, data []byte) error
	// List returns the steps of the stored checkpoints, newest first.
	List(ctx context.Context) ([]int64, error)
	// Load returns the checkpoint of step after verifying its checksum;
	// ErrCorruptCheckpoint when it is truncated or damaged, ErrNoCheckpoint
	// when there is none. An implementation may set a damaged checkpoint
	// aside so that List no longer returns it.
	Load(ctx context.Context, step int64) ([]byte, error)
}

// StatefulLoader is a data loader whose state the trainer commits as
// opaque bytes. The trainer calls it from its loop goroutine only, in this
// order in every round:
//
//  1. Restore, on every rank, after the round agreed on the state it
//     continues from (and after every Partition's Restore). state is the
//     loader state of that commit, as committed (see State and
//     StateMerger), or nil when the job starts fresh. The loader reshards
//     for rank of size, forgets whatever it read or leased after that
//     commit, and serves from it. Work that must be done before any rank
//     reads (revoking leases taken after the commit, acking shards the
//     commit consumed) is done here, by whichever rank the loader
//     chooses; the trainer holds a barrier between every rank's Restore
//     and the round's first Next. Restore must be idempotent: a round may
//     fail and the next restore the same state again.
//  2. Next, once per step. A Batch with Epoch >= Config.Epochs ends the
//     job; every rank must reach it at the same step, which a loader
//     whose ranks decide separately achieves through Stepped (every rank
//     sees the same LoaderStep). A global batch in which no rank got a
//     sample (a leased loader waiting for a shard) is not a step: the
//     optimizer does not run and the step count does not move, but
//     Stepped is still called.
//  3. Stepped, on every rank, after every step that every rank applied
//     (and after every empty global batch), with the outcome every rank
//     agreed on. It returns true to ask for a commit at this step
//     boundary, besides the Config.CommitEvery schedule. Every rank must
//     return the same (decide from s and from state the ranks share):
//     a commit is collective, and ranks that disagree fail the round.
//  4. State, on every rank, when a commit is due at this step boundary:
//     this rank's part of the loader state after the last batch Stepped
//     reported. It may do I/O (leasing ahead the shards that the steps up
//     to the next commit need, so that they are part of the commit).
//  5. Committed (CommitListener), once every rank holds that commit.
//
// An error from any call ends the round as a failure (a new round
// follows and restores the newest commit every rank holds); a loader
// that can never go on returns an error wrapping one of package
// dataloader's sentinels, which ends Run.
type StatefulLoader[B any] interface {
	Source[B]
	Restore(ctx context.Context, state []byte, rank, size int) error
	Stepped(ctx context.Context, s LoaderStep) (commit bool, err error)
	State(ctx context.Context) ([]byte, error)
}

// StateMerger is the optional capability of a StatefulLoader whose state
// differs between ranks (each rank's leases). The trainer gathers every
// rank's State in rank order and commits MergeStates(parts), which every
// rank computes from the same parts, so it must be a pure function.
// Without it the state is taken to be the same on every rank, and rank
// 0's is committed.
type StateMerger interface {
	MergeStates(parts [][]byte) ([]byte, error)
}

// CommitListener is the optional capability of a StatefulLoader with work
// that must never be rolled back (acking leased shards: an acked shard is
// never served again). Committed is called on every rank once every rank
// of the round holds the commit of the state it last returned from State
// (the trainer passes a barrier first), and never for a commit some rank
// may lack. When the round fails before, the next round restores whichever
// commit it agrees on, and Restore redoes what Committed did not.
type CommitListener interface {
	Committed(ctx context.Context) error
}

// LoaderStep is one step, or one empty global batch, as every rank of the
// round agreed on it: Step, and per rank (indexed by rank, valid only
// during the call) Samples, ComputeSeconds and EpochDone. It is
// dataloader.StepOutcome, so that a loader in package dataloader (which
// must not import trainer) implements Stepped; see there for the fields.
type LoaderStep = dataloader.StepOutcome

// LineageSetter is the optional capability of a StatefulLoader whose state
// outside the job (a shard queue's acks) must be kept apart per history.
// Before every Restore, on every rank, the trainer calls SetLineage with
// the lineage ID of the state that Restore installs (AuditEntry.Gen): the
// same for every commit of one history, and a new one, the same on every
// rank, when the job starts fresh or restores a durable checkpoint (the
// commits made after that checkpoint are abandoned, and so must be what
// they did outside the job: a leased loader then continues in a new
// generation of the queue instead of finding the abandoned acks).
type LineageSetter interface {
	SetLineage(lineage uint64)
}

// DataSettings is an optional capability of a StatefulLoader: the global
// batch and dataset length it was built with, in samples, which the
// trainer compares between the members of every round. A Loader's come
// from its NewCursor; a StatefulLoader without it is not compared on them.
type DataSettings interface {
	DataSettings() (globalBatch, datasetLen int)
}

// Partition is state split over the ranks of a round. The trainer calls it
// from its loop goroutine only, in this order:
//
//  1. Listen, once, before the first rendezvous: it opens whatever peers
//     dial for this partition and returns the address advertised under
//     Name in the rendezvous ("" when it needs none). An error ends Run.
//  2. Restore, at the start of every round, on every rank, once the round
//     agreed on the step it continues from (after the replicated state is
//     installed, before the loader's Restore and the first step). The
//     partition brings its state to its value at PartitionRound.Step,
//     re-partitioned over the round's ranks, moving parts from the ranks
//     that hold them and from durable storage otherwise. Every rank gets
//     the same PartitionRound but its own Rank.
//  3. Commit, on every rank, with the same step, at every commit: after
//     the step's updates were applied everywhere, before the trainer
//     takes its own snapshot of the replicated state. The partition keeps
//     what it needs to restore that step in a later round (at least the
//     last two commits, since ranks may be one commit apart when a round
//     fails).
//  4. Checkpoint, on every rank, at every durable checkpoint, with a step
//     it committed: make this rank's part of that step durable and return
//     a manifest of it (which files, sizes, checksums; the partition's
//     own format). Rank 0 publishes the checkpoint, with every rank's
//     manifest, only after every rank's Checkpoint returned, in one
//     atomic write; so a crash at any point of the save leaves the
//     previous checkpoint whole. The partition must keep what the newest
//     published checkpoint names until a later one is published (the
//     trainer calls Checkpoint again).
//  5. EndRound, on every rank, when the round ends by a decision every
//     rank took (a join, a graceful leave, the end of the job), before
//     the round's Synchronizer is closed: the partition finishes the
//     requests of its peers, so that no rank leaves while another still
//     needs its part. Not called when the round failed.
//  6. Close, once, when Run returns.
//
// Errors from Restore, Commit, Checkpoint and EndRound end the round as a
// failure (a *sync.PeerError naming the rank lets the trainer report it);
// an error wrapping ErrPartitionLost ends Run, because no round can
// restore the state.
type Partition interface {
	Name() string
	Listen(ctx context.Context) (addr string, err error)
	Restore(ctx context.Context, r PartitionRound) error
	Commit(ctx context.Context, step int64) error
	Checkpoint(ctx context.Context, step int64) (manifest []byte, err error)
	EndRound(ctx context.Context) error
	Close() error
}

// InlineCheckpointer is an optional capability of a Partition whose
// Checkpoint returns a manifest that holds this rank's part of the state
// itself (encoded from the commit in its memory), not the names of files
// it keeps. Called from the loop goroutine; the answer must not change
// during Run and must be the same on every rank. When every partition
// says true, the trainer writes the periodic checkpoints
// (Config.CheckpointEvery) in the background: training waits for every
// rank's Checkpoint and for the manifests to reach rank 0, not for the
// write, which rank 0's checkpoint goroutine does like that of a job
// without partitions (one CheckpointStore.Save of the blob holding every
// rank's manifest, so a crash before it completes leaves the previous
// checkpoint whole). Such a partition keeps nothing for a checkpoint
// once Checkpoint returned, and must accept that PartitionRound.Published
// trails the checkpoints it took. The catch-up checkpoint of a new
// round, the final one and a preemption's stay synchronous.
type InlineCheckpointer interface {
	InlineCheckpoint() bool
}

// PartitionRound is what a Partition's Restore is told about the round.
type PartitionRound struct {
	// World is the round: job, round number, this rank, and every rank's
	// address for this partition (advertised under its Name), in rank order.
	World sync.World
	// Step is the committed step the round continues from (0 for a job
	// that starts fresh).
	Step int64
	// Source says where the replicated state came from: "init" (a fresh
	// job: the partition starts from its initial values), "commit" (a
	// survivor's commit: parts are on the ranks that committed Step, or
	// in durable storage) or "checkpoint" (a whole-job restart: parts
	// come from the durable checkpoint of Step, named by Manifests).
	Source string
	// Manifests holds, for Source "checkpoint", the manifests every rank
	// returned from Checkpoint when it was written, in the rank order of
	// the round that wrote it (its world size may differ from this one's);
	// nil when that checkpoint holds none of this partition (it was
	// written by a job without it, or before it existed).
	Manifests [][]byte
	// Published is the step of the newest durable checkpoint published
	// (rank 0's CheckpointStore.List), -1 when there is none or no
	// CheckpointStore. The partition keeps what that checkpoint names,
	// whatever its own last Checkpoint call was: a round that failed
	// while rank 0 was publishing leaves the store at an older one.
	// Within a round, a Checkpoint call follows only a published one (a
	// failed publication fails the round).
	Published int64
	// Comm is the round's Synchronizer, for a partition that needs an
	// agreement of its own; the partition must make the same calls on it,
	// in the same order, on every rank.
	Comm sync.Synchronizer
}

// Releasable is an optional capability of a Partition: whether this
// rank's part of the partitioned state is held by another rank too, so
// that a scaling decision may remove this rank without losing state.
// Called from the loop goroutine at the start of every round. A Partition
// without it is taken to hold state no other rank holds: its ranks are
// never removed by a decision (the policy then shrinks only ranks it may,
// or not at all).
type Releasable interface {
	Releasable() bool
}

// TempCleaner is an optional capability of a CheckpointStore: removing the
// temporary files of writes that never completed (a rank 0 killed while
// writing). Rank 0 calls it when a round starts with no live state (a new
// job or a whole-job restart, when no write of the job can be in flight),
// after the newest checkpoint matched the model (or none exists), never
// before. LocalDir implements it.
type TempCleaner interface {
	// CleanTemp removes leftover temporary files and returns their names.
	CleanTemp(ctx context.Context) ([]string, error)
}

// Weighter is the optional capability of a loader (a Loader or a
// StatefulLoader) that can split each global batch over the ranks by
// weight; *dataloader.Loader has it (SetWeights). With Config.Balance the
// trainer calls SetWeights from its loop goroutine, on every rank with
// the same weights at the same step boundary (after Stepped, before the
// next Next): weights[r] is rank r's share of the global batch relative
// to the others (its smoothed speed, in samples or cost units per
// second); nil returns to equal shares. The loader must cut every
// following global batch, the same samples in the same order, into
// contiguous runs by those weights (and whole micro-batches when it has
// them), in the same way on every rank. A new round starts from equal
// shares: the trainer calls SetWeights again once it has measured the
// round's ranks. An error fails the round.
type Weighter interface {
	SetWeights(weights []float64) error
}

// Loader is a data loader whose state is a dataloader.Cursor, the same on
// every rank; *dataloader.Loader implements it. The trainer calls it from
// its loop goroutine only. New adapts it to the StatefulLoader protocol
// (the state is the cursor's MarshalBinary, CursorSize bytes), so
// checkpoints hold the same bytes whichever kind of loader wrote them.
type Loader[B any] interface {
	// Reset reshards the loader from a committed cursor for rank of worldSize.
	Reset(c dataloader.Cursor, rank, worldSize int) error
	// Next returns this rank's share of the next global batch.
	Next(ctx context.Context) (dataloader.Batch[B], error)
	// NewCursor returns the cursor of a fresh job (epoch 0, position 0).
	NewCursor() dataloader.Cursor
}

// Errors of the CheckpointStore contract; package trainer exports them
// under the same names (trainer.ErrNoCheckpoint is driver.ErrNoCheckpoint).
var (
	// ErrNoCheckpoint is wrapped by CheckpointStore.Load for a step that
	// has no checkpoint.
	ErrNoCheckpoint = errors.New("trainer: no checkpoint")
	// ErrCorruptCheckpoint reports a durable checkpoint that is truncated
	// or fails its checksum; a store skips such files for the previous
	// good one.
	ErrCorruptCheckpoint = errors.New("trainer: corrupt checkpoint")
)

// MicroBatcher is the optional capability of a loader that cuts global
// batches into fixed micro-batches (*dataloader.Loader has it):
// MicroBatchSize is the micro-batch size in samples, 0 when the loader does
// not cut them. Deterministic mode (trainer.Config.Deterministic, the
// default) needs micro-batches: a loader without the capability, or whose
// MicroBatchSize is 0, trains in the float32 mode, and Run says so once at
// its start.
type MicroBatcher interface {
	MicroBatchSize() int
}
