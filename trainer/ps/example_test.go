package ps_test

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/ps"
)

// One worker fits an embedding per user (y = a[user] + b): the rows of a
// live on the parameter server, pulled and pushed by the step function,
// the bias b is a dense parameter the trainer allreduces. After Run the
// tables are read back from the shard directory.
func Example() {
	dir, _ := os.MkdirTemp("", "ps-example-")
	defer os.RemoveAll(dir)
	secret := []byte("an example secret of 32 bytes...")
	cfg := ps.DefaultConfig()
	cfg.Tables = []paramserver.TableSpec{{Name: "a", Rows: 8, Dim: 1, Optimizer: paramserver.NewSparseSGD(0.3)}}
	cfg.Dir, cfg.Sync.JobID, cfg.Sync.Secret = dir, "ps-example", secret
	part, err := ps.New(cfg)
	if err != nil {
		panic(err)
	}
	type sample struct {
		user int64
		y    float32
	}
	data := make([]sample, 256)
	for i := range data {
		data[i] = sample{user: int64(i % 8), y: float32(i%8) / 8}
	}
	bias, grad := []float32{0}, []float32{0}
	step := func(ctx context.Context, b dataloader.Batch[[]sample]) (float64, error) {
		rows := paramserver.Rows{Table: 0, Values: make([]float32, len(b.Data))}
		for _, s := range b.Data {
			rows.IDs = append(rows.IDs, s.user)
		}
		if err := part.Pull(ctx, rows); err != nil {
			return 0, err
		}
		loss, g := 0.0, paramserver.Rows{Table: 0, IDs: rows.IDs, Values: make([]float32, len(b.Data))}
		grad[0] = 0
		for i, s := range b.Data {
			d := rows.Values[i] + bias[0] - s.y
			loss += 0.5 * float64(d*d)
			g.Values[i], grad[0] = d, grad[0]+d
		}
		return loss, part.Push(ctx, g)
	}
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch = 16
	loader, _ := dataloader.New(dataloader.FromSlice(data), func(_ context.Context, s []sample, _ []int) ([]sample, error) { return slices.Clone(s), nil }, dcfg)
	defer loader.Close()
	tcfg := trainer.DefaultConfig()
	tcfg.JobID, tcfg.Epochs, tcfg.Sync.Secret, tcfg.Elastic.LastCall = "ps-example", 3, secret, 0
	tr, err := trainer.New([]trainer.Param{{Name: "b", Shape: []int{1}, Value: bias, Grad: grad}}, optim.NewSGD(0.3),
		loader, step, store.NewMemory(), tcfg, trainer.WithPartition(part))
	if err != nil {
		panic(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		panic(err)
	}
	tabs, err := part.Tables(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d steps; user 5 predicts %.2f (target %.2f)\n", res.Step, tabs[0][5]+bias[0], 5.0/8)
	// Output: 48 steps; user 5 predicts 0.62 (target 0.62)
}
