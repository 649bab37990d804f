package sync

import (
	"context"
	"fmt"
	"testing"
)

// pair drives rank 1 of a two-rank world from a persistent goroutine, so an
// operation on both ranks can be measured without allocating to start it.
type pair struct {
	w     *testWorld
	start chan func(*Ring) error
	done  chan error
	stop  chan struct{}
}

func newPair(t testing.TB, cfg Config) *pair {
	p := &pair{w: newTestWorld(t, 2, cfg), start: make(chan func(*Ring) error), done: make(chan error), stop: make(chan struct{})}
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case f := <-p.start:
				p.done <- f(p.w.rings[1])
			case <-p.stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(p.stop); <-finished })
	return p
}

// run runs f on both ranks and returns the first error.
func (p *pair) run(f func(*Ring) error) error {
	p.start <- f
	err0 := f(p.w.rings[0])
	err1 := <-p.done
	if err0 != nil {
		return err0
	}
	return err1
}

// TestNoAllocsPerOperation: once the Ring's buffers exist, collectives do
// not allocate (counted over both ranks and all their goroutines).
func TestNoAllocsPerOperation(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Log("coverage instrumentation may allocate; counting anyway")
	}
	p := newPair(t, smallConfig(t))
	ctx, cancel := context.WithCancel(context.Background()) // a cancellable context, as trainers use
	defer cancel()
	// Per-rank buffers (the ranks run concurrently).
	type bufs struct {
		small   []float32
		large   []float64
		bytes   []byte
		gather  []byte
		buckets *Buckets
	}
	var rb [2]bufs
	for i := range rb {
		tensors := [][]float32{make([]float32, 300), make([]float32, 7), make([]float32, 5000)}
		rb[i] = bufs{
			small:   make([]float32, 100),   // direct path
			large:   make([]float64, 50000), // two-rank exchange, 2 lanes, many chunks
			bytes:   make([]byte, 70000),
			gather:  make([]byte, 2*70000),
			buckets: NewBuckets(tensors, 4096),
		}
	}
	ops := map[string]func(*Ring) error{
		"allreduce small": func(r *Ring) error { return r.AllReduceFloat32(ctx, rb[r.Rank()].small, OpSum) },
		"allreduce large": func(r *Ring) error { return r.AllReduceFloat64(ctx, rb[r.Rank()].large, OpAvg) },
		"broadcast":       func(r *Ring) error { return r.Broadcast(ctx, rb[r.Rank()].bytes, 1) },
		"allgather":       func(r *Ring) error { return r.AllGather(ctx, rb[r.Rank()].bytes, rb[r.Rank()].gather) },
		"barrier":         func(r *Ring) error { return r.Barrier(ctx) },
		"buckets":         func(r *Ring) error { return rb[r.Rank()].buckets.AllReduce(ctx, r, OpSum) },
	}
	for name, f := range ops {
		if err := p.run(f); err != nil { // warm up: size the buffers
			t.Fatalf("%s: %v", name, err)
		}
		var err error
		allocs := testing.AllocsPerRun(20, func() {
			if e := p.run(f); e != nil && err == nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if allocs > 0 {
			t.Errorf("%s: %v allocations per operation (both ranks), want 0", name, allocs)
		}
	}
}

// BenchmarkAllReduce reports time and allocations per allreduce of float32
// on a two-rank world inside this process (both ranks' allocations count).
func BenchmarkAllReduce(b *testing.B) {
	for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
		b.Run(fmt.Sprintf("bytes=%d", size), func(b *testing.B) {
			cfg := testConfig(b)
			p := newPair(b, cfg)
			buf0, buf1 := make([]float32, size/4), make([]float32, size/4)
			f := func(r *Ring) error {
				buf := buf0
				if r.Rank() == 1 {
					buf = buf1
				}
				return r.AllReduceFloat32(context.Background(), buf, OpSum)
			}
			if err := p.run(f); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := p.run(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllReduceOrdered compares, on a two-rank world inside this
// process (shared memory, the default Config), AllReduceOrderedFloat32
// with one part per rank against AllReduceFloat32 of the same length:
// 101,770 float32 values, examples/mnist's MLP (784-128-10) gradients;
// AllReduceOrderedTensors of the same values as the MLP's four tensors;
// and AllReduceFloat64 of as many values, the transport of the trainer's
// fixed-point deterministic mode.
func BenchmarkAllReduceOrdered(b *testing.B) {
	const values = 101770
	for _, op := range []string{"allreduce", "ordered", "ordered-tensors", "allreduce-float64"} {
		b.Run(fmt.Sprintf("op=%s/values=%d", op, values), func(b *testing.B) {
			p := newPair(b, testConfig(b))
			var bufs, outs [2][]float32
			var parts [2][][]float32
			var bufs64 [2][]float64
			for r := range bufs {
				bufs[r], outs[r], bufs64[r] = make([]float32, values), make([]float32, values), make([]float64, values)
				for i := range bufs[r] {
					bufs[r][i] = float32(i%97) / 8
					bufs64[r][i] = float64(i % 97)
				}
				parts[r] = [][]float32{bufs[r]}
			}
			f := func(r *Ring) error {
				return r.AllReduceFloat32(context.Background(), bufs[r.Rank()], OpSum)
			}
			switch op {
			case "ordered":
				f = func(r *Ring) error {
					return r.AllReduceOrderedFloat32(context.Background(), parts[r.Rank()], outs[r.Rank()])
				}
			case "ordered-tensors":
				// The buffer as the model's tensors (examples/mnist's MLP:
				// 784x128, 128, 128x10, 10), the sum written into them.
				var tensors [2][][]float32
				for r := range tensors {
					b := bufs[r]
					tensors[r] = [][]float32{b[:100352], b[100352:100480], b[100480:101760], b[101760:]}
				}
				f = func(r *Ring) error {
					return r.AllReduceOrderedTensors(context.Background(), nil, tensors[r.Rank()])
				}
			case "allreduce-float64":
				f = func(r *Ring) error {
					return r.AllReduceFloat64(context.Background(), bufs64[r.Rank()], OpSum)
				}
			}
			if err := p.run(f); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(4 * values) // the float32 gradients' bytes, for every op
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := p.run(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
