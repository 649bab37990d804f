package trainer_test

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Adam's frozen commits through a real job, deterministic: a run of 2
// workers; one of 3 in which one is killed (the survivors agree on the
// commit they hold, rank 0 encodes its frozen state and broadcasts it) and
// one joins later; and one of 3 in which a rank fails right after step
// 20's allreduce, so the others apply step 20 and then roll back to commit
// 19, which Adam's next update must have left untouched: all three end
// with the same parameter bits.
func TestAdamDeterministicAcrossAKillAndAJoin(t *testing.T) {
	run := func(workers int, fault func(j *memJob, ws []*trainertest.Worker) *trainertest.Worker, afterReduce func(rank int, step int64) error) *trainertest.Model {
		j := newMemJob(t, 640, 8, 2)
		j.afterReduce = afterReduce
		j.opt = func() Optimizer { return NewAdam(0.02) }
		j.micro, j.cfg.Deterministic = 4, true
		j.cfg.Elastic.MinWorkers = 2
		ws := make([]*trainertest.Worker, workers)
		for i := range ws {
			ws[i] = j.start()
		}
		var victim *trainertest.Worker
		if fault != nil {
			victim = fault(j, ws)
		}
		j.c.Wait()
		for _, w := range ws {
			if w != victim {
				res, err := w.Result()
				require.NoError(t, err, "%v", w)
				require.True(t, res.Finished)
				return j.models[w]
			}
		}
		t.Fatal("no finisher")
		return nil
	}
	want := run(2, nil, nil)
	got := run(3, func(j *memJob, ws []*trainertest.Worker) *trainertest.Worker {
		j.waitStep(25)
		j.c.Kill(ws[1])
		j.waitStep(50)
		j.start()
		return ws[1]
	}, nil)
	require.Equal(t, want.W, got.W, "the weights' bits, with a kill and a join")
	require.Equal(t, want.B, got.B)
	var fired atomic.Bool
	rolled := run(3, nil, func(rank int, step int64) error {
		if rank == 1 && step == 20 && fired.CompareAndSwap(false, true) {
			return errors.New("injected failure after the allreduce")
		}
		return nil
	})
	require.True(t, fired.Load())
	require.Equal(t, want.W, rolled.W, "the weights' bits, with a rollback of an applied step")
	require.Equal(t, want.B, rolled.B)
}
