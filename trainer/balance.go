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

// Speed-weighted shares (Config.Balance). In a synchronous job every step
// waits for the slowest rank; when ranks differ in speed (a slower or
// shared host, a noisy neighbour, samples that cost more), giving each
// rank a share of the global batch in proportion to its speed makes every
// rank finish at about the same time. This file holds the deterministic
// core of that: the balancer folds each step's agreed per-rank work (the
// samples, or Batch.Cost, of its share) and compute seconds, from the
// step's control allreduce, into smoothed speeds, and decides the split
// of the next global batch. Every rank runs it on the same reduced values
// in the same order, so every rank derives the same split without a
// message of its own. The split is handed to a loader that can cut global
// batches by weight (Weighter); it changes which rank trains which
// samples, never which samples form a step, so exactly-once holds and, in
// deterministic mode (whole micro-batches move; the fixed-point gradient
// sum is exact in any order), the parameters are the same bits as an
// unbalanced run's.

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

// Balancing parameters. Speeds are an exponential moving average of each
// rank's work per second: the first step of a round is not measured (it
// compiles graphs for new batch sizes, warms caches), then the n-th
// observation of a rank has weight max(1/n, balanceAlpha), a running mean
// at first, then an average over about the last 2/balanceAlpha steps. The
// target split gives each rank a fraction of the global batch in
// proportion to its speed, so that every rank would compute for the same
// time. The split is only moved when that pays, at the smoothed speeds:
// when the target would cut the slowest rank's compute time by more than
// balanceMinGain; and a move shifts no rank's fraction by more than
// balanceMaxStep. Every move is a trial: over the balanceTrial steps
// after it (less the first two, which may compile graphs for new batch
// sizes), the step's slowest compute time must fall by at least half of
// balanceMinGain against the steps before it, or the split goes back and
// no move is tried for a hold-off that doubles with each failed trial
// (from balanceHold steps up to balanceHoldMax). So noise does not make
// shares oscillate, and a cost that no share changes (a step function's
// fixed set-up, a loaded host's scheduling, which make a larger share look
// faster per sample) does not make them drift. The loader's cut gives
// every rank a floor (dataloader.WeightedShares), so a slow rank still
// progresses.
const (
	balanceAlpha   = 0.1
	balanceMinGain = 0.1
	balanceMaxStep = 0.15
	balanceTrial   = 10
	balanceBefore  = 5 // steps measured before a move, at least
	balanceHold    = 50
	balanceHoldMax = 1600
	// absorbedFactor: a straggler is absorbed by balancing when, at the
	// smoothed speeds, its share's time is within this multiple of the
	// median rank's (the steps no longer wait on it).
	absorbedFactor = 1.25
)

// balancer is the deterministic core of speed-weighted shares for one
// round of W ranks. Not safe for concurrent use (the loop goroutine's).
type balancer struct {
	speeds []float64 // smoothed work per second by rank; 0: not observed yet
	seen   []int     // observations by rank in this round
	frac   []float64 // the applied fractions of the global batch, by rank
	prev   []float64 // the fractions before the move on trial
	target []float64 // scratch
	steps  int       // steps observed in this round

	trial     int     // steps since the move on trial; 0: none
	before    float64 // mean slowest compute time before it
	sum       float64 // of the slowest compute times since the last move (or trial's measured steps)
	count     int
	hold      int  // steps left before a move may be tried
	holdNext  int  // the next failed trial's hold-off
	unsettled bool // the last evaluation found a move worth making
	kept      bool // the last observe ended a move's trial that paid: the split stays (takeKept)
}

// takeKept returns the split whose trial paid at the last observe (a copy),
// or nil; it reports each kept split once.
func (b *balancer) takeKept() []float64 {
	if !b.kept {
		return nil
	}
	b.kept = false
	return slices.Clone(b.frac)
}

// reset starts a round of W ranks: no speed known, equal shares.
func (b *balancer) reset(W int) {
	if len(b.speeds) != W {
		b.speeds, b.frac, b.target = make([]float64, W), make([]float64, W), make([]float64, W)
		b.seen, b.prev = make([]int, W), make([]float64, W)
	}
	clear(b.speeds)
	clear(b.seen)
	b.steps, b.trial, b.before, b.sum, b.count, b.hold, b.holdNext = 0, 0, 0, 0, 0, 0, balanceHold
	b.unsettled, b.kept = false, false
	for r := range b.frac {
		b.frac[r] = 1 / float64(W)
	}
}

// observe folds one applied step's agreed per-rank work (samples or cost
// units of each rank's share) and compute seconds into the speeds, and
// returns the weights of the next global batch's split when it changes
// (a new slice: a move, or the return from a failed one), or nil when the
// split stays. Ranks with no work or no compute time at this step keep
// their speed; while some rank has never been observed in the round, the
// split stays.
func (b *balancer) observe(work, compute []float64) []float64 {
	W := len(b.speeds)
	if len(work) < W || len(compute) < W {
		return nil
	}
	if b.steps++; b.steps == 1 {
		return nil // the round's first step: warm-up, not a measurement
	}
	slowestNow := 0.0
	for r := range W {
		n, s := work[r], compute[r]
		slowestNow = max(slowestNow, s)
		if !(n > 0) || !(s > 0) || math.IsInf(n, 0) || math.IsInf(s, 0) {
			continue
		}
		v := n / s
		if !(v > 0) || math.IsInf(v, 0) {
			continue
		}
		b.seen[r]++
		a := max(1/float64(b.seen[r]), balanceAlpha)
		b.speeds[r] = float64(a*v) + float64((1-a)*b.speeds[r]) // explicit: never fused
	}
	if b.trial > 0 {
		b.trial++
		if b.trial > 3 { // the first two steps after a move may compile graphs
			b.sum += slowestNow
			b.count++
		}
		if b.trial <= balanceTrial {
			return nil
		}
		after := b.sum / float64(b.count)
		b.trial, b.sum, b.count = 0, 0, 0
		if !(after < float64(b.before*(1-balanceMinGain/2))) {
			copy(b.frac, b.prev) // it did not pay: back, and wait
			b.hold, b.holdNext = b.holdNext, min(2*b.holdNext, balanceHoldMax)
			return slices.Clone(b.frac)
		}
		b.holdNext = balanceHold
		b.kept = true
	}
	b.sum += slowestNow
	b.count++
	if b.hold > 0 {
		b.hold--
		return nil
	}
	sum := 0.0
	for _, v := range b.speeds {
		if v == 0 {
			return nil
		}
		sum += v
	}
	if b.count < balanceBefore {
		return nil
	}
	// Compute times in units of the global batch's: now, and at the
	// target (where they are all 1/sum).
	slowest := 0.0
	for r, v := range b.speeds {
		b.target[r] = v / sum
		slowest = max(slowest, b.frac[r]/v)
	}
	b.unsettled = float64(slowest*sum) > 1+balanceMinGain
	if !b.unsettled {
		return nil
	}
	// The whole move is scaled down to the bound, so the fractions still
	// add up to 1.
	far := 0.0
	for r := range b.frac {
		far = max(far, math.Abs(b.target[r]-b.frac[r]))
	}
	step := 1.0
	if far > balanceMaxStep {
		step = balanceMaxStep / far
	}
	copy(b.prev, b.frac)
	for r := range b.frac {
		b.frac[r] += float64(step * (b.target[r] - b.frac[r]))
	}
	b.before = b.sum / float64(b.count)
	b.trial, b.sum, b.count = 1, 0, 0
	return slices.Clone(b.frac)
}

// speedsCopy returns the smoothed speeds by rank (a copy; 0: not observed).
func (b *balancer) speedsCopy() []float64 { return slices.Clone(b.speeds) }

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

// trying reports whether the balancer may still absorb a straggler it
// has not absorbed yet: a move is on trial, the round is too young for a
// first move, or the last step asked for another move.
func (b *balancer) trying() bool {
	return b.trial > 0 || b.steps <= balanceBefore+1 || (b.unsettled && b.hold == 0)
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
	w := t.bal.observe(o.perWork, o.perCompute)
	r := world.Rank
	if kept := t.bal.takeKept(); kept != nil && r == 0 && sharesMoved(t.balLogged, kept) {
		// A split that paid its trial, and moved: what an operator wants
		// to read. Moves on trial and their returns stay at DEBUG.
		t.balLogged = kept
		t.log.Info("balanced shares", "step", t.step, "fractions", roundAll(kept, 3), "speeds", roundAll(t.bal.speeds, 1))
	}
	if t.tel.share != nil {
		if t.balAttrs == nil || t.balRank != r {
			t.balAttrs, t.balRank = metric.WithAttributes(t.tel.jobAttr, AttrRank.Int(r)), r
		}
		t.tel.share.Record(ctx, int64(o.perSamples[r]), t.balAttrs)
		t.tel.speed.Record(ctx, t.bal.speeds[r], t.balAttrs)
	}
	if w == nil || t.weighter == nil {
		return nil
	}
	if err := t.weighter.SetWeights(w); err != nil {
		return fmt.Errorf("trainer: loader: set weights: %w", err)
	}
	t.log.Debug("trying shares", "step", t.step, "fractions", roundAll(w, 3), "speeds", roundAll(t.bal.speeds, 1))
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
		ab := absorbed(o.perWork, t.bal.speeds, r, sorted)
		if !ab && t.bal.trying() {
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
