package optim_test

import (
	"context"
	"fmt"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Example gives Adam to a trainer: a one-worker job on a linear
// regression problem of package trainertest, over its in-memory Backend
// (no TCP). The optimizer's moments are part of every commit.
func Example() {
	prob := trainertest.NewProblem(256, 4, 0.05, 1)
	m := trainertest.NewModel(prob.Dim)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch = 16
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer loader.Close()
	cfg := trainertest.Config("example-optim")
	cfg.Epochs = 20
	opt := optim.NewAdam(0.05)
	tr, err := trainer.New(m.Params(), opt, loader, m.Step, store.NewMemory(), cfg,
		trainer.WithBackend(trainertest.NewNetwork(trainertest.NetworkConfig{}).Backend()))
	if err != nil {
		fmt.Println(err)
		return
	}
	before := m.Loss(prob)
	res, err := tr.Run(context.Background())
	fmt.Println(res.Step, opt.Steps(), m.Loss(prob) < before/10, err)
	// Output: 320 320 true <nil>
}
