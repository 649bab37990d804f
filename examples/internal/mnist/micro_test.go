package mnist

import (
	"context"
	"fmt"
	"math"
	"testing"
)

// splitImages cuts n images into micro-batches of the given sizes.
func splitImages(px []float32, labels []int, sizes []int) ([][]float32, [][]int) {
	var mp [][]float32
	var ml [][]int
	lo := 0
	for _, s := range sizes {
		mp = append(mp, px[lo*Pixels:(lo+s)*Pixels])
		ml = append(ml, labels[lo:lo+s])
		lo += s
	}
	return mp, ml
}

// StepMicro gives each micro-batch the bits of its own Step, for both
// models (whose gradient and loss sums are split in one run), which is
// what keeps deterministic mode's results independent of how micro-batches
// are spread over the ranks.
func TestStepMicroMatchesStepPerMicroBatch(t *testing.T) {
	ctx := context.Background()
	for _, kind := range ModelKinds {
		m := newModel(t, kind, 3)
		px, labels := randomImages(40, 9)
		for _, sizes := range [][]int{{16, 16, 8}, {16}, {8, 16, 16}} {
			mp, ml := splitImages(px, labels, sizes)
			k := len(sizes)
			grads := make([][][]float32, k-1)
			for j := range grads {
				for _, p := range m.Params() {
					grads[j] = append(grads[j], make([]float32, len(p.Grad)))
				}
			}
			losses := make([]float64, k)
			if err := m.StepMicro(ctx, mp, ml, grads, losses); err != nil {
				t.Fatalf("%s %v: %v", kind, sizes, err)
			}
			var last [][]float32
			for _, p := range m.Params() {
				last = append(last, append([]float32(nil), p.Grad...))
			}
			grads = append(grads, last)
			for j := range k {
				l, err := m.Step(ctx, mp[j], ml[j])
				if err != nil {
					t.Fatal(err)
				}
				where := fmt.Sprintf("%s, micro-batches %v, #%d", kind, sizes, j)
				if math.Float64bits(l) != math.Float64bits(losses[j]) {
					t.Fatalf("%s: loss %v, Step gives %v", where, losses[j], l)
				}
				for i, p := range m.Params() {
					for x, g := range p.Grad {
						if math.Float32bits(g) != math.Float32bits(grads[j][i][x]) {
							t.Fatalf("%s: %s[%d] = %v, Step gives %v", where, p.Name, x, grads[j][i][x], g)
						}
					}
				}
			}
		}
	}
}

// BenchmarkStepMicro compares a rank's compute for a share of 32 samples
// in deterministic mode: two micro-batches of 16 in one StepMicro call
// against two Step calls (the StepFunc once per micro-batch) and one Step
// of 32 (the non-deterministic mode's call).
func BenchmarkStepMicro(b *testing.B) {
	ctx := context.Background()
	for _, kind := range ModelKinds {
		m := newModel(b, kind, 1)
		px, labels := randomImages(32, 1)
		mp, ml := splitImages(px, labels, []int{16, 16})
		grads := [][][]float32{nil}
		for _, p := range m.Params() {
			grads[0] = append(grads[0], make([]float32, len(p.Grad)))
		}
		losses := make([]float64, 2)
		run := map[string]func() error{
			"one-call-of-32": func() error { _, err := m.Step(ctx, px, labels); return err },
			"two-calls-of-16": func() error {
				for j := range 2 {
					if _, err := m.Step(ctx, mp[j], ml[j]); err != nil {
						return err
					}
				}
				return nil
			},
			"micro-2x16": func() error { return m.StepMicro(ctx, mp, ml, grads, losses) },
		}
		for _, name := range []string{"one-call-of-32", "two-calls-of-16", "micro-2x16"} {
			b.Run(kind+"/"+name, func(b *testing.B) {
				f := run[name]
				if err := f(); err != nil { // compile outside the timing
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
