package dataloader

import (
	"math"
	"slices"
	"sort"
)

// WeightedShares splits a global batch of global samples over
// len(weights) ranks in proportion to their weights (samples per second,
// say) and returns each rank's number of samples; they sum to global.
// Every rank gets a floor of global/(8n) samples (at least 1 when global >=
// n), so a slow rank still progresses and a rank holding the last shard of
// an epoch always finishes it; the rest is split in proportion to the
// weights by largest remainder, ties to the lower rank. Weights that are
// not finite and positive count as the smallest positive weight given (or
// 1 when there is none). The result is a pure function of its arguments:
// every rank that computes it from the same agreed weights gets the same
// split. It returns nil for global < 0 or no weights.
//
// It is the cut of leased loaders with LeasedConfig.Balance, and any
// loader can use it with a Balancer's fractions as weights.
func WeightedShares(global int, weights []float64) []int {
	n := len(weights)
	if n == 0 || global < 0 {
		return nil
	}
	w := sanitiseWeights(weights) // relative to the largest: no sum or product overflows
	total := sumFloats(w)
	floor := shareFloor(global, n)
	rest := global - floor*n
	out := make([]int, n)
	frac := make([]float64, n)
	sum := 0
	for r := range w {
		x := float64(rest) * float64(w[r]/total) // explicit conversions: never fused, the same on every platform
		f := math.Floor(x)
		out[r] = floor + int(f)
		frac[r] = x - f
		sum += out[r]
	}
	for sum > global { // rounding pushed the floors over (not expected; kept safe)
		for r := n - 1; r >= 0 && sum > global; r-- {
			if out[r] > floor {
				out[r]--
				sum--
			}
		}
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	for i := 1; i < n; i++ { // insertion sort: by remainder descending, then rank
		for j := i; j > 0 && (frac[order[j]] > frac[order[j-1]] || (frac[order[j]] == frac[order[j-1]] && order[j] < order[j-1])); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	for i := 0; sum < global; i++ {
		out[order[i%n]]++
		sum++
	}
	return out
}

// CostShares splits the units (samples, or micro-batches) of a global
// batch, whose costs in order are costs, over len(weights) ranks in
// contiguous runs, so that each rank's cost is in proportion to its
// weight (its speed in cost units per second, say), and returns each
// rank's number of units; they sum to len(costs). The runs are cut where
// the running cost is nearest to each rank's running target (ties to the
// lower cut), and every rank gets at least the floor of WeightedShares,
// so a slow rank still progresses. Weights are sanitised as by
// WeightedShares; costs that are not finite and non-negative count as 0.
// When every cost is 0 it is WeightedShares(len(costs), weights). The
// result is a pure function of its arguments. It returns nil for no
// weights.
//
// With equal weights it gives ranks equal cost rather than equal counts,
// for data whose samples cost different amounts (sequences of different
// lengths); see Config.Cost.
func CostShares(costs []float64, weights []float64) []int {
	n, units := len(weights), len(costs)
	if n == 0 {
		return nil
	}
	w := sanitiseWeights(weights)
	prefix := make([]float64, units+1)
	for k, c := range costs {
		if !(c >= 0) || math.IsInf(c, 1) {
			c = 0
		}
		prefix[k+1] = prefix[k] + c
	}
	total := prefix[units]
	if !(total > 0) || math.IsInf(total, 1) {
		return WeightedShares(units, weights)
	}
	wsum := sumFloats(w)
	floor := shareFloor(units, n)
	out := make([]int, n)
	cut, acc := 0, 0.0
	for r := 0; r < n-1; r++ {
		acc += w[r]
		target := float64(total * float64(acc/wsum)) // explicit: never fused
		lo, hi := cut+floor, units-floor*(n-1-r)
		// The first cut at or past the target, then the nearer of it and
		// the one before.
		k := lo + sort.SearchFloat64s(prefix[lo:hi+1], target)
		if k > hi {
			k = hi
		}
		if k > lo && target-prefix[k-1] <= prefix[k]-target {
			k--
		}
		out[r] = k - cut
		cut = k
	}
	out[n-1] = units - cut
	return out
}

// shareFloor is the least share of units units over n ranks that
// WeightedShares and CostShares give every rank: units/(8n), at least 1
// when units >= n.
func shareFloor(units, n int) int {
	floor := max(1, units/(8*n))
	if floor*n > units {
		floor = units / n
	}
	return floor
}

// sumFloats returns the sum of xs, in order.
func sumFloats(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// sanitiseWeights returns weights scaled so the largest is 1, with those
// that are not finite and positive replaced as WeightedShares says.
func sanitiseWeights(weights []float64) []float64 {
	w := make([]float64, len(weights))
	smallest := math.Inf(1)
	for _, x := range weights {
		if x > 0 && !math.IsInf(x, 1) && x < smallest {
			smallest = x
		}
	}
	if math.IsInf(smallest, 1) {
		smallest = 1
	}
	largest := 0.0
	for i, x := range weights {
		if !(x > 0) || math.IsInf(x, 1) {
			x = smallest
		}
		w[i] = x
		largest = max(largest, x)
	}
	for i := range w {
		w[i] /= largest
	}
	return w
}

// Balancer is the module's speed-weighted split with trial moves, the one
// the trainer's Config.Balance and LeasedConfig.Balance run. In a synchronous
// job every step waits for the slowest rank; when ranks differ in speed (a
// slower or shared host, a noisy neighbour, samples that cost more),
// giving each rank a share of the global batch in proportion to its speed
// makes every rank finish at about the same time.
//
// Observe folds each step's agreed per-rank work (samples, or Batch.Cost
// units) and compute seconds into smoothed speeds and decides the split of
// the next global batch, as fractions by rank; a loader cuts it with
// WeightedShares (or CostShares). Every rank that runs it on the same
// agreed values in the same order derives the same split, bit for bit,
// without a message of its own.
//
// Speeds are an exponential moving average of each rank's work per
// second: the first step of a round is not measured (it compiles graphs
// for new batch sizes, warms caches), then the n-th observation of a rank
// has weight max(1/n, 0.1), a running mean at first, then an average over
// about the last 20 steps. The target split gives each rank a fraction of
// the global batch in proportion to its speed, so that every rank would
// compute for the same time. The split only moves when that pays at the
// smoothed speeds: when the target would cut the slowest rank's compute
// time by more than 10%; and a move shifts no rank's fraction by more than
// 0.15. Every move is a trial: over the 10 steps after it (less the first
// two, which may compile graphs for new batch sizes), the step's slowest
// compute time must fall by at least 5% against the steps before it, or
// the split goes back and no move is tried for a hold-off that doubles
// with each failed trial (from 50 steps up to 1600). So noise does not
// make shares oscillate, and a cost that no share changes (a step
// function's fixed set-up, a loaded host's scheduling, which make a larger
// share look faster per sample) does not make them drift. The split's cut
// gives every rank a floor (WeightedShares), so a slow rank still
// progresses.
//
// The zero value has no ranks: call Reset at the start of every round. Not
// safe for concurrent use (the training loop's goroutine owns it).
type Balancer struct {
	est    speedEstimate // smoothed work per second by rank; 0: not observed yet
	frac   []float64     // the applied fractions of the global batch, by rank
	prev   []float64     // the fractions before the move on trial
	target []float64     // scratch
	steps  int           // steps observed in this round

	trial     int     // steps since the move on trial; 0: none
	before    float64 // mean slowest compute time before it
	sum       float64 // of the slowest compute times since the last move (or trial's measured steps)
	count     int
	hold      int  // steps left before a move may be tried
	holdNext  int  // the next failed trial's hold-off
	unsettled bool // the last evaluation found a move worth making
	kept      bool // the last Observe ended a move's trial that paid: the split stays (Kept)
}

// The Balancer's parameters (see its doc).
const (
	balanceAlpha   = 0.1  // the newest observation's weight, at least
	balanceMinGain = 0.1  // of the slowest rank's compute time, for a move
	balanceMaxStep = 0.15 // the largest change of a rank's fraction in one move
	balanceTrial   = 10   // steps a move is on trial
	balanceBefore  = 5    // steps measured before a move, at least
	balanceHold    = 50   // steps without a move after a failed trial, at first
	balanceHoldMax = 1600 // ... at the most
)

// Reset starts a round of ranks ranks: no speed known, equal shares.
func (b *Balancer) Reset(ranks int) {
	ranks = max(ranks, 0)
	b.est.reset(ranks, balanceAlpha, 0)
	if len(b.frac) != ranks {
		b.frac, b.target, b.prev = make([]float64, ranks), make([]float64, ranks), make([]float64, ranks)
	}
	b.steps, b.trial, b.before, b.sum, b.count, b.hold, b.holdNext = 0, 0, 0, 0, 0, 0, balanceHold
	b.unsettled, b.kept = false, false
	for r := range b.frac {
		b.frac[r] = 1 / float64(ranks)
	}
}

// Observe folds one applied step's agreed per-rank work (samples or cost
// units of each rank's share, by rank) and compute seconds into the
// speeds, and returns the weights of the next global batch's split when it
// changes (a new slice of fractions summing to 1: a move, or the return
// from a failed one), or nil when the split stays. Ranks with no work or
// no compute time at this step keep their speed; while some rank has never
// been observed in the round, the split stays. Slices shorter than the
// round are ignored (nil).
func (b *Balancer) Observe(work, compute []float64) []float64 {
	W := len(b.frac)
	if len(work) < W || len(compute) < W {
		return nil
	}
	if b.steps++; b.steps == 1 {
		return nil // the round's first step: warm-up, not a measurement
	}
	slowestNow := 0.0
	for r := range W {
		slowestNow = max(slowestNow, compute[r])
		b.est.fold(r, work[r], compute[r])
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
	speeds := b.est.v
	sum := 0.0
	for _, v := range speeds {
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
	for r, v := range speeds {
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

// Kept returns the split whose trial paid at the last Observe (a copy of
// the fractions), or nil; it reports each kept split once. It is what an
// operator wants to read: moves on trial may still go back.
func (b *Balancer) Kept() []float64 {
	if !b.kept {
		return nil
	}
	b.kept = false
	return slices.Clone(b.frac)
}

// Speeds returns the smoothed speeds by rank, in work units per second (a
// copy; 0: not observed in this round).
func (b *Balancer) Speeds() []float64 { return slices.Clone(b.est.v) }

// Speed returns rank r's smoothed speed (0: not observed in this round, or
// r out of range).
func (b *Balancer) Speed(r int) float64 {
	if r < 0 || r >= len(b.est.v) {
		return 0
	}
	return b.est.v[r]
}

// Trying reports whether the split may still move without a new
// measurement of its own to wait for: a move is on trial, the round is too
// young for a first move, or the last step asked for another move. The
// trainer's straggler tracker gives balancing that chance before it calls
// a rank a straggler that balancing cannot absorb.
func (b *Balancer) Trying() bool {
	return b.trial > 0 || b.steps <= balanceBefore+1 || (b.unsettled && b.hold == 0)
}

// speedEstimate is the module's one per-rank speed estimate (Balancer's
// and Speeds'): an exponential moving average of work per second by
// rank. Without a prior, a rank starts unknown (0) and its n-th
// observation has weight max(1/n, alpha); with a prior p > 0, every rank
// starts at p, each observation has weight alpha and the estimate never
// falls below p.
type speedEstimate struct {
	v     []float64 // by rank
	seen  []int     // observations by rank
	alpha float64
	prior float64
}

// reset starts ranks ranks over, all at the prior.
func (e *speedEstimate) reset(ranks int, alpha, prior float64) {
	if len(e.v) != ranks {
		e.v, e.seen = make([]float64, ranks), make([]int, ranks)
	}
	clear(e.seen)
	for r := range e.v {
		e.v[r] = prior
	}
	e.alpha, e.prior = alpha, prior
}

// fold folds rank r's work units done in seconds into its estimate. Work
// or seconds that are not finite and positive, or whose quotient is not,
// are no measurement; nor is an estimate that would become infinite.
func (e *speedEstimate) fold(r int, work, seconds float64) {
	if !(work > 0) || !(seconds > 0) || math.IsInf(work, 0) || math.IsInf(seconds, 0) {
		return
	}
	v := work / seconds
	if !(v > 0) || math.IsInf(v, 0) {
		return
	}
	e.seen[r]++
	a := e.alpha
	if e.prior == 0 {
		a = max(1/float64(e.seen[r]), e.alpha)
	}
	x := float64(a*v) + float64((1-a)*e.v[r]) // explicit conversions: never fused
	if x < e.prior {
		x = e.prior
	}
	if !math.IsInf(x, 0) {
		e.v[r] = x
	}
}

// Speeds estimates each rank's speed in samples per second of its own
// compute, from the agreed outcomes of the steps of a round: an
// exponential moving average (weight 0.3 for the newest step) of
// Samples/ComputeSeconds per rank, starting at 1 and never below 1. A rank
// that trained nothing in a step keeps its estimate. Every rank that
// observes the same outcomes in the same order holds the same values, so
// shares computed from them (WeightedShares) agree between ranks without
// a message. It is the Balancer's speed estimate (one implementation)
// with a prior of 1 sample/s and a fixed weight; the shares follow it at
// every step, where a Balancer skips a round's first step and moves the
// split by bounded trials. The zero value has no ranks; use NewSpeeds. Not
// safe for concurrent use.
//
// Deprecated: use a Balancer, the module's one speed-weighted split (the
// trainer's Config.Balance and LeasedConfig.Balance run it), and cut its
// fractions with WeightedShares.
type Speeds struct {
	e speedEstimate
}

// NewSpeeds returns the estimate for a round of size ranks, every rank at
// 1 sample/s (equal shares until a step is observed).
//
// Deprecated: use a Balancer (see Speeds).
func NewSpeeds(size int) Speeds {
	var s Speeds
	s.e.reset(max(size, 0), 0.3, 1)
	return s
}

// Observe folds one step's per-rank samples and compute seconds into the
// estimate. Slices shorter than the round leave the missing ranks alone;
// negative, zero or non-finite entries are ignored.
func (s *Speeds) Observe(samples []int, seconds []float64) {
	for r := range min(len(s.e.v), len(samples), len(seconds)) {
		s.e.fold(r, float64(samples[r]), seconds[r])
	}
}

// Values returns the current estimate, by rank (a copy).
func (s Speeds) Values() []float64 { return append([]float64(nil), s.e.v...) }

// Shares returns WeightedShares(global, the current estimate).
func (s Speeds) Shares(global int) []int { return WeightedShares(global, s.e.v) }
