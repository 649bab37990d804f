package gorgoniastep

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer"
)

// Sentinel errors. Errors returned by this package wrap one of these (or a
// context error) with %w.
var (
	// ErrBadGraph reports a graph, loss node, learnable or input this
	// package cannot bind: nil, wrong dtype, not a float32 tensor, not in
	// the graph, duplicate name, missing value, a non-scalar loss.
	ErrBadGraph = errors.New("gorgoniastep: bad graph")
	// ErrBadBatch reports a batch size or input length that does not fit.
	ErrBadBatch = errors.New("gorgoniastep: bad batch")
	// ErrRun reports a failure inside gorgonia's tape machine.
	ErrRun = errors.New("gorgoniastep: run failed")
	// ErrAliasBroken reports that after a run gorgonia no longer holds a
	// learnable's value or gradient in the buffers shared with the trainer
	// (it replaced a backing array). It has not been seen with gorgonia
	// v0.9.18; Run checks for it after every run so it can never go unnoticed.
	ErrAliasBroken = errors.New("gorgoniastep: gorgonia replaced a shared buffer")
	// ErrClosed reports use of a closed Machine or Model.
	ErrClosed = errors.New("gorgoniastep: closed")
)

// Option configures Bind and New.
type Option func(*options)

type options struct {
	lossScale float64
	meanLoss  bool
	maxGraphs int
	inputs    gorgonia.Nodes
	outputs   gorgonia.Nodes
}

func defaultOptions() options { return options{lossScale: 1, maxGraphs: 4} }

// WithLossScale makes Run multiply the loss and every gradient by s after
// each run (default 1). Use it with Bind when the loss node is not a sum over
// samples: for a mean over a fixed batch of n samples, pass n.
func WithLossScale(s float64) Option { return func(o *options) { o.lossScale = s } }

// WithMeanLoss tells New that the BuildFunc's loss node is the MEAN over
// the batch of per-sample losses; each Run then multiplies the loss and the
// gradients by the batch size, so callers still receive sums (as
// trainer.StepFunc requires). Default: the loss node is a sum. The product
// rounds once more per element than a sum graph would. Only for New; Bind
// rejects it (use WithLossScale).
func WithMeanLoss() Option { return func(o *options) { o.meanLoss = true } }

// WithMaxGraphs sets how many compiled graphs per kind (training, eval) a
// Model keeps, one per batch size, least recently used evicted first
// (default 4; at least 1). A data-parallel rank sees at most a few batch
// sizes (its usual share, its share of a kept last batch).
func WithMaxGraphs(n int) Option { return func(o *options) { o.maxGraphs = n } }

// WithInputs names the input nodes of a Bind graph, so that
// (*Machine).Input returns their float32 buffers. Each must be a float32
// input (a leaf that is not a learnable) with a fixed shape; a node without
// a value gets a zeroed tensor bound to it.
func WithInputs(nodes ...*gorgonia.Node) Option {
	return func(o *options) { o.inputs = append(o.inputs, nodes...) }
}

// WithOutputs names nodes whose values (*Machine).Output returns after a
// run of a forward-only Machine (see (*Model).Eval).
func WithOutputs(nodes ...*gorgonia.Node) Option {
	return func(o *options) { o.outputs = append(o.outputs, nodes...) }
}

// Machine runs one compiled gorgonia graph of fixed shapes: forward and
// backward (a training Machine, from Bind or (*Model).Train) or forward
// only (from (*Model).Eval).
//
// A Machine is not safe for concurrent use: one goroutine at a time. It
// holds the graph, the tape machine and the input tensors; Close releases
// the tape machine.
type Machine struct {
	g          *gorgonia.ExprGraph
	vm         gorgonia.VM
	loss       *gorgonia.Node
	learnables gorgonia.Nodes
	gradNodes  gorgonia.Nodes // d(loss)/d(learnable), in learnables' order (training)
	params     []trainer.Param
	inputs     []*gorgonia.Node
	inputBufs  [][]float32
	outputs    []*gorgonia.Node
	scale      float64
	train      bool
	batch      int
	closed     bool

	// StepMicro's split runs (micro.go).
	splitKnown, splittable bool
	lossParts              [][]float32
}

// Bind compiles g into a tape machine that computes loss and its gradients
// with respect to learnables, and returns the learnables as
// []trainer.Param whose Value and Grad slices alias gorgonia's tensors.
//
// Requirements (ErrBadGraph otherwise): loss is a scalar float32 or float64
// node of g; each learnable is a float32 tensor leaf of g with a value bound
// (gorgonia.WithValue or WithInit), held as a dense, non-view tensor, with a
// unique non-empty name; g holds no gradient nodes yet (Bind calls
// gorgonia.Grad itself). A learnable that already has a gradient tensor
// bound (gorgonia.WithGrad) keeps it; otherwise Bind binds a zeroed one.
//
// Gradients: Run copies each gradient node's value into the bound
// gradient tensor, so after Run each Param.Grad holds d(loss)/d(Value)
// for this run only. For
// trainer.StepFunc the loss must be the SUM of per-sample losses (or use
// WithLossScale).
//
// Bind works on one fixed batch size; New handles batch sizes that vary.
func Bind(g *gorgonia.ExprGraph, loss *gorgonia.Node, learnables gorgonia.Nodes, opts ...Option) (*Machine, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if o.meanLoss {
		return nil, fmt.Errorf("%w: WithMeanLoss needs New, which knows the batch size; use WithLossScale", ErrBadGraph)
	}
	if err := validScale(o.lossScale); err != nil {
		return nil, err
	}
	return bind(g, loss, learnables, nil, true, o)
}

func validScale(s float64) error {
	if math.IsNaN(s) || math.IsInf(s, 0) || s == 0 {
		return fmt.Errorf("%w: loss scale %v must be finite and non-zero", ErrBadGraph, s)
	}
	return nil
}

// bind is Bind with optional gradient buffers (one per learnable, nil =
// keep or allocate) and a training flag (false: forward only, no Grad).
func bind(g *gorgonia.ExprGraph, loss *gorgonia.Node, learnables gorgonia.Nodes, grads [][]float32, train bool, o options) (_ *Machine, err error) {
	// gorgonia reports many construction errors by panicking; turn those
	// into errors here rather than crash the caller.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: gorgonia: %v", ErrBadGraph, r)
		}
	}()
	if g == nil {
		return nil, fmt.Errorf("%w: nil graph", ErrBadGraph)
	}
	if err := checkInGraph(g, loss, "loss"); err != nil {
		return nil, err
	}
	if !loss.IsScalar() {
		return nil, fmt.Errorf("%w: loss %q has shape %v, want a scalar", ErrBadGraph, loss.Name(), loss.Shape())
	}
	if dt := loss.Dtype(); dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("%w: loss %q has dtype %v, want float32 or float64", ErrBadGraph, loss.Name(), dt)
	}
	if train && len(learnables) == 0 {
		return nil, fmt.Errorf("%w: no learnables", ErrBadGraph)
	}
	names := make(map[string]bool, len(learnables))
	params := make([]trainer.Param, len(learnables))
	for i, n := range learnables {
		if err := checkLeaf(g, n, "learnable"); err != nil {
			return nil, err
		}
		if names[n.Name()] {
			return nil, fmt.Errorf("%w: two learnables named %q", ErrBadGraph, n.Name())
		}
		names[n.Name()] = true
		if train && n.Deriv() != nil {
			return nil, fmt.Errorf("%w: learnable %q already has a gradient node; let Bind call gorgonia.Grad", ErrBadGraph, n.Name())
		}
		value, err := denseFloat32s(n.Value(), n)
		if err != nil {
			return nil, err
		}
		params[i] = trainer.Param{Name: n.Name(), Shape: []int(n.Shape().Clone()), Value: value}
		if !train {
			continue
		}
		var grad []float32
		switch {
		case grads != nil && grads[i] != nil:
			grad = grads[i]
		default:
			if gv, err := n.Grad(); err == nil {
				// A dual value is already bound (gorgonia.WithGrad): keep it.
				if d, err := denseFloat32s(gv, n); err == nil && len(d) == len(value) {
					grad = d
				}
			}
		}
		if grad == nil {
			grad = make([]float32, len(value))
		}
		if len(grad) != len(value) {
			return nil, fmt.Errorf("%w: learnable %q: %d gradient elements for %d values", ErrBadGraph, n.Name(), len(grad), len(value))
		}
		gorgonia.WithGrad(tensor.New(tensor.WithShape(n.Shape().Clone()...), tensor.WithBacking(grad)))(n)
		params[i].Grad = grad
	}

	m := &Machine{g: g, loss: loss, learnables: learnables, params: params, scale: o.lossScale, train: train}
	for _, n := range o.inputs {
		if err := checkLeaf(g, n, "input"); err != nil {
			return nil, err
		}
		if learnables.Contains(n) {
			return nil, fmt.Errorf("%w: node %q is both a learnable and an input", ErrBadGraph, n.Name())
		}
		if n.Value() == nil {
			if err := gorgonia.Let(n, tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(n.Shape().Clone()...))); err != nil {
				return nil, fmt.Errorf("%w: input %q: %v", ErrBadGraph, n.Name(), err)
			}
		}
		buf, err := denseFloat32s(n.Value(), n)
		if err != nil {
			return nil, err
		}
		m.inputs = append(m.inputs, n)
		m.inputBufs = append(m.inputBufs, buf)
	}
	for _, n := range o.outputs {
		if err := checkInGraph(g, n, "output"); err != nil {
			return nil, err
		}
		m.outputs = append(m.outputs, n)
	}

	if train {
		grads, err := gorgonia.Grad(loss, learnables...)
		if err != nil {
			return nil, fmt.Errorf("%w: symbolic gradient: %v", ErrBadGraph, err)
		}
		// Compile only what the loss, the learnables' gradients and the
		// outputs need: gorgonia's symbolic differentiation also adds
		// gradients of the inputs (the pixels, the labels), which nothing
		// reads; left in, the tape machine computes them every run.
		roots := append(append(gorgonia.Nodes{loss}, grads...), m.outputs...)
		// Not gorgonia.BindDualValues: that adds every gradient into the
		// bound gradient tensor with gorgonia's scalar add, after Run
		// zeroed it (two passes over each gradient, a slow one); Run
		// copies each gradient node's value instead.
		m.gradNodes = grads
		m.vm = gorgonia.NewTapeMachine(g.ExactSubgraphRoots(roots...))
	} else {
		m.vm = gorgonia.NewTapeMachine(g)
	}
	return m, nil
}

func checkInGraph(g *gorgonia.ExprGraph, n *gorgonia.Node, what string) error {
	if n == nil {
		return fmt.Errorf("%w: nil %s node", ErrBadGraph, what)
	}
	if n.Graph() != g || !g.Has(n.ID()) {
		return fmt.Errorf("%w: %s %q is not in the graph", ErrBadGraph, what, n.Name())
	}
	return nil
}

func checkLeaf(g *gorgonia.ExprGraph, n *gorgonia.Node, what string) error {
	if err := checkInGraph(g, n, what); err != nil {
		return err
	}
	if !n.IsVar() {
		return fmt.Errorf("%w: %s %q is not a variable leaf (it is computed or constant)", ErrBadGraph, what, n.Name())
	}
	if n.IsScalar() {
		return fmt.Errorf("%w: %s %q is a scalar; use a tensor of shape (1)", ErrBadGraph, what, n.Name())
	}
	if n.Dtype() != tensor.Float32 {
		return fmt.Errorf("%w: %s %q has dtype %v, want float32", ErrBadGraph, what, n.Name(), n.Dtype())
	}
	return nil
}

// denseFloat32s returns the backing array of v, which must be a dense,
// non-view float32 tensor whose element count matches n's shape.
func denseFloat32s(v gorgonia.Value, n *gorgonia.Node) ([]float32, error) {
	if v == nil {
		return nil, fmt.Errorf("%w: node %q has no value bound", ErrBadGraph, n.Name())
	}
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: node %q holds a %T, want *tensor.Dense", ErrBadGraph, n.Name(), v)
	}
	if d.IsView() {
		return nil, fmt.Errorf("%w: node %q holds a view; bind a contiguous tensor", ErrBadGraph, n.Name())
	}
	s, ok := d.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("%w: node %q holds %v data, want float32", ErrBadGraph, n.Name(), d.Dtype())
	}
	if want := n.Shape().TotalSize(); len(s) != want {
		return nil, fmt.Errorf("%w: node %q holds %d elements, its shape %v needs %d", ErrBadGraph, n.Name(), len(s), n.Shape(), want)
	}
	return s, nil
}

// Params returns the learnables in the order given to Bind. Value and Grad
// alias gorgonia's tensors: writing Value changes what the next Run
// computes; Grad holds the gradient of the last Run. The slice is shared;
// do not append to it. A forward-only Machine's Params carry the Model's
// gradient buffers (see (*Model).Eval).
func (m *Machine) Params() []trainer.Param { return m.params }

// Batch returns the batch size this Machine was built for by a Model, or 0
// for a Machine from Bind.
func (m *Machine) Batch() int { return m.batch }

// NumInputs returns the number of input buffers (see Input).
func (m *Machine) NumInputs() int { return len(m.inputs) }

// Input returns the float32 backing array of input i, in the order of
// WithInputs or Graph.Inputs; the caller writes the batch there before Run.
// It panics if i is out of range, like a slice index.
func (m *Machine) Input(i int) []float32 { return m.inputBufs[i] }

// Output returns the values of output node i computed by the last Run of a
// forward-only Machine; the slice is valid until the next Run. On a
// training Machine gorgonia may reuse an output's memory during the
// backward pass, so Output returns ErrBadGraph there.
func (m *Machine) Output(i int) ([]float32, error) {
	if m.train {
		return nil, fmt.Errorf("%w: outputs are only kept by forward-only machines (Model.Eval)", ErrBadGraph)
	}
	if i < 0 || i >= len(m.outputs) {
		return nil, fmt.Errorf("%w: output %d of %d", ErrBadGraph, i, len(m.outputs))
	}
	n := m.outputs[i]
	v := n.Value()
	if v == nil {
		return nil, fmt.Errorf("%w: output %q has no value; call Run first", ErrBadGraph, n.Name())
	}
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: output %q holds a %T", ErrBadGraph, n.Name(), v)
	}
	s, ok := d.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("%w: output %q holds %v data, want float32", ErrBadGraph, n.Name(), d.Dtype())
	}
	return s, nil
}

// Run runs the graph once on the current inputs and parameter values and
// returns the loss node's value times the loss scale. On a training
// Machine each Param.Grad then holds the gradient of that (scaled) loss
// (copied from the gradient nodes' values).
//
// gorgonia's tape machine cannot be interrupted: Run checks ctx before it
// starts and returns a wrapped ctx.Err() if it is already done, otherwise it
// runs to completion. Errors: ErrClosed, ErrRun (gorgonia failed; the
// gradients are then undefined), ErrAliasBroken, context errors.
func (m *Machine) Run(ctx context.Context) (float64, error) {
	if m.closed {
		return 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("gorgoniastep: run: %w", err)
	}
	m.vm.Reset()
	if err := m.vm.RunAll(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrRun, err)
	}
	if m.train {
		if err := m.copyGrads(); err != nil {
			return 0, err
		}
	}
	if err := m.checkAliases(); err != nil {
		return 0, err
	}
	loss, err := scalar(m.loss)
	if err != nil {
		return 0, err
	}
	if m.scale != 1 {
		loss *= m.scale
		if m.train {
			s := float32(m.scale)
			for _, p := range m.params {
				for j := range p.Grad {
					p.Grad[j] *= s
				}
			}
		}
	}
	return loss, nil
}

// copyGrads copies each gradient node's value, as the run left it, into
// its Param.Grad.
func (m *Machine) copyGrads() error {
	for i, n := range m.gradNodes {
		p := m.params[i]
		d, ok := n.Value().(*tensor.Dense)
		if ok && d.IsView() {
			d, ok = d.Materialize().(*tensor.Dense)
		}
		var g []float32
		if ok {
			g, ok = d.Data().([]float32)
		}
		if !ok || len(g) != len(p.Grad) {
			return fmt.Errorf("%w: the gradient of %q is %v, want %d float32 values", ErrRun, p.Name, n.Value(), len(p.Grad))
		}
		copy(p.Grad, g)
	}
	return nil
}

// checkAliases verifies that every learnable still holds its value and
// gradient in the shared buffers: a few interface calls per learnable.
func (m *Machine) checkAliases() error {
	for i, n := range m.learnables {
		p := m.params[i]
		v, ok := n.Value().(*tensor.Dense)
		if !ok || !sameArray(v, p.Value) {
			return fmt.Errorf("%w: value of %q", ErrAliasBroken, p.Name)
		}
		if !m.train {
			continue
		}
		gv, err := n.Grad()
		if err != nil {
			return fmt.Errorf("%w: gradient of %q: %v", ErrAliasBroken, p.Name, err)
		}
		gd, ok := gv.(*tensor.Dense)
		if !ok || !sameArray(gd, p.Grad) {
			return fmt.Errorf("%w: gradient of %q", ErrAliasBroken, p.Name)
		}
	}
	return nil
}

func sameArray(d *tensor.Dense, s []float32) bool {
	if d.IsView() || d.Dtype() != tensor.Float32 || d.DataSize() != len(s) || len(s) == 0 {
		return false
	}
	return d.Uintptr() == uintptr(unsafe.Pointer(unsafe.SliceData(s)))
}

func scalar(n *gorgonia.Node) (float64, error) {
	v := n.Value()
	if v == nil {
		return 0, fmt.Errorf("%w: loss %q has no value after the run", ErrRun, n.Name())
	}
	switch x := v.Data().(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case []float32:
		if len(x) == 1 {
			return float64(x[0]), nil
		}
	case []float64:
		if len(x) == 1 {
			return x[0], nil
		}
	}
	return 0, fmt.Errorf("%w: loss %q holds %T, want a float scalar", ErrRun, n.Name(), v.Data())
}

// Close releases the tape machine. It is idempotent; Run after Close
// returns ErrClosed.
func (m *Machine) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	return m.vm.Close()
}
