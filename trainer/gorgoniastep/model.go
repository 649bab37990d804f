package gorgoniastep

import (
	"context"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer"
)

// maxParamElems bounds one parameter's element count (2^31-1, 8 GiB of
// float32 for value and gradient together), so a bad shape is an error and
// not an out-of-memory crash.
const maxParamElems = 1<<31 - 1

// ParamSpec names and shapes one learnable parameter of a Model.
type ParamSpec struct {
	// Name identifies the parameter (trainer.Param.Name); unique, non-empty.
	Name string
	// Shape is the tensor shape, outermost first; at least one dimension,
	// each at least 1.
	Shape []int
}

// Graph is what a BuildFunc returns: the nodes a Model needs from one
// batch size's graph.
type Graph struct {
	// Loss is a scalar node: the SUM over the batch of per-sample losses
	// (or the mean, with WithMeanLoss).
	Loss *gorgonia.Node
	// Inputs are float32 leaf nodes the caller fills before each run (for
	// example the pixels and the one-hot labels), in the order of
	// (*Machine).Input. A node without a value gets a zeroed tensor.
	Inputs gorgonia.Nodes
	// Outputs are nodes a forward-only Machine exposes after a run (for
	// example the logits), in the order of (*Machine).Output. Optional.
	Outputs gorgonia.Nodes
}

// BuildFunc adds a model's computation for batches of exactly batch samples
// (batch >= 1) to the empty graph g. params holds one learnable node per
// ParamSpec, in order, already bound to the Model's shared buffers; the
// BuildFunc must use these and must not create learnables of its own. It is
// called once per batch size and kind (training, forward-only), so it must
// build the same computation every time. A panic inside gorgonia during the
// build is returned as ErrBadGraph.
type BuildFunc func(g *gorgonia.ExprGraph, batch int, params gorgonia.Nodes) (Graph, error)

// Model owns a model's parameter and gradient buffers and one compiled
// graph per batch size, built lazily by a BuildFunc: every graph's
// learnables alias the same buffers, so Params stays valid whatever batch
// sizes are used. This is how variable per-rank shares (the last rank's
// share, the last global batch of an epoch) are handled: exactly, without
// padding or masks. Compiling a graph for a new batch size costs a few
// milliseconds for an MLP; at most WithMaxGraphs graphs per kind are kept.
//
// A Model is not safe for concurrent use; the trainer calls it from its
// loop goroutine.
type Model struct {
	specs  []ParamSpec
	build  BuildFunc
	opts   options
	params []trainer.Param
	grads  [][]float32
	train  graphCache
	eval   graphCache
	closed bool
}

type graphCache struct {
	tick    uint64
	entries map[int]*cacheEntry
}

type cacheEntry struct {
	m    *Machine
	used uint64
}

// New allocates zeroed parameter and gradient buffers for specs and
// returns a Model that compiles build's graph per batch size. It builds
// and compiles the training graph for batch size 1 at once, so a broken
// BuildFunc fails here. Errors: ErrBadGraph (bad specs, options or graph).
//
// Initialise the parameters by writing Params()[i].Value.
func New(specs []ParamSpec, build BuildFunc, opts ...Option) (*Model, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if build == nil {
		return nil, fmt.Errorf("%w: nil BuildFunc", ErrBadGraph)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("%w: no parameters", ErrBadGraph)
	}
	if o.maxGraphs < 1 {
		return nil, fmt.Errorf("%w: WithMaxGraphs(%d), want at least 1", ErrBadGraph, o.maxGraphs)
	}
	if err := validScale(o.lossScale); err != nil {
		return nil, err
	}
	if len(o.inputs) > 0 || len(o.outputs) > 0 {
		return nil, fmt.Errorf("%w: WithInputs/WithOutputs are for Bind; a BuildFunc returns them in Graph", ErrBadGraph)
	}
	m := &Model{build: build, opts: o}
	names := make(map[string]bool, len(specs))
	for _, s := range specs {
		if s.Name == "" {
			return nil, fmt.Errorf("%w: parameter with an empty name", ErrBadGraph)
		}
		if names[s.Name] {
			return nil, fmt.Errorf("%w: two parameters named %q", ErrBadGraph, s.Name)
		}
		names[s.Name] = true
		if len(s.Shape) == 0 {
			return nil, fmt.Errorf("%w: parameter %q has no dimensions", ErrBadGraph, s.Name)
		}
		n := 1
		for _, d := range s.Shape {
			if d < 1 || n > maxParamElems/d {
				return nil, fmt.Errorf("%w: parameter %q has shape %v: dimensions must be >= 1 and hold at most %d elements", ErrBadGraph, s.Name, s.Shape, maxParamElems)
			}
			n *= d
		}
		shape := append([]int(nil), s.Shape...)
		m.specs = append(m.specs, ParamSpec{Name: s.Name, Shape: shape})
		grad := make([]float32, n)
		m.params = append(m.params, trainer.Param{Name: s.Name, Shape: shape, Value: make([]float32, n), Grad: grad})
		m.grads = append(m.grads, grad)
	}
	if _, err := m.Train(1); err != nil {
		return nil, err
	}
	return m, nil
}

// Params returns the parameters in ParamSpec order. Value and Grad alias
// the tensors of every graph the Model compiles. The slice is shared; do
// not append to it.
func (m *Model) Params() []trainer.Param { return m.params }

// ZeroGrads sets every gradient to zero.
func (m *Model) ZeroGrads() {
	for _, p := range m.params {
		clear(p.Grad)
	}
}

// Train returns the training Machine (forward and backward) for batches of
// exactly batch samples, compiling it on first use. Errors: ErrBadBatch
// (batch < 1), ErrBadGraph (the BuildFunc failed), ErrClosed.
func (m *Model) Train(batch int) (*Machine, error) { return m.machine(batch, true) }

// Eval returns the forward-only Machine for batches of exactly batch
// samples, compiling it on first use; its Run computes the loss and the
// Graph.Outputs without touching the gradients. Its Params are the Model's.
// Errors as for Train.
func (m *Model) Eval(batch int) (*Machine, error) { return m.machine(batch, false) }

// Step runs forward and backward on one batch of n samples: fill writes the
// batch into the Machine's inputs, then the Machine runs. Afterwards every
// Param.Grad holds the SUM over the n samples of the per-sample gradient and
// Step returns the SUM of the per-sample losses (the trainer.StepFunc
// contract). With n == 0 it zeroes the gradients and returns 0 without
// calling fill. Errors: ErrBadBatch (n < 0, or a nil fill with n > 0),
// those of Train and Run, and fill's error (wrapped).
func (m *Model) Step(ctx context.Context, n int, fill func(*Machine) error) (float64, error) {
	if m.closed {
		return 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("gorgoniastep: step: %w", err)
	}
	if n < 0 {
		return 0, fmt.Errorf("%w: %d samples", ErrBadBatch, n)
	}
	if n == 0 {
		m.ZeroGrads()
		return 0, nil
	}
	if fill == nil {
		return 0, fmt.Errorf("%w: nil fill function for %d samples", ErrBadBatch, n)
	}
	mc, err := m.Train(n)
	if err != nil {
		return 0, err
	}
	if err := fill(mc); err != nil {
		return 0, fmt.Errorf("gorgoniastep: filling the inputs: %w", err)
	}
	return mc.Run(ctx)
}

func (m *Model) machine(batch int, train bool) (*Machine, error) {
	if m.closed {
		return nil, ErrClosed
	}
	if batch < 1 {
		return nil, fmt.Errorf("%w: batch size %d, want at least 1", ErrBadBatch, batch)
	}
	c := &m.eval
	if train {
		c = &m.train
	}
	c.tick++
	if e, ok := c.entries[batch]; ok {
		e.used = c.tick
		return e.m, nil
	}
	mc, err := m.compile(batch, train)
	if err != nil {
		return nil, err
	}
	if c.entries == nil {
		c.entries = make(map[int]*cacheEntry)
	}
	if len(c.entries) >= m.opts.maxGraphs {
		oldest, at := 0, ^uint64(0)
		for b, e := range c.entries {
			if e.used < at {
				oldest, at = b, e.used
			}
		}
		_ = c.entries[oldest].m.Close() // releases nothing that can fail on the CPU
		delete(c.entries, oldest)
	}
	c.entries[batch] = &cacheEntry{m: mc, used: c.tick}
	return mc, nil
}

func (m *Model) compile(batch int, train bool) (_ *Machine, err error) {
	g := gorgonia.NewGraph()
	nodes := make(gorgonia.Nodes, len(m.specs))
	gr, err := func() (gr Graph, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("gorgonia panicked: %v", r)
			}
		}()
		for i, s := range m.specs {
			t := tensor.New(tensor.WithShape(s.Shape...), tensor.WithBacking(m.params[i].Value))
			nodes[i] = gorgonia.NewTensor(g, tensor.Float32, len(s.Shape),
				gorgonia.WithShape(s.Shape...), gorgonia.WithName(s.Name), gorgonia.WithValue(t))
		}
		return m.build(g, batch, nodes)
	}()
	if err != nil {
		return nil, fmt.Errorf("%w: building the graph for batch size %d: %w", ErrBadGraph, batch, err)
	}
	o := m.opts
	o.inputs, o.outputs = gr.Inputs, gr.Outputs
	if o.meanLoss {
		o.lossScale *= float64(batch)
	}
	mc, err := bind(g, gr.Loss, nodes, m.grads, train, o)
	if err != nil {
		return nil, err
	}
	mc.batch = batch
	if !train {
		mc.params = m.params
	}
	return mc, nil
}

// Close closes every compiled Machine. It is idempotent; other methods
// return ErrClosed afterwards.
func (m *Model) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	for _, c := range []*graphCache{&m.train, &m.eval} {
		for b, e := range c.entries {
			_ = e.m.Close()
			delete(c.entries, b)
		}
	}
	return nil
}
