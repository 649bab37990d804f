package mnist

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/trainer"
)

// adam is a plain Adam optimiser (Kingma & Ba, 2015) over flat buffers,
// local to these tests: the trainer has its own. It applies the mean
// gradient of a batch of n samples (Step returns sums).
type adam struct {
	lr, b1, b2, eps float64
	t               int
	m, v            [][]float32
}

func newAdam(ps []trainer.Param, lr float64) *adam {
	a := &adam{lr: lr, b1: 0.9, b2: 0.999, eps: 1e-8}
	for _, p := range ps {
		a.m = append(a.m, make([]float32, len(p.Value)))
		a.v = append(a.v, make([]float32, len(p.Value)))
	}
	return a
}

func (a *adam) step(ps []trainer.Param, n int) {
	a.t++
	c1 := 1 - math.Pow(a.b1, float64(a.t))
	c2 := 1 - math.Pow(a.b2, float64(a.t))
	inv := 1 / float32(n)
	b1, b2 := float32(a.b1), float32(a.b2)
	for i, p := range ps {
		m, v := a.m[i], a.v[i]
		for j, g := range p.Grad {
			g *= inv
			m[j] = b1*m[j] + (1-b1)*g
			v[j] = b2*v[j] + (1-b2)*g*g
			mh := float64(m[j]) / c1
			vh := float64(v[j]) / c2
			p.Value[j] -= float32(a.lr * mh / (math.Sqrt(vh) + a.eps))
		}
	}
}

// loadBatch reads the samples idx of ds into pixels/labels.
func loadBatch(t testing.TB, ds *MNIST, idx []int, pixels []float32, labels []int) ([]float32, []int) {
	t.Helper()
	pixels, labels = pixels[:0], labels[:0]
	ctx := context.Background()
	for _, i := range idx {
		s, err := ds.Get(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		pixels = append(pixels, s.Pixels[:]...)
		labels = append(labels, s.Label)
	}
	return pixels, labels
}

func openReal(t testing.TB, split Split) *MNIST {
	t.Helper()
	ds, err := OpenMNIST("", split)
	if err != nil {
		t.Fatalf("the real MNIST files (GoMNIST module): %v", err)
	}
	t.Cleanup(func() { ds.Close() })
	return ds
}

func newModel(t testing.TB, kind string, seed int64) *Model {
	t.Helper()
	m, err := NewModel(kind, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func randomImages(n int, seed uint64) ([]float32, []int) {
	r := rand.New(rand.NewPCG(seed, 3))
	px := make([]float32, n*Pixels)
	for i := range px {
		px[i] = r.Float32()
	}
	labels := make([]int, n)
	for i := range labels {
		labels[i] = r.IntN(NumClasses)
	}
	return px, labels
}

func TestNewModelShapesAndSeededInit(t *testing.T) {
	for kind, want := range map[string]int{"mlp": 784*256 + 256 + 256*10 + 10, "cnn": 8*25 + 16*8*25 + 784*10 + 10} {
		a, b, c := newModel(t, kind, 1), newModel(t, kind, 1), newModel(t, kind, 2)
		total := 0
		for i, p := range a.Params() {
			total += len(p.Value)
			if !slices.Equal(p.Value, b.Params()[i].Value) {
				t.Fatalf("%s %s: same seed, different init", kind, p.Name)
			}
			if len(p.Shape) >= 2 && slices.Equal(p.Value, c.Params()[i].Value) {
				t.Fatalf("%s %s: different seeds, same init", kind, p.Name)
			}
		}
		if total != want {
			t.Fatalf("%s: %d parameters, want %d", kind, total, want)
		}
		if a.Kind() != kind {
			t.Fatalf("Kind %q", a.Kind())
		}
	}
	if _, err := NewModel("resnet", 1); !errors.Is(err, ErrBadInput) {
		t.Fatalf("NewModel(resnet): %v, want ErrBadInput", err)
	}
}

// TestModelGradientsMatchFiniteDifferences checks sampled gradient elements
// of both models against central differences of the summed loss.
func TestModelGradientsMatchFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	for _, kind := range ModelKinds {
		t.Run(kind, func(t *testing.T) {
			m := newModel(t, kind, 3)
			px, labels := randomImages(3, 5)
			if _, err := m.Step(ctx, px, labels); err != nil {
				t.Fatal(err)
			}
			var grads [][]float32
			for _, p := range m.Params() {
				grads = append(grads, slices.Clone(p.Grad))
			}
			// Forward-only loss from the logits, in float64.
			loss := func() float64 {
				logits, err := m.Logits(px, 3)
				if err != nil {
					t.Fatal(err)
				}
				s := 0.0
				for i, l := range labels {
					row := logits[i*NumClasses : (i+1)*NumClasses]
					mx := float64(slices.Max(row))
					z := 0.0
					for _, v := range row {
						z += math.Exp(float64(v) - mx)
					}
					s += mx + math.Log(z) - float64(row[l])
				}
				return s
			}
			// Per parameter, the relative L2 error over ~24 sampled elements:
			// robust to the odd perturbation that crosses a ReLU or max-pool
			// kink (every conv1 weight touches thousands of activations).
			const eps = 1e-3
			for pi, p := range m.Params() {
				var diff, norm float64
				for j := 0; j < len(p.Value); j += max(1, len(p.Value)/24) {
					orig := p.Value[j]
					p.Value[j] = orig + eps
					lp := loss()
					p.Value[j] = orig - eps
					lm := loss()
					p.Value[j] = orig
					fd := (lp - lm) / (2 * eps)
					d := fd - float64(grads[pi][j])
					diff += d * d
					norm += fd * fd
				}
				if rel := math.Sqrt(diff / norm); !(rel < 0.03) || norm == 0 {
					t.Errorf("%s: relative error %.4f between gradient and finite differences (|fd| %.3g)", p.Name, rel, math.Sqrt(norm))
				}
			}
		})
	}
}

// TestModelStepIsBitForBitDeterministic checks what reproducible training
// needs from the model: the same batch gives the same loss and gradient
// bits across runs, fresh models and GOMAXPROCS settings.
func TestModelStepIsBitForBitDeterministic(t *testing.T) {
	ctx := context.Background()
	px, labels := randomImages(64, 7)
	for _, kind := range ModelKinds {
		t.Run(kind, func(t *testing.T) {
			run := func() (float64, [][]float32) {
				m := newModel(t, kind, 11)
				var l float64
				var err error
				for range 2 {
					if l, err = m.Step(ctx, px, labels); err != nil {
						t.Fatal(err)
					}
				}
				var g [][]float32
				for _, p := range m.Params() {
					g = append(g, slices.Clone(p.Grad))
				}
				return l, g
			}
			procs := runtime.GOMAXPROCS(0)
			defer runtime.GOMAXPROCS(procs)
			l0, g0 := run()
			for _, p := range []int{1, 2, 4} {
				runtime.GOMAXPROCS(p)
				l, g := run()
				if math.Float64bits(l) != math.Float64bits(l0) {
					t.Fatalf("GOMAXPROCS %d: loss %v, first %v", p, l, l0)
				}
				for i := range g {
					for j := range g[i] {
						if math.Float32bits(g[i][j]) != math.Float32bits(g0[i][j]) {
							t.Fatalf("GOMAXPROCS %d: param %d grad[%d] = %v, first %v", p, i, j, g[i][j], g0[i][j])
						}
					}
				}
			}
		})
	}
}

func TestModelStepValidatesInput(t *testing.T) {
	ctx := context.Background()
	m := newModel(t, "mlp", 1)
	px, labels := randomImages(2, 1)
	for name, tc := range map[string]struct {
		px     []float32
		labels []int
	}{
		"short pixels":   {px[:Pixels], labels},
		"label too big":  {px, []int{1, 10}},
		"negative label": {px, []int{-1, 0}},
	} {
		if _, err := m.Step(ctx, tc.px, tc.labels); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	if _, err := m.Predict(px, 3); !errors.Is(err, ErrBadInput) {
		t.Errorf("Predict with 2 images for n=3: %v", err)
	}
	for _, p := range m.Params() {
		for i := range p.Grad {
			p.Grad[i] = 1
		}
	}
	if l, err := m.Step(ctx, nil, nil); err != nil || l != 0 {
		t.Fatalf("empty Step: %v, %v", l, err)
	}
	for _, p := range m.Params() {
		if slices.ContainsFunc(p.Grad, func(g float32) bool { return g != 0 }) {
			t.Fatalf("empty Step left %s gradients non-zero", p.Name)
		}
	}
	if pred, err := m.Predict(nil, 0); err != nil || len(pred) != 0 {
		t.Fatalf("Predict(0): %v, %v", pred, err)
	}
}

// TestModelLearnsRealDigits trains the MLP briefly on 1 024 real training
// images with Adam and checks it classifies held-out real test images far
// better than chance: the whole path (data, model, gradients) works.
func TestModelLearnsRealDigits(t *testing.T) {
	ctx := context.Background()
	train, test := openReal(t, Train), openReal(t, Test)
	m := newModel(t, "mlp", 1)
	opt := newAdam(m.Params(), 1e-3)
	var px []float32
	var labels []int
	idx := make([]int, 64)
	for epoch := 0; epoch < 3; epoch++ {
		for lo := 0; lo < 1024; lo += 64 {
			for i := range idx {
				idx[i] = lo + i
			}
			px, labels = loadBatch(t, train, idx, px, labels)
			if _, err := m.Step(ctx, px, labels); err != nil {
				t.Fatal(err)
			}
			opt.step(m.Params(), len(labels))
		}
	}
	idx = make([]int, 500)
	for i := range idx {
		idx[i] = i
	}
	px, labels = loadBatch(t, test, idx, px, labels)
	pred, err := m.Predict(px, len(labels))
	if err != nil {
		t.Fatal(err)
	}
	correct := 0
	for i, p := range pred {
		if p == labels[i] {
			correct++
		}
	}
	if acc := float64(correct) / float64(len(pred)); acc < 0.8 {
		t.Fatalf("test accuracy %.3f after 48 steps on 1 024 images, want >= 0.8", acc)
	}
}

// BenchmarkStep measures forward+backward throughput on one goroutine
// (samples/s) for each model at batch sizes 32 and 64, and the CPU time
// the process spends per step (cpu-ns/op: less disturbed than ns/op on a
// shared machine, where ns/op grows with the other jobs' load).
func BenchmarkStep(b *testing.B) {
	ctx := context.Background()
	for _, kind := range ModelKinds {
		for _, n := range []int{32, 64} {
			b.Run(fmt.Sprintf("%s/batch%d", kind, n), func(b *testing.B) {
				m := newModel(b, kind, 1)
				px, labels := randomImages(n, 1)
				if _, err := m.Step(ctx, px, labels); err != nil { // compile outside the timing
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				for b.Loop() {
					if _, err := m.Step(ctx, px, labels); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "samples/s")
				if cpu := cpuTime() - cpu0; cpu > 0 {
					b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
				}
			})
		}
	}
}

// BenchmarkTrainToAccuracy trains a model from scratch on the real 60 000
// training images in a single process (local Adam, lr 1e-3, batch 64,
// shuffled each epoch, 3 epochs), evaluates on the 10 000 test images after
// every epoch, and fails if the final accuracy is below 0.97. It reports
// the accuracy and seconds per epoch. Run it once:
//
//	go test ./examples/internal/mnist -run '^$' -bench TrainToAccuracy/mlp -benchtime 1x -v
func BenchmarkTrainToAccuracy(b *testing.B) {
	for _, kind := range ModelKinds {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				trainToAccuracy(b, kind, 3)
			}
		})
	}
}

func trainToAccuracy(b *testing.B, kind string, epochs int) {
	ctx := context.Background()
	train, test := openReal(b, Train), openReal(b, Test)
	m := newModel(b, kind, 1)
	opt := newAdam(m.Params(), 1e-3)
	const batch = 64
	var px []float32
	var labels []int
	r := rand.New(rand.NewPCG(1, 1))
	var acc float64
	var trainTime time.Duration
	for epoch := 1; epoch <= epochs; epoch++ {
		order := r.Perm(train.Len())
		start := time.Now()
		lossSum := 0.0
		for lo := 0; lo+batch <= len(order); lo += batch {
			px, labels = loadBatch(b, train, order[lo:lo+batch], px, labels)
			l, err := m.Step(ctx, px, labels)
			if err != nil {
				b.Fatal(err)
			}
			lossSum += l
			opt.step(m.Params(), batch)
		}
		took := time.Since(start)
		trainTime += took
		acc = evalAccuracy(b, m, test)
		b.Logf("%s epoch %d: %.1f s, %.0f samples/s, mean loss %.4f, test accuracy %.4f",
			kind, epoch, took.Seconds(), float64(len(order))/took.Seconds(), lossSum/float64(len(order)), acc)
	}
	b.ReportMetric(acc, "test_acc")
	b.ReportMetric(trainTime.Seconds()/float64(epochs), "s/epoch")
	if acc < 0.97 {
		b.Fatalf("%s: test accuracy %.4f after %d epochs, want >= 0.97", kind, acc, epochs)
	}
}

func evalAccuracy(t testing.TB, m *Model, ds *MNIST) float64 {
	const chunk = 500
	var px []float32
	var labels []int
	correct := 0
	idx := make([]int, 0, chunk)
	for lo := 0; lo < ds.Len(); lo += chunk {
		idx = idx[:0]
		for i := lo; i < min(lo+chunk, ds.Len()); i++ {
			idx = append(idx, i)
		}
		px, labels = loadBatch(t, ds, idx, px, labels)
		pred, err := m.Predict(px, len(labels))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range pred {
			if p == labels[i] {
				correct++
			}
		}
	}
	return float64(correct) / float64(ds.Len())
}

// BenchmarkCompile measures what a new batch size costs: NewModel (which
// compiles batch size 1) plus the first Step at batch size 64, which
// builds and compiles that graph, minus nothing (it includes one run).
func BenchmarkCompile(b *testing.B) {
	ctx := context.Background()
	px, labels := randomImages(64, 1)
	for _, kind := range ModelKinds {
		b.Run(kind, func(b *testing.B) {
			for b.Loop() {
				m, err := NewModel(kind, 1)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := m.Step(ctx, px, labels); err != nil {
					b.Fatal(err)
				}
				m.Close()
			}
		})
	}
}
