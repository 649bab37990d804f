// Package autoscale is resource adjustment for elastic jobs: it measures
// what a world size is worth (goodput from numbers every rank agrees on),
// decides a target world size with a pure, deterministic policy, and hands
// the decision to a worker.Platform that enacts it (package launch for local
// processes; Kubernetes' own scaling on a cluster).
//
// # Measure
//
// Every rank feeds a Policy the same Observation after every applied step
// (the trainer builds it from the step's reduced control values): each
// rank's seconds per step, compute and sync seconds, its share, the
// squared norms of its mean gradient and of the averaged one. From them
// the Policy keeps, per world size, the measured seconds per step and
// throughput (samples per second), fits the step-time model of Pollux
// (compute linear in the per-replica batch plus a sync time growing with
// the replica count) to predict the sizes not measured yet, and estimates
// the gradient noise scale and the statistical efficiency of the global
// batch (McCandlish et al. 2018); goodput = throughput × efficiency. See
// model.go for the forms and sources. With a fixed global batch the
// efficiency is the same at every world size, so the decisions rest on
// throughput.
//
// # Decide
//
// Policy.Observe returns a Decision when the target world size changes:
// grow, shrink, probe a size not measured yet (kept only if it measured
// better), undo a probe, follow the platform's capacity. Intervals are
// counted in steps (Config), so a job of a few thousand steps finds its
// size within seconds; hysteresis and a minimum interval keep it from
// flapping. The Policy's state (MarshalBinary) travels in the trainer's
// commits and checkpoints, so a restarted job does not re-learn. The
// Policy is tested from scripts (testdata/*.txt) against a simulated job.
//
// # Enact
//
// A Platform enacts: rank 0 calls Resize with the target; each rank a
// shrink names calls Release and leaves gracefully. Without a Platform the
// decisions are recommendations.
//
// It imports only the standard library.
package autoscale
