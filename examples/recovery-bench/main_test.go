package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/launch"
)

func TestMain(m *testing.M) {
	if os.Getenv(launch.EnvWorker) != "" || os.Getenv(envFlood) != "" {
		// A worker or the flood process, re-executed from this test binary.
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestBadFlagsSayWhy(t *testing.T) {
	for args, want := range map[string]string{
		"-idle-conns -1":     "-idle-conns -1: want >= 0",
		"-idle-from nowhere": `-idle-from "nowhere": want an IP address`,
		"-idle-settle -1s":   "-idle-settle -1s: want >= 0",
	} {
		code, _, stderr := jobenv.RunAsLauncher(t, run, strings.Fields(args)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, stderr, want, args)
	}
}

// With -idle-conns the bench measures each trial twice, undisturbed and
// under a flood of silent connections (from its own process) on rank 0's
// peer port, and prints both medians and their ratio.
func TestBenchPrintsUndisturbedAndFloodedRecovery(t *testing.T) {
	code, stdout, stderr := jobenv.RunAsLauncher(t, run,
		"-workers", "3", "-trials", "1", "-kill-at", "20", "-idle-conns", "64", "-idle-settle", "0s", "-json")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	var trials, summaries, comparisons int
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &v), line)
		switch {
		case v["comparison"] == true:
			comparisons++
			require.Greater(t, v["flooded_median_seconds"], 0.0)
			require.Greater(t, v["undisturbed_median_seconds"], 0.0)
		case v["summary"] == true:
			summaries++
		default:
			trials++
			require.Greater(t, v["recovery_seconds"], 0.0, line)
			require.GreaterOrEqual(t, v["rounds"], 2.0, "the round before the kill and the one after: %s", line)
			if v["idle_conns"] != nil {
				require.EqualValues(t, 64, v["idle_conns"])
				require.EqualValues(t, 64, v["idle_open_at_kill"], "the flood stood when the kill came")
				require.Equal(t, "127.0.0.2", v["idle_from"])
			}
		}
	}
	require.Equal(t, []int{2, 2, 1}, []int{trials, summaries, comparisons}, stdout)
}
