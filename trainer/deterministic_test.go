package trainer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Deterministic without the loader's micro-batches is refused by New, with
// the setting to change, not at the first step as a failed step function.
func TestNewRefusesDeterministicWithoutMicroBatches(t *testing.T) {
	m := trainertest.NewModel(2)
	p := trainertest.NewProblem(64, 2, 0, 1)
	mk := func(micro int) error {
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.MicroBatch = 8, micro
		loader, err := dataloader.New(p.Dataset(), p.Collate, dcfg)
		require.NoError(t, err)
		defer loader.Close()
		cfg := trainertest.Config("det-micro")
		cfg.Deterministic = true
		_, err = New(m.Params(), NewSGD(0.1), loader, m.Step, store.NewMemory(), cfg)
		return err
	}
	err := mk(0)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "Deterministic needs the loader's micro-batches: set dataloader.Config.MicroBatch")
	require.NotContains(t, err.Error(), "step function")
	require.NoError(t, mk(2))
}
