package localsgd_test

import (
	"context"
	"fmt"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/localsgd"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// DiLoCo with 8 local steps between outer steps, over an in-memory Backend
// (ring.NewBackend in a real job): 2 epochs of 16 steps take 4
// outer steps, each one allreduce of the model's 5 parameters (20 bytes).
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
	cfg := trainertest.Config("example-diloco")
	cfg.Epochs = 2

	scfg := localsgd.DefaultConfig() // outer LR 0.7, Nesterov momentum 0.9
	scfg.Every = 8
	base := trainertest.NewNetwork(trainertest.NetworkConfig{}).Backend()
	s, err := localsgd.New(m.Params(), optim.NewAdam(0.05), base, scfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := trainer.New(m.Params(), s.Optimizer(), loader, m.Step, store.NewMemory(), cfg, trainer.WithBackend(s.Backend()))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := tr.Run(context.Background())
	st := s.Stats()
	fmt.Println(res.Step, st.OuterSteps, st.ReducedBytes, err)
	// Output: 32 4 80 <nil>
}
