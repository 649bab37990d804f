package cpuops

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func randData(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// directConv is the convolution by its definition, in float64: y, and the
// gradients of sum(y*dy) with respect to x and f.
func directConv(g convGeom, x, f, dy []float32) (y, dx, df []float64) {
	y = make([]float64, g.n*g.m*g.oh*g.ow)
	dx = make([]float64, len(x))
	df = make([]float64, len(f))
	for n := 0; n < g.n; n++ {
		for m := 0; m < g.m; m++ {
			for oy := 0; oy < g.oh; oy++ {
				for ox := 0; ox < g.ow; ox++ {
					yi := ((n*g.m+m)*g.oh+oy)*g.ow + ox
					for c := 0; c < g.c; c++ {
						for ky := 0; ky < g.kh; ky++ {
							for kx := 0; kx < g.kw; kx++ {
								iy, ix := oy+ky-g.ph, ox+kx-g.pw
								if iy < 0 || iy >= g.h || ix < 0 || ix >= g.w {
									continue
								}
								xi := ((n*g.c+c)*g.h+iy)*g.w + ix
								fi := ((m*g.c+c)*g.kh+ky)*g.kw + kx
								y[yi] += float64(x[xi]) * float64(f[fi])
								dx[xi] += float64(dy[yi]) * float64(f[fi])
								df[fi] += float64(dy[yi]) * float64(x[xi])
							}
						}
					}
				}
			}
		}
	}
	return y, dx, df
}

func closeTo(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); d > tol*(1+math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestConvKernelsMatchTheDefinition checks the forward pass and both
// gradients against the definition of convolution over random shapes,
// paddings and kernel sizes.
func TestConvKernelsMatchTheDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for trial := 0; trial < 40; trial++ {
		kh, kw := 1+r.IntN(5), 1+r.IntN(5)
		h, w := kh+r.IntN(7), kw+r.IntN(7)
		xs := []int{1 + r.IntN(3), 1 + r.IntN(4), h, w}
		fs := []int{1 + r.IntN(6), xs[1], kh, kw}
		g := newConvGeom(xs, fs, r.IntN(kh), r.IntN(kw))
		t.Run(fmt.Sprintf("x%v_f%v_pad%d,%d", xs, fs, g.ph, g.pw), func(t *testing.T) {
			x := randData(r, g.n*g.c*g.h*g.w)
			f := randData(r, g.m*g.c*g.kh*g.kw)
			dy := randData(r, g.n*g.m*g.oh*g.ow)
			wantY, wantDX, wantDF := directConv(g, x, f, dy)
			var s convScratch
			y := make([]float32, len(wantY))
			dx := make([]float32, len(x))
			df := make([]float32, len(f))
			for i := range y { // stale contents must not leak into the results
				y[i] = 99
			}
			copy(dx, y[:min(len(y), len(dx))])
			convForward(g, x, f, y, &s)
			convInputGrad(g, f, dy, dx, &s)
			convFilterGrad(g, x, dy, df, &s)
			closeTo(t, "y", y, wantY, 1e-5)
			closeTo(t, "dx", dx, wantDX, 1e-5)
			closeTo(t, "df", df, wantDF, 1e-5)
		})
	}
}

// model is a small CNN built two ways: with this package's ops, or with
// gorgonia's Conv2d, Rectify and MaxPool2D. Its loss is
// sum(r * conv(reluMaxPool(conv(x, f1)), f2)) for a fixed random r.
type model struct {
	g         *gorgonia.ExprGraph
	x, f1, f2 *gorgonia.Node
	loss      *gorgonia.Node
	vm        gorgonia.VM
}

func buildModel(t *testing.T, ours bool, x, f1, f2 *tensor.Dense, r []float32, ph, pw int) *model {
	t.Helper()
	g := gorgonia.NewGraph()
	m := &model{g: g}
	m.x = gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(x.Shape()...), gorgonia.WithName("x"), gorgonia.WithValue(x.Clone()))
	m.f1 = gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(f1.Shape()...), gorgonia.WithName("f1"), gorgonia.WithValue(f1.Clone()))
	m.f2 = gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(f2.Shape()...), gorgonia.WithName("f2"), gorgonia.WithValue(f2.Clone()))
	var h *gorgonia.Node
	var err error
	if ours {
		if h, err = Conv2D(m.x, m.f1, 2, 1); err != nil {
			t.Fatal(err)
		}
		if h, err = ReLUMaxPool2D(h, ph, pw); err != nil {
			t.Fatal(err)
		}
		if h, err = Conv2D(h, m.f2, 1, 1); err != nil {
			t.Fatal(err)
		}
	} else {
		h = gorgonia.Must(gorgonia.Conv2d(m.x, m.f1, tensor.Shape{f1.Shape()[2], f1.Shape()[3]}, []int{2, 1}, []int{1, 1}, []int{1, 1}))
		h = gorgonia.Must(gorgonia.Rectify(h))
		h = gorgonia.Must(gorgonia.MaxPool2D(h, tensor.Shape{ph, pw}, []int{0, 0}, []int{ph, pw}))
		h = gorgonia.Must(gorgonia.Conv2d(h, m.f2, tensor.Shape{f2.Shape()[2], f2.Shape()[3]}, []int{1, 1}, []int{1, 1}, []int{1, 1}))
	}
	rt := gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(h.Shape()...), gorgonia.WithName("r"),
		gorgonia.WithValue(tensor.New(tensor.WithShape(h.Shape()...), tensor.WithBacking(append([]float32(nil), r...)))))
	m.loss = gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(h, rt))))
	if _, err := gorgonia.Grad(m.loss, m.x, m.f1, m.f2); err != nil {
		t.Fatal(err)
	}
	return m
}

// run runs m's machine once more (vm is compiled on the first call) with
// zeroed gradients, as gorgoniastep does, and returns the loss and the
// gradients.
func run(t *testing.T, m *model) (loss float32, dx, df1, df2 []float32) {
	t.Helper()
	if m.vm == nil {
		m.vm = gorgonia.NewTapeMachine(m.g, gorgonia.BindDualValues(m.x, m.f1, m.f2))
		t.Cleanup(func() { m.vm.Close() })
	}
	for _, n := range []*gorgonia.Node{m.x, m.f1, m.f2} {
		if v, err := n.Grad(); err == nil && v != nil {
			clear(v.Data().([]float32))
		}
	}
	m.vm.Reset()
	if err := m.vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	grad := func(n *gorgonia.Node) []float32 {
		v, err := n.Grad()
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), v.Data().([]float32)...)
	}
	return m.loss.Value().Data().(float32), grad(m.x), grad(m.f1), grad(m.f2)
}

// TestOpsMatchGorgoniasOps is the gradient check against the original ops:
// the same network built from gorgonia's Conv2d, Rectify and MaxPool2D
// and from this package's ops gives the same loss and the same gradients
// for the input and both filter banks, within float32 rounding.
func TestOpsMatchGorgoniasOps(t *testing.T) {
	// conv1: 11x9 -> 11x9 (padding 2, 1); pooled 2x2: 5x4 (an odd row and
	// column left over), or 3x2: 3x4 (the general path); conv2 keeps it.
	for _, win := range [][2]int{{2, 2}, {3, 2}} {
		t.Run(fmt.Sprintf("pool%dx%d", win[0], win[1]), func(t *testing.T) {
			r := rand.New(rand.NewPCG(2, uint64(win[0])))
			x := tensor.New(tensor.WithShape(3, 2, 11, 9), tensor.WithBacking(randData(r, 3*2*11*9)))
			f1 := tensor.New(tensor.WithShape(4, 2, 5, 3), tensor.WithBacking(randData(r, 4*2*5*3)))
			f2 := tensor.New(tensor.WithShape(5, 4, 3, 3), tensor.WithBacking(randData(r, 5*4*3*3)))
			rv := randData(r, 3*5*(11/win[0])*(9/win[1]))
			ours := buildModel(t, true, x, f1, f2, rv, win[0], win[1])
			theirs := buildModel(t, false, x, f1, f2, rv, win[0], win[1])
			l1, dx1, da1, db1 := run(t, ours)
			l2, dx2, da2, db2 := run(t, theirs)
			if d := math.Abs(float64(l1 - l2)); d > 1e-4*(1+math.Abs(float64(l2))) {
				t.Fatalf("loss %v, gorgonia's ops %v", l1, l2)
			}
			cmp := func(what string, got, want []float32) {
				t.Helper()
				w := make([]float64, len(want))
				nonzero := 0
				for i, v := range want {
					w[i] = float64(v)
					if v != 0 {
						nonzero++
					}
				}
				if nonzero == 0 {
					t.Fatalf("%s: gorgonia's gradient is all zero; the check would prove nothing", what)
				}
				closeTo(t, what, got, w, 1e-4)
			}
			cmp("d loss/d x", dx1, dx2)
			cmp("d loss/d f1", da1, da2)
			cmp("d loss/d f2", db1, db2)
			// A second run of the same machine gives the same bits (buffers
			// reused, nothing accumulated).
			l3, dx3, da3, db3 := run(t, ours)
			if l3 != l1 {
				t.Fatalf("second run: loss %v, first %v", l3, l1)
			}
			for i, pair := range [][2][]float32{{dx1, dx3}, {da1, da3}, {db1, db3}} {
				for j := range pair[0] {
					if math.Float32bits(pair[0][j]) != math.Float32bits(pair[1][j]) {
						t.Fatalf("second run: gradient %d[%d] %v, first %v", i, j, pair[1][j], pair[0][j])
					}
				}
			}
		})
	}
}

// TestGradientsMatchFiniteDifferences checks the gradient ops of Conv2D
// and ReLUMaxPool2D against central differences of the forward ops, in
// float64, for every element of the filters and of the input.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	xs, fs := []int{2, 2, 6, 6}, []int{3, 2, 3, 3}
	g := newConvGeom(xs, fs, 1, 1)
	pg := newPoolGeom([]int{g.n, g.m, g.oh, g.ow}, 2, 2)
	x := randData(r, 2*2*6*6)
	f := randData(r, 3*2*3*3)
	rv := randData(r, pg.n*pg.c*pg.oh*pg.ow)
	var s convScratch
	y := make([]float32, g.n*g.m*g.oh*g.ow)
	p := make([]float32, len(rv))
	loss := func() float64 {
		convForward(g, x, f, y, &s)
		reluMaxPool(pg, y, p)
		l := 0.0
		for i := range p {
			l += float64(p[i]) * float64(rv[i])
		}
		return l
	}
	loss()
	dy := make([]float32, len(y))
	reluMaxPoolGrad(pg, y, rv, dy)
	dx, df := make([]float32, len(x)), make([]float32, len(f))
	convInputGrad(g, f, dy, dx, &s)
	convFilterGrad(g, x, dy, df, &s)
	const eps = 1e-2
	check := func(what string, vals, grad []float32) {
		var diff, norm float64
		for i := range vals {
			orig := vals[i]
			vals[i] = orig + eps
			lp := loss()
			vals[i] = orig - eps
			lm := loss()
			vals[i] = orig
			fd := (lp - lm) / (2 * eps)
			diff += (fd - float64(grad[i])) * (fd - float64(grad[i]))
			norm += fd * fd
		}
		// A relative L2 error: a perturbation may cross a ReLU or max-pool
		// kink, which moves a single finite difference.
		if rel := math.Sqrt(diff / norm); !(rel < 0.02) || norm == 0 {
			t.Errorf("%s: relative error %.4f between gradient and finite differences", what, rel)
		}
	}
	check("filters", f, df)
	check("input", x, dx)
}

// TestRunsReuseTheirBuffers checks that a node returns the same output
// tensor run after run and that a run allocates nothing.
func TestRunsReuseTheirBuffers(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	x := tensor.New(tensor.WithShape(2, 3, 8, 8), tensor.WithBacking(randData(r, 2*3*8*8)))
	f := tensor.New(tensor.WithShape(4, 3, 5, 5), tensor.WithBacking(randData(r, 4*3*5*5)))
	dy := tensor.New(tensor.WithShape(2, 4, 8, 8), tensor.WithBacking(randData(r, 2*4*8*8)))
	pdy := tensor.New(tensor.WithShape(2, 4, 4, 4), tensor.WithBacking(randData(r, 2*4*4*4)))
	cases := []struct {
		name string
		op   gorgonia.Op
		in   []gorgonia.Value
	}{
		{"Conv2D", &convOp{ph: 2, pw: 2}, []gorgonia.Value{x, f}},
		{"Conv2DFilterGrad", &convFilterGradOp{ph: 2, pw: 2, f: tensor.Shape{4, 3, 5, 5}}, []gorgonia.Value{x, dy}},
		{"Conv2DInputGrad", &convInputGradOp{ph: 2, pw: 2, x: tensor.Shape{2, 3, 8, 8}}, []gorgonia.Value{f, dy}},
		{"ReLUMaxPool2D", &poolOp{kh: 2, kw: 2}, []gorgonia.Value{dy}},
		{"ReLUMaxPool2D keeping winners", &poolOp{kh: 2, kw: 2, keep: true}, []gorgonia.Value{dy}},
		{"ReLUMaxPool2DGrad", &poolGradOp{kh: 2, kw: 2}, []gorgonia.Value{dy, pdy}},
	}
	for _, tc := range cases {
		first, err := tc.op.Do(tc.in...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := append([]float32(nil), first.Data().([]float32)...)
		allocs := testing.AllocsPerRun(5, func() {
			v, err := tc.op.Do(tc.in...)
			if err != nil || v != first {
				t.Fatalf("%s: run returned %p (%v), first run %p", tc.name, v, err, first)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per run, want 0", tc.name, allocs)
		}
		for i, v := range first.Data().([]float32) {
			if math.Float32bits(v) != math.Float32bits(want[i]) {
				t.Fatalf("%s: element %d changed between runs", tc.name, i)
			}
		}
	}
}

func TestRejectsBadInput(t *testing.T) {
	g := gorgonia.NewGraph()
	x := gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(1, 2, 5, 5), gorgonia.WithName("x"))
	f := gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(3, 2, 3, 3), gorgonia.WithName("f"))
	f1c := gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(3, 1, 3, 3), gorgonia.WithName("f1c"))
	big := gorgonia.NewTensor(g, tensor.Float32, 4, gorgonia.WithShape(3, 2, 9, 9), gorgonia.WithName("big"))
	x64 := gorgonia.NewTensor(g, tensor.Float64, 4, gorgonia.WithShape(1, 2, 5, 5), gorgonia.WithName("x64"))
	m := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(2, 5), gorgonia.WithName("m"))
	for name, f := range map[string]func() error{
		"channels":      func() error { _, err := Conv2D(x, f1c, 1, 1); return err },
		"pad >= kernel": func() error { _, err := Conv2D(x, f, 3, 1); return err },
		"negative pad":  func() error { _, err := Conv2D(x, f, -1, 0); return err },
		"too big":       func() error { _, err := Conv2D(x, big, 0, 0); return err },
		"float64":       func() error { _, err := Conv2D(x64, f, 1, 1); return err },
		"matrix":        func() error { _, err := Conv2D(m, f, 1, 1); return err },
		"nil":           func() error { _, err := Conv2D(nil, f, 1, 1); return err },
		"window":        func() error { _, err := ReLUMaxPool2D(x, 6, 2); return err },
		"zero window":   func() error { _, err := ReLUMaxPool2D(x, 0, 2); return err },
		"pool matrix":   func() error { _, err := ReLUMaxPool2D(m, 2, 2); return err },
	} {
		if err := f(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	// A value that does not fit the op is an error at run time, not a panic.
	op := &convOp{ph: 1, pw: 1}
	bad := tensor.New(tensor.WithShape(1, 3, 5, 5), tensor.Of(tensor.Float32))
	filt := tensor.New(tensor.WithShape(3, 2, 3, 3), tensor.Of(tensor.Float32))
	if _, err := op.Do(bad, filt); !errors.Is(err, ErrBadInput) {
		t.Errorf("Do with mismatched channels: %v", err)
	}
	if _, err := op.Do(tensor.New(tensor.WithShape(1, 2, 5, 5), tensor.Of(tensor.Float64)), filt); !errors.Is(err, ErrBadInput) {
		t.Errorf("Do with float64: %v", err)
	}
}

// TestDenseMatchesGorgoniasOps checks Dense against gorgonia's Mul and
// BroadcastAdd: the same loss and gradients for the input, the weights and
// the bias (and without a bias), and the same bits run after run.
func TestDenseMatchesGorgoniasOps(t *testing.T) {
	for _, bias := range []bool{true, false} {
		t.Run(fmt.Sprintf("bias=%v", bias), func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, 5))
			const n, in, out = 7, 13, 5
			xv, wv, bv, rv := randData(r, n*in), randData(r, in*out), randData(r, out), randData(r, n*out)
			build := func(ours bool) (g *gorgonia.ExprGraph, loss *gorgonia.Node, wrt gorgonia.Nodes) {
				g = gorgonia.NewGraph()
				mk := func(name string, v []float32, shape ...int) *gorgonia.Node {
					return gorgonia.NewTensor(g, tensor.Float32, len(shape), gorgonia.WithShape(shape...), gorgonia.WithName(name),
						gorgonia.WithValue(tensor.New(tensor.WithShape(shape...), tensor.WithBacking(append([]float32(nil), v...)))))
				}
				x, w, b, rr := mk("x", xv, n, in), mk("w", wv, in, out), mk("b", bv, out), mk("r", rv, n, out)
				wrt = gorgonia.Nodes{x, w}
				if !bias {
					b = nil
				} else {
					wrt = append(wrt, b)
				}
				var y *gorgonia.Node
				var err error
				if ours {
					if y, err = Dense(x, w, b); err != nil {
						t.Fatal(err)
					}
				} else {
					y = gorgonia.Must(gorgonia.Mul(x, w))
					if b != nil {
						y = gorgonia.Must(gorgonia.BroadcastAdd(y, b, nil, []byte{0}))
					}
				}
				loss = gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, rr))))
				if _, err := gorgonia.Grad(loss, wrt...); err != nil {
					t.Fatal(err)
				}
				return g, loss, wrt
			}
			runOnce := func(g *gorgonia.ExprGraph, loss *gorgonia.Node, wrt gorgonia.Nodes, vm gorgonia.VM) (float32, [][]float32) {
				for _, n := range wrt {
					if v, err := n.Grad(); err == nil && v != nil {
						clear(v.Data().([]float32))
					}
				}
				vm.Reset()
				if err := vm.RunAll(); err != nil {
					t.Fatal(err)
				}
				var grads [][]float32
				for _, n := range wrt {
					v, err := n.Grad()
					if err != nil {
						t.Fatal(err)
					}
					grads = append(grads, append([]float32(nil), v.Data().([]float32)...))
				}
				return loss.Value().Data().(float32), grads
			}
			g1, l1, w1 := build(true)
			g2, l2, w2 := build(false)
			vm1 := gorgonia.NewTapeMachine(g1, gorgonia.BindDualValues(w1...))
			vm2 := gorgonia.NewTapeMachine(g2, gorgonia.BindDualValues(w2...))
			defer vm1.Close()
			defer vm2.Close()
			loss1, grads1 := runOnce(g1, l1, w1, vm1)
			loss2, grads2 := runOnce(g2, l2, w2, vm2)
			if d := math.Abs(float64(loss1 - loss2)); d > 1e-4*(1+math.Abs(float64(loss2))) {
				t.Fatalf("loss %v, gorgonia's ops %v", loss1, loss2)
			}
			for i := range grads1 {
				want := make([]float64, len(grads2[i]))
				for j, v := range grads2[i] {
					want[j] = float64(v)
				}
				closeTo(t, "gradient of "+w1[i].Name(), grads1[i], want, 1e-5)
			}
			again, grads3 := runOnce(g1, l1, w1, vm1)
			if again != loss1 {
				t.Fatalf("second run: loss %v, first %v", again, loss1)
			}
			for i := range grads1 {
				for j := range grads1[i] {
					if math.Float32bits(grads1[i][j]) != math.Float32bits(grads3[i][j]) {
						t.Fatalf("second run: gradient of %s[%d] changed", w1[i].Name(), j)
					}
				}
			}
		})
	}
}

func TestDenseRunsReuseBuffersAndRejectsBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	x := tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(randData(r, 12)))
	w := tensor.New(tensor.WithShape(4, 5), tensor.WithBacking(randData(r, 20)))
	b := tensor.New(tensor.WithShape(5), tensor.WithBacking(randData(r, 5)))
	dy := tensor.New(tensor.WithShape(3, 5), tensor.WithBacking(randData(r, 15)))
	for name, c := range map[string]struct {
		op gorgonia.Op
		in []gorgonia.Value
	}{
		"Dense":           {&denseOp{bias: true}, []gorgonia.Value{x, w, b}},
		"DenseInputGrad":  {&denseGradOp{wrt: 0}, []gorgonia.Value{w, dy}},
		"DenseWeightGrad": {&denseGradOp{wrt: 1}, []gorgonia.Value{x, dy}},
		"DenseBiasGrad":   {&denseGradOp{wrt: 2}, []gorgonia.Value{dy}},
	} {
		first, err := c.op.Do(c.in...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if allocs := testing.AllocsPerRun(5, func() {
			if v, err := c.op.Do(c.in...); err != nil || v != first {
				t.Fatalf("%s: %p, %v; first run %p", name, v, err, first)
			}
		}); allocs != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, allocs)
		}
	}
	g := gorgonia.NewGraph()
	xn := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(3, 4), gorgonia.WithName("x"))
	wn := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(5, 5), gorgonia.WithName("w"))
	wok := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(4, 5), gorgonia.WithName("wok"))
	bn := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(4), gorgonia.WithName("b"))
	if _, err := Dense(xn, wn, nil); !errors.Is(err, ErrBadInput) {
		t.Errorf("Dense with mismatched features: %v", err)
	}
	if _, err := Dense(xn, wok, bn); !errors.Is(err, ErrBadInput) {
		t.Errorf("Dense with a bias of the wrong length: %v", err)
	}
	if _, err := Dense(xn, wok, xn); !errors.Is(err, ErrBadInput) {
		t.Errorf("Dense with a matrix bias: %v", err)
	}
	if _, err := (&denseOp{}).Do(x, b); !errors.Is(err, ErrBadInput) {
		t.Errorf("Do with a vector for weights: %v", err)
	}
}

// TestPoolGradUsesOnlyFreshWinners checks that the gradient of
// ReLUMaxPool2D takes the windows' winners from its forward op only when
// that op ran on the same input since: otherwise it finds them again, and
// either way the bits are those of the direct computation.
func TestPoolGradUsesOnlyFreshWinners(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	fwd := &poolOp{kh: 2, kw: 2, keep: true}
	bwd := &poolGradOp{kh: 2, kw: 2, fwd: fwd}
	shape := []int{2, 3, 7, 6} // an odd row left over
	g := newPoolGeom(shape, 2, 2)
	mk := func(n int) *tensor.Dense {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(randData(r, n)))
	}
	x1, x2 := mk(2*3*7*6), mk(2*3*7*6)
	dy := tensor.New(tensor.WithShape(2, 3, 3, 3), tensor.WithBacking(randData(r, 2*3*3*3)))
	check := func(what string, x *tensor.Dense) {
		t.Helper()
		got, err := bwd.Do(x, dy)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, x.Shape().TotalSize())
		reluMaxPoolGrad(g, x.Float32s(), dy.Float32s(), want)
		for i, v := range got.(*tensor.Dense).Float32s() {
			if math.Float32bits(v) != math.Float32bits(want[i]) {
				t.Fatalf("%s: dx[%d] = %v, want %v", what, i, v, want[i])
			}
		}
	}
	if _, err := fwd.Do(x1); err != nil {
		t.Fatal(err)
	}
	before := bwd.used
	check("fresh winners", x1)
	if bwd.used == before {
		t.Fatal("the gradient op did not use the forward op's winners")
	}
	copy(x1.Float32s(), randData(r, 2*3*7*6)) // new values, no forward run
	check("stale winners", x1)
	if _, err := fwd.Do(x1); err != nil {
		t.Fatal(err)
	}
	check("another input", x2)
}

// TestReLUAndSoftmaxCrossEntropyMatchGorgoniasOps checks ReLU and
// SoftmaxCrossEntropy against gorgonia's Rectify and its Neg(Sum(
// HadamardProd(y, LogSoftMax(·)))) chain: the same loss and gradient, for
// one-hot and for soft targets, and the same bits run after run.
func TestReLUAndSoftmaxCrossEntropyMatchGorgoniasOps(t *testing.T) {
	for _, soft := range []bool{false, true} {
		t.Run(fmt.Sprintf("soft=%v", soft), func(t *testing.T) {
			r := rand.New(rand.NewPCG(10, 10))
			const n, k = 6, 5
			xv := randData(r, n*k)
			for i := range xv {
				xv[i] *= 3
			}
			yv := make([]float32, n*k)
			for i := 0; i < n; i++ {
				if soft {
					for j := 0; j < k; j++ {
						yv[i*k+j] = r.Float32()
					}
				} else {
					yv[i*k+r.IntN(k)] = 1
				}
			}
			build := func(ours bool) (*gorgonia.ExprGraph, *gorgonia.Node, *gorgonia.Node) {
				g := gorgonia.NewGraph()
				x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(n, k), gorgonia.WithName("x"),
					gorgonia.WithValue(tensor.New(tensor.WithShape(n, k), tensor.WithBacking(append([]float32(nil), xv...)))))
				y := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(n, k), gorgonia.WithName("y"),
					gorgonia.WithValue(tensor.New(tensor.WithShape(n, k), tensor.WithBacking(append([]float32(nil), yv...)))))
				var loss *gorgonia.Node
				if ours {
					h, err := ReLU(x)
					if err != nil {
						t.Fatal(err)
					}
					if loss, err = SoftmaxCrossEntropy(h, y); err != nil {
						t.Fatal(err)
					}
				} else {
					h := gorgonia.Must(gorgonia.Rectify(x))
					loss = gorgonia.Must(gorgonia.Neg(gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, gorgonia.Must(gorgonia.LogSoftMax(h))))))))
				}
				if _, err := gorgonia.Grad(loss, x); err != nil {
					t.Fatal(err)
				}
				return g, x, loss
			}
			run := func(g *gorgonia.ExprGraph, x, loss *gorgonia.Node, vm gorgonia.VM) (float32, []float32) {
				if v, err := x.Grad(); err == nil && v != nil {
					clear(v.Data().([]float32))
				}
				vm.Reset()
				if err := vm.RunAll(); err != nil {
					t.Fatal(err)
				}
				v, err := x.Grad()
				if err != nil {
					t.Fatal(err)
				}
				return loss.Value().Data().(float32), append([]float32(nil), v.Data().([]float32)...)
			}
			g1, x1, l1 := build(true)
			g2, x2, l2 := build(false)
			vm1 := gorgonia.NewTapeMachine(g1, gorgonia.BindDualValues(x1))
			vm2 := gorgonia.NewTapeMachine(g2, gorgonia.BindDualValues(x2))
			defer vm1.Close()
			defer vm2.Close()
			loss1, d1 := run(g1, x1, l1, vm1)
			loss2, d2 := run(g2, x2, l2, vm2)
			if d := math.Abs(float64(loss1 - loss2)); d > 1e-5*(1+math.Abs(float64(loss2))) {
				t.Fatalf("loss %v, gorgonia's ops %v", loss1, loss2)
			}
			want := make([]float64, len(d2))
			for i, v := range d2 {
				want[i] = float64(v)
			}
			closeTo(t, "d loss/d x", d1, want, 1e-5)
			again, d3 := run(g1, x1, l1, vm1)
			if again != loss1 {
				t.Fatalf("second run: loss %v, first %v", again, loss1)
			}
			for i := range d1 {
				if math.Float32bits(d1[i]) != math.Float32bits(d3[i]) {
					t.Fatalf("second run: gradient [%d] changed", i)
				}
			}
		})
	}
}

func TestReLUAndSoftmaxCrossEntropyReuseBuffersAndRejectBadInput(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	z := tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(randData(r, 12)))
	y := tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(randData(r, 12)))
	one := gorgonia.F32(1)
	for name, c := range map[string]struct {
		op gorgonia.Op
		in []gorgonia.Value
	}{
		"ReLU":                    {&reluOp{dims: 2}, []gorgonia.Value{z}},
		"ReLUGrad":                {&reluGradOp{dims: 2}, []gorgonia.Value{z, y}},
		"SoftmaxCrossEntropy":     {&xentOp{}, []gorgonia.Value{z, y}},
		"SoftmaxCrossEntropyGrad": {&xentGradOp{}, []gorgonia.Value{z, y, &one}},
	} {
		first, err := c.op.Do(c.in...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if allocs := testing.AllocsPerRun(5, func() {
			if v, err := c.op.Do(c.in...); err != nil || v != first {
				t.Fatalf("%s: %p, %v; first run %p", name, v, err, first)
			}
		}); allocs != 0 {
			t.Errorf("%s: %v allocations per run, want 0", name, allocs)
		}
	}
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(3, 4), gorgonia.WithName("a"))
	b := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(3, 5), gorgonia.WithName("b"))
	v := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(4), gorgonia.WithName("v"))
	f64 := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(3, 4), gorgonia.WithName("f64"))
	for name, f := range map[string]func() error{
		"shapes":  func() error { _, err := SoftmaxCrossEntropy(a, b); return err },
		"vector":  func() error { _, err := SoftmaxCrossEntropy(v, v); return err },
		"float64": func() error { _, err := ReLU(f64); return err },
		"nil":     func() error { _, err := ReLU(nil); return err },
	} {
		if err := f(); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
}
