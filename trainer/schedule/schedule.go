// Package schedule holds learning-rate schedules for trainer.WithSchedule:
// each is a pure function of the global step (trainer.Schedule), so a
// rollback, a rescale or a restart never makes the rate jump. Validate
// errors wrap worker.ErrInvalidConfig, which is trainer.ErrInvalidConfig.
package schedule

import (
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/worker"
)

// Func adapts a function to a trainer.Schedule.
type Func func(step int64) float64

// LR implements trainer.Schedule.
func (f Func) LR(step int64) float64 { return f(step) }

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

// LR implements trainer.Schedule.
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
// worker.ErrInvalidConfig.
func (s WarmupCosine) Validate() error {
	switch {
	case !positiveFinite(s.Base):
		return fmt.Errorf("%w: WarmupCosine.Base %v is not a positive finite number", worker.ErrInvalidConfig, s.Base)
	case s.Warmup < 0 || s.Total < 0:
		return fmt.Errorf("%w: WarmupCosine.Warmup %d or Total %d < 0", worker.ErrInvalidConfig, s.Warmup, s.Total)
	case !(s.Min >= 0 && s.Min <= s.Base):
		return fmt.Errorf("%w: WarmupCosine.Min %v is outside [0, Base]", worker.ErrInvalidConfig, s.Min)
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

// LR implements trainer.Schedule.
func (s StepDecay) LR(step int64) float64 {
	if step < s.Warmup {
		return s.Base * float64(step+1) / float64(s.Warmup)
	}
	return s.Base * math.Pow(s.Gamma, float64((step-s.Warmup)/s.Every))
}

// Validate reports a Base that is not a positive finite number, a
// negative Warmup, Every < 1 or Gamma outside (0, 1], wrapping
// worker.ErrInvalidConfig.
func (s StepDecay) Validate() error {
	switch {
	case !positiveFinite(s.Base):
		return fmt.Errorf("%w: StepDecay.Base %v is not a positive finite number", worker.ErrInvalidConfig, s.Base)
	case s.Warmup < 0 || s.Every < 1:
		return fmt.Errorf("%w: StepDecay.Warmup %d < 0 or Every %d < 1", worker.ErrInvalidConfig, s.Warmup, s.Every)
	case !(s.Gamma > 0 && s.Gamma <= 1):
		return fmt.Errorf("%w: StepDecay.Gamma %v is outside (0, 1]", worker.ErrInvalidConfig, s.Gamma)
	}
	return nil
}

func positiveFinite(v float64) bool { return v > 0 && !math.IsInf(v, 1) }
