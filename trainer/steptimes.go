package trainer

import "time"

// StepTimes is where this worker's applied steps spent their wall time,
// summed over the steps (Result.StepTimes): each step is measured from
// the loader's Next to the end of its step boundary, and cut into parts
// that add up to it exactly (Other is what is left).
type StepTimes struct {
	// Steps is how many applied steps the figures cover (a global batch
	// without samples is no step and is not counted).
	Steps int64
	// Loader: the loader's Next (waiting for a prefetched batch) and its
	// Stepped, and the audit record of the step's samples.
	Loader time.Duration
	// Compute: the StepFunc over this rank's share, with deterministic
	// mode's gradient copies.
	Compute time.Duration
	// Reduce: the step's collective (the gradients' sum and the control
	// values; in deterministic mode the fixed-point conversions too), and
	// the wait there for the slowest rank.
	Reduce time.Duration
	// Optimizer: dividing by the global batch and the optimizer's update.
	Optimizer time.Duration
	// Commit: the in-memory commit and a durable checkpoint's hand-off to
	// its writer (at the steps that take them).
	Commit time.Duration
	// Other: the rest (the step's decisions: balancing, stragglers,
	// resource adjustment, Hooks.OnStep, telemetry).
	Other time.Duration
}

// Total is the steps' whole wall time, the sum of the parts.
func (s StepTimes) Total() time.Duration {
	return s.Loader + s.Compute + s.Reduce + s.Optimizer + s.Commit + s.Other
}

// stepClock cuts one step's wall time into StepTimes' parts: each lap
// charges the time since the previous one to a part.
type stepClock struct {
	start, last time.Time
	cur         StepTimes
}

// begin starts a step at now.
func (c *stepClock) begin(now time.Time) {
	c.start, c.last, c.cur = now, now, StepTimes{}
}

// lap charges the time since the previous lap to *part and returns now.
func (c *stepClock) lap(part *time.Duration) time.Time {
	now := time.Now()
	*part += now.Sub(c.last)
	c.last = now
	return now
}

// end charges the rest to Other and adds the step to total.
func (c *stepClock) end(total *StepTimes) {
	c.lap(&c.cur.Other)
	total.Steps++
	total.Loader += c.cur.Loader
	total.Compute += c.cur.Compute
	total.Reduce += c.cur.Reduce
	total.Optimizer += c.cur.Optimizer
	total.Commit += c.cur.Commit
	total.Other += c.cur.Other
}
