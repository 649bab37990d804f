// Package trainer is the elastic training loop: the part users buy. You give
// it the model's parameters (named, shaped float32 buffers shared with your
// framework), a StepFunc that runs forward and backward on this rank's share
// of a global batch, an optimizer (package trainer/optim), a data loader
// and a rendezvous store; Run trains until every epoch is done, surviving
// crashes, hangs, preemption and rescaling without losing or repeating a
// sample.
//
// # The loop
//
// Each worker process runs one Trainer. Run repeats rounds:
//
//  1. Join the rendezvous (package elastic) and get a World: round, rank,
//     world size, peers (each with the addresses it advertised: its
//     Backend's under EndpointSync, each Partition's under its name).
//  2. Connect the round's Backend (by default the ring of package sync),
//     and agree on the job's settings: one max-allreduce of every member's
//     model fingerprint, epochs, base learning rate, global batch, dataset
//     length, shuffle seed, commit interval and mode, and whether each
//     member holds the job's trained state (installed in an earlier
//     round). When the members that hold it agree, they are the job: a
//     newcomer that differs from them is refused (as a stranger with the
//     wrong secret is: evicted, and its Run returns a *SettingsError,
//     ErrSettingsMismatch, ErrModelMismatch too when the models differ,
//     with Refused set), and the others end the round before any state
//     moves and train on without it. When nobody holds trained state (a
//     new job, a whole-job restart) or the holders disagree, every member
//     stops in this round with that error. It names the settings with the
//     values as each member configured them, and the members; it is not
//     retried. Members whose sync transport layout differs (Config.Sync's
//     ChunkBytes, DirectBytes, Streams, Hierarchy) cannot connect at all:
//     the transport's handshake names them (sync.LayoutError), the
//     round's majority evicts them and trains on, and they stop with the
//     same error (see ErrSettingsMismatch).
//  3. Agree on state. The ranks first check with one max-allreduce that they
//     hold the same model (names, shapes, optimizer; otherwise every rank
//     returns ErrModelMismatch), then find the newest commit that every
//     survivor holds. The lowest rank holding it broadcasts it to everyone, so
//     survivors roll back and joiners catch up in one step. When no rank
//     holds live state (a new job, or a whole-job restart), rank 0 loads the
//     newest durable checkpoint that passes its checksum, or starts from the
//     initial values. A checkpoint of another model stops every rank with
//     ErrForeignCheckpoint, and one that already completes Config.Epochs
//     (a finished job's, under a new job ID) with ErrFinishedCheckpoint,
//     before anything in the store changes.
//  4. Restore every Partition to the agreed step, then the data loader
//     from the committed loader state for the new world size.
//  5. Train: batch, StepFunc, the gradient allreduce (one collective that
//     also carries the step's control values: fused float32 buckets, or in
//     deterministic mode (Config.Deterministic) the exact fixed-point sums as
//     float64; with the round's GradientReducer outside deterministic mode,
//     or a LocalStepper, one small allreduce of control values
//     first), divide by the global batch size, optimizer step, Hooks.OnStep (so
//     what it sets is part of this step's commit), commit every
//     Config.CommitEvery steps, durable checkpoint every
//     Config.CheckpointEvery steps (written asynchronously by rank 0; with
//     partitions, by every rank together).
//
// # Seams
//
// What varies between jobs plugs in through small interfaces, each with
// its contract in its own file (who calls what, in which order, from which
// goroutine, what an error does to the round); optional capabilities are
// found by type assertion.
//
//   - Backend (backend.go): the communicator of every round. Listen once,
//     Connect per round, Close at the end; the round's sync.Synchronizer
//     carries the control values, the state agreement and broadcast and
//     the gradients. Capabilities of the Synchronizer: sync.AllGatherer
//     (used to gather per-rank loader states and partition manifests;
//     broadcasts otherwise), GradientReducer (a gradient sync of its
//     own, outside deterministic mode) and LocalStepper (local steps and
//     an outer step every so often, commits at outer steps only:
//     trainer/localsgd). Default: NewRingBackend from
//     Config.ListenAddr and Config.Sync; another with WithBackend.
//   - The optimizer (package trainer/optim, its contract in optim.go):
//     Step after every step's allreduce, its state in every commit.
//     Capabilities: optim.ScaledStepper (the mean's scaling in the
//     update's own pass) and optim.StateFreezer (a commit holds the state
//     without copying it). Adam has both.
//   - The data loader (loader.go): New takes a Source that is a Loader
//     (a cursor the same on every rank: *dataloader.Loader) or a
//     StatefulLoader (opaque state per rank, committed with the model:
//     Restore, Next, Stepped, State), optionally a StateMerger (every
//     rank's state is gathered and merged) and a CommitListener (told once
//     every rank holds a commit). A global batch in which no rank got a
//     sample is no step; each rank's Batch.EpochDone reaches every rank in
//     LoaderStep.
//   - Partition (partition.go, WithPartition): state split over the ranks
//     (parameter-server shards), restored, committed, checkpointed and
//     told about decided round ends in step with the replicated state.
//     With partitions a durable checkpoint is collective: every rank's
//     Checkpoint returns a manifest, rank 0 publishes one checkpoint
//     (snapshot version 3) holding the replicated state and every
//     manifest, synchronously, and every rank learns whether it did; a
//     failed publication fails the round, so the next round's
//     PartitionRound.Published tells the partitions which checkpoint
//     counts. A whole-job restart hands every rank the manifests of the
//     checkpoint it restores (PartitionRound.Source "checkpoint").
//
// Commits are numbered, and the state agreement picks the newest commit
// every survivor holds by number (a loader may ask for two commits at one
// step, around a global batch without samples).
//
// # The deterministic core
//
// The decisions of the loop (which commit a round restores and from which
// rank, what a step's control values decide, when to commit and
// checkpoint, the failure budget, stragglers) are plain functions and
// small state machines in core.go, with time passed in; Run, round and
// train are the I/O around them. They are tested from scripts
// (testdata/core/*.txt: a command, its input, its expected output), in
// the way etcd raft tests RawNode.
//
// # Testing with in-memory ranks
//
// Package sync/synctest gives N in-memory ranks behind sync.Synchronizer
// with fault knobs (Kill, FailAt, Delay, Drop); package trainertest gives
// an in-memory Backend over them (Network, Backend) and Cluster, which
// runs N trainers of one job in one test over an in-memory rendezvous
// store, with Kill making a worker vanish as a SIGKILLed process does. A
// user tests a step function, a strategy or a partition without TCP.
//
// # Deterministic mode
//
// With Config.Deterministic (the default), two runs of one job end with
// the same parameter bits whatever the world size, the balancer's shares
// and the faults (kills, joins, rollbacks, whole-job restarts from a
// checkpoint), when the loader cuts global batches into fixed
// micro-batches (dataloader.Config.MicroBatch). With a loader that does
// not (or merges state across ranks), the job trains in the float32 mode
// of Config.Deterministic false, whose sums depend on the world size and
// the shares, and Run says so once at its start. The
// StepFunc runs once per micro-batch, or a MicroStepFunc (WithMicroStep)
// once per step with each micro-batch's sums kept apart, so a sample's
// gradient never depends on which rank computed it. How the micro-batches'
// gradients are summed depends on the round's Synchronizer:
//
//   - The ordered sum, where it implements sync.OrderedReducer (a
//     *sync.Ring, that is the default ring Backend; sync.NewLocal; the
//     ranks of package synctest): each micro-batch's gradients are one
//     part of AllReduceOrderedFloat32, in order, so every rank receives
//     the float32 sum (((0 + m_0) + m_1) + ... + m_{K-1}) of the global
//     batch's micro-batches, added one by one in the batch's order. The
//     dataloader hands each rank a contiguous run of micro-batches, the
//     runs in rank order (dataloader.MicroShareOf, and its weighted
//     shares when balancing), so the sequence of parts, and the sum, is
//     the same at every world size and whatever the shares; every rank
//     checks the runs (each rank's travels with its control values) and
//     all stop with ErrInvalidConfig where a loader of its own cuts them
//     otherwise. The control values travel in the same collective,
//     packed into float32 lanes after each rank's last part (as in the
//     default mode's gradient allreduce), so a step takes one collective;
//     the sum divided by the global batch size is the mean gradient (in
//     the optimizer's pass when it can scale, as in the default mode). A
//     non-finite sum or loss stops every rank at the same step with
//     ErrDiverged. Precision: float32's, as in the default mode; only the
//     order of the additions is fixed.
//   - Fixed point, where it does not (a Backend of the user's own):
//     every micro-batch's gradients are rounded to integers at one scale
//     for the whole step, 2^s, and summed as float64, which is exact below 2^53 and so the same in any order, on
//     any number of ranks. The scale comes from the previous step's
//     largest |gradient| over the global batch, with 2^4 of headroom
//     (detScaleExp), so no collective is spent agreeing on it: each
//     rank's largest |gradient| travels in the step's one float64
//     allreduce, and in the rare step whose gradients outgrew the
//     headroom every rank sees it there and sums the step again at its
//     own largest gradient's scale (StepInfo.Resummed). The exponent is
//     part of every commit and checkpoint (the "detscale" section,
//     which the ordered path leaves as it found it), so a resumed run
//     scales its steps as an uninterrupted one. Precision: about
//     2^-(48-log2(global batch)) of the largest |gradient|.
//
// The two paths give different bits: a job keeps its results reproducible
// as long as every round of it takes the same path (the same Backend).
// Losses are summed in fixed point on both (2^-24 per micro-batch). The
// cost against the float32 mode: a StepFunc call per micro-batch
// instead of one per share (none with a MicroStepFunc such as
// gorgoniastep.Model.StepMicro, which runs the forward and backward pass
// once and splits only the sums), a copy of each micro-batch's gradients
// (on the fixed-point path all but the last), then on the ordered path a
// read-only pass that checks the sum is finite and the chained allreduce,
// on the fixed-point path one pass that converts the gradients and finds
// their largest |gradient| and a float64 allreduce (twice the bytes). What
// the promise does not cover: a StepFunc that is itself not deterministic
// (threads that sum in a varying order, BLAS libraries that pick kernels
// by CPU kind, so ranks on different CPU kinds differ), and LocalStepper
// strategies (package localsgd: LocalSGD, DiLoCo), whose results depend on
// the world size by design (each rank steps on its own share): they are
// reproducible at one world size, without faults.
//
// # Agreement at step boundaries
//
// The control values of each step (in the gradient allreduce, or in an
// allreduce of their own first with a GradientReducer outside
// deterministic mode or a LocalStepper) carry, from every rank: its loss and
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
// records every rank's indices before each step, every round's agreed
// commit, and the end of a round that every rank decided not to apply its
// step (ErrDiverged, ErrStepFailed); VerifyAudit replays it and counts
// missing and duplicate samples.
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
// A worker whose loop makes no progress for elastic.Config.ProgressTimeout
// (15 s by default) is counted as hung and left behind (see package
// elastic); when it wakes it is fenced and rejoins as a new member. The
// loop marks the phases it drives itself (collectives and connects, data
// fetches, checkpoint writes, the time between rounds), so only the
// StepFunc and hooks are judged: mark a long phase of your own with Busy
// (inside a StepFunc) or Trainer.Busy.
//
// A marked phase (a data fetch, a synchronous checkpoint write, rank 0's
// checkpoint load at a round's start, Busy) also tells the round's peers
// (sync.BusyMarker): their collectives wait for it instead of failing
// after sync.Config.OpTimeout, which so counts only unmarked time; a
// phase still open when a new round connects (a Trainer.Busy from another
// goroutine) tells that round's peers too. What bounds a marked phase:
// elastic.Config.PhaseTimeout (10 min by default; Config.Elastic): a
// phase open longer is a hang (a Dataset.Get that never returns), and
// the worker's Agent leaves the job for it, naming the phase in a WARN;
// every survivor names the member in a WARN when the round re-forms
// without it (within PhaseTimeout + a heartbeat + a re-form), and the
// worker is fenced when it wakes. The peers wait up to
// sync.Config.BusyTimeout (30 min), which Validate requires to be at
// least PhaseTimeout. Raise PhaseTimeout above your longest legitimate
// phase (an evaluation marked with Busy). A collective that waited
// OpTimeout while some rank was neither in it nor marked busy fails with
// a *sync.TimeoutError naming that rank (Silent), and every survivor logs
// a WARN with its member ID and address; the rank's own Agent leaves the
// job at ProgressTimeout. Asynchronous checkpoint writes (every
// CheckpointEvery steps) hold no peer up and mark the progress watch
// only (PhaseTimeout bounds them too). Every CheckpointStore call has a
// bound of its own, Config.CheckpointTimeout (10 min): a Save, List or
// Load past it fails with ErrCheckpoint, and Run's end waits for a write
// in flight no longer than that (a preempted worker's, no longer than its
// grace period), so a store that hangs never keeps Run from returning.
//
// A worker preempted while it waits outside a round (for a round to form
// below MinWorkers, for the store, between rounds) with nothing to commit
// leaves at once: Run returns ErrPreempted after one leave call bounded by
// half a lease. Only a worker that holds a commit newer than the
// CheckpointStore's newest checkpoint joins on, to leave at the next
// round's first step boundary with that checkpoint written, within the
// grace period (if every holder of the commit was preempted at once,
// leaving would lose it).
//
// # Uneven workers: speed-weighted shares
//
// With Config.Balance (the default) and a loader that can cut global
// batches by weight (Weighter; *dataloader.Loader has it), a rank gets a
// share of each global batch in proportion to its measured speed, so a
// slow worker no longer sets the pace of every step. Every step's control
// allreduce carries each rank's work (its samples, or the loader's
// Batch.Cost) and compute seconds; every rank folds the same agreed
// numbers into the same smoothed speeds (balance.go) and, at the same
// step boundary, hands the loader the same new split, only when it would
// cut the slowest rank's compute time by 10 %, by at most 0.15 of the
// batch at a time, and as a trial: a move after which the steps' slowest
// compute time did not fall is taken back, and none is tried for a
// hold-off that doubles each time (a cost no share changes, such as a
// step function's fixed set-up on a loaded host, makes a larger share
// look faster per sample; trials keep that from making shares drift).
// The loader keeps a floor per rank. Shares are
// contiguous runs of the same global batch, so the samples of a step, the
// epoch order and exactly-once are unchanged; in deterministic mode whole
// micro-batches move and, since the fixed-point gradient sum is exact in
// any order, the parameters are the same bits as an unbalanced run's.
// Each round starts from equal shares and is balanced after its first
// steps. StepInfo.Shares and Speeds, MetricShare, MetricSpeed and a log
// line per new split show it; while balancing, the straggler tracker
// follows compute time per sample; a straggler whose step time
// balancing evened out is reported Absorbed and never evicted, one that
// balancing is still trying to absorb is reported Pending (not evicted,
// judged again later), and only one that balancing could not absorb is
// evicted with Config.EvictStragglers. For data
// whose samples cost different amounts, dataloader.Config.Cost makes the
// cut give equal cost rather than equal counts.
//
// # Resource adjustment: the job sizes itself
//
// With Config.Autoscale enabled, every rank measures what a world size is
// worth and the same policy (package autoscale) decides a target world
// size: grow while one more worker pays for its measured cost within a
// horizon, shrink when the last one adds less than a fraction of an
// average worker, probe sizes not measured yet (kept only if they measure
// better), follow the platform's capacity, never flap. Every step's
// control values carry each rank's step interval, compute and sync
// seconds, the squared norms of its mean gradient and of the averaged one
// (every 8th step) and its platform's capacity, so every rank feeds the
// policy the same numbers and takes the same decision at the same step
// (StepInfo.Scaling; figures in StepInfo.Throughput, Efficiency, Goodput
// and RecommendedWorldSize). Rank 0 logs it once (Info, "scaling
// decision", with its reason and figures) and calls the Platform's
// Resize; each rank the decision removes (the slowest, or the newest,
// never rank 0 when another can go, never one that holds state no other
// holds: see Releasable) calls Release and leaves at the next step
// boundary by the preemption path: every rank commits, nothing is lost or
// trained twice, no recovery is counted, and its Run returns ErrReleased.
// The policy's state is part of every commit and checkpoint, so a
// whole-job restart does not re-learn; in deterministic mode the
// parameters are the bits of a fixed-size run whatever was decided.
//
// # Telemetry
//
// With the OpenTelemetry API only (pass providers with WithTracerProvider and
// WithMeterProvider; default: the globals): spans SpanJoin, SpanStateSync,
// SpanStep (one every Config.StepSpanEvery steps), SpanAllReduce, SpanCommit,
// SpanCheckpoint and SpanRecovery; metrics MetricStepDuration (s),
// MetricSamples, MetricWorldSize, MetricRounds, MetricRecoveries,
// MetricRecoveryDuration (s), MetricGoodput (useful training time over wall
// time), MetricStragglers, MetricShare and MetricSpeed (per rank: its
// samples in the last step, its smoothed speed); with Config.Autoscale,
// MetricAutoscaleThroughput (measured samples/s at the current size),
// MetricAutoscaleEfficiency (the global batch's statistical efficiency),
// MetricAutoscaleGoodput (their product) and MetricAutoscaleRecommended
// (the policy's target world size). Logs go to the *slog.Logger of WithLogger.
//
// # No silent success
//
// Run returns nil only for a job that finished with this worker in it: a
// job ID the store remembers as finished is an error wrapping
// elastic.ErrJobFinished. A NaN or infinite loss is ErrDiverged on every
// rank. WithLogger also reaches the rendezvous and the transport, whose
// waits (fewer than MinWorkers) and store outages are logged as they begin
// and every 2 s. A Schedule (WithSchedule) ties the learning rate to the
// global step; WithEvaluation evaluates committed parameters beside the
// loop; LoadCheckpoint reads a checkpoint's parameters by name without a
// job.
//
// Several Trainers can run in one process (the tests do): each has its own
// store client, listener and goroutines; nothing is global.
package trainer
