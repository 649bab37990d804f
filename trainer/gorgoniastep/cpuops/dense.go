package cpuops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/internal/gemm"
)

// Dense returns the node of x·w + b, a fully connected layer: x (n, in),
// w (in, out), b (out), result (n, out), float32. b may be nil (no bias).
// It computes what gorgonia.BroadcastAdd(gorgonia.Mul(x, w), b, nil,
// []byte{0}) computes, with gradients for x, w and b, and no transposed
// copies: the gradient of w is xᵀ·dy and that of x is dy·wᵀ, each one
// matrix product that reads its operands in place.
//
// Requirements (ErrBadInput otherwise): x and w are float32 matrices and b
// a float32 vector of the shapes above, in one graph.
//
// Each node owns its output buffer and reuses it in every run; see the
// package documentation.
func Dense(x, w, b *gorgonia.Node) (*gorgonia.Node, error) {
	if err := checkDims(x, "input", 2); err != nil {
		return nil, err
	}
	if err := checkDims(w, "weights", 2); err != nil {
		return nil, err
	}
	xs, ws := x.Shape(), w.Shape()
	if xs[1] != ws[0] {
		return nil, fmt.Errorf("%w: input %v has %d features, weights %v expect %d", ErrBadInput, xs, xs[1], ws, ws[0])
	}
	if b == nil {
		return gorgonia.ApplyOp(&denseOp{}, x, w)
	}
	if err := checkDims(b, "bias", 1); err != nil {
		return nil, err
	}
	if bs := b.Shape(); bs[0] != ws[1] {
		return nil, fmt.Errorf("%w: bias %v for %d outputs", ErrBadInput, bs, ws[1])
	}
	return gorgonia.ApplyOp(&denseOp{bias: true}, x, w, b)
}

func checkDims(n *gorgonia.Node, what string, dims int) error {
	if n == nil {
		return fmt.Errorf("%w: nil %s node", ErrBadInput, what)
	}
	if n.Dtype() != tensor.Float32 {
		return fmt.Errorf("%w: %s %q has dtype %v, want float32", ErrBadInput, what, n.Name(), n.Dtype())
	}
	if s := n.Shape(); len(s) != dims {
		return fmt.Errorf("%w: %s %q has shape %v, want %d dimensions", ErrBadInput, what, n.Name(), s, dims)
	}
	return nil
}

func tensorN(dims int) hm.Type { return &gorgonia.TensorType{Dims: dims, Of: hm.TypeVariable('a')} }

// vals returns the contiguous data and shape of a float32 tensor value of
// dims dimensions, without allocating.
func vals(v gorgonia.Value, what string, dims int) ([]float32, tensor.Shape, error) {
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s is a %T, want *tensor.Dense", ErrBadInput, what, v)
	}
	if d.Dtype() != tensor.Float32 {
		return nil, nil, fmt.Errorf("%w: %s holds %v, want float32", ErrBadInput, what, d.Dtype())
	}
	if d.RequiresIterator() {
		return nil, nil, fmt.Errorf("%w: %s is a non-contiguous view", ErrBadInput, what)
	}
	s, sh := d.Float32s(), d.Shape()
	if len(sh) != dims || sh.TotalSize() != len(s) {
		return nil, nil, fmt.Errorf("%w: %s has shape %v, want %d dimensions", ErrBadInput, what, sh, dims)
	}
	return s, sh, nil
}

// buffer2 and buffer1 are buffers of matrices and vectors.
type buffer2 struct{ t *tensor.Dense }

func (b *buffer2) get(r, c int) (*tensor.Dense, []float32) {
	if s := shapeOrNil(b.t); len(s) != 2 || s[0] != r || s[1] != c {
		b.t = tensor.New(tensor.WithShape(r, c), tensor.Of(tensor.Float32))
	}
	return b.t, b.t.Float32s()
}

type buffer1 struct{ t *tensor.Dense }

func (b *buffer1) get(n int) (*tensor.Dense, []float32) {
	if s := shapeOrNil(b.t); len(s) != 1 || s[0] != n {
		b.t = tensor.New(tensor.WithShape(n), tensor.Of(tensor.Float32))
	}
	return b.t, b.t.Float32s()
}

func shapeOrNil(t *tensor.Dense) tensor.Shape {
	if t == nil {
		return nil
	}
	return t.Shape()
}

// denseOp is Dense: inputs (x, w[, b]), output y.
type denseOp struct {
	opBase
	bias bool
	out  buffer2
}

func (op *denseOp) Arity() int {
	if op.bias {
		return 3
	}
	return 2
}

func (op *denseOp) Type() hm.Type {
	if op.bias {
		return hm.NewFnType(tensorN(2), tensorN(2), tensorN(1), tensorN(2))
	}
	return hm.NewFnType(tensorN(2), tensorN(2), tensorN(2))
}

func (op *denseOp) String() string        { return fmt.Sprintf("cpuops.Dense(bias=%v)", op.bias) }
func (op *denseOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "cpuops.Dense(%v)", op.bias) }
func (op *denseOp) Hashcode() uint32      { return hashcode(fmt.Sprintf("cpuops.Dense(%v)", op.bias)) }

func (op *denseOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("%w: Dense takes %d inputs, got %d", ErrBadInput, op.Arity(), len(in))
	}
	xs, ok1 := in[0].(tensor.Shape)
	ws, ok2 := in[1].(tensor.Shape)
	if !ok1 || !ok2 || len(xs) != 2 || len(ws) != 2 {
		return nil, fmt.Errorf("%w: Dense of %v and %v", ErrBadInput, in[0], in[1])
	}
	return tensor.Shape{xs[0], ws[1]}, nil
}

func (op *denseOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("%w: Dense takes %d inputs, got %d", ErrBadInput, op.Arity(), len(in))
	}
	x, xs, err := vals(in[0], "Dense input", 2)
	if err != nil {
		return nil, err
	}
	w, ws, err := vals(in[1], "Dense weights", 2)
	if err != nil {
		return nil, err
	}
	if xs[1] != ws[0] {
		return nil, fmt.Errorf("%w: Dense of %v and %v", ErrBadInput, xs, ws)
	}
	n, k, m := xs[0], xs[1], ws[1]
	t, y := op.out.get(n, m)
	gemm.NN(n, m, k, x, k, 1, w, m, y, m, false)
	if op.bias {
		b, bs, err := vals(in[2], "Dense bias", 1)
		if err != nil {
			return nil, err
		}
		if bs[0] != m {
			return nil, fmt.Errorf("%w: Dense bias %v for %d outputs", ErrBadInput, bs, m)
		}
		for i := 0; i < n; i++ {
			row := y[i*m : (i+1)*m]
			for j := range row {
				row[j] += b[j]
			}
		}
	}
	return t, nil
}

func (op *denseOp) DiffWRT(n int) []bool {
	d := make([]bool, n)
	for i := range d {
		d[i] = true
	}
	return d
}

func (op *denseOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("%w: Dense takes %d inputs, got %d", ErrBadInput, op.Arity(), len(in))
	}
	x, w := in[0], in[1]
	dx, err := gorgonia.ApplyOp(&denseGradOp{wrt: 0}, w, grad)
	if err != nil {
		return nil, err
	}
	dw, err := gorgonia.ApplyOp(&denseGradOp{wrt: 1}, x, grad)
	if err != nil {
		return nil, err
	}
	if !op.bias {
		return gorgonia.Nodes{dx, dw}, nil
	}
	db, err := gorgonia.ApplyOp(&denseGradOp{wrt: 2}, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx, dw, db}, nil
}

// denseGradOp is one gradient of Dense, by wrt: 0, the input's
// (inputs w, dy; dy·wᵀ); 1, the weights' (inputs x, dy; xᵀ·dy); 2, the
// bias's (input dy; the sum of dy's rows, in row order).
type denseGradOp struct {
	opBase
	rowSplit // the weight and bias gradients are RowSplitters
	wrt      int
	out2     buffer2
	out1     buffer1
}

var denseGradNames = [3]string{"cpuops.DenseInputGrad", "cpuops.DenseWeightGrad", "cpuops.DenseBiasGrad"}

func (op *denseGradOp) Arity() int {
	if op.wrt == 2 {
		return 1
	}
	return 2
}

func (op *denseGradOp) Type() hm.Type {
	if op.wrt == 2 {
		return hm.NewFnType(tensorN(2), tensorN(1))
	}
	return hm.NewFnType(tensorN(2), tensorN(2), tensorN(2))
}

func (op *denseGradOp) String() string        { return denseGradNames[op.wrt] }
func (op *denseGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, denseGradNames[op.wrt]) }
func (op *denseGradOp) Hashcode() uint32      { return hashcode(denseGradNames[op.wrt]) }

func (op *denseGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("%w: %s takes %d inputs, got %d", ErrBadInput, op, op.Arity(), len(in))
	}
	a, ok := in[0].(tensor.Shape)
	if !ok || len(a) != 2 {
		return nil, fmt.Errorf("%w: %s of %v", ErrBadInput, op, in[0])
	}
	if op.wrt == 2 {
		return tensor.Shape{a[1]}, nil
	}
	d, ok := in[1].(tensor.Shape)
	if !ok || len(d) != 2 {
		return nil, fmt.Errorf("%w: %s of %v", ErrBadInput, op, in[1])
	}
	if op.wrt == 0 {
		return tensor.Shape{d[0], a[0]}, nil // (n, in) from w (in, out) and dy (n, out)
	}
	return tensor.Shape{a[1], d[1]}, nil // (in, out) from x (n, in) and dy (n, out)
}

func (op *denseGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != op.Arity() {
		return nil, fmt.Errorf("%w: %s takes %d inputs, got %d", ErrBadInput, op, op.Arity(), len(in))
	}
	if op.wrt == 2 {
		dy, ds, err := vals(in[0], "DenseBiasGrad output gradient", 2)
		if err != nil {
			return nil, err
		}
		n, m := ds[0], ds[1]
		b, err := op.ranges(op.String(), n, m)
		if err != nil {
			return nil, err
		}
		t, own := op.out1.get(m)
		for r := range len(b) - 1 {
			db := op.target(r, len(b)-1, own)
			clear(db)
			for i := b[r]; i < b[r+1]; i++ {
				for j, v := range dy[i*m : (i+1)*m] {
					db[j] += v
				}
			}
		}
		return t, nil
	}
	a, as, err := vals(in[0], "Dense gradient operand", 2)
	if err != nil {
		return nil, err
	}
	dy, ds, err := vals(in[1], "Dense output gradient", 2)
	if err != nil {
		return nil, err
	}
	if op.wrt == 0 { // a = w (in, out), dy (n, out): dx = dy·wᵀ (n, in)
		k, m, n := as[0], as[1], ds[0]
		if ds[1] != m {
			return nil, fmt.Errorf("%w: %s of %v and %v", ErrBadInput, op, as, ds)
		}
		t, dx := op.out2.get(n, k)
		gemm.NT(n, k, m, dy, m, a, m, dx, k, false)
		return t, nil
	}
	// a = x (n, in), dy (n, out): dw = xᵀ·dy (in, out)
	n, k, m := as[0], as[1], ds[1]
	if ds[0] != n {
		return nil, fmt.Errorf("%w: %s of %v and %v", ErrBadInput, op, as, ds)
	}
	b, err := op.ranges(op.String(), n, k*m)
	if err != nil {
		return nil, err
	}
	t, own := op.out2.get(k, m)
	for r := range len(b) - 1 {
		// Rows [lo, hi) alone: the product's inner dimension is the
		// range's, summed in row order as for a batch of those rows.
		lo, hi := b[r], b[r+1]
		gemm.NN(k, m, hi-lo, a[lo*k:], 1, k, dy[lo*m:], m, op.target(r, len(b)-1, own), m, false)
	}
	return t, nil
}

// SplitRows splits the weight and bias gradients (see RowSplitter).
func (op *denseGradOp) SplitRows(bounds []int, dst [][]float32) bool {
	if op.wrt == 0 {
		return false
	}
	op.split(bounds, dst)
	return true
}

func (op *denseGradOp) DiffWRT(n int) []bool { return make([]bool, n) }
func (op *denseGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: %s has no second derivative here", ErrBadInput, op)
}
