package trainer

import (
	"fmt"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/autoscale"
)

// Config holds the settings users write down. Start from DefaultConfig and
// change fields; New calls Validate.
type Config struct {
	// JobID names the job; every worker of one job uses the same value. It
	// overrides Elastic.JobID and Sync.JobID. Required.
	JobID string
	// Epochs is how many epochs to train. Default 1.
	Epochs int
	// CommitEvery is the number of steps between in-memory commits; a
	// failure rolls back at most this many steps. Default 1.
	CommitEvery int
	// CheckpointEvery is the number of steps between durable checkpoints
	// (written asynchronously by rank 0 when a CheckpointStore is set; at
	// most one write is in flight and one waits, and a newer checkpoint
	// replaces the waiting one, so a store slower than this interval keeps
	// fewer steps); 0 writes one only at the end and on preemption.
	// Default 0.
	CheckpointEvery int
	// ListenAddr is where this worker's collective transport listens
	// (host:port; port 0 picks a free one) when the default Backend is used
	// (see NewRingBackend; ignored with WithBackend). Default "127.0.0.1:0".
	ListenAddr string
	// BucketBytes is the size of the fused gradient buffers (tensor fusion),
	// in bytes. Default 4 MiB.
	BucketBytes int
	// MaxRecoveries is how many failure recoveries the job tolerates within
	// RecoveryWindow before Run returns ErrFailureBudget; membership growth
	// and graceful leaves do not count, nor do rounds that failed before
	// any rank trained a step in them. Those are bounded per worker
	// instead: after more than MaxRecoveries of them in a row (with a
	// backoff from 20 ms to 1 s between them) Run returns ErrFailureBudget
	// on that worker. A worker that the members authenticating one another
	// evicted for a wrong secret stops at once with ErrStranger (which
	// matches ErrFailureBudget too). Default 20.
	MaxRecoveries int
	// RecoveryWindow is the sliding window of the failure budget. Default 10 min.
	RecoveryWindow time.Duration
	// StragglerFactor: a rank whose compute time exceeds this multiple of the
	// median for StragglerSteps consecutive steps is reported. Default 2.
	StragglerFactor float64
	// StragglerSteps is the number of consecutive slow steps before a rank is
	// reported as a straggler. Default 20.
	StragglerSteps int
	// EvictStragglers makes a reported straggler leave the job (its Run
	// returns ErrEvicted) so the others go on without it; with Balance, a
	// straggler that balancing absorbed is reported but not evicted (see
	// StragglerInfo.Absorbed). Default false.
	EvictStragglers bool
	// Balance splits each global batch over the ranks by their measured
	// speed (samples, or the loader's Batch.Cost, per compute second,
	// smoothed and agreed on by every rank from the step's control
	// values), so that a rank twice as fast trains about twice the
	// samples and a slow worker no longer sets the pace of every step.
	// The global batch, which samples form it and the order of epochs
	// stay as they are: exactly-once holds, and in Deterministic mode
	// (whole micro-batches move) the parameters are the same bits as
	// without it. It needs a loader with the Weighter capability
	// (*dataloader.Loader); with other loaders it only measures (the
	// speeds in StepInfo). Damped and bounded: see balance.go. While on,
	// the straggler report follows each rank's compute time per sample,
	// not per step. Default true.
	Balance bool
	// GracePeriod bounds how long a preempted worker may take to commit,
	// checkpoint and leave after Preempt. Default 30 s.
	GracePeriod time.Duration
	// CheckpointTimeout bounds one durable checkpoint call: a
	// CheckpointStore.Save (asynchronous or synchronous), whose context
	// ends after it and which then fails with ErrCheckpoint naming the
	// step; a List or Load of the CheckpointStore at a round's start and a
	// Partition's Checkpoint, which past it fail the round with
	// ErrCheckpoint (a List or Load timed out is not taken for "no
	// checkpoint", which would start the job over, nor for an unreadable
	// one). It is also the most Run's end waits for a write still in
	// flight (and the one queued behind it, each within its own bound); a
	// preempted worker waits only what is left of GracePeriod. Past it, a
	// WARN names the step, and Run returns an error wrapping ErrCheckpoint
	// that names the step not written and how long it was waited for. A
	// store that hangs (an NFS mount gone, an object store that never
	// answers) so never keeps Run from returning. Default 10 min
	// (elastic.DefaultPhaseTimeout: a write marked busy for longer is a
	// hang for the rendezvous anyway); 0 means the default, so a Config
	// written before the field existed keeps working; not negative.
	CheckpointTimeout time.Duration
	// ShareCores, above 0, is the host's cores that the job's workers on
	// this host share: at the start of every round the trainer sets
	// runtime.GOMAXPROCS to ShareCores divided by the round's members on
	// this host (elastic.Member.Host), at least 1, so the workers left
	// after a shrink use the cores the others gave back, and a grown job
	// does not oversubscribe them. package launch sets it
	// (Worker.Configure) when it chose the workers' GOMAXPROCS and the
	// job's size can change (-autoscale, -capacity). Default 0: GOMAXPROCS
	// is left alone.
	ShareCores int
	// StepSpanEvery samples one step span every this many steps (0 = none).
	// Default 100.
	StepSpanEvery int
	// Deterministic makes training reproducible bit for bit whatever the
	// world size, the balancer's shares and what failed. It needs a
	// loader that cuts global batches into fixed micro-batches
	// (dataloader.Config.MicroBatch; a driver.MicroBatcher) and merges no
	// state across ranks (no driver.StateMerger); with another loader the
	// job trains in the float32 mode below, Run logs why once at its
	// start, and Result.Deterministic is false. The StepFunc runs once
	// per micro-batch (or a MicroStepFunc once per step, WithMicroStep),
	// and the micro-batches' gradients are summed in the global batch's
	// order, in float32, by the round's sync.OrderedReducer (the ring
	// Backend's Synchronizers have it), or, with a Synchronizer without
	// it (a Backend of your own), in exact fixed-point arithmetic as
	// float64; losses in fixed point; in one collective per step (see the
	// package doc). It costs a StepFunc call per micro-batch (smaller
	// matrix products) and a copy of each micro-batch's gradients; the
	// two paths give different bits. The promise holds among workers
	// whose step function gives the same bits for the same micro-batch:
	// the same build of the model's kernels on the same kind of CPU (an
	// OpenBLAS build differs between CPU kinds). LocalStepper strategies
	// (package localsgd: LocalSGD, DiLoCo) depend on the world size by
	// design; their runs are reproducible at one world size only.
	// Default true. False is the float32 mode: each rank sums its share
	// in one StepFunc call and the ring sums the ranks' sums in its own
	// order, whose last bits depend on the world size and the balancer's
	// shares.
	Deterministic bool
	// Autoscale is resource adjustment: every rank measures what a world
	// size is worth and the same policy decides a target world size, which
	// Autoscale.Platform enacts (see package autoscale and scaling.go). The
	// zero value is off. The world size stays within Elastic.MinWorkers
	// and MaxWorkers.
	Autoscale autoscale.Config
	// Elastic configures the rendezvous (min/max workers, last call, leases).
	Elastic elastic.Config
	// Sync configures the collective transport (secret, timeouts, TLS) of
	// the default Backend (ignored with WithBackend, whose Backend brings
	// its own).
	Sync sync.Config
}

// DefaultConfig returns a Config with the documented defaults; JobID must
// still be set.
func DefaultConfig() Config {
	return Config{
		Epochs:            1,
		CommitEvery:       1,
		ListenAddr:        "127.0.0.1:0",
		BucketBytes:       4 << 20,
		MaxRecoveries:     20,
		RecoveryWindow:    10 * time.Minute,
		StragglerFactor:   2,
		StragglerSteps:    20,
		Balance:           true,
		Deterministic:     true,
		GracePeriod:       30 * time.Second,
		CheckpointTimeout: elastic.DefaultPhaseTimeout,
		StepSpanEvery:     100,
		Elastic:           elastic.DefaultConfig(),
		Sync:              sync.DefaultConfig(),
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error { return c.validate(true) }

// validate is Validate; ring says whether the default Backend is used, so
// that ListenAddr and Sync must be valid too.
func (c Config) validate(ring bool) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.JobID == "":
		return bad("JobID is empty")
	case c.Epochs < 1:
		return bad("Epochs %d < 1", c.Epochs)
	case c.CommitEvery < 1:
		return bad("CommitEvery %d < 1", c.CommitEvery)
	case c.CheckpointEvery < 0:
		return bad("CheckpointEvery %d < 0", c.CheckpointEvery)
	case ring && c.ListenAddr == "":
		return bad("ListenAddr is empty")
	case c.BucketBytes < 4:
		return bad("BucketBytes %d < 4", c.BucketBytes)
	case c.MaxRecoveries < 0:
		return bad("MaxRecoveries %d < 0", c.MaxRecoveries)
	case c.RecoveryWindow <= 0:
		return bad("RecoveryWindow %v <= 0", c.RecoveryWindow)
	case c.StragglerFactor <= 1:
		return bad("StragglerFactor %v <= 1", c.StragglerFactor)
	case c.StragglerSteps < 1:
		return bad("StragglerSteps %d < 1", c.StragglerSteps)
	case c.GracePeriod <= 0:
		return bad("GracePeriod %v <= 0", c.GracePeriod)
	case c.CheckpointTimeout < 0:
		return bad("CheckpointTimeout %v < 0", c.CheckpointTimeout)
	case c.ShareCores < 0:
		return bad("ShareCores %d < 0", c.ShareCores)
	case c.StepSpanEvery < 0:
		return bad("StepSpanEvery %d < 0", c.StepSpanEvery)
	}
	if err := c.Autoscale.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	e := c.Elastic
	e.JobID = c.JobID
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if !ring {
		return nil
	}
	s := c.Sync
	s.JobID = c.JobID
	if err := s.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	// The peers wait for a marked phase up to sync's BusyTimeout; a
	// phase may last up to Elastic.PhaseTimeout before its own worker is
	// counted as hung. Below it, the peers would time out on a phase the
	// worker is still allowed to finish.
	if pt, bt := c.Elastic.PhaseTimeout, peersBusyTimeout(s); pt > 0 && bt < pt {
		return bad("Sync.BusyTimeout %v (how long peers wait for a marked phase) < Elastic.PhaseTimeout %v (how long a marked phase may last)", bt, pt)
	}
	return nil
}

// peersBusyTimeout is how long sync's collectives wait for a peer marked
// busy: Config.BusyTimeout, sync.DefaultBusyTimeout when 0, at least
// OpTimeout.
func peersBusyTimeout(s sync.Config) time.Duration {
	b := s.BusyTimeout
	if b == 0 {
		b = sync.DefaultBusyTimeout
	}
	return max(b, s.OpTimeout)
}
