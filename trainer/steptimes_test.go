package trainer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Result.StepTimes covers every applied step of the worker, its parts add
// up to the whole, and the compute part holds at least the StepFunc's own
// delay (the test model sleeps 1 ms per call, once per micro-batch).
func TestResultBreaksTheStepsDownByPart(t *testing.T) {
	j := newMemJob(t, 320, 8, 1)
	j.micro = 8
	w := j.start()
	j.c.Wait()
	res, err := w.Result()
	require.NoError(t, err)
	require.True(t, res.Finished)
	st := res.StepTimes
	require.Equal(t, res.Step, st.Steps, "one entry per applied step")
	require.Equal(t, st.Loader+st.Compute+st.Reduce+st.Optimizer+st.Commit+st.Other, st.Total())
	micro := int64(j.batch / j.micro)
	require.GreaterOrEqual(t, st.Compute, time.Duration(st.Steps*micro)*time.Millisecond, "%+v", st)
	for name, d := range map[string]time.Duration{"loader": st.Loader, "reduce": st.Reduce, "optimizer": st.Optimizer, "commit": st.Commit, "other": st.Other} {
		require.Positive(t, d, "%s: %+v", name, st)
	}
}
