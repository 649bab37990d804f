package cpuops

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// SoftmaxCrossEntropy returns the scalar node of the softmax cross-entropy
// of logits (n, k) against the targets y (n, k), SUMMED over the n rows:
// -Σ_i Σ_j y_ij · log softmax(logits_i)_j, with the log-softmax computed
// stably (the row maximum subtracted first, sums in float64). It is what
// gorgonia.Neg(gorgonia.Sum(gorgonia.HadamardProd(y,
// gorgonia.LogSoftMax(logits)))) computes, in two ops instead of eight.
// The gradient for the logits is softmax(logits_i)·Σ_j y_ij − y_i per
// row (softmax − y for one-hot rows); y gets none (it is data).
//
// Requirements (ErrBadInput otherwise): logits and y are float32 matrices
// of one shape.
func SoftmaxCrossEntropy(logits, y *gorgonia.Node) (*gorgonia.Node, error) {
	if err := checkDims(logits, "logits", 2); err != nil {
		return nil, err
	}
	if err := checkDims(y, "targets", 2); err != nil {
		return nil, err
	}
	if !logits.Shape().Eq(y.Shape()) {
		return nil, fmt.Errorf("%w: logits %v and targets %v differ in shape", ErrBadInput, logits.Shape(), y.Shape())
	}
	return gorgonia.ApplyOp(&xentOp{}, logits, y)
}

// logSoftmaxRow writes the log-softmax of z into lp (float64) and returns
// it.
func logSoftmaxRow(z []float32, lp []float64) []float64 {
	mx := z[0]
	for _, v := range z[1:] {
		mx = max(mx, v)
	}
	s := 0.0
	for _, v := range z {
		s += math.Exp(float64(v - mx))
	}
	ls := math.Log(s)
	for j, v := range z {
		lp[j] = float64(v-mx) - ls
	}
	return lp
}

// xentOp is SoftmaxCrossEntropy: inputs (logits, y), output a float32
// scalar.
type xentOp struct {
	opBase
	rowSplit // a RowSplitter
	out      gorgonia.F32
	lp       []float64
}

func (op *xentOp) Arity() int { return 2 }
func (op *xentOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := &gorgonia.TensorType{Dims: 2, Of: a}
	return hm.NewFnType(t, t, a)
}
func (op *xentOp) String() string        { return "cpuops.SoftmaxCrossEntropy" }
func (op *xentOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "cpuops.SoftmaxCrossEntropy") }
func (op *xentOp) Hashcode() uint32      { return hashcode("cpuops.SoftmaxCrossEntropy") }
func (op *xentOp) InferShape(...gorgonia.DimSizer) (tensor.Shape, error) {
	return tensor.ScalarShape(), nil
}

func (op *xentOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	z, y, n, k, err := xentInputs(in)
	if err != nil {
		return nil, err
	}
	if cap(op.lp) < k {
		op.lp = make([]float64, k)
	}
	b, err := op.ranges(op.String(), n, 1)
	if err != nil {
		return nil, err
	}
	for r := range len(b) - 1 {
		loss := 0.0
		for i := b[r]; i < b[r+1]; i++ {
			lp := logSoftmaxRow(z[i*k:(i+1)*k], op.lp[:k])
			for j, t := range y[i*k : (i+1)*k] {
				if t != 0 {
					loss -= float64(t) * lp[j]
				}
			}
		}
		if r < len(b)-2 {
			op.dst[r][0] = float32(loss)
		} else {
			op.out = gorgonia.F32(loss)
		}
	}
	return &op.out, nil
}

func xentInputs(in []gorgonia.Value) (z, y []float32, n, k int, err error) {
	if len(in) < 2 {
		return nil, nil, 0, 0, fmt.Errorf("%w: SoftmaxCrossEntropy takes logits and targets, got %d inputs", ErrBadInput, len(in))
	}
	z, zs, err := vals(in[0], "SoftmaxCrossEntropy logits", 2)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	y, ys, err := vals(in[1], "SoftmaxCrossEntropy targets", 2)
	if err != nil {
		return nil, nil, 0, 0, err
	}
	if !zs.Eq(ys) || zs[1] < 1 {
		return nil, nil, 0, 0, fmt.Errorf("%w: SoftmaxCrossEntropy of logits %v and targets %v", ErrBadInput, zs, ys)
	}
	return z, y, zs[0], zs[1], nil
}

// SplitRows splits the loss (see RowSplitter).
func (op *xentOp) SplitRows(bounds []int, dst [][]float32) bool {
	op.split(bounds, dst)
	return true
}

func (op *xentOp) DiffWRT(int) []bool { return []bool{true, false} }

func (op *xentOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: SoftmaxCrossEntropy takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	dz, err := gorgonia.ApplyOp(&xentGradOp{}, in[0], in[1], grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dz, nil}, nil
}

// xentGradOp: inputs (logits, y, the loss's gradient g, a scalar), output
// the logits' gradient g·(softmax·Σy − y).
type xentGradOp struct {
	opBase
	out buffer2
	lp  []float64
}

func (op *xentGradOp) Arity() int { return 3 }
func (op *xentGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := &gorgonia.TensorType{Dims: 2, Of: a}
	return hm.NewFnType(t, t, a, t)
}
func (op *xentGradOp) String() string        { return "cpuops.SoftmaxCrossEntropyGrad" }
func (op *xentGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "cpuops.SoftmaxCrossEntropyGrad") }
func (op *xentGradOp) Hashcode() uint32      { return hashcode("cpuops.SoftmaxCrossEntropyGrad") }
func (op *xentGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad takes 3 inputs, got %d", ErrBadInput, len(in))
	}
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) != 2 {
		return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad of %v", ErrBadInput, in[0])
	}
	return s.Clone(), nil
}

func (op *xentGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad takes 3 inputs, got %d", ErrBadInput, len(in))
	}
	z, y, n, k, err := xentInputs(in[:2])
	if err != nil {
		return nil, err
	}
	var g float64
	switch v := in[2].(type) {
	case *gorgonia.F32:
		g = float64(*v)
	case *tensor.Dense:
		if s, ok := v.Data().(float32); ok && v.IsScalar() {
			g = float64(s)
		} else {
			return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad: the loss's gradient is %v, want a float32 scalar", ErrBadInput, v.Shape())
		}
	default:
		return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad: the loss's gradient is a %T, want a float32 scalar", ErrBadInput, in[2])
	}
	if cap(op.lp) < k {
		op.lp = make([]float64, k)
	}
	t, dz := op.out.get(n, k)
	for i := 0; i < n; i++ {
		lp := logSoftmaxRow(z[i*k:(i+1)*k], op.lp[:k])
		yi := y[i*k : (i+1)*k]
		sy := 0.0
		for _, v := range yi {
			sy += float64(v)
		}
		for j, l := range lp {
			dz[i*k+j] = float32(g * (math.Exp(l)*sy - float64(yi[j])))
		}
	}
	return t, nil
}

func (op *xentGradOp) DiffWRT(int) []bool { return []bool{false, false, false} }
func (op *xentGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: SoftmaxCrossEntropyGrad has no second derivative here", ErrBadInput)
}
