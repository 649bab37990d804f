package trainer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/autoscale"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// testPlatform is an autoscale.Platform for an in-process job: Resize
// asks the test goroutine (scaleJob.drive) to start workers until target
// run, Release counts the workers that leave by decision, Capacity is
// what the test sets. Safe for concurrent use.
type testPlatform struct {
	mu       stdsync.Mutex
	capacity int // 0: no bound
	resize   chan int
	released int
	targets  []int
}

func newTestPlatform(capacity int) *testPlatform {
	return &testPlatform{capacity: capacity, resize: make(chan int, 64)}
}

func (p *testPlatform) Capacity(ctx context.Context) (int, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.capacity, p.capacity > 0, ctx.Err()
}

func (p *testPlatform) Resize(ctx context.Context, target int) error {
	p.mu.Lock()
	p.targets = append(p.targets, target)
	p.mu.Unlock()
	select {
	case p.resize <- target:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *testPlatform) Release(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.released++
	return ctx.Err()
}

func (p *testPlatform) setCapacity(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.capacity = n
}

// scaleJob is an in-process job of linear-regression workers on a
// trainertest.Cluster whose size a testPlatform changes.
type scaleJob struct {
	t       *testing.T
	c       *trainertest.Cluster
	prob    *trainertest.Problem
	audit   *MemoryAudit
	cfg     Config
	micro   int
	delay   time.Duration
	plat    *testPlatform
	extra   []Option
	each    func() ([]Option, func(*Trainer[trainertest.Batch])) // more options and a set-up, made for each worker
	logs    *decisionLog                                         // nil: testLogger
	events  chan stepEvent
	exited  chan *scaleWorker
	workers []*scaleWorker
}

type scaleWorker struct {
	w     *trainertest.Worker
	model *trainertest.Model
	steps []StepInfo // filled by drive
}

// decisionLog is a slog.Handler that keeps the "scaling decision"
// records of every worker. Safe for concurrent use.
type decisionLog struct {
	mu      stdsync.Mutex
	records []slog.Record
}

func (l *decisionLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *decisionLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "scaling decision" {
		l.mu.Lock()
		l.records = append(l.records, r.Clone())
		l.mu.Unlock()
	}
	return nil
}
func (l *decisionLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *decisionLog) WithGroup(string) slog.Handler      { return l }

// infoSteps returns the step of every decision logged at Info.
func (l *decisionLog) infoSteps() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int64
	for _, r := range l.records {
		if r.Level != slog.LevelInfo {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "step" {
				out = append(out, a.Value.Int64())
				return false
			}
			return true
		})
	}
	return out
}

// closingRunner closes the worker's loader when its Run returns.
type closingRunner struct {
	r      trainertest.Runner
	loader *dataloader.Loader[trainertest.Sample, trainertest.Batch]
}

func (c closingRunner) Run(ctx context.Context) (Result, error) {
	defer c.loader.Close()
	return c.r.Run(ctx)
}

type stepEvent struct {
	w  *scaleWorker
	si StepInfo
}

func newScaleJob(t *testing.T, plat *testPlatform, mutate func(*Config)) *scaleJob {
	cfg := trainertest.Config(fmt.Sprintf("scale-%s-%d", t.Name(), time.Now().UnixNano()))
	cfg.Epochs = 3
	// Leases longer than trainertest's 1 s: on a host starved by other
	// work a lease that runs out is a failure, and these tests count the
	// failures a graceful leave must not cause.
	cfg.Elastic.LeaseTTL, cfg.Elastic.HeartbeatInterval = 3*time.Second, 300*time.Millisecond
	if plat != nil {
		cfg.Autoscale = autoscale.Config{Enabled: true, Platform: plat, DecisionInterval: 5, WarmupSteps: 2, MeasureSteps: 6,
			MinChangeInterval: 10, HorizonSteps: 1 << 30, Hysteresis: 1e-6, ShrinkFraction: 1e-6, ProbeBackoff: 1 << 20,
			PendingSteps: 100, ChangeCost: 0.001}
	}
	if mutate != nil {
		mutate(&cfg)
	}
	return &scaleJob{t: t, c: trainertest.NewCluster(t, trainertest.ClusterConfig{Timeout: 90 * time.Second}),
		prob: trainertest.NewProblem(960, 4, 0.05, 7), audit: &MemoryAudit{}, cfg: cfg, delay: 3 * time.Millisecond,
		plat: plat, events: make(chan stepEvent, 1<<16), exited: make(chan *scaleWorker, 64)}
}

// start starts one more worker (test goroutine only).
func (j *scaleJob) start() {
	sw := &scaleWorker{model: trainertest.NewModel(j.prob.Dim)}
	sw.model.StepDelay = j.delay
	sw.w = j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = 16, 3, j.micro
		loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		logger := testLogger(j.t, len(j.workers))
		if j.logs != nil {
			logger = slog.New(j.logs)
		}
		opts := append(w.Options(), WithAudit(j.audit), WithLogger(logger),
			WithHooks(Hooks{OnStep: func(si StepInfo) { j.events <- stepEvent{sw, si} }}))
		opts = append(opts, j.extra...)
		var setup func(*Trainer[trainertest.Batch])
		if j.each != nil {
			var more []Option
			more, setup = j.each()
			opts = append(opts, more...)
		}
		tr, err := New(sw.model.Params(), NewSGD(0.3), loader, sw.model.Step, w.Store, j.cfg, opts...)
		if err != nil {
			loader.Close()
			return nil, err
		}
		if setup != nil {
			setup(tr)
		}
		return closingRunner{tr, loader}, nil
	})
	j.workers = append(j.workers, sw)
	go func() {
		<-sw.w.Done()
		j.exited <- sw
	}()
}

// drive starts n workers, then runs the job to its end: it records every
// worker's steps, calls onStep with each (the test's script: capacity
// changes), and starts workers when the platform is asked to resize.
func (j *scaleJob) drive(n int, onStep func(si StepInfo)) {
	for range n {
		j.start()
	}
	running := n
	timeout := time.After(90 * time.Second)
	for running > 0 {
		select {
		case ev := <-j.events:
			ev.w.steps = append(ev.w.steps, ev.si)
			if onStep != nil {
				onStep(ev.si)
			}
		case target := <-j.resizes():
			for running < target {
				j.start()
				running++
			}
		case <-j.exited:
			running--
		case <-timeout:
			j.t.Fatal("the job did not finish within 90 s")
		}
	}
	for {
		select {
		case ev := <-j.events:
			ev.w.steps = append(ev.w.steps, ev.si)
		default:
			return
		}
	}
}

// resizes is the platform's channel of resize requests (nil without one:
// never ready).
func (j *scaleJob) resizes() chan int {
	if j.plat == nil {
		return nil
	}
	return j.plat.resize
}

// finishers returns the workers whose Run finished the job, and checks
// that every other one left by a scaling decision (ErrReleased) and, when
// noRecovery, that the job counted no recovery.
func (j *scaleJob) finishers(noRecovery bool) []*scaleWorker {
	var out []*scaleWorker
	for i, sw := range j.workers {
		res, err := sw.w.Result()
		switch {
		case err == nil:
			require.True(j.t, res.Finished, "worker %d", i)
			if noRecovery {
				require.Zero(j.t, res.Recoveries, "worker %d: a graceful leave counts no recovery", i)
			}
			out = append(out, sw)
		default:
			require.ErrorIs(j.t, err, ErrReleased, "worker %d", i)
			require.False(j.t, errors.Is(err, ErrPreempted), "ErrReleased must not match ErrPreempted")
		}
	}
	require.NotEmpty(j.t, out)
	return out
}

// Must show 4, second half: every rank takes the same decision. Three
// workers train; the platform's capacity drops to 2 at step 30: the
// policy removes one rank, and every rank of the round reports the same
// decision at the same step, and the same figures at every step.
func TestAutoscaleEveryRankDecidesTheSame(t *testing.T) {
	plat := newTestPlatform(3)
	j := newScaleJob(t, plat, func(c *Config) { c.Elastic.MaxWorkers = 3; c.Elastic.MinWorkers = 1 })
	j.logs = &decisionLog{}
	j.drive(3, func(si StepInfo) {
		if si.Step >= 30 {
			plat.setCapacity(2)
		}
	})
	j.finishers(true)
	type key struct {
		round uint64
		step  int64
	}
	byStep := map[key][]StepInfo{}
	for _, sw := range j.workers {
		for _, si := range sw.steps {
			k := key{si.Round, si.Step}
			byStep[k] = append(byStep[k], si)
		}
	}
	decisions := 0
	for k, sis := range byStep {
		require.Len(t, sis, sis[0].WorldSize, "round %d step %d: every rank reports it", k.round, k.step)
		for _, si := range sis[1:] {
			require.Equal(t, sis[0].Scaling, si.Scaling, "round %d step %d: rank %d vs rank %d", k.round, k.step, si.Rank, sis[0].Rank)
			require.Equal(t, sis[0].Throughput, si.Throughput, "round %d step %d", k.round, k.step)
			require.Equal(t, sis[0].Efficiency, si.Efficiency, "round %d step %d", k.round, k.step)
			require.Equal(t, sis[0].Goodput, si.Goodput, "round %d step %d", k.round, k.step)
			require.Equal(t, sis[0].RecommendedWorldSize, si.RecommendedWorldSize, "round %d step %d", k.round, k.step)
		}
		if d := sis[0].Scaling; d != nil {
			decisions++
			t.Logf("step %d: %d -> %d %s remove %v (%s)", d.Step, d.From, d.To, d.Reason, d.Remove, d.Detail)
			if d.To < d.From {
				require.NotContains(t, d.Remove, 0, "rank 0 stays when another can go")
			}
		}
	}
	require.NotZero(t, decisions, "the capacity drop made a decision")
	// Logged once, at Info, by rank 0: as many Info records as decisions
	// (a decision of a step rolled back and taken again would log twice;
	// this job has no failure).
	require.Len(t, j.logs.infoSteps(), decisions, "each decision logged once at Info: %v", j.logs.infoSteps())
	plat.mu.Lock()
	require.NotZero(t, plat.released, "the removed rank released itself")
	plat.mu.Unlock()
	rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, func(epoch int) []int {
		return dataloader.Order(3, epoch, len(j.prob.Samples))
	})
	require.Zero(t, rep.Missing, "audit missing")
	require.Zero(t, rep.Duplicates, "audit duplicates")
}

// Must show 5: in deterministic mode the parameters after a job that
// autoscale grew and shrank (through a platform that starts in-process
// workers, and the graceful leave of the ranks it removes) are the same
// bits as those of a fixed-size run with the same global batch.
//
// The decisions that must happen come from the platform's capacity, not
// from timing: the job starts on 1 worker with a capacity of 1; at step
// 30 the capacity rises to 3, and with only 1 worker measured the model
// predicts a second to pay (its compute is proportional to the share,
// its sync not known yet): a probe, which the platform enacts by starting
// a worker. Once the job runs on 2, the capacity drops to 1 (a removal, a
// graceful leave), and rises again when it is back on 1. Which further
// decisions the measurements bring does not matter.
func TestAutoscaleDeterministicSameBitsAsFixedSize(t *testing.T) {
	det := func(c *Config) {
		c.Deterministic = true
		c.Epochs = 4
		c.Elastic.MaxWorkers = 4
		if c.Autoscale.Enabled {
			c.Autoscale.MeasureSteps = 20 // the capacity drop (two decision steps, 10 steps) comes first
		}
	}

	fixed := newScaleJob(t, nil, det)
	fixed.micro = 4
	fixed.plat = newTestPlatform(0) // never asked
	fixed.drive(1, nil)
	ref := fixed.finishers(false)[0].model // its recoveries do not matter: it is the reference

	plat := newTestPlatform(1)
	j := newScaleJob(t, plat, det)
	j.micro = 4
	phase := 0
	j.drive(1, func(si StepInfo) {
		switch {
		case phase == 0 && si.Step >= 30:
			plat.setCapacity(3)
			phase++
		case phase == 1 && si.WorldSize >= 2:
			plat.setCapacity(1)
			phase++
		case phase == 2 && si.WorldSize == 1:
			plat.setCapacity(3)
			phase++
		}
	})
	fin := j.finishers(true)
	var decisions []string
	seen := map[int64]bool{}
	for _, sw := range j.workers {
		for _, si := range sw.steps {
			if d := si.Scaling; d != nil && !seen[d.Step] {
				seen[d.Step] = true
				decisions = append(decisions, fmt.Sprintf("step %d: %d->%d %s %v", d.Step, d.From, d.To, d.Reason, d.Remove))
			}
		}
	}
	t.Logf("decisions: %v; workers started: %d", decisions, len(j.workers))
	require.GreaterOrEqual(t, len(j.workers), 2, "the platform started a worker on a decision")
	require.Equal(t, 3, phase, "grown, shrunk by capacity, back on 1")
	plat.mu.Lock()
	require.NotZero(t, plat.released, "a decision removed a worker")
	plat.mu.Unlock()
	for _, sw := range fin {
		require.Equal(t, ref.W, sw.model.W, "the same bits as the fixed-size run")
		require.Equal(t, ref.B, sw.model.B)
	}
	rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, func(epoch int) []int {
		return dataloader.Order(3, epoch, len(j.prob.Samples))
	})
	require.Zero(t, rep.Missing, "audit missing")
	require.Zero(t, rep.Duplicates, "audit duplicates")
}

// A whole-job restart keeps what the policy learned: a job that restores
// a checkpoint written with autoscale on reports the throughput measured
// before the restart from its first step, when a fresh job, still in its
// warm-up, has measured nothing.
func TestAutoscaleRestartKeepsTheModel(t *testing.T) {
	dir := t.TempDir()
	run := func(epochs int, dir string) []StepInfo {
		j := newScaleJob(t, nil, func(c *Config) {
			c.Epochs = epochs
			c.Autoscale = autoscale.Config{Enabled: true, WarmupSteps: 5, MeasureSteps: 10, DecisionInterval: 5}
		})
		st, err := NewLocalDir(dir, 2)
		require.NoError(t, err)
		j.extra = []Option{WithCheckpointStore(st)}
		j.drive(1, nil)
		j.finishers(true)
		return j.workers[0].steps
	}
	first := run(1, dir)
	require.Zero(t, first[0].Throughput, "a fresh job measures nothing in its warm-up")
	last := first[len(first)-1]
	require.Positive(t, last.Throughput, "measured by the end of the first job")

	restarted := run(2, dir)
	require.Equal(t, last.Step+1, restarted[0].Step, "the restart continues from the checkpoint")
	require.Equal(t, last.Throughput, restarted[0].Throughput, "the measurement came back with the checkpoint")

	fresh := run(2, t.TempDir())
	require.Zero(t, fresh[0].Throughput, "without the checkpoint's state nothing is known")
}

// The policy's figures reach the MeterProvider as the documented gauges,
// with their units, and equal the figures of the last step's StepInfo.
func TestAutoscaleMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	j := newScaleJob(t, nil, func(c *Config) {
		c.Epochs = 1
		c.Autoscale = autoscale.Config{Enabled: true, WarmupSteps: 2, MeasureSteps: 5, DecisionInterval: 5}
	})
	j.extra = []Option{WithMeterProvider(mp)}
	j.drive(1, nil)
	j.finishers(true)
	steps := j.workers[0].steps
	last := steps[len(steps)-1]
	require.Positive(t, last.Throughput)
	require.Zero(t, last.Step%5, "the last step is a decision step: its figures are the gauges' last values")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	units := map[string]string{MetricAutoscaleGoodput: "{sample}/s", MetricAutoscaleThroughput: "{sample}/s",
		MetricAutoscaleEfficiency: "1", MetricAutoscaleRecommended: "{worker}"}
	for name, unit := range units {
		m, ok := got[name]
		require.True(t, ok, "metric %s recorded", name)
		require.Equal(t, unit, m.Unit, name)
	}
	eff := got[MetricAutoscaleEfficiency].Data.(metricdata.Gauge[float64]).DataPoints
	require.Len(t, eff, 1)
	require.InDelta(t, 1, eff[0].Value, 1e-9, "one rank: the efficiency is not estimated, 1")
	thr := got[MetricAutoscaleThroughput].Data.(metricdata.Gauge[float64]).DataPoints
	require.Equal(t, last.Throughput, thr[0].Value)
	gp := got[MetricAutoscaleGoodput].Data.(metricdata.Gauge[float64]).DataPoints
	require.Equal(t, last.Goodput, gp[0].Value)
	rec := got[MetricAutoscaleRecommended].Data.(metricdata.Gauge[int64]).DataPoints
	require.EqualValues(t, last.RecommendedWorldSize, rec[0].Value)
}

// keepPart is a Partition whose rank 2 holds state no other rank holds
// (Releasable is false there); it keeps nothing else.
type keepPart struct{ rank int }

func (p *keepPart) Name() string                                      { return "keep" }
func (p *keepPart) Listen(context.Context) (string, error)            { return "", nil }
func (p *keepPart) Commit(context.Context, int64) error               { return nil }
func (p *keepPart) Checkpoint(context.Context, int64) ([]byte, error) { return nil, nil }
func (p *keepPart) EndRound(context.Context) error                    { return nil }
func (p *keepPart) Close() error                                      { return nil }
func (p *keepPart) Releasable() bool                                  { return p.rank != 2 }
func (p *keepPart) Restore(_ context.Context, r PartitionRound) error {
	p.rank = r.World.Rank
	return nil
}

// Scale-down never removes a rank whose partition holds state no other
// rank holds (Releasable): rank 2 is the slowest (its compute time per
// sample, from the compute-time hook, is ten times the others'), so it
// would go first; its partition keeps it, and another rank goes.
func TestAutoscaleKeepsTheSoleHolder(t *testing.T) {
	plat := newTestPlatform(3)
	j := newScaleJob(t, plat, func(c *Config) {
		c.Elastic.MaxWorkers = 3
		c.Autoscale.ProbeTolerance = 1e-9 // no probe down: the capacity decides
	})
	j.each = func() ([]Option, func(*Trainer[trainertest.Batch])) {
		part := &keepPart{rank: -1}
		return []Option{WithPartition(part)}, func(tr *Trainer[trainertest.Batch]) {
			SetComputeTimeHook(tr, func(b dataloader.Batch[trainertest.Batch], _ time.Duration) time.Duration {
				per := 100 * time.Microsecond
				if part.rank == 2 { // Restore ran on this goroutine, before the step
					per *= 10
				}
				return time.Duration(len(b.Indices)) * per
			})
		}
	}
	j.drive(3, func(si StepInfo) {
		if si.Step >= 20 {
			plat.setCapacity(2)
		}
	})
	var removals int
	for _, sw := range j.workers {
		for _, si := range sw.steps {
			if d := si.Scaling; d != nil && si.Rank == 0 && len(d.Remove) > 0 {
				t.Logf("step %d: %d -> %d %s remove %v", d.Step, d.From, d.To, d.Reason, d.Remove)
				require.NotContains(t, d.Remove, 2, "rank 2 holds state no other rank holds")
				removals++
			}
		}
	}
	require.NotZero(t, removals)
}
