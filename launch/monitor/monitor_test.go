package monitor

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/faults"
)

// The launcher re-executes its own binary: here, the test binary, which
// acts as a fake worker when the launcher's launch.EnvWorker variable is set.
func TestMain(m *testing.M) {
	if os.Getenv(launch.EnvWorker) != "" {
		os.Exit(fakeWorker(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// fakeWorker is a worker that trains nothing. Worker idx of the first
// -world holds rank (idx+1) mod world in round 1 (so ranks and launch
// indices differ); a worker started later by a join holds rank idx in a
// round of its own, with world size idx+1. Every worker writes
// DIR/ready-IDX ("rank pid"), reports its round, then an "error" event
// with the message "round reported" (the launcher echoes it to its log
// after handling the round event from the same pipe), and waits for
// DIR/done; on
// SIGTERM it writes DIR/term-IDX and exits with 143.
//
// The holder of rank 0 waits until the launcher's log (mirrored to
// DIR/launcher.log by the test) holds every worker's echo, so the launcher
// knows who holds which rank; then it reports steps 1..-steps and the job
// done. After each step that a -faults entry names it waits, with a
// deadline, until the fault has visibly hit its target (gone, stopped,
// terminated, or the joiners' echoes logged), so the launcher must have
// applied it at that step. With -hold it never reports done.
//
// -loss sets the loss of every step (default 1/step); -await makes rank 0
// wait, before reporting done, until the launcher's log holds that text;
// -garbage makes every worker first write a line that is not JSON to its
// events pipe; -finished makes every worker report launch.EvFinished and exit 0
// at once, as a worker does whose job had already finished; with
// -pending, a joiner fails unless the launcher holds the job for it
// (EnvHold's file exists), writes that path to DIR/hold-path, reports
// launch.EvPending, and waits for the hold to end before its round.
func fakeWorker(args []string) int {
	fs := flag.NewFlagSet("fake", flag.ContinueOnError)
	dir := fs.String("dir", "", "shared directory")
	world := fs.Int("world", 1, "world size of round 1")
	steps := fs.Int64("steps", 0, "steps rank 0 reports")
	faultsFlag := fs.String("faults", "", "kind:N@STEP,... as given to the launcher")
	hold := fs.Bool("hold", false, "never finish")
	noDone := fs.Bool("no-done", false, "rank 0 exits without reporting done")
	loss := fs.Float64("loss", 0, "loss of every step (0: 1/step)")
	await := fs.String("await", "", "rank 0 waits for this text in the launcher's log before done")
	garbage := fs.Bool("garbage", false, "write a line that is not JSON to the events pipe first")
	finished := fs.Bool("finished", false, "report that the job had already finished, and exit 0")
	failAfterDone := fs.String("fail-after-done", "", "rank 0 reports done (unless -no-done), then this error, and exits 1")
	loseCheckpoint := fs.Int("lose-checkpoint", -1, "this worker (not rank 0), once rank 0 reported done, reports trainer.ErrCheckpoint and exits 1")
	pending := fs.Bool("pending", false, "a joiner checks that the job holds for it (EnvHold), reports launch.EvPending and waits for the hold to end before its round")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	idx, _ := strconv.Atoi(os.Getenv(launch.EnvWorker))
	ev := launch.NewEmitter()
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		ev.Emit(launch.Event{Ev: launch.EvError, Message: msg})
		fmt.Fprintf(os.Stderr, "fake worker %d: %s\n", idx, msg)
		return 1
	}
	if *garbage {
		os.NewFile(3, "events").Write([]byte("{not json\n"))
	}
	if *finished {
		ev.Emit(launch.Event{Ev: launch.EvFinished})
		return 0
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	termed := make(chan struct{})
	go func() {
		<-terms
		// Closed before the term file exists, and so before the stepper
		// (which waits for that file) can let the job finish.
		close(termed)
		os.WriteFile(filepath.Join(*dir, fmt.Sprintf("term-%d", idx)), nil, 0o644)
		os.Exit(143)
	}()

	rank, round, ws := (idx+1)%*world, uint64(1), *world
	if idx >= *world {
		rank, round, ws = idx, uint64(idx-*world+2), idx+1
		if *pending {
			hold := os.Getenv(EnvHold)
			if hold == "" || !exists(hold) {
				return fail("newcomer %d: the job does not hold for it (%s=%q)", idx, EnvHold, hold)
			}
			if err := os.WriteFile(filepath.Join(*dir, "hold-path"), []byte(hold), 0o644); err != nil {
				return fail("%v", err)
			}
			ev.Emit(launch.Event{Ev: launch.EvPending})
			if !waitFor(20*time.Second, func() bool { return !exists(hold) }) {
				return fail("newcomer %d: the hold outlived its pending event", idx)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(*dir, fmt.Sprintf("ready-%d", idx)), fmt.Appendf(nil, "%d %d", rank, os.Getpid()), 0o644); err != nil {
		return fail("%v", err)
	}
	ev.Emit(launch.Event{Ev: launch.EvRound, Round: round, Rank: rank, WorldSize: ws})
	ev.Emit(launch.Event{Ev: launch.EvError, Message: roundReported})

	waitDone := func() int {
		if !waitFor(2*time.Minute, func() bool { return exists(filepath.Join(*dir, "done")) }) {
			return fail("no done file")
		}
		select {
		case <-termed:
			select {} // the SIGTERM handler exits with 143; exiting 0 here first would race it
		default:
		}
		if idx == *loseCheckpoint {
			// What a worker's error event says of trainer.ErrCheckpoint.
			ev.Emit(launch.Event{Ev: launch.EvError, Message: "left without its checkpoint: trainer: checkpoint failed: disk full", Checkpoint: true})
			return 1
		}
		return 0
	}
	if rank != 0 {
		return waitDone()
	}

	var list []faults.Fault
	for _, f := range strings.Split(*faultsFlag, ",") {
		if f == "" {
			continue
		}
		kind, spec, _ := strings.Cut(f, ":")
		if err := (faults.Flag{Kind: faults.Kind(kind), List: &list}).Set(spec); err != nil {
			return fail("%v", err)
		}
	}
	if !waitFor(20*time.Second, func() bool { return echoed(*dir, *world) }) {
		return fail("the other workers never got ready")
	}
	started, lastRound := *world, uint64(1)
	for s := int64(1); s <= *steps; s++ {
		l := *loss
		if l == 0 {
			l = 1 / float64(s)
		}
		// The first step of a later round trains nothing (a dynamic-shard
		// job waiting for data): recovery is counted to the step after.
		r, samples := uint64(started-*world+1), 8
		if r != lastRound {
			lastRound, samples = r, 0
		}
		ev.Emit(launch.Event{Ev: launch.EvStep, Round: r, Rank: 0, WorldSize: started, Step: s, Loss: l, Samples: samples})
		HoldAtStep()
		for _, f := range list {
			if f.Step != s {
				continue
			}
			if f.Kind == faults.Join {
				started += f.Rank
				if !waitFor(20*time.Second, func() bool { return echoed(*dir, started) }) {
					return fail("%v: the joiners never got ready", f)
				}
				fmt.Fprintf(os.Stderr, "fake: %v hit: %d workers ready\n", f, started)
				continue
			}
			h, ok := holders(*dir)[f.Rank]
			if !ok {
				return fail("%v: nobody holds rank %d", f, f.Rank)
			}
			hit := map[faults.Kind]func() bool{
				faults.Kill: func() bool { st := procState(h.pid); return st == 0 || st == 'Z' || st == 'X' },
				faults.Stop: func() bool { return procState(h.pid) == 'T' },
				faults.Term: func() bool { return exists(filepath.Join(*dir, fmt.Sprintf("term-%d", h.idx))) },
			}[f.Kind]
			if !waitFor(20*time.Second, hit) {
				return fail("%v: worker %d (pid %d) was not hit after step %d", f, h.idx, h.pid, s)
			}
			fmt.Fprintf(os.Stderr, "fake: %v hit worker %d\n", f, h.idx)
		}
	}
	if *hold {
		return waitDone() // until the launcher kills it
	}
	if *await != "" && !waitFor(20*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(*dir, "launcher.log"))
		return bytes.Contains(b, []byte(*await))
	}) {
		return fail("%q never appeared in the launcher's log", *await)
	}
	if !*noDone {
		ev.Emit(launch.Event{Ev: launch.EvDone, Rank: 0, Step: *steps, Extra: map[string]any{"fake": true}})
	}
	if err := os.WriteFile(filepath.Join(*dir, "done"), nil, 0o644); err != nil {
		return fail("%v", err)
	}
	if *failAfterDone != "" {
		return fail("%s", *failAfterDone)
	}
	return 0
}

// roundReported is the message a fake worker sends after its round.
const roundReported = "round reported"

// echoed reports whether the launcher has logged the roundReported echo
// of workers 0..n-1, and so has handled their round events.
func echoed(dir string, n int) bool {
	b, _ := os.ReadFile(filepath.Join(dir, "launcher.log"))
	for i := range n {
		if !bytes.Contains(b, fmt.Appendf(nil, "[launcher] worker %d: %s\n", i, roundReported)) {
			return false
		}
	}
	return true
}

type holder struct{ idx, pid int }

// holders maps rank to the worker that wrote it in its ready file.
func holders(dir string) map[int]holder {
	out := map[int]holder{}
	names, _ := filepath.Glob(filepath.Join(dir, "ready-*"))
	for _, n := range names {
		idx, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(n), "ready-"))
		b, err2 := os.ReadFile(n)
		var rank, pid int
		if _, err3 := fmt.Sscan(string(b), &rank, &pid); err != nil || err2 != nil || err3 != nil {
			continue
		}
		out[rank] = holder{idx: idx, pid: pid}
	}
	return out
}

// procState is the state letter in /proc/PID/stat, 0 when there is no such
// process.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// waitFor polls cond every few milliseconds until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// logBuf collects the launcher's log (its own lines and the workers'
// stderr), mirrors it to DIR/launcher.log for the fake workers, and
// signals when a line matching a pattern has appeared.
type logBuf struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	mirror  *os.File
	pending []byte
	watch   *regexp.Regexp
	want    int
	fired   chan struct{}
}

func newLogBuf(t *testing.T, dir, watch string, want int) *logBuf {
	f, err := os.Create(filepath.Join(dir, "launcher.log"))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	l := &logBuf{mirror: f, want: want, fired: make(chan struct{})}
	if watch != "" {
		l.watch = regexp.MustCompile(watch)
	}
	return l
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.mirror.Write(p)
	l.pending = append(l.pending, p...)
	for {
		i := bytes.IndexByte(l.pending, '\n')
		if i < 0 {
			break
		}
		line := l.pending[:i]
		l.pending = l.pending[i+1:]
		if l.watch != nil && l.want > 0 && l.watch.Match(line) {
			if l.want--; l.want == 0 {
				close(l.fired)
			}
		}
	}
	return len(p), nil
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// pidsOf returns every worker pid the ready files name.
func pidsOf(dir string) []int {
	var pids []int
	for _, h := range holders(dir) {
		pids = append(pids, h.pid)
	}
	return pids
}

// requireGone checks that no process is left with any of pids: Run has
// reaped them all, so even a zombie would be a failure.
func requireGone(t *testing.T, pids []int) {
	t.Helper()
	require.NotEmpty(t, pids)
	for _, pid := range pids {
		err := syscall.Kill(pid, 0)
		require.True(t, errors.Is(err, syscall.ESRCH), "pid %d is still there (kill 0: %v)", pid, err)
	}
}

// testCtx bounds a launcher run, so a fake worker that fails leaves an
// error (Run kills the rest) rather than a hung test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var faultLine = regexp.MustCompile(`\[launcher\] step (\d+): (\S.*) rank (\d+) \(worker (\d+), pid (\d+)\)`)

func TestFaultsHitTheRankHolderAtTheirStep(t *testing.T) {
	dir := t.TempDir()
	// Ranks are (idx+1) mod 3: rank 1 is worker 0, rank 2 worker 1, rank
	// 0 (the stepper) worker 2; the joiner is worker 3 with rank 3.
	given := "kill:1@5,stop:2@9,join:1@12,term:3@17"
	var list []faults.Fault
	for _, f := range strings.Split(given, ",") {
		kind, spec, _ := strings.Cut(f, ":")
		require.NoError(t, faults.Flag{Kind: faults.Kind(kind), List: &list}.Set(spec))
	}
	log := newLogBuf(t, dir, "", 0)
	sum, err := Run(testCtx(t), Spec{
		Workers: 3, Faults: list, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "3", "-steps", "24", "-faults", given},
	})
	out := log.String()
	require.NoError(t, err, out)

	// Each fault line names the step it was applied at and the process
	// that held the rank then.
	type applied struct {
		step             int64
		what             string
		rank, worker, pi int
	}
	var got []applied
	for _, m := range faultLine.FindAllStringSubmatch(out, -1) {
		s, _ := strconv.ParseInt(m[1], 10, 64)
		r, _ := strconv.Atoi(m[3])
		w, _ := strconv.Atoi(m[4])
		p, _ := strconv.Atoi(m[5])
		got = append(got, applied{s, m[2], r, w, p})
	}
	hs := holders(dir)
	require.Len(t, got, 3, out)
	require.Equal(t, applied{5, syscall.SIGKILL.String(), 1, 0, hs[1].pid}, got[0])
	require.Equal(t, applied{9, syscall.SIGSTOP.String(), 2, 1, hs[2].pid}, got[1])
	require.Equal(t, applied{17, syscall.SIGTERM.String(), 3, 3, hs[3].pid}, got[2])
	require.Contains(t, out, "[launcher] step 12: starting 1 more worker(s)")
	for _, f := range list {
		require.Contains(t, out, fmt.Sprintf("fake: %v hit", f), "the stepper saw each fault land before its next step")
	}

	// Killed and stopped workers end by a signal (the stopped one is
	// killed once the job is done); the preempted one by its own exit.
	require.Equal(t, map[int]int{0: -1, 1: -1, 2: 0, 3: 143}, sum.Exits)
	require.NotNil(t, sum.Done)
	require.EqualValues(t, 24, sum.Done.Step)
	require.Equal(t, true, sum.Done.Extra["fake"])
	require.EqualValues(t, 24, sum.MaxStep)
	require.Len(t, sum.Steps, 24)
	require.Equal(t, []int{3, 4}, sum.WorldSizes())
	require.Len(t, sum.Rounds, 2)
	// The kill and the stop each await the first step of a later round
	// that trains samples: the joiner's round 2 from step 13 on trains
	// nothing in step 13.
	require.Len(t, sum.Recoveries, 2)
	require.Contains(t, out, "training again in round 2 at step 14,")
	require.NotContains(t, out, "at step 13,")
	requireGone(t, pidsOf(dir))
}

// A Join fault holds the job (EnvHold) from the fault's step until its
// newcomers wait in the store (launch.EvPending): the newcomer starts
// while the hold file exists and sees it go once it reported pending.
func TestAJoinHoldsTheJobUntilTheNewcomerWaits(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Faults: []faults.Fault{{Kind: faults.Join, Rank: 1, Step: 3}}, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "6", "-faults", "join:1@3", "-pending"},
	})
	out := log.String()
	require.NoError(t, err, out)
	require.Equal(t, map[int]int{0: 0, 1: 0, 2: 0}, sum.Exits)
	held := strings.Index(out, "[launcher] holding the workers at their next step until the newcomer(s) wait in the store")
	waits := strings.Index(out, "[launcher] worker 2 waits in the store; the job goes on")
	require.True(t, held >= 0 && waits > held, out)
	require.NotContains(t, out, "no newcomer waits in the store")
	// The hold file lived in a directory of Run's own, gone with it.
	require.NoDirExists(t, filepath.Dir(holdPath(t, dir)))
}

// holdPath is the EnvHold path a fake worker of dir saw.
func holdPath(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "hold-path"))
	require.NoError(t, err)
	return string(b)
}

// A cancel is a preemption: the workers get a SIGTERM and leave (exit
// 143); the stopped one cannot, and is SIGKILLed once the grace period is
// over, so the job failed rather than was preempted.
func TestCancelStopsEveryChildAndKillsAStoppedOneAfterTheGracePeriod(t *testing.T) {
	dir := t.TempDir()
	// Rank 1 (worker 0) is stopped at step 2; the stepper then holds the
	// job open for good, and every worker is left waiting.
	log := newLogBuf(t, dir, `^fake: stop 1@2 hit worker 0$`, 1)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := Run(ctx, Spec{
			Workers: 3, Faults: []faults.Fault{{Kind: faults.Stop, Rank: 1, Step: 2}}, Log: log, Quiet: true, GracePeriod: time.Second,
			Args: []string{"-dir", dir, "-world", "3", "-steps", "3", "-faults", "stop:1@2", "-hold"},
		})
		done <- result{sum, err}
	}()
	select {
	case <-log.fired:
	case r := <-done:
		t.Fatalf("Run returned before the stop landed: %v\n%s", r.err, log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the stop never landed\n%s", log.String())
	}
	pids := pidsOf(dir)
	require.Len(t, pids, 3)
	require.Equal(t, byte('T'), procState(holders(dir)[1].pid))
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return after cancel\n%s", log.String())
	}
	require.ErrorIs(t, r.err, context.Canceled)
	require.ErrorIs(t, r.err, launch.ErrFailed)
	require.ErrorContains(t, r.err, "worker 0 (pid ")
	require.ErrorContains(t, r.err, "was killed by the launcher")
	require.Equal(t, map[int]int{0: -1, 1: 143, 2: 143}, r.sum.Exits)
	requireGone(t, pids)
}

// A cancel (the example's SIGTERM or Ctrl-C) is forwarded to every worker
// as a SIGTERM; when all of them leave by themselves the job was
// preempted.
func TestCancelPreemptsEveryWorker(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, `^\[launcher\] worker \d: `+roundReported+`$`, 2)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	type result struct {
		sum Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := Run(ctx, Spec{Workers: 2, Log: log, Quiet: true,
			Args: []string{"-dir", dir, "-world", "2", "-steps", "1", "-hold"}})
		done <- result{sum, err}
	}()
	select {
	case <-log.fired:
	case <-time.After(30 * time.Second):
		t.Fatalf("the workers never reported their rounds\n%s", log.String())
	}
	pids := pidsOf(dir)
	cancel()
	r := <-done
	require.ErrorIs(t, r.err, launch.ErrPreempted, log.String())
	require.ErrorIs(t, r.err, context.Canceled)
	require.Equal(t, 143, launch.ExitStatus(r.err))
	require.Equal(t, map[int]int{0: 143, 1: 143}, r.sum.Exits)
	for i := range 2 {
		require.FileExists(t, filepath.Join(dir, fmt.Sprintf("term-%d", i)), "worker %d got the SIGTERM", i)
	}
	requireGone(t, pids)
}

func TestEveryWorkerExitingWithoutDoneIsAnError(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "3", "-no-done"},
	})
	require.ErrorContains(t, err, "every worker exited and none reported the job done")
	require.Nil(t, sum.Done)
	require.Equal(t, map[int]int{0: 0, 1: 0}, sum.Exits)
	requireGone(t, pidsOf(dir))
}

func TestAFaultOnAnUnheldRankIsSkipped(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	// The stop of rank 1 (worker 0) at step 3 keeps the job open until
	// the launcher has handled the done event, which kills it.
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Faults: []faults.Fault{{Kind: faults.Kill, Rank: 7, Step: 2}, {Kind: faults.Stop, Rank: 1, Step: 3}}, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "4", "-faults", "stop:1@3"},
	})
	require.NoError(t, err, log.String())
	require.Contains(t, log.String(), "[launcher] step 2: no live worker holds rank 7; kill skipped")
	require.Equal(t, map[int]int{0: -1, 1: 0}, sum.Exits)
	requireGone(t, pidsOf(dir))
}

// A recovery that took two rounds (nothing trained between them) is one
// recovery; two recoveries with training between them are two.
func TestRecoveriesFromFailuresMergesARecoveryThatTookTwoRounds(t *testing.T) {
	sum := Summary{
		Rounds: []RoundSeen{{Round: 1}, {Round: 2, Recovery: true}, {Round: 3, Recovery: true},
			{Round: 4}, {Round: 5, Recovery: true}, {Round: 6, Recovery: true}},
		Steps: []StepSeen{{Step: 1, Round: 1, Samples: 8}, {Step: 2, Round: 2, Samples: 0},
			{Step: 2, Round: 3, Samples: 8}, {Step: 3, Round: 4, Samples: 8}},
	}
	require.Equal(t, 4, sum.RecoveryRounds())
	require.Equal(t, 2, sum.RecoveriesFromFailures(), "rounds 2+3 are one recovery (round 2 trained nothing), 5+6 another")
	sum.Steps = append(sum.Steps, StepSeen{Step: 4, Round: 5, Samples: 8})
	require.Equal(t, 3, sum.RecoveriesFromFailures(), "round 5 trained, so round 6 is a recovery of its own")
}

func TestWorldSizesMergesRepeatsInRoundOrder(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		want  []int
	}{
		{nil, nil},
		{[]int{2}, []int{2}},
		{[]int{3, 2, 3}, []int{3, 2, 3}},
		{[]int{3, 3, 2, 2, 2, 3}, []int{3, 2, 3}},
	} {
		var s Summary
		for i, w := range tc.sizes {
			s.Rounds = append(s.Rounds, RoundSeen{Round: uint64(i + 1), WorldSize: w})
		}
		require.Equal(t, tc.want, s.WorldSizes(), "%v", tc.sizes)
	}
}

func TestANaNLossReachesTheLauncherAndItsProgressLines(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	// Progress every millisecond; the stepper waits until a progress line
	// has shown the NaN before it reports done.
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Progress: time.Millisecond,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "3", "-loss", "NaN", "-await", "loss NaN"},
	})
	require.NoError(t, err, log.String())
	require.Len(t, sum.Steps, 3)
	for _, s := range sum.Steps {
		require.True(t, math.IsNaN(s.Loss), "step %d loss %v", s.Step, s.Loss)
	}
	require.Regexp(t, `\[launcher\] epoch 0 step [123] loss NaN `, log.String())
	requireGone(t, pidsOf(dir))
}

func TestALineThatIsNotAnEventIsReported(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	_, err := Run(testCtx(t), Spec{
		Workers: 1, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "1", "-steps", "2", "-garbage"},
	})
	require.NoError(t, err, log.String())
	require.Contains(t, log.String(), `[launcher] worker 0: undecodable event "{not json": `)
}

// A worker whose final checkpoint failed reports the job done (its result
// stands) and then fails: the launcher says which worker and why, and does
// not call the job a success.
func TestADoneReporterThatThenFailsFailsTheJob(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	const why = "trainer: checkpoint failed: rank 0 could not write the final checkpoint of step 3: too many open files"
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "3", "-fail-after-done", why},
	})
	require.ErrorIs(t, err, ErrFinishedWithError)
	require.ErrorContains(t, err, "worker 1 (rank 0) reported the job done, then exited with status 1: "+why)
	require.NotNil(t, sum.Done)
	require.Equal(t, map[int]int{0: 0, 1: 1}, sum.Exits)
}

// A worker other than the one that reports the job done whose Run
// returned trainer.ErrCheckpoint (a preempted worker whose checkpoint
// failed, say) fails the job too: the launcher names it.
func TestALostCheckpointOfAnotherWorkerFailsTheJob(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "3", "-lose-checkpoint", "0"},
	})
	require.ErrorIs(t, err, ErrFinishedWithError)
	require.ErrorContains(t, err, "worker 0 (status 1): left without its checkpoint: trainer: checkpoint failed: disk full")
	require.NotNil(t, sum.Done)
	require.Equal(t, map[int]int{0: 1, 1: 0}, sum.Exits)
}

// When no worker reports done, the error names those that failed and why.
func TestNoDoneNamesTheWorkersThatFailed(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	const why = "trainer: checkpoint failed: rank 0 could not write the final checkpoint of step 3"
	_, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-world", "2", "-steps", "3", "-no-done", "-fail-after-done", why},
	})
	require.ErrorContains(t, err, "every worker exited and none reported the job done; worker 1 exited with status 1: "+why)
}

func TestAJobThatHadAlreadyFinishedIsItsOwnError(t *testing.T) {
	dir := t.TempDir()
	log := newLogBuf(t, dir, "", 0)
	sum, err := Run(testCtx(t), Spec{
		Workers: 2, Log: log, Quiet: true,
		Args: []string{"-dir", dir, "-finished"},
	})
	require.ErrorIs(t, err, ErrJobAlreadyFinished)
	require.True(t, sum.AlreadyFinished)
	require.Nil(t, sum.Done)
	require.Equal(t, map[int]int{0: 0, 1: 0}, sum.Exits)
	require.Contains(t, log.String(), "[launcher] worker 1: the job had already finished when it joined")
}

func TestRunStartsNoMoreWorkersThanMaxWorkers(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Workers: 2, MaxWorkers: 3, Faults: []faults.Fault{{Kind: faults.Join, Rank: 1, Step: 5}, {Kind: faults.Join, Rank: 1, Step: 9}}}, "-join: 2 workers plus 2 joining would start 4, above -max 3 (at most 1 may join)"},
		{Spec{Workers: 1, Faults: []faults.Fault{{Kind: faults.Join, Rank: 100000, Step: 1}}}, fmt.Sprintf("would start 100001, above -max %d", DefaultMaxWorkers)},
		{Spec{Workers: 4, MaxWorkers: 3}, "-workers 4 is above -max 3"},
	} {
		dir := t.TempDir()
		tc.spec.Args = []string{"-dir", dir, "-world", "1", "-steps", "1"}
		tc.spec.Log = newLogBuf(t, dir, "", 0)
		_, err := Run(testCtx(t), tc.spec)
		require.ErrorContains(t, err, tc.want)
		ready, _ := filepath.Glob(filepath.Join(dir, "ready-*"))
		require.Empty(t, ready, "no worker may start")
	}
}
