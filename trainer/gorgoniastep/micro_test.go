package gorgoniastep

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/cpuops"
)

// cpuMLP is tinyMLP made of cpuops' ops (Dense, ReLU,
// SoftmaxCrossEntropy), whose gradient and loss sums StepMicro splits.
func cpuMLP(g *gorgonia.ExprGraph, batch int, p gorgonia.Nodes) (Graph, error) {
	in, classes := p[0].Shape()[0], p[2].Shape()[1]
	x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, in), gorgonia.WithName("x"))
	y := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, classes), gorgonia.WithName("y"))
	h, err := cpuops.Dense(x, p[0], p[1])
	if err != nil {
		return Graph{}, err
	}
	if h, err = cpuops.ReLU(h); err != nil {
		return Graph{}, err
	}
	logits, err := cpuops.Dense(h, p[2], p[3])
	if err != nil {
		return Graph{}, err
	}
	loss, err := cpuops.SoftmaxCrossEntropy(logits, y)
	if err != nil {
		return Graph{}, err
	}
	return Graph{Loss: loss, Inputs: gorgonia.Nodes{x, y}, Outputs: gorgonia.Nodes{logits}}, nil
}

// microSplit runs StepMicro on b cut at bounds and returns each
// micro-batch's gradients (the last from the Params) and losses.
func microSplit(t *testing.T, m *Model, b batchData, bounds []int) ([][][]float32, []float64) {
	t.Helper()
	k := len(bounds) - 1
	grads := make([][][]float32, k-1)
	for j := range grads {
		for _, p := range m.Params() {
			grads[j] = append(grads[j], make([]float32, len(p.Grad)))
		}
	}
	losses := make([]float64, k)
	fill := func(mc *Machine, lo, hi int) error {
		if mc.Batch() != bounds[hi]-bounds[lo] {
			t.Errorf("fill(%d, %d) given a machine of %d rows, want %d", lo, hi, mc.Batch(), bounds[hi]-bounds[lo])
		}
		return b.slice(bounds[lo], bounds[hi]).fill(mc)
	}
	if err := m.StepMicro(context.Background(), bounds, fill, grads, losses); err != nil {
		t.Fatalf("StepMicro(%v): %v", bounds, err)
	}
	return append(grads, gradsCopy(m)), losses
}

// TestStepMicroGivesEachMicroBatchsStepBits checks StepMicro's promise:
// each micro-batch's gradient and loss sums are the same bits as Step on
// that micro-batch alone, both when the graph's sums are split in one run
// (cpuops' ops) and when each micro-batch runs on its own (gorgonia's ops).
func TestStepMicroGivesEachMicroBatchsStepBits(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		build BuildFunc
		split bool
	}{{"cpuops split in one run", cpuMLP, true}, {"gorgonia ops one run each", tinyMLP, false}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tinySpecs(7, 9, 4), tc.build)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for i, p := range m.Params() {
				for j := range p.Value {
					p.Value[j] = float32(math.Sin(float64(7*i+j))) * 0.6
				}
			}
			b := randomBatch(11, 7, 4, 5)
			for _, bounds := range [][]int{{0, 11}, {0, 4, 11}, {0, 3, 6, 9, 11}, {0, 1, 2, 11}} {
				grads, losses := microSplit(t, m, b, bounds)
				for j := range len(bounds) - 1 {
					part := b.slice(bounds[j], bounds[j+1])
					l, err := m.Step(ctx, part.n(), part.fill)
					if err != nil {
						t.Fatal(err)
					}
					if math.Float64bits(l) != math.Float64bits(losses[j]) {
						t.Fatalf("bounds %v micro-batch %d: loss %v, Step gives %v", bounds, j, losses[j], l)
					}
					for i, p := range m.Params() {
						for x := range p.Grad {
							if math.Float32bits(p.Grad[x]) != math.Float32bits(grads[j][i][x]) {
								t.Fatalf("bounds %v micro-batch %d: %s[%d] = %v, Step gives %v", bounds, j, p.Name, x, grads[j][i][x], p.Grad[x])
							}
						}
					}
				}
			}
			mc, err := m.Train(11)
			if err != nil {
				t.Fatal(err)
			}
			if mc.canSplit() != tc.split {
				t.Fatalf("canSplit = %v, want %v", mc.canSplit(), tc.split)
			}
			// A plain Run after a split one sums every row again.
			l, err := m.Step(ctx, 11, b.fill)
			if err != nil {
				t.Fatal(err)
			}
			_, losses := microSplit(t, m, b, []int{0, 5, 11})
			sum := losses[0] + losses[1]
			if math.Abs(l-sum) > 1e-4*math.Abs(l) {
				t.Fatalf("loss of 11 rows %v after a split run, parts %v", l, losses)
			}
		})
	}
}

// TestStepMicroRejectsBadArguments checks StepMicro's errors.
func TestStepMicroRejectsBadArguments(t *testing.T) {
	m, err := New(tinySpecs(3, 4, 2), cpuMLP)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := randomBatch(4, 3, 2, 1)
	fill := func(mc *Machine, lo, hi int) error { return b.slice(0, mc.Batch()).fill(mc) }
	one := [][][]float32{{make([]float32, 12), make([]float32, 4), make([]float32, 8), make([]float32, 2)}}
	for _, tc := range []struct {
		name   string
		bounds []int
		fill   func(*Machine, int, int) error
		grads  [][][]float32
		losses int
	}{
		{"no micro-batch", []int{0}, fill, nil, 0},
		{"not from 0", []int{1, 4}, fill, nil, 1},
		{"not increasing", []int{0, 2, 2, 4}, fill, append(slices.Clone(one), one[0]), 3},
		{"nil fill", []int{0, 2, 4}, nil, one, 2},
		{"too few gradient sets", []int{0, 2, 4}, fill, nil, 2},
		{"too few losses", []int{0, 2, 4}, fill, one, 1},
		{"short gradient", []int{0, 2, 4}, fill, [][][]float32{{make([]float32, 12), make([]float32, 3), make([]float32, 8), make([]float32, 2)}}, 2},
	} {
		err := m.StepMicro(context.Background(), tc.bounds, tc.fill, tc.grads, make([]float64, tc.losses))
		if !errors.Is(err, ErrBadBatch) {
			t.Errorf("%s: err = %v, want ErrBadBatch", tc.name, err)
		}
	}
}
