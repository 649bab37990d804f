package autoscale

import (
	"errors"
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/worker"
)

// ErrInvalidConfig reports a Config that fails validation.
var ErrInvalidConfig = errors.New("autoscale: invalid config")

// Config holds the policy's settings. The zero value is off. Every
// interval is counted in training steps (global steps, the same on every
// rank), so the policy measures and acts within seconds on jobs whose steps
// take milliseconds; a knob left 0 takes its default, stated on the field.
// The defaults are chosen so that a job of a few thousand steps (examples/
// mnist: about 940 steps an epoch, 130-600 steps per second on a laptop)
// finds its best size within its first epoch: a size is judged about 60
// steps after its round formed, and a change is considered every 25 steps.
type Config struct {
	// Enabled turns the policy on: every rank measures and decides.
	// Default false.
	Enabled bool
	// Platform enacts decisions (rank 0 resizes, the ranks a decision
	// removes release themselves and leave gracefully) and bounds the
	// world size by its capacity. nil: decisions are recommendations only
	// (logged, in StepInfo and the metrics), nothing is enacted.
	Platform worker.Platform

	// DecisionInterval: the policy considers a change at every step that
	// is a multiple of it. Default 25 steps.
	DecisionInterval int
	// WarmupSteps: the first steps of every round are not measured (they
	// compile graphs for new batch shapes, warm caches, and the first one
	// holds the round change). Default 10 steps.
	WarmupSteps int
	// MeasureSteps: a world size is judged (kept, left, compared) only
	// after this many measured steps in the current round. Default 50 steps.
	MeasureSteps int
	// MinChangeInterval: at least this many steps pass between two
	// decisions that are not the undoing of a probe. Default 100 steps.
	MinChangeInterval int
	// Hysteresis is the band, as a fraction of an average worker's
	// throughput, between the marginal gain below which a worker is shrunk
	// away (ShrinkFraction) and the gain at which one is added
	// (ShrinkFraction + Hysteresis): inside it the job stays as it is, so
	// measurements that wobble around one threshold never flap. Default 0.05.
	Hysteresis float64
	// ShrinkFraction: the last worker of a world of W is removed when it
	// adds less than this fraction of an average worker's throughput at
	// W-1 (DLRover stops adding PS workers below 0.2). Default 0.1.
	ShrinkFraction float64
	// HorizonSteps: a grow must pay its cost within this many steps: the
	// seconds per step it is predicted to save, times HorizonSteps, must
	// exceed the measured seconds a change pauses training (twice that for
	// a probe, which may have to be undone). Default 2000 steps.
	HorizonSteps int
	// ProbeTolerance: a smaller world size not measured yet is tried when
	// the model predicts its throughput no more than this fraction below
	// the current size's. The step-time model cannot see workers that
	// share a host's cores (it predicts fewer workers to be slower), so a
	// size below is worth a try unless predicted much worse. Default 0.35.
	ProbeTolerance float64
	// ProbeBackoff: after a probe of a size was undone (or a size could
	// not be reached), it is not tried again for this many steps, doubling
	// at each further failure. Default 5000 steps.
	ProbeBackoff int
	// PendingSteps: a decision waits this long for the platform to bring
	// the world to its target; then the target is given up and the size
	// backs off as a failed probe does. Default 1000 steps.
	PendingSteps int
	// ChangeCost is the first estimate, in seconds, of how long a change
	// of world size pauses training (a round change and the state
	// transfer); replaced by the measured pauses as changes happen.
	// Default 1 s.
	ChangeCost float64
}

// Defaults of Config's knobs.
const (
	DefaultDecisionInterval  = 25
	DefaultWarmupSteps       = 10
	DefaultMeasureSteps      = 50
	DefaultMinChangeInterval = 100
	DefaultHysteresis        = 0.05
	DefaultShrinkFraction    = 0.1
	DefaultHorizonSteps      = 2000
	DefaultProbeTolerance    = 0.35
	DefaultProbeBackoff      = 5000
	DefaultPendingSteps      = 1000
	DefaultChangeCost        = 1.0
)

// DefaultConfig returns the documented defaults, with Enabled false and
// no Platform.
func DefaultConfig() Config {
	return Config{
		DecisionInterval:  DefaultDecisionInterval,
		WarmupSteps:       DefaultWarmupSteps,
		MeasureSteps:      DefaultMeasureSteps,
		MinChangeInterval: DefaultMinChangeInterval,
		Hysteresis:        DefaultHysteresis,
		ShrinkFraction:    DefaultShrinkFraction,
		HorizonSteps:      DefaultHorizonSteps,
		ProbeTolerance:    DefaultProbeTolerance,
		ProbeBackoff:      DefaultProbeBackoff,
		PendingSteps:      DefaultPendingSteps,
		ChangeCost:        DefaultChangeCost,
	}
}

// withDefaults returns c with every knob left 0 set to its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setI := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setF := func(v *float64, def float64) {
		if *v == 0 {
			*v = def
		}
	}
	setI(&c.DecisionInterval, d.DecisionInterval)
	setI(&c.WarmupSteps, d.WarmupSteps)
	setI(&c.MeasureSteps, d.MeasureSteps)
	setI(&c.MinChangeInterval, d.MinChangeInterval)
	setF(&c.Hysteresis, d.Hysteresis)
	setF(&c.ShrinkFraction, d.ShrinkFraction)
	setI(&c.HorizonSteps, d.HorizonSteps)
	setF(&c.ProbeTolerance, d.ProbeTolerance)
	setI(&c.ProbeBackoff, d.ProbeBackoff)
	setI(&c.PendingSteps, d.PendingSteps)
	setF(&c.ChangeCost, d.ChangeCost)
	return c
}

// Validate reports the first invalid knob, wrapping ErrInvalidConfig: a
// negative interval, a fraction outside [0, 1), a non-finite number. A
// knob left 0 is valid (it takes its default). A Config that is not
// Enabled is always valid.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...)
	}
	ints := []struct {
		name string
		v    int
	}{
		{"DecisionInterval", c.DecisionInterval}, {"WarmupSteps", c.WarmupSteps}, {"MeasureSteps", c.MeasureSteps},
		{"MinChangeInterval", c.MinChangeInterval}, {"HorizonSteps", c.HorizonSteps}, {"ProbeBackoff", c.ProbeBackoff},
		{"PendingSteps", c.PendingSteps},
	}
	for _, f := range ints {
		if f.v < 0 {
			return bad("%s %d < 0", f.name, f.v)
		}
	}
	fracs := []struct {
		name string
		v    float64
	}{
		{"Hysteresis", c.Hysteresis}, {"ShrinkFraction", c.ShrinkFraction}, {"ProbeTolerance", c.ProbeTolerance},
	}
	for _, f := range fracs {
		if !(f.v >= 0 && f.v < 1) {
			return bad("%s %v is not in [0, 1)", f.name, f.v)
		}
	}
	if !(c.ChangeCost >= 0) || math.IsInf(c.ChangeCost, 0) {
		return bad("ChangeCost %v is not a finite number of seconds >= 0", c.ChangeCost)
	}
	return nil
}
