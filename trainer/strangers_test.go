package trainer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	. "github.com/elastictrain/elastictrain/trainer"
)

const wrongSecret = "another secret of 32 bytes, alas"

// Must-show 1: three workers with the job secret and one without, started
// together on a fresh job (nobody has trained, so no member holds state),
// real TCP and real Redis. The three prove the secret to one another, a
// majority of the round of four: they evict the stranger, form a round of
// three and finish, exactly once. The stranger alone stops, with
// ErrStranger (a *BudgetError: errors.Is(err, ErrFailureBudget) holds too),
// after the one round it spoilt.
func TestStrangerInAFreshJobIsShutOut(t *testing.T) {
	for _, at := range []int{0, 3} {
		t.Run(fmt.Sprintf("stranger started %d", at), func(t *testing.T) {
			j := newJob(t, stores(t)["redis"])
			base := func(c *Config) {
				c.Elastic.MinWorkers, c.Elastic.MaxWorkers = 3, 4
				c.Elastic.LastCall = 2 * time.Second // the first round waits for all four
			}
			var honest []*inproc
			var s *inproc
			for i := range 4 {
				if i == at {
					j.mutate = func(c *Config) { base(c); c.Sync.Secret = []byte(wrongSecret) }
					s = j.start()
					continue
				}
				j.mutate = base
				honest = append(honest, j.start())
			}
			j.wait()
			j.checkFinished(honest)
			for _, w := range honest {
				require.Equal(t, 3, w.res.WorldSize, "worker %d", w.idx)
				require.Zero(t, w.res.Recoveries, "a round that failed to form spends no budget")
			}
			require.ErrorIs(t, s.err, ErrStranger, "stranger: %+v", s.res)
			require.ErrorIs(t, s.err, ErrFailureBudget)
			var be *BudgetError
			require.ErrorAs(t, s.err, &be)
			require.True(t, be.Stranger)
			require.Equal(t, 1, be.Unformed, "the stranger spoilt one round")
			require.Contains(t, s.err.Error(), "authentication failed")
			require.Equal(t, 1, s.res.Rounds)
			require.Equal(t, 4, s.res.WorldSize, "the stranger was in the first round")
			require.Zero(t, s.res.Step, "the stranger never trained")
		})
	}
}

// One worker with the secret and one without, in a fresh job: neither is a
// majority of the round, so nobody can tell which side is wrong and nobody
// reports; they stop with ErrFailureBudget after MaxRecoveries rounds,
// naming the authentication failure, and neither claims to be the stranger.
// When one gives up while the other's last connect is still in flight, the
// other stops too (TestLoneStrangerWhosePeerLeftMidConnectGivesUp); one
// that was still pausing between rounds when the other left is alone below
// MinWorkers and waits for a peer until JoinTimeout (5 s here), as any
// lone worker does.
func TestStrangerAndOneWorkerBothGiveUp(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	base := func(c *Config) { c.Elastic.MinWorkers, c.MaxRecoveries, c.Elastic.JoinTimeout = 2, 2, 5*time.Second }
	j.mutate = base
	a := j.start()
	j.mutate = func(c *Config) { base(c); c.Sync.Secret = []byte(wrongSecret) }
	s := j.start()
	j.wait()
	gaveUp := 0
	for _, w := range []*inproc{a, s} {
		require.Zero(t, w.res.Step, "worker %d trained nothing", w.idx)
		require.NotErrorIs(t, w.err, ErrStranger, "worker %d", w.idx)
		if errors.Is(w.err, elastic.ErrJoinTimeout) {
			continue // left alone by the other's giving up
		}
		gaveUp++
		require.ErrorIs(t, w.err, ErrFailureBudget, "worker %d", w.idx)
		require.NotErrorIs(t, w.err, ErrStranger, "worker %d", w.idx)
		var be *BudgetError
		require.ErrorAs(t, w.err, &be)
		require.Equal(t, 3, be.Unformed)
		require.Contains(t, w.err.Error(), "authentication failed")
		require.Zero(t, w.res.Step)
	}
	require.Positive(t, gaveUp, "at least the first to give up stops with ErrFailureBudget")
}
