package launch

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Launching a job ID that the store remembers as finished trains nothing;
// it once ended as Finished with exit status 0. Now every worker exits
// with StatusJobFinished, none is restarted, and the job fails with an
// error that wraps elastic.ErrJobFinished.
func TestRelaunchingAFinishedJobIsAnError(t *testing.T) {
	bin := buildWorker(t, t.TempDir())
	cfg := DefaultConfig()
	cfg.Workers, cfg.MaxRestarts = 2, 3
	cfg.Redis, cfg.JobID = testredis.Addr(t), testredis.JobID(t)
	spec := Spec{Command: []string{bin, "-epochs", "1", "-min", "2"}, Stdout: io.Discard, Stderr: os.Stderr}
	res, err := Run(context.Background(), spec, cfg)
	require.NoError(t, err)
	require.Equal(t, Finished, res.Outcome)

	res, err = Run(context.Background(), spec, cfg)
	require.ErrorIs(t, err, elastic.ErrJobFinished)
	require.ErrorIs(t, err, ErrFailed)
	require.Equal(t, Failed, res.Outcome)
	require.Equal(t, StatusFailed, res.ExitStatus())
	require.Equal(t, StatusFailed, ExitStatus(err), "the launcher's status is the job's")
	require.Zero(t, res.Restarts, "a worker that found the job over is not restarted")
	require.Len(t, res.Exits, 2)
	for _, x := range res.Exits {
		require.Equal(t, StatusJobFinished, x.Code, "%v", x)
		require.True(t, x.JobFinished, "%v", x)
	}
}

func TestExitStatusOfAFinishedJob(t *testing.T) {
	require.Equal(t, StatusJobFinished, ExitStatus(elastic.ErrJobFinished))
}
