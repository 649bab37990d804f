package trainer

import "github.com/elastictrain/elastictrain/trainer/driver"

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
type Source[B any] = driver.Source[B]

// StatefulLoader is a data loader whose state the trainer commits as
// opaque bytes. The trainer calls it from its loop goroutine only, in this
// order in every round:
//
// Deprecated: use driver.StatefulLoader, the same type.
type StatefulLoader[B any] = driver.StatefulLoader[B]

// StateMerger is the optional capability of a StatefulLoader whose state
// differs between ranks (each rank's leases). The trainer gathers every
// rank's State in rank order and commits MergeStates(parts), which every
// rank computes from the same parts, so it must be a pure function.
//
// Deprecated: use driver.StateMerger, the same type.
type StateMerger = driver.StateMerger

// CommitListener is the optional capability of a StatefulLoader with work
// that must never be rolled back (acking leased shards: an acked shard is
// never served again). Committed is called on every rank once every rank
// of the round holds the commit of the state it last returned from State
// (the trainer passes a barrier first), and never for a commit some rank
// may lack. When the round fails before, the next round restores whichever
// commit it agrees on, and Restore redoes what Committed did not.
//
// Deprecated: use driver.CommitListener, the same type.
type CommitListener = driver.CommitListener

// LoaderStep is one step, or one empty global batch, as every rank of the
// round agreed on it: Step, and per rank (indexed by rank, valid only
// during the call) Samples, ComputeSeconds and EpochDone. It is
// dataloader.StepOutcome, so that a loader in package dataloader (which
// must not import trainer) implements Stepped; see there for the fields.
//
// Deprecated: use driver.LoaderStep, the same type.
type LoaderStep = driver.LoaderStep

// LineageSetter is the optional capability of a StatefulLoader whose state
// outside the job (a shard queue's acks) must be kept apart per history.
//
// Deprecated: use driver.LineageSetter, the same type.
type LineageSetter = driver.LineageSetter
