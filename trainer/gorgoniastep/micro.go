package gorgoniastep

import (
	"context"
	"fmt"

	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/cpuops"
)

// StepMicro runs forward and backward on K = len(bounds)-1 micro-batches
// at once and leaves each one's gradient and loss sums apart, for the
// trainer's deterministic mode (trainer.MicroStepFunc): micro-batch j is
// the rows [bounds[j], bounds[j+1]) of one batch of n = bounds[K] samples.
// fill(mc, lo, hi) writes micro-batches lo..hi-1, in order, into the
// Machine's inputs (mc.Batch() rows). Afterwards grads[j][i] (j < K-1)
// holds the SUM over micro-batch j's samples of parameter i's gradient,
// the Params' Grad buffers hold the last micro-batch's, and losses[j] is
// micro-batch j's loss sum; each is the same bits as Step on that
// micro-batch alone.
//
// When every parameter's gradient and the loss are sums over rows taken
// by ops of package cpuops (cpuops.RowSplitter: Dense and
// SoftmaxCrossEntropy; the gradient of a parameter used more than once, or
// a loss computed after the sum, is not), the graph for n samples runs
// once and only those sums are taken per micro-batch; otherwise each
// micro-batch runs on its own graph, as K calls of Step would. Errors:
// ErrBadBatch (bounds not starting at 0 and strictly increasing, a nil
// fill, grads or losses of the wrong shape), those of Train and Run, and
// fill's error (wrapped).
func (m *Model) StepMicro(ctx context.Context, bounds []int, fill func(mc *Machine, lo, hi int) error, grads [][][]float32, losses []float64) error {
	if m.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("gorgoniastep: step: %w", err)
	}
	k := len(bounds) - 1
	if k < 1 || bounds[0] != 0 {
		return fmt.Errorf("%w: micro-batch bounds %v, want 0 = b[0] < b[1] < ...", ErrBadBatch, bounds)
	}
	for j := range k {
		if bounds[j+1] <= bounds[j] {
			return fmt.Errorf("%w: micro-batch bounds %v, want 0 = b[0] < b[1] < ...", ErrBadBatch, bounds)
		}
	}
	if fill == nil {
		return fmt.Errorf("%w: nil fill function", ErrBadBatch)
	}
	if len(grads) != k-1 || len(losses) != k {
		return fmt.Errorf("%w: %d gradient sets and %d losses for %d micro-batches, want %d and %d", ErrBadBatch, len(grads), len(losses), k, k-1, k)
	}
	for j, g := range grads {
		if len(g) != len(m.params) {
			return fmt.Errorf("%w: micro-batch %d: %d gradient buffers for %d parameters", ErrBadBatch, j, len(g), len(m.params))
		}
		for i, p := range m.params {
			if len(g[i]) != len(p.Grad) {
				return fmt.Errorf("%w: micro-batch %d: %d gradient values for %q of %d", ErrBadBatch, j, len(g[i]), p.Name, len(p.Grad))
			}
		}
	}
	mc, err := m.Train(bounds[k])
	if err != nil {
		return err
	}
	if k > 1 && !mc.canSplit() {
		return m.stepEach(ctx, bounds, fill, grads, losses)
	}
	if err := fill(mc, 0, k); err != nil {
		return fmt.Errorf("gorgoniastep: filling the inputs: %w", err)
	}
	return mc.runSplit(ctx, bounds, grads, losses)
}

// stepEach is StepMicro with one run per micro-batch.
func (m *Model) stepEach(ctx context.Context, bounds []int, fill func(*Machine, int, int) error, grads [][][]float32, losses []float64) error {
	k := len(bounds) - 1
	for j := range k {
		mc, err := m.Train(bounds[j+1] - bounds[j])
		if err != nil {
			return err
		}
		if err := fill(mc, j, j+1); err != nil {
			return fmt.Errorf("gorgoniastep: filling the inputs: %w", err)
		}
		if losses[j], err = mc.Run(ctx); err != nil {
			return err
		}
		if j < k-1 {
			for i, p := range m.params {
				copy(grads[j][i], p.Grad)
			}
		}
	}
	return nil
}

// canSplit reports whether runSplit can take the machine's gradient and
// loss sums per row range (see StepMicro), deciding once.
func (m *Machine) canSplit() bool {
	if m.splitKnown {
		return m.splittable
	}
	m.splitKnown = true
	if !m.train {
		return false
	}
	nodes := append(m.gradNodes[:len(m.gradNodes):len(m.gradNodes)], m.loss)
	seen := make(map[cpuops.RowSplitter]bool, len(nodes))
	for _, n := range nodes {
		s, ok := n.Op().(cpuops.RowSplitter)
		// A node another one reads would hand it one range only; an op
		// twice in the list would be split twice.
		if readers := m.g.To(n.ID()); !ok || seen[s] || readers == nil || readers.Len() > 0 || !s.SplitRows(nil, nil) {
			return false
		}
		seen[s] = true
	}
	m.splittable = true
	return true
}

// runSplit runs the machine once with its gradient and loss sums split at
// bounds (canSplit must hold when len(bounds) > 2).
func (m *Machine) runSplit(ctx context.Context, bounds []int, grads [][][]float32, losses []float64) (err error) {
	k := len(bounds) - 1
	if k == 1 {
		losses[0], err = m.Run(ctx)
		return err
	}
	if len(m.lossParts) != k-1 {
		m.lossParts = make([][]float32, k-1)
		for j := range m.lossParts {
			m.lossParts[j] = make([]float32, 1)
		}
	}
	dst := make([][]float32, k-1) // one per split op, reused below
	for i, n := range m.gradNodes {
		for j := range k - 1 {
			dst[j] = grads[j][i]
		}
		n.Op().(cpuops.RowSplitter).SplitRows(bounds, append([][]float32(nil), dst...))
	}
	m.loss.Op().(cpuops.RowSplitter).SplitRows(bounds, m.lossParts)
	defer func() {
		for _, n := range m.gradNodes {
			n.Op().(cpuops.RowSplitter).SplitRows(nil, nil)
		}
		m.loss.Op().(cpuops.RowSplitter).SplitRows(nil, nil)
	}()
	last, err := m.Run(ctx) // scales the last micro-batch's gradients
	if err != nil {
		return err
	}
	losses[k-1] = last
	for j := range k - 1 {
		losses[j] = float64(m.lossParts[j][0]) * m.scale
		if m.scale != 1 {
			s := float32(m.scale)
			for _, g := range grads[j] {
				for x := range g {
					g[x] *= s
				}
			}
		}
	}
	return nil
}
