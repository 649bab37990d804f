package trainer_test

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// balJob is an in-memory job whose workers compute at speeds of their own:
// worker i's step function waits perUnit(i) for every unit of work of its
// share (a sample, or the sample's cost with a cost function), as a
// slower host would; then the linear-regression step.
type balJob struct {
	t       *testing.T
	c       *trainertest.Cluster
	prob    *trainertest.Problem
	audit   *MemoryAudit
	cfg     Config
	dcfg    dataloader.Config
	perUnit func(i int) time.Duration
	work1   func(index int) float64 // a sample's units of work (nil: 1 each)
	cost    func(index int) float64 // dataloader.Config.Cost
	onStrag func(StragglerInfo)     // Hooks.OnStraggler of every worker
	// modelled: the step function does not wait; the trainer takes its
	// compute time as exactly units x perUnit (SetComputeTimeHook), so
	// the balancer's and the straggler tracker's decisions follow the
	// speeds the test sets, whatever else the machine runs.
	modelled bool
	// paced: with modelled, the step function still waits its modelled
	// time, so the job runs at the modelled pace (a kill or a join the
	// test makes at a step lands mid-job) while the trainer sees exactly
	// the modelled compute times.
	paced bool
	// logger, when set, is worker i's logger (WithLogger).
	logger func(i int) *slog.Logger

	mu     stdsync.Mutex
	steps  []StepInfo         // rank 0's
	ranks  map[uint64][]int   // round -> rank of each worker index in it
	work   map[int][]workTime // worker index -> its steps' compute
	models map[*trainertest.Worker]*trainertest.Model
	reach  chan int64
}

type workTime struct {
	step    int64
	seconds float64
}

func newBalJob(t *testing.T, samples, epochs, batch int) *balJob {
	cfg := trainertest.Config(t.Name())
	cfg.Epochs = epochs
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = batch, 5
	return &balJob{t: t, c: trainertest.NewCluster(t, trainertest.ClusterConfig{}), prob: trainertest.NewProblem(samples, 4, 0.05, 5),
		audit: &MemoryAudit{}, cfg: cfg, dcfg: dcfg, ranks: map[uint64][]int{}, work: map[int][]workTime{},
		models: map[*trainertest.Worker]*trainertest.Model{}, reach: make(chan int64, 1<<16)}
}

func (j *balJob) start() *trainertest.Worker {
	var m *trainertest.Model
	w := j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
		m = trainertest.NewModel(j.prob.Dim)
		dcfg := j.dcfg
		dcfg.Cost = j.cost
		loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		j.t.Cleanup(func() { loader.Close() })
		idx := w.Index
		var cur int64
		busy := func(b dataloader.Batch[trainertest.Batch]) time.Duration {
			units := float64(len(b.Indices))
			if j.work1 != nil {
				units = 0
				for _, i := range b.Indices {
					units += j.work1(i)
				}
			}
			return time.Duration(units * float64(j.perUnit(idx)))
		}
		step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			start := time.Now()
			if !j.modelled || j.paced {
				tm := time.NewTimer(busy(b))
				select {
				case <-tm.C:
				case <-ctx.Done():
					tm.Stop()
					return 0, ctx.Err()
				}
			}
			loss, err := m.Step(ctx, b)
			j.mu.Lock()
			j.work[idx] = append(j.work[idx], workTime{cur + 1, time.Since(start).Seconds()})
			j.mu.Unlock()
			return loss, err
		}
		opts := append(w.Options(), WithAudit(j.audit), WithHooks(Hooks{
			OnRound: func(r RoundInfo) {
				j.mu.Lock()
				rs := j.ranks[r.Round]
				for len(rs) <= idx {
					rs = append(rs, -1)
				}
				rs[idx] = r.Rank
				j.ranks[r.Round] = rs
				j.mu.Unlock()
				cur = r.Step
			},
			OnStraggler: func(s StragglerInfo) {
				if j.onStrag != nil {
					j.onStrag(s)
				}
			},
			OnStep: func(s StepInfo) {
				cur = s.Step
				if s.Rank != 0 {
					return
				}
				j.mu.Lock()
				j.steps = append(j.steps, s)
				j.mu.Unlock()
				select {
				case j.reach <- s.Step:
				default:
				}
			},
		}))
		if j.logger != nil {
			opts = append(opts, WithLogger(j.logger(idx)))
		}
		tr, err := New(m.Params(), NewMomentum(0.02, 0.9), loader, step, w.Store, j.cfg, opts...)
		if err == nil && j.modelled {
			SetComputeTimeHook(tr, func(b dataloader.Batch[trainertest.Batch], _ time.Duration) time.Duration { return busy(b) })
		}
		return tr, err
	})
	j.models[w] = m
	return w
}

func (j *balJob) waitStep(s int64) {
	j.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case got := <-j.reach:
			if got >= s {
				return
			}
		case <-deadline:
			j.t.Fatalf("no worker reached step %d", s)
		}
	}
}

// checkAudit: every sample of every epoch trained exactly once.
func (j *balJob) checkAudit() {
	n := len(j.prob.Samples)
	rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, func(epoch int) []int {
		o := dataloader.Order(j.dcfg.Seed, epoch, n)
		if !j.dcfg.Shuffle {
			o = o[:0]
			for i := range n {
				o = append(o, i)
			}
		}
		return o[:n/j.dcfg.GlobalBatch*j.dcfg.GlobalBatch]
	})
	require.Zero(j.t, rep.Missing, "audit missing")
	require.Zero(j.t, rep.Duplicates, "audit duplicates")
}

// rounds returns rank 0's steps grouped by round, in order.
func (j *balJob) rounds() [][]StepInfo {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out [][]StepInfo
	for _, s := range j.steps {
		if len(out) == 0 || out[len(out)-1][0].Round != s.Round {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], s)
	}
	return out
}

// TestBalancingFollowsAKillAndAJoin (issue 18, Must show 4): three
// workers, one of them at half speed; a fast one is killed, a new one
// joins. In every round the shares re-balance within 20 steps of its
// start (the slow worker's share near half the others'), the ranks agree
// on every split, and every sample is trained exactly once.
//
// The speeds are modelled and paced (balJob.modelled, paced): on a loaded
// machine (CI under a CPU hog) a timer's lateness failed the balancer's
// trial move of round 2, which then went back to equal shares for its
// hold-off, as it should for what it measured; this test is about
// following the membership, not about measuring speeds.
func TestBalancingFollowsAKillAndAJoin(t *testing.T) {
	j := newBalJob(t, 3000, 2, 40)
	j.modelled, j.paced = true, true
	j.cfg.Elastic.MinWorkers = 2
	j.cfg.Elastic.LastCall = time.Second // the first round takes all three
	const slow = 2
	j.perUnit = func(i int) time.Duration {
		if i == slow {
			return 600 * time.Microsecond
		}
		return 300 * time.Microsecond
	}
	ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
	j.waitStep(30)
	j.c.Kill(ws[0])
	j.waitStep(75)
	joiner := j.start()
	j.c.Wait()
	for _, w := range append(ws[1:], joiner) {
		res, err := w.Result()
		require.NoError(t, err, "%v", w)
		require.True(t, res.Finished)
	}
	j.checkAudit()

	rounds := j.rounds()
	require.GreaterOrEqual(t, len(rounds), 3, "the first round, after the kill, after the join")
	checked := 0
	for _, r := range rounds {
		if len(r) < 21 {
			continue // a round too short to judge (the job ended, or a member came)
		}
		j.mu.Lock()
		ranks := j.ranks[r[0].Round]
		j.mu.Unlock()
		require.Greater(t, len(ranks), slow, "round %d: the slow worker's rank", r[0].Round)
		sr := ranks[slow]
		W := r[0].WorldSize
		target := 0.5 / (float64(W-1) + 0.5) // its speed over the sum of speeds
		s := r[20]
		frac := float64(s.Shares[sr]) / float64(s.Samples)
		t.Logf("round %d: world %d, slow rank %d, shares %v at step %d (its target fraction %.2f), speeds %.0f",
			s.Round, W, sr, s.Shares, s.Step, target, s.Speeds)
		require.InDelta(t, target, frac, 0.35*target, "round %d: the slow rank's share 20 steps in", s.Round)
		require.Less(t, frac, 1/float64(W), "below an equal share")
		checked++
	}
	require.GreaterOrEqual(t, checked, 2, "rounds long enough to judge")
}

// TestCostAwareShares (issue 18, Must show 5): samples cost 1 or 3 units
// of compute by their index, laid out so that equal counts give one rank
// twice the other's compute; with Config.Cost the cut gives equal cost,
// and the ranks' compute times per step are within 15 % of each other.
func TestCostAwareShares(t *testing.T) {
	cost := func(i int) float64 {
		if i%24 < 12 {
			return 1
		}
		return 2
	}
	run := func(withCost bool) float64 {
		j := newBalJob(t, 24*40, 1, 24)
		j.cfg.Elastic.MinWorkers = 2
		j.cfg.Balance = false // the cost cut alone, not the speed measurement
		j.dcfg.Shuffle = false
		j.perUnit = func(int) time.Duration { return time.Millisecond }
		j.work1 = cost
		if withCost {
			j.cost = cost
		}
		ws := []*trainertest.Worker{j.start(), j.start()}
		j.c.Wait()
		for _, w := range ws {
			_, err := w.Result()
			require.NoError(t, err)
		}
		j.checkAudit()
		// Median compute time per step of each worker, over the steps
		// both trained.
		j.mu.Lock()
		defer j.mu.Unlock()
		var med []float64
		for _, idx := range []int{0, 1} {
			var xs []float64
			for _, wt := range j.work[idx] {
				xs = append(xs, wt.seconds)
			}
			require.NotEmpty(t, xs)
			slices.Sort(xs)
			med = append(med, xs[len(xs)/2])
		}
		ratio := math.Max(med[0], med[1]) / math.Min(med[0], med[1])
		t.Logf("cost function %v: median compute per step %.1f ms and %.1f ms, ratio %.2f", withCost, med[0]*1e3, med[1]*1e3, ratio)
		return ratio
	}
	require.Greater(t, run(false), 1.6, "equal counts leave the ranks about 2x apart")
	require.Less(t, run(true), 1.15, "equal cost: within 15 %")
}

// TestAbsorbedStragglerIsReportedNotEvicted: a worker three times slower
// per sample is reported as a straggler (its time per sample stays above
// StragglerFactor times the median), but balancing shrank its share until
// its steps take no longer than the others': the report says Absorbed,
// and even with EvictStragglers it stays and the job finishes with it.
// The speeds are modelled (balJob.modelled): on a loaded machine a timer's
// lateness can fail the balancer's trial move, and the verdict then (not
// absorbed, evicted) is right for what it measured; this test is about the
// verdict on a straggler that balancing did absorb.
func TestAbsorbedStragglerIsReportedNotEvicted(t *testing.T) {
	j := newBalJob(t, 2400, 1, 40)
	j.modelled = true
	j.cfg.Elastic.MinWorkers = 2 // an eviction fails the test rather than stalling it
	j.cfg.Elastic.LastCall = time.Second
	j.cfg.StragglerFactor, j.cfg.StragglerSteps, j.cfg.EvictStragglers = 2, 5, true
	j.perUnit = func(i int) time.Duration {
		if i == 2 {
			return 900 * time.Microsecond
		}
		return 300 * time.Microsecond
	}
	var mu stdsync.Mutex
	var reports []StragglerInfo
	j.onStrag = func(s StragglerInfo) {
		mu.Lock()
		reports = append(reports, s)
		mu.Unlock()
	}
	ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
	j.c.Wait()
	for _, w := range ws {
		res, err := w.Result()
		require.NoError(t, err, "%v: nobody is evicted", w)
		require.True(t, res.Finished)
	}
	j.checkAudit()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, reports, "the slow worker is reported")
	j.mu.Lock()
	slowRank := j.ranks[reports[0].Round][2]
	j.mu.Unlock()
	absorbed := 0
	for _, r := range reports {
		require.Equal(t, slowRank, r.Rank)
		require.True(t, r.Balanced)
		require.False(t, r.Evict, "an absorbed straggler is not evicted")
		if r.Absorbed {
			absorbed++
		}
	}
	require.NotZero(t, absorbed, "balancing absorbed it: %+v", reports)
}

// shareLines records the balancer's lines ("balanced shares", "trying
// shares") of the loggers it makes: their level and fractions.
type shareLines struct {
	mu    stdsync.Mutex
	lines []shareLine
}

type shareLine struct {
	level     slog.Level
	msg       string
	fractions []float64
}

func (h *shareLines) Enabled(context.Context, slog.Level) bool { return true }
func (h *shareLines) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *shareLines) WithGroup(string) slog.Handler            { return h }
func (h *shareLines) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasSuffix(r.Message, " shares") {
		return nil
	}
	l := shareLine{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "fractions" {
			l.fractions, _ = a.Value.Any().([]float64)
		}
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, l)
	h.mu.Unlock()
	return nil
}

// On a noisy machine the balancer tries a move every few steps and takes
// most back (their trials do not pay): those are DEBUG. Only a split that
// paid its trial and moved some rank's share by more than five percentage
// points of the global batch since the last INFO line is logged at INFO
// (rank 0): mnist logged "balanced shares" at INFO 50 times in a 2 s run.
// The speeds are modelled: worker 1's time per sample jumps at random
// (seeded) between 0.5 and 1.7 times worker 0's at every step.
func TestBalancedSharesAreLoggedAtInfoOnlyWhenTheyMove(t *testing.T) {
	j := newBalJob(t, 40000, 1, 40)
	j.cfg.Elastic.MinWorkers = 2
	j.modelled = true
	var mu stdsync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	j.perUnit = func(i int) time.Duration {
		if i == 0 {
			return time.Millisecond
		}
		mu.Lock()
		defer mu.Unlock()
		return time.Duration(500+rng.IntN(1200)) * time.Microsecond
	}
	h := &shareLines{}
	j.logger = func(int) *slog.Logger { return slog.New(h) }
	ws := []*trainertest.Worker{j.start(), j.start()}
	j.c.Wait()
	for _, w := range ws {
		_, err := w.Result()
		require.NoError(t, err)
	}
	j.checkAudit()
	h.mu.Lock()
	defer h.mu.Unlock()
	var info [][]float64
	debug := 0
	for _, l := range h.lines {
		switch l.level {
		case slog.LevelInfo:
			info = append(info, l.fractions)
		case slog.LevelDebug:
			debug++
		}
	}
	t.Logf("%d lines at DEBUG, %d at INFO: %v", debug, len(info), info)
	require.GreaterOrEqual(t, debug, 8, "the noise makes the balancer try moves")
	require.LessOrEqual(t, 4*len(info), debug, "most splits are tried and taken back: DEBUG")
	for k := 1; k < len(info); k++ {
		moved := len(info[k]) != len(info[k-1])
		for i := range info[k] {
			if !moved && math.Abs(info[k][i]-info[k-1][i]) > 0.05-0.001 { // fractions are rounded to 0.001
				moved = true
			}
		}
		require.True(t, moved, "INFO line %d (%v) moved no share by 5 points from the last (%v)", k, info[k], info[k-1])
	}
}
