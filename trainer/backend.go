package trainer

import "github.com/elastictrain/elastictrain/trainer/driver"

// This file holds the contract of the trainer's communication seam. The
// loop (rendezvous, connect, agree, restore, steps, commit, checkpoint,
// recover) is written once, in this package; what moves numbers between
// the ranks of a round plugs in here, in the way database/sql takes a
// driver or hashicorp/raft a Transport.

// EndpointSync is the name under which a worker advertises its Backend's
// address in the rendezvous (elastic.Member.Endpoints). Partitions
// advertise theirs under their own Name.
//
// Deprecated: use driver.EndpointSync, the same const.
const EndpointSync = driver.EndpointSync

// Backend gives every round of a job its collective communicator: the
// sync.Synchronizer that carries the trainer's control values, state
// agreement and state broadcast, and the gradient allreduce.
//
// Deprecated: use driver.Backend, the same type.
type Backend = driver.Backend

// GradientReducer is an optional capability of a round's Synchronizer: a
// Synchronizer that sums gradients its own way.
//
// Deprecated: use driver.GradientReducer, the same type.
type GradientReducer = driver.GradientReducer

// LocalStepper is an optional capability of a round's Synchronizer: a
// low-communication strategy (LocalSGD, DiLoCo; package trainer/localsgd)
// whose ranks step on their own gradients and reconcile their parameters
// only at some steps, its outer steps. With it the trainer:
//
// Deprecated: use driver.LocalStepper, the same type.
type LocalStepper = driver.LocalStepper
