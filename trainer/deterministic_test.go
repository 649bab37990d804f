package trainer_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
)

// Deterministic mode is the default (#32). Where the loader cuts no
// micro-batches it cannot hold: New accepts the job, which trains in the
// float32 mode, Run says why once at its start, and Result.Deterministic
// tells which mode ran; with micro-batches the job runs deterministically
// and says nothing of the kind.
func TestDeterministicByDefaultFallsBackWithoutMicroBatchesAndSaysSo(t *testing.T) {
	require.True(t, DefaultConfig().Deterministic, "the default")
	for _, micro := range []int{0, 4} {
		j := newJob(t, stores(t)["memory"])
		j.epochs, j.micro = 1, micro
		var logs bytes.Buffer // written under the handler's lock, read once Run returned
		j.opts = func(int) []Option { return []Option{WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))} }
		w := j.start()
		j.wait()
		require.NoError(t, w.err, "micro %d", micro)
		require.Equal(t, micro > 0, w.res.Deterministic, "micro %d: Result.Deterministic", micro)
		said := strings.Count(logs.String(), "not bit-reproducible")
		if micro == 0 {
			require.Equal(t, 1, said, "said once: %s", logs.String())
			require.Contains(t, logs.String(), "set dataloader.Config.MicroBatch")
		} else {
			require.Zero(t, said, logs.String())
		}
	}
}
