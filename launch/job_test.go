package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

// The test binary doubles as a fake worker: with envFake set it runs one
// of the modes of fakeWorker instead of the tests.
const (
	envFake = "LAUNCH_TEST_FAKE"
	envDir  = "LAUNCH_TEST_DIR"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envFake); mode != "" {
		os.Exit(fakeWorker(mode))
	}
	testredis.VerifyTestMain(m)
}

// fakeWorker runs one mode:
//
//	exit N       exit with status N at once
//	env          write what WorkerEnv returned (and GOMAXPROCS, WRAPPED,
//	             PREPARED, EXTRA) to DIR/env-INDEX-RESTART.json, exit 0
//	crash-once   exit 3 on the first start of an index, 0 on its restart
//	             once DIR/exited-I exists for every first index I
//	wait         print "ready INDEX PID" once SIGTERM and SIGINT are
//	             caught, then exit 143 on either
//	ignore-term  ignore SIGTERM, print "ready INDEX PID", wait for ever
//	grandchild   start a sleep in its own process group, print
//	             "child PID", exit 3
//	finish-on-usr1  print "ready INDEX PID", exit 0 on SIGUSR1 (the job
//	             finished)
//	stop-self    print "ready INDEX PID", then SIGSTOP itself (a hung
//	             worker); exit 0 if ever continued
//	no-handler   print "ready INDEX PID", then sleep without handling any
//	             signal: a SIGTERM kills it
//	slow-leave   print "ready INDEX PID"; on SIGTERM print "leaving INDEX",
//	             then exit 143 on SIGUSR1 (a leave that takes a while)
//	permanent-on-usr1  print "ready INDEX PID", exit StatusPermanent on
//	             SIGUSR1 (an error a restart cannot fix), 143 on SIGTERM
//	             or SIGINT
//	refused-on-usr1  the same with StatusRefused on SIGUSR1
//	events       emit a round, a line that is not an event, a step with a
//	             NaN loss and "done" on its events pipe, exit 0
func fakeWorker(mode string) int {
	w, err := WorkerEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake worker:", err)
		return 2
	}
	ready := func() { fmt.Printf("ready %d %d\n", w.Index, os.Getpid()) }
	kind, arg, _ := strings.Cut(mode, " ")
	switch kind {
	case "exit":
		n, _ := strconv.Atoi(arg)
		return n
	case "env":
		rec := map[string]any{"worker": w, "GOMAXPROCS": os.Getenv("GOMAXPROCS"), "WRAPPED": os.Getenv("WRAPPED"),
			"PREPARED": os.Getenv("PREPARED"), "USER_VAR": os.Getenv("USER_VAR")}
		if f := os.NewFile(3, "extra"); f != nil {
			if _, err := f.Write([]byte("x")); err == nil {
				rec["EXTRA"] = "written"
			}
			f.Close()
		}
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(filepath.Join(os.Getenv(envDir), fmt.Sprintf("env-%d-%d.json", w.Index, w.Restart)), b, 0o644); err != nil {
			return 1
		}
		return 0
	case "crash-once":
		if w.Restart == 0 {
			return 3
		}
		// Finish only once the launcher handled the crash of every first
		// process (the test's OnExit writes DIR/exited-INDEX): a restart
		// that finished sooner would end the restarts of the others.
		for i := range w.Workers {
			for {
				if _, err := os.Stat(filepath.Join(os.Getenv(envDir), fmt.Sprintf("exited-%d", i))); err == nil {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		return 0
	case "wait":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		ready()
		<-sigs
		return 143
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		ready()
		select {}
	case "finish-on-usr1":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGUSR1)
		ready()
		<-sigs
		return 0
	case "platform":
		// ready INDEX PID capacity N BOUNDED ERR autoscale A; worker 0's
		// first process then asks for ARG workers; SIGUSR1 releases the
		// worker, SIGTERM ends it as preempted.
		p := w.Platform()
		if p == nil {
			fmt.Println("no platform")
			return 1
		}
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
		ctx := context.Background()
		n, ok, err := p.Capacity(ctx)
		fmt.Printf("ready %d %d capacity %d %v %v autoscale %v\n", w.Index, os.Getpid(), n, ok, err, w.Autoscale)
		if arg != "" && w.Index == 0 && w.Restart == 0 {
			target, _ := strconv.Atoi(arg)
			fmt.Printf("resized %d %v\n", target, p.Resize(ctx, target))
		}
		if <-sigs == syscall.SIGUSR1 {
			fmt.Printf("released %d %v\n", w.Index, p.Release(ctx))
		}
		return 143
	case "slow-leave":
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGUSR1)
		ready()
		for <-sigs != syscall.SIGTERM {
		}
		fmt.Printf("leaving %d\n", w.Index)
		for <-sigs != syscall.SIGUSR1 {
		}
		return 143
	case "permanent-on-usr1", "refused-on-usr1":
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
		ready()
		if <-sigs == syscall.SIGUSR1 {
			if mode == "refused-on-usr1" {
				return StatusRefused
			}
			return StatusPermanent
		}
		return 143
	case "stop-self":
		ready()
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return 0
	case "no-handler":
		ready()
		time.Sleep(time.Hour)
		return 0
	case "events":
		// Its events: a round, a line that is not JSON, a step with a NaN
		// loss, then "done"; exit 0.
		e := NewEmitter()
		e.Emit(Event{Ev: EvRound, Round: 1, Rank: w.Index})
		os.NewFile(3, "events").Write([]byte("{not json\n"))
		e.Emit(Event{Ev: EvStep, Step: 1, Loss: math.NaN()})
		e.Emit(Event{Ev: EvDone, Step: 1})
		return 0
	case "grandchild":
		cmd := exec.Command("sleep", "1000")
		if err := cmd.Start(); err != nil {
			return 1
		}
		fmt.Printf("child %d\n", cmd.Process.Pid)
		return 3
	}
	return 2
}

// outputLines returns a writer for Spec.Stdout and the lines the workers
// write to it. The channel closes once the test is over and every worker
// holding the pipe exited.
func outputLines(t *testing.T) (*os.File, <-chan string) {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	c := make(chan string, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(c)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		w.Close()
		for range c { // drain, so the reader is never blocked
		}
		wg.Wait()
		r.Close()
	})
	return w, c
}

// awaitLines waits for n lines that start with prefix and returns them.
func awaitLines(t *testing.T, c <-chan string, prefix string, n int) []string {
	t.Helper()
	var got []string
	deadline := time.After(time.Minute)
	for len(got) < n {
		select {
		case l, ok := <-c:
			require.True(t, ok, "output closed after %d of %d %q lines", len(got), n, prefix)
			if strings.HasPrefix(l, prefix) {
				got = append(got, l)
			}
		case <-deadline:
			t.Fatalf("only %d of %d %q lines after a minute", len(got), n, prefix)
		}
	}
	return got
}

func fakeSpec(t *testing.T, mode string) Spec {
	return Spec{Command: []string{os.Args[0]}, Env: []string{envFake + "=" + mode, envDir + "=" + t.TempDir()}, Stderr: os.Stderr}
}

func testConfig(workers int) Config {
	cfg := DefaultConfig()
	cfg.Workers = workers
	cfg.GracePeriod = 20 * time.Second
	return cfg
}

func TestWorkersGetTheJobInTheirEnvironment(t *testing.T) {
	spec := fakeSpec(t, "env")
	dir := strings.TrimPrefix(spec.Env[1], envDir+"=")
	spec.Env = append(spec.Env, "USER_VAR=mine")
	spec.Wrap = func(i int) []string {
		if i == 1 {
			return []string{"env", "WRAPPED=yes"}
		}
		return nil
	}
	cfg := testConfig(3)
	cfg.JobID, cfg.Secret, cfg.GracePeriod = "env-job", []byte("0123456789abcdef"), 7*time.Second
	var mu sync.Mutex
	var events []string
	hooks := Hooks{
		Prepare: func(p Process, cmd *exec.Cmd) error {
			cmd.Env = append(cmd.Env, "PREPARED=1")
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("extra-%d", p.Worker)))
			if err != nil {
				return err
			}
			t.Cleanup(func() { f.Close() })
			cmd.ExtraFiles = []*os.File{f}
			mu.Lock()
			events = append(events, fmt.Sprintf("prepare %d pid=%d", p.Worker, p.PID))
			mu.Unlock()
			return nil
		},
		OnStart: func(p Process) {
			mu.Lock()
			events = append(events, fmt.Sprintf("start %d", p.Worker))
			mu.Unlock()
		},
		OnExit: func(x Exit) {
			mu.Lock()
			events = append(events, fmt.Sprintf("exit %d", x.Worker))
			mu.Unlock()
		},
	}
	job, err := Start(context.Background(), spec, cfg, WithHooks(hooks))
	require.NoError(t, err)
	res, err := job.Wait()
	require.NoError(t, err)
	require.Equal(t, Finished, res.Outcome)
	require.Equal(t, 0, res.ExitStatus())
	require.Equal(t, "env-job", res.JobID)
	require.Len(t, res.Last(), 3)

	for i := range 3 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("env-%d-0.json", i)))
		require.NoError(t, err)
		var rec struct {
			Worker                                  Worker
			GOMAXPROCS, WRAPPED, PREPARED, USER_VAR string
			EXTRA                                   string
		}
		require.NoError(t, json.Unmarshal(b, &rec))
		require.Equal(t, Worker{Store: job.Store(), JobID: "env-job", Secret: []byte("0123456789abcdef"), Index: i, Workers: 3,
			GracePeriod: 7 * time.Second}, rec.Worker)
		require.Equal(t, strconv.Itoa(max(1, runtime.NumCPU()/3)), rec.GOMAXPROCS)
		require.Equal(t, "mine", rec.USER_VAR)
		require.Equal(t, "1", rec.PREPARED)
		require.Equal(t, "written", rec.EXTRA, "Prepare's ExtraFiles reach the worker as fd 3")
		require.Equal(t, map[bool]string{true: "yes", false: ""}[i == 1], rec.WRAPPED, "worker %d", i)
	}
	// Every process: prepared (before it had a pid), started, then exited.
	mu.Lock()
	defer mu.Unlock()
	for i := range 3 {
		at := map[string]int{}
		for k, e := range events {
			at[e] = k
		}
		p, okp := at[fmt.Sprintf("prepare %d pid=0", i)]
		s, oks := at[fmt.Sprintf("start %d", i)]
		x, okx := at[fmt.Sprintf("exit %d", i)]
		require.True(t, okp && oks && okx, "events %v", events)
		require.Less(t, p, s)
		require.Less(t, s, x)
	}
}

func TestGOMAXPROCSOfTheEnvironmentIsKept(t *testing.T) {
	spec := fakeSpec(t, "env")
	dir := strings.TrimPrefix(spec.Env[1], envDir+"=")
	spec.Env = append(spec.Env, "GOMAXPROCS=7")
	_, err := Run(context.Background(), spec, testConfig(1))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "env-0-0.json"))
	require.NoError(t, err)
	require.Contains(t, string(b), `"GOMAXPROCS":"7"`)
}

func TestACrashedWorkerIsRestartedUpToTheLimit(t *testing.T) {
	cfg := testConfig(1)
	cfg.MaxRestarts = 2
	// The fake worker crashes at once, every time: with the start-up rule
	// on, its second crash would end the restarts (see
	// TestAStartThatFailsTheSameWayIsRestartedOnce).
	cfg.StartupWindow = 0
	res, err := Run(context.Background(), fakeSpec(t, "exit 3"), cfg)
	require.ErrorIs(t, err, ErrFailed)
	require.EqualError(t, err, fmt.Sprintf("launch: job failed: worker 0 (restart 2, pid %d) exited with status 3", res.Exits[2].PID))
	require.Equal(t, Failed, res.Outcome)
	require.Equal(t, 1, res.ExitStatus())
	require.Equal(t, 2, res.Restarts)
	require.Len(t, res.Exits, 3)
	for k, x := range res.Exits {
		require.Equal(t, 0, x.Worker)
		require.Equal(t, k, x.Restart)
		require.Equal(t, 3, x.Code)
		require.Equal(t, Failed, x.Outcome)
		require.Equal(t, k < 2, x.Restarting, "exit %d", k)
	}
	require.NotEqual(t, res.Exits[0].PID, res.Exits[1].PID, "a restart is a new process")
}

func TestARestartedWorkerThatSucceedsFinishesTheJob(t *testing.T) {
	spec := fakeSpec(t, "crash-once")
	dir := strings.TrimPrefix(spec.Env[1], envDir+"=")
	res, err := Run(context.Background(), spec, testConfig(2), WithHooks(Hooks{OnExit: func(x Exit) {
		if x.Restart == 0 {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("exited-%d", x.Worker)), nil, 0o644)
		}
	}}))
	require.NoError(t, err)
	require.Equal(t, Finished, res.Outcome)
	require.Equal(t, 2, res.Restarts)
	require.Len(t, res.Exits, 4)
	for _, x := range res.Last() {
		require.Equal(t, 1, x.Restart)
		require.Equal(t, Finished, x.Outcome)
	}
}

func TestNoRestartsWhenTheyAreOff(t *testing.T) {
	cfg := testConfig(1)
	cfg.MaxRestarts = 0
	res, err := Run(context.Background(), fakeSpec(t, "exit 1"), cfg)
	require.ErrorIs(t, err, ErrFailed)
	require.Len(t, res.Exits, 1)
	require.Zero(t, res.Restarts)
}

func TestStopForwardsTheSignalToEveryWorker(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			spec := fakeSpec(t, "wait")
			out, lines := outputLines(t)
			spec.Stdout = out
			job, err := Start(context.Background(), spec, testConfig(2))
			require.NoError(t, err)
			awaitLines(t, lines, "ready", 2)
			job.Stop(sig)
			job.Stop(syscall.SIGKILL) // only the first stop counts
			res, err := job.Wait()
			require.ErrorIs(t, err, ErrPreempted)
			require.Equal(t, 143, ExitStatus(err))
			require.Equal(t, Preempted, res.Outcome)
			require.True(t, res.Stopped)
			require.Len(t, res.Exits, 2)
			for _, x := range res.Exits {
				require.Equal(t, 143, x.Code, "the worker caught the signal and left by itself")
				require.True(t, x.AtStop)
				require.False(t, x.Killed)
				require.False(t, x.Restarting)
			}
		})
	}
}

func TestTheStartContextStopsTheJobLikeSIGTERM(t *testing.T) {
	spec := fakeSpec(t, "wait")
	out, lines := outputLines(t)
	spec.Stdout = out
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	job, err := Start(ctx, spec, testConfig(2))
	require.NoError(t, err)
	awaitLines(t, lines, "ready", 2)
	cancel()
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, Preempted, res.Outcome)
	<-job.Done()
	res2, err2 := job.Wait()
	require.Equal(t, res, res2, "Wait returns the same every time")
	require.Equal(t, err, err2)
}

func TestAWorkerThatOutstaysTheGracePeriodIsKilled(t *testing.T) {
	spec := fakeSpec(t, "ignore-term")
	out, lines := outputLines(t)
	spec.Stdout = out
	cfg := testConfig(2)
	cfg.GracePeriod = 300 * time.Millisecond
	job, err := Start(context.Background(), spec, cfg)
	require.NoError(t, err)
	awaitLines(t, lines, "ready", 2)
	stopped := time.Now()
	job.Stop(syscall.SIGTERM)
	res, err := job.Wait()
	require.GreaterOrEqual(t, time.Since(stopped), cfg.GracePeriod, "nobody is killed before the grace period is over")
	require.ErrorIs(t, err, ErrFailed)
	require.ErrorContains(t, err, "was killed by the launcher")
	require.Equal(t, 1, res.ExitStatus())
	for _, x := range res.Exits {
		require.True(t, x.Killed)
		require.Equal(t, syscall.SIGKILL, x.Signal)
		require.False(t, x.Restarting, "no restart while stopping")
	}
}

func TestKillEndsEveryWorkerAtOnce(t *testing.T) {
	spec := fakeSpec(t, "ignore-term")
	out, lines := outputLines(t)
	spec.Stdout = out
	job, err := Start(context.Background(), spec, testConfig(2)) // a 20 s grace period
	require.NoError(t, err)
	awaitLines(t, lines, "ready", 2)
	job.Stop(syscall.SIGTERM)
	job.Kill()
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrFailed)
	for _, x := range res.Exits {
		require.True(t, x.Killed)
	}
}

func TestKillWithoutAStopFailsTheJob(t *testing.T) {
	spec := fakeSpec(t, "wait")
	out, lines := outputLines(t)
	spec.Stdout = out
	job, err := Start(context.Background(), spec, testConfig(1))
	require.NoError(t, err)
	awaitLines(t, lines, "ready", 1)
	job.Kill()
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrFailed)
	require.Equal(t, Failed, res.Outcome)
	require.Zero(t, res.Restarts, "a killed job restarts nothing")
}

// gone reports whether pid no longer runs: it does not exist, or it is a
// zombie nobody reaped yet (this machine's init may be slow to).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// awaitGone waits, up to a deadline, until pid no longer runs.
func awaitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWhatAWorkerLeftInItsProcessGroupIsKilled(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the leftovers of a worker are killed on Linux only")
	}
	spec := fakeSpec(t, "grandchild")
	out, lines := outputLines(t)
	spec.Stdout = out
	cfg := testConfig(1)
	cfg.MaxRestarts = 0
	_, err := Run(context.Background(), spec, cfg)
	require.ErrorIs(t, err, ErrFailed)
	l := awaitLines(t, lines, "child", 1)
	pid, err := strconv.Atoi(strings.TrimPrefix(l[0], "child "))
	require.NoError(t, err)
	awaitGone(t, pid)
}

func TestAddStartsMoreWorkersUpToMaxWorkers(t *testing.T) {
	spec := fakeSpec(t, "wait")
	out, lines := outputLines(t)
	spec.Stdout = out
	cfg := testConfig(1)
	cfg.MaxWorkers = 3
	job, err := Start(context.Background(), spec, cfg)
	require.NoError(t, err)
	ws, err := job.Add(context.Background(), 2)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, ws)
	_, err = job.Add(context.Background(), 1)
	require.ErrorContains(t, err, "Config.MaxWorkers is 3")
	_, err = job.Add(context.Background(), 0)
	require.Error(t, err)
	ready := awaitLines(t, lines, "ready", 3)
	require.ElementsMatch(t, []string{"ready 0", "ready 1", "ready 2"}, []string{
		ready[0][:7], ready[1][:7], ready[2][:7]})
	job.Stop(nil)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	require.Len(t, res.Exits, 3)
	_, err = job.Add(context.Background(), 1)
	require.ErrorIs(t, err, ErrJobOver)
}

func TestSignalReachesOneWorker(t *testing.T) {
	spec := fakeSpec(t, "wait")
	out, lines := outputLines(t)
	spec.Stdout = out
	exited := make(chan Exit, 4)
	job, err := Start(context.Background(), spec, testConfig(2), WithHooks(Hooks{OnExit: func(x Exit) { exited <- x }}))
	require.NoError(t, err)
	awaitLines(t, lines, "ready", 2)
	require.ErrorIs(t, job.Signal(5, syscall.SIGTERM), ErrNoWorker)
	require.NoError(t, job.Signal(1, syscall.SIGTERM))
	x := <-exited
	require.Equal(t, 1, x.Worker)
	require.Equal(t, Preempted, x.Outcome)
	require.False(t, x.Restarting, "a preempted worker is not restarted")
	require.ErrorIs(t, job.Signal(1, syscall.SIGTERM), ErrNoWorker)
	job.Stop(syscall.SIGTERM)
	res, err := job.Wait()
	require.ErrorIs(t, err, ErrPreempted, "every worker running at the stop left as preempted")
	require.Len(t, res.Exits, 2)
	require.False(t, res.Exits[0].AtStop)
	require.True(t, res.Exits[1].AtStop)
}

func TestAStartThatFailsLeavesNothingRunning(t *testing.T) {
	spec := fakeSpec(t, "wait")
	var pids []int
	spec.Wrap = func(i int) []string {
		if i == 2 {
			return []string{"no-such-wrapper-of-elastictrain"}
		}
		return nil
	}
	_, err := Start(context.Background(), spec, testConfig(3), WithHooks(Hooks{OnStart: func(p Process) { pids = append(pids, p.PID) }}))
	require.ErrorContains(t, err, "launch: worker 2:")
	require.ErrorContains(t, err, "no-such-wrapper-of-elastictrain")
	require.Len(t, pids, 2)
	for _, pid := range pids {
		require.True(t, gone(pid), "worker %d was reaped before Start returned", pid)
	}
}

func TestAPrepareErrorStopsTheStart(t *testing.T) {
	_, err := Start(context.Background(), fakeSpec(t, "wait"), testConfig(1), WithHooks(Hooks{
		Prepare: func(Process, *exec.Cmd) error { return fmt.Errorf("no files for you") }}))
	require.ErrorContains(t, err, "launch: worker 0: prepare: no files for you")
}

func TestAnUnreachableRedisIsOneClearErrorBeforeAnyWorker(t *testing.T) {
	cfg := testConfig(2)
	cfg.Redis = "127.0.0.1:1"
	started := 0
	_, err := Start(context.Background(), fakeSpec(t, "wait"), cfg, WithHooks(Hooks{OnStart: func(Process) { started++ }}))
	require.ErrorContains(t, err, "launch: the store at 127.0.0.1:1 does not answer")
	require.ErrorContains(t, err, "connection refused")
	require.Zero(t, started)
}

func TestAFinishedJobRestartsNoLaterCrash(t *testing.T) {
	// Worker 0 finishes at once; worker 1 (wrapped in a shell) crashes a
	// moment later, once 0 has exited: a new member would find the job
	// over, so it is not restarted, and the job finished.
	spec := fakeSpec(t, "exit 0")
	dir := t.TempDir()
	marker := filepath.Join(dir, "zero-exited")
	spec.Wrap = func(i int) []string {
		if i == 1 {
			return []string{"sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done; exit 5`, marker}
		}
		return nil
	}
	res, err := Run(context.Background(), spec, testConfig(2), WithHooks(Hooks{OnExit: func(x Exit) {
		if x.Worker == 0 {
			os.WriteFile(marker, nil, 0o644)
		}
	}}))
	require.NoError(t, err)
	require.Equal(t, Finished, res.Outcome)
	require.Zero(t, res.Restarts)
	require.Equal(t, 5, res.Last()[1].Code)
}
