package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
)

func TestMain(m *testing.M) { testredis.VerifyTestMain(m) }

// build builds etrun and the launch package's test worker (a user's own
// worker binary, outside the examples) into dir.
func build(t *testing.T, dir string) (etrun, worker string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	etrun, worker = filepath.Join(dir, "etrun"), filepath.Join(dir, "worker")
	for _, b := range [][2]string{{etrun, "."}, {worker, "../../launch/testdata/worker"}} {
		out, err := exec.Command(gobin, "build", "-o", b[0], b[1]).CombinedOutput()
		require.NoError(t, err, "go build %s: %s", b[1], out)
	}
	return etrun, worker
}

type workerEvent struct {
	Ev        string `json:"ev"`
	Worker    int    `json:"worker"`
	Restart   int    `json:"restart"`
	PID       int    `json:"pid"`
	WorldSize int    `json:"world_size"`
	Step      int64  `json:"step"`
	Status    int    `json:"status"`
	Preempted bool   `json:"preempted"`
	Finished  bool   `json:"finished"`
}

// etrunProc is an etrun process started by a test, with its stdout (the
// workers' event lines) decoded as they come.
type etrunProc struct {
	cmd    *exec.Cmd
	events chan workerEvent
	stderr bytes.Buffer
	read   sync.WaitGroup
}

func startEtrun(t *testing.T, etrun string, args ...string) *etrunProc {
	t.Helper()
	p := &etrunProc{cmd: exec.Command(etrun, args...), events: make(chan workerEvent, 4096)}
	p.cmd.Stderr = &p.stderr
	// Once etrun exited, what its workers still hold of its stderr does
	// not hold up Wait for long (a test of a SIGKILLed etrun must see the
	// workers die without waiting for them).
	p.cmd.WaitDelay = time.Second
	out, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	p.read.Add(1)
	go func() {
		defer p.read.Done()
		defer close(p.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e workerEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				p.events <- e
			}
		}
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		for range p.events {
		}
		p.read.Wait()
		p.cmd.Wait()
	})
	return p
}

// until returns the events up to the first that ok accepts.
func (p *etrunProc) until(t *testing.T, ok func(workerEvent) bool) []workerEvent {
	t.Helper()
	var evs []workerEvent
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case e, open := <-p.events:
			require.True(t, open, "etrun's output ended first; stderr:\n%s", &p.stderr)
			evs = append(evs, e)
			if ok(e) {
				return evs
			}
		case <-deadline:
			t.Fatalf("no such event in 2 minutes; stderr:\n%s", &p.stderr)
		}
	}
}

// wait waits for etrun to exit and returns its status and every event
// not read yet.
func (p *etrunProc) wait(t *testing.T) (int, []workerEvent) {
	t.Helper()
	var evs []workerEvent
	for e := range p.events {
		evs = append(evs, e)
	}
	p.read.Wait()
	err := p.cmd.Wait()
	if err != nil {
		_, ok := err.(*exec.ExitError)
		require.True(t, ok, "%v", err)
	}
	return p.cmd.ProcessState.ExitCode(), evs
}

// gone reports whether pid no longer runs (absent, or a zombie).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// TestEtrunAsAProcess runs the etrun binary over a user's own worker
// binary and signals it as a user, a scheduler or an OOM killer would.
func TestEtrunAsAProcess(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	for sig, name := range map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"} {
		t.Run("a "+name+" preempts every worker and etrun exits 143", func(t *testing.T) {
			ckpt := t.TempDir()
			p := startEtrun(t, etrun, "-workers", "2", "-grace", "30s", "-redis", testredis.Addr(t), "-job", testredis.JobID(t),
				"--", worker, "-epochs", "100000", "-min", "2", "-checkpoint", ckpt)
			evs := p.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 && e.Step >= 5 })
			require.NoError(t, p.cmd.Process.Signal(sig))
			code, rest := p.wait(t)
			evs = append(evs, rest...)
			require.Equal(t, 143, code, "etrun's stderr:\n%s", &p.stderr)
			require.Contains(t, p.stderr.String(), "forwarding the signal to every worker")
			require.Contains(t, p.stderr.String(), "outcome=preempted exit_status=143")

			var pids []int
			var step int64 = -1
			for _, e := range evs {
				switch e.Ev {
				case "start":
					pids = append(pids, e.PID)
				case "exit":
					require.True(t, e.Preempted, "worker %d's Run returned trainer.ErrPreempted: %+v", e.Worker, e)
					require.Equal(t, 143, e.Status)
					if step >= 0 {
						require.Equal(t, step, e.Step)
					}
					step = e.Step
				}
			}
			require.Len(t, pids, 2)
			require.Positive(t, step)
			for _, pid := range pids {
				require.True(t, gone(pid), "worker pid %d outlived etrun", pid)
			}
			dir, err := checkpoint.NewLocalDir(ckpt, 3)
			require.NoError(t, err)
			steps, err := dir.List(context.Background())
			require.NoError(t, err)
			require.Equal(t, []int64{step}, steps, "the preemption checkpoint, of the step the workers left at")
		})
	}

	t.Run("a SIGKILLed etrun takes its workers with it", func(t *testing.T) {
		if runtime.GOOS != "linux" {
			t.Skip("the parent-death signal is Linux's")
		}
		// Without it the workers would live on until their store outage
		// budget ran out, far beyond the deadline below.
		killedEtrun(t, etrun, worker)
	})

	t.Run("a job that runs to the end exits 0", func(t *testing.T) {
		p := startEtrun(t, etrun, "-workers", "2", worker, "-epochs", "1", "-min", "2")
		code, evs := p.wait(t)
		require.Equal(t, 0, code, "stderr:\n%s", &p.stderr)
		n := 0
		for _, e := range evs {
			if e.Ev == "exit" {
				n++
				require.True(t, e.Finished)
			}
		}
		require.Equal(t, 2, n)
	})
}

func killedEtrun(t *testing.T, etrun, worker string) {
	// etrun's output goes to a pipe this test drains until the end, and to
	// a file: a worker that outlived etrun could write on, rather than die
	// of a broken pipe, so only the parent-death signal ends it.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	require.NoError(t, err)
	defer stderr.Close()
	cmd := exec.Command(etrun, "-workers", "2", "--", worker, "-epochs", "100000", "-min", "2")
	cmd.Stdout, cmd.Stderr = w, stderr
	require.NoError(t, cmd.Start())
	w.Close()
	pids := make(chan int, 2)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var e workerEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Ev == "start" {
				pids <- e.PID
			}
		}
	}()
	defer func() { r.Close(); <-drained }()
	var got []int
	timeout := time.After(2 * time.Minute)
	for len(got) < 2 {
		select {
		case pid := <-pids:
			got = append(got, pid)
		case <-timeout:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the workers never started")
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	require.Equal(t, -1, cmd.ProcessState.ExitCode())
	deadline := time.Now().Add(20 * time.Second)
	for _, pid := range got {
		for !gone(pid) {
			if time.Now().After(deadline) {
				for _, pid := range got {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				t.Fatalf("worker pid %d outlived a SIGKILLed etrun by 20 s", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// runEtrun runs the command in this process.
func runEtrun(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var o, e bytes.Buffer
	code := run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestEtrunExitStatusOfAWorkerThatKeepsCrashing(t *testing.T) {
	// -startup-window 0: the crash comes at once every time, which the
	// start-up rule would stop restarting after one restart.
	code, _, stderr := runEtrun(t, nil, "-max-restarts", "2", "-startup-window", "0", "sh", "-c", "exit 7")
	require.Equal(t, 1, code)
	require.Equal(t, 2, strings.Count(stderr, "worker crashed; restarting it as a new member"), stderr)
	require.Contains(t, stderr, "etrun: launch: job failed: worker 0 (restart 2, pid ")
	require.Contains(t, stderr, "exited with status 7")
}

func TestEtrunPassesTheWorkersOutputOn(t *testing.T) {
	code, stdout, stderr := runEtrun(t, nil, "-workers", "3", "sh", "-c", `echo "out $ELASTICTRAIN_WORKER"; echo "err $ELASTICTRAIN_WORKER" >&2`)
	require.Equal(t, 0, code, stderr)
	for i := range 3 {
		require.Contains(t, stdout, fmt.Sprintf("out %d\n", i))
		require.Contains(t, stderr, fmt.Sprintf("err %d\n", i))
	}
}

func TestEtrunTakesTheSecretFromItsEnvironment(t *testing.T) {
	secret := "00112233445566778899aabbccddeeff"
	code, stdout, _ := runEtrun(t, map[string]string{"ELASTICTRAIN_SECRET": secret}, "-job", "shared-job", "sh", "-c", `echo "$ELASTICTRAIN_SECRET $ELASTICTRAIN_JOB_ID"`)
	require.Equal(t, 0, code)
	require.Equal(t, secret+" shared-job\n", stdout)

	code, _, stderr := runEtrun(t, map[string]string{"ELASTICTRAIN_SECRET": "00ff"}, "true")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "ELASTICTRAIN_SECRET must hold the job secret")
}

func TestEtrunBadCommandLinesExitWith2(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{nil, "etrun: no worker command"},
		{[]string{"-workers", "2"}, "etrun: no worker command"},
		{[]string{"-workers", "0", "true"}, "Workers 0: want at least 1"},
		{[]string{"-max-restarts", "-1", "true"}, "MaxRestarts -1"},
		{[]string{"-grace", "0s", "true"}, "GracePeriod 0s"},
		{[]string{"-job", "a b", "true"}, "JobID"},
		{[]string{"-workers", "x", "true"}, `invalid value "x" for flag -workers`},
		{[]string{"no-such-program-of-elastictrain"}, "no-such-program-of-elastictrain"},
	}
	for _, c := range cases {
		code, _, stderr := runEtrun(t, nil, c.args...)
		require.Equal(t, 2, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, "%v", c.args)
	}
	code, _, stderr := runEtrun(t, nil, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "Usage: etrun [flags] [--] command [args...]")
}

func TestEtrunRefusesARedisThatDoesNotAnswer(t *testing.T) {
	code, _, stderr := runEtrun(t, nil, "-redis", "127.0.0.1:1", "true")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "etrun: launch: the store at 127.0.0.1:1 does not answer")
	require.NotContains(t, stderr, "worker started")
}

// runEtrunWithin is runEtrun that fails the test when etrun runs longer
// than limit.
func runEtrunWithin(t *testing.T, limit time.Duration, args ...string) (int, string, string) {
	t.Helper()
	type res struct {
		code int
		o, e string
	}
	c := make(chan res, 1)
	go func() {
		var o, e syncBuffer
		code := run(args, &o, &e)
		c <- res{code, o.String(), e.String()}
	}()
	select {
	case r := <-c:
		return r.code, r.o, r.e
	case <-time.After(limit):
		t.Fatalf("etrun %v still running after %v", args, limit)
	}
	return 0, "", ""
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
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

func TestEtrunDoesNotWaitForAHungWorkerAfterTheJobFinished(t *testing.T) {
	// Workers 0 and 1 finish at once; worker 2 stops itself (a hung
	// worker, which only SIGKILL ends). etrun gives it -grace, then kills
	// it and exits 0: the job finished.
	code, stdout, stderr := runEtrunWithin(t, time.Minute, "-workers", "3", "-grace", "500ms", "sh", "-c",
		`echo "pid $ELASTICTRAIN_WORKER $$"; if [ "$ELASTICTRAIN_WORKER" = 2 ]; then kill -STOP $$; fi; exit 0`)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "worker killed: it was still running a grace period after the job finished")
	require.Contains(t, stderr, "killed_after_finish=1")
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var i, pid int
		_, err := fmt.Sscanf(l, "pid %d %d", &i, &pid)
		require.NoError(t, err, l)
		require.True(t, gone(pid), "worker %d (pid %d) left behind", i, pid)
	}
}

func TestEtrunDoesNotRestartAWorkerWhoseFlagsAreRefused(t *testing.T) {
	_, worker := build(t, t.TempDir())
	// The user's mistake: etrun's flag after the command goes to the
	// worker, whose flag package refuses it with status 2.
	code, _, stderr := runEtrunWithin(t, time.Minute, worker, "-workers", "3")
	require.Equal(t, 2, code, stderr)
	require.Equal(t, 1, strings.Count(stderr, "flag provided but not defined: -workers"), "one start, no restarts:\n%s", stderr)
	require.NotContains(t, stderr, "restarting it as a new member")
	require.Equal(t, 1, strings.Count(stderr, "msg=\"worker started\""), stderr)
	require.Contains(t, stderr, "its command line was refused")
	require.Contains(t, stderr, "etrun: the worker's command line holds -workers, etrun's own flag: etrun's flags go before the command")
	for _, l := range strings.Split(stderr, "\n") {
		require.LessOrEqual(t, strings.Count(l, " restart="), 1, "a duplicate key: %s", l)
	}
}

func TestEtrunReportsAWorkerKilledBySIGTERMAsNotPreempted(t *testing.T) {
	etrun, _ := build(t, t.TempDir())
	// sleep has no SIGTERM handler: the forwarded signal kills it.
	p := startEtrun(t, etrun, "-workers", "2", "--", "sh", "-c", `echo '{"ev":"start","pid":'$$'}'; exec sleep 1000`)
	p.until(t, func(e workerEvent) bool { return e.Ev == "start" })
	p.until(t, func(e workerEvent) bool { return e.Ev == "start" })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	code, _ := p.wait(t)
	require.Equal(t, 1, code, "nothing was committed: not the preempted status; stderr:\n%s", &p.stderr)
	require.Contains(t, p.stderr.String(), "worker killed by SIGTERM: it does not handle preemption, nothing was committed")
	require.NotContains(t, p.stderr.String(), "left as preempted")
	require.Contains(t, p.stderr.String(), "outcome=failed exit_status=1")
}

func TestEtrunEndsAJobWhoseStoppedWorkerTheOthersFinishedWithout(t *testing.T) {
	// The user's report: 3 trainers, one SIGSTOPped mid-training, the two
	// others re-form without it, finish and exit 0; etrun waited on the
	// stopped one until it was continued. Now it kills it -grace later.
	etrun, worker := build(t, t.TempDir())
	p := startEtrun(t, etrun, "-workers", "3", "-grace", "2s", "--", worker, "-epochs", "3", "-delay", "20ms")
	pids := map[int]int{}
	p.until(t, func(e workerEvent) bool {
		if e.Ev == "start" {
			pids[e.Worker] = e.PID
		}
		return e.Ev == "step" && e.WorldSize == 3 && e.Step >= 5
	})
	require.Len(t, pids, 3)
	require.NoError(t, syscall.Kill(pids[2], syscall.SIGSTOP))
	// A deadline, not a synchronisation: past it, end the test's own
	// processes and fail.
	late := time.AfterFunc(time.Minute, func() {
		syscall.Kill(pids[2], syscall.SIGKILL)
		p.cmd.Process.Kill()
	})
	code, _ := p.wait(t)
	require.True(t, late.Stop(), "etrun still waited for the stopped worker a minute later; stderr:\n%s", &p.stderr)
	require.Equal(t, 0, code, "the job finished; stderr:\n%s", &p.stderr)
	require.Contains(t, p.stderr.String(), "worker killed: it was still running a grace period after the job finished")
	require.Contains(t, p.stderr.String(), "killed_after_finish=1")
	for i, pid := range pids {
		require.True(t, gone(pid), "worker %d (pid %d) left behind", i, pid)
	}
}

// A second etrun started on the job ID of a running one (the same -redis
// and -job; each draws its own job secret) once started strangers to the
// running job, which re-formed its rounds for them while nothing said why.
// Now it exits 1 at once, starting no worker, with one line that names the
// job ID and what to do; the first trains on, undisturbed, to its end.
func TestASecondEtrunOnARunningJobIDIsRefused(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	redisAddr, job := testredis.Addr(t), testredis.JobID(t)
	args := []string{"-workers", "2", "-redis", redisAddr, "-job", job, "--", worker, "-min", "2"}
	first := startEtrun(t, etrun, append(args, "-epochs", "100000")...)
	first.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 && e.Step >= 5 })

	second := startEtrun(t, etrun, append(args, "-epochs", "1")...)
	code, evs := second.wait(t)
	require.Equal(t, 1, code, "stderr:\n%s", &second.stderr)
	require.Empty(t, evs, "no worker of the second etrun started")
	msg := strings.TrimSpace(second.stderr.String())
	require.NotContains(t, msg, "\n", "one line")
	require.Contains(t, msg, "etrun: launch: the job ID is in use by another launcher: job "+job+" is running on the store "+redisAddr)
	require.Contains(t, msg, "pass another job ID, or stop that launcher first")

	// The first job goes on in its round of 2 and hears of no stranger.
	evs = first.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.Step >= 40 })
	for _, e := range evs {
		if e.Ev == "step" {
			require.Equal(t, 2, e.WorldSize, "%+v", e)
		}
	}
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	code, _ = first.wait(t)
	require.Equal(t, 143, code, "stderr:\n%s", &first.stderr)
	require.NotContains(t, first.stderr.String(), "does not hold the job secret")
	require.NotContains(t, first.stderr.String(), "refused connection")
}

// TestEtrunAddsAWorkerOnSIGUSR1 adds a worker to a running job by hand:
// a SIGUSR1 to etrun starts worker 1, which joins the running job (a
// round of 2 trains); a second SIGUSR1 beyond -max-workers adds nothing
// and says why; the job then ends as preempted on SIGTERM.
func TestEtrunAddsAWorkerOnSIGUSR1(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	p := startEtrun(t, etrun, "-workers", "1", "-max-workers", "2", "-redis", testredis.Addr(t), "-job", testredis.JobID(t),
		"--", worker, "-epochs", "100000")
	p.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 1 && e.Step >= 5 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGUSR1))
	evs := p.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 })
	started := false
	for _, e := range evs {
		started = started || (e.Ev == "start" && e.Worker == 1)
	}
	require.True(t, started, "worker 1 started: %+v", evs)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGUSR1)) // above -max-workers
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	code, rest := p.wait(t)
	require.Equal(t, 143, code, "stderr:\n%s", &p.stderr)
	for _, e := range rest {
		require.NotEqual(t, 2, e.Worker, "no third worker: %+v", e)
	}
	out := p.stderr.String()
	require.Contains(t, out, "send SIGUSR1 to add a worker")
	require.Contains(t, out, "SIGUSR1: added a worker")
}

// TestEtrunFollowsItsCapacityFile runs two workers under -capacity and
// rewrites the file in place 2 -> 1 -> 2: worker 1 gets a SIGTERM, leaves
// gracefully (its Run returned trainer.ErrPreempted, status 143) and the
// other trains on alone; at 2 worker 1 starts again (restart 1) and the
// two train together. Nobody is restarted as a crash, and the job ends as
// preempted on SIGTERM.
func TestEtrunFollowsItsCapacityFile(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	capFile := filepath.Join(t.TempDir(), "capacity")
	require.NoError(t, os.WriteFile(capFile, []byte("2\n"), 0o644))
	p := startEtrun(t, etrun, "-workers", "2", "-capacity", capFile, "-redis", testredis.Addr(t), "-job", testredis.JobID(t),
		"--", worker, "-epochs", "100000")
	p.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 && e.Step >= 5 })

	require.NoError(t, os.WriteFile(capFile, []byte("1\n"), 0o644))
	var left workerEvent
	p.until(t, func(e workerEvent) bool {
		if e.Ev == "exit" {
			left = e
		}
		return e.Ev == "step" && e.WorldSize == 1
	})
	require.Equal(t, 1, left.Worker, "the newest worker left")
	require.True(t, left.Preempted, "it left gracefully: %+v", left)
	require.Equal(t, 143, left.Status)

	require.NoError(t, os.WriteFile(capFile, []byte("2\n"), 0o644))
	evs := p.until(t, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 })
	restarted := false
	for _, e := range evs {
		restarted = restarted || (e.Ev == "start" && e.Worker == 1 && e.Restart == 1)
	}
	require.True(t, restarted, "worker 1 started again: %+v", evs)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	code, _ := p.wait(t)
	require.Equal(t, 143, code, "stderr:\n%s", &p.stderr)
	out := p.stderr.String()
	require.Contains(t, out, "worker left gracefully as told: the capacity dropped; not restarting it")
	require.Contains(t, out, "outcome=preempted exit_status=143 restarts=0")
}

// TestEtrunSIGTERMEndsAWorkerWaitingBelowMin: a worker waiting for a round
// to form (one worker, -min 2) has nothing to commit; a SIGTERM to etrun,
// forwarded to it, ends it at once (issue 29, item 3). It used to wait on
// for the whole grace period and fail with "grace period exceeded". The
// bound: the wait is cancelled by the signal itself, then one leave call
// bounded by half the worker's lease (1 s), so 2 s from the signal to
// both processes gone leaves a second for signal delivery and exit.
func TestEtrunSIGTERMEndsAWorkerWaitingBelowMin(t *testing.T) {
	etrun, worker := build(t, t.TempDir())
	redisAddr, job := testredis.Addr(t), testredis.JobID(t)
	// The job's first change hint is published by the worker's Join that
	// created the job's state: from then on the worker waits in Join.
	sub := testredis.Client(t).Subscribe(context.Background(), store.KeyPrefix+"{"+job+"}:events")
	defer sub.Close()
	_, err := sub.Receive(context.Background()) // the subscription's confirmation
	require.NoError(t, err)
	p := startEtrun(t, etrun, "-workers", "1", "-grace", "30s", "-redis", redisAddr, "-job", job,
		"--", worker, "-epochs", "1", "-min", "2")
	start := p.until(t, func(e workerEvent) bool { return e.Ev == "start" })
	pid := start[len(start)-1].PID
	select {
	case <-sub.Channel():
	case <-time.After(time.Minute):
		t.Fatalf("the worker never joined; stderr:\n%s", &p.stderr)
	}
	signalled := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan struct{})
	var code int
	var evs []workerEvent
	go func() { defer close(exited); code, evs = p.wait(t) }()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatalf("etrun still runs a minute after SIGTERM; stderr:\n%s", &p.stderr)
	}
	took := time.Since(signalled)
	require.True(t, gone(pid), "worker pid %d outlived etrun", pid)
	t.Logf("etrun and its waiting worker gone %v after SIGTERM (bound 2 s)", took.Round(time.Millisecond))
	require.Less(t, took, 2*time.Second, "etrun and its waiting worker took %v to end after SIGTERM; stderr:\n%s", took, &p.stderr)
	require.Equal(t, 143, code, "stderr:\n%s", &p.stderr)
	require.NotContains(t, p.stderr.String(), "grace period")
	n := 0
	for _, e := range evs {
		if e.Ev == "exit" {
			n++
			require.True(t, e.Preempted, "Run returned trainer.ErrPreempted: %+v", e)
			require.Equal(t, 143, e.Status)
		}
	}
	require.Equal(t, 1, n)
}
