package trainer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envWorker) != "" {
		os.Exit(workerMain())
	}
	testredis.VerifyTestMain(m)
}

// job is an in-process elastic job of linear-regression workers, each with
// its own trainer, store client, listener and goroutines.
type job struct {
	t      *testing.T
	id     string
	store  func() store.Store
	prob   *trainertest.Problem
	audit  *MemoryAudit
	epochs int
	batch  int
	micro  int     // dataloader MicroBatch (for deterministic mode); 0: none
	lr     float64 // SGD learning rate; 0: 0.3
	mutate func(*Config)
	opts   func(i int) []Option
	delay  func(i int) time.Duration
	// afterReduce, when set, is installed on every worker before it runs.
	afterReduce func(rank int, step int64) error
	// failCall, when positive, makes every worker's StepFunc fail on its
	// failCall-th call.
	failCall int
	// hold, when set, runs in every worker's OnStep (on its loop
	// goroutine) and may block it there.
	hold    func(i int, s StepInfo)
	mu      stdsync.Mutex
	workers []*inproc
	wg      stdsync.WaitGroup
}

type inproc struct {
	idx    int
	model  *trainertest.Model
	tr     *Trainer[trainertest.Batch]
	cancel context.CancelFunc
	res    Result
	err    error
	done   chan struct{}
	steps  chan StepInfo
}

func newJob(t *testing.T, store func() store.Store) *job {
	return &job{t: t, id: testredis.JobID(t), store: store, prob: trainertest.NewProblem(480, 4, 0.05, 7),
		audit: &MemoryAudit{}, epochs: 3, batch: 16}
}

func (j *job) config() Config {
	cfg := DefaultConfig()
	cfg.JobID = j.id
	cfg.Epochs = j.epochs
	cfg.Elastic.LeaseTTL = time.Second
	cfg.Elastic.HeartbeatInterval = 100 * time.Millisecond
	cfg.Elastic.LastCall = 300 * time.Millisecond
	cfg.Sync.OpTimeout = 5 * time.Second
	cfg.Sync.Secret = []byte("a test secret of 32 bytes length")
	if j.mutate != nil {
		j.mutate(&cfg)
	}
	return cfg
}

// start launches one more worker.
func (j *job) start() *inproc {
	j.mu.Lock()
	idx := len(j.workers)
	j.mu.Unlock()
	m := trainertest.NewModel(j.prob.Dim)
	m.StepDelay = 2 * time.Millisecond
	if j.delay != nil {
		m.StepDelay = j.delay(idx)
	}
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = j.batch, 3, j.micro
	loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
	require.NoError(j.t, err)
	w := &inproc{idx: idx, model: m, done: make(chan struct{}), steps: make(chan StepInfo, 4096)}
	opts := []Option{WithAudit(j.audit), WithLogger(testLogger(j.t, idx)), WithHooks(Hooks{OnStep: func(s StepInfo) {
		select {
		case w.steps <- s:
		default:
		}
		if j.hold != nil {
			j.hold(idx, s)
		}
	}})}
	if j.opts != nil {
		opts = append(opts, j.opts(idx)...)
	}
	lr := j.lr
	if lr == 0 {
		lr = 0.3
	}
	step := m.Step
	if j.failCall > 0 {
		calls := 0
		step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			if calls++; calls == j.failCall {
				return 0, fmt.Errorf("worker %d fails its step on purpose", idx)
			}
			return m.Step(ctx, b)
		}
	}
	tr, err := New(m.Params(), NewSGD(lr), loader, step, j.store(), j.config(), opts...)
	require.NoError(j.t, err)
	w.tr = tr
	if j.afterReduce != nil {
		SetAfterReduceHook(tr, j.afterReduce)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	j.mu.Lock()
	j.workers = append(j.workers, w)
	j.mu.Unlock()
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer close(w.done)
		defer loader.Close()
		w.res, w.err = tr.Run(ctx)
	}()
	return w
}

// waitStep blocks until w has applied global step s.
func (w *inproc) waitStep(t *testing.T, s int64) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case si := <-w.steps:
			if si.Step >= s {
				return
			}
		case <-w.done:
			t.Fatalf("worker %d ended before step %d: %v", w.idx, s, w.err)
		case <-deadline:
			t.Fatalf("worker %d did not reach step %d", w.idx, s)
		}
	}
}

// testLogger logs to the test output when ELASTICTRAIN_TEST_LOG is set.
func testLogger(t *testing.T, idx int) *slog.Logger {
	if os.Getenv("ELASTICTRAIN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("worker", idx)
}

func (j *job) wait() {
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		for _, w := range j.workers {
			w.cancel()
		}
		j.t.Fatal("job did not finish within 60 s")
	}
	for _, w := range j.workers {
		w.cancel()
	}
}

// expected lists the indices each epoch must hold exactly once.
func (j *job) expected(epoch int) []int {
	n := len(j.prob.Samples)
	return dataloader.Order(3, epoch, n)[:n/j.batch*j.batch]
}

// checkAuditApplied checks that the audit holds the samples of global
// steps 1..steps exactly once, and nothing else: a run that ended early
// (diverged, every StepFunc failed) after applying steps steps.
func (j *job) checkAuditApplied(steps int64) {
	t := j.t
	t.Helper()
	n := len(j.prob.Samples)
	perEpoch := int64(n / j.batch)
	epochs := int((steps + perEpoch - 1) / perEpoch)
	rep := VerifyAudit(j.audit.Entries(), epochs, func(epoch int) []int {
		done := min(steps-int64(epoch)*perEpoch, perEpoch)
		return dataloader.Order(3, epoch, n)[:done*int64(j.batch)]
	})
	require.Zero(t, rep.Missing, "audit missing: %+v", rep)
	require.Zero(t, rep.Duplicates, "audit duplicates (the samples of a step no rank applied?): %+v", rep)
	require.Equal(t, int(steps), rep.Steps, "audit steps")
	require.Equal(t, int(steps)*j.batch, rep.Samples, "audit samples")
}

func (j *job) checkFinished(finishers []*inproc) {
	t := j.t
	for _, w := range finishers {
		t.Logf("worker %d: %+v err=%v", w.idx, w.res, w.err)
	}
	for _, w := range finishers {
		require.NoError(t, w.err, "worker %d", w.idx)
		require.True(t, w.res.Finished)
	}
	ref := finishers[0].model
	for _, w := range finishers[1:] {
		require.Equal(t, ref.W, w.model.W, "identical parameters on every rank")
		require.Equal(t, ref.B, w.model.B)
	}
	rep := VerifyAudit(j.audit.Entries(), j.epochs, j.expected)
	require.Zero(t, rep.Missing, "audit missing")
	require.Zero(t, rep.Duplicates, "audit duplicates")
	steps := int64(j.epochs * (len(j.prob.Samples) / j.batch))
	require.EqualValues(t, steps, rep.Steps)
	require.Equal(t, steps, finishers[0].res.Step)
	// Linear regression converges to the least-squares optimum.
	require.InDelta(t, j.prob.OptimumLoss(), ref.Loss(j.prob), 0.01)
}

func stores(t *testing.T) map[string]func() store.Store {
	mem := store.NewMemory()
	return map[string]func() store.Store{
		"memory": func() store.Store { return mem },
		"redis":  func() store.Store { return store.NewRedis(testredis.Client(t)) },
	}
}

func TestJobTrainsToOptimum(t *testing.T) {
	for name, st := range stores(t) {
		t.Run(name, func(t *testing.T) {
			j := newJob(t, st)
			j.mutate = func(c *Config) { c.Elastic.MinWorkers = 3 }
			ws := []*inproc{j.start(), j.start(), j.start()}
			j.wait()
			j.checkFinished(ws)
			for _, w := range ws {
				require.Equal(t, 3, w.res.WorldSize)
				require.Equal(t, 1, w.res.Rounds)
			}
		})
	}
}

func TestJoinerIsTakenInAtAStepBoundary(t *testing.T) {
	redisStore := stores(t)["redis"]
	// The first two hold at step 10 until the joiner waits in the store
	// (pending), so that the job cannot end before it comes (under a CPU
	// hog, its start took longer than the 80 steps left). Bounded well
	// below ProgressTimeout, so the hold never looks like a hang.
	waiting := make(chan struct{})
	var once stdsync.Once
	j := newJob(t, func() store.Store {
		return trainertest.NotifyPending(redisStore(), func() { once.Do(func() { close(waiting) }) })
	})
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.hold = func(i int, s StepInfo) {
		if i < 2 && s.Step >= 10 {
			select {
			case <-waiting:
			case <-time.After(10 * time.Second):
			}
		}
	}
	a, b := j.start(), j.start()
	a.waitStep(t, 10)
	c := j.start()
	j.wait()
	j.checkFinished([]*inproc{a, b, c})
	require.Equal(t, 3, a.res.WorldSize)
	require.GreaterOrEqual(t, a.res.Rounds, 2)
	require.Zero(t, a.res.Recoveries, "growth is not a failure")
}

func TestPreemptedWorkerCheckpointsAndLeaves(t *testing.T) {
	dir := t.TempDir()
	ckpt, err := NewLocalDir(dir, 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["redis"])
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(ckpt)} }
	a, b, c := j.start(), j.start(), j.start()
	b.waitStep(t, 5)
	b.tr.Preempt()
	j.wait()
	require.ErrorIs(t, b.err, ErrPreempted)
	j.checkFinished([]*inproc{a, c})
	require.Equal(t, 2, a.res.WorldSize)
	require.Zero(t, a.res.Recoveries, "a graceful leave is not a failure")
	steps, err := ckpt.List(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(steps), 2, "the preempted worker's checkpoint and the final one")
}

// A worker preempted in a job without a checkpoint store says that nothing
// durable was written (a rerun of a job that all left starts over); one with
// a store does not.
func TestPreemptedWithoutACheckpointStoreSaysNothingIsDurable(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprintf("store=%v", durable), func(t *testing.T) {
			var mu stdsync.Mutex
			var warned []string
			j := newJob(t, stores(t)["redis"])
			j.mutate = func(c *Config) { c.Elastic.MinWorkers = 1 }
			var ckpt CheckpointStore
			if durable {
				d, err := NewLocalDir(t.TempDir(), 0)
				require.NoError(t, err)
				ckpt = d
			}
			j.opts = func(idx int) []Option {
				var opts []Option
				if ckpt != nil {
					opts = append(opts, WithCheckpointStore(ckpt))
				}
				if idx == 1 {
					opts = append(opts, WithLogger(slog.New(&recordHandler{min: slog.LevelWarn, rec: func(r slog.Record) {
						mu.Lock()
						warned = append(warned, r.Message)
						mu.Unlock()
					}})))
				}
				return opts
			}
			a, b := j.start(), j.start()
			b.waitStep(t, 5)
			b.tr.Preempt()
			j.wait()
			require.ErrorIs(t, b.err, ErrPreempted)
			require.NoError(t, a.err)
			mu.Lock()
			defer mu.Unlock()
			said := slices.ContainsFunc(warned, func(m string) bool { return strings.Contains(m, "nothing durable was written") })
			require.Equal(t, !durable, said, "warnings: %q", warned)
		})
	}
}

func TestWholeJobRestartResumesFromCheckpoint(t *testing.T) {
	dir := t.TempDir()
	ckpt, err := NewLocalDir(dir, 0)
	require.NoError(t, err)
	st := stores(t)["redis"]
	j := newJob(t, st)
	j.epochs = 1
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(ckpt)} }
	a, b := j.start(), j.start()
	j.wait()
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	perEpoch := int64(len(j.prob.Samples) / j.batch)
	require.Equal(t, perEpoch, a.res.Step)

	// The same data, a new incarnation with more epochs, sharing the audit
	// and the checkpoints: it must resume at the end of epoch 1.
	j2 := newJob(t, st)
	j2.audit, j2.epochs = j.audit, 3
	j2.mutate = func(c *Config) { c.Elastic.MinWorkers = 3 }
	j2.opts = j.opts
	rounds := make(chan RoundInfo, 8)
	j2.opts = func(int) []Option {
		return []Option{WithCheckpointStore(ckpt), WithHooks(Hooks{OnRound: func(r RoundInfo) { rounds <- r }})}
	}
	ws := []*inproc{j2.start(), j2.start(), j2.start()}
	j2.wait()
	j2.checkFinished(ws)
	close(rounds)
	var all []RoundInfo
	for r := range rounds {
		all = append(all, r)
	}
	require.NotEmpty(t, all)
	firstRound := slices.MinFunc(all, func(a, b RoundInfo) int { return cmp.Compare(a.Round, b.Round) }).Round
	ranks := 0
	for _, r := range all {
		if r.Round != firstRound {
			continue
		}
		// Every rank says so, not only rank 0, which alone reads the
		// checkpoint (the others once said "init").
		ranks++
		require.Equal(t, "checkpoint", r.Source, "rank %d", r.Rank)
		require.Equal(t, perEpoch, r.Step)
		require.Equal(t, 1, r.Epoch)
	}
	require.Equal(t, 3, ranks)
}

// A whole-job restart whose first round fails before its first step (here
// rank 0 fails that step after rank 1 applied it) continues the restored
// lineage from a commit, not from the checkpoint; the steps the crashed
// incarnation trained after that checkpoint must still be dropped (the
// audit once kept them, counting their samples twice).
func TestRestoredRoundFailingBeforeItsFirstStep(t *testing.T) {
	ckpt, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	st := stores(t)["redis"]
	j := newJob(t, st)
	j.epochs = 20 // far more than it trains before the crash
	// The first incarnation crashes at step 25, five steps past its
	// checkpoint of step 20, on every machine: each rank's loop stops in
	// its step-25 hook until the checkpoint of step 20 is written and the
	// test has cancelled it, so a loaded machine cannot let it train on
	// past the second job's epochs while the asynchronous checkpoint lags.
	checkpointed := make(chan struct{})
	var ckOnce, crashOnce stdsync.Once
	crash, crashed := make(chan struct{}), make(chan struct{})
	j.mutate = func(c *Config) { c.Elastic.MinWorkers, c.CheckpointEvery = 2, 10 }
	j.opts = func(int) []Option {
		return []Option{WithCheckpointStore(ckpt), WithHooks(Hooks{
			OnCheckpoint: func(s int64, err error) {
				if s == 20 { // a failed write shows as no "checkpoint" source below
					ckOnce.Do(func() { close(checkpointed) })
				}
			},
			OnStep: func(s StepInfo) {
				if s.Step == 25 {
					<-checkpointed
					crashOnce.Do(func() { close(crash) })
					<-crashed
				}
			},
		})}
	}
	a, b := j.start(), j.start()
	select {
	case <-crash:
	case <-a.done:
		t.Fatalf("the first incarnation ended before its crash: %v", a.err)
	}
	a.cancel() // the whole job crashes past its checkpoint
	b.cancel()
	close(crashed)
	j.wait()

	j2 := newJob(t, st)
	j2.audit, j2.epochs = j.audit, 3
	j2.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	rounds := make(chan RoundInfo, 64)
	j2.opts = func(int) []Option {
		return []Option{WithCheckpointStore(ckpt), WithHooks(Hooks{OnRound: func(r RoundInfo) { rounds <- r }})}
	}
	var fired atomic.Bool
	j2.afterReduce = func(rank int, step int64) error {
		if rank == 0 && fired.CompareAndSwap(false, true) {
			return errors.New("injected failure of the restored round's first step")
		}
		return nil
	}
	ws := []*inproc{j2.start(), j2.start()}
	j2.wait()
	j2.checkFinished(ws)
	require.True(t, fired.Load())
	close(rounds)
	sources := map[string]bool{}
	for r := range rounds {
		sources[r.Source] = true
	}
	require.True(t, sources["checkpoint"] && sources["commit"], "a restore, then a round from a commit: %v", sources)
}

func TestCorruptCheckpointFallsBackToPreviousGood(t *testing.T) {
	ctx := context.Background()
	ckptDir := t.TempDir()
	ckpt, err := NewLocalDir(ckptDir, 0)
	require.NoError(t, err)
	st := stores(t)["memory"]
	j := newJob(t, st)
	j.epochs = 1
	j.mutate = func(c *Config) { c.CheckpointEvery = 5 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(ckpt)} }
	a := j.start()
	j.wait()
	require.NoError(t, a.err)
	steps, err := ckpt.List(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(steps), 2)
	// Damage the newest: flip a bit in the middle.
	p := filepath.Join(ckptDir, fmt.Sprintf("ckpt-%020d.etc", steps[0]))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)/2] ^= 0x40
	require.NoError(t, os.WriteFile(p, b, 0o644))

	j2 := newJob(t, st)
	j2.audit = j.audit
	rounds := make(chan RoundInfo, 8)
	j2.opts = func(int) []Option {
		return []Option{WithCheckpointStore(ckpt), WithHooks(Hooks{OnRound: func(r RoundInfo) { rounds <- r }})}
	}
	j2.epochs = 2
	w := j2.start()
	j2.wait()
	require.NoError(t, w.err)
	r := <-rounds
	require.Equal(t, "checkpoint", r.Source)
	require.Equal(t, steps[1], r.Step, "the previous good checkpoint")
	j2.checkFinished([]*inproc{w})
}

func TestRanksWithDifferentModelsRefuseToTrain(t *testing.T) {
	st := stores(t)["memory"]
	j := newJob(t, st)
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	a := j.start()
	// A second worker whose model has another shape.
	other := trainertest.NewProblem(240, 5, 0.05, 7)
	m := trainertest.NewModel(5)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = 16, 3
	loader, err := dataloader.New(other.Dataset(), other.Collate, dcfg)
	require.NoError(t, err)
	defer loader.Close()
	tr, err := New(m.Params(), NewSGD(0.05), loader, m.Step, st(), j.config())
	require.NoError(t, err)
	_, err = tr.Run(context.Background())
	require.ErrorIs(t, err, ErrModelMismatch)
	j.wait()
	require.ErrorIs(t, a.err, ErrModelMismatch)
}

func TestInvalidConfig(t *testing.T) {
	m := trainertest.NewModel(2)
	p := trainertest.NewProblem(100, 2, 0, 1)
	loader, err := dataloader.New(p.Dataset(), p.Collate, dataloader.DefaultConfig())
	require.NoError(t, err)
	defer loader.Close()
	good := DefaultConfig()
	good.JobID = "x"
	good.Sync.Secret = []byte("a test secret of 32 bytes length")
	st := store.NewMemory()
	for name, mut := range map[string]func(*Config){
		"no job":       func(c *Config) { c.JobID = "" },
		"zero epochs":  func(c *Config) { c.Epochs = 0 },
		"commit 0":     func(c *Config) { c.CommitEvery = 0 },
		"bad factor":   func(c *Config) { c.StragglerFactor = 1 },
		"bad elastic":  func(c *Config) { c.Elastic.MinWorkers = -1 },
		"empty listen": func(c *Config) { c.ListenAddr = "" },
	} {
		cfg := good
		mut(&cfg)
		_, err := New(m.Params(), NewSGD(0.1), loader, m.Step, st, cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, name)
	}
	bad := m.Params()
	bad[0].Grad = bad[0].Grad[:1]
	_, err = New(bad, NewSGD(0.1), loader, m.Step, st, good)
	require.ErrorIs(t, err, ErrInvalidConfig)
	dup := append(m.Params(), m.Params()[0])
	_, err = New(dup, NewSGD(0.1), loader, m.Step, st, good)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

var _ = errors.Is
var _ = fmt.Sprint
var _ = math.Abs
var _ = slices.Clone[[]int]

// Must-show 2: a step that fails on one rank after another rank applied it.
// The failing rank keeps its older commit; the next round agrees on the
// newest commit all ranks hold, so the others roll that step back, and every
// rank ends with the same state and an exact audit.
func TestStepFailingOnOneRankAfterOthersAppliedIt(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 3 }
	rounds := make(chan RoundInfo, 64)
	j.opts = func(int) []Option {
		return []Option{WithHooks(Hooks{OnRound: func(r RoundInfo) { rounds <- r }})}
	}
	var fired atomic.Bool
	j.afterReduce = func(rank int, step int64) error {
		if rank == 1 && step == 20 && fired.CompareAndSwap(false, true) {
			return errors.New("injected failure after the allreduce")
		}
		return nil
	}
	ws := []*inproc{j.start(), j.start(), j.start()}
	j.wait()
	j.checkFinished(ws)
	require.True(t, fired.Load())
	close(rounds)
	rolledBack := false
	for r := range rounds {
		if r.Round > 1 && r.Step == 19 && r.RolledBack == 1 {
			rolledBack = true
		}
	}
	require.True(t, rolledBack, "ranks that applied step 20 rolled it back to the commit every rank held")
}

// Must-show 5, first half: a slow rank is reported, by rank, within
// StragglerSteps steps.
func TestSlowRankIsReported(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 3
		c.StragglerSteps = 5
		c.StragglerFactor = 3
	}
	reports := make(chan StragglerInfo, 64)
	j.opts = func(int) []Option {
		return []Option{WithHooks(Hooks{OnStraggler: func(s StragglerInfo) { reports <- s }})}
	}
	// 50 times slower: a loaded machine's scheduling noise on the fast
	// ranks must not bring the ratio under StragglerFactor and restart the
	// count.
	j.delay = func(i int) time.Duration {
		if i == 2 {
			return 100 * time.Millisecond
		}
		return 2 * time.Millisecond
	}
	ws := []*inproc{j.start(), j.start(), j.start()}
	j.wait()
	j.checkFinished(ws)
	close(reports)
	var got []StragglerInfo
	for r := range reports {
		got = append(got, r)
	}
	require.NotEmpty(t, got, "the slow rank was reported")
	slowRank := -1
	for _, w := range ws {
		if w.idx == 2 {
			slowRank = w.res.Rank
		}
	}
	require.LessOrEqual(t, got[0].Step, int64(5+1), "reported within StragglerSteps steps")
	for _, r := range got { // with balancing, judged again while balancing tries to absorb it
		require.Equal(t, slowRank, r.Rank)
		require.Greater(t, r.Ratio, 3.0)
	}
}

// The failure budget is counted per job: past MaxRecoveries within the
// window every rank stops with a *BudgetError naming the last failures.
func TestFailureBudgetStopsTheJob(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 2
		c.MaxRecoveries = 1
	}
	j.afterReduce = func(rank int, step int64) error {
		if rank == 1 && step%10 == 0 {
			return fmt.Errorf("injected failure at step %d", step)
		}
		return nil
	}
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrFailureBudget, "worker %d", w.idx)
		var be *BudgetError
		require.ErrorAs(t, w.err, &be)
		require.Equal(t, 2, be.Recoveries)
	}
}

// With EvictStragglers, a rank that stays slow leaves (ErrEvicted) and the
// others finish without it, every sample still trained exactly once.
func TestStragglerEviction(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 2
		c.Elastic.LastCall = time.Second // the first round takes all three
		c.StragglerSteps = 5
		c.StragglerFactor = 3
		c.EvictStragglers = true
	}
	j.delay = func(i int) time.Duration {
		if i == 0 {
			return 30 * time.Millisecond
		}
		return 2 * time.Millisecond
	}
	j.start()
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	require.ErrorIs(t, j.workers[0].err, ErrEvicted)
	j.checkFinished(ws)
	require.Equal(t, 2, ws[0].res.WorldSize)
}

// When every member is fenced at once (all leases lapsed together: a store
// stall, an overloaded host), the members rejoin as new members and keep
// their commits: the job continues from where it was, not from step 0.
func TestAllMembersFencedKeepProgress(t *testing.T) {
	st := store.NewMemory()
	var offset atomic.Int64
	st.SetClock(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	j := newJob(t, func() store.Store { return st })
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 3 }
	rounds := make(chan RoundInfo, 64)
	var jumped atomic.Bool
	j.opts = func(int) []Option {
		return []Option{WithHooks(Hooks{
			OnRound: func(r RoundInfo) { rounds <- r },
			OnStep: func(s StepInfo) {
				if s.Step == 20 && jumped.CompareAndSwap(false, true) {
					offset.Add(int64(time.Minute)) // every lease lapses
				}
			},
		})}
	}
	ws := []*inproc{j.start(), j.start(), j.start()}
	j.wait()
	j.checkFinished(ws)
	close(rounds)
	var later []RoundInfo
	for r := range rounds {
		if r.Round > 1 {
			later = append(later, r)
		}
	}
	require.NotEmpty(t, later, "the members formed a new round after being fenced")
	for _, r := range later {
		require.Equal(t, "commit", r.Source, "state kept across fencing")
		require.GreaterOrEqual(t, r.Step, int64(19))
	}
}

// A worker with another job secret (a pod with a stale Secret) that joins
// a running job is refused by every peer: the members that trained (a
// majority of the round) report it, the job trains on and finishes exactly
// once without spending its failure budget, and the stranger, which nobody
// authenticated, stops with ErrStranger (also ErrFailureBudget) once it is
// evicted, after one spoilt round (it once made the job re-form rounds in
// a tight loop for ever, later for MaxRecoveries rounds).
func TestStrangerWithAnotherSecretIsShutOut(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	j.epochs = 40 // long enough to outlast the stranger's attempts
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	a, b := j.start(), j.start()
	a.waitStep(t, 10)
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 2
		c.Sync.Secret = []byte("another secret of 32 bytes, alas")
		c.MaxRecoveries = 3
	}
	s := j.start()
	j.wait()
	j.checkFinished([]*inproc{a, b})
	require.Zero(t, a.res.Recoveries, "rounds that failed to form spend no budget")
	require.ErrorIs(t, s.err, ErrFailureBudget, "stranger: %+v", s.res)
	require.ErrorIs(t, s.err, ErrStranger)
	var be *BudgetError
	require.ErrorAs(t, s.err, &be)
	require.Equal(t, 1, be.Unformed)
	require.Contains(t, s.err.Error(), "authentication failed")
	require.Zero(t, s.res.Step, "the stranger never trained")
}

// A member that joined a round and died before connecting (it never
// answers) ends the survivors' Connect as soon as the rendezvous moves on
// (its lease lapses), not after the much longer DialTimeout.
func TestMemberLostBeforeConnectingDoesNotStallTheRound(t *testing.T) {
	st := stores(t)["redis"]
	j := newJob(t, st)
	j.epochs = 1
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers, c.Elastic.MaxWorkers = 2, 3
		c.Elastic.LastCall = time.Hour // the first round forms at 3
		c.Sync.DialTimeout = 30 * time.Second
	}
	cfg := j.config()
	ecfg := cfg.Elastic
	ecfg.JobID = cfg.JobID
	ghost, err := elastic.NewAgent(st(), elastic.NewMember("127.0.0.1:1"), ecfg)
	require.NoError(t, err)
	joined := make(chan error, 1)
	go func() {
		_, err := ghost.Join(context.Background())
		joined <- err
	}()
	a, b := j.start(), j.start()
	require.NoError(t, <-joined)
	ghost.Close() // dies holding a rank: its lease (1 s) lapses
	died := time.Now()
	a.waitStep(t, 1)
	took := time.Since(died)
	t.Logf("first step %v after the ghost died (LeaseTTL %v, DialTimeout %v)", took, cfg.Elastic.LeaseTTL, cfg.Sync.DialTimeout)
	require.Less(t, took, cfg.Sync.DialTimeout/3, "Connect was abandoned when the round moved on")
	j.wait()
	j.checkFinished([]*inproc{a, b})
}

// flakyStore is a CheckpointStore whose Save fails for the steps fail says.
type flakyStore struct {
	CheckpointStore
	fail func(step int64) bool
}

func (s *flakyStore) Save(ctx context.Context, step int64, data []byte) error {
	if s.fail(step) {
		return errors.New("injected: disk full")
	}
	return s.CheckpointStore.Save(ctx, step, data)
}

// A job whose final checkpoint cannot be written finishes, but Run says so
// with ErrCheckpoint instead of returning nil (lost durability was once a
// log line only).
func TestFailedFinalCheckpointIsAnError(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	store := &flakyStore{CheckpointStore: dir, fail: func(int64) bool { return true }}
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(store)} }
	w := j.start()
	j.wait()
	require.ErrorIs(t, w.err, ErrCheckpoint)
	require.ErrorContains(t, w.err, "disk full")
	require.True(t, w.res.Finished)
}

// When the rank 0 that was writing a due checkpoint is lost before it
// lands, the next round's rank 0 writes one at once, rather than leaving
// the durable history a whole interval (or several) behind.
func TestLostRankZeroCheckpointIsWrittenByTheNext(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	var first atomic.Bool
	store := &flakyStore{CheckpointStore: dir, fail: func(step int64) bool {
		return step == 20 && first.CompareAndSwap(false, true) // the write that never landed
	}}
	j := newJob(t, stores(t)["redis"])
	j.epochs = 2
	j.delay = func(int) time.Duration { return 5 * time.Millisecond }
	j.mutate = func(c *Config) { c.Elastic.MinWorkers, c.CheckpointEvery = 2, 10 }
	var leaver atomic.Pointer[inproc]
	j.opts = func(i int) []Option {
		return []Option{WithCheckpointStore(store), WithHooks(Hooks{OnStep: func(s StepInfo) {
			if s.Rank == 0 && s.Step == 23 && leaver.Load() == nil {
				j.mu.Lock()
				w := j.workers[i]
				j.mu.Unlock()
				leaver.Store(w) // rank 0 of the first round leaves before step 30
				w.cancel()
			}
		}})}
	}
	ws := []*inproc{j.start(), j.start(), j.start()}
	j.wait()
	var finishers []*inproc
	for _, w := range ws {
		if w != leaver.Load() {
			finishers = append(finishers, w)
		}
	}
	j.checkFinished(finishers)
	require.True(t, first.Load(), "the write of step 20 failed")
	steps, err := dir.List(context.Background())
	require.NoError(t, err)
	caughtUp := false
	for _, s := range steps {
		if s > 20 && s < 30 {
			caughtUp = true
		}
	}
	require.True(t, caughtUp, "a checkpoint between the lost one and the next due one: %v", steps)
}

// In deterministic mode a diverged model (non-finite gradients, which
// fixed point cannot sum) stops every rank at the same step with
// ErrDiverged, instead of failing and re-forming the round over and over.
func TestDeterministicDivergenceStopsEveryRank(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.micro, j.lr = 4, 1e30 // SGD with this rate overflows within a few steps
	j.mutate = func(c *Config) { c.Elastic.MinWorkers, c.Deterministic = 2, true }
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrDiverged, "worker %d", w.idx)
		require.Equal(t, 1, w.res.Rounds, "no round was re-formed")
	}
	require.Equal(t, ws[0].res.Step, ws[1].res.Step, "both stopped after the same step")
	require.Positive(t, ws[0].res.Step, "a step was applied before the diverged one")
	// Every rank recorded the diverged step's samples before its control
	// exchange, and no later round drops them: the round's end does.
	j.checkAuditApplied(ws[0].res.Step)
}

// In the default mode a loss that overflows stops every rank with
// ErrDiverged after its gradient allreduce; the audit holds the steps
// applied before it only.
func TestANonFiniteLossLeavesOnlyTheAppliedStepsInTheAudit(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.lr = 1e30
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrDiverged, "worker %d", w.idx)
		require.ErrorContains(t, w.err, "the loss over the global batch")
	}
	require.Equal(t, ws[0].res.Step, ws[1].res.Step, "both stopped after the same step")
	require.Positive(t, ws[0].res.Step)
	j.checkAuditApplied(ws[0].res.Step)
}

// When every rank's StepFunc fails at the same step, every rank ends with
// ErrStepFailed and nobody forms a later round: the audit holds the steps
// applied before it only.
func TestAStepEveryRankFailedIsNotInTheAudit(t *testing.T) {
	j := newJob(t, stores(t)["memory"])
	j.failCall = 4
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	for _, w := range ws {
		require.ErrorIs(t, w.err, ErrStepFailed, "worker %d", w.idx)
		require.Equal(t, int64(3), w.res.Step, "worker %d", w.idx)
	}
	j.checkAuditApplied(3)
}

// Strangers that are restarted whenever they give up (a crash-looping pod
// with a stale secret, twice over) cannot wear the job down: the members
// that train report them, and rounds whose culprit they reported do not
// count towards their own give-up budget.
func TestRestartingStrangersDoNotStopTheJob(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	j.epochs = 40
	base := func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.mutate = base
	a, b := j.start(), j.start()
	a.waitStep(t, 10)
	j.mutate = func(c *Config) {
		base(c)
		c.Sync.Secret = []byte("another secret of 32 bytes, alas")
		c.MaxRecoveries = 2
	}
	legit := make(chan struct{})
	go func() { <-a.done; <-b.done; close(legit) }()
	var restarts atomic.Int64
	for range 2 {
		go func() {
			for {
				s := j.start()
				select {
				case <-s.done:
					restarts.Add(1)
				case <-legit:
					return
				}
			}
		}()
	}
	<-legit
	j.wait()
	j.checkFinished([]*inproc{a, b})
	t.Logf("strangers gave up %d times", restarts.Load())
}

// A worker preempted while it waits below MinWorkers, holding a commit
// that no checkpoint has (its only peer left without writing one), does
// not leave at once: leaving would lose the job's progress. It joins on
// and leaves at the next round's first step boundary with that checkpoint
// written (issue 29, item 3: only a worker with nothing to commit leaves
// at once).
func TestPreemptedWhileWaitingWithAnUncheckpointedCommitCheckpointsFirst(t *testing.T) {
	dir := t.TempDir()
	ckpt, err := NewLocalDir(dir, 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 20
	j.mutate = func(c *Config) { c.Elastic.MinWorkers = 2 }
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(ckpt)} } // CheckpointEvery 0: none until a preemption or the end
	a, b := j.start(), j.start()
	b.waitStep(t, 5)
	a.cancel() // a leaves without a checkpoint; b is left below MinWorkers
	<-a.done
	steps, err := ckpt.List(context.Background())
	require.NoError(t, err)
	require.Empty(t, steps, "no checkpoint yet")
	b.tr.Preempt()
	c := j.start() // a round of two can form again
	<-b.done
	require.ErrorIs(t, b.err, ErrPreempted)
	require.NotErrorIs(t, b.err, ErrCheckpoint)
	steps, err = ckpt.List(context.Background())
	require.NoError(t, err)
	require.NotEmpty(t, steps, "the preempted worker left without checkpointing the only commit")
	require.GreaterOrEqual(t, steps[0], int64(5))
	c.cancel()
	j.wait()
}
