package trainer_test

import (
	"math"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/internal/testredis"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

func TestSchedulesGiveTheirFormulas(t *testing.T) {
	wc := WarmupCosine{Base: 0.4, Warmup: 4, Total: 14, Min: 0.1}
	require.NoError(t, wc.Validate())
	for s, want := range map[int64]float64{0: 0.1, 1: 0.2, 3: 0.4, 4: 0.4, 9: 0.25, 14: 0.1, 100: 0.1} {
		require.InDelta(t, want, wc.LR(s), 1e-12, "step %d", s)
	}
	sd := StepDecay{Base: 1, Warmup: 2, Every: 3, Gamma: 0.5}
	require.NoError(t, sd.Validate())
	for s, want := range map[int64]float64{0: 0.5, 1: 1, 2: 1, 4: 1, 5: 0.5, 8: 0.25} {
		require.InDelta(t, want, sd.LR(s), 1e-12, "step %d", s)
	}
	for _, bad := range []interface{ Validate() error }{
		WarmupCosine{Base: math.NaN()}, WarmupCosine{Base: 0}, WarmupCosine{Base: 1, Min: 2},
		StepDecay{Base: 1, Every: 0, Gamma: 1}, StepDecay{Base: 1, Every: 1, Gamma: 0},
	} {
		require.ErrorIs(t, bad.Validate(), ErrInvalidConfig, "%+v", bad)
	}
}

// lrRecord is one applied step as a worker's OnStep saw it.
type lrRecord struct {
	step int64
	lr   float64
}

// A learning-rate schedule tied to the global step: a kill, a join and a
// whole-job restart from a checkpoint, all in the middle of the warm-up,
// leave the rate of every applied step equal to the schedule's value at
// that global step (a rollback re-trains steps with the same rates; a
// restart continues the warm-up where the checkpoint was taken).
func TestTheScheduleHoldsAcrossAKillAJoinAndAWholeJobRestart(t *testing.T) {
	sched := WarmupCosine{Base: 0.3, Warmup: 200, Total: 400}
	prob := trainertest.NewProblem(480, 4, 0.05, 7)
	perEpoch := int64(480 / 16)
	dir := t.TempDir()
	var mu stdsync.Mutex
	var recs []lrRecord
	var rounds []RoundInfo
	steps := make(chan int64, 4096)
	ckpts := make(chan int64, 64) // steps of the checkpoints written (any rank 0's)
	// Every rank holds in OnStep from step 24 until the test killed the
	// whole job there: a 60-step job must not run to its end before its
	// kills (under a CPU hog the test's goroutine can lag the workers).
	var holdAt atomic.Int64
	holdAt.Store(24)
	hold := make(chan struct{})
	build := func(jobID string) func(w *trainertest.Worker) (trainertest.Runner, error) {
		return func(w *trainertest.Worker) (trainertest.Runner, error) {
			m := trainertest.NewModel(4)
			m.StepDelay = 2 * time.Millisecond
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed = 16, 3
			loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			ck, err := NewLocalDir(dir, 0)
			if err != nil {
				return nil, err
			}
			cfg := trainertest.Config(jobID)
			cfg.Epochs = 2
			cfg.CheckpointEvery = 5
			cfg.Elastic.MinWorkers = 2
			opts := append(w.Options(), WithSchedule(sched), WithCheckpointStore(ck), WithHooks(Hooks{OnCheckpoint: func(step int64, err error) {
				if err == nil && step > 0 {
					select {
					case ckpts <- step:
					default:
					}
				}
			}, OnRound: func(r RoundInfo) {
				mu.Lock()
				rounds = append(rounds, r)
				mu.Unlock()
			}, OnStep: func(s StepInfo) {
				mu.Lock()
				recs = append(recs, lrRecord{s.Step, s.LearningRate})
				mu.Unlock()
				select {
				case steps <- s.Step:
				default:
				}
				if h := holdAt.Load(); h > 0 && s.Step >= h {
					<-hold
				}
			}}))
			// The optimizer's own rate is not the schedule's: the schedule wins.
			return New(m.Params(), NewSGD(1), loader, m.Step, w.Store, cfg, opts...)
		}
	}
	waitStep := func(s int64) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case got := <-steps:
				if got >= s {
					return
				}
			case <-deadline:
				t.Fatalf("no worker reached step %d", s)
			}
		}
	}

	c := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	job := testredis.JobID(t)
	a, b, d := c.Start(build(job)), c.Start(build(job)), c.Start(build(job))
	waitStep(8)
	c.Kill(b) // a kill: the others roll back to their last commit
	waitStep(16)
	e := c.Start(build(job)) // a join
	waitStep(24)
	// The restart must find a checkpoint, and rank 0 writes them in the
	// background: wait for one to be written before the crash (ci of
	// 2026-12-05 under a CPU hog, with fsyncs taking seconds: no write of
	// the first 24 steps had finished when the test killed the job, and the
	// restart began from the initial values).
	select {
	case <-ckpts:
	case <-time.After(30 * time.Second):
		t.Fatal("no checkpoint written within 30 s of step 24")
	}
	for _, w := range []*trainertest.Worker{a, d, e} {
		c.Kill(w) // the whole job crashes, held at step 24 or later
	}
	holdAt.Store(0)
	close(hold)

	// The whole job restarts from its newest checkpoint (a new store: the
	// old one still has the dead members).
	c2 := trainertest.NewCluster(t, trainertest.ClusterConfig{})
	ws := []*trainertest.Worker{c2.Start(build(job)), c2.Start(build(job))}
	c2.Wait()
	for _, w := range ws {
		res, err := w.Result()
		require.NoError(t, err)
		require.Equal(t, 2*perEpoch, res.Step)
	}

	mu.Lock()
	defer mu.Unlock()
	seen := map[int64]bool{}
	for _, r := range recs {
		require.Equal(t, sched.LR(r.step-1), r.lr, "the rate of global step %d", r.step)
		seen[r.step] = true
	}
	for s := int64(1); s <= 2*perEpoch; s++ {
		require.True(t, seen[s], "global step %d was recorded", s)
	}
	require.Less(t, sched.LR(2*perEpoch-1), sched.Base, "the whole test ran inside the warm-up")
	var recovered, restored bool
	for _, r := range rounds {
		recovered = recovered || r.Recovery
		restored = restored || (r.Source == "checkpoint" && r.Step > 0)
	}
	require.True(t, recovered, "a round recovered from the kill: %+v", rounds)
	require.True(t, restored, "the restart restored a checkpoint taken in the warm-up: %+v", rounds)
}
