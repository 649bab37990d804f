package fixk

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// specials are float32 bit patterns the kernels must treat as the Go code
// does: zeros, subnormals, the extremes, infinities and NaNs of both signs,
// quiet and signalling, with distinct payloads.
var specials = []uint32{
	0x00000000, 0x80000000, // ±0
	0x00000001, 0x80000001, 0x007fffff, 0x807fffff, 0x00400000, // subnormals
	0x00800000, 0x7f7fffff, 0xff7fffff, // smallest normal, ±largest finite
	0x7f800000, 0xff800000, // ±Inf
	0x7fc00000, 0xffc00000, 0x7fc12345, 0xffd00001, 0x7fffffff, 0xffffffff, // quiet NaNs
	0x7f800001, 0xff800001, 0x7fa00000, 0xffbfffff, // signalling NaNs
	0x3f000000, 0xbf000000, 0x3fc00000, 0xc0200000, // ±0.5, 1.5, -2.5: ties at scale 1
}

// values returns n gradients drawn from wide ranges with specials mixed in
// at the given rate (one in every 'rate').
func values(r *rand.Rand, n, rate int) []float32 {
	g := make([]float32, n)
	for i := range g {
		switch {
		case rate > 0 && r.IntN(rate) == 0:
			g[i] = math.Float32frombits(specials[r.IntN(len(specials))])
		case r.IntN(8) == 0:
			g[i] = math.Float32frombits(r.Uint32()) // anything at all
		default:
			g[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(60)-40))
		}
	}
	return g
}

// sums returns n float64s: integers of fixed-point size, with NaNs (of
// distinct payloads), infinities and zeros mixed in.
func sums(r *rand.Rand, n int) []float64 {
	f := make([]float64, n)
	for i := range f {
		switch r.IntN(12) {
		case 0:
			f[i] = math.Float64frombits(0x7ff8000000000000 | r.Uint64()&0xfffff)
		case 1:
			f[i] = math.Float64frombits(0xfff0000000000001 | r.Uint64()&0x7ffff) // signalling
		case 2:
			f[i] = math.Inf(1 - 2*r.IntN(2))
		case 3:
			f[i] = math.Copysign(0, -1)
		case 4:
			f[i] = math.Float64frombits(r.Uint64())
		default:
			f[i] = math.Round(r.NormFloat64() * math.Ldexp(1, r.IntN(50)))
		}
	}
	return f
}

// scales are the scales tried: powers of two as deterministic mode uses
// (including ones that put values far past the fixed-point bound), and
// others the functions accept all the same.
var scales = []float64{1, math.Ldexp(1, 20), math.Ldexp(1, 52+149), math.Ldexp(1, -60), 0.3, -7, 0, 1e300, math.Inf(1), math.NaN()}

// diff64 returns the first index where a and b differ in their bits, or
// -1. Under the race detector two NaNs count as the same (see raceBuild).
func diff64(a, b []float64) int {
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) && !(raceBuild && a[i] != a[i] && b[i] != b[i]) {
			return i
		}
	}
	return -1
}

func diff32(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// both runs f with the portable code, then with the AVX2 kernels.
func both(t testing.TB, f func()) {
	t.Helper()
	if !hasAVX2 {
		t.Skip("no AVX2 kernel in this build or on this CPU: the portable code is the only one")
	}
	func() { defer useKernel(false)(); f() }()
	func() { defer useKernel(true)(); f() }()
}

// check compares every kernel's AVX2 result with the portable code's, bit
// for bit, for K runs g[k] (each at least n long, read from offset off),
// prior sums f0 and the given scale.
func check(t testing.TB, g [][]float32, f0 []float64, scale float64, name string) {
	t.Helper()
	n := len(f0)
	var got [2]struct {
		sum    [][]float64 // by K
		sumMB  []uint32
		nilMB  []uint32
		add    []float64
		addMB  uint32
		unfix  []float32
		maxAbs uint32
	}
	run := 0
	both(t, func() {
		o := &got[run]
		run++
		for K := range len(g) + 1 {
			f := slices.Clone(f0)
			o.sumMB = append(o.sumMB, Sum(f, g[:K], scale))
			o.sum = append(o.sum, f)
			o.nilMB = append(o.nilMB, Sum(nil, g[:K], scale))
		}
		o.add = slices.Clone(f0)
		o.addMB = Add(o.add, g[0], scale)
		o.maxAbs = MaxAbs(g[0][:n])
		o.unfix = make([]float32, n)
		Unfix(o.unfix, f0, scale, 1/scale+0.1)
	})
	w, a := got[0], got[1]
	for K := range w.sum {
		if i := diff64(w.sum[K], a.sum[K]); i >= 0 {
			t.Fatalf("%s K=%d: f[%d] is %#x with AVX2, %#x in Go (inputs %#x)", name, K, i,
				math.Float64bits(a.sum[K][i]), math.Float64bits(w.sum[K][i]), inputsAt(g[:K], i))
		}
		if w.sumMB[K] != a.sumMB[K] || w.nilMB[K] != a.nilMB[K] {
			t.Fatalf("%s K=%d: largest |g| bits %#x (%#x without sums) with AVX2, %#x (%#x) in Go",
				name, K, a.sumMB[K], a.nilMB[K], w.sumMB[K], w.nilMB[K])
		}
	}
	if i := diff64(w.add, a.add); i >= 0 {
		t.Fatalf("%s Add: f[%d] is %#x with AVX2, %#x in Go (sum %#x, input %#x)", name, i,
			math.Float64bits(a.add[i]), math.Float64bits(w.add[i]), math.Float64bits(f0[i]), math.Float32bits(g[0][i]))
	}
	if w.addMB != a.addMB || w.maxAbs != a.maxAbs {
		t.Fatalf("%s: Add's largest |g| %#x, MaxAbs %#x with AVX2; %#x, %#x in Go", name, a.addMB, a.maxAbs, w.addMB, w.maxAbs)
	}
	if i := diff32(w.unfix, a.unfix); i >= 0 {
		t.Fatalf("%s Unfix: dst[%d] is %#x with AVX2, %#x in Go (sum %#x)", name, i,
			math.Float32bits(a.unfix[i]), math.Float32bits(w.unfix[i]), math.Float64bits(f0[i]))
	}
}

func inputsAt(g [][]float32, i int) []uint32 {
	var b []uint32
	for _, r := range g {
		b = append(b, math.Float32bits(r[i]))
	}
	return b
}

// The AVX2 kernels give the portable code's bits for every length from 0
// to 70 and a few large ones, at every start alignment, for one to four
// runs, at every scale tried, with special values mixed in densely and
// sparsely.
func TestKernelsMatchGo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{}
	for n := range 71 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 1000, 4099, 101770)
	for _, n := range lengths {
		for _, scale := range scales {
			for _, rate := range []int{0, 3, 50} {
				off := r.IntN(4)
				g := make([][]float32, 4)
				for k := range g {
					g[k] = values(r, n+off+r.IntN(3), rate)[off:] // some runs longer than f
				}
				check(t, g, sums(r, n), scale, fmt.Sprintf("n=%d scale=%v rate=%d", n, scale, rate))
			}
		}
	}
}

// Every pair of special values, in every lane of a vector and in the tail,
// meets in Set2's and Add's sums: of two NaNs the kernels keep the one the
// Go code keeps.
func TestSpecialPairs(t *testing.T) {
	const n = 11 // eight lanes and a tail of three
	for _, a := range specials {
		for _, b := range specials {
			g := [][]float32{make([]float32, n), make([]float32, n), make([]float32, n)}
			f0 := make([]float64, n)
			for i := range n {
				g[0][i], g[1][i] = math.Float32frombits(a), math.Float32frombits(b)
				g[2][i] = math.Float32frombits(specials[(i+int(a))%len(specials)])
				f0[i] = float64(math.Float32frombits(b)) * float64(i-5)
			}
			for _, scale := range scales {
				check(t, g, f0, scale, fmt.Sprintf("%#x and %#x, scale %v", a, b, scale))
			}
		}
	}
}

// Sum is fixed point as deterministic mode defines it: each value rounded
// to an integer at the scale, ties to even, summed exactly; and the largest
// magnitude as bits.
func TestSumIsTheRoundedSum(t *testing.T) {
	g := [][]float32{{0.5, 1.5, -2.5, 3, -0.25, 1e-3}, {0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, {-1, -1, -1, -1, -1, -7}}
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX2 {
			continue
		}
		func() {
			defer useKernel(avx)()
			f := []float64{9, 9, 9, 9, 9, 9}
			mb := Sum(f, g, 2)
			want := []float64{1 + 1 - 2, 3 + 1 - 2, -5 + 1 - 2, 6 + 1 - 2, 0 + 1 - 2, 0 + 1 - 14}
			if diff64(f, want) >= 0 || mb != math.Float32bits(7) {
				t.Fatalf("avx=%v: %v and %#x, want %v and %#x", avx, f, mb, want, math.Float32bits(7))
			}
		}()
	}
}

func TestShortRunsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"Set":  func() { Set(make([]float64, 9), make([]float32, 8), 1) },
		"Set2": func() { Set2(make([]float64, 9), make([]float32, 9), make([]float32, 8), 1) },
		"Add":  func() { Add(make([]float64, 16), make([]float32, 15), 1) },
		"Sum": func() {
			Sum(make([]float64, 9), [][]float32{make([]float32, 9), make([]float32, 9), make([]float32, 3)}, 1)
		},
		"Unfix": func() { Unfix(make([]float32, 9), make([]float64, 8), 1, 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Fatalf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// FuzzKernels: any bytes, read as float32 runs and float64 sums, give the
// same bits with the AVX2 kernels as in Go.
func FuzzKernels(f *testing.F) {
	f.Add([]byte{0, 0, 0xc0, 0x7f, 1, 0, 0x80, 0xff, 0, 0, 0, 0x3f}, int16(20), uint8(3))
	f.Add(make([]byte, 200), int16(-3), uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, s int16, K uint8) {
		K = K%4 + 1
		n := len(b) / 4 / int(K)
		g := make([][]float32, K)
		for k := range g {
			g[k] = make([]float32, n)
			for i := range n {
				g[k][i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*(k*n+i):]))
			}
		}
		f0 := make([]float64, n)
		for i := range n {
			f0[i] = float64(g[0][(i+1)%n]) * 3
		}
		for len(g) < 4 {
			g = append(g, g[0])
		}
		check(t, g, f0, math.Ldexp(1, int(s)), fmt.Sprintf("n=%d s=%d", n, s))
	})
}

// The benchmarks run each pass over the MNIST MLP's 101,770 values, with
// gradients of a training run's scale.
const benchN = 101770

func benchInputs() ([][]float32, []float64) {
	r := rand.New(rand.NewPCG(3, 4))
	g := make([][]float32, 4)
	for k := range g {
		g[k] = make([]float32, benchN)
		for i := range g[k] {
			g[k][i] = float32(r.NormFloat64() * 1e-3)
		}
	}
	return g, make([]float64, benchN)
}

func benchKernels(b *testing.B, bytes int, f func()) {
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX2 {
			continue
		}
		b.Run(map[bool]string{false: "go", true: "avx2"}[avx], func(b *testing.B) {
			defer useKernel(avx)()
			b.SetBytes(int64(bytes))
			for b.Loop() {
				f()
			}
		})
	}
}

func BenchmarkSum(b *testing.B) {
	g, f := benchInputs()
	scale := math.Ldexp(1, 40)
	for _, K := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("K=%d", K), func(b *testing.B) {
			benchKernels(b, benchN*(4*K+8), func() { Sum(f, g[:K], scale) })
		})
	}
	b.Run("nil", func(b *testing.B) {
		benchKernels(b, benchN*4, func() { Sum(nil, g[:1], scale) })
	})
}

func BenchmarkAdd(b *testing.B) {
	g, f := benchInputs()
	benchKernels(b, benchN*(4+16), func() { Add(f, g[0], math.Ldexp(1, 40)) })
}

func BenchmarkUnfix(b *testing.B) {
	g, f := benchInputs()
	Sum(f, g[:2], math.Ldexp(1, 40))
	dst := make([]float32, benchN)
	benchKernels(b, benchN*(8+4), func() { Unfix(dst, f, math.Ldexp(1, -40), 0.5) })
}
