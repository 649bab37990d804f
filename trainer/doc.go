// Package trainer is the elastic training loop: the part users buy. You give
// it the model's parameters (named, shaped float32 buffers shared with your
// framework), a StepFunc that runs forward and backward on this rank's share
// of a global batch, an Optimizer, a data loader and a rendezvous store; Run
// trains until every epoch is done, surviving crashes, hangs, preemption and
// rescaling without losing or repeating a sample.
//
// # The loop
//
// Each worker process runs one Trainer. Run repeats rounds:
//
//  1. Join the rendezvous (package elastic) and get a World: round, rank,
//     world size, peers.
//  2. Connect the collective transport (package sync) for that round.
//  3. Agree on state. The ranks first check with one max-allreduce that they
//     hold the same model (names, shapes, optimizer; otherwise every rank
//     returns ErrModelMismatch), then find the newest commit that every
//     survivor holds. The lowest rank holding it broadcasts it to everyone, so
//     survivors roll back and joiners catch up in one step. When no rank
//     holds live state (a new job, or a whole-job restart), rank 0 loads the
//     newest durable checkpoint that passes its checksum, or starts from the
//     initial values.
//  4. Reshard the data loader from the committed cursor for the new world size.
//  5. Train: batch, StepFunc, one small allreduce of control values, the
//     gradient allreduce (fused buckets), divide by the global batch size,
//     optimizer step, commit every Config.CommitEvery steps, durable
//     checkpoint every Config.CheckpointEvery steps (written asynchronously).
//
// # Agreement at step boundaries
//
// The control allreduce of each step carries, from every rank: its loss and
// sample count, whether its rendezvous agent sees a membership change
// pending (a joiner waiting, a member lost), whether its StepFunc failed,
// its compute time, and whether it was preempted. Because every rank sees the
// same sums after the same step, every rank takes the same decision: leave
// the round together after this step (a joiner is waiting; a worker was
// preempted; a straggler is evicted), or go on. A peer that dies turns into
// an error inside a collective on every rank (the transport names it; the
// survivors report it to the rendezvous, which opens the next round at
// once), and a peer that hangs is found when its lease lapses, which aborts
// the collectives waiting for it.
//
// # Rollback and exactly once
//
// A step is applied on a rank only after its gradient allreduce completed
// there. When a round fails mid-step some ranks may have applied step s and
// others not; the next round restores the newest commit that all survivors
// hold, so no rank keeps a step another discarded (invariant 2). Because the
// data cursor is part of every commit and the loader decides which samples
// form a global batch independently of the world size, the samples of the
// rolled-back steps are trained again, exactly once. The optional Audit
// records every rank's indices before each step and every round's agreed
// commit; VerifyAudit replays it and counts missing and duplicate samples.
//
// # Preemption, stragglers and the failure budget
//
// Preempt (call it on SIGTERM) makes the worker leave at the next step
// boundary after everyone committed and it wrote a checkpoint, within
// Config.GracePeriod; Run then returns ErrPreempted. The compute times in the
// control allreduce let every rank spot a rank slower than
// Config.StragglerFactor times the median for Config.StragglerSteps steps;
// it is reported (log, metric, Hooks.OnStraggler) and, with
// Config.EvictStragglers, leaves. Failure recoveries are counted in the
// committed state, so per job rather than per process; more than
// Config.MaxRecoveries within Config.RecoveryWindow end Run with a
// *BudgetError. Growth and graceful leaves do not count.
//
// # Telemetry
//
// With the OpenTelemetry API only (pass providers with WithTracerProvider and
// WithMeterProvider; default: the globals): spans SpanJoin, SpanStateSync,
// SpanStep (one every Config.StepSpanEvery steps), SpanAllReduce, SpanCommit,
// SpanCheckpoint and SpanRecovery; metrics MetricStepDuration (s),
// MetricSamples, MetricWorldSize, MetricRounds, MetricRecoveries,
// MetricRecoveryDuration (s), MetricGoodput (useful training time over wall
// time) and MetricStragglers. Logs go to the *slog.Logger of WithLogger.
//
// Several Trainers can run in one process (the tests do): each has its own
// store client, listener and goroutines; nothing is global.
package trainer
