package trainer

import (
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/trainer/schedule"
)

// Schedule gives the learning rate of every global step. It is a pure
// function of the global step, and the global step is part of every
// commit and checkpoint, so a rollback, a rescale, a join or a whole-job
// restart from a checkpoint never makes it jump: whatever happened, the
// step that takes the count from s to s+1 uses LR(s), on every rank. Set
// it with WithSchedule; the trainer calls the optimizer's
// SetLearningRate (optim.Optimizer) with it before every optimizer step,
// from the loop goroutine (so a value an OnRescale hook set is
// overridden; scale inside the Schedule instead).
type Schedule interface {
	// LR returns the learning rate of the step that takes the global step
	// count from step to step+1 (step >= 0). It must be a pure function of
	// step, the same on every worker.
	LR(step int64) float64
}

// ScheduleFunc adapts a function to a Schedule.
//
// Deprecated: use schedule.Func, the same type.
type ScheduleFunc = schedule.Func

// WarmupCosine is a linear warm-up, then a cosine decay.
//
// Deprecated: use schedule.WarmupCosine, the same type.
type WarmupCosine = schedule.WarmupCosine

// StepDecay is a linear warm-up, then a step decay.
//
// Deprecated: use schedule.StepDecay, the same type.
type StepDecay = schedule.StepDecay

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
