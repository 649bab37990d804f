package gorgoniastep

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/chewxy/hm"
	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tinyMLP is a BuildFunc: in -> hidden (tanh) -> classes, softmax
// cross-entropy summed over the batch. Inputs: x (batch, in), one-hot y
// (batch, classes). Output: logits.
func tinyMLP(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (Graph, error) {
	in, classes := p[0].Shape()[0], p[2].Shape()[1]
	x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, in), gorgonia.WithName("x"))
	y := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, classes), gorgonia.WithName("y"))
	h, err := gorgonia.Mul(x, p[0])
	if err != nil {
		return Graph{}, err
	}
	if h, err = gorgonia.BroadcastAdd(h, p[1], nil, []byte{0}); err != nil {
		return Graph{}, err
	}
	if h, err = gorgonia.Tanh(h); err != nil {
		return Graph{}, err
	}
	logits, err := gorgonia.Mul(h, p[2])
	if err != nil {
		return Graph{}, err
	}
	if logits, err = gorgonia.BroadcastAdd(logits, p[3], nil, []byte{0}); err != nil {
		return Graph{}, err
	}
	logp, err := gorgonia.LogSoftMax(logits)
	if err != nil {
		return Graph{}, err
	}
	picked, err := gorgonia.HadamardProd(y, logp)
	if err != nil {
		return Graph{}, err
	}
	s, err := gorgonia.Sum(picked)
	if err != nil {
		return Graph{}, err
	}
	loss, err := gorgonia.Neg(s)
	if err != nil {
		return Graph{}, err
	}
	return Graph{Loss: loss, Inputs: gorgonia.Nodes{x, y}, Outputs: gorgonia.Nodes{logits}}, nil
}

func tinySpecs(in, hidden, classes int) []ParamSpec {
	return []ParamSpec{
		{Name: "w1", Shape: []int{in, hidden}},
		{Name: "b1", Shape: []int{hidden}},
		{Name: "w2", Shape: []int{hidden, classes}},
		{Name: "b2", Shape: []int{classes}},
	}
}

func newTiny(t *testing.T, in, hidden, classes int, seed uint64, opts ...Option) *Model {
	t.Helper()
	m, err := New(tinySpecs(in, hidden, classes), tinyMLP, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	r := rand.New(rand.NewPCG(seed, 1))
	for _, p := range m.Params() {
		for i := range p.Value {
			p.Value[i] = float32(r.NormFloat64() * 0.5)
		}
	}
	return m
}

// batchData is n samples of (x, one-hot y).
type batchData struct {
	x, y  []float32
	in, k int
}

func randomBatch(n, in, classes int, seed uint64) batchData {
	r := rand.New(rand.NewPCG(seed, 2))
	b := batchData{x: make([]float32, n*in), y: make([]float32, n*classes), in: in, k: classes}
	for i := range b.x {
		b.x[i] = float32(r.NormFloat64())
	}
	for i := 0; i < n; i++ {
		b.y[i*classes+r.IntN(classes)] = 1
	}
	return b
}

func (b batchData) slice(lo, hi int) batchData {
	return batchData{x: b.x[lo*b.in : hi*b.in], y: b.y[lo*b.k : hi*b.k], in: b.in, k: b.k}
}

func (b batchData) fill(mc *Machine) error {
	copy(mc.Input(0), b.x)
	copy(mc.Input(1), b.y)
	return nil
}

func (b batchData) n() int { return len(b.y) / b.k }

func gradsCopy(m *Model) [][]float32 {
	var out [][]float32
	for _, p := range m.Params() {
		out = append(out, slices.Clone(p.Grad))
	}
	return out
}

// TestGradientMatchesFiniteDifferences checks every gradient element of a
// small MLP with softmax cross-entropy against central differences of the
// loss computed by the forward-only machine.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 1)
	b := randomBatch(6, 4, 3, 7)
	loss, err := m.Step(ctx, b.n(), b.fill)
	if err != nil {
		t.Fatal(err)
	}
	grads := gradsCopy(m)
	ev, err := m.Eval(b.n())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.fill(ev); err != nil {
		t.Fatal(err)
	}
	evLoss, err := ev.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(evLoss-loss) > 1e-5*math.Abs(loss) {
		t.Fatalf("eval loss %v != training loss %v", evLoss, loss)
	}
	const eps = 1e-2
	checked := 0
	for pi, p := range m.Params() {
		for j := range p.Value {
			orig := p.Value[j]
			p.Value[j] = orig + eps
			lp, err := ev.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Value[j] = orig - eps
			lm, err := ev.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			p.Value[j] = orig
			num := (lp - lm) / (2 * eps)
			got := float64(grads[pi][j])
			if math.Abs(got-num) > 2e-3+2e-2*math.Abs(num) {
				t.Errorf("%s[%d]: gradient %v, finite difference %v", p.Name, j, got, num)
			}
			checked++
		}
	}
	if checked != 4*5+5+5*3+3 {
		t.Fatalf("checked %d elements", checked)
	}
}

// TestParamsAliasGorgoniaTensors checks that Param.Value and Param.Grad are
// the very arrays gorgonia reads and writes, in every compiled graph and
// after repeated Reset/RunAll cycles, and that writes to Value are seen by
// the next run.
func TestParamsAliasGorgoniaTensors(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 2)
	params := m.Params()
	b := randomBatch(5, 4, 3, 9)
	for round := 0; round < 3; round++ {
		for _, n := range []int{5, 2} {
			mc, err := m.Train(n)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Step(ctx, n, b.slice(0, n).fill); err != nil {
				t.Fatal(err)
			}
			for i, node := range mc.learnables {
				v := node.Value().(*tensor.Dense)
				if v.Uintptr() != uintptr(unsafe.Pointer(&params[i].Value[0])) {
					t.Fatalf("batch %d round %d: %s value is not aliased", n, round, params[i].Name)
				}
				gv, err := node.Grad()
				if err != nil {
					t.Fatal(err)
				}
				if gv.(*tensor.Dense).Uintptr() != uintptr(unsafe.Pointer(&params[i].Grad[0])) {
					t.Fatalf("batch %d round %d: %s gradient is not aliased", n, round, params[i].Name)
				}
				if got := gv.(*tensor.Dense).Data().([]float32); !slices.Equal(got, params[i].Grad) {
					t.Fatalf("%s: gradient tensor and Param.Grad differ", params[i].Name)
				}
			}
		}
	}
	// A write through Param.Value changes the next run: zero every weight
	// and the loss must be n*ln(classes) exactly as a uniform softmax gives.
	for _, p := range params {
		clear(p.Value)
	}
	loss, err := m.Step(ctx, 5, b.fill)
	if err != nil {
		t.Fatal(err)
	}
	if want := 5 * math.Log(3); math.Abs(loss-want) > 1e-5 {
		t.Fatalf("loss with zero weights %v, want %v", loss, want)
	}
	// With zero weights the hidden layer is zero, so w2's gradient is zero.
	for _, g := range params[2].Grad {
		if g != 0 {
			t.Fatalf("w2 gradient %v with zero hidden activations", params[2].Grad)
		}
	}
}

// TestRunDoesNotAccumulateOrMutate checks that repeated runs give the same
// bits (gradients are zeroed, not accumulated) and that a run leaves the
// parameter values and the inputs untouched.
func TestRunDoesNotAccumulateOrMutate(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 3)
	b := randomBatch(4, 4, 3, 11)
	var values [][]float32
	for _, p := range m.Params() {
		values = append(values, slices.Clone(p.Value))
	}
	l1, err := m.Step(ctx, 4, b.fill)
	if err != nil {
		t.Fatal(err)
	}
	g1 := gradsCopy(m)
	mc, _ := m.Train(4)
	in0, in1 := slices.Clone(mc.Input(0)), slices.Clone(mc.Input(1))
	l2, err := mc.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l1 != l2 {
		t.Fatalf("loss %v then %v", l1, l2)
	}
	for i, p := range m.Params() {
		if !slices.Equal(p.Grad, g1[i]) {
			t.Fatalf("%s: gradient changed between identical runs", p.Name)
		}
		if !slices.Equal(p.Value, values[i]) {
			t.Fatalf("%s: run modified the parameter values", p.Name)
		}
	}
	if !slices.Equal(in0, mc.Input(0)) || !slices.Equal(in1, mc.Input(1)) {
		t.Fatal("run modified its inputs")
	}
}

// TestGradientsAreSumsOverSamples checks the StepFunc contract across batch
// sizes: one batch of 5 gives the sum of the losses and gradients of a
// batch of 2 and a batch of 3 (graphs compiled per batch size).
func TestGradientsAreSumsOverSamples(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 4)
	b := randomBatch(5, 4, 3, 13)
	whole, err := m.Step(ctx, 5, b.fill)
	if err != nil {
		t.Fatal(err)
	}
	gWhole := gradsCopy(m)
	l1, err := m.Step(ctx, 2, b.slice(0, 2).fill)
	if err != nil {
		t.Fatal(err)
	}
	g1 := gradsCopy(m)
	l2, err := m.Step(ctx, 3, b.slice(2, 5).fill)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(whole-(l1+l2)) > 1e-5*math.Abs(whole) {
		t.Fatalf("loss of 5 = %v, sum of parts = %v", whole, l1+l2)
	}
	for i, p := range m.Params() {
		for j := range p.Grad {
			sum := g1[i][j] + p.Grad[j]
			if d := math.Abs(float64(sum - gWhole[i][j])); d > 1e-5+1e-5*math.Abs(float64(sum)) {
				t.Fatalf("%s[%d]: whole %v, parts sum %v", p.Name, j, gWhole[i][j], sum)
			}
		}
	}
}

// TestMeanLossIsScaledToSum checks WithMeanLoss: a graph computing the mean
// still yields summed loss and gradients.
func TestMeanLossIsScaledToSum(t *testing.T) {
	ctx := context.Background()
	meanMLP := func(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (Graph, error) {
		gr, err := tinyMLP(g, batch, p)
		if err != nil {
			return gr, err
		}
		gr.Loss, err = gorgonia.Div(gr.Loss, gorgonia.NewConstant(float32(batch)))
		return gr, err
	}
	sum := newTiny(t, 4, 5, 3, 5)
	mean, err := New(tinySpecs(4, 5, 3), meanMLP, WithMeanLoss())
	if err != nil {
		t.Fatal(err)
	}
	defer mean.Close()
	for i, p := range sum.Params() {
		copy(mean.Params()[i].Value, p.Value)
	}
	b := randomBatch(6, 4, 3, 17)
	ls, err := sum.Step(ctx, 6, b.fill)
	if err != nil {
		t.Fatal(err)
	}
	lm, err := mean.Step(ctx, 6, b.fill)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(ls-lm) > 1e-5*math.Abs(ls) {
		t.Fatalf("sum loss %v, scaled mean loss %v", ls, lm)
	}
	for i, p := range sum.Params() {
		for j, g := range p.Grad {
			if d := math.Abs(float64(g - mean.Params()[i].Grad[j])); d > 1e-5+1e-5*math.Abs(float64(g)) {
				t.Fatalf("%s[%d]: sum %v, scaled mean %v", p.Name, j, g, mean.Params()[i].Grad[j])
			}
		}
	}
}

// TestEmptyBatchZeroesGradients checks the zero-sample case of the
// StepFunc contract.
func TestEmptyBatchZeroesGradients(t *testing.T) {
	m := newTiny(t, 4, 5, 3, 6)
	for _, p := range m.Params() {
		for i := range p.Grad {
			p.Grad[i] = 42
		}
	}
	called := false
	loss, err := m.Step(context.Background(), 0, func(*Machine) error { called = true; return nil })
	if err != nil || loss != 0 || called {
		t.Fatalf("Step(0) = %v, %v (fill called: %v), want 0, nil, not called", loss, err, called)
	}
	for _, p := range m.Params() {
		for _, g := range p.Grad {
			if g != 0 {
				t.Fatalf("%s not zeroed: %v", p.Name, p.Grad)
			}
		}
	}
	if _, err := m.Step(context.Background(), -1, nil); !errors.Is(err, ErrBadBatch) {
		t.Fatalf("Step(-1): %v, want ErrBadBatch", err)
	}
	if _, err := m.Step(context.Background(), 2, nil); !errors.Is(err, ErrBadBatch) {
		t.Fatalf("Step(2, nil fill): %v, want ErrBadBatch", err)
	}
}

// TestDeterministicAcrossRunsModelsAndThreads checks that forward and
// backward are bit-for-bit reproducible for a fixed batch: across runs,
// across fresh models, and with GOMAXPROCS 1 against the machine's default
// (gonum's matrix multiply runs in parallel above 64x64 blocks; its
// per-element summation order depends only on the shapes). Sizes are big
// enough to take the parallel path.
func TestDeterministicAcrossRunsModelsAndThreads(t *testing.T) {
	ctx := context.Background()
	const in, hidden, classes, n = 200, 130, 10, 140
	b := randomBatch(n, in, classes, 19)
	run := func() (float64, [][]float32) {
		m := newTiny(t, in, hidden, classes, 8)
		loss, err := m.Step(ctx, n, b.fill)
		if err != nil {
			t.Fatal(err)
		}
		return loss, gradsCopy(m)
	}
	l0, g0 := run()
	procs := runtime.GOMAXPROCS(0)
	for _, p := range []int{1, max(procs, 2), procs} {
		runtime.GOMAXPROCS(p)
		l, g := run()
		if math.Float64bits(l) != math.Float64bits(l0) {
			t.Fatalf("GOMAXPROCS %d: loss %v, first run %v", p, l, l0)
		}
		for i := range g {
			for j := range g[i] {
				if math.Float32bits(g[i][j]) != math.Float32bits(g0[i][j]) {
					t.Fatalf("GOMAXPROCS %d: param %d grad[%d] %v, first run %v", p, i, j, g[i][j], g0[i][j])
				}
			}
		}
	}
	runtime.GOMAXPROCS(procs)
}

// TestEvalOutputs checks the forward-only machine: its outputs are the
// logits, and running it leaves the gradients alone.
func TestEvalOutputs(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 9)
	b := randomBatch(3, 4, 3, 23)
	if _, err := m.Step(ctx, 3, b.fill); err != nil {
		t.Fatal(err)
	}
	g := gradsCopy(m)
	ev, err := m.Eval(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.fill(ev); err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Run(ctx); err != nil {
		t.Fatal(err)
	}
	logits, err := ev.Output(0)
	if err != nil {
		t.Fatal(err)
	}
	// Recompute the logits by hand.
	p := m.Params()
	for s := 0; s < 3; s++ {
		h := make([]float64, 5)
		for j := range h {
			acc := float64(p[1].Value[j])
			for i := 0; i < 4; i++ {
				acc += float64(b.x[s*4+i]) * float64(p[0].Value[i*5+j])
			}
			h[j] = math.Tanh(acc)
		}
		for c := 0; c < 3; c++ {
			acc := float64(p[3].Value[c])
			for j := range h {
				acc += h[j] * float64(p[2].Value[j*3+c])
			}
			if math.Abs(acc-float64(logits[s*3+c])) > 1e-4 {
				t.Fatalf("logit[%d,%d] = %v, want %v", s, c, logits[s*3+c], acc)
			}
		}
	}
	for i, q := range m.Params() {
		if !slices.Equal(q.Grad, g[i]) {
			t.Fatalf("eval run changed gradient of %s", q.Name)
		}
	}
	tr, _ := m.Train(3)
	if _, err := tr.Output(0); !errors.Is(err, ErrBadGraph) {
		t.Fatalf("Output on a training machine: %v, want ErrBadGraph", err)
	}
}

// TestGraphCacheEvictsLeastRecentlyUsed checks WithMaxGraphs.
func TestGraphCacheEvictsLeastRecentlyUsed(t *testing.T) {
	ctx := context.Background()
	m := newTiny(t, 4, 5, 3, 10, WithMaxGraphs(2))
	b := randomBatch(4, 4, 3, 29)
	first, err := m.Train(1) // built by New
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 3} {
		if _, err := m.Step(ctx, n, b.slice(0, n).fill); err != nil {
			t.Fatal(err)
		}
	}
	if len(m.train.entries) != 2 {
		t.Fatalf("%d cached graphs, want 2", len(m.train.entries))
	}
	if _, err := first.Run(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("evicted machine Run: %v, want ErrClosed", err)
	}
	again, err := m.Train(1)
	if err != nil || again == first {
		t.Fatalf("rebuilding batch 1: %v (same machine: %v)", err, again == first)
	}
	if _, err := m.Step(ctx, 1, b.slice(0, 1).fill); err != nil {
		t.Fatal(err)
	}
}

func TestRunHonoursCancelledContext(t *testing.T) {
	m := newTiny(t, 4, 5, 3, 11)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Step(ctx, 2, randomBatch(2, 4, 3, 1).fill); !errors.Is(err, context.Canceled) {
		t.Fatalf("Step: %v, want context.Canceled", err)
	}
	mc, _ := m.Train(1)
	if _, err := mc.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Step(context.Background(), 1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Step after Close: %v, want ErrClosed", err)
	}
}

func TestFillErrorIsReturned(t *testing.T) {
	m := newTiny(t, 4, 5, 3, 12)
	boom := errors.New("boom")
	if _, err := m.Step(context.Background(), 2, func(*Machine) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Step: %v, want the fill error", err)
	}
}

func TestNewRejectsBadSpecsAndGraphs(t *testing.T) {
	okSpecs := tinySpecs(2, 2, 2)
	cases := []struct {
		name  string
		specs []ParamSpec
		build BuildFunc
		opts  []Option
	}{
		{"no params", nil, tinyMLP, nil},
		{"nil build", okSpecs, nil, nil},
		{"empty name", []ParamSpec{{Name: "", Shape: []int{1}}}, tinyMLP, nil},
		{"duplicate name", []ParamSpec{{Name: "a", Shape: []int{1}}, {Name: "a", Shape: []int{1}}}, tinyMLP, nil},
		{"no dims", []ParamSpec{{Name: "a"}}, tinyMLP, nil},
		{"zero dim", []ParamSpec{{Name: "a", Shape: []int{0, 3}}}, tinyMLP, nil},
		{"huge", []ParamSpec{{Name: "a", Shape: []int{1 << 20, 1 << 20}}}, tinyMLP, nil},
		{"max graphs", okSpecs, tinyMLP, []Option{WithMaxGraphs(0)}},
		{"nan scale", okSpecs, tinyMLP, []Option{WithLossScale(math.NaN())}},
		{"build error", okSpecs, func(*gorgonia.ExprGraph, int, gorgonia.Nodes) (Graph, error) {
			return Graph{}, errors.New("nope")
		}, nil},
		{"nil loss", okSpecs, func(*gorgonia.ExprGraph, int, gorgonia.Nodes) (Graph, error) { return Graph{}, nil }, nil},
		{"vector loss", okSpecs, func(g *gorgonia.ExprGraph, _ int, p gorgonia.Nodes) (Graph, error) {
			return Graph{Loss: p[1]}, nil
		}, nil},
		{"shape mismatch panics inside gorgonia", okSpecs, func(g *gorgonia.ExprGraph, _ int, p gorgonia.Nodes) (Graph, error) {
			x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(3, 7), gorgonia.WithName("x"))
			return Graph{Loss: gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Mul(x, p[0]))))}, nil
		}, nil},
		{"loss from another graph", okSpecs, func(g *gorgonia.ExprGraph, _ int, p gorgonia.Nodes) (Graph, error) {
			other := gorgonia.NewGraph()
			return Graph{Loss: gorgonia.NewScalar(other, tensor.Float32, gorgonia.WithName("l"))}, nil
		}, nil},
		{"float64 input", okSpecs, func(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (Graph, error) {
			gr, err := tinyMLP(g, batch, p)
			gr.Inputs = append(gr.Inputs, gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(1, 1), gorgonia.WithName("z")))
			return gr, err
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.specs, tc.build, tc.opts...)
			if !errors.Is(err, ErrBadGraph) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("New: %v, want ErrBadGraph", err)
			}
		})
	}
}

func TestBindRejectsBadLearnables(t *testing.T) {
	g := gorgonia.NewGraph()
	w := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("w"), gorgonia.WithInit(gorgonia.Zeroes()))
	w64 := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(3), gorgonia.WithName("w64"), gorgonia.WithInit(gorgonia.Zeroes()))
	noValue := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("novalue"))
	loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Add(w, noValue))))
	sq := gorgonia.Must(gorgonia.Square(w))
	other := gorgonia.NewVector(gorgonia.NewGraph(), tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("o"), gorgonia.WithInit(gorgonia.Zeroes()))
	for name, tc := range map[string]struct {
		loss *gorgonia.Node
		ls   gorgonia.Nodes
		opts []Option
	}{
		"float64 learnable":  {loss, gorgonia.Nodes{w64}, nil},
		"no value":           {loss, gorgonia.Nodes{noValue}, nil},
		"computed node":      {loss, gorgonia.Nodes{sq}, nil},
		"other graph":        {loss, gorgonia.Nodes{other}, nil},
		"duplicate":          {loss, gorgonia.Nodes{w, w}, nil},
		"none":               {loss, nil, nil},
		"nil loss":           {nil, gorgonia.Nodes{w}, nil},
		"mean needs New":     {loss, gorgonia.Nodes{w}, []Option{WithMeanLoss()}},
		"input is learnable": {loss, gorgonia.Nodes{w}, []Option{WithInputs(w)}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Bind(g, tc.loss, tc.ls, tc.opts...); !errors.Is(err, ErrBadGraph) {
				t.Fatalf("Bind: %v, want ErrBadGraph", err)
			}
		})
	}
}

// TestBindSingleGraph exercises Bind directly on a graph the caller built:
// loss = sum((x*w)^2) with a gradient tensor the caller bound.
func TestBindSingleGraph(t *testing.T) {
	g := gorgonia.NewGraph()
	gradBuf := make([]float32, 3)
	w := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("w"),
		gorgonia.WithValue(tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{1, 2, 3}))),
		gorgonia.WithGrad(tensor.New(tensor.WithShape(3), tensor.WithBacking(gradBuf))))
	x := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("x"))
	loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Square(gorgonia.Must(gorgonia.HadamardProd(x, w))))))
	mc, err := Bind(g, loss, gorgonia.Nodes{w}, WithInputs(x), WithLossScale(2))
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	copy(mc.Input(0), []float32{1, -1, 2})
	l, err := mc.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// loss = 2 * (1 + 4 + 36); grad = 2 * 2 x^2 w.
	if l != 82 {
		t.Fatalf("loss %v, want 82", l)
	}
	p := mc.Params()[0]
	if &p.Grad[0] != &gradBuf[0] {
		t.Fatal("Bind did not keep the caller's gradient tensor")
	}
	if want := []float32{4, 8, 48}; !slices.Equal(p.Grad, want) {
		t.Fatalf("grad %v, want %v", p.Grad, want)
	}
	if mc.Batch() != 0 || mc.NumInputs() != 1 {
		t.Fatalf("Batch %d NumInputs %d", mc.Batch(), mc.NumInputs())
	}
}

// mulOp is x·w for a matrix x and a vector w. The gradient it gives its
// input x goes through a countOp, so a test can see whether that gradient
// is ever computed.
type mulOp struct{ calls *int }

func (op mulOp) Arity() int { return 2 }
func (op mulOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(&gorgonia.TensorType{Dims: 2, Of: a}, &gorgonia.TensorType{Dims: 1, Of: a}, &gorgonia.TensorType{Dims: 1, Of: a})
}
func (op mulOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return tensor.Shape{in[0].(tensor.Shape)[0]}, nil
}
func (op mulOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	return tensor.MatVecMul(in[0].(*tensor.Dense), in[1].(*tensor.Dense))
}
func (op mulOp) ReturnsPtr() bool      { return false }
func (op mulOp) CallsExtern() bool     { return false }
func (op mulOp) OverwritesInput() int  { return -1 }
func (op mulOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "mulOp") }
func (op mulOp) Hashcode() uint32      { return 1 }
func (op mulOp) String() string        { return "mul" }
func (op mulOp) DiffWRT(int) []bool    { return []bool{true, true} }
func (op mulOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	dx, err := gorgonia.ApplyOp(countOp(op), in[0]) // a stand-in of the right shape
	if err != nil {
		return nil, err
	}
	dw, err := gorgonia.Mul(gorgonia.Must(gorgonia.Transpose(in[0])), grad)
	return gorgonia.Nodes{dx, dw}, err
}

// countOp is the identity on a matrix that counts its runs.
type countOp mulOp

func (op countOp) Arity() int { return 1 }
func (op countOp) Type() hm.Type {
	t := &gorgonia.TensorType{Dims: 2, Of: hm.TypeVariable('a')}
	return hm.NewFnType(t, t)
}
func (op countOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return in[0].(tensor.Shape).Clone(), nil
}
func (op countOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	*op.calls++
	return in[0].(*tensor.Dense).Clone().(*tensor.Dense), nil
}
func (op countOp) ReturnsPtr() bool      { return false }
func (op countOp) CallsExtern() bool     { return false }
func (op countOp) OverwritesInput() int  { return -1 }
func (op countOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "countOp") }
func (op countOp) Hashcode() uint32      { return 2 }
func (op countOp) String() string        { return "count" }

// TestUnusedGradientsAreNotComputed checks that a training run computes
// only what the loss and the learnables' gradients need: gorgonia's
// symbolic differentiation also builds the gradient of the input x, which
// nothing reads, and the Machine must not run it.
func TestUnusedGradientsAreNotComputed(t *testing.T) {
	calls := 0
	build := func(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (Graph, error) {
		x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, 3), gorgonia.WithName("x"))
		h, err := gorgonia.ApplyOp(mulOp{&calls}, x, p[0])
		if err != nil {
			return Graph{}, err
		}
		return Graph{Loss: gorgonia.Must(gorgonia.Sum(h)), Inputs: gorgonia.Nodes{x}}, nil
	}
	m, err := New([]ParamSpec{{Name: "w", Shape: []int{3}}}, build)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	copy(m.Params()[0].Value, []float32{1, 2, 3})
	for range 2 {
		loss, err := m.Step(context.Background(), 2, func(mc *Machine) error {
			copy(mc.Input(0), []float32{1, 0, 0, 0, 1, 1})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if loss != 1+2+3 {
			t.Fatalf("loss %v, want 6", loss)
		}
		if g := m.Params()[0].Grad; !slices.Equal(g, []float32{1, 1, 1}) {
			t.Fatalf("gradient %v, want [1 1 1]", g)
		}
	}
	if calls != 0 {
		t.Fatalf("the input's gradient was computed %d times; nothing reads it", calls)
	}
}
