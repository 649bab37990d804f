package trainer_test

import (
	"context"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"

	"github.com/elastictrain/elastictrain/dataloader"
)

// BenchmarkStepOverhead measures the trainer's own cost per step at world
// size 1 with a no-op model (one parameter of 16 values, a StepFunc that
// does nothing): loader hand-off, control and gradient collectives, the
// optimizer, the commit and the hooks. Set-up and rendezvous are excluded:
// the time runs from the first applied step to the last. Goal: under 20 µs.
func BenchmarkStepOverhead(b *testing.B) {
	for _, prefetch := range []int{0, 2} {
		b.Run(map[int]string{0: "prefetch0", 2: "prefetch2"}[prefetch], func(b *testing.B) {
			steps := max(b.N, 2)
			data := make([]int, steps)
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Shuffle, dcfg.Prefetch = 1, false, prefetch
			loader, err := dataloader.New(dataloader.FromSlice(data),
				func(_ context.Context, s []int, _ []int) (int, error) { return len(s), nil }, dcfg)
			if err != nil {
				b.Fatal(err)
			}
			defer loader.Close()
			value, grad := make([]float32, 16), make([]float32, 16)
			params := []Param{{Name: "w", Shape: []int{16}, Value: value, Grad: grad}}
			step := func(context.Context, dataloader.Batch[int]) (float64, error) { return 0, nil }
			cfg := DefaultConfig()
			cfg.JobID = "bench-overhead"
			cfg.Sync.Secret = []byte("a benchmark secret of 32 bytes..")
			cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = 1, 1
			cfg.StepSpanEvery = 0
			var first, last time.Time
			n := 0
			tr, err := New(params, NewSGD(0.1), loader, step, store.NewMemory(), cfg,
				WithHooks(Hooks{OnStep: func(StepInfo) {
					n++
					if n == 1 {
						first = time.Now()
					}
					last = time.Now()
				}}))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			if _, err := tr.Run(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if n != steps {
				b.Fatalf("%d steps applied, want %d", n, steps)
			}
			b.ReportMetric(float64(last.Sub(first).Nanoseconds())/float64(n-1)/1e3, "us/step")
		})
	}
}
