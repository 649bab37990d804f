package faultinject_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
)

// The same seed gives the same schedule; another seed another one.
func TestScheduleReplaysFromSeed(t *testing.T) {
	cfg := faultinject.ScheduleConfig{Faults: 50}
	a := faultinject.NewSchedule(7, cfg)
	require.Equal(t, a, faultinject.NewSchedule(7, cfg))
	require.NotEqual(t, a, faultinject.NewSchedule(8, cfg))
}

// A schedule keeps the live workers within bounds and, with EachKind, has
// every kind; durations stay within MaxDuration.
func TestScheduleBounds(t *testing.T) {
	for seed := range uint64(200) {
		cfg := faultinject.ScheduleConfig{Faults: 20, Workers: 4, MinLive: 3, MaxLive: 6, MaxDuration: 2 * time.Second, EachKind: true}
		s := faultinject.NewSchedule(seed, cfg)
		require.Len(t, s, 20)
		live := 4
		seen := map[faultinject.Kind]bool{}
		for _, f := range s {
			seen[f.Kind] = true
			switch f.Kind {
			case faultinject.Kill, faultinject.Term:
				live--
			case faultinject.Join:
				live++
			}
			require.GreaterOrEqual(t, live, 2, "seed %d", seed)
			require.LessOrEqual(t, live, 6, "seed %d", seed)
			require.LessOrEqual(t, f.Duration, 2*time.Second)
			require.True(t, f.After >= 3 && f.After <= 15)
		}
		require.Len(t, seen, len(faultinject.AllKinds()), "seed %d: %v", seed, s)
	}
}

func TestParseKinds(t *testing.T) {
	k, err := faultinject.ParseKinds("kill, peer-cut")
	require.NoError(t, err)
	require.Equal(t, []faultinject.Kind{faultinject.Kill, faultinject.PeerCut}, k)
	all, err := faultinject.ParseKinds("all")
	require.NoError(t, err)
	require.Len(t, all, 16)
	_, err = faultinject.ParseKinds("meteor")
	require.Error(t, err)
}
