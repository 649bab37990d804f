package autoscale

import "math"

// The measurement side of the policy: what a world size is worth.
//
// # Step-time model
//
// The seconds of one step at world size w with a global batch of B
// samples are modelled as
//
//	T(w) = other + compute(w) + sync(w)
//	compute(w) = α + β·B/w              (the slowest rank's StepFunc time,
//	                                     linear in the per-replica batch)
//	sync(w)    = 0 for w = 1,
//	             γ + δ·(w-2) for w ≥ 2  (the gradient allreduce, growing
//	                                     with the replica count)
//
// which is the throughput model of Pollux / AdaptDL (Qiao et al., "Pollux:
// Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning",
// OSDI 2021, section 3.2) without its overlap exponent: this loop runs the
// allreduce after the StepFunc, so the two add. other is what a step
// spends outside both (data, optimizer, commit), taken as the same at
// every size. α, β are fitted by least squares to the per-size means of
// the slowest rank's compute time (with one size measured, α = 0: compute
// proportional to the share); γ, δ to the per-size means of the smallest
// sync time over the ranks (the slowest rank's, which waits on nobody);
// with one size of two or more measured, δ = 0; with none, sync is
// unknown and taken as 0 (optimistic: a probe then measures it). All
// parameters are kept ≥ 0. Measured sizes are judged by their measured
// step time; the model only predicts sizes not measured yet.
//
// # Statistical efficiency
//
// The gradient noise scale B_noise = tr(Σ)/|G|² (McCandlish et al., "An
// Empirical Model of Large-Batch Training", 2018) is estimated from what
// the allreduce already has: each rank's mean gradient over its share of
// b samples (|g_b|²) and the averaged gradient over the global batch of B
// (|g_B|²). Appendix A's unbiased estimators are
//
//	|G|²  ≈ (B·|g_B|² − b·|g_b|²) / (B − b)
//	tr(Σ) ≈ (|g_b|² − |g_B|²) / (1/b − 1/B)
//
// averaged over the ranks of a step, each smoothed over steps (an
// exponential moving average), and their ratio is B_noise. The statistical
// efficiency of the global batch is then B_noise/(B_noise + B): the
// fraction of the samples that advance training as much as they would in
// small batches (McCandlish et al., eq. 2.7-2.8: E/E_min = 1 + B/B_noise).
// It is 1 until estimated (a world of one rank has no second batch size to
// compare with). Goodput = throughput × efficiency, in useful samples per
// second (Pollux's definition with McCandlish's efficiency).
//
// With a fixed global batch the efficiency is the same at every world
// size, so goodput orders the sizes as throughput does: the decisions rest
// on throughput alone, and efficiency is reported, not weighed.

// sizeRecord is what the policy measured at one world size.
type sizeRecord struct {
	steps    int64   // measured steps at this size (all visits)
	stepTime float64 // smoothed seconds per step
	compute  float64 // smoothed compute seconds of the slowest rank
	sync     float64 // smoothed sync seconds of the rank that waited least
	batch    float64 // the global batch (samples) of the last measured step
	badUntil int64   // not probed before this step (0: any time)
	backoff  int64   // the next backoff after a failed probe (0: Config.ProbeBackoff)
}

// measured reports whether the size has measurements.
func (r *sizeRecord) measured() bool { return r.steps > 0 && r.stepTime > 0 }

// throughput is the measured samples per second.
func (r *sizeRecord) throughput() float64 {
	if !r.measured() {
		return 0
	}
	return r.batch / r.stepTime
}

// smoothing is the weight of a new observation in the moving averages once
// more than 1/smoothing observations were seen (before: a running mean).
const smoothing = 0.02

// ema folds x into the average avg of n-1 earlier observations.
func ema(avg, x float64, n int64) float64 {
	a := max(1/float64(n), smoothing)
	return float64(a*x) + float64((1-a)*avg) // explicit: never fused, the same bits on every rank
}

// model is the fitted step-time model.
type model struct {
	alpha, beta   float64 // compute(w) = alpha + beta·B/w
	gamma, delta  float64 // sync(w) = gamma + delta·(w-2), w ≥ 2
	syncKnown     bool
	other         float64
	ok            bool // some size is measured
	measuredSizes int
}

// fit fits the model to the measured records (index: world size).
func fit(sizes []sizeRecord) model {
	var m model
	var xs, ys, ws, ss []float64
	var otherSum float64
	for w := 1; w < len(sizes); w++ {
		r := &sizes[w]
		if !r.measured() || r.batch <= 0 {
			continue
		}
		m.measuredSizes++
		xs = append(xs, r.batch/float64(w))
		ys = append(ys, r.compute)
		if w >= 2 {
			ws = append(ws, float64(w-2))
			ss = append(ss, r.sync)
		}
		otherSum += max(0, r.stepTime-r.compute-r.sync)
	}
	if m.measuredSizes == 0 {
		return m
	}
	m.ok = true
	m.other = otherSum / float64(m.measuredSizes)
	m.alpha, m.beta = linearFit(xs, ys, true)
	if len(ss) > 0 {
		m.syncKnown = true
		m.gamma, m.delta = linearFit(ws, ss, false)
	}
	return m
}

// linearFit fits y = a + b·x by least squares, keeping a, b ≥ 0. With one
// distinct x: through the origin when proportional (b = y/x), else a
// constant (a = mean y).
func linearFit(xs, ys []float64, proportional bool) (a, b float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += float64(xs[i] * xs[i])
		sxy += float64(xs[i] * ys[i])
	}
	den := float64(n*sxx) - float64(sx*sx)
	if len(xs) < 2 || den <= 1e-12*float64(n*sxx) {
		if proportional && sx > 0 {
			return 0, max(0, sy/sx)
		}
		return max(0, sy/n), 0
	}
	b = (float64(n*sxy) - float64(sx*sy)) / den
	a = (sy - float64(b*sx)) / n
	switch {
	case b < 0: // more samples per rank never take less time: a constant
		return max(0, sy/n), 0
	case a < 0:
		if sxx > 0 {
			return 0, max(0, sxy/sxx)
		}
		return 0, 0
	}
	return a, b
}

// stepTime predicts the seconds of a step at world size w with global batch b.
func (m *model) stepTime(w int, b float64) float64 {
	if !m.ok || w < 1 {
		return 0
	}
	t := m.other + m.alpha + float64(m.beta*b)/float64(w)
	if w >= 2 && m.syncKnown {
		t += m.gamma + float64(m.delta*float64(w-2))
	}
	return t
}

// noise estimates the gradient noise scale (see the file comment).
type noise struct {
	n     int64   // steps folded in
	trace float64 // smoothed tr(Σ) estimate
	g2    float64 // smoothed |G|² estimate
}

// observe folds one step's squared norms in: per rank, its share b[r] and
// the squared norm of its mean gradient small[r]; big, the squared norm of
// the mean gradient over the global batch of B samples. Ranks whose share
// is empty or the whole batch, and non-finite values, are skipped.
func (e *noise) observe(b, small []float64, big, B float64) {
	if !(big > 0) || math.IsInf(big, 0) || !(B > 0) {
		return
	}
	var sTrace, sG2 float64
	k := 0
	for r := range min(len(b), len(small)) {
		br, gr := b[r], small[r]
		if !(br > 0) || br >= B || !(gr > 0) || math.IsInf(gr, 0) {
			continue
		}
		sTrace += (gr - big) / (1/br - 1/B)
		sG2 += (float64(B*big) - float64(br*gr)) / (B - br)
		k++
	}
	if k == 0 {
		return
	}
	e.n++
	e.trace = ema(e.trace, sTrace/float64(k), e.n)
	e.g2 = ema(e.g2, sG2/float64(k), e.n)
}

// scale returns B_noise, or 0 when it is not known.
func (e *noise) scale() float64 {
	if e.n == 0 || !(e.g2 > 0) || !(e.trace > 0) {
		return 0
	}
	return e.trace / e.g2
}

// efficiency returns the statistical efficiency of a global batch of B
// samples: B_noise/(B_noise+B), or 1 when B_noise is not known.
func (e *noise) efficiency(B float64) float64 {
	s := e.scale()
	if s == 0 || !(B > 0) {
		return 1
	}
	return s / (s + B)
}
