package sumk

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// operands32 returns n float32s of every kind: finite of any exponent,
// zeros of both signs, subnormals, infinities and NaNs (quiet and
// signalling, both signs, distinct payloads).
func operands32(r *rand.Rand, n int) []float32 {
	specials := []uint32{0, 1 << 31, 1, 1<<31 | 0x7fffff, 0x7f7fffff, 0x7f800000, 0xff800000,
		0x7fc00000, 0xffc00001, 0x7f800001, 0xffa00000, 0x4b400000}
	v := make([]float32, n)
	for i := range v {
		switch r.IntN(4) {
		case 0:
			v[i] = math.Float32frombits(specials[r.IntN(len(specials))])
		case 1:
			v[i] = math.Float32frombits(r.Uint32())
		default:
			v[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(24)))
		}
	}
	return v
}

// diff32 is diff for float32.
func diff32(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(raceBuild && a[i] != a[i] && b[i] != b[i]) {
			return i
		}
	}
	return -1
}

// To32's AVX kernel gives the portable code's bits for every length from
// 0 to 70 and a few large ones, at every start alignment, out of place and
// in place into either operand.
func TestTo32MatchesGo(t *testing.T) {
	if !hasAVX {
		t.Skip("no AVX kernel in this build or on this CPU: the portable code is the only one")
	}
	r := rand.New(rand.NewPCG(17, 18))
	lengths := []int{}
	for n := range 71 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 1000, 4099, 101770)
	for _, n := range lengths {
		off := r.IntN(8)
		x, y := operands32(r, n+off)[off:], operands32(r, n+off+1)[off:]
		for _, into := range []string{"o", "x", "y"} {
			var got [2][]float32
			for k, avx := range []bool{false, true} {
				func() {
					defer useKernel(avx)()
					xs, ys, o := slices.Clone(x), slices.Clone(y), make([]float32, n)
					switch into {
					case "x":
						o = xs[:n]
					case "y":
						o = ys[:n]
					}
					To32(o, xs, ys)
					got[k] = o
				}()
			}
			if i := diff32(got[0], got[1]); i >= 0 {
				t.Fatalf("n=%d into %s: o[%d] = %#x with AVX, %#x in Go (x %#x, y %#x)", n, into, i,
					math.Float32bits(got[1][i]), math.Float32bits(got[0][i]), math.Float32bits(x[i]), math.Float32bits(y[i]))
			}
		}
	}
}

// Of two NaNs To32 keeps x's, in every lane, with the AVX kernel and the
// Go code (of a normal build: see raceBuild); +0 + -0 is +0.
func TestTo32KeepsXsNaN(t *testing.T) {
	const n = 37
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = math.Float32frombits(0x7fc00000|uint32(i+1)), math.Float32frombits(0xff800100|uint32(i))
	}
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		func() {
			defer useKernel(avx)()
			o := make([]float32, n)
			To32(o, x, y)
			for i := range o {
				if math.Float32bits(o[i]) != math.Float32bits(x[i]) && (!raceBuild || avx && i < n&^15) { // the tail is Go code
					t.Fatalf("avx=%v: o[%d] = %#x, want x's %#x", avx, i, math.Float32bits(o[i]), math.Float32bits(x[i]))
				}
			}
			z, m := make([]float32, n), make([]float32, n)
			for i := range m {
				m[i] = float32(math.Copysign(0, -1))
			}
			To32(o, z, m)
			for i := range o {
				if math.Float32bits(o[i]) != 0 {
					t.Fatalf("avx=%v: +0 + -0 = %#x at %d", avx, math.Float32bits(o[i]), i)
				}
			}
		}()
	}
}

// BenchmarkTo32: one sum of the MNIST MLP's 101,770 gradients in float32,
// as the ordered allreduce adds a part to the running sum.
func BenchmarkTo32(b *testing.B) {
	r := rand.New(rand.NewPCG(19, 20))
	n := 101770
	x, y, o := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range n {
		x[i], y[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		b.Run(map[bool]string{false: "go", true: "avx"}[avx], func(b *testing.B) {
			defer useKernel(avx)()
			b.SetBytes(int64(n) * 12)
			for b.Loop() {
				To32(o, x, y)
			}
		})
	}
}
