package sumk

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// operands returns n float64s of every kind: finite of any exponent,
// zeros of both signs, subnormals, infinities and NaNs (quiet and
// signalling, both signs, distinct payloads).
func operands(r *rand.Rand, n int) []float64 {
	specials := []uint64{0, 1 << 63, 1, 1<<63 | 0xfffffffffffff, 0x7fefffffffffffff, 0x7ff0000000000000, 0xfff0000000000000,
		0x7ff8000000000000, 0xfff8000000000001, 0x7ff0000000000001, 0xfff4000000000000, 0x4338000000000000}
	v := make([]float64, n)
	for i := range v {
		switch r.IntN(4) {
		case 0:
			v[i] = math.Float64frombits(specials[r.IntN(len(specials))])
		case 1:
			v[i] = math.Float64frombits(r.Uint64())
		default:
			v[i] = math.Round(r.NormFloat64() * math.Ldexp(1, r.IntN(52)))
		}
	}
	return v
}

// diff returns the first index where a and b differ in their bits, or -1.
// Under the race detector two NaNs count as the same (see raceBuild).
func diff(a, b []float64) int {
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) && !(raceBuild && a[i] != a[i] && b[i] != b[i]) {
			return i
		}
	}
	return -1
}

// The AVX kernel gives the portable code's bits for every length from 0
// to 70 and a few large ones, at every start alignment, out of place and
// in place into either operand.
func TestToMatchesGo(t *testing.T) {
	if !hasAVX {
		t.Skip("no AVX kernel in this build or on this CPU: the portable code is the only one")
	}
	r := rand.New(rand.NewPCG(7, 8))
	lengths := []int{}
	for n := range 71 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 1000, 4099, 101770)
	for _, n := range lengths {
		off := r.IntN(4)
		x, y := operands(r, n+off)[off:], operands(r, n+off+1)[off:]
		for _, into := range []string{"o", "x", "y"} {
			var got [2][]float64
			for k, avx := range []bool{false, true} {
				func() {
					defer useKernel(avx)()
					xs, ys, o := slices.Clone(x), slices.Clone(y), make([]float64, n)
					switch into {
					case "x":
						o = xs[:n]
					case "y":
						o = ys[:n]
					}
					To(o, xs, ys)
					got[k] = o
				}()
			}
			if i := diff(got[0], got[1]); i >= 0 {
				t.Fatalf("n=%d into %s: o[%d] = %#x with AVX, %#x in Go (x %#x, y %#x)", n, into, i,
					math.Float64bits(got[1][i]), math.Float64bits(got[0][i]), math.Float64bits(x[i]), math.Float64bits(y[i]))
			}
		}
	}
}

// Of two NaNs the sum keeps x's, in every lane, with the AVX kernel and
// the Go code (of a normal build: see raceBuild).
func TestToKeepsXsNaN(t *testing.T) {
	x, y := make([]float64, 11), make([]float64, 11)
	for i := range x {
		x[i], y[i] = math.Float64frombits(0x7ff8000000000000|uint64(i+1)), math.Float64frombits(0xfff0000000000100|uint64(i))
	}
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		func() {
			defer useKernel(avx)()
			o := make([]float64, len(x))
			To(o, x, y)
			for i := range o {
				if math.Float64bits(o[i]) != math.Float64bits(x[i]) && (!raceBuild || avx && i < len(o)&^7) { // the tail is Go code
					t.Fatalf("avx=%v: o[%d] = %#x, want x's %#x", avx, i, math.Float64bits(o[i]), math.Float64bits(x[i]))
				}
			}
		}()
	}
}

func TestToPanicsOnShortOperands(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	To(make([]float64, 9), make([]float64, 9), make([]float64, 8))
}

// BenchmarkTo: one sum of the MNIST MLP's 101,770 gradients in float64,
// as deterministic mode's allreduce of two ranks adds them.
func BenchmarkTo(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	n := 101770
	x, y, o := make([]float64, n), make([]float64, n), make([]float64, n)
	for i := range n {
		x[i], y[i] = math.Round(r.NormFloat64()*1e12), math.Round(r.NormFloat64()*1e12)
	}
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		b.Run(fmt.Sprint(map[bool]string{false: "go", true: "avx"}[avx]), func(b *testing.B) {
			defer useKernel(avx)()
			b.SetBytes(int64(n) * 24)
			for b.Loop() {
				To(o, x, y)
			}
		})
	}
}
