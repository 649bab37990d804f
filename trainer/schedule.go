package trainer

import (
	"fmt"
	"math"
)

// Schedule gives the learning rate of every global step. It is a pure
// function of the global step, and the global step is part of every
// commit and checkpoint, so a rollback, a rescale, a join or a whole-job
// restart from a checkpoint never makes it jump: whatever happened, the
// step that takes the count from s to s+1 uses LR(s), on every rank. Set
// it with WithSchedule; the trainer calls Optimizer.SetLearningRate with
// it before every optimizer step, from the loop goroutine (so a value an
// OnRescale hook set is overridden; scale inside the Schedule instead).
type Schedule interface {
	// LR returns the learning rate of the step that takes the global step
	// count from step to step+1 (step >= 0). It must be a pure function of
	// step, the same on every worker.
	LR(step int64) float64
}

// ScheduleFunc adapts a function to a Schedule.
type ScheduleFunc func(step int64) float64

// LR implements Schedule.
func (f ScheduleFunc) LR(step int64) float64 { return f(step) }

// WarmupCosine is a linear warm-up over Warmup steps to Base (gradual
// warm-up, Goyal et al., "Accurate, Large Minibatch SGD", 2017: step s
// of the warm-up uses Base*(s+1)/Warmup), then a cosine decay from Base
// to Min that reaches Min at step Total and stays there (Loshchilov &
// Hutter, "SGDR", 2017, without restarts). Warmup 0 starts at Base;
// Total <= Warmup keeps Base after the warm-up.
type WarmupCosine struct {
	// Base is the peak learning rate, reached at the end of the warm-up.
	Base float64
	// Warmup is the warm-up's length in global steps.
	Warmup int64
	// Total is the step at which the decay reaches Min.
	Total int64
	// Min is the floor of the decay; default 0.
	Min float64
}

// LR implements Schedule.
func (s WarmupCosine) LR(step int64) float64 {
	if step < s.Warmup {
		return s.Base * float64(step+1) / float64(s.Warmup)
	}
	if s.Total <= s.Warmup {
		return s.Base
	}
	p := min(1, float64(step-s.Warmup)/float64(s.Total-s.Warmup))
	return s.Min + (s.Base-s.Min)*0.5*(1+math.Cos(math.Pi*p))
}

// Validate reports a Base that is not a positive finite number, a
// negative Warmup or Total, or a Min outside [0, Base], wrapping
// ErrInvalidConfig.
func (s WarmupCosine) Validate() error {
	switch {
	case !positiveFinite(s.Base):
		return fmt.Errorf("%w: WarmupCosine.Base %v is not a positive finite number", ErrInvalidConfig, s.Base)
	case s.Warmup < 0 || s.Total < 0:
		return fmt.Errorf("%w: WarmupCosine.Warmup %d or Total %d < 0", ErrInvalidConfig, s.Warmup, s.Total)
	case !(s.Min >= 0 && s.Min <= s.Base):
		return fmt.Errorf("%w: WarmupCosine.Min %v is outside [0, Base]", ErrInvalidConfig, s.Min)
	}
	return nil
}

// StepDecay is an optional linear warm-up over Warmup steps to Base (as in
// WarmupCosine), then Base*Gamma^floor((step-Warmup)/Every): the rate is
// multiplied by Gamma every Every steps.
type StepDecay struct {
	// Base is the rate after the warm-up.
	Base float64
	// Warmup is the warm-up's length in global steps; 0 for none.
	Warmup int64
	// Every is the decay interval in global steps (> 0).
	Every int64
	// Gamma is the factor of each decay, in (0, 1].
	Gamma float64
}

// LR implements Schedule.
func (s StepDecay) LR(step int64) float64 {
	if step < s.Warmup {
		return s.Base * float64(step+1) / float64(s.Warmup)
	}
	return s.Base * math.Pow(s.Gamma, float64((step-s.Warmup)/s.Every))
}

// Validate reports a Base that is not a positive finite number, a
// negative Warmup, Every < 1 or Gamma outside (0, 1], wrapping
// ErrInvalidConfig.
func (s StepDecay) Validate() error {
	switch {
	case !positiveFinite(s.Base):
		return fmt.Errorf("%w: StepDecay.Base %v is not a positive finite number", ErrInvalidConfig, s.Base)
	case s.Warmup < 0 || s.Every < 1:
		return fmt.Errorf("%w: StepDecay.Warmup %d < 0 or Every %d < 1", ErrInvalidConfig, s.Warmup, s.Every)
	case !(s.Gamma > 0 && s.Gamma <= 1):
		return fmt.Errorf("%w: StepDecay.Gamma %v is outside (0, 1]", ErrInvalidConfig, s.Gamma)
	}
	return nil
}

func positiveFinite(v float64) bool { return v > 0 && !math.IsInf(v, 1) }

// WithSchedule makes s set the learning rate of every step (see
// Schedule). A Schedule with a Validate() error method is validated by
// New. With a schedule, the settings the members of a round compare hold
// the schedule's rates at steps 0, 1, 2, 4, ..., 2^30 instead of the
// optimizer's learning rate at New.
func WithSchedule(s Schedule) Option { return func(o *options) { o.sched = s } }

// scheduleProbe is the settings value of a schedule: the sum of its rates
// at steps 0 and 2^k for k in 0..30 (the same computation on every rank,
// so equal schedules give bit-equal sums).
func scheduleProbe(s Schedule) float64 {
	sum := s.LR(0)
	for k := range 31 {
		sum += s.LR(int64(1) << k)
	}
	return sum
}

// checkSchedule validates the schedule given to New: its own Validate when
// it has one, and a first rate that is finite and not negative.
func checkSchedule(s Schedule) error {
	if v, ok := s.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if lr := s.LR(0); math.IsNaN(lr) || math.IsInf(lr, 0) || lr < 0 {
		return fmt.Errorf("%w: the schedule's learning rate at step 0 is %v", ErrInvalidConfig, lr)
	}
	return nil
}
