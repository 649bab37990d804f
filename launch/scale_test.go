package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/autoscale"
)

// logLines returns a logger whose records arrive on the channel, one line
// each.
func logLines() (*slog.Logger, <-chan string) {
	c := make(chan string, 4096)
	return slog.New(slog.NewTextHandler(chanWriter(c), nil)), c
}

type chanWriter chan string

func (c chanWriter) Write(b []byte) (int, error) {
	select {
	case c <- string(b):
	default: // a test reads what it waits for; never block the launcher
	}
	return len(b), nil
}

// awaitLog waits for a log line holding every part.
func awaitLog(t *testing.T, c <-chan string, parts ...string) string {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case l := <-c:
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				return l
			}
		case <-deadline:
			t.Fatalf("no log line with %q in a minute", parts)
		}
	}
}

// awaitExit waits for the next exit the OnExit hook reported.
func awaitExit(t *testing.T, c <-chan Exit) Exit {
	t.Helper()
	select {
	case x := <-c:
		return x
	case <-time.After(time.Minute):
		t.Fatal("no worker exited in a minute")
	}
	return Exit{}
}

// stopOnFailure kills the job at the end of a test that failed before it
// stopped it, so its workers never outlive the test.
func stopOnFailure(t *testing.T, job *Job) {
	t.Cleanup(func() {
		job.Kill()
		job.Wait()
	})
}

func writeCapacity(t *testing.T, path, s string) {
	t.Helper()
	// In place, as a user's echo 2 > FILE does: truncate, then write.
	require.NoError(t, os.WriteFile(path, []byte(s), 0o644))
}

func TestParseCapacity(t *testing.T) {
	for in, want := range map[string]int{"3": 3, " 2\n": 2, "\t1 \n\n": 1, "1024": 1024} {
		n, err := parseCapacity([]byte(in))
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, n, "%q", in)
	}
	for in, why := range map[string]string{"": "empty", " \n": "empty", "0": "not a whole number", "-1": "not a whole number",
		"two": "not a whole number", "2 3": "not a whole number", "1.5": "not a whole number", "\x00": "not a whole number"} {
		_, err := parseCapacity([]byte(in))
		require.ErrorContains(t, err, why, "%q", in)
	}
}

func TestAnUnreadableCapacityFileFailsStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	writeCapacity(t, bad, "lots")
	for _, path := range []string{filepath.Join(dir, "missing"), bad} {
		cfg := testConfig(1)
		cfg.CapacityFile = path
		_, err := Start(context.Background(), fakeSpec(t, "wait"), cfg)
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, "capacity file")
	}
	cfg := testConfig(1)
	cfg.CapacityFile, cfg.CapacityPoll = bad, 0
	require.ErrorContains(t, cfg.Validate(), "CapacityPoll 0s: want at least 10ms")
}

func TestNoControlSocketWithoutScaling(t *testing.T) {
	require.Nil(t, Worker{JobID: "j"}.Platform(), "no control socket: no Platform")
	var p *platform
	_, _, err := p.Capacity(context.Background())
	require.ErrorIs(t, err, ErrControl, "a nil client fails, never panics")
	var _ autoscale.Platform = Worker{Control: "x"}.Platform()
}

// TestTheCapacityFileShrinksAndGrowsTheJob runs three real worker
// processes under a capacity file and rewrites it in place 3 -> 1 ->
// garbage -> empty -> 2: the two newest workers get a SIGTERM and leave
// gracefully (143), released and not restarted; the bad reads change
// nothing and are logged once each; at 2 one worker starts again on the
// lowest index that left. The workers' Capacity calls answer the file.
// The job, stopped at the end, is preempted, not failed, with no
// restart.
func TestTheCapacityFileShrinksAndGrowsTheJob(t *testing.T) {
	capFile := filepath.Join(t.TempDir(), "capacity")
	writeCapacity(t, capFile, "3\n")
	spec := fakeSpec(t, "platform")
	out, lines := outputLines(t)
	spec.Stdout = out
	exits := make(chan Exit, 16)
	var scales []Scale
	scalec := make(chan Scale, 16)
	log, logs := logLines()
	cfg := testConfig(3)
	cfg.CapacityFile = capFile
	job, err := Start(context.Background(), spec, cfg, WithLogger(log), WithHooks(Hooks{
		OnExit:  func(x Exit) { exits <- x },
		OnScale: func(s Scale) { scalec <- s },
	}))
	require.NoError(t, err)
	stopOnFailure(t, job)
	for _, l := range awaitLines(t, lines, "ready", 3) {
		require.Contains(t, l, "capacity 3 true <nil> autoscale false")
	}

	writeCapacity(t, capFile, "1\n")
	left := map[int]bool{}
	for range 2 {
		x := awaitExit(t, exits)
		require.True(t, x.Released, "%+v", x)
		require.Equal(t, Preempted, x.Outcome, "a graceful leave: %+v", x)
		require.False(t, x.Restarting, "%+v", x)
		left[x.Worker] = true
	}
	require.Equal(t, map[int]bool{1: true, 2: true}, left, "the newest workers leave")
	scales = append(scales, <-scalec)

	writeCapacity(t, capFile, "many")
	awaitLog(t, logs, "capacity file read ignored", "many")
	writeCapacity(t, capFile, "")
	awaitLog(t, logs, "capacity file read ignored", "empty")

	writeCapacity(t, capFile, "2")
	l := awaitLines(t, lines, "ready", 1)[0]
	require.True(t, strings.HasPrefix(l, "ready 1 "), "the lowest index that left starts again: %s", l)
	require.Contains(t, l, "capacity 2 true <nil>")
	scales = append(scales, <-scalec)
	require.Equal(t, []Scale{
		{From: 3, To: 1, Reason: "capacity", Capacity: 1, Leaving: []int{2, 1}},
		{From: 1, To: 2, Reason: "capacity", Capacity: 2, Started: []int{1}},
	}, scales)

	_, err = job.Add(context.Background(), 1)
	require.ErrorIs(t, err, ErrCapacity, "Add stays within the capacity")

	job.Stop(nil)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted, "the released workers neither fail nor decide the job")
	require.Zero(t, res.Restarts)
	var released, restarted int
	for _, x := range res.Exits {
		if x.Released {
			released++
		}
		if x.Worker == 1 && x.Restart == 1 {
			restarted++
		}
	}
	require.Equal(t, 2, released)
	require.Equal(t, 1, restarted, "worker 1 ran again as restart 1: %v", res.Exits)
}

// TestWorkersResizeAndReleaseThroughTheControlSocket: a worker's Resize(3)
// over the real socket starts two more workers (Autoscale reaches them
// through their environment); a worker that calls Release and leaves is
// not restarted and does not fail the job; a Resize above MaxWorkers is
// held to it.
func TestWorkersResizeAndReleaseThroughTheControlSocket(t *testing.T) {
	spec := fakeSpec(t, "platform 5")
	out, lines := outputLines(t)
	spec.Stdout = out
	exits := make(chan Exit, 16)
	cfg := testConfig(1)
	cfg.MaxWorkers, cfg.Autoscale = 3, true
	job, err := Start(context.Background(), spec, cfg, WithHooks(Hooks{OnExit: func(x Exit) { exits <- x }}))
	require.NoError(t, err)
	stopOnFailure(t, job)
	ready := awaitLines(t, lines, "ready", 3)
	for _, l := range ready {
		require.Contains(t, l, "capacity 3 true <nil> autoscale true", "MaxWorkers bounds the capacity")
	}
	require.NoError(t, job.Signal(2, syscall.SIGUSR1))
	require.Equal(t, "released 2 <nil>", awaitLines(t, lines, "released", 1)[0])
	x := awaitExit(t, exits)
	require.Equal(t, 2, x.Worker)
	require.True(t, x.Released)
	require.False(t, x.Restarting)
	require.Equal(t, Preempted, x.Outcome)

	job.Stop(nil)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	require.Len(t, res.Exits, 3, "nothing was restarted")
}

// TestTheControlSocketRefusesBadInput sends the launcher's control socket
// what no client sends: each gets one line with a clear error and a closed
// connection, and the launcher answers a good request after them.
func TestTheControlSocketRefusesBadInput(t *testing.T) {
	capFile := filepath.Join(t.TempDir(), "capacity")
	writeCapacity(t, capFile, "2")
	out, lines := outputLines(t)
	spec := fakeSpec(t, "wait")
	spec.Stdout = out
	cfg := testConfig(1)
	cfg.CapacityFile = capFile
	job, err := Start(context.Background(), spec, cfg)
	require.NoError(t, err)
	stopOnFailure(t, job)
	awaitLines(t, lines, "ready", 1)
	path := job.ctl.path
	fi, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "only the launcher's user reaches the socket")

	ask := func(req string) string {
		c, err := net.Dial("unix", path)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, req)
		require.NoError(t, err)
		b, err := io.ReadAll(bufio.NewReader(c)) // the launcher closes after its answer
		require.NoError(t, err)
		require.Equal(t, 1, strings.Count(string(b), "\n"), "one answer line: %q", b)
		var rep controlReply
		require.NoError(t, json.Unmarshal(b, &rep), "%q", b)
		return rep.Error
	}
	for req, want := range map[string]string{
		"not json\n":                             "request is not a JSON object",
		"{\"op\":\"fly\"}\n":                     `unknown op "fly"`,
		"{}\n":                                   `unknown op ""`,
		"{\"op\":\"resize\",\"target\":0}\n":     "resize to 0: want a target of at least 1",
		"{\"op\":\"resize\",\"target\":-5}\n":    "resize to -5",
		"{\"op\":\"capacity\",\"x\":1}\n":        "unknown field",
		"{\"op\":\"capacity\"} {}\n":             "more than one JSON value",
		"{\"op\":\"release\",\"worker\":7}\n":    "release: worker 7 (restart 0) is not running",
		"{\"op\":\"release\",\"worker\":-1}\n":   "want an index and restart >= 0",
		"{\"op\":\"resize\",\"target\":\"x\"}\n": "request is not a JSON object",
		strings.Repeat("a", 2*maxControlLine):    "request longer than 4096 bytes",
		"{\"op\":\"capacity\"}":                  "reading the request",
		"[1,2,3]\n":                              "request is not a JSON object",
		"{\"op\":\"release\",\"restart\":99}\n":  "release: worker 0 (restart 99) is not running",
	} {
		if req == "{\"op\":\"capacity\"}" {
			// No newline, then the writer closes its side: EOF.
			c, err := net.Dial("unix", path)
			require.NoError(t, err)
			io.WriteString(c, req)
			c.(*net.UnixConn).CloseWrite()
			b, err := io.ReadAll(c)
			c.Close()
			require.NoError(t, err)
			var rep controlReply
			require.NoError(t, json.Unmarshal(b, &rep), "%q", b)
			require.Contains(t, rep.Error, want)
			continue
		}
		got := ask(req)
		require.True(t, strings.HasPrefix(got, "launch: control: "), "%q: %q", req, got)
		require.Contains(t, got, want, "%q", req)
	}
	p := Worker{Control: path, Index: 0}.Platform()
	n, ok, err := p.Capacity(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.True(t, ok)
	err = Worker{Control: path, Index: 5}.Platform().Release(context.Background())
	require.ErrorIs(t, err, ErrControl)
	require.ErrorContains(t, err, "worker 5 (restart 0) is not running")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err = p.Capacity(ctx)
	require.True(t, errors.Is(err, context.Canceled) && errors.Is(err, ErrControl), "%v", err)

	job.Stop(nil)
	_, err = job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	_, err = os.Stat(filepath.Dir(path))
	require.True(t, os.IsNotExist(err), "the socket's directory is removed with the job")
	_, _, err = p.Capacity(context.Background())
	require.ErrorIs(t, err, ErrControl, "a job that is over answers nothing, clearly")
}

// TestWithAutoscaleACapacityDropWaitsForTheWorkersReleases: with
// Autoscale, the workers' policy names who leaves when the capacity
// drops. A worker that releases itself within ReleaseWait (worker 0
// here, not the newest) counts toward the drop, and the launcher stops no
// other worker; a drop nobody answers is the launcher's after ReleaseWait
// (the newest worker leaves).
func TestWithAutoscaleACapacityDropWaitsForTheWorkersReleases(t *testing.T) {
	capFile := filepath.Join(t.TempDir(), "capacity")
	writeCapacity(t, capFile, "3")
	spec := fakeSpec(t, "platform")
	out, lines := outputLines(t)
	spec.Stdout = out
	exits := make(chan Exit, 16)
	log, logs := logLines()
	cfg := testConfig(3)
	cfg.CapacityFile, cfg.Autoscale = capFile, true
	job, err := Start(context.Background(), spec, cfg, WithLogger(log), WithHooks(Hooks{OnExit: func(x Exit) { exits <- x }}))
	require.NoError(t, err)
	stopOnFailure(t, job)
	awaitLines(t, lines, "ready", 3)

	writeCapacity(t, capFile, "2")
	awaitLog(t, logs, "capacity changed", "from=3 to=2")
	require.NoError(t, job.Signal(0, syscall.SIGUSR1))
	require.Equal(t, "released 0 <nil>", awaitLines(t, lines, "released", 1)[0])
	x := awaitExit(t, exits)
	require.Equal(t, 0, x.Worker)
	require.True(t, x.Released)
	awaitLog(t, logs, "the workers' own releases brought the job within the capacity; stopping none")

	writeCapacity(t, capFile, "1")
	awaitLog(t, logs, "capacity changed", "from=2 to=1")
	x = awaitExit(t, exits)
	require.Equal(t, 2, x.Worker, "after ReleaseWait the newest worker leaves")
	require.True(t, x.Released)
	require.Equal(t, Preempted, x.Outcome)

	job.Stop(nil)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	require.Len(t, res.Exits, 3)
}

// TestACapacityFileThatIsNoRegularFileNeverHangsTheLauncher: a FIFO, a
// symlink to /dev/zero, a directory and a file over the bound are refused at Start
// with a clear error (a FIFO's open blocked Start forever; /dev/zero was
// read without a bound). A running job's capacity file replaced by a FIFO
// is logged and ignored, and the job still ends (the watcher blocked in
// the FIFO's open, and the launcher's end waited for it for ever).
func TestACapacityFileThatIsNoRegularFileNeverHangsTheLauncher(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	zero := filepath.Join(dir, "zero")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	huge := filepath.Join(dir, "huge")
	writeCapacity(t, huge, "2"+strings.Repeat(" ", maxCapacityFile))
	sub := t.TempDir()
	for path, why := range map[string]string{fifo: "not a regular file (a named pipe)", zero: "not a regular file (a device)", sub: "not a regular file (a directory)", huge: "longer than"} {
		cfg := testConfig(1)
		cfg.CapacityFile = path
		started := make(chan error, 1)
		go func() {
			_, err := Start(context.Background(), fakeSpec(t, "wait"), cfg)
			started <- err
		}()
		select {
		case err := <-started:
			require.ErrorIs(t, err, ErrInvalidConfig, path)
			require.ErrorContains(t, err, why, path)
		case <-time.After(time.Minute):
			t.Fatalf("Start with the capacity file %s did not return in a minute", path)
		}
	}

	capFile := filepath.Join(dir, "capacity")
	writeCapacity(t, capFile, "1\n")
	log, logs := logLines()
	cfg := testConfig(1)
	cfg.CapacityFile = capFile
	job, err := Start(context.Background(), fakeSpec(t, "wait"), cfg, WithLogger(log))
	require.NoError(t, err)
	stopOnFailure(t, job)
	require.NoError(t, os.Rename(fifo, capFile))
	awaitLog(t, logs, "capacity file read ignored", "not a regular file")
	job.Stop(nil)
	select {
	case <-job.Done():
	case <-time.After(time.Minute):
		t.Fatal("the job did not end in a minute after its stop")
	}
}

// TestTheControlSocketOutlivesAFloodThatExhaustsFileDescriptors: a flood
// of connections while the launcher is out of file descriptors fails its
// accepts (EMFILE); once the flood is gone the socket answers again (its
// accept loop ended at the first failed accept, and every later request
// of the job hung unanswered).
func TestTheControlSocketOutlivesAFloodThatExhaustsFileDescriptors(t *testing.T) {
	log, logs := logLines()
	calls := make(chan ctlCall)
	ctl, err := startControl(calls, log)
	require.NoError(t, err)
	answered := make(chan struct{})
	go func() { // owned by the test: it ends when the test closes calls
		defer close(answered)
		for c := range calls {
			c.reply <- controlReply{Capacity: 3, Bounded: true}
		}
	}()
	defer func() {
		ctl.close()
		close(calls)
		<-answered
	}()

	var orig syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig))
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	low := orig
	low.Cur = uint64(len(fds) + 16)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig))
		}
	}
	defer restore()
	var flood []net.Conn
	for range 64 {
		// The dials that fail for want of descriptors are part of the
		// flood too; the ones that connect wait in the backlog.
		if c, err := net.Dial("unix", ctl.path); err == nil {
			flood = append(flood, c)
		}
	}
	awaitLog(t, logs, "control socket: accept failed")
	for _, c := range flood {
		c.Close()
	}
	restore()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, ok, err := Worker{Control: ctl.path}.Platform().Capacity(ctx)
	require.NoError(t, err, "the socket answers after the flood")
	require.Equal(t, 3, n)
	require.True(t, ok)
}

// TestARisingCapacityWaitsForTheWorkersStillLeaving: workers told to
// leave by a capacity drop still run (committing, checkpointing) until
// they exit, and hold their share of the capacity until then. When the
// capacity rises back before they exited, the launcher starts no worker
// beyond it (it started two new ones at once: five processes under a
// capacity of three, on two fresh indices), nor does Add, and it starts
// one each time a leaver exits, on the leaver's index.
func TestARisingCapacityWaitsForTheWorkersStillLeaving(t *testing.T) {
	capFile := filepath.Join(t.TempDir(), "capacity")
	writeCapacity(t, capFile, "3\n")
	spec := fakeSpec(t, "slow-leave")
	out, lines := outputLines(t)
	spec.Stdout = out
	scalec := make(chan Scale, 16)
	log, logs := logLines()
	cfg := testConfig(3)
	cfg.CapacityFile = capFile
	job, err := Start(context.Background(), spec, cfg, WithLogger(log), WithHooks(Hooks{
		OnScale: func(s Scale) { scalec <- s },
	}))
	require.NoError(t, err)
	stopOnFailure(t, job)
	awaitLines(t, lines, "ready", 3)

	writeCapacity(t, capFile, "1\n")
	awaitLines(t, lines, "leaving", 2)
	require.Equal(t, Scale{From: 3, To: 1, Reason: "capacity", Capacity: 1, Leaving: []int{2, 1}}, <-scalec)

	writeCapacity(t, capFile, "3\n")
	awaitLog(t, logs, "capacity changed", "to=3")
	// A control request is answered after the supervisor handled the
	// change: whatever it started for it, OnScale has reported.
	_, _, err = Worker{Control: job.ctl.path}.Platform().Capacity(context.Background())
	require.NoError(t, err)
	select {
	case s := <-scalec:
		t.Fatalf("the launcher started workers beyond the capacity while two still leave: %+v", s)
	default:
	}
	_, err = job.Add(context.Background(), 1)
	require.ErrorIs(t, err, ErrCapacity, "Add counts the workers still leaving too")

	require.NoError(t, job.Signal(2, syscall.SIGUSR1))
	require.Equal(t, Scale{From: 1, To: 2, Reason: "capacity", Capacity: 3, Started: []int{2}}, <-scalec)
	require.NoError(t, job.Signal(1, syscall.SIGUSR1))
	require.Equal(t, Scale{From: 2, To: 3, Reason: "capacity", Capacity: 3, Started: []int{1}}, <-scalec)
	awaitLines(t, lines, "ready", 2)

	job.Stop(nil)
	awaitLines(t, lines, "leaving", 3)
	for i := range 3 {
		require.NoError(t, job.Signal(i, syscall.SIGUSR1))
	}
	_, err = job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
}
