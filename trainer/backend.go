package trainer

import (
	"context"

	"github.com/elastictrain/elastictrain/sync"
)

// This file holds the contract of the trainer's communication seam. The
// loop (rendezvous, connect, agree, restore, steps, commit, checkpoint,
// recover) is written once, in this package; what moves numbers between
// the ranks of a round plugs in here, in the way database/sql takes a
// driver or hashicorp/raft a Transport.

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
// It is not used in deterministic mode (the default), whose exact
// fixed-point sums need AllReduceFloat64.
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
