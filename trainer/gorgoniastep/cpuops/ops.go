package cpuops

import (
	"errors"
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ErrBadInput reports a node or value these ops cannot take: not a
// float32 tensor of four dimensions, mismatched channels, a padding or
// window that does not fit.
var ErrBadInput = errors.New("cpuops: bad input")

// Conv2D returns the node of the 2-D convolution of x (n, c, h, w) with the
// filters f (m, c, kh, kw), stride 1, zero padding ph rows above and below
// and pw columns left and right: shape (n, m, h+2ph-kh+1, w+2pw-kw+1),
// float32, NCHW. It computes what gorgonia.Conv2d(x, f, (kh, kw), (ph, pw),
// (1, 1), (1, 1)) computes (a cross-correlation, as in PyTorch), with
// gradients for both x and f.
//
// Requirements (ErrBadInput otherwise): x and f are float32 tensors of
// four dimensions in the same graph, with the same channel count c;
// 0 <= ph < kh and 0 <= pw < kw; the output has at least one row and
// column.
//
// Each node owns its output and scratch buffers and reuses them in every
// run; see the package documentation.
func Conv2D(x, f *gorgonia.Node, ph, pw int) (*gorgonia.Node, error) {
	if err := check4D(x, "input"); err != nil {
		return nil, err
	}
	if err := check4D(f, "filters"); err != nil {
		return nil, err
	}
	xs, fs := x.Shape(), f.Shape()
	if xs[1] != fs[1] {
		return nil, fmt.Errorf("%w: input %v has %d channels, filters %v expect %d", ErrBadInput, xs, xs[1], fs, fs[1])
	}
	if ph < 0 || pw < 0 || ph >= fs[2] || pw >= fs[3] {
		return nil, fmt.Errorf("%w: padding (%d, %d) for a %dx%d kernel: want 0 <= padding < kernel size", ErrBadInput, ph, pw, fs[2], fs[3])
	}
	if g := newConvGeom(xs, fs, ph, pw); g.oh < 1 || g.ow < 1 {
		return nil, fmt.Errorf("%w: a %dx%d kernel with padding (%d, %d) does not fit a %dx%d image", ErrBadInput, fs[2], fs[3], ph, pw, xs[2], xs[3])
	}
	return gorgonia.ApplyOp(&convOp{ph: ph, pw: pw}, x, f)
}

// ReLUMaxPool2D returns the node of max(0, x) max-pooled over
// non-overlapping kh×kw windows (stride (kh, kw), no padding): shape
// (n, c, h/kh, w/kw) for x (n, c, h, w); trailing rows and columns that
// fill no window are dropped. It computes
// gorgonia.MaxPool2D(gorgonia.Rectify(x), (kh, kw), (0, 0), (kh, kw)) in
// one pass. The gradient reaches, in each window, the largest input (the
// first in row-major order among equals) when it is positive.
//
// Requirements (ErrBadInput otherwise): x is a float32 tensor of four
// dimensions; 1 <= kh <= h and 1 <= kw <= w.
func ReLUMaxPool2D(x *gorgonia.Node, kh, kw int) (*gorgonia.Node, error) {
	if err := check4D(x, "input"); err != nil {
		return nil, err
	}
	xs := x.Shape()
	if kh < 1 || kw < 1 || kh > xs[2] || kw > xs[3] {
		return nil, fmt.Errorf("%w: a %dx%d window for a %dx%d image", ErrBadInput, kh, kw, xs[2], xs[3])
	}
	return gorgonia.ApplyOp(&poolOp{kh: kh, kw: kw}, x)
}

func check4D(n *gorgonia.Node, what string) error {
	if n == nil {
		return fmt.Errorf("%w: nil %s node", ErrBadInput, what)
	}
	if n.Dtype() != tensor.Float32 {
		return fmt.Errorf("%w: %s %q has dtype %v, want float32", ErrBadInput, what, n.Name(), n.Dtype())
	}
	if s := n.Shape(); len(s) != 4 {
		return fmt.Errorf("%w: %s %q has shape %v, want four dimensions (n, c, h, w)", ErrBadInput, what, n.Name(), s)
	}
	return nil
}

// tensor4 is the type of every input and output of these ops.
func tensor4() hm.Type { return &gorgonia.TensorType{Dims: 4, Of: hm.TypeVariable('a')} }

// buffer is an op's output tensor, allocated on first use and returned by
// every later run.
type buffer struct{ t *tensor.Dense }

// get returns the (a, b, c, d) float32 tensor, allocating it only when
// there is none of that shape yet.
func (b *buffer) get(a, bb, c, d int) (*tensor.Dense, []float32) {
	if b.t == nil || !same4(b.t.Shape(), a, bb, c, d) {
		b.t = tensor.New(tensor.WithShape(a, bb, c, d), tensor.Of(tensor.Float32))
	}
	return b.t, b.t.Float32s()
}

func same4(s tensor.Shape, a, b, c, d int) bool {
	return len(s) == 4 && s[0] == a && s[1] == b && s[2] == c && s[3] == d
}

// float32s returns the contiguous data and the shape of a float32 tensor
// value of four dimensions, without allocating.
func float32s(v gorgonia.Value, what string) ([]float32, tensor.Shape, error) {
	return vals(v, what, 4)
}

func shapeOf(d gorgonia.DimSizer, what string) (tensor.Shape, error) {
	s, ok := d.(tensor.Shape)
	if !ok || len(s) != 4 {
		return nil, fmt.Errorf("%w: %s shape %v, want four dimensions", ErrBadInput, what, d)
	}
	return s, nil
}

func writeHash(h hash.Hash, name string, vals ...int) {
	fmt.Fprintf(h, "%s%v", name, vals)
}

func hashcode(name string, vals ...int) uint32 {
	h := fnv.New32a()
	writeHash(h, name, vals...)
	return h.Sum32()
}

// opBase holds the methods every op here shares.
type opBase struct{}

func (opBase) ReturnsPtr() bool     { return false }
func (opBase) CallsExtern() bool    { return false }
func (opBase) OverwritesInput() int { return -1 }

// convOp is Conv2D: inputs (x, f), output y.
type convOp struct {
	opBase
	ph, pw int
	out    buffer
	s      convScratch
}

func (op *convOp) Arity() int            { return 2 }
func (op *convOp) Type() hm.Type         { t := tensor4(); return hm.NewFnType(t, t, t) }
func (op *convOp) String() string        { return fmt.Sprintf("cpuops.Conv2D(pad=%d,%d)", op.ph, op.pw) }
func (op *convOp) WriteHash(h hash.Hash) { writeHash(h, "cpuops.Conv2D", op.ph, op.pw) }
func (op *convOp) Hashcode() uint32      { return hashcode("cpuops.Conv2D", op.ph, op.pw) }

func (op *convOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: Conv2D takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	xs, err := shapeOf(in[0], "input")
	if err != nil {
		return nil, err
	}
	fs, err := shapeOf(in[1], "filters")
	if err != nil {
		return nil, err
	}
	g := newConvGeom(xs, fs, op.ph, op.pw)
	return tensor.Shape{g.n, g.m, g.oh, g.ow}, nil
}

func (op *convOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: Conv2D takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	x, xs, err := float32s(in[0], "Conv2D input")
	if err != nil {
		return nil, err
	}
	f, fs, err := float32s(in[1], "Conv2D filters")
	if err != nil {
		return nil, err
	}
	g, err := checkConv(xs, fs, op.ph, op.pw)
	if err != nil {
		return nil, err
	}
	t, y := op.out.get(g.n, g.m, g.oh, g.ow)
	convForward(g, x, f, y, &op.s)
	return t, nil
}

func checkConv(xs, fs tensor.Shape, ph, pw int) (convGeom, error) {
	g := newConvGeom(xs, fs, ph, pw)
	if xs[1] != fs[1] || ph >= g.kh || pw >= g.kw || g.oh < 1 || g.ow < 1 {
		return g, fmt.Errorf("%w: Conv2D of %v with filters %v and padding (%d, %d)", ErrBadInput, xs, fs, ph, pw)
	}
	return g, nil
}

func (op *convOp) DiffWRT(int) []bool { return []bool{true, true} }

func (op *convOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: Conv2D takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	x, f := in[0], in[1]
	dx, err := gorgonia.ApplyOp(&convInputGradOp{ph: op.ph, pw: op.pw, x: x.Shape().Clone()}, f, grad)
	if err != nil {
		return nil, err
	}
	df, err := gorgonia.ApplyOp(&convFilterGradOp{ph: op.ph, pw: op.pw, f: f.Shape().Clone()}, x, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx, df}, nil
}

// convFilterGradOp: inputs (x, dy), output df with the filters' shape.
type convFilterGradOp struct {
	opBase
	rowSplit // a RowSplitter over the images
	ph, pw   int
	f        tensor.Shape
	out      buffer
	s        convScratch
}

func (op *convFilterGradOp) Arity() int    { return 2 }
func (op *convFilterGradOp) Type() hm.Type { t := tensor4(); return hm.NewFnType(t, t, t) }
func (op *convFilterGradOp) String() string {
	return fmt.Sprintf("cpuops.Conv2DFilterGrad(pad=%d,%d)", op.ph, op.pw)
}
func (op *convFilterGradOp) WriteHash(h hash.Hash) {
	writeHash(h, "cpuops.Conv2DFilterGrad", append([]int{op.ph, op.pw}, op.f...)...)
}
func (op *convFilterGradOp) Hashcode() uint32 {
	return hashcode("cpuops.Conv2DFilterGrad", append([]int{op.ph, op.pw}, op.f...)...)
}
func (op *convFilterGradOp) InferShape(...gorgonia.DimSizer) (tensor.Shape, error) {
	return op.f.Clone(), nil
}

func (op *convFilterGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: Conv2DFilterGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	x, xs, err := float32s(in[0], "Conv2DFilterGrad input")
	if err != nil {
		return nil, err
	}
	dy, ds, err := float32s(in[1], "Conv2DFilterGrad output gradient")
	if err != nil {
		return nil, err
	}
	g, err := checkConv(xs, op.f, op.ph, op.pw)
	if err != nil {
		return nil, err
	}
	if !same4(ds, g.n, g.m, g.oh, g.ow) {
		return nil, fmt.Errorf("%w: Conv2DFilterGrad: output gradient %v for output %v", ErrBadInput, ds, tensor.Shape{g.n, g.m, g.oh, g.ow})
	}
	t, own := op.out.get(op.f[0], op.f[1], op.f[2], op.f[3])
	b, err := op.ranges("cpuops.Conv2DFilterGrad", g.n, len(own))
	if err != nil {
		return nil, err
	}
	for r := range len(b) - 1 {
		// Images [lo, hi) alone, summed in image order as for a batch
		// of those images.
		lo, hi := b[r], b[r+1]
		gr := g
		gr.n = hi - lo
		convFilterGrad(gr, x[lo*g.c*g.h*g.w:], dy[lo*g.m*g.oh*g.ow:], op.target(r, len(b)-1, own), &op.s)
	}
	return t, nil
}

// SplitRows splits the filter gradient by images (see RowSplitter).
func (op *convFilterGradOp) SplitRows(bounds []int, dst [][]float32) bool {
	op.split(bounds, dst)
	return true
}

func (op *convFilterGradOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op *convFilterGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: Conv2DFilterGrad has no second derivative here", ErrBadInput)
}

// convInputGradOp: inputs (f, dy), output dx with the input's shape.
type convInputGradOp struct {
	opBase
	ph, pw int
	x      tensor.Shape
	out    buffer
	s      convScratch
}

func (op *convInputGradOp) Arity() int    { return 2 }
func (op *convInputGradOp) Type() hm.Type { t := tensor4(); return hm.NewFnType(t, t, t) }
func (op *convInputGradOp) String() string {
	return fmt.Sprintf("cpuops.Conv2DInputGrad(pad=%d,%d)", op.ph, op.pw)
}
func (op *convInputGradOp) WriteHash(h hash.Hash) {
	writeHash(h, "cpuops.Conv2DInputGrad", append([]int{op.ph, op.pw}, op.x...)...)
}
func (op *convInputGradOp) Hashcode() uint32 {
	return hashcode("cpuops.Conv2DInputGrad", append([]int{op.ph, op.pw}, op.x...)...)
}
func (op *convInputGradOp) InferShape(...gorgonia.DimSizer) (tensor.Shape, error) {
	return op.x.Clone(), nil
}

func (op *convInputGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: Conv2DInputGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	f, fs, err := float32s(in[0], "Conv2DInputGrad filters")
	if err != nil {
		return nil, err
	}
	dy, ds, err := float32s(in[1], "Conv2DInputGrad output gradient")
	if err != nil {
		return nil, err
	}
	g, err := checkConv(op.x, fs, op.ph, op.pw)
	if err != nil {
		return nil, err
	}
	if !same4(ds, g.n, g.m, g.oh, g.ow) {
		return nil, fmt.Errorf("%w: Conv2DInputGrad: output gradient %v for output %v", ErrBadInput, ds, tensor.Shape{g.n, g.m, g.oh, g.ow})
	}
	t, dx := op.out.get(op.x[0], op.x[1], op.x[2], op.x[3])
	convInputGrad(g, f, dy, dx, &op.s)
	return t, nil
}

func (op *convInputGradOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op *convInputGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: Conv2DInputGrad has no second derivative here", ErrBadInput)
}

// poolOp is ReLUMaxPool2D: input x, output y.
type poolOp struct {
	opBase
	kh, kw int
	out    buffer
	// For the gradient op of a training graph (set by SymDiff): the
	// winner of each 2x2 window in the last run, the input it was computed
	// from, and a count of runs.
	keep  bool
	codes []uint8
	from  *float32
	runs  uint64
}

func (op *poolOp) Arity() int            { return 1 }
func (op *poolOp) Type() hm.Type         { t := tensor4(); return hm.NewFnType(t, t) }
func (op *poolOp) String() string        { return fmt.Sprintf("cpuops.ReLUMaxPool2D(%dx%d)", op.kh, op.kw) }
func (op *poolOp) WriteHash(h hash.Hash) { writeHash(h, "cpuops.ReLUMaxPool2D", op.kh, op.kw) }
func (op *poolOp) Hashcode() uint32      { return hashcode("cpuops.ReLUMaxPool2D", op.kh, op.kw) }

func (op *poolOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLUMaxPool2D takes 1 input, got %d", ErrBadInput, len(in))
	}
	xs, err := shapeOf(in[0], "input")
	if err != nil {
		return nil, err
	}
	g := newPoolGeom(xs, op.kh, op.kw)
	return tensor.Shape{g.n, g.c, g.oh, g.ow}, nil
}

func (op *poolOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLUMaxPool2D takes 1 input, got %d", ErrBadInput, len(in))
	}
	x, xs, err := float32s(in[0], "ReLUMaxPool2D input")
	if err != nil {
		return nil, err
	}
	g, err := checkPool(xs, op.kh, op.kw)
	if err != nil {
		return nil, err
	}
	t, y := op.out.get(g.n, g.c, g.oh, g.ow)
	if op.keep && g.kh == 2 && g.kw == 2 {
		if n := g.n * g.c * g.oh * g.ow; cap(op.codes) < n {
			op.codes = make([]uint8, n)
		} else {
			op.codes = op.codes[:n]
		}
		reluMaxPool2x2Codes(g, x, y, op.codes)
		op.from, op.runs = &x[0], op.runs+1
		return t, nil
	}
	reluMaxPool(g, x, y)
	return t, nil
}

func checkPool(xs tensor.Shape, kh, kw int) (poolGeom, error) {
	g := newPoolGeom(xs, kh, kw)
	if g.oh < 1 || g.ow < 1 {
		return g, fmt.Errorf("%w: ReLUMaxPool2D of %v with a %dx%d window", ErrBadInput, xs, kh, kw)
	}
	return g, nil
}

func (op *poolOp) DiffWRT(int) []bool { return []bool{true} }

func (op *poolOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLUMaxPool2D takes 1 input, got %d", ErrBadInput, len(in))
	}
	op.keep = true
	dx, err := gorgonia.ApplyOp(&poolGradOp{kh: op.kh, kw: op.kw, fwd: op}, in[0], grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx}, nil
}

// poolGradOp: inputs (x, dy), output dx. It takes each window's winner
// from its forward op when that op has run on the same input since this
// op last ran (as in every run of a tape machine, forward before
// backward), and otherwise finds it again in x.
type poolGradOp struct {
	opBase
	kh, kw int
	out    buffer
	fwd    *poolOp
	used   uint64 // fwd.runs when this op last used fwd.codes
}

func (op *poolGradOp) Arity() int    { return 2 }
func (op *poolGradOp) Type() hm.Type { t := tensor4(); return hm.NewFnType(t, t, t) }
func (op *poolGradOp) String() string {
	return fmt.Sprintf("cpuops.ReLUMaxPool2DGrad(%dx%d)", op.kh, op.kw)
}
func (op *poolGradOp) WriteHash(h hash.Hash) { writeHash(h, "cpuops.ReLUMaxPool2DGrad", op.kh, op.kw) }
func (op *poolGradOp) Hashcode() uint32      { return hashcode("cpuops.ReLUMaxPool2DGrad", op.kh, op.kw) }

func (op *poolGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: ReLUMaxPool2DGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	xs, err := shapeOf(in[0], "input")
	if err != nil {
		return nil, err
	}
	return xs.Clone(), nil
}

func (op *poolGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: ReLUMaxPool2DGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	x, xs, err := float32s(in[0], "ReLUMaxPool2DGrad input")
	if err != nil {
		return nil, err
	}
	dy, ds, err := float32s(in[1], "ReLUMaxPool2DGrad output gradient")
	if err != nil {
		return nil, err
	}
	g, err := checkPool(xs, op.kh, op.kw)
	if err != nil {
		return nil, err
	}
	if !same4(ds, g.n, g.c, g.oh, g.ow) {
		return nil, fmt.Errorf("%w: ReLUMaxPool2DGrad: output gradient %v for output %v", ErrBadInput, ds, tensor.Shape{g.n, g.c, g.oh, g.ow})
	}
	t, dx := op.out.get(xs[0], xs[1], xs[2], xs[3])
	if f := op.fwd; f != nil && f.runs > op.used && f.from == &x[0] && len(f.codes) == len(dy) {
		op.used = f.runs
		reluMaxPool2x2GradCodes(g, f.codes, dy, dx)
		return t, nil
	}
	reluMaxPoolGrad(g, x, dy, dx)
	return t, nil
}

func (op *poolGradOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op *poolGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: ReLUMaxPool2DGrad has no second derivative here", ErrBadInput)
}
