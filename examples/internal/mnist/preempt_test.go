package mnist

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/checkpoint"
)

// envAsMain makes the test binary run the command as its main does (see
// TestMain): a test can then start the mnist command as a process of its
// own and signal it.
const envAsMain = "MNIST_TEST_AS_MAIN"

// TestASIGTERMPreemptsEveryWorkerWithItsCheckpoint sends a SIGTERM to the
// launcher of a 2-worker -checkpoint run while it trains: the public
// launcher forwards it to both workers, each leaves as preempted (its
// trainer's Run returns trainer.ErrPreempted, exit status 143) after the
// checkpoint of the step they stopped at was written, within the grace
// period (nobody is killed), and the launcher exits with 143.
func TestASIGTERMPreemptsEveryWorkerWithItsCheckpoint(t *testing.T) {
	ckpt := t.TempDir()
	cmd := exec.Command(os.Args[0], "-workers", "2", "-epochs", "3", "-checkpoint", ckpt)
	lines := startMain(t, cmd)
	var log strings.Builder
	// Training: a progress line with a step above 0 (rank 0 reports
	// steps as it applies them).
	training := regexp.MustCompile(`^\[launcher\] epoch \d+ step [1-9]\d*`)
	deadline := time.After(3 * time.Minute)
	for waiting := true; waiting; {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the launcher ended before training:\n%s", log.String())
			log.WriteString(l + "\n")
			waiting = !training.MatchString(l)
		case <-deadline:
			t.Fatalf("no step trained in 3 minutes:\n%s", log.String())
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	for l := range lines {
		log.WriteString(l + "\n")
	}
	err := cmd.Wait()
	out := log.String()
	require.Error(t, err)
	require.Equal(t, 143, cmd.ProcessState.ExitCode(), "the launcher exits with the preempted status:\n%s", out)
	require.Contains(t, out, "[launcher] terminated signal received: stopping every worker")
	require.Contains(t, out, "mnist: job preempted")
	require.NotContains(t, out, "killed")
	for _, w := range []string{"0", "1"} {
		require.Regexp(t, `\[launcher\] worker `+w+` \(rank \d\) exited: exit status 143\n`, out,
			"worker %s left as preempted (trainer.ErrPreempted)", w)
	}
	m := regexp.MustCompile(`\[launcher\] preempted at step (\d+): every worker left gracefully; the checkpoint of step \d+ is in `).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	step, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)

	dir, err := checkpoint.NewLocalDir(ckpt, 3)
	require.NoError(t, err)
	steps, err := dir.List(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, steps, out)
	require.Equal(t, step, steps[0], "the newest checkpoint is the step the workers left at: %v\n%s", steps, out)
	data, err := dir.Load(context.Background(), step)
	require.NoError(t, err, "the preemption checkpoint loads, its checksum holds")
	require.NotEmpty(t, data)
}
