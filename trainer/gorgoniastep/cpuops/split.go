package cpuops

import "fmt"

// RowSplitter is the optional capability of an op whose output is a sum
// over the rows of a batch (the first dimension of its batch operand): the
// weight and bias gradients of Dense, the filter gradient of Conv2D (its
// rows are images) and the loss of SoftmaxCrossEntropy. Package gorgoniastep uses it to compute
// the sums of several micro-batches in one run of a graph
// (gorgoniastep.Model.StepMicro): the forward and backward pass run once
// over all the rows, and only these sums are taken per row range.
//
// SplitRows(bounds, dst) reports whether the op can split its sum (the
// input gradient of Dense, say, cannot: it is no sum over rows); if it
// can, it makes every later run compute the sum over the
// rows [bounds[j], bounds[j+1]) for each j < K = len(bounds)-1 separately:
// range j's into dst[j] for j < K-1 (each len(dst[j]) is the output's
// element count; for the loss, 1), and the last range's as the op's own
// output. bounds must start at 0, increase strictly and end at the batch's
// row count; len(dst) must be K-1. SplitRows(nil, nil) restores the sum
// over every row. A range's sum is the same bits as the op's output for a
// batch of just those rows, because every sum here is taken row after row
// in row order (see the package's determinism section). A run whose batch
// does not match bounds fails with ErrBadInput.
type RowSplitter interface {
	SplitRows(bounds []int, dst [][]float32) bool
}

// rowSplit is the state of a RowSplitter.
type rowSplit struct {
	bounds []int
	dst    [][]float32
	whole  [2]int
}

func (s *rowSplit) split(bounds []int, dst [][]float32) {
	s.bounds, s.dst = bounds, dst
}

// ranges returns the row ranges' bounds for a batch of n rows, each
// range's output size being size: [0, n] when not split.
func (s *rowSplit) ranges(what string, n, size int) ([]int, error) {
	if s.bounds == nil {
		s.whole = [2]int{0, n}
		return s.whole[:], nil
	}
	b := s.bounds
	k := len(b) - 1
	if k < 1 || b[0] != 0 || b[k] != n || len(s.dst) != k-1 {
		return nil, fmt.Errorf("%w: %s split at rows %v (%d outputs) for a batch of %d rows", ErrBadInput, what, b, len(s.dst), n)
	}
	for j := range k {
		if b[j+1] <= b[j] {
			return nil, fmt.Errorf("%w: %s split at rows %v: bounds must increase", ErrBadInput, what, b)
		}
		if j < k-1 && len(s.dst[j]) != size {
			return nil, fmt.Errorf("%w: %s split: %d values for range %d, want %d", ErrBadInput, what, len(s.dst[j]), j, size)
		}
	}
	return b, nil
}

// target returns where range j of k goes: dst[j], or own for the last.
func (s *rowSplit) target(j, k int, own []float32) []float32 {
	if j == k-1 {
		return own
	}
	return s.dst[j]
}
