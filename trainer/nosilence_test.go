package trainer_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Running a job ID again after it finished trained nothing and once
// returned Result{Finished: true} with a nil error: success for an
// untrained model. Now Run's error wraps elastic.ErrJobFinished, and the
// late worker's parameters are untouched.
func TestRerunOfAFinishedJobIsAnError(t *testing.T) {
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			j := newJob(t, st)
			j.epochs = 1
			first := j.start()
			j.wait()
			j.checkFinished([]*inproc{first})

			again := j.start()
			before := slices.Clone(again.model.W)
			<-again.done
			require.ErrorIs(t, again.err, elastic.ErrJobFinished)
			require.ErrorContains(t, again.err, j.id, "the error names the job")
			require.Zero(t, again.res.Step, "no step was trained")
			require.Zero(t, again.res.Rounds)
			require.Equal(t, before, again.model.W, "the parameters stay as they were")
		})
	}
}

// dirState is every file of dir: its name, size, mode, time and content.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[string]string{}
	for _, e := range entries {
		info, err := e.Info()
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		m[e.Name()] = fmt.Sprintf("%d %v %v %x", info.Size(), info.Mode(), info.ModTime().UnixNano(), sha256.Sum256(b))
	}
	return m
}

// A checkpoint directory written by another model was once skipped with a
// warning per file; the job trained from scratch and rotated the other
// model's checkpoints out. Now every worker refuses to start, with
// ErrForeignCheckpoint naming the tensor, and nothing in the directory is
// created, changed or removed, not even a leftover temporary file.
func TestACheckpointDirectoryOfAnotherModelIsRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	newStore := func() CheckpointStore {
		st, err := NewLocalDir(dir, 2)
		require.NoError(t, err)
		return st
	}
	// Model A (4 features) writes its history.
	a := newJob(t, stores(t)["memory"])
	a.epochs = 1
	a.mutate = func(c *Config) { c.CheckpointEvery = 5 }
	a.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	a.start()
	a.wait()
	require.NoError(t, a.workers[0].err)
	leftover := filepath.Join(dir, ".tmp-ckpt-00000000000000000099.etc-123")
	require.NoError(t, os.WriteFile(leftover, []byte("half a checkpoint"), 0o644))
	before := dirState(t, dir)
	require.Greater(t, len(before), 2)

	// Model B (5 features), a new job on the same directory.
	b := newJob(t, stores(t)["redis"])
	b.prob = trainertest.NewProblem(480, 5, 0.05, 7)
	b.mutate = func(c *Config) { c.Elastic.MinWorkers = 2; c.CheckpointEvery = 5 }
	b.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	ws := []*inproc{b.start(), b.start()}
	b.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrForeignCheckpoint, "worker %d", w.idx)
		require.Zero(t, w.res.Step)
		require.Equal(t, 1, w.res.Rounds, "refused in its first round, not retried")
	}
	rank0 := ws[0]
	if ws[1].res.Rank == 0 {
		rank0 = ws[1]
	}
	require.ErrorIs(t, rank0.err, ErrShapeMismatch)
	require.ErrorContains(t, rank0.err, `"w"`, "the error names the tensor")
	require.ErrorContains(t, rank0.err, dir, "and the directory")
	require.Equal(t, before, dirState(t, dir), "nothing in the directory was created, changed or removed")

	// Model A again (a new job restoring the history) matches: the
	// leftover goes, the checkpoints stay.
	c := newJob(t, stores(t)["memory"])
	c.epochs = 2
	c.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	w := c.start()
	c.wait()
	require.NoError(t, w.err)
	_, err := os.Stat(leftover)
	require.ErrorIs(t, err, os.ErrNotExist, "the leftover temporary file was removed once the model matched")
}
