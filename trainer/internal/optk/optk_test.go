package optk

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// adamInputs returns n values, gradients and moments drawn from wide
// ranges, with zeros, subnormals, huge and infinite entries mixed in.
func adamInputs(r *rand.Rand, n int) (val, g, m, v []float32) {
	val, g, m, v = make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-42, 3e38, -3e38, float32(math.Inf(1)), float32(math.Inf(-1))}
	for i := range n {
		e := float64(r.IntN(40) - 30)
		val[i] = float32(r.NormFloat64())
		g[i] = float32(r.NormFloat64() * math.Pow(2, e))
		m[i] = float32(r.NormFloat64() * math.Pow(2, e))
		v[i] = float32(math.Abs(r.NormFloat64()) * math.Pow(2, 2*e))
		if r.IntN(16) == 0 {
			g[i] = special[r.IntN(len(special))]
		}
		if r.IntN(32) == 0 {
			v[i] = 0
		}
	}
	return val, g, m, v
}

func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			return i
		}
	}
	return -1
}

// The AVX kernel gives the portable code's bits, in place and not, with
// and without the gradient written back, for every length around the
// vector width.
func TestAdamAVXMatchesGo(t *testing.T) {
	if !hasAVX {
		t.Skip("no AVX kernel in this build or on this CPU: the portable code is the only one")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 8, 9, 15, 16, 17, 63, 64, 1000, 4099} {
		for _, inPlace := range []bool{false, true} {
			for _, store := range []bool{false, true} {
				c := &AdamCoeffs{GScale: 1 / float32(3+n%5), B1: 0.9, B2: 0.999, Alpha: 1e-3 * 0.7, Eps: 1e-8, StoreGrad: store}
				c.C1, c.C2 = 1-c.B1, 1-c.B2
				if n%2 == 0 {
					c.GScale = 1
				}
				val, g, m, v := adamInputs(r, n)
				run := func(avx bool) (val2, g2, mo, vo []float32) {
					defer useKernel(avx)()
					val2, g2 = slices.Clone(val), slices.Clone(g)
					mi, vi := slices.Clone(m), slices.Clone(v)
					mo, vo = make([]float32, n), make([]float32, n)
					if inPlace {
						mo, vo = mi, vi
					}
					Adam(val2, g2, mi, vi, mo, vo, c)
					if !inPlace && (sameBits(mi, m) >= 0 || sameBits(vi, v) >= 0) {
						t.Fatalf("n=%d: the input moments changed in an update out of place", n)
					}
					return val2, g2, mo, vo
				}
				wv, wg, wm, wvv := run(false)
				gv, gg, gm, gvv := run(true)
				for name, p := range map[string][2][]float32{"values": {wv, gv}, "gradients": {wg, gg}, "m": {wm, gm}, "v": {wvv, gvv}} {
					if i := sameBits(p[0], p[1]); i >= 0 {
						t.Fatalf("n=%d inPlace=%v store=%v: %s[%d] is %v (%08x) with AVX, %v (%08x) in Go",
							n, inPlace, store, name, i, p[1][i], math.Float32bits(p[1][i]), p[0][i], math.Float32bits(p[0][i]))
					}
				}
				if !store && sameBits(wg, g) >= 0 {
					t.Fatalf("n=%d: gradients changed without StoreGrad", n)
				}
			}
		}
	}
}

// The portable code is the textbook update, element by element.
func TestAdamGoIsTheUpdate(t *testing.T) {
	val, g, m, v := []float32{1, -2}, []float32{0.5, -4}, []float32{0.1, 0}, []float32{0.01, 0}
	c := &AdamCoeffs{GScale: 0.5, B1: 0.9, C1: 0.1, B2: 0.999, C2: 1 - float32(0.999), Alpha: 0.01, Eps: 1e-8, StoreGrad: true}
	want := slices.Clone(val)
	wm, wv := make([]float32, 2), make([]float32, 2)
	for i := range want {
		gi := g[i] * 0.5
		wm[i] = 0.9*m[i] + 0.1*gi
		wv[i] = 0.999*v[i] + c.C2*gi*gi
		want[i] -= 0.01 * wm[i] / (float32(math.Sqrt(float64(wv[i]))) + 1e-8)
	}
	Adam(val, g, m, v, m, v, c)
	if sameBits(val, want) >= 0 || sameBits(m, wm) >= 0 || sameBits(v, wv) >= 0 || g[0] != 0.25 || g[1] != -2 {
		t.Fatalf("got values %v m %v v %v g %v; want values %v m %v v %v", val, m, v, g, want, wm, wv)
	}
}

func TestAdamPanicsOnShortSlices(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	a := make([]float32, 4)
	Adam(a, a[:3], make([]float32, 4), make([]float32, 4), make([]float32, 4), make([]float32, 4), &AdamCoeffs{})
}

// BenchmarkAdam: one update of the MNIST MLP's 203,530 parameters.
func BenchmarkAdam(b *testing.B) {
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		b.Run(map[bool]string{false: "go", true: "avx"}[avx], func(b *testing.B) {
			defer useKernel(avx)()
			// Gradients and moments of a training run's scale (no
			// subnormal: those take a slow path in hardware).
			r := rand.New(rand.NewPCG(3, 4))
			n := 203530
			val, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range n {
				val[i], g[i], m[i] = float32(r.NormFloat64()), float32(r.NormFloat64()*1e-3), float32(r.NormFloat64()*1e-3)
				v[i] = m[i] * m[i]
			}
			m2, v2 := slices.Clone(m), slices.Clone(v)
			c := &AdamCoeffs{GScale: 1, B1: 0.9, C1: 0.1, B2: 0.999, C2: 1 - float32(0.999), Alpha: 1e-9, Eps: 1e-8}
			b.SetBytes(int64(len(val)) * 4 * 4)
			for b.Loop() {
				Adam(val, g, m, v, m2, v2, c)
				m, m2, v, v2 = m2, m, v2, v
			}
		})
	}
}
