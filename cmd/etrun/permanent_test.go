package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/launch"
)

// dirState is every file of dir: its name, size, mode, time and content.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := map[string]string{}
	for _, e := range entries {
		info, err := e.Info()
		require.NoError(t, err)
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		m[e.Name()] = fmt.Sprintf("%d %v %v %x", info.Size(), info.Mode(), info.ModTime().UnixNano(), sha256.Sum256(b))
	}
	return m
}

// requireNoRestart checks that etrun restarted no worker: its log never
// says restart=1 and started each of workers once.
func requireNoRestart(t *testing.T, stderr string, workers int) {
	t.Helper()
	require.NotContains(t, stderr, "restart=1", "no worker was restarted:\n%s", stderr)
	require.NotContains(t, stderr, "restarting it as a new member")
	require.Equal(t, workers, strings.Count(stderr, `msg="worker started"`), stderr)
}

// An invalid configuration (-lr -1: trainer.ErrInvalidConfig) once exited
// 1, and etrun restarted the workers before it gave up with status 1. Now
// the worker exits with launch.StatusPermanent, etrun restarts nothing,
// stops the job and exits 2, as for a bad command line.
func TestEtrunStopsAtOnceOnAnInvalidConfiguration(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	p := startEtrun(t, etrun, "-workers", "2", "--", worker, "-lr", "-1")
	code, _ := p.wait(t)
	stderr := p.stderr.String()
	require.Equal(t, 2, code, "stderr:\n%s", stderr)
	requireNoRestart(t, stderr, 2)
	require.Contains(t, stderr, "trainer: invalid config: the optimizer's learning rate -1 is not a positive finite number")
	require.Contains(t, stderr, "exited with status 78: a permanent error")
	require.Contains(t, stderr, "the launcher restarted nothing and stopped the job")
}

// A checkpoint directory of another model (ErrForeignCheckpoint), and one
// whose job already finished its epochs (ErrFinishedCheckpoint, restored
// under a new job ID: once a silent success that trained nothing), each
// stop etrun at once with status 2 and no restart, leaving the directory
// as it was; training more epochs from the finished one works.
func TestEtrunStopsAtOnceOnACheckpointDirectoryItCannotUse(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	dir := t.TempDir()
	// The history: a model of 5 features, 1 epoch (50 steps), finished.
	p := startEtrun(t, etrun, "-workers", "1", "--", worker, "-features", "5", "-epochs", "1", "-checkpoint", dir)
	code, evs := p.wait(t)
	require.Equal(t, 0, code, "stderr:\n%s", &p.stderr)
	var final int64
	for _, e := range evs {
		if e.Ev == "exit" {
			final = e.Step
		}
	}
	require.Equal(t, int64(50), final)
	before := dirState(t, dir)
	require.NotEmpty(t, before)

	t.Run("another model", func(t *testing.T) {
		p := startEtrun(t, etrun, "-workers", "2", "--", worker, "-features", "4", "-checkpoint", dir)
		code, _ := p.wait(t)
		stderr := p.stderr.String()
		require.Equal(t, 2, code, "stderr:\n%s", stderr)
		requireNoRestart(t, stderr, 2)
		require.Contains(t, stderr, "the checkpoint store holds another model's checkpoints")
		require.Contains(t, stderr, dir)
		require.Equal(t, before, dirState(t, dir), "the directory is untouched")
	})
	t.Run("a finished job", func(t *testing.T) {
		p := startEtrun(t, etrun, "-workers", "2", "--", worker, "-features", "5", "-epochs", "1", "-checkpoint", dir)
		code, evs := p.wait(t)
		stderr := p.stderr.String()
		require.Equal(t, 2, code, "not a success: nothing was trained; stderr:\n%s", stderr)
		requireNoRestart(t, stderr, 2)
		require.Contains(t, stderr, "the checkpoint store holds a finished job")
		require.Contains(t, stderr, dir)
		for _, e := range evs {
			require.NotEqual(t, "step", e.Ev, "no step trained: %+v", e)
			require.False(t, e.Finished, "%+v", e)
		}
		require.Equal(t, before, dirState(t, dir), "the directory is untouched")
	})
	t.Run("more epochs train on from it", func(t *testing.T) {
		p := startEtrun(t, etrun, "-workers", "2", "-redis", testredis.Addr(t), "-job", testredis.JobID(t),
			"--", worker, "-features", "5", "-epochs", "2", "-checkpoint", dir)
		code, evs := p.wait(t)
		require.Equal(t, 0, code, "stderr:\n%s", &p.stderr)
		for _, e := range evs {
			if e.Ev == "exit" {
				require.True(t, e.Finished)
				require.Equal(t, 2*final, e.Step, "the second epoch, on from the first")
			}
		}
	})
}

// The user's report: a 3-worker job trained with learning rate 0.2; a 4th
// worker started with 0.1 made all four stop, etrun restarted them into the
// same mismatch, and the job died. Now the three (which hold the job's
// trained state) refuse the newcomer and finish every step with status 0;
// the newcomer exits once, with the permanent status (its etrun exits 2,
// restarting nothing), and its message names the setting and both values
// as configured.
func TestEtrunJobRefusesALateWorkerWithAnotherLearningRate(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	// Two launchers of one job share its secret (and its launcher mark).
	t.Setenv("ELASTICTRAIN_SECRET", "00112233445566778899aabbccddeeff")
	redisAddr, job := testredis.Addr(t), testredis.JobID(t)
	const epochs, perEpoch = 8, 50 // 400 steps of 20 ms at least: the 4th joins long before the end
	args := func(lr string) []string {
		return []string{"-redis", redisAddr, "-job", job, "--", worker, "-lr", lr, "-epochs", fmt.Sprint(epochs), "-delay", "20ms", "-min", "3"}
	}
	job3 := startEtrun(t, etrun, append([]string{"-workers", "3"}, args("0.2")...)...)
	job3.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 3 && e.Step >= 5 })

	fourth := startEtrun(t, etrun, append([]string{"-workers", "1"}, args("0.1")...)...)
	code, evs := fourth.wait(t)
	stderr := fourth.stderr.String()
	t.Logf("the fourth etrun's stderr:\n%s", stderr)
	require.Equal(t, 1, code, "its only worker was refused: the job failed, not a usage error; stderr:\n%s", stderr)
	requireNoRestart(t, stderr, 1)
	exits := 0
	for _, e := range evs {
		if e.Ev == "exit" {
			exits++
			require.Equal(t, launch.StatusRefused, e.Status, "%+v", e)
			require.Zero(t, e.Step)
		}
	}
	require.Equal(t, 1, exits, "the fourth ran once")
	require.Contains(t, stderr, "refused by the job")
	require.Regexp(t, `learning rate: 0\.2 on rank \d \(member [^)]+\), 0\.2 on rank \d \(member [^)]+\), 0\.2 on rank \d \(member [^)]+\), 0\.1 on rank 3`, stderr)

	code, evs = job3.wait(t)
	require.Equal(t, 0, code, "stderr:\n%s", &job3.stderr)
	exits = 0
	for _, e := range evs {
		if e.Ev == "exit" {
			exits++
			require.Equal(t, 0, e.Status, "%+v", e)
			require.True(t, e.Finished, "%+v", e)
			require.Equal(t, int64(epochs*perEpoch), e.Step, "every step of the job: %+v", e)
		}
	}
	require.Equal(t, 3, exits)
	require.Contains(t, job3.stderr.String(), "refused members whose settings differ from the job's")
	require.NotContains(t, job3.stderr.String(), "restart=1")
}
