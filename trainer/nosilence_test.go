package trainer_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
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

// worker is one setting of a worker for TestWorkersThatDisagree...: its
// loader's global batch and dataset length, its epochs and learning rate.
type workerSettings struct {
	batch, samples, epochs int
	lr                     float64
}

// startWith starts a worker of j with its own settings s.
func startWith(t *testing.T, j *job, s workerSettings) *inproc {
	prob := trainertest.NewProblem(s.samples, 4, 0.05, 7)
	m := trainertest.NewModel(4)
	m.StepDelay = 2 * time.Millisecond
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = s.batch, 3
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	require.NoError(t, err)
	cfg := j.config()
	cfg.Epochs = s.epochs
	cfg.Elastic.MinWorkers = 2
	w := &inproc{model: m, done: make(chan struct{})}
	tr, err := New(m.Params(), NewSGD(s.lr), loader, m.Step, j.store(), cfg, WithLogger(testLogger(t, 0)))
	require.NoError(t, err)
	w.tr = tr
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	w.cancel = cancel
	go func() {
		defer close(w.done)
		defer loader.Close()
		w.res, w.err = tr.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-w.done })
	return w
}

// Workers that disagree on the global batch or the dataset length once
// failed round after round (~20 retries, 15 s) with a cursor error; on the
// epochs, one worker's job was silently cut short; on the learning rate,
// one silently won. Now the round they meet in fails at once on every
// member with ErrSettingsMismatch naming the setting and the members, and
// Run returns after that one round.
func TestWorkersThatDisagreeOnSettingsStopInTheirFirstRound(t *testing.T) {
	good := workerSettings{batch: 16, samples: 480, epochs: 2, lr: 0.3}
	for _, c := range []struct {
		setting string
		other   func(workerSettings) workerSettings
		values  [2]string
	}{
		{"global batch", func(s workerSettings) workerSettings { s.batch = 32; return s }, [2]string{"16", "32"}},
		{"dataset length", func(s workerSettings) workerSettings { s.samples = 400; return s }, [2]string{"480", "400"}},
		{"epochs", func(s workerSettings) workerSettings { s.epochs = 3; return s }, [2]string{"2", "3"}},
		{"learning rate", func(s workerSettings) workerSettings { s.lr = 0.1; return s }, [2]string{"0.3", "0.1"}},
	} {
		t.Run(c.setting, func(t *testing.T) {
			j := newJob(t, stores(t)["redis"])
			ws := []*inproc{startWith(t, j, good), startWith(t, j, c.other(good))}
			for _, w := range ws {
				<-w.done
			}
			for i, w := range ws {
				require.ErrorIs(t, w.err, ErrSettingsMismatch, "worker %d", i)
				var se *SettingsError
				require.ErrorAs(t, w.err, &se)
				require.Len(t, se.Diffs, 1, "%v", w.err)
				d := se.Diffs[0]
				require.Equal(t, c.setting, d.Setting)
				require.ErrorContains(t, w.err, c.setting, "named in words")
				require.Len(t, d.Members, 2)
				require.NotEqual(t, d.Members[0], d.Members[1])
				require.ElementsMatch(t, c.values[:], d.Values)
				require.Equal(t, 1, w.res.Rounds, "not retried")
				require.Zero(t, w.res.Step, "nothing trained")
			}
			require.Equal(t, ws[0].err.Error(), ws[1].err.Error(), "every member says the same")
		})
	}
}

// A base learning rate that cannot train is refused by New.
func TestABaseLearningRateThatCannotTrainIsRefused(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	for _, lr := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -0.1} {
		prob := trainertest.NewProblem(64, 4, 0.05, 7)
		m := trainertest.NewModel(4)
		loader, err := dataloader.New(prob.Dataset(), prob.Collate, dataloader.DefaultConfig())
		require.NoError(t, err)
		_, err = New(m.Params(), NewSGD(lr), loader, m.Step, j.store(), j.config())
		require.ErrorIs(t, err, ErrInvalidConfig, "lr %v", lr)
		require.ErrorContains(t, err, "learning rate")
		loader.Close()
	}
}

// A NaN loss in the default (non-deterministic) mode once trained on and
// ended with a nil error. Now every rank stops at that step with
// ErrDiverged.
func TestANaNLossStopsEveryRankWithErrDiverged(t *testing.T) {
	c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	prob := trainertest.NewProblem(480, 4, 0.05, 7)
	job := testredis.JobID(t)
	build := func(w *trainertest.Worker) (trainertest.Runner, error) {
		m := trainertest.NewModel(4)
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch = 16
		loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { loader.Close() })
		n := 0
		step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			loss, err := m.Step(ctx, b)
			if n++; w.Index == 1 && n == 5 {
				return math.NaN(), err
			}
			return loss, err
		}
		cfg := trainertest.Config(job)
		cfg.Elastic.MinWorkers = 2
		return New(m.Params(), NewSGD(0.1), loader, step, w.Store, cfg, w.Options()...)
	}
	ws := []*trainertest.Worker{c.Start(build), c.Start(build)}
	c.Wait()
	for _, w := range ws {
		res, err := w.Result()
		require.ErrorIs(t, err, ErrDiverged, "worker %d", w.Index)
		require.ErrorContains(t, err, "step 5")
		require.Equal(t, int64(4), res.Step)
	}
}

// ErrModelMismatch once said only that the models differ. It names the
// first parameter that differs, with every rank's name and shape, and the
// members.
func TestAModelMismatchNamesTheTensorAndTheRanks(t *testing.T) {
	c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	job := testredis.JobID(t)
	build := func(dim int) func(w *trainertest.Worker) (trainertest.Runner, error) {
		return func(w *trainertest.Worker) (trainertest.Runner, error) {
			prob := trainertest.NewProblem(480, dim, 0.05, 7)
			m := trainertest.NewModel(dim)
			loader, err := dataloader.New(prob.Dataset(), prob.Collate, dataloader.DefaultConfig())
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			cfg := trainertest.Config(job)
			cfg.Elastic.MinWorkers = 2
			return New(m.Params(), NewSGD(0.1), loader, m.Step, w.Store, cfg, w.Options()...)
		}
	}
	ws := []*trainertest.Worker{c.Start(build(4)), c.Start(build(5))}
	c.Wait()
	for _, w := range ws {
		_, err := w.Result()
		require.ErrorIs(t, err, ErrModelMismatch)
		var se *SettingsError
		require.ErrorAs(t, err, &se)
		d := se.Diffs[0]
		require.Equal(t, "parameter 0 (name and shape)", d.Setting)
		require.ElementsMatch(t, []string{`"w" [4]`, `"w" [5]`}, d.Values)
		require.Len(t, d.Members, 2)
		require.ErrorContains(t, err, `"w" [5] on rank`)
		require.ErrorContains(t, err, "ranks hold different models")
	}
}

// When one rank's StepFunc failed, the others went on without it and
// never learned why. Now they log the peer's error.
func TestSurvivorsAreToldWhyAPeersStepFailed(t *testing.T) {
	c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	job := testredis.JobID(t)
	lines := make(chan logLine, 4096)
	build := func(w *trainertest.Worker) (trainertest.Runner, error) {
		prob := trainertest.NewProblem(480, 4, 0.05, 7)
		m := trainertest.NewModel(4)
		loader, err := dataloader.New(prob.Dataset(), prob.Collate, dataloader.DefaultConfig())
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { loader.Close() })
		n := 0
		step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			if n++; w.Index == 1 && n == 5 {
				return 0, fmt.Errorf("cuda: out of memory on purpose")
			}
			return m.Step(ctx, b)
		}
		cfg := trainertest.Config(job)
		cfg.Elastic.MinWorkers = 1
		opts := w.Options()
		if w.Index == 0 {
			opts = append(opts, WithLogger(slog.New(&recorder{lines: lines})))
		}
		return New(m.Params(), NewSGD(0.1), loader, step, w.Store, cfg, opts...)
	}
	// Worker 0 waits for worker 1 in its first round (last call), so both train.
	a, b := c.Start(build), c.Start(build)
	c.Wait()
	_, err := b.Result()
	require.ErrorIs(t, err, ErrStepFailed)
	res, err := a.Result()
	require.NoError(t, err, "the survivor finishes the job")
	require.True(t, res.Finished)
	got := waitLines(t, lines, "a peer's step function failed", 1)
	require.Contains(t, got[0].text, "cuda: out of memory on purpose")
	require.Contains(t, got[0].text, "peer_rank=")
}

// Gradient accumulation outside deterministic mode: with the loader's
// MicroBatch, the StepFunc never sees more than MicroBatch samples, and
// the model trained with 2 ranks is the one trained without micro-batches
// (up to float32 rounding of the sums).
func TestMicroBatchesAccumulateGradientsInTheDefaultMode(t *testing.T) {
	train := func(micro int) ([]float32, int) {
		c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
		job := testredis.JobID(t)
		prob := trainertest.NewProblem(480, 4, 0.05, 7)
		var mu stdsync.Mutex
		largest := 0
		models := make([]*trainertest.Model, 2)
		build := func(w *trainertest.Worker) (trainertest.Runner, error) {
			m := trainertest.NewModel(4)
			models[w.Index] = m
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = 32, 3, micro
			loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
				mu.Lock()
				largest = max(largest, len(b.Indices))
				mu.Unlock()
				return m.Step(ctx, b)
			}
			cfg := trainertest.Config(job)
			cfg.Elastic.MinWorkers = 2
			cfg.Balance = false // equal shares: the test measures what a rank's StepFunc sees
			return New(m.Params(), NewSGD(0.2), loader, step, w.Store, cfg, w.Options()...)
		}
		ws := []*trainertest.Worker{c.Start(build), c.Start(build)}
		c.Wait()
		for _, w := range ws {
			_, err := w.Result()
			require.NoError(t, err)
		}
		require.Equal(t, models[0].W, models[1].W)
		return models[0].W, largest
	}
	whole, big := train(0)
	accumulated, small := train(4)
	require.Equal(t, 16, big, "each rank's share of 32")
	require.Equal(t, 4, small, "the StepFunc saw at most MicroBatch samples")
	require.InDeltaSlice(t, whole, accumulated, 1e-4)
}

// A leased loader reports its settings too, so its workers are compared.
func TestALeasedLoaderReportsItsDataSettings(t *testing.T) {
	var _ DataSettings = (*dataloader.LeasedLoader[trainertest.Sample, trainertest.Batch])(nil)
}

// A worker that trained, then hung past its progress timeout while the
// other finished the job, once returned Result{Finished: true} with a nil
// error when it woke, holding the parameters of its last step: a caller
// that saves the model on success saved a stale one. Now its Run's error
// wraps elastic.ErrJobFinished and says the parameters are not final,
// while the worker that finished returns nil.
func TestAWorkerLeftBehindAtTheEndIsNotASuccess(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.epochs = 2
	j.mutate = func(c *Config) { c.Elastic.ProgressTimeout = 500 * time.Millisecond }
	release := make(chan struct{})
	var once stdsync.Once
	j.opts = func(i int) []Option {
		if i != 1 {
			return nil
		}
		return []Option{WithHooks(Hooks{OnStep: func(s StepInfo) {
			if s.Step == 5 {
				once.Do(func() { <-release }) // hung until the other finished
			}
		}})}
	}
	first, second := j.start(), j.start()
	<-first.done
	close(release)
	<-second.done
	j.wait()
	require.NoError(t, first.err)
	require.True(t, first.res.Finished)
	require.ErrorIs(t, second.err, elastic.ErrJobFinished)
	require.ErrorContains(t, second.err, "not the final model")
	require.NotEqual(t, first.model.W, second.model.W, "the late worker's parameters are stale")
	rep := VerifyAudit(j.audit.Entries(), j.epochs, j.expected)
	require.Zero(t, rep.Missing+rep.Duplicates, "audit")
}

// A checkpoint of a job with more epochs (its position past this job's
// end) once ended this job at once: Run returned nil, nothing trained.
// Now it is ErrForeignCheckpoint (wrapping ErrSettingsMismatch) on every
// rank, and the directory is left as it was.
func TestACheckpointPastThisJobsEpochsIsRefusedUntouched(t *testing.T) {
	dir := t.TempDir()
	newStore := func() CheckpointStore {
		st, err := NewLocalDir(dir, 2)
		require.NoError(t, err)
		return st
	}
	a := newJob(t, stores(t)["memory"])
	a.epochs = 3
	a.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	a.start()
	a.wait()
	require.NoError(t, a.workers[0].err)
	before := dirState(t, dir)

	b := newJob(t, stores(t)["memory"])
	b.epochs = 2
	b.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	w := b.start()
	b.wait()
	require.ErrorIs(t, w.err, ErrForeignCheckpoint)
	require.ErrorIs(t, w.err, ErrSettingsMismatch)
	require.ErrorContains(t, w.err, "past this job's 2 epochs")
	require.Zero(t, w.res.Step)
	require.Equal(t, before, dirState(t, dir), "nothing in the directory was created, changed or removed")

	// A job of the same epochs under a new job ID once restored the final
	// checkpoint and returned success, having trained nothing: it is
	// ErrFinishedCheckpoint (TestAFinishedCheckpointUnderANewJobIDIsAnError).
	c := newJob(t, stores(t)["memory"])
	c.epochs = 3
	c.opts = func(int) []Option { return []Option{WithCheckpointStore(newStore())} }
	w = c.start()
	c.wait()
	require.ErrorIs(t, w.err, ErrFinishedCheckpoint)
	require.Equal(t, before, dirState(t, dir))
}
