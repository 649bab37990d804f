package trainer

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/trainer/autoscale"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/worker"
)

// Resource adjustment (Config.Autoscale): the I/O around the policy core
// of package autoscale. Every step, each rank puts its measurements into
// the step's control values (scalingControl: the seconds since it began
// its previous step, its allreduce seconds, the squared norms of its mean
// gradient and of the averaged one, its platform's capacity, whether it
// holds state no other rank holds); the allreduce the step runs anyway
// hands every rank every rank's values, and every rank feeds the same
// autoscale.Observation to its Policy, whose state came to every rank in
// the round's agreed commit. So every rank takes the same decision at the
// same step, without a message of its own. Rank 0 asks the Platform to
// resize; a rank the decision removes tells the Platform it leaves
// (Release) and leaves gracefully, as a preempted worker does, and its Run
// returns ErrReleased. The policy's state is part of every commit and
// checkpoint (the snapshot's "autoscale" section).
//
// The control values never touch the parameters: the norms are read from
// the gradients, and the control values travel in lanes of their own
// after the gradients (float32 lanes, or float64 values in deterministic
// mode).

// Releasable is an optional capability of a Partition: whether this
// rank's part of the partitioned state is held by another rank too, so
// that a scaling decision may remove this rank without losing state.
//
// Deprecated: use driver.Releasable, the same type.
type Releasable = driver.Releasable

// scalingTimeout bounds each call to the Platform.
const scalingTimeout = 2 * time.Second

// scalingNormEvery: the gradient norms (two passes over the gradients)
// are taken at every this-many-th step only, so that measuring costs well
// under 1 % of a step even for a small model; the noise scale is an
// average over many steps anyway.
const scalingNormEvery = 8

// normStep reports whether the step being trained takes the norms (the
// same answer on every rank: it depends on the global step only).
func (t *Trainer[B]) normStep() bool { return (t.step+1)%scalingNormEvery == 0 }

// scalingNorms are one step's numbers behind the noise scale and the
// step-time model, sent with the next step's control values.
type scalingNorms struct {
	gradSq, normSamples, bigSq, sync float64
}

// scaling is the loop's resource-adjustment state (Run's goroutine).
type scaling struct {
	policy    *autoscale.Policy // nil: off
	platform  worker.Platform
	capacity  int       // the platform's last answer; 0: no bound stated
	lastStart time.Time // when this worker began its previous step
	prev, cur scalingNorms
	keep      bool // this rank holds state no other holds (this round)
	attrs     metric.MeasurementOption
	warned    bool // a failed Capacity was logged at Warn once
}

// newScaling returns the resource adjustment of cfg (off when not Enabled).
func newScaling(cfg autoscale.Config) scaling {
	if !cfg.Enabled {
		return scaling{}
	}
	return scaling{policy: autoscale.New(cfg), platform: cfg.Platform}
}

// startScaling starts a round: the norms of the previous round's steps
// are not this round's, the partitions say whether this rank may leave,
// and the platform's capacity is read.
func (t *Trainer[B]) startScaling(ctx context.Context) {
	s := &t.sc
	if s.policy == nil {
		return
	}
	s.prev, s.cur = scalingNorms{}, scalingNorms{}
	s.keep = false
	for _, p := range t.parts {
		if r, ok := p.(Releasable); !ok || !r.Releasable() {
			s.keep = true
		}
	}
	t.readCapacity(ctx)
}

// readCapacity asks the platform how many workers it allows.
func (t *Trainer[B]) readCapacity(ctx context.Context) {
	s := &t.sc
	if s.platform == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, scalingTimeout)
	n, ok, err := s.platform.Capacity(cctx)
	cancel()
	switch {
	case err != nil:
		if !s.warned {
			t.log.Warn("autoscale: the platform's capacity cannot be read; keeping the last answer", "err", err)
			s.warned = true
		} else {
			t.log.Debug("autoscale: the platform's capacity cannot be read", "err", err)
		}
	case ok && n >= 1:
		s.capacity = n
	default:
		s.capacity = 0
	}
}

// scalingBefore takes a step's start: the seconds since the previous one.
func (t *Trainer[B]) scalingBefore(start time.Time) float64 {
	s := &t.sc
	if s.policy == nil {
		return 0
	}
	iv := 0.0
	if !s.lastStart.IsZero() {
		iv = start.Sub(s.lastStart).Seconds()
	}
	s.lastStart = start
	return iv
}

// scalingControl returns this rank's control values of a step whose
// interval scalingBefore measured.
func (t *Trainer[B]) scalingControl(interval float64) scalingControl {
	s := &t.sc
	if s.policy == nil {
		return scalingControl{}
	}
	return scalingControl{interval: interval, syncPrev: s.prev.sync, gradSq: s.prev.gradSq, normSamples: s.prev.normSamples,
		bigSq: s.prev.bigSq, capacity: float64(s.capacity), keep: s.keep}
}

// noteLocalGradients records the squared norm of this rank's mean
// gradient over its share of n samples, before the allreduce: the sum in
// the parameters' Grad buffers, or, in deterministic mode, the sum of its
// micro-batches' gradients.
func (t *Trainer[B]) noteLocalGradients(n int) {
	s := &t.sc
	if s.policy == nil {
		return
	}
	s.cur.gradSq, s.cur.normSamples = 0, float64(n)
	if n == 0 || !t.normStep() {
		return
	}
	var sq float64
	if t.det {
		if len(t.fixed) != t.nvalues {
			t.fixed = make([]float64, t.nvalues)
		}
		// t.fixed is free until reduceGrads fills it: the sum of this
		// rank's micro-batches, element by element.
		sum := t.fixed
		clear(sum)
		for k := range t.microCount {
			t.microGrads(k, t.microCount, func(off int, g []float32) {
				s := sum[off : off+len(g)]
				for i, x := range g {
					s[i] += float64(x)
				}
			})
		}
		for _, x := range sum {
			sq += x * x
		}
	} else {
		for _, p := range t.params {
			for _, g := range p.Grad {
				sq += float64(g) * float64(g)
			}
		}
	}
	s.cur.gradSq = sq / (float64(n) * float64(n))
}

// noteGlobalGradients records the squared norm of the mean gradient over
// the global batch of n samples, after the allreduce (the sum in the
// default mode, the mean in deterministic mode), and the step's sync
// seconds; then this step's norms become the ones the next step sends.
func (t *Trainer[B]) noteGlobalGradients(n float64, sync time.Duration) {
	s := &t.sc
	if s.policy == nil {
		return
	}
	var sq float64
	if !t.normStep() {
		// No norms at this step: the next one sends none (zeros, which
		// the estimator skips), only the sync time.
		s.prev = scalingNorms{sync: sync.Seconds()}
		return
	}
	for _, p := range t.params {
		for _, g := range p.Grad {
			sq += float64(g) * float64(g)
		}
	}
	if (!t.det || t.ordered) && n > 0 { // sums, not yet the mean
		sq /= n * n
	}
	s.cur.bigSq, s.cur.sync = sq, sync.Seconds()
	if math.IsNaN(sq) || math.IsInf(sq, 0) {
		s.cur.bigSq = 0
	}
	s.prev = s.cur
}

// observeScaling feeds an applied step's agreed outcome to the policy and
// enacts its decision: logged once (rank 0, Info), rank 0 resizes, the
// ranks it removes release themselves and leave gracefully. It returns the
// decision (nil: none) and the figures for StepInfo.
func (t *Trainer[B]) observeScaling(ctx context.Context, world elastic.World, o *stepOutcome) (*autoscale.Decision, autoscale.Figures) {
	s := &t.sc
	if s.policy == nil {
		return nil, autoscale.Figures{}
	}
	W := world.Size
	obs := autoscale.Observation{Step: t.step, Round: world.Round, WorldSize: W, GlobalBatch: o.samples,
		Interval: o.perInterval, Compute: o.perCompute, Sync: o.perSyncPrev,
		NormSamples: o.perNormSamples, GradSq: o.perGradSq, BigGradSq: o.perBigSq[0],
		Keep: o.perKeep, MinWorkers: t.cfg.Elastic.MinWorkers, MaxWorkers: t.cfg.Elastic.MaxWorkers}
	obs.Samples = make([]float64, W)
	for r, n := range o.perSamples {
		obs.Samples[r] = float64(n)
		obs.NormBatch += o.perNormSamples[r]
		if c := int(o.perCapacity[r]); c > 0 && (obs.Capacity == 0 || c < obs.Capacity) {
			obs.Capacity = c
		}
	}
	d := s.policy.Observe(obs)
	fig := s.policy.Figures()
	if t.tel.asGoodput != nil && (d != nil || t.step%int64(max(t.cfg.Autoscale.DecisionInterval, 1)) == 0 || t.step == 1) {
		if s.attrs == nil {
			s.attrs = t.tel.commonAttrs
		}
		t.tel.asGoodput.Record(ctx, fig.Goodput, s.attrs)
		t.tel.asThroughput.Record(ctx, fig.Throughput, s.attrs)
		t.tel.asEfficiency.Record(ctx, fig.Efficiency, s.attrs)
		t.tel.asRecommended.Record(ctx, int64(fig.Recommended), s.attrs)
	}
	interval := t.cfg.Autoscale.DecisionInterval
	if interval <= 0 {
		interval = autoscale.DefaultDecisionInterval
	}
	if d == nil {
		if t.step%int64(interval) == 0 {
			t.readCapacity(ctx)
		}
		return nil, fig
	}
	args := []any{"step", d.Step, "from", d.From, "to", d.To, "reason", d.Reason, "remove", d.Remove,
		"throughput", math.Round(d.Throughput*10) / 10, "predicted", math.Round(d.Predicted*10) / 10,
		"goodput", math.Round(d.Goodput*10) / 10, "efficiency", math.Round(d.Efficiency*1000) / 1000,
		"enacted", s.platform != nil, "detail", d.Detail}
	if world.Rank == 0 {
		t.log.Info("scaling decision", args...)
	} else {
		t.log.Debug("scaling decision", args...)
	}
	if s.platform != nil {
		if world.Rank == 0 {
			cctx, cancel := context.WithTimeout(ctx, scalingTimeout)
			if err := s.platform.Resize(cctx, d.To); err != nil {
				t.log.Warn("autoscale: the platform did not take the resize; training goes on", "to", d.To, "err", err)
			}
			cancel()
		}
		if slices.Contains(d.Remove, world.Rank) {
			cctx, cancel := context.WithTimeout(ctx, scalingTimeout)
			if err := s.platform.Release(cctx); err != nil {
				t.log.Warn("autoscale: the platform did not take the release; leaving anyway", "err", err)
			}
			cancel()
			t.log.Info("leaving the job by a scaling decision", "step", d.Step, "rank", world.Rank, "reason", d.Reason)
			// The preemption path: at the next step boundary every rank
			// commits, this one leaves and the others re-form.
			t.released.Store(true)
			t.Preempt()
		}
	}
	t.readCapacity(ctx)
	return d, fig
}

// scalingState appends the policy's state for a commit (nil when off).
func (t *Trainer[B]) scalingState(dst []byte) []byte {
	if t.sc.policy == nil {
		return dst[:0]
	}
	b, _ := t.sc.policy.MarshalBinary()
	return append(dst[:0], b...)
}

// installScaling makes the policy's state the one in an installed
// snapshot (a fresh one when it holds none), on every rank alike.
func (t *Trainer[B]) installScaling(state []byte) {
	s := &t.sc
	if s.policy == nil {
		return
	}
	if len(state) == 0 {
		s.policy = autoscale.New(t.cfg.Autoscale)
		return
	}
	if err := s.policy.UnmarshalBinary(state); err != nil {
		// Every rank decodes the same bytes and starts afresh alike.
		t.log.Warn("autoscale: the policy state in the commit is unreadable; starting afresh", "err", err)
		s.policy = autoscale.New(t.cfg.Autoscale)
	}
}

// errReleasedLeave is how Run reports a worker that left by decision.
func releasedError(saveErr error) error {
	if saveErr != nil {
		return errors.Join(ErrReleased, saveErr)
	}
	return ErrReleased
}
