package trainer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
)

// A fresh job split evenly on the sync transport's layout (two workers,
// one with Streams 1): neither side is the job, nobody holds trained state
// to break the tie, so both stop with ErrSettingsMismatch, Refused empty,
// naming the setting with both values; nothing is trained. Once both
// waited out DialTimeout round after round until their failure budgets
// ran out, and the error named no setting.
func TestAFreshJobSplitEvenlyOnTheSyncLayoutStopsWithTheMismatch(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	j.mutate = func(cfg *Config) { cfg.Elastic.MinWorkers = 2 }
	a := j.member(4)
	j.mutate = func(cfg *Config) { cfg.Elastic.MinWorkers = 2; cfg.Sync.Streams = 1 }
	b := j.member(4)
	j.wait()
	for _, w := range []*inproc{a, b} {
		require.ErrorIs(t, w.err, ErrSettingsMismatch, "worker %d", w.idx)
		var se *SettingsError
		require.ErrorAs(t, w.err, &se)
		require.Empty(t, se.Refused, "nobody is the job: %v", w.err)
		require.Len(t, se.Diffs, 1)
		require.Equal(t, "sync streams", se.Diffs[0].Setting)
		require.ElementsMatch(t, []string{"2", "1"}, se.Diffs[0].Values, "both values as configured")
		require.Zero(t, w.res.Step)
	}
}
