package dataloader

import (
	"context"
	"flag"
	"fmt"
	"syscall"
	"testing"
	"time"
)

var (
	benchSamples = flag.Int("dl.samples", 8192, "dataloader benchmarks: samples in the in-memory dataset")
	benchDim     = flag.Int("dl.dim", 784, "dataloader benchmarks: float32 values per sample")
	benchBatch   = flag.Int("dl.batch", 64, "dataloader benchmarks: global batch size")
	benchChunk   = flag.Int("dl.chunk", 256, "BenchmarkLoaderOverhead: batches per interleaved chunk")
)

// benchData is the in-memory dataset: samples of dim float32.
func benchData() Dataset[[]float32] {
	s := make([][]float32, *benchSamples)
	for i := range s {
		v := make([]float32, *benchDim)
		for j := range v {
			v[j] = float32(i + j)
		}
		s[i] = v
	}
	return FromSlice(s)
}

// collateFloats copies the samples into one new []float32 of
// len(samples)*dim: the same collate for the plain loop and the loader.
func collateFloats(_ context.Context, samples [][]float32, _ []int) ([]float32, error) {
	dim := *benchDim
	out := make([]float32, len(samples)*dim)
	for i, s := range samples {
		copy(out[i*dim:(i+1)*dim], s)
	}
	return out, nil
}

// plainLoop is the baseline: what a hand-written training loop does without
// the Loader (shuffle per epoch, slice the order, Get, collate) on one rank.
type plainLoop struct {
	ds      Dataset[[]float32]
	seed    uint64
	batch   int
	epoch   int
	pos     int
	order   []int
	samples [][]float32
	sink    float32
}

func newPlainLoop(ds Dataset[[]float32], seed uint64, batch int) *plainLoop {
	return &plainLoop{ds: ds, seed: seed, batch: batch, order: Order(seed, 0, ds.Len())}
}

func (p *plainLoop) next(ctx context.Context) error {
	out, err := p.nextBatch(ctx)
	if err != nil {
		return err
	}
	p.sink += out[0]
	return nil
}

// nextBatch returns the next collated batch.
func (p *plainLoop) nextBatch(ctx context.Context) ([]float32, error) {
	n := p.ds.Len()
	if p.pos+p.batch > n {
		p.epoch++
		p.pos = 0
		p.order = Order(p.seed, p.epoch, n)
	}
	idx := p.order[p.pos : p.pos+p.batch]
	p.pos += p.batch
	p.samples = p.samples[:0]
	for _, i := range idx {
		s, err := p.ds.Get(ctx, i)
		if err != nil {
			return nil, err
		}
		p.samples = append(p.samples, s)
	}
	return collateFloats(ctx, p.samples, idx)
}

func benchConfig(prefetch, workers int) Config {
	return Config{GlobalBatch: *benchBatch, Seed: 1, Shuffle: true, DropLast: true, Prefetch: prefetch, Workers: workers}
}

func reportPerSample(b *testing.B, batches int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(batches**benchBatch), "ns/sample")
}

// BenchmarkPlainLoop is the baseline: one op is one batch.
func BenchmarkPlainLoop(b *testing.B) {
	ds := benchData()
	p := newPlainLoop(ds, 1, *benchBatch)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := p.next(ctx); err != nil {
			b.Fatal(err)
		}
	}
	reportPerSample(b, b.N)
}

// BenchmarkLoader measures Next+Commit per batch (one op is one batch) for
// a world of one rank, so allocs/op is allocations per batch, collate's
// 64*784 float32 buffer included (the plain loop has the same one).
func BenchmarkLoader(b *testing.B) {
	for _, pw := range [][2]int{{0, 1}, {2, 1}, {4, 2}} {
		b.Run(fmt.Sprintf("prefetch%d/workers%d", pw[0], pw[1]), func(b *testing.B) {
			ds := benchData()
			l, err := New(ds, collateFloats, benchConfig(pw[0], pw[1]))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			var sink float32
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				bt, err := l.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				sink += bt.Data[0]
				l.Commit(bt)
			}
			reportPerSample(b, b.N)
			_ = sink
		})
	}
}

// cpuTime returns the CPU time (user + system) used by the whole process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoaderOverhead times the plain loop and the Loader in
// alternating chunks of -dl.chunk batches (so machine noise hits both
// alike) and reports, for each, wall time and process CPU time per sample,
// and the Loader's overhead in percent of the plain loop (wall and CPU).
// The consumer does no work besides taking batches, so with prefetch every
// Next waits for a worker and pays a cross-thread wake-up per batch: the
// worst case for a pipeline. With prefetch, the pipeline is stopped (Reset
// to the committed cursor) outside the measured region before each plain
// chunk, so its workers never run during the baseline.
func BenchmarkLoaderOverhead(b *testing.B) {
	for _, pw := range [][2]int{{0, 1}, {2, 1}} {
		b.Run(fmt.Sprintf("prefetch%d/workers%d", pw[0], pw[1]), func(b *testing.B) {
			ds := benchData()
			l, err := New(ds, collateFloats, benchConfig(pw[0], pw[1]))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			p := newPlainLoop(ds, 1, *benchBatch)
			ctx := context.Background()
			chunk := *benchChunk
			var plain, loader, plainCPU, loaderCPU time.Duration
			var sink float32
			batches := 0
			b.ResetTimer()
			for b.Loop() {
				c0, t0 := cpuTime(), time.Now()
				for range chunk {
					if err := p.next(ctx); err != nil {
						b.Fatal(err)
					}
				}
				c1, t1 := cpuTime(), time.Now()
				for range chunk {
					bt, err := l.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					sink += bt.Data[0]
					l.Commit(bt)
				}
				c2, t2 := cpuTime(), time.Now()
				plain += t1.Sub(t0)
				loader += t2.Sub(t1)
				plainCPU += c1 - c0
				loaderCPU += c2 - c1
				batches += chunk
				if err := l.Reset(l.Cursor(), 0, 1); err != nil {
					b.Fatal(err)
				}
			}
			_ = sink
			samples := float64(batches * *benchBatch)
			b.ReportMetric(float64(plain.Nanoseconds())/samples, "plain-ns/sample")
			b.ReportMetric(float64(loader.Nanoseconds())/samples, "loader-ns/sample")
			b.ReportMetric(100*(float64(loader)-float64(plain))/float64(plain), "wall-overhead-%")
			b.ReportMetric(float64(plainCPU.Nanoseconds())/samples, "plain-cpu-ns/sample")
			b.ReportMetric(float64(loaderCPU.Nanoseconds())/samples, "loader-cpu-ns/sample")
			b.ReportMetric(100*(float64(loaderCPU)-float64(plainCPU))/float64(plainCPU), "cpu-overhead-%")
		})
	}
}

var benchWork = flag.Int("dl.work", 1, "BenchmarkBusyStep: passes of simulated step work over each batch")

// simulatedStep stands for the training step: passes of arithmetic over
// the batch, of the order of loading it when passes is 1.
func simulatedStep(x []float32, passes int) float32 {
	var acc float32
	for range passes {
		for i, v := range x {
			acc += v * float32(i&7)
		}
	}
	return acc
}

// BenchmarkBusyStep compares a training loop whose step does work
// (-dl.work passes over each batch): the plain loop loads then steps; the
// Loader with prefetch loads the next batches while the step runs. One op
// is one batch.
func BenchmarkBusyStep(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		ds := benchData()
		p := newPlainLoop(ds, 1, *benchBatch)
		ctx := context.Background()
		var sink float32
		b.ReportAllocs()
		for b.Loop() {
			out, err := p.nextBatch(ctx)
			if err != nil {
				b.Fatal(err)
			}
			sink += simulatedStep(out, *benchWork)
		}
		reportPerSample(b, b.N)
		_ = sink
	})
	for _, pw := range [][2]int{{0, 1}, {2, 1}} {
		b.Run(fmt.Sprintf("loader/prefetch%d/workers%d", pw[0], pw[1]), func(b *testing.B) {
			ds := benchData()
			l, err := New(ds, collateFloats, benchConfig(pw[0], pw[1]))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			var sink float32
			b.ReportAllocs()
			for b.Loop() {
				bt, err := l.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				sink += simulatedStep(bt.Data, *benchWork)
				l.Commit(bt)
			}
			reportPerSample(b, b.N)
			_ = sink
		})
	}
}
