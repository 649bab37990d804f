package dataloader

import (
	"math"
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
// It is the split of leased loaders with LeasedConfig.Balance, and any
// loader can use it with weights from Speeds.
func WeightedShares(global int, weights []float64) []int {
	n := len(weights)
	if n == 0 || global < 0 {
		return nil
	}
	w := sanitiseWeights(weights) // relative to the largest: no sum or product overflows
	total := 0.0
	for _, x := range w {
		total += x
	}
	floor := max(1, global/(8*n))
	if floor*n > global {
		floor = global / n
	}
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

// Speeds estimates each rank's speed in samples per second of its own
// compute, from the agreed outcomes of the steps of a round: an
// exponential moving average (weight 0.3 for the newest step) of
// Samples/ComputeSeconds per rank, starting at 1 and never below 1. A rank
// that trained nothing in a step keeps its estimate. Every rank that
// observes the same outcomes in the same order holds the same values, so
// shares computed from them (WeightedShares) agree between ranks without
// a message. The zero value has no ranks; use NewSpeeds. Not safe for
// concurrent use.
type Speeds struct {
	v []float64
}

// NewSpeeds returns the estimate for a round of size ranks, every rank at
// 1 sample/s (equal shares until a step is observed).
func NewSpeeds(size int) Speeds {
	v := make([]float64, max(size, 0))
	for i := range v {
		v[i] = 1
	}
	return Speeds{v: v}
}

// Observe folds one step's per-rank samples and compute seconds into the
// estimate. Slices shorter than the round leave the missing ranks alone;
// negative, zero or non-finite entries are ignored.
func (s *Speeds) Observe(samples []int, seconds []float64) {
	for r := range s.v {
		if r >= len(samples) || r >= len(seconds) {
			break
		}
		n, t := float64(samples[r]), seconds[r]
		if n <= 0 || !(t > 0) || math.IsInf(t, 1) {
			continue
		}
		x := float64(0.7*s.v[r]) + float64(0.3*(n/t))
		if x < 1 {
			x = 1
		}
		if !math.IsInf(x, 1) {
			s.v[r] = x
		}
	}
}

// Values returns the current estimate, by rank (a copy).
func (s Speeds) Values() []float64 { return append([]float64(nil), s.v...) }

// Shares returns WeightedShares(global, the current estimate).
func (s Speeds) Shares(global int) []int { return WeightedShares(global, s.v) }

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
	wsum := 0.0
	for _, x := range w {
		wsum += x
	}
	floor := max(1, units/(8*n))
	if floor*n > units {
		floor = units / n
	}
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
