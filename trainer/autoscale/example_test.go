package autoscale_test

import (
	"fmt"

	"github.com/elastictrain/elastictrain/trainer/autoscale"
)

// A job on one worker whose steps take 8 ms, 7 of them computing: the
// model predicts a second worker to halve the compute, which pays within
// the horizon, so the policy probes 2 workers once it has measured 1.
func ExamplePolicy() {
	p := autoscale.New(autoscale.Config{Enabled: true})
	for step := int64(1); step <= 100; step++ {
		d := p.Observe(autoscale.Observation{
			Step: step, Round: 1, WorldSize: 1, GlobalBatch: 64, MaxWorkers: 4,
			Interval: []float64{0.008}, Compute: []float64{0.007}, Samples: []float64{64},
		})
		if d != nil {
			fmt.Printf("step %d: %d -> %d (%s), %.0f samples/s now, %.0f predicted\n", d.Step, d.From, d.To, d.Reason, d.Throughput, d.Predicted)
		}
	}
	fmt.Println("recommended:", p.Figures().Recommended)
	// Output:
	// step 75: 1 -> 2 (probe), 8000 samples/s now, 14222 predicted
	// recommended: 2
}
