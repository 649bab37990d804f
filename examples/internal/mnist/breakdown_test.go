package mnist

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer"
)

// step_breakdown_ms is StepTimes per step in milliseconds, its parts add
// up to its total, and -profile-step's line names every part.
func TestStepBreakdownIsPerStepAndAddsUp(t *testing.T) {
	require.Nil(t, stepBreakdown(trainer.StepTimes{}), "no step: no figures")
	st := trainer.StepTimes{Steps: 4, Loader: 4 * time.Millisecond, Compute: 20 * time.Millisecond, Reduce: 8 * time.Millisecond,
		Optimizer: 2 * time.Millisecond, Commit: 6 * time.Millisecond, Other: 400 * time.Microsecond}
	m := stepBreakdown(st)
	require.Equal(t, map[string]any{"loader": 1.0, "compute": 5.0, "reduce": 2.0, "optimizer": 0.5, "commit": 1.5, "other": 0.1,
		"total": 10.1, "steps": 4.0}, m)
	f := map[string]float64{}
	for k, v := range m {
		f[k] = v.(float64)
	}
	line := stepBreakdownLine(f)
	for _, p := range stepParts {
		require.Contains(t, line, p+" ")
	}
	require.Contains(t, line, "total 10.100")
	require.Contains(t, line, "compute 5.000 (50%)")
}
