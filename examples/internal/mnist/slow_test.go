package mnist

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSlowWorkerGetsASmallerShare: with -slow 1@3 the worker holding rank
// 1 computes three times slower per sample; balancing (the default) gives
// it a smaller share of every global batch, which rank 0 logs, and the run
// still trains every sample exactly once. Three epochs: a split is logged
// once a move's trial paid, and a failed trial holds the next move off for
// 50, then 100, 200 steps; under a CPU hog on both cores the trials'
// measurements are noisy and one epoch (234 steps) ended with no trial
// paid in 2 runs of 5; with two epochs every one of 6 runs had one.
func TestSlowWorkerGetsASmallerShare(t *testing.T) {
	lastSplit := func(stderr string) []float64 {
		var last []float64
		for _, line := range strings.Split(stderr, "\n") {
			var rec struct {
				Msg       string    `json:"msg"`
				Fractions []float64 `json:"fractions"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "balanced shares" {
				last = rec.Fractions
			}
		}
		return last
	}
	args := []string{"-workers", "2", "-epochs", "3", "-batch", "256", "-slow", "1@3", "-json", "-quiet",
		"-log-format", "json", "-log-level", "info"}
	code, stdout, stderr := runMain(t, args...)
	require.Equal(t, 0, code, "stderr: %s", stderr)
	var res result
	require.NoError(t, json.Unmarshal([]byte(lastLine(stdout)), &res))
	require.Zero(t, res.AuditMissing)
	require.Zero(t, res.AuditDuplicates)
	split := lastSplit(stderr)
	require.Len(t, split, 2, "rank 0 logged a new split")
	// How much smaller depends on how much faster the other rank is at the
	// moment, which a loaded machine changes (0.413 under a CPU hog on both
	// cores failed the 0.4 this test had): it asserts what it names, a
	// smaller share; what balancing buys is a benchmark figure
	// (docs/benchmarks.md, -slow 1@2).
	require.Less(t, split[1], split[0], "the slow rank's fraction of the global batch: %v", split)
	t.Logf("the slow rank's fraction of the global batch: %.3f", split[1])

}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
