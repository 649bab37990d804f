package trainer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Must-show 5: a gradient sync written by a user, plugged into trainer.New
// through WithBackend, trains the model to its optimum; the trainer calls
// it once per step and never allreduces the gradients itself.
func TestUserGradientReducerTrainsToOptimum(t *testing.T) {
	j := newMemJob(t, 480, 4, 3)
	j.cfg.Elastic.MinWorkers = 3
	backends := map[*trainertest.Worker]*countingBackend{}
	ws := make([]*trainertest.Worker, 3)
	for i := range ws {
		ws[i] = j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
			b := &countingBackend{Backend: w.Backend}
			backends[w] = b
			m := trainertest.NewModel(j.prob.Dim)
			j.models[w] = m
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed = j.batch, j.seed
			loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			return New(m.Params(), NewSGD(0.3), loader, m.Step, w.Store, j.cfg, WithBackend(b), WithAudit(j.audit))
		})
	}
	j.c.Wait()
	j.check(ws)
	for _, w := range ws {
		res, _ := w.Result()
		b := backends[w]
		require.Equal(t, res.Step, b.sums.Load(), "one SumGradients call per step")
		require.Zero(t, b.direct.Load(), "no bucket allreduce of the trainer's own")
	}
}

// New refuses what it cannot drive.
func TestNewRefusesBadSeams(t *testing.T) {
	m := trainertest.NewModel(2)
	p := trainertest.NewProblem(64, 2, 0, 1)
	loader, err := dataloader.New(p.Dataset(), p.Collate, dataloader.DefaultConfig())
	require.NoError(t, err)
	defer loader.Close()
	cfg := trainertest.Config("refuse")
	st := store.NewMemory()
	mk := func(src Source[trainertest.Batch], mut func(*Config), opts ...Option) error {
		c := cfg
		if mut != nil {
			mut(&c)
		}
		_, err := New(m.Params(), NewSGD(0.1), src, m.Step, st, c, opts...)
		return err
	}
	require.NoError(t, mk(loader, nil))
	require.ErrorIs(t, mk(nextOnly{}, nil), ErrInvalidConfig, "neither a Loader nor a StatefulLoader")
	merging := &mergingLoader{}
	require.NoError(t, mk(merging, nil))
	// Deterministic (the default) with a StateMerger: the float32 mode,
	// which Run says (TestDeterministicByDefaultFallsBackWithoutMicroBatchesAndSaysSo).
	require.NoError(t, mk(merging, func(c *Config) { c.Deterministic = true }), "Deterministic with a StateMerger")
	require.ErrorIs(t, mk(loader, nil, WithPartition(&recPart{name: "a"}), WithPartition(&recPart{name: "a"})), ErrInvalidConfig, "duplicate partition names")
	require.ErrorIs(t, mk(loader, nil, WithPartition(&recPart{name: EndpointSync})), ErrInvalidConfig, "the Backend's endpoint name")
	require.ErrorIs(t, mk(loader, nil, WithPartition(&recPart{})), ErrInvalidConfig, "an empty partition name")
	// With a Backend of its own, Config.Sync is not the trainer's business.
	require.NoError(t, mk(loader, func(c *Config) { c.Sync.Secret = nil }, WithBackend(trainertest.NewNetwork(trainertest.NetworkConfig{}).Backend())))
	require.ErrorIs(t, mk(loader, func(c *Config) { c.Sync.Secret = nil }), ErrInvalidConfig, "the default ring needs its secret")
}

type nextOnly struct{}

func (nextOnly) Next(context.Context) (dataloader.Batch[trainertest.Batch], error) {
	return dataloader.Batch[trainertest.Batch]{}, fmt.Errorf("unused")
}

type mergingLoader struct{ nextOnly }

func (*mergingLoader) Restore(context.Context, []byte, int, int) error   { return nil }
func (*mergingLoader) Stepped(context.Context, LoaderStep) (bool, error) { return false, nil }
func (*mergingLoader) State(context.Context) ([]byte, error)             { return nil, nil }
func (*mergingLoader) MergeStates(parts [][]byte) ([]byte, error)        { return nil, nil }
func (*mergingLoader) Committed(context.Context) error                   { return nil }
