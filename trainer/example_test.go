package trainer_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// countingBackend is a user's own Backend: it wraps another one and gives
// every round a Synchronizer with its own gradient sync (GradientReducer),
// counting the calls.
type countingBackend struct {
	trainer.Backend
	sums, direct atomic.Int64 // SumGradients calls; AllReduceFloat32 calls the trainer made itself
}

func (b *countingBackend) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	s, err := b.Backend.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	return &countingSync{Synchronizer: s, b: b}, nil
}

type countingSync struct {
	sync.Synchronizer
	b *countingBackend
}

// SumGradients sums each tensor on its own (no fusion): a strategy of the
// user's, which the trainer must call instead of its bucketed allreduce.
func (s *countingSync) SumGradients(ctx context.Context, grads [][]float32) error {
	s.b.sums.Add(1)
	for _, g := range grads {
		if err := s.Synchronizer.AllReduceFloat32(ctx, g, sync.OpSum); err != nil {
			return err
		}
	}
	return nil
}

func (s *countingSync) AllReduceFloat32(ctx context.Context, buf []float32, op sync.Op) error {
	s.b.direct.Add(1)
	return s.Synchronizer.AllReduceFloat32(ctx, buf, op)
}

var _ trainer.GradientReducer = (*countingSync)(nil)

// ExampleWithBackend plugs a gradient sync of one's own into the trainer:
// a Backend whose rounds' Synchronizers implement GradientReducer. Here it
// wraps the in-memory Backend of package trainertest (a one-worker job, no
// TCP) and counts its calls: one per step.
func ExampleWithBackend() {
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
	cfg := trainertest.Config("example-backend")
	cfg.Epochs = 2
	b := &countingBackend{Backend: trainertest.NewNetwork(trainertest.NetworkConfig{}).Backend()}
	tr, err := trainer.New(m.Params(), optim.NewSGD(0.3), loader, m.Step, store.NewMemory(), cfg, trainer.WithBackend(b))
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := tr.Run(context.Background())
	fmt.Println(res.Step, b.sums.Load(), err)
	// Output: 32 32 <nil>
}
