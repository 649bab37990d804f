package dataloader

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

var (
	benchSamples = flag.Int("dl.samples", 8192, "dataloader benchmarks: samples in the in-memory dataset")
	benchDim     = flag.Int("dl.dim", 784, "dataloader benchmarks: float32 values per sample")
	benchBatch   = flag.Int("dl.batch", 64, "dataloader benchmarks: global batch size")
	benchChunk   = flag.Int("dl.chunk", 64, "BenchmarkLoaderOverhead: batches per interleaved chunk")
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
// alternating chunks of -dl.chunk batches (which goes first alternates too),
// so that noise from other processes on the machine hits both alike, and
// reports the median over chunk pairs of the Loader's overhead in percent
// of the plain loop, by wall time and by process CPU time, plus the
// overall costs per sample. One op is one chunk pair.
//
// The consumer does no work besides taking batches, so with prefetch every
// Next waits for a worker and pays a cross-thread wake-up per batch: the
// worst case for a pipeline (BenchmarkBusyStep shows the case it is for).
// With prefetch, the pipeline is stopped (Reset to the committed cursor)
// outside the measured region before each plain chunk, so its workers never
// run during the baseline.
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
			var sink float32
			runPlain := func() (wall, cpu time.Duration) {
				c0, t0 := cpuTime(), time.Now()
				for range chunk {
					if err := p.next(ctx); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(t0), cpuTime() - c0
			}
			runLoader := func() (wall, cpu time.Duration) {
				c0, t0 := cpuTime(), time.Now()
				for range chunk {
					bt, err := l.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					sink += bt.Data[0]
					l.Commit(bt)
				}
				wall, cpu = time.Since(t0), cpuTime()-c0
				if err := l.Reset(l.Cursor(), 0, 1); err != nil { // stop the workers
					b.Fatal(err)
				}
				return wall, cpu
			}
			var plainWall, loaderWall, plainCPU, loaderCPU time.Duration
			var wallRatio, cpuRatio []float64
			pairs := 0
			b.ResetTimer()
			for b.Loop() {
				var pw, pc, lw, lc time.Duration
				if pairs%2 == 0 {
					pw, pc = runPlain()
					lw, lc = runLoader()
				} else {
					lw, lc = runLoader()
					pw, pc = runPlain()
				}
				pairs++
				plainWall += pw
				loaderWall += lw
				plainCPU += pc
				loaderCPU += lc
				wallRatio = append(wallRatio, float64(lw)/float64(pw))
				if pc > 0 {
					cpuRatio = append(cpuRatio, float64(lc)/float64(pc))
				}
			}
			_ = sink
			samples := float64(pairs * chunk * *benchBatch)
			b.ReportMetric(float64(plainWall.Nanoseconds())/samples, "plain-ns/sample")
			b.ReportMetric(float64(loaderWall.Nanoseconds())/samples, "loader-ns/sample")
			b.ReportMetric(100*(median(wallRatio)-1), "median-wall-overhead-%")
			b.ReportMetric(100*(median(cpuRatio)-1), "median-cpu-overhead-%")
			b.ReportMetric(100*(float64(loaderCPU)/float64(plainCPU)-1), "total-cpu-overhead-%")
		})
	}
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

var (
	benchWork   = flag.Int("dl.work", 1, "BenchmarkBusyStep, BenchmarkDecodingDataset: passes of simulated step work over each batch")
	benchDecode = flag.Int("dl.decode", 4, "BenchmarkDecodingDataset: passes of simulated decoding over each sample in Get")
)

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
func BenchmarkBusyStep(b *testing.B) { benchStepLoop(b, benchData) }

// benchStepLoop runs the plain loop and the Loader (with and without
// prefetch) over data, with -dl.work passes of step work per batch.
func benchStepLoop(b *testing.B, data func() Dataset[[]float32]) {
	b.Run("plain", func(b *testing.B) {
		p := newPlainLoop(data(), 1, *benchBatch)
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
			l, err := New(data(), collateFloats, benchConfig(pw[0], pw[1]))
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

// decodingData is benchData behind a Get that costs -dl.decode passes of
// arithmetic over the sample, as decompressing or decoding a record from a
// file would; it returns a new sample each time, as a decoder does.
func decodingData() Dataset[[]float32] {
	passes := *benchDecode
	return Map(benchData(), func(_ context.Context, _ int, s []float32) ([]float32, error) {
		out := make([]float32, len(s))
		for range passes {
			for i, v := range s {
				out[i] += v * float32(i&3)
			}
		}
		return out, nil
	})
}

// BenchmarkDecodingDataset is the case prefetch is for: Get does real work
// (decoding), the step too; the plain loop does one after the other, the
// Loader with prefetch decodes the next batches on another core while the
// step runs. One op is one batch.
func BenchmarkDecodingDataset(b *testing.B) { benchStepLoop(b, decodingData) }

// BenchmarkBookkeeping isolates the Loader's own cost per batch: samples
// are ints and collate only counts them, so what remains is Get calls,
// planning and (with prefetch) the hand-off between goroutines. "plain" is
// the same loop written by hand. One op is one batch of -dl.batch samples.
func BenchmarkBookkeeping(b *testing.B) {
	ds := idDataset(*benchSamples)
	count := func(_ context.Context, s []int, _ []int) (int, error) { return len(s), nil }
	b.Run("plain", func(b *testing.B) {
		ctx := context.Background()
		n, batch := ds.Len(), *benchBatch
		epoch, pos := 0, 0
		order := Order(1, 0, n)
		var samples []int
		total := 0
		b.ReportAllocs()
		for b.Loop() {
			if pos+batch > n {
				epoch, pos = epoch+1, 0
				order = Order(1, epoch, n)
			}
			samples = samples[:0]
			idx := order[pos : pos+batch]
			for _, i := range idx {
				v, err := ds.Get(ctx, i)
				if err != nil {
					b.Fatal(err)
				}
				samples = append(samples, v)
			}
			pos += batch
			c, _ := count(ctx, samples, idx)
			total += c
		}
		_ = total
	})
	for _, pw := range [][2]int{{0, 1}, {2, 1}} {
		b.Run(fmt.Sprintf("loader/prefetch%d/workers%d", pw[0], pw[1]), func(b *testing.B) {
			l, err := New(ds, count, benchConfig(pw[0], pw[1]))
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			total := 0
			b.ReportAllocs()
			for b.Loop() {
				bt, err := l.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				total += bt.Data
				l.Commit(bt)
			}
			_ = total
		})
	}
}
