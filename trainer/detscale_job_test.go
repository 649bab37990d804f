package trainer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/sync"
	. "github.com/elastictrain/elastictrain/trainer"

	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Deterministic mode where a step's gradients grow far past the steps
// before (targets scaled up a thousandfold): runs of 1 and 2 workers and
// one of 3 in which a worker is killed and another joins, all balancing,
// end with the same parameter bits. The ordered sum (the in-memory
// Backend's Synchronizers implement sync.OrderedReducer) has no scale:
// no step is summed twice. The fixed-point step (a Backend without the
// capability) takes its scale from the step before, so such a step is
// summed again, on every rank, at a wider scale, and the runs re-sum the
// same steps.
func TestDeterministicThroughScaleGrowth(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		name := "ordered"
		if fixed {
			name = "fixed point"
		}
		t.Run(name, func(t *testing.T) { deterministicThroughScaleGrowth(t, fixed) })
	}
}

func deterministicThroughScaleGrowth(t *testing.T, fixed bool) {
	run := func(workers int, fault bool) (*trainertest.Model, []int64) {
		j := newMemJob(t, 640, 8, 2)
		j.micro, j.cfg.Deterministic = 4, true
		if fixed {
			j.backend = func(w *trainertest.Worker) []Option { return []Option{WithBackend(unordered{w.Backend})} }
		}
		for i := range j.prob.Samples {
			if i%97 == 5 { // a few steps whose gradients are about 1000 times the others'
				j.prob.Samples[i].Y *= 1000
			}
		}
		ws := make([]*trainertest.Worker, workers)
		for i := range ws {
			ws[i] = j.start()
		}
		var victim *trainertest.Worker
		if fault {
			j.waitStep(25)
			j.c.Kill(ws[1])
			victim = ws[1]
			j.waitStep(50)
			j.start()
		}
		j.c.Wait()
		close(j.steps)
		resummed := map[int64]bool{}
		for s := range j.steps {
			if s.Resummed {
				resummed[s.Step] = true
			}
		}
		var steps []int64
		for s := range resummed {
			steps = append(steps, s)
		}
		for _, w := range ws {
			if w != victim {
				res, err := w.Result()
				require.NoError(t, err, "%v", w)
				require.True(t, res.Finished)
				return j.models[w], steps
			}
		}
		t.Fatal("no finisher")
		return nil, nil
	}
	want, rs := run(2, false)
	if fixed {
		require.NotEmpty(t, rs, "some step's gradients outgrew the scale")
	} else {
		require.Empty(t, rs, "the ordered sum sums every step once")
	}
	one, rs1 := run(1, false)
	require.Equal(t, want.W, one.W, "the weights' bits, 1 worker against 2")
	require.Equal(t, want.B, one.B)
	require.ElementsMatch(t, rs, rs1, "the same steps re-summed")
	got, _ := run(3, true)
	require.Equal(t, want.W, got.W, "the weights' bits, with a kill and a join")
	require.Equal(t, want.B, got.B)
}

// unordered is a Backend whose Synchronizers lack sync.OrderedReducer
// (and keep sync.AllGatherer): deterministic mode takes the fixed-point
// path, as with a user's Backend.
type unordered struct{ *trainertest.Backend }

func (b unordered) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	s, err := b.Backend.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	if ag, ok := s.(sync.AllGatherer); ok {
		return struct {
			sync.Synchronizer
			sync.AllGatherer
		}{s, ag}, nil
	}
	return struct{ sync.Synchronizer }{s}, nil
}
