package launch

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
)

// workerEvent is a line of testdata/worker's output.
type workerEvent struct {
	Ev        string `json:"ev"`
	Worker    int    `json:"worker"`
	Restart   int    `json:"restart"`
	PID       int    `json:"pid"`
	Round     uint64 `json:"round"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
	Step      int64  `json:"step"`
	Status    int    `json:"status"`
	Preempted bool   `json:"preempted"`
	Finished  bool   `json:"finished"`
	Err       string `json:"err"`
}

// buildWorker builds testdata/worker, a user's own worker binary written
// against the public API only, into dir with go build.
func buildWorker(t *testing.T, dir string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	bin := filepath.Join(dir, "worker")
	out, err := exec.Command(gobin, "build", "-o", bin, "./testdata/worker").CombinedOutput()
	require.NoError(t, err, "go build ./testdata/worker: %s", out)
	return bin
}

// collect decodes the worker events of lines until the channel closes.
func collect(t *testing.T, lines <-chan string, until func(workerEvent) bool) []workerEvent {
	t.Helper()
	var evs []workerEvent
	for l := range lines {
		var e workerEvent
		require.NoError(t, json.Unmarshal([]byte(l), &e), "worker line %q", l)
		evs = append(evs, e)
		if until != nil && until(e) {
			break
		}
	}
	return evs
}

func exitsOf(evs []workerEvent) map[[2]int]workerEvent {
	m := map[[2]int]workerEvent{}
	for _, e := range evs {
		if e.Ev == "exit" {
			m[[2]int{e.Worker, e.Restart}] = e
		}
	}
	return m
}

// TestAUsersOwnWorkerBinary runs a worker binary built outside the
// examples (testdata/worker: trainer and trainertest's linear regression)
// through the launcher: it trains to the end, a crashed worker is restarted
// and the job still finishes, and a stop makes every worker leave as
// preempted with the job's checkpoint written.
func TestAUsersOwnWorkerBinary(t *testing.T) {
	bin := buildWorker(t, t.TempDir())

	t.Run("it trains to the end on the embedded store", func(t *testing.T) {
		out, lines := outputLines(t)
		cfg := DefaultConfig()
		cfg.Workers = 2
		res, err := Run(context.Background(), Spec{Command: []string{bin, "-epochs", "1", "-min", "2"}, Stdout: out, Stderr: os.Stderr}, cfg)
		require.NoError(t, err)
		require.Equal(t, Finished, res.Outcome)
		require.Zero(t, res.Restarts)
		out.Close()
		exits := exitsOf(collect(t, lines, nil))
		require.Len(t, exits, 2)
		for _, e := range exits {
			require.True(t, e.Finished, "worker %d: %+v", e.Worker, e)
			require.Equal(t, int64(800/16), e.Step, "every worker ends at the job's last step")
			require.Equal(t, 0, e.Status)
		}
	})

	t.Run("a crashed worker is restarted, rejoins as a new member, and the job finishes", func(t *testing.T) {
		out, lines := outputLines(t)
		cfg := DefaultConfig()
		cfg.Workers, cfg.MaxRestarts = 2, 1
		cfg.Redis, cfg.JobID = testredis.Addr(t), testredis.JobID(t)
		// MinWorkers 2: the survivor cannot train alone, so the job goes
		// on only once the restarted worker joined it.
		res, err := Run(context.Background(), Spec{Command: []string{bin, "-epochs", "2", "-min", "2",
			"-crash-worker", "1", "-crash-step", "10"}, Stdout: out, Stderr: os.Stderr}, cfg)
		require.NoError(t, err)
		require.Equal(t, Finished, res.Outcome)
		require.Equal(t, 1, res.Restarts)
		require.Len(t, res.Exits, 3)
		crash := res.Exits[0]
		require.Equal(t, Process{Worker: 1, Restart: 0, PID: crash.PID}, crash.Process)
		require.Equal(t, 3, crash.Code)
		require.True(t, crash.Restarting)
		last := res.Last()
		require.Equal(t, 1, last[1].Restart)
		require.Equal(t, Finished, last[0].Outcome)
		require.Equal(t, Finished, last[1].Outcome)

		out.Close()
		evs := collect(t, lines, nil)
		var trainedAfterRestart bool
		for _, e := range evs {
			if e.Ev == "round" && e.Worker == 1 && e.Restart == 1 && e.WorldSize == 2 {
				trainedAfterRestart = true
			}
		}
		require.True(t, trainedAfterRestart, "the restarted worker joined a round of 2: %+v", evs)
		exits := exitsOf(evs)
		require.Equal(t, 3, exits[[2]int{1, 0}].Status)
		w0, w1 := exits[[2]int{0, 0}], exits[[2]int{1, 1}]
		require.True(t, w0.Finished && w1.Finished, "%+v %+v", w0, w1)
		require.Equal(t, int64(2*800/16), w0.Step)
		require.Equal(t, w0.Step, w1.Step)
	})

	t.Run("a stop makes every worker leave as preempted with its checkpoint written", func(t *testing.T) {
		out, lines := outputLines(t)
		ckpt := t.TempDir()
		cfg := DefaultConfig()
		cfg.Workers = 2
		job, err := Start(context.Background(), Spec{Command: []string{bin, "-epochs", "100000", "-min", "2", "-checkpoint", ckpt},
			Stdout: out, Stderr: os.Stderr}, cfg)
		require.NoError(t, err)
		// Both train (rank 0 reports steps of a round of 2); no checkpoint
		// exists yet: the worker writes one only at the end or on
		// preemption (CheckpointEvery 0).
		evs := collect(t, lines, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 && e.Step >= 5 })
		entries, err := os.ReadDir(ckpt)
		require.NoError(t, err)
		require.Empty(t, entries)
		job.Stop(syscall.SIGTERM)
		res, err := job.Wait()
		require.ErrorIs(t, err, ErrPreempted)
		require.Equal(t, 143, res.ExitStatus())
		for _, x := range res.Exits {
			require.Equal(t, 143, x.Code, "%v", x)
			require.False(t, x.Killed, "%v left within the grace period", x)
		}
		out.Close()
		evs = append(evs, collect(t, lines, nil)...)
		exits := exitsOf(evs)
		require.Len(t, exits, 2)
		var step int64 = -1
		for _, e := range exits {
			require.True(t, e.Preempted, "worker %d's Run returned trainer.ErrPreempted: %+v", e.Worker, e)
			require.Equal(t, 143, e.Status)
			if step >= 0 {
				require.Equal(t, step, e.Step, "both left after the same step")
			}
			step = e.Step
		}
		dir, err := checkpoint.NewLocalDir(ckpt, 3)
		require.NoError(t, err)
		steps, err := dir.List(context.Background())
		require.NoError(t, err)
		require.Equal(t, []int64{step}, steps, "one checkpoint, of the step the workers left at")
		data, err := dir.Load(context.Background(), step)
		require.NoError(t, err, "the checkpoint loads and its checksum holds")
		require.NotEmpty(t, data)
	})
}
