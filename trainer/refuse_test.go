package trainer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// member starts one more worker of j whose model has dim features (a
// problem of j's sample count, so only the model differs from j's) with
// opts after j's own.
func (j *job) member(dim int, opts ...Option) *inproc {
	t := j.t
	j.mu.Lock()
	idx := len(j.workers)
	j.mu.Unlock()
	prob := trainertest.NewProblem(len(j.prob.Samples), dim, 0.05, 7)
	m := trainertest.NewModel(dim)
	m.StepDelay = 5 * time.Millisecond
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed, dcfg.MicroBatch = j.batch, 3, j.micro
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	require.NoError(t, err)
	w := &inproc{idx: idx, model: m, done: make(chan struct{}), steps: make(chan StepInfo, 4096)}
	all := []Option{WithLogger(testLogger(t, idx)), WithHooks(Hooks{OnStep: func(s StepInfo) {
		select {
		case w.steps <- s:
		default:
		}
	}})}
	tr, err := New(m.Params(), NewSGD(0.3), loader, m.Step, j.store(), j.config(), append(all, opts...)...)
	require.NoError(t, err)
	w.tr = tr
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

// A worker that joined a running job with another learning rate once made
// every member of the round stop with ErrSettingsMismatch, the healthy
// ones included, and the message showed the settings' encodings (a
// Schedule's probe sum, 1.18...), not the values configured. Now the
// members that hold the job's trained state refuse the newcomer and train
// on to the end, and only the newcomer's Run returns the error, naming the
// setting with both values as configured. A newcomer with another model
// is refused the same way (ErrModelMismatch), and so is one with other
// gradient buckets (Config.BucketBytes), and one in the float32 mode (an
// earlier release's default) joining a deterministic job.
func TestANewcomerWithOtherSettingsIsRefusedAndTheJobTrainsOn(t *testing.T) {
	sched := func(base float64) Option { return WithSchedule(WarmupCosine{Base: base, Warmup: 4, Total: 1000}) }
	for _, c := range []struct {
		name    string
		dim     int
		opts    []Option
		cfg     func(*Config) // the newcomer's
		setting string
		values  []string
		micro   int // the loaders' micro-batches (every member's)
	}{
		{"learning rate", 4, []Option{sched(0.1)}, nil, "learning rate",
			[]string{"schedule.WarmupCosine{Base:0.2 Warmup:4 Total:1000 Min:0}", "schedule.WarmupCosine{Base:0.1 Warmup:4 Total:1000 Min:0}"}, 0},
		{"model", 5, []Option{sched(0.2)}, nil, "parameter 0 (name and shape)", []string{`"w" [4]`, `"w" [5]`}, 0},
		// Once the newcomer's collectives failed every step ("ranks
		// disagree on the operation"), and the failure budget of every
		// member ran out.
		{"gradient buckets", 4, []Option{sched(0.2)}, func(c *Config) { c.BucketBytes = 8 }, "gradient bucket bytes", []string{"4194304", "8"}, 0},
		// A worker of an earlier release, whose default was the float32
		// mode, joining a job of this one, deterministic by default: its
		// sums would give other bits, so the job refuses it.
		{"deterministic mode", 4, []Option{sched(0.2)}, func(c *Config) { c.Deterministic = false }, "deterministic mode", []string{"true", "false"}, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := newJob(t, stores(t)["redis"])
			j.epochs = 20 // 600 steps of 5 ms at least: the newcomer joins long before the end
			j.micro = c.micro
			j.mutate = func(cfg *Config) { cfg.Elastic.MinWorkers = 2 }
			ws := []*inproc{j.member(4, sched(0.2)), j.member(4, sched(0.2))}
			ws[0].waitStep(t, 5)
			if c.cfg != nil {
				j.mutate = func(cfg *Config) { cfg.Elastic.MinWorkers = 2; c.cfg(cfg) }
			}
			late := j.member(c.dim, c.opts...)
			<-late.done
			j.wait()

			require.ErrorIs(t, late.err, ErrSettingsMismatch)
			var se *SettingsError
			require.ErrorAs(t, late.err, &se)
			require.Len(t, se.Refused, 1, "%v", late.err)
			require.ErrorContains(t, late.err, "refused by the job")
			require.ErrorContains(t, late.err, c.setting)
			for _, v := range c.values {
				require.ErrorContains(t, late.err, v, "the values as configured")
			}
			require.NotContains(t, late.err.Error(), "e+", "no encoded value")
			require.Equal(t, c.setting, se.Diffs[0].Setting)
			require.Equal(t, c.values[1], se.Diffs[0].Values[len(se.Diffs[0].Values)-1], "the newcomer holds the highest rank")
			if c.dim != 4 {
				require.ErrorIs(t, late.err, ErrModelMismatch)
			}
			require.Zero(t, late.res.Step, "the newcomer trained nothing")

			steps := int64(j.epochs * len(j.prob.Samples) / j.batch)
			for _, w := range ws {
				require.NoError(t, w.err, "worker %d trains on", w.idx)
				require.True(t, w.res.Finished)
				require.Equal(t, steps, w.res.Step, "every step of the job")
				require.Equal(t, 2, w.res.WorldSize)
				require.GreaterOrEqual(t, w.res.Rounds, 3, "the round with the newcomer, and one without it after")
			}
			require.Equal(t, ws[0].model.W, ws[1].model.W)
		})
	}
}
