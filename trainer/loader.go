package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/dataloader"
)

// This file holds the contract between the loop and a data loader. New
// takes any Source; how the loader's state is committed and restored is
// said by one of two capabilities, found by type assertion:
//
//   - Loader[B]: the state is a dataloader.Cursor, the same on every rank
//     (*dataloader.Loader: static shards of each global batch).
//   - StatefulLoader[B]: the state is opaque, versioned bytes of the
//     loader's own, possibly different on every rank (dataloader's leased
//     shards: each rank holds its own leases).
//
// The trainer stores the state in every commit and checkpoint next to the
// parameters, and gives it back at the start of every round, so that the
// model and the data always restart from the same step boundary
// (exactly once, invariant 3).

// Source is what New needs of a data loader: this rank's share of the next
// global batch, from the loop goroutine only. It must also implement
// Loader[B] or StatefulLoader[B].
type Source[B any] interface {
	Next(ctx context.Context) (dataloader.Batch[B], error)
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
