package trainer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/synctest"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// envLoadStarts sets how many job starts TestFaultFreeStartsUnderLoad runs
// (default 2, the quick variant CI runs). The acceptance run is
//
//	ELASTICTRAIN_LOAD_STARTS=50 go test -count=1 -run TestFaultFreeStartsUnderLoad -v ./trainer
const envLoadStarts = "ELASTICTRAIN_LOAD_STARTS"

// envSlowSteps ("N:duration") makes a worker process's first N StepFunc
// calls take at least that long: a rank that a loaded machine slows down,
// so its peers wait inside the control allreduce.
const envSlowSteps = "ELASTICTRAIN_TRAINER_TEST_SLOW_STEPS"

// slowSteps wraps a worker's StepFunc as envSlowSteps says.
func slowSteps(f StepFunc[trainertest.Batch]) StepFunc[trainertest.Batch] {
	n, d, ok := strings.Cut(os.Getenv(envSlowSteps), ":")
	left, err1 := strconv.Atoi(n)
	delay, err2 := time.ParseDuration(d)
	if !ok || err1 != nil || err2 != nil {
		return f
	}
	return func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
		if left > 0 {
			left--
			if err := sleepCtxTest(ctx, delay); err != nil {
				return 0, err
			}
		}
		return f(ctx, b)
	}
}

// sleepCtxTest waits d or until ctx ends (the slow rank's compute).
func sleepCtxTest(ctx context.Context, d time.Duration) error {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startLogged is procJob.start with the worker's log (stderr, level Warn)
// sent to lines instead of the test's stderr.
func (j *procJob) startLogged(lines chan<- string, env ...string) *proc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append([]string(nil), j.env...), env...)
	out, err := cmd.StdoutPipe()
	require.NoError(j.t, err)
	errOut, err := cmd.StderrPipe()
	require.NoError(j.t, err)
	require.NoError(j.t, cmd.Start())
	p := &proc{cmd: cmd, reports: make(chan report, 1<<16), exited: make(chan struct{})}
	j.procs = append(j.procs, p)
	var wg stdsync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			lines <- strconv.Itoa(cmd.Process.Pid) + ": " + sc.Text()
		}
	}()
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				p.reports <- r
				j.merged <- r
			}
		}
		wg.Wait() // both pipes drained before Wait closes them
		cmd.Wait()
		close(p.reports)
		close(p.exited)
	}()
	return p
}

// hogCPU keeps every core busy until the returned stop is called.
func hogCPU() (stop func()) {
	quit := make(chan struct{})
	var wg stdsync.WaitGroup
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := uint64(1)
			for {
				select {
				case <-quit:
					return
				default:
				}
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
		}()
	}
	return func() { close(quit); wg.Wait() }
}

// Fault-free starts of four worker processes on a loaded machine (a CPU
// hog on every core, and one rank slowed down for its first steps): no
// member is fenced and no round fails, however late a worker arrives or
// however slowly a round connects or steps. The workers hold elastic's
// default lease (3 s): the 1 s lease of the fault tests is a detection
// time for an idle machine, and CI's fresh-clone run (the compiler and
// other packages' tests beside this hog) once starved a worker past it,
// which the lease rightly took for a hang. (A worker arriving
// while the first round connected once made the others' collective watch
// cancel that Connect on purpose, and the peers, seeing a broken
// connection, reported the healthy rank as lost.)
func TestFaultFreeStartsUnderLoad(t *testing.T) {
	starts := 2
	if v := os.Getenv(envLoadStarts); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, envLoadStarts)
		starts = n
	}
	stop := hogCPU()
	defer stop()
	bad := 0
	for s := range starts {
		j := newProcJob(t, 2, 1, t.TempDir())
		lines := make(chan string, 1<<16)
		// The second worker's first 10 steps take 350 ms each (a rank
		// the load slows down): its peers wait that long in each step's
		// control allreduce, as the fourth arrives.
		lease := envLease + "=1"
		j.startLogged(lines, lease)
		j.startLogged(lines, lease, envSlowSteps+"=10:350ms")
		j.startLogged(lines, lease)
		// The fourth arrives late, as a slow process start does: after
		// the first round closed (LastCall 300 ms), at another moment
		// of its connecting or first steps in each start (the
		// scenario's input, not a wait).
		time.Sleep(400*time.Millisecond + time.Duration(s%6)*150*time.Millisecond)
		j.startLogged(lines, lease)
		j.waitAll()
		close(lines)
		var problems []string
		for l := range lines {
			if strings.Contains(l, "fenced") || strings.Contains(l, "round failed") || strings.Contains(l, "level=ERROR") {
				problems = append(problems, l)
			}
		}
		var rounds []string
		for _, p := range j.procs {
			for _, r := range p.seen {
				if r.Kind == "round" && r.Rank == 0 {
					rounds = append(rounds, strconv.FormatUint(r.Round, 10)+":"+strconv.Itoa(r.Size)+"@"+strconv.FormatInt(r.Step, 10))
				}
			}
			if p.final == nil {
				problems = append(problems, "pid "+strconv.Itoa(p.cmd.Process.Pid)+" ended without finishing: "+p.last.Err)
			}
		}
		t.Logf("start %d: rounds (number:size@step) %v", s+1, rounds)
		if len(problems) > 0 {
			bad++
			t.Errorf("start %d of %d:\n%s", s+1, starts, strings.Join(problems, "\n"))
		}
	}
	t.Logf("%d fault-free starts of 4 workers under a CPU hog on %d cores: %d with a failed round or an eviction", starts, runtime.NumCPU(), bad)
}

// A worker that arrives while a round is inside a slow collective or a
// slow Connect (a loaded machine: one rank takes 500 ms to enter each
// operation of the round, or to reach its Connect) does not abort it: a
// waiting joiner is a planned change, taken at the next step boundary.
// Only a round the rendezvous has superseded (a member lost, evicted or
// gone) is aborted mid-collective. So the job grows without a failed
// round, a recovery or an eviction.
func TestJoinerDoesNotAbortASlowRound(t *testing.T) {
	for _, slow := range []string{"collective", "connect"} {
		t.Run(slow, func(t *testing.T) { testJoinerDuringSlowRound(t, slow) })
	}
}

func testJoinerDuringSlowRound(t *testing.T, slow string) {
	arrived := make(chan struct{}) // the round of three is connecting (connect) or connected (collective)
	var once stdsync.Once
	j := newMemJob(t, 480, 4, 1)
	j.cfg.Elastic.MinWorkers = 3
	j.c = trainertest.NewCluster(t, trainertest.ClusterConfig{Network: trainertest.NetworkConfig{
		OnGroup: func(w sync.World, g *synctest.Group) {
			if slow == "collective" && g.Size() == 3 {
				g.Delay(2, 500*time.Millisecond)
				once.Do(func() { close(arrived) })
			}
		},
	}})
	if slow == "connect" {
		j.backend = func(w *trainertest.Worker) []Option {
			if w.Index != 2 {
				return w.Options()
			}
			return []Option{WithBackend(&lateConnect{Backend: w.Backend, first: func() { once.Do(func() { close(arrived) }) }})}
		}
	}
	var logMu stdsync.Mutex
	var warnings []string
	j.opts = func(w *trainertest.Worker) []Option {
		return []Option{WithLogger(slog.New(&recordHandler{min: slog.LevelWarn, rec: func(r slog.Record) {
			logMu.Lock()
			warnings = append(warnings, fmt.Sprintf("%v: %s", w, r.Message))
			logMu.Unlock()
		}}))}
	}
	ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the round of three never began")
	}
	ws = append(ws, j.start()) // arrives while the slow round connects or is in a collective
	j.c.Wait()
	for _, w := range ws {
		res, err := w.Result()
		require.NoError(t, err, "%v", w)
		require.True(t, res.Finished, "%v", w)
		require.Zero(t, res.Recoveries, "%v: a failure recovery in a fault-free job", w)
	}
	logMu.Lock()
	defer logMu.Unlock()
	require.Empty(t, warnings, "no round failed, nobody was fenced")
	require.Equal(t, 1, ws[3].Backend.Connects(), "the joiner connected once: no round failed")
	rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, j.expected)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)
}

// lateConnect is a Backend whose first Connect starts 500 ms late (a rank
// of a loaded machine), calling first when it is called.
type lateConnect struct {
	*trainertest.Backend
	first func()
	late  bool
}

func (b *lateConnect) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	if !b.late {
		b.late = true
		b.first()
		tm := time.NewTimer(500 * time.Millisecond)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return nil, ctx.Err()
		}
	}
	return b.Backend.Connect(ctx, w)
}

// recordHandler is a slog.Handler that passes records at min or above to rec.
type recordHandler struct {
	min slog.Level
	rec func(slog.Record)
}

func (h *recordHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.rec(r)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }
