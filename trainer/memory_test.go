package trainer_test

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// memJob is an elastic job of linear-regression workers on a
// trainertest.Cluster: in-memory rendezvous and collectives, no TCP.
type memJob struct {
	t       *testing.T
	c       *trainertest.Cluster
	prob    *trainertest.Problem
	audit   *MemoryAudit
	cfg     Config
	batch   int
	micro   int // the loader's MicroBatch (0: none)
	seed    uint64
	opts    func(w *trainertest.Worker) []Option
	wrap    func(w *trainertest.Worker, l *dataloader.Loader[trainertest.Sample, trainertest.Batch]) Source[trainertest.Batch]
	backend func(w *trainertest.Worker) []Option // default: w.Options(), the in-memory Backend
	models  map[*trainertest.Worker]*trainertest.Model
	opt     func() Optimizer
	// step and data, when set, wrap the model's step and the dataset.
	step func(w *trainertest.Worker, f StepFunc[trainertest.Batch]) StepFunc[trainertest.Batch]
	// microStep, when set, gives every worker a MicroStepFunc of its model.
	microStep func(m *trainertest.Model) MicroStepFunc[trainertest.Batch]
	data      func(w *trainertest.Worker, d dataloader.Dataset[trainertest.Sample]) dataloader.Dataset[trainertest.Sample]
	// afterReduce, when set, is installed on every worker (SetAfterReduceHook).
	afterReduce func(rank int, step int64) error
	maxStep     atomic.Int64
	steps       chan StepInfo
}

func newMemJob(t *testing.T, samples, dim, epochs int) *memJob {
	cfg := trainertest.Config(t.Name())
	cfg.Epochs = epochs
	return &memJob{t: t, c: trainertest.NewCluster(t, trainertest.ClusterConfig{}), prob: trainertest.NewProblem(samples, dim, 0.05, 11),
		audit: &MemoryAudit{}, cfg: cfg, batch: 16, seed: 11, models: map[*trainertest.Worker]*trainertest.Model{},
		opt: func() Optimizer { return NewMomentum(0.02, 0.9) }, steps: make(chan StepInfo, 1<<16)}
}

func (j *memJob) start() *trainertest.Worker {
	var m *trainertest.Model
	w := j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
		m = trainertest.NewModel(j.prob.Dim)
		m.StepDelay = time.Millisecond
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = j.batch, j.seed, j.micro
		ds := j.prob.Dataset()
		if j.data != nil {
			ds = j.data(w, ds)
		}
		loader, err := dataloader.New(ds, j.prob.Collate, dcfg)
		if err != nil {
			return nil, err
		}
		j.t.Cleanup(func() { loader.Close() })
		opts := w.Options()
		if j.backend != nil {
			opts = j.backend(w)
		}
		opts = append(opts, WithAudit(j.audit), WithHooks(Hooks{OnStep: func(s StepInfo) {
			for {
				cur := j.maxStep.Load()
				if s.Step <= cur || j.maxStep.CompareAndSwap(cur, s.Step) {
					break
				}
			}
			select {
			case j.steps <- s:
			default:
			}
		}}))
		if j.opts != nil {
			opts = append(opts, j.opts(w)...)
		}
		if j.microStep != nil {
			opts = append(opts, WithMicroStep(j.microStep(m)))
		}
		var src Source[trainertest.Batch] = loader
		if j.wrap != nil {
			src = j.wrap(w, loader)
		}
		var step StepFunc[trainertest.Batch] = m.Step
		if j.step != nil {
			step = j.step(w, step)
		}
		tr, err := New(m.Params(), j.opt(), src, step, w.Store, j.cfg, opts...)
		if err == nil && j.afterReduce != nil {
			SetAfterReduceHook(tr, j.afterReduce)
		}
		return tr, err
	})
	j.models[w] = m
	return w
}

// waitStep blocks until some worker applied global step s; it returns the
// rank of every worker in the newest round it reported a step of.
func (j *memJob) waitStep(s int64) {
	j.t.Helper()
	deadline := time.After(30 * time.Second)
	for j.maxStep.Load() < s {
		select {
		case <-j.steps:
		case <-deadline:
			j.t.Fatalf("no worker reached step %d", s)
		}
	}
}

func (j *memJob) expected(epoch int) []int {
	n := len(j.prob.Samples)
	return dataloader.Order(j.seed, epoch, n)[:n/j.batch*j.batch]
}

// check asserts what every finished job must show: each finisher ended
// without error at the last step with the same parameters as the others,
// every sample of every epoch is in the audit exactly once, and the model
// reached the least-squares optimum.
func (j *memJob) check(finishers []*trainertest.Worker) {
	t := j.t
	var ref *trainertest.Model
	steps := int64(j.cfg.Epochs * (len(j.prob.Samples) / j.batch))
	for _, w := range finishers {
		res, err := w.Result()
		require.NoError(t, err, "%v", w)
		require.True(t, res.Finished, "%v", w)
		require.Equal(t, steps, res.Step, "%v", w)
		m := j.models[w]
		if ref == nil {
			ref = m
			continue
		}
		require.Equal(t, ref.W, m.W, "identical parameters on every rank")
		require.Equal(t, ref.B, m.B)
	}
	rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, j.expected)
	require.Zero(t, rep.Missing, "audit missing")
	require.Zero(t, rep.Duplicates, "audit duplicates")
	require.EqualValues(t, steps, rep.Steps)
	require.InDelta(t, j.prob.OptimumLoss(), ref.Loss(j.prob), 0.01)
}

// The kill-and-join test of the process workers (TestProcessesSurviveKillAndJoin)
// on the in-memory doubles: four workers, one killed at a random step (its
// peers' collectives fail naming its rank, it neither leaves nor renews its
// lease), a new worker joins later; every sample is trained exactly once,
// every finisher holds the same parameters, and the loss reaches the optimum.
func TestInMemoryKillAndJoin(t *testing.T) {
	j := newMemJob(t, 1600, 8, 3)
	j.cfg.Elastic.MinWorkers = 3
	ws := []*trainertest.Worker{j.start(), j.start(), j.start(), j.start()}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	killAt := int64(20 + rng.IntN(60))
	j.waitStep(killAt)
	victim := ws[rng.IntN(len(ws))]
	t.Logf("killing %v at step >= %d", victim, killAt)
	j.c.Kill(victim)
	j.waitStep(killAt + 60)
	joiner := j.start()
	j.c.Wait()

	var finishers []*trainertest.Worker
	for _, w := range append(ws, joiner) {
		if w != victim {
			finishers = append(finishers, w)
		}
	}
	require.Len(t, finishers, 4, "3 survivors and the newcomer finish")
	j.check(finishers)
	res, _ := finishers[0].Result()
	require.GreaterOrEqual(t, res.Recoveries, 1, "the kill was a failure recovery")
	require.GreaterOrEqual(t, joiner.Backend.Connects(), 1)
}
