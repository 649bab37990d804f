package cpuops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ReLU returns the node of max(0, x), elementwise, for a float32 tensor x
// of any shape: what gorgonia.Rectify computes, in a buffer the node keeps.
// Its gradient passes dy where x > 0 and 0 elsewhere (at 0 too, as in
// PyTorch; gorgonia.Rectify passes it at 0). Errors: ErrBadInput for a nil
// or non-float32 node.
func ReLU(x *gorgonia.Node) (*gorgonia.Node, error) {
	if x == nil {
		return nil, fmt.Errorf("%w: nil input node", ErrBadInput)
	}
	if x.Dtype() != tensor.Float32 || x.IsScalar() {
		return nil, fmt.Errorf("%w: ReLU of %q (%v, shape %v), want a float32 tensor", ErrBadInput, x.Name(), x.Dtype(), x.Shape())
	}
	return gorgonia.ApplyOp(&reluOp{dims: x.Dims()}, x)
}

// flat returns the contiguous float32 data and shape of a tensor value of
// dims dimensions without allocating.
func flat(v gorgonia.Value, what string, dims int) ([]float32, tensor.Shape, error) {
	return vals(v, what, dims)
}

// bufferN is an output buffer of any shape.
type bufferN struct{ t *tensor.Dense }

func (b *bufferN) like(s tensor.Shape) (*tensor.Dense, []float32) {
	if b.t == nil || !b.t.Shape().Eq(s) {
		b.t = tensor.New(tensor.WithShape(s.Clone()...), tensor.Of(tensor.Float32))
	}
	return b.t, b.t.Float32s()
}

// reluOp is ReLU: input x, output y.
type reluOp struct {
	opBase
	dims int
	out  bufferN
}

func (op *reluOp) Arity() int            { return 1 }
func (op *reluOp) Type() hm.Type         { t := tensorN(op.dims); return hm.NewFnType(t, t) }
func (op *reluOp) String() string        { return "cpuops.ReLU" }
func (op *reluOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "cpuops.ReLU") }
func (op *reluOp) Hashcode() uint32      { return hashcode("cpuops.ReLU") }

func (op *reluOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLU takes 1 input, got %d", ErrBadInput, len(in))
	}
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("%w: ReLU of %v", ErrBadInput, in[0])
	}
	return s.Clone(), nil
}

func (op *reluOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLU takes 1 input, got %d", ErrBadInput, len(in))
	}
	x, xs, err := flat(in[0], "ReLU input", op.dims)
	if err != nil {
		return nil, err
	}
	t, y := op.out.like(xs)
	for i, v := range x[:len(y)] {
		y[i] = max(v, 0)
	}
	return t, nil
}

func (op *reluOp) DiffWRT(int) []bool { return []bool{true} }

func (op *reluOp) SymDiff(in gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: ReLU takes 1 input, got %d", ErrBadInput, len(in))
	}
	dx, err := gorgonia.ApplyOp(&reluGradOp{dims: op.dims}, in[0], grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx}, nil
}

// reluGradOp: inputs (x, dy), output dx = dy where x > 0, else 0.
type reluGradOp struct {
	opBase
	dims int
	out  bufferN
}

func (op *reluGradOp) Arity() int            { return 2 }
func (op *reluGradOp) Type() hm.Type         { t := tensorN(op.dims); return hm.NewFnType(t, t, t) }
func (op *reluGradOp) String() string        { return "cpuops.ReLUGrad" }
func (op *reluGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "cpuops.ReLUGrad") }
func (op *reluGradOp) Hashcode() uint32      { return hashcode("cpuops.ReLUGrad") }

func (op *reluGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: ReLUGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("%w: ReLUGrad of %v", ErrBadInput, in[0])
	}
	return s.Clone(), nil
}

func (op *reluGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: ReLUGrad takes 2 inputs, got %d", ErrBadInput, len(in))
	}
	x, xs, err := flat(in[0], "ReLUGrad input", op.dims)
	if err != nil {
		return nil, err
	}
	dy, ds, err := flat(in[1], "ReLUGrad output gradient", op.dims)
	if err != nil {
		return nil, err
	}
	if !ds.Eq(xs) {
		return nil, fmt.Errorf("%w: ReLUGrad: output gradient %v for input %v", ErrBadInput, ds, xs)
	}
	t, dx := op.out.like(xs)
	dy = dy[:len(x)]
	for i, v := range x[:len(dx)] {
		var g float32
		if v > 0 {
			g = dy[i]
		}
		dx[i] = g
	}
	return t, nil
}

func (op *reluGradOp) DiffWRT(int) []bool { return []bool{false, false} }
func (op *reluGradOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: ReLUGrad has no second derivative here", ErrBadInput)
}
