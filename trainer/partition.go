package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/sync"
)

// This file holds the contract of state partitioned over the ranks of a
// round: the rows of parameter-server tables, or any state of which each
// rank holds a part rather than a copy. The trainer commits, restores and
// checkpoints it in step with the replicated state (parameters, optimizer,
// loader, user state), so a round always continues from one step boundary
// of all of them. WithPartition registers one; several may be registered,
// with distinct names.

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
