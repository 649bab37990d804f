package autoscale

import (
	"fmt"
	"math"
	"slices"
)

// Observation is what every rank agrees on after one applied step: the
// step's control values, reduced by the allreduce the loop runs anyway,
// so every rank passes the same Observation and its Policy takes the same
// decision. Per-rank slices are indexed by rank and have WorldSize
// elements (a shorter one counts as missing).
type Observation struct {
	// Step is the global step count after this step.
	Step int64
	// Round is the rendezvous round; a new value starts a new round.
	Round uint64
	// WorldSize is the round's world size.
	WorldSize int
	// GlobalBatch is the samples of this step's global batch.
	GlobalBatch float64
	// Interval is each rank's seconds since it began its previous step
	// (0: none in this process). On a round's first step it spans the
	// round change.
	Interval []float64
	// Compute is each rank's StepFunc seconds of this step.
	Compute []float64
	// Samples is each rank's samples of this step.
	Samples []float64
	// Sync is each rank's seconds in the gradient allreduce of its
	// previous step in this round (0: none).
	Sync []float64
	// NormSamples and GradSq: each rank's samples and the squared norm of
	// its mean gradient over them, of the step that BigGradSq describes
	// (0: none); BigGradSq is the squared norm of the mean gradient over
	// that step's global batch of NormBatch samples (0: none).
	NormSamples []float64
	GradSq      []float64
	BigGradSq   float64
	NormBatch   float64
	// Capacity is how many workers the platform allows now; 0 or less: no
	// bound stated.
	Capacity int
	// Keep marks the ranks that hold state no other rank holds: never
	// removed. nil: none.
	Keep []bool
	// MinWorkers and MaxWorkers bound the world size (the rendezvous'
	// bounds); 0: 1 and no bound.
	MinWorkers, MaxWorkers int
}

// Decision is a change of the target world size.
type Decision struct {
	// Step is the global step after which it was made.
	Step int64
	// From is the world size when it was made, To the target.
	From, To int
	// Remove lists the ranks of the current round that leave, lowest
	// first, when To < From (the slowest or newest members, never rank 0
	// when another can go, never one that holds state no other holds).
	Remove []int
	// Reason is one word: "grow", "shrink", "probe", "undo-probe",
	// "capacity" (the platform allows fewer workers), "bounds" (beyond
	// MaxWorkers), "unreached" (the platform did not bring the world to
	// the last target in time: the target returns to the current size).
	Reason string
	// Detail is one human line with the figures behind it.
	Detail string
	// Throughput is the measured samples per second at From; Predicted the
	// samples per second expected at To (measured, when To was measured
	// before; else from the step-time model).
	Throughput, Predicted float64
	// Goodput is Throughput × Efficiency, in useful samples per second;
	// Efficiency the statistical efficiency of the global batch (1 until
	// the gradient noise scale is estimated).
	Goodput, Efficiency float64
}

// Figures are the policy's measurements after a step, for StepInfo and the
// metrics.
type Figures struct {
	// Throughput is the measured samples per second at the current world
	// size (0 until measured).
	Throughput float64
	// Efficiency is the statistical efficiency of the global batch (1
	// until estimated); NoiseScale the gradient noise scale B_noise in
	// samples (0 until estimated).
	Efficiency, NoiseScale float64
	// Goodput is Throughput × Efficiency.
	Goodput float64
	// Recommended is the target world size: the current one unless a
	// decision awaits enactment.
	Recommended int
}

// Policy is the deterministic core of resource adjustment: a state that
// Observe advances with agreed observations, returning a Decision when the
// target world size changes. It holds no clock, goroutine or I/O; every
// rank that starts from the same state (MarshalBinary travels in the
// commits and checkpoints) and sees the same observations decides the
// same. Not safe for concurrent use.
//
// The rules, evaluated at every DecisionInterval-th step once the current
// size has MeasureSteps measured steps in this round (X(w) is the
// throughput at w, measured, or predicted for a size not measured yet;
// the gain of the w-th worker is (X(w) − X(w−1)) / (X(w−1)/(w−1)), what it
// adds in units of an average worker of the smaller world):
//
//   - capacity: a world larger than the platform's capacity (or
//     MaxWorkers), seen at two evaluations in a row, shrinks to it;
//   - a change on trial (every change but a capacity one: a probe of a
//     size not measured yet, or a grow or shrink to a size measured
//     before, perhaps under another load) is kept when the new
//     measurement agrees (an added worker's gain ≥ ShrinkFraction
//   - Hysteresis; a removed worker's gain < ShrinkFraction) and undone
//     at once otherwise, the size backing off for ProbeBackoff steps;
//   - shrink when the current size's last worker adds less than
//     ShrinkFraction (W−1 measured);
//   - grow when one more worker adds at least ShrinkFraction + Hysteresis
//     (W+1 measured) and the seconds it saves per step, over HorizonSteps
//     steps, exceed the measured cost of a change;
//   - probe W+1 not measured yet under the same test, with the model's
//     prediction and twice the cost (it may have to come back);
//   - probe W−1 not measured yet when the model predicts it no more than
//     ProbeTolerance slower.
//
// At most one change every MinChangeInterval steps (the undoing of a probe
// excepted), and none while a decision awaits enactment (PendingSteps).
type Policy struct {
	cfg Config
	st  state
}

// state is the Policy's state: all of it travels in MarshalBinary.
type state struct {
	sizes      []sizeRecord // by world size (index 0 unused)
	round      uint64
	roundSize  int
	roundSteps int64     // steps observed in this round
	measured   int64     // measured steps in this round
	slow       []float64 // this round: each rank's smoothed compute seconds per sample
	slowN      []int64
	lastChange int64 // step of the last decision (0: none)
	lastFrom   int   // the world size the last decision left (0: none)
	holdUntil  int64 // no grow or shrink that reverses the last decision before this step
	holdNext   int64 // the next such hold (0: Config.ProbeBackoff)
	pending    int   // target awaiting enactment (0: none)
	pendSince  int64
	probeFrom  int     // size a probe on trial came from (0: none)
	capLow     int     // evaluations in a row that found the world above its capacity
	cost       float64 // smoothed seconds a change pauses training
	costN      int64
	gns        noise
	lastStep   float64 // the smoothed step time of the size before the last round change (for the change cost)
	fig        Figures
}

// New returns a Policy with cfg (knobs left 0 take their defaults) and no
// measurements.
func New(cfg Config) *Policy {
	cfg = cfg.withDefaults()
	return &Policy{cfg: cfg, st: state{cost: cfg.ChangeCost}}
}

// Figures returns the measurements after the last observed step.
func (p *Policy) Figures() Figures { return p.st.fig }

// Measured returns the world sizes measured so far, ascending.
func (p *Policy) Measured() []int {
	var out []int
	for w := range p.st.sizes {
		if p.st.sizes[w].measured() {
			out = append(out, w)
		}
	}
	return out
}

// record returns the record of size w, growing the table.
func (s *state) record(w int) *sizeRecord {
	for len(s.sizes) <= w {
		s.sizes = append(s.sizes, sizeRecord{})
	}
	return &s.sizes[w]
}

// maxSizes bounds the world sizes the policy keeps records for (package
// sync's bound).
const maxSizes = 1 << 16

// Observe advances the policy with one step's agreed observation and
// returns a Decision when the target world size changes, else nil. An
// observation that does not make sense (no world, sizes beyond bounds,
// slices of the wrong length) is skipped: no measurement, no decision.
func (p *Policy) Observe(o Observation) *Decision {
	s, c := &p.st, &p.cfg
	W := o.WorldSize
	if W < 1 || W >= maxSizes || len(o.Compute) < W || len(o.Interval) < W {
		return nil
	}
	if o.Round != s.round || s.roundSize != W {
		p.newRound(o)
	}
	s.roundSteps++
	s.gns.observe(o.NormSamples, o.GradSq, o.BigGradSq, o.NormBatch)
	p.observeRanks(o)
	rec := s.record(W)
	if s.roundSteps > int64(c.WarmupSteps) && o.GlobalBatch > 0 {
		interval := median(o.Interval[:W])
		compute := slices.Max(o.Compute[:W])
		sync := 0.0
		if W > 1 && len(o.Sync) >= W {
			sync = slices.Min(o.Sync[:W])
		}
		if interval > 0 && !math.IsInf(interval, 0) && compute >= 0 && !math.IsInf(compute, 0) && sync >= 0 && !math.IsInf(sync, 0) {
			rec.steps++
			s.measured++
			n := min(rec.steps, s.measured) // a new visit starts from its own steps
			rec.stepTime = ema(rec.stepTime, interval, n)
			rec.compute = ema(rec.compute, compute, n)
			rec.sync = ema(rec.sync, sync, n)
			rec.batch = o.GlobalBatch
		}
	}
	eff := s.gns.efficiency(o.GlobalBatch)
	s.fig = Figures{Throughput: rec.throughput(), Efficiency: eff, NoiseScale: s.gns.scale(), Recommended: W}
	s.fig.Goodput = s.fig.Throughput * eff
	if s.pending != 0 {
		s.fig.Recommended = s.pending
	}
	if c.DecisionInterval <= 0 || o.Step%int64(c.DecisionInterval) != 0 {
		return nil
	}
	d := p.evaluate(o)
	if d != nil {
		d.Step, d.From = o.Step, W
		d.Throughput, d.Efficiency = rec.throughput(), eff
		d.Goodput = d.Throughput * eff
		s.lastChange, s.lastFrom = o.Step, W
		s.pending, s.pendSince = d.To, o.Step
		if d.To == W {
			s.pending = 0
		}
		s.fig.Recommended = d.To
	}
	return d
}

// newRound starts a round: a new size's measurements, the change's cost,
// and the end of a wait for a target reached.
func (p *Policy) newRound(o Observation) {
	s := &p.st
	W := o.WorldSize
	if s.roundSize > 0 && s.roundSize < len(s.sizes) {
		s.lastStep = s.sizes[s.roundSize].stepTime
	}
	if s.roundSize > 0 && s.roundSize != W {
		// The round's first step spans the change: its longest interval,
		// less a step, is the pause.
		gap := 0.0
		for _, v := range o.Interval[:W] {
			if v > 0 && !math.IsInf(v, 0) {
				gap = max(gap, v)
			}
		}
		if gap > 0 && s.lastStep > 0 {
			s.costN++
			s.cost = ema(s.cost, max(0, gap-s.lastStep), s.costN)
		}
	}
	s.round, s.roundSize, s.roundSteps, s.measured, s.capLow = o.Round, W, 0, 0, 0
	s.slow, s.slowN = make([]float64, W), make([]int64, W)
	if s.pending == W {
		s.pending = 0
	}
}

// observeRanks folds each rank's compute seconds per sample into its
// smoothed slowness (who leaves first on a shrink).
func (p *Policy) observeRanks(o Observation) {
	s := &p.st
	for r := range min(len(s.slow), len(o.Samples), len(o.Compute)) {
		n, c := o.Samples[r], o.Compute[r]
		if n > 0 && c > 0 && !math.IsInf(c, 0) {
			s.slowN[r]++
			s.slow[r] = ema(s.slow[r], c/n, s.slowN[r])
		}
	}
}

// evaluate applies the rules (see Policy) at a decision step.
func (p *Policy) evaluate(o Observation) *Decision {
	s, c := &p.st, &p.cfg
	W, step := o.WorldSize, o.Step
	lo := max(o.MinWorkers, 1)
	hi := maxSizes - 1
	if o.MaxWorkers > 0 {
		hi = o.MaxWorkers
	}
	reason := "bounds"
	if o.Capacity > 0 && o.Capacity < hi {
		hi, reason = o.Capacity, "capacity"
	}
	hi = max(hi, lo)
	if W > hi && !(s.pending != 0 && s.pending <= hi) {
		// Above the capacity, and no decision under way brings it down:
		// whatever was awaited (a grow, a probe) gives way.
		if s.capLow++; s.capLow < 2 {
			return nil
		}
		rm := p.pickRemove(o, W-hi)
		if len(rm) == 0 {
			return nil
		}
		s.probeFrom = 0
		return &Decision{To: W - len(rm), Remove: rm, Reason: reason,
			Detail: fmt.Sprintf("world of %d above the allowed %d", W, hi), Predicted: p.throughput(W-len(rm), o.GlobalBatch)}
	}
	s.capLow = 0
	if s.pending != 0 {
		if step-s.pendSince < int64(c.PendingSteps) {
			return nil
		}
		// The platform did not bring the world to the target: give it up.
		p.backOff(s.pending, step)
		target := s.pending
		s.pending, s.probeFrom = 0, 0
		return &Decision{To: W, Reason: "unreached",
			Detail: fmt.Sprintf("target %d not reached within %d steps; staying at %d, no retry for %d steps", target, c.PendingSteps, W, s.record(target).badUntil-step)}
	}
	if s.measured < int64(c.MeasureSteps) {
		return nil
	}
	X := s.record(W).throughput()
	if s.probeFrom != 0 {
		from := s.probeFrom
		s.probeFrom = 0
		prev := s.record(from).throughput()
		var keep bool
		var g float64
		if W > from {
			g = gain(X, prev, from)
			keep = g >= c.ShrinkFraction+c.Hysteresis
		} else {
			g = gain(prev, X, W)
			keep = g < c.ShrinkFraction
		}
		if keep || prev <= 0 || from > hi || from < lo {
			return nil // kept, or the way back is closed (the bounds moved)
		}
		p.backOff(W, step)
		d := &Decision{To: from, Reason: "undo-probe", Predicted: prev,
			Detail: fmt.Sprintf("%d workers measured %.1f samples/s against %.1f at %d: worker %d adds %.2f of an average worker; no retry of %d for %d steps",
				W, X, prev, from, max(W, from), g, W, s.record(W).badUntil-step)}
		if from < W {
			d.Remove = p.pickRemove(o, W-from)
			if len(d.Remove) < W-from {
				return nil
			}
		}
		return d
	}
	if step-s.lastChange < int64(c.MinChangeInterval) && s.lastChange > 0 {
		return nil
	}
	m := fit(s.sizes)
	B := o.GlobalBatch
	// A grow or shrink back to the size the last decision left reverses
	// it: measurements wobbling around a threshold could do that again
	// and again, so a reversal holds the next one off for a backoff that
	// doubles (one round trip, then the job stays).
	reversal := func(to int) bool {
		if s.lastFrom != to {
			return false
		}
		if step < s.holdUntil {
			return true
		}
		if s.holdNext <= 0 {
			s.holdNext = int64(c.ProbeBackoff)
		}
		return false
	}
	hold := func() {
		s.holdUntil, s.holdNext = step+s.holdNext, min(2*s.holdNext, 1<<40)
	}
	// Shrink: the last worker does not pay.
	if W-1 >= lo && s.record(W-1).measured() && !reversal(W-1) {
		prev := s.record(W - 1).throughput()
		if g := gain(X, prev, W-1); g < c.ShrinkFraction {
			rm := p.pickRemove(o, 1)
			if len(rm) == 1 {
				if s.lastFrom == W-1 {
					hold()
				}
				s.probeFrom = W // a trial too: the measurement of W-1 may be old
				return &Decision{To: W - 1, Remove: rm, Reason: "shrink", Predicted: prev,
					Detail: fmt.Sprintf("worker %d adds %.2f of an average worker (< %.2f): %.1f samples/s at %d, %.1f at %d", W, g, c.ShrinkFraction, X, W, prev, W-1)}
			}
		}
	}
	// Grow, or probe one more worker.
	if W+1 <= hi && !reversal(W+1) {
		up := s.record(W + 1)
		var next float64
		probe := false
		switch {
		case up.measured() && step >= up.badUntil && up.badUntil > 0:
			next, probe = p.predict(&m, W+1, B), true // measured long ago and backed off since: try again
		case up.measured():
			next = up.throughput()
		case step >= up.badUntil:
			next, probe = p.predict(&m, W+1, B), true
		}
		if next > 0 {
			g := gain(next, X, W)
			saved := B/X - B/next // seconds per step
			cost := s.cost
			if probe {
				cost *= 2
			}
			if g >= c.ShrinkFraction+c.Hysteresis && float64(saved*float64(c.HorizonSteps)) > cost {
				reason := "grow"
				if probe {
					reason = "probe"
				} else if s.lastFrom == W+1 {
					hold()
				}
				s.probeFrom = W // a grow to a measured size is a trial too: its measurement may be old
				return &Decision{To: W + 1, Reason: reason, Predicted: next,
					Detail: fmt.Sprintf("worker %d would add %.2f of an average worker: %.1f samples/s predicted against %.1f; saves %.0f s over %d steps for a change of %.2f s",
						W+1, g, next, X, float64(saved*float64(c.HorizonSteps)), c.HorizonSteps, s.cost)}
			}
		}
	}
	// Probe one worker less.
	if W-1 >= lo {
		dn := s.record(W - 1)
		if (!dn.measured() || dn.badUntil > 0) && step >= dn.badUntil {
			pred := p.predict(&m, W-1, B)
			if pred >= float64(X*(1-c.ProbeTolerance)) {
				rm := p.pickRemove(o, 1)
				if len(rm) == 1 {
					s.probeFrom = W
					return &Decision{To: W - 1, Remove: rm, Reason: "probe", Predicted: pred,
						Detail: fmt.Sprintf("%d workers not measured; predicted %.1f samples/s against %.1f at %d (within %.2f)", W-1, pred, X, W, c.ProbeTolerance)}
				}
			}
		}
	}
	return nil
}

// gain is what the top worker of a world of n+1 adds, in units of an
// average worker of the world of n: (x1 − x0)/(x0/n).
func gain(x1, x0 float64, n int) float64 {
	if !(x0 > 0) || n < 1 {
		return 0
	}
	return (x1 - x0) / (x0 / float64(n))
}

// predict returns the model's throughput at w for a global batch of b.
func (p *Policy) predict(m *model, w int, b float64) float64 {
	t := m.stepTime(w, b)
	if !(t > 0) {
		return 0
	}
	return b / t
}

// throughput returns the measured throughput at w, else the model's.
func (p *Policy) throughput(w int, b float64) float64 {
	if r := p.st.record(w); r.measured() {
		return r.throughput()
	}
	m := fit(p.st.sizes)
	return p.predict(&m, w, b)
}

// backOff keeps size w from being probed for its backoff, which doubles.
func (p *Policy) backOff(w int, step int64) {
	r := p.st.record(w)
	if r.backoff <= 0 {
		r.backoff = int64(p.cfg.ProbeBackoff)
	}
	r.badUntil = step + r.backoff
	r.backoff = min(2*r.backoff, 1<<40)
}

// pickRemove returns k ranks to remove, lowest first: never one that
// Keep marks, rank 0 only when no other can go, the slowest (most compute
// seconds per sample this round) first, the highest rank (the newest
// member) among equals. It returns fewer when fewer can go.
func (p *Policy) pickRemove(o Observation, k int) []int {
	W := o.WorldSize
	var cand []int
	for r := W - 1; r >= 0; r-- {
		if r < len(o.Keep) && o.Keep[r] {
			continue
		}
		cand = append(cand, r)
	}
	slow := func(r int) float64 {
		if r < len(p.st.slow) {
			return p.st.slow[r]
		}
		return 0
	}
	slices.SortStableFunc(cand, func(a, b int) int {
		if (a == 0) != (b == 0) { // rank 0 last
			if a == 0 {
				return 1
			}
			return -1
		}
		sa, sb := slow(a), slow(b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		}
		return b - a
	})
	if len(cand) > k {
		cand = cand[:k]
	}
	slices.Sort(cand)
	return cand
}

// median returns the median of xs (the lower middle for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
