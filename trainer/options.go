package trainer

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/autoscale"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// Option configures a Trainer beyond its Config: collaborators and hooks.
type Option func(*options)

type options struct {
	ckpt    CheckpointStore
	audit   Audit
	hooks   Hooks
	logger  *slog.Logger
	tp      trace.TracerProvider
	mp      metric.MeterProvider
	state   Stateful
	now     func() time.Time
	backend Backend
	parts   []Partition
	sched   Schedule
	eval    *Evaluation
	micro   any // a MicroStepFunc[B], checked by New
}

// WithMicroStep gives deterministic mode a MicroStepFunc: the trainer
// calls f once per step with all of this rank's micro-batches instead of
// the StepFunc once per micro-batch (the StepFunc still serves batches
// without micro-batches, and every step outside deterministic mode). B
// must be the Trainer's batch type: New returns ErrInvalidConfig
// otherwise.
func WithMicroStep[B any](f MicroStepFunc[B]) Option {
	return func(o *options) {
		if f != nil {
			o.micro = f
		}
	}
}

// WithBackend makes every round communicate through b (see driver.Backend)
// instead of the default ring over TCP built from Config.ListenAddr and
// Config.Sync, which are then ignored (and not validated). The Trainer
// owns b from Run on: it calls Listen once and Close when Run returns.
func WithBackend(b driver.Backend) Option { return func(o *options) { o.backend = b } }

// WithPartition adds state partitioned over the ranks (see driver.Partition) to
// every commit, restore and checkpoint. It may be given several times,
// for partitions of distinct names (at most elastic.MaxEndpoints-1 of
// them; "sync" is the Backend's), in the same order on every worker: the
// trainer calls them in that order. The Trainer owns p from Run on: it
// calls Listen once and Close when Run returns.
//
// With partitions, a durable checkpoint is a collective of every rank at
// a step boundary (each rank's Checkpoint, then rank 0's publication of
// one checkpoint naming every part), not rank 0's asynchronous write.
func WithPartition(p driver.Partition) Option {
	return func(o *options) { o.parts = append(o.parts, p) }
}

// WithCheckpointStore enables durable checkpoints in s (see
// Config.CheckpointEvery; package trainer/checkpoint has stores).
// Without it the job keeps only in-memory commits.
func WithCheckpointStore(s driver.CheckpointStore) Option { return func(o *options) { o.ckpt = s } }

// WithAudit records every applied sample index in a (see package
// trainer/audit).
func WithAudit(a audit.Recorder) Option { return func(o *options) { o.audit = a } }

// WithHooks sets callbacks the loop calls at round starts, steps, commits,
// checkpoints, rescales and stragglers.
func WithHooks(h Hooks) Option { return func(o *options) { o.hooks = h } }

// WithLogger sets the structured logger; default: discard. It also
// becomes Config.Elastic.Logger and Config.Sync.Logger where those are
// nil, so the rendezvous' waits (fewer than MinWorkers arrived) and store
// outages are logged as they begin and then every 2 s, with their cause.
// No part adds the job ID to it: a logger that should name the job carries
// it (l.With("job", id)), and each record then names it once.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithTracerProvider sets the OpenTelemetry tracer provider; default: the global one.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithMeterProvider sets the OpenTelemetry meter provider; default: the global one.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(o *options) { o.mp = mp } }

// WithState adds user state (RNG streams, counters) to every commit and
// checkpoint, restored with the parameters.
func WithState(s Stateful) Option { return func(o *options) { o.state = s } }

// Stateful is extra user state carried in commits and checkpoints. The
// trainer calls it from its loop goroutine only.
type Stateful interface {
	// AppendState appends the encoded state to dst.
	AppendState(dst []byte) []byte
	// LoadState replaces the state with an encoding from AppendState
	// (nil or empty when the job starts fresh).
	LoadState(src []byte) error
}

// Hooks are optional callbacks, called synchronously from the loop
// goroutine; they must return quickly. A nil field is skipped.
type Hooks struct {
	// OnRound is called when a round has agreed on its state, before its
	// first step.
	OnRound func(RoundInfo)
	// OnRescale is called when the world size differs from the previous
	// round's, before the first step; scale the learning rate here if that
	// is the policy you prefer over a fixed global batch.
	OnRescale func(oldSize, newSize int)
	// OnStep is called after every applied step (the optimizer has
	// stepped and the loader has Stepped), before that step's commit and
	// durable checkpoint: what it changes (state carried by WithState, the
	// optimizer's learning rate for the next step) is part of this step's
	// commit, so a round that restores this step restores those values
	// with it. Not called for a global batch without samples.
	OnStep func(StepInfo)
	// OnCommit is called after every in-memory commit with its global step.
	OnCommit func(step int64)
	// OnCheckpoint is called when a durable checkpoint write finished, with
	// its error (nil on success). Called from the checkpoint goroutine.
	OnCheckpoint func(step int64, err error)
	// OnStraggler is called on every rank when a rank is found slow.
	OnStraggler func(StragglerInfo)
}

// RoundInfo describes a round at its start.
type RoundInfo struct {
	Round     uint64
	Rank      int
	WorldSize int
	// PrevWorldSize is the world size of this worker's previous round (0 for its first).
	PrevWorldSize int
	// Step is the global step the round continues from; Epoch and
	// EpochStep locate it in the data.
	Step      int64
	Epoch     int
	EpochStep int
	// Source says where the state came from: "init", "checkpoint" or "commit".
	Source string
	// Recovery is true when the previous round ended by a failure.
	Recovery bool
	// RolledBack is how many steps this worker discarded to reach Step.
	RolledBack int64
}

// StepInfo describes one applied step.
type StepInfo struct {
	Round     uint64
	Rank      int
	WorldSize int
	// Step is the global step count once this step is applied.
	Step      int64
	Epoch     int
	EpochStep int
	// Loss is the mean per-sample loss over the global batch.
	Loss float64
	// LearningRate is the optimizer's learning rate of this step (with
	// WithSchedule: the Schedule's LR(Step-1)).
	LearningRate float64
	// Samples is the global batch size of this step.
	Samples int
	// ComputeSeconds is this rank's StepFunc time; SyncSeconds the time in
	// collectives; StepSeconds the whole step.
	ComputeSeconds, SyncSeconds, StepSeconds float64
	// RecoverySeconds is set on the first step completed after a failure:
	// seconds from when this worker saw the failure.
	RecoverySeconds float64
	// Shares is each rank's samples in this step, by rank (with
	// Config.Balance, in proportion to Speeds).
	Shares []int
	// Speeds is each rank's smoothed speed, by rank, in samples (or the
	// loader's cost units, Batch.Cost) per compute second, as every rank
	// agreed on it after this step; 0 for a rank not measured yet.
	Speeds []float64
	// Scaling is the decision of resource adjustment (Config.Autoscale)
	// made at this step, the same on every rank; nil at the steps where
	// the target world size did not change.
	Scaling *autoscale.Decision
	// Throughput is the measured samples per second at this world size
	// (0 until measured); Efficiency the statistical efficiency of the
	// global batch (1 until the gradient noise scale is estimated);
	// Goodput = Throughput × Efficiency, in useful samples per second;
	// RecommendedWorldSize the policy's target. All 0 without
	// Config.Autoscale, and the same on every rank.
	Throughput, Efficiency, Goodput float64
	RecommendedWorldSize            int
	// Resummed is set, in deterministic mode, on a step whose gradients
	// grew past the fixed-point scale taken from the step before (by more
	// than 2^4): every rank summed it a second time at a wider scale, with
	// a second collective. The same on every rank and in every run of the
	// job.
	Resummed bool
}

// StragglerInfo reports a rank whose compute time stayed above
// Config.StragglerFactor times the median for Config.StragglerSteps steps.
type StragglerInfo struct {
	Round uint64
	Rank  int
	Step  int64
	Ratio float64 // its compute time over the median, last step (per sample with Config.Balance)
	Evict bool    // Config.EvictStragglers and not Absorbed: it leaves now
	// Balanced: Config.Balance is on, so Ratio compares compute time per
	// sample (the rank's slowness), which balancing does not change.
	Balanced bool
	// Absorbed: balancing gave the rank a share small enough that its
	// compute time per step is within 1.25 times the median: the job no
	// longer waits on it, and it is not evicted. A slow rank that is not
	// absorbed (its share is at the floor, or its time does not shrink
	// with its share) slows every step: eviction is the better cure.
	Absorbed bool
	// Pending: not absorbed yet, but balancing has not had its chance (the
	// round is young, or a new split is on trial); it is not evicted now,
	// and reported again StragglerSteps steps later if it stays slow.
	Pending bool
}
