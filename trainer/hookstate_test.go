package trainer_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// hookState is user state changed only in Hooks.OnStep and carried by
// WithState: how many steps of the model's history it saw and the last.
type hookState struct {
	counter, last int64
}

func (s *hookState) AppendState(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.counter))
	return binary.LittleEndian.AppendUint64(dst, uint64(s.last))
}

func (s *hookState) LoadState(src []byte) error {
	if len(src) == 0 {
		*s = hookState{}
		return nil
	}
	if len(src) != 16 {
		return fmt.Errorf("hook state of %d bytes", len(src))
	}
	s.counter, s.last = int64(binary.LittleEndian.Uint64(src)), int64(binary.LittleEndian.Uint64(src[8:]))
	return nil
}

// hookLR is the learning-rate schedule the test's OnStep sets from its
// state: a step trained at another step's rate changes the final model.
func hookLR(counter int64) float64 { return 0.01 * float64(1+counter%5) }

// hookJob runs phases of one deterministic job whose state and learning
// rate are set only in OnStep, with durable checkpoints in dir.
type hookJob struct {
	t     *testing.T
	prob  *trainertest.Problem
	cfg   Config
	ckpt  CheckpointStore
	mu    stdsync.Mutex
	bad   []string
	srcs  map[string]int // OnRound sources seen
	step  atomic.Int64   // the largest step any worker applied
	ck    atomic.Int64   // the newest checkpoint written
	model map[*trainertest.Worker]*trainertest.Model
	moved chan struct{} // signalled when step or ck grows
	// holdAt > 0 holds every rank in OnStep at that step or later, once a
	// checkpoint of holdCk or later was written, until hold is closed: the
	// test kills the whole job there, and the job must not run to its end
	// first (a CPU hog let a 150-step job finish before its kills).
	holdAt atomic.Int64
	holdCk int64
	hold   chan struct{}
}

func (j *hookJob) violation(format string, a ...any) {
	j.mu.Lock()
	j.bad = append(j.bad, fmt.Sprintf(format, a...))
	j.mu.Unlock()
}

func (j *hookJob) start(c *trainertest.Cluster) *trainertest.Worker {
	return c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
		m := trainertest.NewModel(j.prob.Dim)
		m.StepDelay = time.Millisecond
		j.mu.Lock()
		j.model[w] = m
		j.mu.Unlock()
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.MicroBatch, dcfg.Seed = 16, 4, 5
		loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		j.t.Cleanup(func() { loader.Close() })
		opt := NewMomentum(hookLR(0), 0.9)
		st := &hookState{}
		hooks := Hooks{
			OnRound: func(r RoundInfo) {
				j.mu.Lock()
				j.srcs[r.Source]++
				j.mu.Unlock()
				// The state restored with step r.Step is that step's: it saw
				// exactly the r.Step steps of the history, the last being r.Step.
				if st.counter != r.Step || st.last != r.Step {
					j.violation("round %d (%s) restored step %d with hook state %+v", r.Round, r.Source, r.Step, *st)
				}
				if lr := opt.LearningRate(); lr != hookLR(r.Step) {
					j.violation("round %d (%s) restored step %d with learning rate %v, want %v", r.Round, r.Source, r.Step, lr, hookLR(r.Step))
				}
			},
			OnStep: func(s StepInfo) {
				st.counter++
				st.last = s.Step
				opt.SetLearningRate(hookLR(st.counter)) // the rate of the next step
				j.raise(&j.step, s.Step)
				if at := j.holdAt.Load(); at > 0 && s.Step >= at && j.ck.Load() >= j.holdCk {
					<-j.hold
				}
			},
			OnCheckpoint: func(s int64, err error) {
				if err == nil {
					j.raise(&j.ck, s)
				}
			},
		}
		opts := append(w.Options(), WithState(st), WithHooks(hooks))
		if j.ckpt != nil {
			opts = append(opts, WithCheckpointStore(j.ckpt))
		}
		return New(m.Params(), opt, loader, m.Step, w.Store, j.cfg, opts...)
	})
}

func newHookJob(t *testing.T, ckpt CheckpointStore) *hookJob {
	cfg := trainertest.Config(t.Name())
	cfg.Epochs, cfg.Deterministic, cfg.CheckpointEvery = 3, true, 10
	cfg.Elastic.MinWorkers = 2
	prob := trainertest.NewProblem(800, 6, 0.05, 5)
	for i := range prob.Samples {
		// One feature 2^-30 of the others: its weight's gradient is so
		// small that the fixed-point scale shows in its bits, so a
		// restored round must scale as the undisturbed run did (the
		// exponent in the checkpoint).
		s := &prob.Samples[i]
		s.X = append([]float32(nil), s.X...)
		s.X[0] *= 0x1p-30
	}
	return &hookJob{t: t, prob: prob, cfg: cfg, ckpt: ckpt,
		srcs: map[string]int{}, model: map[*trainertest.Worker]*trainertest.Model{}, moved: make(chan struct{}, 1),
		hold: make(chan struct{})}
}

// raise sets *v to at least x and signals the change.
func (j *hookJob) raise(v *atomic.Int64, x int64) {
	for cur := v.Load(); x > cur; cur = v.Load() {
		if v.CompareAndSwap(cur, x) {
			select {
			case j.moved <- struct{}{}:
			default:
			}
			return
		}
	}
}

func (j *hookJob) waitFor(what string, v *atomic.Int64, at int64) {
	j.t.Helper()
	deadline := time.After(30 * time.Second)
	for v.Load() < at {
		select {
		case <-j.moved:
		case <-deadline:
			j.t.Fatalf("no %s reached %d", what, at)
		}
	}
}

func (j *hookJob) finished(ws []*trainertest.Worker) *trainertest.Model {
	j.t.Helper()
	var ref *trainertest.Model
	for _, w := range ws {
		res, err := w.Result()
		require.NoError(j.t, err, "%v", w)
		require.True(j.t, res.Finished, "%v", w)
		m := j.model[w]
		if ref != nil {
			require.Equal(j.t, ref.W, m.W, "identical parameters on every rank")
		}
		ref = m
	}
	return ref
}

// State and the learning rate set only in Hooks.OnStep are part of that
// step's commit and checkpoint: after a kill, a join and a whole-job
// restart each restored round holds the restored step's hook state and
// rate, and the final parameters are bit-identical to an undisturbed run's
// (deterministic mode). One feature is so small that the
// fixed-point scale shows in the bits: without the scale's exponent in
// every commit and checkpoint, w[0] differs in its last bits.
func TestHookStateIsPartOfItsStepsCommit(t *testing.T) {
	// The undisturbed run.
	ref := newHookJob(t, nil)
	rc := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	rws := []*trainertest.Worker{ref.start(rc), ref.start(rc)}
	rc.Wait()
	want := ref.finished(rws)
	require.Empty(t, ref.bad)

	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	j := newHookJob(t, dir)
	j.holdAt.Store(60)
	j.holdCk = 50
	c1 := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	ws := []*trainertest.Worker{j.start(c1), j.start(c1), j.start(c1)}
	j.waitFor("step", &j.step, 17)
	c1.Kill(ws[1])
	j.waitFor("step", &j.step, 35)
	ws = append(ws, j.start(c1))
	j.waitFor("step", &j.step, 60)
	j.waitFor("checkpoint", &j.ck, 50)
	for _, w := range ws {
		c1.Kill(w) // the whole job crashes, held at step 60 or later
	}
	j.holdAt.Store(0)
	close(j.hold)
	for _, w := range ws {
		<-w.Done()
	}
	// The job restarts: new processes, a new rendezvous, the checkpoints.
	c2 := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	ws2 := []*trainertest.Worker{j.start(c2), j.start(c2)}
	c2.Wait()
	got := j.finished(ws2)
	require.Empty(t, j.bad, "restored hook state")
	require.Positive(t, j.srcs["commit"], "a round restored a commit: %v", j.srcs)
	require.Positive(t, j.srcs["checkpoint"], "the restart restored a checkpoint: %v", j.srcs)
	res, _ := ws2[0].Result()
	require.GreaterOrEqual(t, res.Recoveries, 1)
	for i := range want.W {
		require.Equal(t, math.Float32bits(want.W[i]), math.Float32bits(got.W[i]), "w[%d]: undisturbed %v, disturbed %v", i, want.W[i], got.W[i])
	}
	require.Equal(t, math.Float32bits(want.B[0]), math.Float32bits(got.B[0]), "b")
}

// A final checkpoint that cannot be written is ErrCheckpoint on every rank
// of the last round, not on rank 0 only: the job finished, but every
// worker's Run says its durability was lost.
func TestFailedFinalCheckpointFailsEveryRank(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	store := &flakyStore{CheckpointStore: dir, fail: func(step int64) bool { return step == 90 }} // the last step
	j := newJob(t, stores(t)["memory"])
	j.epochs = 3
	j.mutate = func(c *Config) { c.Elastic.MinWorkers, c.CheckpointEvery = 3, 20 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(store)} }
	ws := []*inproc{j.start(), j.start(), j.start()}
	j.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrCheckpoint, "worker %d (rank %d)", w.idx, w.res.Rank)
		require.True(t, w.res.Finished, "worker %d", w.idx)
		require.EqualValues(t, 90, w.res.Step)
	}
	steps, err := dir.List(context.Background())
	require.NoError(t, err)
	require.NotContains(t, steps, int64(90))
	// Periodic checkpoints were written; which ones depends on timing (a
	// newer submission replaces one waiting behind a slow write, and the
	// final save replaces a waiting one: under -race only step 20 may be).
	require.NotEmpty(t, steps, "the periodic checkpoints were written")
	for _, s := range steps {
		require.True(t, s%20 == 0 && s < 90, "checkpoint of step %d: want periodic ones (every 20 steps) only", s)
	}
}
