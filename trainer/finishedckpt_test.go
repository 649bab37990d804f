package trainer_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
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

// tamperedStore is a CheckpointStore that saves step at with its
// optimizer state cut in half, checksums recomputed.
type tamperedStore struct {
	CheckpointStore
	at     int64
	params []Param
}

func (s *tamperedStore) Save(ctx context.Context, step int64, data []byte) error {
	if step == s.at {
		sgd := NewSGD(0.3).AppendState(nil)
		bad, err := WithOptimizerState(data, s.params, sgd[:len(sgd)/2])
		if err != nil {
			return err
		}
		data = bad
	}
	return s.CheckpointStore.Save(ctx, step, data)
}

// A breaker found that a checkpoint whose checksums hold but whose
// optimizer state does not load was installed round after round until the
// failure budget ran out ("failure budget exhausted ... sgd: ..."), the
// valid checkpoint beside it never tried. It is skipped now like a damaged
// file: the job goes on from the older one.
func TestACheckpointWhoseOptimizerStateDoesNotLoadIsSkipped(t *testing.T) {
	dir := t.TempDir()
	a := newJob(t, stores(t)["memory"])
	a.epochs = 1
	a.mutate = func(c *Config) { c.CheckpointEvery = 10 }
	perEpoch := int64(len(a.prob.Samples) / a.batch)
	params := trainertest.NewModel(a.prob.Dim).Params()
	a.opts = func(int) []Option {
		st, err := NewLocalDir(dir, 0)
		require.NoError(t, err)
		return []Option{WithCheckpointStore(&tamperedStore{CheckpointStore: st, at: perEpoch, params: params})}
	}
	w := a.start()
	a.wait()
	require.NoError(t, w.err)
	st, err := NewLocalDir(dir, 0)
	require.NoError(t, err)
	steps, err := st.List(context.Background())
	require.NoError(t, err)
	require.Contains(t, steps, perEpoch, "the tampered checkpoint is the newest")
	older := int64(0) // where the job must go on from: the newest other checkpoint
	for _, s := range steps {
		if s < perEpoch {
			older = max(older, s)
		}
	}

	b := newJob(t, stores(t)["memory"])
	b.epochs = 2
	b.opts = func(int) []Option {
		st, err := NewLocalDir(dir, 0)
		require.NoError(t, err)
		return []Option{WithCheckpointStore(st)}
	}
	w = b.start()
	b.wait()
	require.NoError(t, w.err, "not a failure budget run out on the tampered checkpoint")
	require.True(t, w.res.Finished)
	require.Equal(t, 2*perEpoch, w.res.Step)
	var restored []int64
	for _, e := range b.audit.Entries() {
		if e.Kind == "agreed" && e.Restored {
			restored = append(restored, e.Step)
		}
	}
	require.Equal(t, []int64{older}, slices.Compact(restored), "restored from step %d, the newest checkpoint that loads", older)
}
