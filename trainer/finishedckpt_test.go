package trainer_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	. "github.com/elastictrain/elastictrain/trainer"
)

// A checkpoint directory whose job finished its epochs, restored under a
// new job ID with the same epochs, was once a silent success: Run restored
// the final step, trained nothing and returned nil with Finished. Now
// every rank returns ErrFinishedCheckpoint naming the directory, and
// nothing in it changes; more epochs train on from it. A rerun of the
// finished job ID says where its checkpoints are.
func TestAFinishedCheckpointUnderANewJobIDIsAnError(t *testing.T) {
	dir := t.TempDir()
	ckpt := func(int) []Option {
		st, err := NewLocalDir(dir, 3)
		require.NoError(t, err)
		return []Option{WithCheckpointStore(st)}
	}
	a := newJob(t, stores(t)["redis"])
	a.epochs = 1
	a.opts = ckpt
	first := a.start()
	a.wait()
	require.NoError(t, first.err)
	perEpoch := int64(len(a.prob.Samples) / a.batch)
	require.Equal(t, perEpoch, first.res.Step)
	before := dirState(t, dir)

	b := newJob(t, stores(t)["redis"])
	b.epochs = 1
	b.opts = ckpt
	b.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	ws := []*inproc{b.start(), b.start()}
	b.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrFinishedCheckpoint, "worker %d", w.idx)
		require.NotErrorIs(t, w.err, ErrForeignCheckpoint)
		require.ErrorContains(t, w.err, "holds a finished job")
		require.ErrorContains(t, w.err, dir)
		require.False(t, w.res.Finished, "not a success")
		require.Zero(t, w.res.Step)
		require.Equal(t, 1, w.res.Rounds, "refused in its first round, not retried")
		require.Equal(t, 1, strings.Count(w.err.Error(), ErrFinishedCheckpoint.Error()), "said once: %v", w.err)
	}
	require.Equal(t, before, dirState(t, dir), "nothing in the directory was created, changed or removed")

	// The finished job ID again: the hint names the directory.
	again := a.start()
	<-again.done
	require.ErrorIs(t, again.err, elastic.ErrJobFinished)
	require.ErrorContains(t, again.err, "a new job ID trains again")
	require.ErrorContains(t, again.err, dir)

	c := newJob(t, stores(t)["redis"])
	c.epochs = 2
	c.opts = ckpt
	w := c.start()
	c.wait()
	require.NoError(t, w.err)
	require.True(t, w.res.Finished)
	require.Equal(t, 2*perEpoch, w.res.Step, "the second epoch, on from the first")
}
