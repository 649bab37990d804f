package launch

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClassifyAProcessEnd(t *testing.T) {
	cases := []struct {
		code int
		sig  syscall.Signal
		want Outcome
	}{
		{0, 0, Finished},
		{143, 0, Preempted},
		{130, 0, Preempted},
		{1, 0, Failed},
		{2, 0, Failed},
		{137, 0, Failed}, // a status, not a signal: the worker chose it
		// Killed by the stop signal itself: no handler, nothing committed.
		{-1, syscall.SIGTERM, Failed},
		{-1, syscall.SIGINT, Failed},
		{-1, syscall.SIGKILL, Failed},
		{-1, syscall.SIGSEGV, Failed},
		{-1, syscall.SIGABRT, Failed},
	}
	for _, c := range cases {
		require.Equal(t, c.want, classify(c.code, c.sig), "status %d signal %v", c.code, c.sig)
	}
}

func TestRestartPolicy(t *testing.T) {
	cases := []struct {
		name                       string
		o                          Outcome
		stopping, finished, doomed bool
		restarts, max              int
		want                       bool
	}{
		{"a crash with restarts left", Failed, false, false, false, 0, 3, true},
		{"the last restart", Failed, false, false, false, 2, 3, true},
		{"restarts used up", Failed, false, false, false, 3, 3, false},
		{"restarts off", Failed, false, false, false, 0, 0, false},
		{"a crash while stopping", Failed, true, false, false, 0, 3, false},
		{"a crash after the job finished", Failed, false, true, false, 0, 3, false},
		{"a preempted worker", Preempted, false, false, false, 0, 3, false},
		{"a finished worker", Finished, false, false, false, 0, 3, false},
		{"a crash that a restart repeats", Failed, false, false, true, 0, 3, false},
	}
	for _, c := range cases {
		require.Equal(t, c.want, restartPolicy(c.o, c.stopping, c.finished, c.doomed, c.restarts, c.max), c.name)
	}
}

func TestJobOutcomeRule(t *testing.T) {
	ex := func(worker, restart int, o Outcome, atStop, killed bool) Exit {
		return Exit{Process: Process{Worker: worker, Restart: restart, PID: 100 + 10*worker + restart}, Outcome: o, AtStop: atStop, Killed: killed}
	}
	cases := []struct {
		name    string
		exits   []Exit
		stopped bool
		want    Outcome
	}{
		{"every worker finished", []Exit{ex(0, 0, Finished, false, false), ex(1, 0, Finished, false, false)}, false, Finished},
		{"one finished after another crashed for good",
			[]Exit{ex(1, 0, Failed, false, false), ex(0, 0, Finished, false, false)}, false, Finished},
		{"finished, then stopped while the last one evaluated",
			[]Exit{ex(1, 0, Finished, false, false), ex(0, 0, Preempted, true, false)}, true, Finished},
		{"stopped, every running worker left preempted",
			[]Exit{ex(0, 0, Preempted, true, false), ex(1, 0, Preempted, true, false)}, true, Preempted},
		{"stopped, an earlier crash the job survived",
			[]Exit{ex(1, 0, Failed, false, false), ex(0, 0, Preempted, true, false), ex(1, 1, Preempted, true, false)}, true, Preempted},
		{"stopped, one killed after the grace period",
			[]Exit{ex(0, 0, Preempted, true, false), ex(1, 0, Failed, true, true)}, true, Failed},
		{"stopped, one crashed during the grace period",
			[]Exit{ex(0, 0, Preempted, true, false), ex(1, 0, Failed, true, false)}, true, Failed},
		{"killed", []Exit{ex(0, 0, Failed, true, true)}, true, Failed},
		{"no stop, every worker preempted from outside",
			[]Exit{ex(0, 0, Preempted, false, false), ex(1, 0, Preempted, false, false)}, false, Preempted},
		{"no stop, a crash restarted, then preempted",
			[]Exit{ex(1, 0, Failed, false, false), ex(1, 1, Preempted, false, false), ex(0, 0, Preempted, false, false)}, false, Preempted},
		{"no stop, one preempted and one crashed for good",
			[]Exit{ex(0, 0, Preempted, false, false), ex(1, 0, Failed, false, false)}, false, Failed},
		{"every restart used up", []Exit{ex(0, 0, Failed, false, false), ex(0, 1, Failed, false, false)}, false, Failed},
		{"nothing ran", nil, false, Failed},
	}
	for _, c := range cases {
		got := jobOutcome(c.exits, c.stopped)
		require.Equal(t, c.want, got, c.name)
		err := jobError(got, c.exits, c.stopped, nil)
		switch got {
		case Finished:
			require.NoError(t, err, c.name)
			require.Equal(t, 0, ExitStatus(err))
		case Preempted:
			require.ErrorIs(t, err, ErrPreempted, c.name)
			require.Equal(t, 143, ExitStatus(err))
		case Failed:
			require.ErrorIs(t, err, ErrFailed, c.name)
			require.Equal(t, 1, ExitStatus(err))
		}
		require.Equal(t, got.ExitStatus(), ExitStatus(err), c.name)
	}
}

func TestAFailedJobsErrorNamesTheWorkersThatDecidedIt(t *testing.T) {
	exits := []Exit{
		{Process: Process{Worker: 0, PID: 10}, Code: 3, Outcome: Failed, Restarting: true},
		{Process: Process{Worker: 0, Restart: 1, PID: 11}, Code: 3, Outcome: Failed},
		{Process: Process{Worker: 1, PID: 12}, Code: 143, Outcome: Preempted},
	}
	err := jobError(Failed, exits, false, nil)
	require.EqualError(t, err, "launch: job failed: worker 0 (restart 1, pid 11) exited with status 3")

	stopped := []Exit{
		{Process: Process{Worker: 0, PID: 10}, Code: 143, Outcome: Preempted, AtStop: true},
		{Process: Process{Worker: 1, PID: 12}, Code: -1, Signal: syscall.SIGKILL, Outcome: Failed, AtStop: true, Killed: true},
	}
	err = jobError(Failed, stopped, true, context.Canceled)
	require.EqualError(t, err, "launch: job failed: worker 1 (pid 12) was killed by the launcher: context canceled")
	require.True(t, errors.Is(err, context.Canceled))
}
