package trainer

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Who stops on a settings disagreement: the newcomers that differ from the
// members holding the job's trained state, when those agree; everybody
// when nobody holds it or the holders disagree.
func TestDecideSettingsRefusesOnlyNewcomersThatDifferFromTheHolders(t *testing.T) {
	row := func(lr float64, holds bool) []float64 {
		r := []float64{7, 2, 5, 3, lr, 16, 480, 3, 1, 0, 4 << 20, 0}
		if holds {
			r[holdsColumn] = 1
		}
		return r
	}
	cases := []struct {
		name    string
		rows    [][]float64
		refused []string // nil: no error
		all     bool     // every member stops
	}{
		{"all agree", [][]float64{row(.2, true), row(.2, false)}, nil, false},
		{"a newcomer differs", [][]float64{row(.2, true), row(.2, true), row(.2, true), row(.1, false)}, []string{"m3"}, false},
		{"a newcomer differs, another agrees", [][]float64{row(.2, true), row(.1, false), row(.2, false)}, []string{"m1"}, false},
		{"the newcomers outnumber the holder", [][]float64{row(.2, true), row(.1, false), row(.1, false)}, []string{"m1", "m2"}, false},
		{"all new and disagree", [][]float64{row(.2, false), row(.1, false)}, nil, true},
		{"the holders disagree", [][]float64{row(.2, true), row(.1, true), row(.2, false)}, nil, true},
	}
	for _, c := range cases {
		var m []float64
		var ids []string
		for r, rw := range c.rows {
			require.Len(t, rw, len(jobSettings)+1)
			m = append(m, rw...)
			ids = append(ids, []string{"m0", "m1", "m2", "m3"}[r])
		}
		err := decideSettings(9, m, ids)
		if c.refused == nil && !c.all {
			require.NoError(t, err, c.name)
			continue
		}
		var se *SettingsError
		require.True(t, errors.As(err, &se), c.name)
		require.ErrorIs(t, err, ErrSettingsMismatch)
		require.Equal(t, c.refused, se.Refused, c.name)
		require.Equal(t, "learning rate", se.Diffs[0].Setting, c.name)
	}
}

// A Schedule reads as configured: its fields, not a probe of its rates.
func TestDescribeScheduleShowsTheConfiguredValues(t *testing.T) {
	w := WarmupCosine{Base: 0.2, Warmup: 4, Total: 1000}
	require.Equal(t, "schedule.WarmupCosine{Base:0.2 Warmup:4 Total:1000 Min:0}", describeSchedule(w))
	require.Equal(t, "schedule.WarmupCosine{Base:0.2 Warmup:4 Total:1000 Min:0}", describeSchedule(&w))
	require.Equal(t, "a schedule with rates 0.5, 0.5, 0.5 at steps 0, 1, 1000", describeSchedule(ScheduleFunc(func(int64) float64 { return 0.5 })))
}
