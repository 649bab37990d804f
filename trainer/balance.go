package trainer

import (
	"context"
	"fmt"
	"math"
	"slices"

	"go.opentelemetry.io/otel/metric"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// Speed-weighted shares (Config.Balance). The deterministic core, the
// speed estimate and the decision of the split, is dataloader.Balancer
// (the one the leased loader runs too): the trainer feeds it each step's
// agreed per-rank work (the samples, or Batch.Cost, of its share) and
// compute seconds, from the step's control allreduce, on every rank in the
// same order, so every rank derives the same split without a message of
// its own. The split is handed to a loader that can cut global batches by
// weight (Weighter); it changes which rank trains which samples, never
// which samples form a step, so exactly-once holds and, in deterministic
// mode (whole micro-batches move; the fixed-point gradient sum is exact in
// any order), the parameters are the same bits as an unbalanced run's.
// This file holds what is the trainer's own: the loader's and the
// straggler tracker's side, logs and metrics.

// Weighter is the optional capability of a loader (a Loader or a
// StatefulLoader) that can split each global batch over the ranks by
// weight; *dataloader.Loader has it (SetWeights). With Config.Balance the
// trainer calls SetWeights from its loop goroutine, on every rank with
// the same weights at the same step boundary (after Stepped, before the
// next Next): weights[r] is rank r's share of the global batch relative
// to the others (its smoothed speed, in samples or cost units per
// second); nil returns to equal shares. The loader must cut every
// following global batch, the same samples in the same order, into
// contiguous runs by those weights (and whole micro-batches when it has
// them), in the same way on every rank. A new round starts from equal
// shares: the trainer calls SetWeights again once it has measured the
// round's ranks. An error fails the round.
//
// Deprecated: use driver.Weighter, the same type.
type Weighter = driver.Weighter

// absorbedFactor: a straggler is absorbed by balancing when, at the
// smoothed speeds, its share's time is within this multiple of the median
// rank's (the steps no longer wait on it).
const absorbedFactor = 1.25

// perUnit fills dst with each rank's compute seconds per unit of work
// (0 for a rank without work), the slowness the straggler tracker follows
// while balancing is on: a slow rank's compute time per step is what
// balancing evens out, its time per sample is not.
func perUnit(dst, work, compute []float64) []float64 {
	dst = dst[:0]
	for r, c := range compute {
		x := 0.0
		if r < len(work) && work[r] > 0 {
			x = c / work[r]
		}
		dst = append(dst, x)
	}
	return dst
}

// absorbed reports whether balancing absorbs rank r's slowness: at the
// smoothed speeds, the share it has now takes it within absorbedFactor of
// the median rank's time (work[i]/speeds[i]), so the steps no longer wait
// on it (its share shrank to fit). Smoothed, so that one noisy step does
// not decide an eviction. A straggler that is not absorbed (its share is
// at the floor, or its time does not shrink with its share) slows every
// step: eviction (Config.EvictStragglers) is then the better cure.
func absorbed(work, speeds []float64, r int, scratch []float64) bool {
	scratch = scratch[:0]
	for i, w := range work {
		x := 0.0
		if i < len(speeds) && speeds[i] > 0 {
			x = w / speeds[i]
		}
		scratch = append(scratch, x)
	}
	mine := scratch[r]
	slices.Sort(scratch)
	med := scratch[len(scratch)/2]
	return med > 0 && mine <= absorbedFactor*med
}

// shareWork is a batch's work for balancing: its Cost, or its samples
// when the loader sets no cost.
func shareWork[B any](b dataloader.Batch[B]) float64 {
	if b.Cost > 0 {
		return b.Cost
	}
	return float64(len(b.Indices))
}

// startBalance starts a round's balancing from equal shares.
func (t *Trainer[B]) startBalance() error {
	if t.weighter == nil {
		return nil
	}
	if err := t.weighter.SetWeights(nil); err != nil {
		return fmt.Errorf("trainer: loader: set weights: %w", err)
	}
	return nil
}

// rebalance runs the balancer on an applied step's agreed outcome and
// hands a new split to the loader: at the same step boundary on every
// rank, before the next Next. It records this rank's share and speed.
func (t *Trainer[B]) rebalance(ctx context.Context, world elastic.World, o *stepOutcome) error {
	w := t.bal.Observe(o.perWork, o.perCompute)
	r := world.Rank
	if kept := t.bal.Kept(); kept != nil && r == 0 && sharesMoved(t.balLogged, kept) {
		// A split that paid its trial, and moved: what an operator wants
		// to read. Moves on trial and their returns stay at DEBUG.
		t.balLogged = kept
		t.log.Info("balanced shares", "step", t.step, "fractions", roundAll(kept, 3), "speeds", roundAll(t.bal.Speeds(), 1))
	}
	if t.tel.share != nil {
		if t.balAttrs == nil || t.balRank != r {
			t.balAttrs, t.balRank = metric.WithAttributes(t.tel.jobAttr, AttrRank.Int(r)), r
		}
		t.tel.share.Record(ctx, int64(o.perSamples[r]), t.balAttrs)
		t.tel.speed.Record(ctx, t.bal.Speed(r), t.balAttrs)
	}
	if w == nil || t.weighter == nil {
		return nil
	}
	if err := t.weighter.SetWeights(w); err != nil {
		return fmt.Errorf("trainer: loader: set weights: %w", err)
	}
	t.log.Debug("trying shares", "step", t.step, "fractions", roundAll(w, 3), "speeds", roundAll(t.bal.Speeds(), 1))
	return nil
}

// shareLogMove is how far one rank's share of the global batch must move
// (a fraction of the batch: 0.05 is five percentage points) from the split
// rank 0 last logged at INFO for a split that paid its trial to be logged
// ("balanced shares", INFO, rank 0 only). Every move tried and every
// return from one that did not pay is logged at DEBUG ("trying shares",
// every rank): on a noisy machine those come every few steps. A kept split
// of another world size is always logged.
const shareLogMove = 0.05

// sharesMoved reports whether split w differs from the split last logged
// at INFO (nil: none yet) by more than shareLogMove in some rank's share,
// or in its world size.
func sharesMoved(last, w []float64) bool {
	if len(last) != len(w) {
		return true
	}
	for i := range w {
		if math.Abs(w[i]-last[i]) > shareLogMove {
			return true
		}
	}
	return false
}

// observeStragglers runs the straggler tracker on an applied step and
// returns the rank to evict, or -1. Without balancing it follows each
// rank's compute time; with it, the compute time per unit of work (the
// rank's slowness, which balancing does not change), and a reported rank
// whose compute time balancing has evened out is absorbed: reported, never
// evicted.
func (t *Trainer[B]) observeStragglers(ctx context.Context, world elastic.World, o *stepOutcome) int {
	if !t.cfg.Balance {
		return t.strag.observe(o.perCompute, t.cfg.EvictStragglers, func(r int, ratio float64) {
			t.straggler(ctx, world, r, ratio, false, false)
		})
	}
	per := perUnit(t.scratch, o.perWork, o.perCompute)
	t.scratch = per
	evict := -1
	var sorted []float64
	// The tracker runs before the balancer folds this step in: the
	// speeds it judges absorption by are those the split was made from.
	t.strag.observe(per, false, func(r int, ratio float64) {
		ab := absorbed(o.perWork, t.bal.Speeds(), r, sorted)
		if !ab && t.bal.Trying() {
			// Balancing has not had its chance yet (a young round, a move
			// on trial): report it, and judge again StragglerSteps later.
			t.strag.slow[r] = 0
			t.straggler(ctx, world, r, ratio, false, true)
			return
		}
		t.straggler(ctx, world, r, ratio, ab, false)
		if t.cfg.EvictStragglers && !ab && evict < 0 {
			evict = r
		}
	})
	return evict
}

// roundAll rounds xs to digits decimals, for logs.
func roundAll(xs []float64, digits int) []float64 {
	p := math.Pow(10, float64(digits))
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = math.Round(x*p) / p
	}
	return out
}
