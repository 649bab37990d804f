package localsgd_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	stdsync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/localsgd"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

const (
	samples     = 480
	globalBatch = 24 // 20 steps an epoch
	epochs      = 2
	every       = 4 // H
)

// job is one elastic job of in-process workers over the shared Redis, with
// the LocalSGD/DiLoCo strategy and an exactly-once audit.
type job struct {
	t     *testing.T
	c     *trainertest.Cluster
	prob  *trainertest.Problem
	cfg   trainer.Config
	inner func() optim.Optimizer
	audit *audit.Memory
	outer localsgd.Config

	ckpt driver.CheckpointStore // nil: none

	mu       stdsync.Mutex
	models   map[*trainertest.Worker]*trainertest.Model
	trainers map[*trainertest.Worker]*trainer.Trainer[trainertest.Batch]
	rounds   []trainer.RoundInfo // every worker's OnRound
	bad      []string
}

func newJob(t *testing.T, minWorkers int, inner func() optim.Optimizer, outer localsgd.Config) *job {
	cfg := trainertest.Config(testredis.JobID(t))
	cfg.Epochs = epochs
	cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = minWorkers, 3
	st := store.NewRedis(testredis.Client(t))
	return &job{t: t, c: trainertest.NewCluster(t, trainertest.ClusterConfig{Store: st, Timeout: 2 * time.Minute}),
		prob: trainertest.NewProblem(samples, 8, 0.1, 3), cfg: cfg, inner: inner, audit: &audit.Memory{},
		outer: outer, models: map[*trainertest.Worker]*trainertest.Model{}, trainers: map[*trainertest.Worker]*trainer.Trainer[trainertest.Batch]{}}
}

// hold runs before each step of a worker with its rank in the round and
// the global step number the step would become (1-based).
type hold func(ctx context.Context, w *trainertest.Worker, rank int, step int64) error

// start starts a worker with hold (nil: none), a StepDelay of delay, and
// joined, when non-nil, closed once its Join reached the store.
func (j *job) start(h hold, delay time.Duration, joined chan struct{}) *trainertest.Worker {
	return j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
		m := trainertest.NewModel(j.prob.Dim)
		m.StepDelay = delay
		st := w.Store
		if joined != nil {
			st = &joinSignal{Store: w.Store, joined: joined}
		}
		j.mu.Lock()
		j.models[w] = m
		j.mu.Unlock()
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.Seed = globalBatch, 7
		loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		j.t.Cleanup(func() { loader.Close() })
		s, err := localsgd.New(m.Params(), j.inner(), w.Backend, j.outer)
		if err != nil {
			return nil, err
		}
		step := m.Step
		rank := -1
		if h != nil {
			perEpoch := int64(samples / globalBatch)
			step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
				if err := h(ctx, w, rank, int64(b.Epoch)*perEpoch+int64(b.Step)+1); err != nil {
					return 0, err
				}
				return m.Step(ctx, b)
			}
		}
		hooks := trainer.Hooks{OnRound: func(r trainer.RoundInfo) {
			rank = r.Rank
			j.mu.Lock()
			defer j.mu.Unlock()
			j.rounds = append(j.rounds, r)
			if r.Step%every != 0 {
				j.bad = append(j.bad, fmt.Sprintf("round %d starts from step %d, not an outer step (H = %d)", r.Round, r.Step, every))
			}
		}}
		opts := []trainer.Option{trainer.WithBackend(s.Backend()), trainer.WithAudit(j.audit), trainer.WithHooks(hooks)}
		if j.ckpt != nil {
			opts = append(opts, trainer.WithCheckpointStore(j.ckpt))
		}
		tr, err := trainer.New(m.Params(), s.Optimizer(), loader, step, st, j.cfg, opts...)
		if err == nil {
			j.mu.Lock()
			j.trainers[w] = tr
			j.mu.Unlock()
		}
		return tr, err
	})
}

// finish waits for the job and checks what every run must hold: no
// violation, an exact audit, every surviving worker finished with the same
// parameters. It returns their hash.
func (j *job) finish() string {
	j.t.Helper()
	j.c.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, b := range j.bad {
		j.t.Error(b)
	}
	all := make([]int, samples)
	for i := range all {
		all[i] = i
	}
	rep := audit.Verify(j.audit.Entries(), epochs, func(int) []int { return all })
	if rep.Missing != 0 || rep.Duplicates != 0 || rep.Steps != epochs*samples/globalBatch {
		j.t.Fatalf("audit: %+v, want every sample once in %d steps", rep, epochs*samples/globalBatch)
	}
	hash := ""
	for _, w := range j.c.Workers() {
		res, err := w.Result()
		if w.Killed() || errors.Is(err, trainer.ErrPreempted) {
			continue
		}
		if err != nil || !res.Finished {
			j.t.Fatalf("%v: Run = %+v, %v", w, res, err)
		}
		h := paramsHash(j.models[w].Params())
		if hash != "" && h != hash {
			j.t.Fatalf("%v ends with other parameters than its peers", w)
		}
		hash = h
	}
	return hash
}

// joinSignal closes joined once a Join call reached the store: the worker
// is then a pending joiner, which the running round will see.
type joinSignal struct {
	store.Store
	joined chan struct{}
	once   stdsync.Once
}

func (s *joinSignal) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	v, err := s.Store.Join(ctx, r)
	s.once.Do(func() { close(s.joined) })
	return v, err
}

func paramsHash(ps []trainer.Param) string {
	h := sha256.New()
	for _, p := range ps {
		for _, v := range p.Value {
			h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// killRun runs three workers (MinWorkers 3) and, when killAt > 0, SIGKILLs
// the one holding rank 2 (as trainertest.Cluster.Kill does) while it
// computes step killAt, and starts a replacement: the world size stays 3
// throughout, and the survivors are ranks 0 and 1 of the first round.
func killRun(t *testing.T, killAt int64, inner func() optim.Optimizer, outer localsgd.Config) (hash string, rolledBack int64) {
	j := newJob(t, 3, inner, outer)
	victims := make(chan *trainertest.Worker, 1)
	var once stdsync.Once
	h := func(ctx context.Context, w *trainertest.Worker, rank int, step int64) error {
		if rank != 2 || step != killAt {
			return nil
		}
		sent := false
		once.Do(func() { victims <- w; sent = true })
		if !sent {
			return nil // the replacement, replaying the step
		}
		<-ctx.Done() // computing until killed
		return ctx.Err()
	}
	for range 3 {
		j.start(h, 0, nil)
	}
	if killAt > 0 {
		select {
		case v := <-victims:
			j.c.Kill(v)
		case <-time.After(time.Minute):
			t.Fatalf("rank 2 never reached step %d", killAt)
		}
		j.start(nil, 0, nil)
	}
	hash = j.finish()
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, r := range j.rounds {
		rolledBack = max(rolledBack, r.RolledBack)
	}
	return hash, rolledBack
}

// A kill between two outer steps rolls every rank back to the last outer
// step, with exactly-once across it; with a stateless inner optimizer
// (SGD) and the world size kept at 3 by a replacement, the final
// parameters are the bits of an undisturbed run: the local steps of the
// interval are replayed from the same state on the same shares.
func TestKillBetweenOuterStepsGivesTheUndisturbedBits(t *testing.T) {
	outer := localsgd.Config{Every: every, Outer: localsgd.Nesterov, LR: 0.7, Momentum: 0.9}
	sgd := func() optim.Optimizer { return optim.NewSGD(0.05) }
	undisturbed, _ := killRun(t, 0, sgd, outer)
	// Step 7 is computed with steps 5 and 6 applied since the outer step
	// at 4: both are rolled back.
	killed, rolledBack := killRun(t, 7, sgd, outer)
	if rolledBack != 2 {
		t.Errorf("a kill during step 7 rolled back %d steps, want 2 (to the outer step at 4)", rolledBack)
	}
	if killed != undisturbed {
		t.Fatalf("parameters after a kill at step 7: %s, undisturbed: %s", killed, undisturbed)
	}
}

// With an inner optimizer whose state is each rank's own between outer
// steps (momentum), a new round starts every rank from one rank's commit:
// kills at two points of one interval give the same world-size history
// and the same bits.
func TestKillPointWithinAnIntervalDoesNotMatter(t *testing.T) {
	outer := localsgd.Config{Every: every, Outer: localsgd.Nesterov, LR: 0.7, Momentum: 0.9}
	mom := func() optim.Optimizer { return optim.NewMomentum(0.02, 0.9) }
	early, rb1 := killRun(t, 10, mom, outer) // after steps 9: rolls back 1
	late, rb2 := killRun(t, 12, mom, outer)  // after steps 9..11: rolls back 3
	if rb1 != 1 || rb2 != 3 {
		t.Errorf("rolled back %d and %d steps, want 1 and 3 (to the outer step at 8)", rb1, rb2)
	}
	if early != late {
		t.Fatalf("kills during steps 10 and 12 end with different parameters: %s, %s", early, late)
	}
}

// A worker joining while a round trains: the round ends at the boundary
// where every rank sees the joiner, without a commit unless that boundary
// is an outer step, and the larger round starts from the last outer step
// (the hooks check every round's start); exactly-once holds and every
// worker ends with the same parameters.
func TestJoinRoundsStartAtOuterSteps(t *testing.T) {
	outer := localsgd.Config{Every: every, Outer: localsgd.Average}
	j := newJob(t, 2, func() optim.Optimizer { return optim.NewMomentum(0.02, 0.9) }, outer)
	reached, joined := make(chan struct{}), make(chan struct{})
	var once stdsync.Once
	// Rank 0 computes step 6 only once the joiner is pending in the store;
	// the remaining steps (20 ms each) leave the round time to see it.
	h := func(ctx context.Context, _ *trainertest.Worker, rank int, step int64) error {
		if rank != 0 || step != 6 {
			return nil
		}
		once.Do(func() { close(reached) })
		select {
		case <-joined:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	j.start(h, 20*time.Millisecond, nil)
	j.start(h, 20*time.Millisecond, nil)
	select {
	case <-reached:
	case <-time.After(time.Minute):
		t.Fatal("the job never reached step 6")
	}
	j.start(nil, 20*time.Millisecond, joined)
	j.finish()
	j.mu.Lock()
	defer j.mu.Unlock()
	sizes := map[int]bool{}
	for _, r := range j.rounds {
		sizes[r.WorldSize] = true
	}
	if !sizes[3] {
		t.Fatalf("the joiner never trained: rounds %+v", j.rounds)
	}
}

// LocalSGD with one local step of plain SGD is the synchronous step: the
// mean of the ranks' updates from their shares' means (the trainer's W/N
// scaling) is the update from the global batch's mean gradient, in the
// default mode and in deterministic mode (exact local sums over the
// micro-batches). Up to float32 rounding: the ring's run sums gradients,
// LocalSGD's parameters.
func TestLocalSGDWithOneStepIsTheSynchronousStep(t *testing.T) {
	for _, det := range []bool{false, true} {
		t.Run(fmt.Sprintf("deterministic=%v", det), func(t *testing.T) {
			prob := trainertest.NewProblem(samples, 8, 0.1, 3)
			run := func(local bool) []trainer.Param {
				cfg := trainertest.Config(testredis.JobID(t))
				cfg.Epochs, cfg.Deterministic = 1, det
				cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = 2, 2
				c := trainertest.NewCluster(t, trainertest.ClusterConfig{Store: store.NewRedis(testredis.Client(t)), Timeout: 2 * time.Minute})
				var models []*trainertest.Model
				var mu stdsync.Mutex
				for range 2 {
					c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
						m := trainertest.NewModel(prob.Dim)
						mu.Lock()
						models = append(models, m)
						mu.Unlock()
						dcfg := dataloader.DefaultConfig()
						dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = globalBatch, 7, 4
						loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
						if err != nil {
							return nil, err
						}
						t.Cleanup(func() { loader.Close() })
						var opt optim.Optimizer = optim.NewSGD(0.05)
						opts := w.Options()
						if local {
							s, err := localsgd.New(m.Params(), opt, w.Backend, localsgd.Config{Every: 1, Outer: localsgd.Average})
							if err != nil {
								return nil, err
							}
							opt, opts = s.Optimizer(), []trainer.Option{trainer.WithBackend(s.Backend())}
						}
						return trainer.New(m.Params(), opt, loader, m.Step, w.Store, cfg, opts...)
					})
				}
				c.Wait()
				return models[0].Params()
			}
			ring, local := run(false), run(true)
			for k := range ring {
				for i, v := range ring[k].Value {
					if d := math.Abs(float64(local[k].Value[i] - v)); d > 1e-5*max(1, math.Abs(float64(v))) {
						t.Fatalf("%s[%d]: LocalSGD H=1 %v, synchronous %v", ring[k].Name, i, local[k].Value[i], v)
					}
				}
			}
		})
	}
}

// A worker preempted between two outer steps leaves without a commit
// there: its checkpoint holds the last outer step and is named by it, and
// the others (with a replacement) roll back to it; exactly-once holds.
func TestPreemptionBetweenOuterStepsCheckpointsTheLastOuterStep(t *testing.T) {
	j := newJob(t, 2, func() optim.Optimizer { return optim.NewMomentum(0.02, 0.9) }, localsgd.Config{Every: every, Outer: localsgd.Average})
	dir, err := checkpoint.NewLocalDir(t.TempDir(), 10)
	if err != nil {
		t.Fatal(err)
	}
	j.ckpt = dir
	preempted := make(chan *trainertest.Worker, 1)
	var once stdsync.Once
	h := func(_ context.Context, w *trainertest.Worker, rank int, step int64) error {
		if rank == 1 && step == 7 { // it leaves after step 7, three steps past the outer step at 4
			once.Do(func() {
				j.mu.Lock()
				j.trainers[w].Preempt()
				j.mu.Unlock()
				preempted <- w
			})
		}
		return nil
	}
	j.start(h, 0, nil)
	j.start(h, 0, nil)
	var w *trainertest.Worker
	select {
	case w = <-preempted:
	case <-time.After(time.Minute):
		t.Fatal("rank 1 never reached step 7")
	}
	<-w.Done()
	if _, err := w.Result(); !errors.Is(err, trainer.ErrPreempted) {
		t.Fatalf("the preempted worker's Run = %v, want ErrPreempted", err)
	}
	j.start(nil, 0, nil)
	j.finish()
	steps, err := dir.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, st := range steps {
		ck, err := trainer.LoadCheckpoint(context.Background(), dir, st)
		if err != nil {
			t.Fatal(err)
		}
		if ck.Step != st || st%every != 0 {
			t.Errorf("checkpoint named %d holds step %d (outer steps every %d)", st, ck.Step, every)
		}
		found = found || st == 4
	}
	if !found {
		t.Fatalf("no checkpoint of the outer step 4 before the preemption: %v", steps)
	}
}
