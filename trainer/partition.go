package trainer

import "github.com/elastictrain/elastictrain/trainer/driver"

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
// Deprecated: use driver.Partition, the same type.
type Partition = driver.Partition

// PartitionRound is what a Partition's Restore is told about the round.
//
// Deprecated: use driver.PartitionRound, the same type.
type PartitionRound = driver.PartitionRound
