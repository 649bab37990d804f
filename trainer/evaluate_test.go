package trainer_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
)

// A periodic evaluation gets a copy of the committed parameters and runs
// beside the loop: while the first one is held, training goes on (the
// evaluations due meanwhile are skipped, not waited for).
func TestAPeriodicEvaluationDoesNotStallTheLoop(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.epochs = 2
	release := make(chan struct{})
	var mu stdsync.Mutex
	var evals []int64
	var first, at5 []float32
	ready := make(chan *inproc, 1)
	j.opts = func(int) []Option {
		return []Option{
			WithEvaluation(Evaluation{Every: 5, Func: func(ctx context.Context, step int64, params []Param) {
				mu.Lock()
				evals = append(evals, step)
				if len(evals) == 1 {
					first = slices.Clone(params[0].Value)
				}
				mu.Unlock()
				if step == 5 {
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
			}}),
			WithHooks(Hooks{OnStep: func(s StepInfo) {
				if s.Step == 5 {
					at5 = slices.Clone((<-ready).model.W)
				}
				if s.Step == 25 {
					close(release) // the loop got here while the evaluation of step 5 was held
				}
			}}),
		}
	}
	w := j.start()
	ready <- w
	j.wait()
	require.NoError(t, w.err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, int64(5), evals[0])
	require.Equal(t, at5, first, "the evaluation saw the parameters of the commit of step 5")
	require.GreaterOrEqual(t, w.tr.EvaluationsSkipped(), int64(3), "10, 15 and 20 came while it was held")
	require.Greater(t, evals[len(evals)-1], int64(25), "evaluations resumed once it returned: %v", evals)
	require.True(t, slices.IsSorted(evals))
}

// An evaluation whose Func does not watch its ctx does not hold Run past
// Evaluation.StopTimeout: Run returns with the job's result and a WARN says
// the evaluation was left running (#29: nothing waits without a bound).
func TestAnEvaluationThatIgnoresItsContextDoesNotHoldRun(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	release := make(chan struct{})
	returned := make(chan struct{})
	var logs bytes.Buffer // written under the handler's lock, read once Run returned
	j.opts = func(int) []Option {
		return []Option{
			WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
			WithEvaluation(Evaluation{Every: 2, StopTimeout: time.Millisecond, Func: func(_ context.Context, step int64, _ []Param) {
				if step == 2 {
					<-release // ignores its ctx
					close(returned)
				}
			}}),
		}
	}
	w := j.start()
	j.wait()
	require.NoError(t, w.err)
	require.Contains(t, logs.String(), "an evaluation is still running after its context ended")
	close(release)
	<-returned
}
