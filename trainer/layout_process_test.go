package trainer_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/launch"
)

// Issue 29's hole beside the settings agreement: a worker whose sync
// transport layout differs (another Config.Sync.Streams) could not be
// compared by the settings allreduce, because its round never connected:
// every member's Connect waited out DialTimeout (its lanes never
// completed), round after round, until every healthy member's failure
// budget ran out and the whole job died. Now the handshake names the
// mismatch: 3 worker processes train on real Redis, a 4th with Streams 1
// joins; the three evict it and finish every step with status 0, the
// audit is exact, and the fourth exits once with launch.StatusRefused,
// naming the setting and both values as configured.
func TestAWorkerWithAnotherSyncLayoutIsRefusedAndTheJobTrainsOn(t *testing.T) {
	const epochs = 8 // 800 steps of 4 ms at least: the 4th joins long before the end
	j := newProcJob(t, 3, epochs, t.TempDir())
	for range 3 {
		j.start()
	}
	j.waitStep(20)
	env := j.env
	j.env = append(slices.Clone(env), envStreams+"=1")
	fourth := j.start()
	j.env = env
	j.waitAll()

	steps := int64(epochs * procSamples / procBatch)
	var sha string
	for _, p := range j.procs[:3] {
		require.NotNil(t, p.final, "pid %d ended with %+v", p.cmd.Process.Pid, p.last)
		require.Equal(t, 0, p.cmd.ProcessState.ExitCode())
		require.Equal(t, steps, p.final.Step, "every step of the job")
		if sha == "" {
			sha = p.final.SHA
		}
		require.Equal(t, sha, p.final.SHA, "identical parameters and optimizer state")
	}
	rep := j.verifyAudit(epochs)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)

	require.Nil(t, fourth.final)
	require.Equal(t, launch.StatusRefused, fourth.cmd.ProcessState.ExitCode(), "refused: the launcher does not restart it; %+v", fourth.last)
	var errs []string
	for _, r := range fourth.seen {
		require.NotEqual(t, "step", r.Kind, "the fourth trained nothing")
		if r.Kind == "error" {
			errs = append(errs, r.Err)
		}
	}
	require.Len(t, errs, 1)
	msg := errs[0]
	t.Logf("the fourth's error: %s", msg)
	require.Contains(t, msg, "refused by the job")
	require.Contains(t, msg, "sync streams:")
	require.Equal(t, 3, strings.Count(msg, " 2 on rank "), "the job's value, as configured, on each of its ranks")
	require.Equal(t, 1, strings.Count(msg, " 1 on rank "), "the fourth's value")
}
