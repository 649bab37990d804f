package launch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// procState is the state letter of pid in /proc ("T" stopped), or "" when
// it cannot be read.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// readyPIDs reads n "ready INDEX PID" lines and returns the PIDs by index.
func readyPIDs(t *testing.T, lines <-chan string, n int) map[int]int {
	t.Helper()
	pids := map[int]int{}
	for _, l := range awaitLines(t, lines, "ready", n) {
		f := strings.Fields(l)
		require.Len(t, f, 3, l)
		i, err := strconv.Atoi(f[1])
		require.NoError(t, err)
		pid, err := strconv.Atoi(f[2])
		require.NoError(t, err)
		pids[i] = pid
	}
	return pids
}

// waitDone waits for the job, failing the test (and killing the job) when
// it is not over within limit.
func waitDone(t *testing.T, job *Job, limit time.Duration) (Result, error) {
	t.Helper()
	select {
	case <-job.Done():
	case <-time.After(limit):
		job.Kill()
		<-job.Done()
		t.Fatalf("the job was not over %v after its workers finished", limit)
	}
	return job.Wait()
}

func TestAWorkerHungAfterTheJobFinishedIsKilledAfterTheGracePeriod(t *testing.T) {
	if procState(os.Getpid()) == "" {
		t.Skip("needs /proc to see the stopped worker")
	}
	// Workers 0 and 1 finish on SIGUSR1; worker 2 stops itself (a hung
	// worker: SIGTERM would stay pending, only SIGKILL ends it).
	spec := fakeSpec(t, "finish-on-usr1")
	spec.Wrap = func(i int) []string {
		if i == 2 {
			return []string{"env", envFake + "=stop-self"}
		}
		return nil
	}
	out, lines := outputLines(t)
	spec.Stdout = out
	cfg := testConfig(3)
	cfg.GracePeriod = 500 * time.Millisecond
	job, err := Start(context.Background(), spec, cfg)
	require.NoError(t, err)
	pids := readyPIDs(t, lines, 3)
	deadline := time.Now().Add(20 * time.Second)
	for st := procState(pids[2]); st != "T"; st = procState(pids[2]) {
		if time.Now().After(deadline) {
			// "" is a worker gone: killed (by whom the job's result says)
			// or exited, not one still running.
			job.Kill()
			<-job.Done()
			res, err := job.Wait()
			t.Fatalf("worker 2 never stopped itself: its state is %q; the job: %+v, %v", st, res, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, job.Signal(0, syscall.SIGUSR1))
	require.NoError(t, job.Signal(1, syscall.SIGUSR1))
	finished := time.Now()

	res, err := waitDone(t, job, 20*time.Second)
	require.NoError(t, err, "the job finished: its final commit is every rank's")
	require.Equal(t, Finished, res.Outcome)
	require.Equal(t, 0, res.ExitStatus())
	require.GreaterOrEqual(t, time.Since(finished), cfg.GracePeriod, "the hung worker had a grace period to exit")
	last := res.Last()
	require.Len(t, last, 3)
	for _, x := range last[:2] {
		require.Equal(t, Finished, x.Outcome)
		require.False(t, x.AfterFinish)
	}
	x := last[2]
	require.True(t, x.Killed)
	require.True(t, x.AfterFinish)
	require.Equal(t, syscall.SIGKILL, x.Signal)
	require.False(t, x.Restarting)
	require.Contains(t, x.String(), "still running a grace period after the job finished")
	require.True(t, gone(pids[2]), "no child left behind")
}

func TestAWorkerWhoseCommandLineIsRefusedIsNotRestarted(t *testing.T) {
	var logs syncBuffer
	cfg := testConfig(3)
	cfg.StartupWindow = 30 * time.Second // "at start", however loaded the machine
	res, err := Run(context.Background(), fakeSpec(t, "exit 2"), cfg,
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.ErrorIs(t, err, ErrUsage)
	require.ErrorIs(t, err, ErrFailed)
	require.Equal(t, StatusUsage, ExitStatus(err))
	require.Equal(t, StatusUsage, res.ExitStatus())
	require.Equal(t, Failed, res.Outcome)
	require.Zero(t, res.Restarts, "the same command line would be refused again")
	require.Len(t, res.Exits, 3)
	for _, x := range res.Exits {
		require.True(t, x.Usage, "%+v", x)
		require.True(t, x.AtStart)
		require.False(t, x.Restarting)
	}
	require.ErrorContains(t, err, "its command line was refused")
	require.Contains(t, logs.String(), "not restarting it: it exited with status 2")
	require.Contains(t, logs.String(), "exit_status=2")
}

func TestAStartThatFailsTheSameWayIsRestartedOnce(t *testing.T) {
	cfg := testConfig(1)
	cfg.StartupWindow = 30 * time.Second
	res, err := Run(context.Background(), fakeSpec(t, "exit 3"), cfg)
	require.ErrorIs(t, err, ErrFailed)
	require.NotErrorIs(t, err, ErrUsage, "status 3 is a crash, not a usage error")
	require.Equal(t, StatusFailed, res.ExitStatus())
	require.Equal(t, 1, res.Restarts, "one restart shows the start fails the same way every time")
	require.Len(t, res.Exits, 2)
	require.True(t, res.Exits[0].Restarting)
	require.True(t, res.Exits[1].AtStart)
	require.False(t, res.Exits[1].Restarting)
}

func TestAWorkerKilledBySIGTERMWasNotPreempted(t *testing.T) {
	spec := fakeSpec(t, "no-handler")
	out, lines := outputLines(t)
	spec.Stdout = out
	var logs syncBuffer
	job, err := Start(context.Background(), spec, testConfig(2), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	readyPIDs(t, lines, 2)
	job.Stop(syscall.SIGTERM)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrFailed, "nothing was committed: the job did not leave gracefully")
	require.NotErrorIs(t, err, ErrPreempted)
	require.Equal(t, StatusFailed, ExitStatus(err))
	require.Equal(t, Failed, res.Outcome)
	require.ErrorContains(t, err, "was killed by SIGTERM: it does not handle preemption, nothing was committed")
	for _, x := range res.Exits {
		require.Equal(t, syscall.SIGTERM, x.Signal)
		require.Equal(t, Failed, x.Outcome)
		require.False(t, x.Killed, "the signal itself ended it, not the launcher's SIGKILL")
		require.False(t, x.Restarting)
	}
	require.Contains(t, logs.String(), "worker killed by SIGTERM: it does not handle preemption")
	require.NotContains(t, logs.String(), "left as preempted")
}

func TestLogRecordsHaveNoDuplicateKeys(t *testing.T) {
	h := &keyChecker{}
	cfg := testConfig(1)
	cfg.MaxRestarts = 2
	cfg.StartupWindow = 0 // restart every crash, so that a restarted process crashes and restarts
	_, err := Run(context.Background(), fakeSpec(t, "exit 3"), cfg, WithLogger(slog.New(h)))
	require.ErrorIs(t, err, ErrFailed)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(t, h.records)
	for _, r := range h.records {
		seen := map[string]bool{}
		for _, k := range r.keys {
			require.False(t, seen[k], "record %q has the key %q twice: %v", r.msg, k, r.keys)
			seen[k] = true
		}
	}
	require.True(t, h.has("worker crashed; restarting it as a new member", "restart", "job_restarts"),
		"the restart of a restarted process: its own restart and the job's count, named apart")
}

func TestStartFailureRule(t *testing.T) {
	const w = time.Second
	ex := func(worker, restart, code int, sig syscall.Signal, ran time.Duration) Exit {
		return Exit{Process: Process{Worker: worker, Restart: restart, PID: 100 + restart}, Code: code, Signal: sig,
			Outcome: classify(code, sig), Ran: ran}
	}
	prev := func(e Exit) Exit { e.AtStart = true; return e }
	cases := []struct {
		name                   string
		x                      Exit
		seen                   []Exit
		window                 time.Duration
		atStart, usage, doomed bool
	}{
		{"status 2 at the first start: usage", ex(0, 0, 2, 0, 10*time.Millisecond), nil, w, true, true, true},
		{"status 2 after the window: a crash (a Go panic)", ex(0, 0, 2, 0, 2*w), nil, w, false, false, false},
		{"status 2 of a restart: not a usage error", ex(0, 1, 2, 0, 10*time.Millisecond), nil, w, true, false, false},
		{"a first failure at start may be restarted", ex(0, 0, 1, 0, 10*time.Millisecond), nil, w, true, false, false},
		{"the same failure at start again", ex(0, 1, 1, 0, 10*time.Millisecond),
			[]Exit{prev(ex(0, 0, 1, 0, 10*time.Millisecond))}, w, true, false, true},
		{"a different failure at start", ex(0, 1, 3, 0, 10*time.Millisecond),
			[]Exit{prev(ex(0, 0, 1, 0, 10*time.Millisecond))}, w, true, false, false},
		{"the same signal at start again", ex(0, 1, -1, syscall.SIGSEGV, 10*time.Millisecond),
			[]Exit{prev(ex(0, 0, -1, syscall.SIGSEGV, 10*time.Millisecond))}, w, true, false, true},
		{"another worker's failure does not count", ex(1, 0, 1, 0, 10*time.Millisecond),
			[]Exit{prev(ex(0, 0, 1, 0, 10*time.Millisecond))}, w, true, false, false},
		{"only the previous process counts", ex(0, 2, 1, 0, 10*time.Millisecond),
			[]Exit{prev(ex(0, 0, 1, 0, 10*time.Millisecond)), ex(0, 1, 1, 0, 2*w)}, w, true, false, false},
		{"the previous one failed later", ex(0, 1, 1, 0, 10*time.Millisecond), []Exit{ex(0, 0, 1, 0, 2*w)}, w, true, false, false},
		{"the rule off", ex(0, 0, 2, 0, 10*time.Millisecond), nil, 0, false, false, false},
		{"finished", ex(0, 0, 0, 0, 10*time.Millisecond), nil, w, false, false, false},
		{"preempted", ex(0, 0, 143, 0, 10*time.Millisecond), nil, w, false, false, false},
	}
	for _, c := range cases {
		atStart, usage, why := startFailure(c.x, c.seen, c.window)
		require.Equal(t, c.atStart, atStart, c.name)
		require.Equal(t, c.usage, usage, c.name)
		require.Equal(t, c.doomed, why != "", "%s: %q", c.name, why)
	}
}

// syncBuffer is a strings.Builder safe for the launcher's logger and the
// test.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// keyChecker is a slog.Handler that records every record's attribute keys.
type keyChecker struct {
	mu      sync.Mutex
	records []keyRecord
}

type keyRecord struct {
	msg  string
	keys []string
}

func (h *keyChecker) Enabled(context.Context, slog.Level) bool { return true }
func (h *keyChecker) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *keyChecker) WithGroup(string) slog.Handler            { return h }

func (h *keyChecker) Handle(_ context.Context, r slog.Record) error {
	rec := keyRecord{msg: r.Message}
	r.Attrs(func(a slog.Attr) bool { rec.keys = append(rec.keys, a.Key); return true })
	h.mu.Lock()
	h.records = append(h.records, rec)
	h.mu.Unlock()
	return nil
}

// has reports whether a record with message msg holds every key (mu held).
func (h *keyChecker) has(msg string, keys ...string) bool {
	for _, r := range h.records {
		if r.msg != msg {
			continue
		}
		n := 0
		for _, k := range keys {
			for _, rk := range r.keys {
				if rk == k {
					n++
					break
				}
			}
		}
		if n == len(keys) {
			return true
		}
	}
	return false
}

// A worker that stopped on an error a restart cannot fix (an invalid
// configuration, a foreign checkpoint, settings the job refused) was once
// restarted like a crash, unless it failed with status 2 within the
// start-up window of its first start. Now its status (StatusPermanent) is
// never restarted, whenever it comes, and the launcher stops the whole job
// at once: the others get the stop signal and leave, and the job's error
// names that worker and wraps ErrPermanent (status 2, as a bad command
// line).
func TestAPermanentErrorIsNeverRestartedAndStopsTheJob(t *testing.T) {
	job, cfg, logs := exitOnUSR1(t, "permanent-on-usr1")

	res, err := waitDone(t, job, cfg.GracePeriod+10*time.Second)
	require.ErrorIs(t, err, ErrPermanent)
	require.ErrorIs(t, err, ErrFailed)
	require.NotErrorIs(t, err, ErrUsage)
	require.Equal(t, StatusUsage, ExitStatus(err), "a launcher exits 2, as for a bad command line")
	require.Equal(t, StatusUsage, res.ExitStatus())
	require.Equal(t, Failed, res.Outcome)
	require.Zero(t, res.Restarts, "a restart fails the same way")
	require.True(t, res.Stopped, "the launcher stopped the job")
	require.Len(t, res.Exits, 3)
	first := res.Exits[0]
	require.Equal(t, 1, first.Worker)
	require.True(t, first.Permanent)
	require.False(t, first.Restarting)
	require.Equal(t, StatusPermanent, first.Code)
	for _, x := range res.Exits[1:] {
		require.True(t, x.AtStop, "%+v", x)
		require.Equal(t, Preempted, x.Outcome, "the others got the stop signal and left: %+v", x)
	}
	require.ErrorContains(t, err, "worker 1 (pid ")
	require.ErrorContains(t, err, "a permanent error")
	require.NotContains(t, err.Error(), "worker 0", "the first permanent error decides, not the workers it stopped")
	require.NotContains(t, logs.String(), "restarting it as a new member")
	require.NotContains(t, logs.String(), "restart=1")
	require.Contains(t, logs.String(), "not restarting it, and stopping the job")
}

// A worker the job's running members refused (StatusRefused: its settings
// differ from theirs) is not restarted, and unlike a permanent error it
// does not stop the job: the others go on, and the job's outcome is theirs.
func TestARefusedWorkerIsNotRestartedAndTheJobGoesOn(t *testing.T) {
	job, cfg, logs := exitOnUSR1(t, "refused-on-usr1")
	// The refused worker's exit is logged while the others still run: the
	// job did not stop for it.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "worker refused") }, time.Minute, 10*time.Millisecond)
	require.NotContains(t, logs.String(), "stopping the job")
	job.Stop(syscall.SIGTERM)
	res, err := waitDone(t, job, cfg.GracePeriod+10*time.Second)
	require.NotErrorIs(t, err, ErrPermanent)
	require.Zero(t, res.Restarts, "a restart would be refused the same way")
	require.Len(t, res.Exits, 3)
	first := res.Exits[0]
	require.Equal(t, 1, first.Worker)
	require.True(t, first.Refused)
	require.False(t, first.Permanent)
	require.False(t, first.Restarting)
	require.False(t, first.AtStop, "it ended before the stop")
	for _, x := range res.Exits[1:] {
		require.True(t, x.AtStop, "the others ran until the stop: %+v", x)
		require.Equal(t, Preempted, x.Outcome, "%+v", x)
	}
	require.NotContains(t, logs.String(), "restarting it as a new member")
}

// exitOnUSR1 starts three fake workers of mode (one that exits with a
// status of its own on SIGUSR1), with the start-up rule off so only the
// status decides, and sends worker 1 the SIGUSR1 once all three are ready.
func exitOnUSR1(t *testing.T, mode string) (*Job, Config, *syncBuffer) {
	t.Helper()
	spec := fakeSpec(t, mode)
	out, lines := outputLines(t)
	spec.Stdout = out
	logs := new(syncBuffer)
	cfg := testConfig(3)
	cfg.StartupWindow = 0
	job, err := Start(context.Background(), spec, cfg, WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	require.NoError(t, err)
	awaitLines(t, lines, "ready ", 3)
	require.NoError(t, job.Signal(1, syscall.SIGUSR1))
	return job, cfg, logs
}
