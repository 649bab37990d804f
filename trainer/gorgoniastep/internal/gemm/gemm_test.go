package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// withKernel runs f with the AVX kernels on (if the CPU has them) or off.
func withKernel(t *testing.T, avx bool, f func()) {
	t.Helper()
	if avx && !hasAVX {
		t.Skip("no AVX kernel on this CPU or build")
	}
	defer useKernels(avx, false)()
	f()
}

// nnRef is NN in float64 with the same strides.
func nnRef(m, n, k int, a []float32, ars, acs int, b []float32, ldb int, c0 []float32, ldc int, acc bool) []float64 {
	out := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			s := 0.0
			if acc {
				s = float64(c0[i*ldc+j])
			}
			for l := 0; l < k; l++ {
				s += float64(a[i*ars+l*acs]) * float64(b[l*ldb+j])
			}
			out[i*n+j] = s
		}
	}
	return out
}

type shape struct{ m, n, k int }

var shapes = []shape{
	{1, 1, 1}, {4, 16, 1}, {4, 16, 7}, {5, 17, 9}, {3, 3, 3}, {8, 7, 25}, {16, 196, 200},
	{16, 200, 196}, {8, 784, 25}, {200, 196, 16}, {7, 33, 15}, {4, 8, 8}, {4, 2, 8}, {9, 5, 17},
}

// TestNNMatchesReferenceAndKernelsAgree checks NN against float64 sums,
// in both transposition layouts of A, with and without accumulation, and
// that the AVX and Go kernels give the same bits.
func TestNNMatchesReferenceAndKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
		for _, trans := range []bool{false, true} {
			for _, acc := range []bool{false, true} {
				name := fmt.Sprintf("%dx%dx%d/trans=%v/acc=%v", s.m, s.n, s.k, trans, acc)
				t.Run(name, func(t *testing.T) {
					ars, acs := s.k+1, 1 // a padded row length, to test strides
					if trans {
						ars, acs = 1, s.m+2
					}
					a := randSlice(r, (s.m-1)*ars+(s.k-1)*acs+1)
					ldb, ldc := s.n+3, s.n+1
					b := randSlice(r, (s.k-1)*ldb+s.n)
					c0 := randSlice(r, (s.m-1)*ldc+s.n)
					want := nnRef(s.m, s.n, s.k, a, ars, acs, b, ldb, c0, ldc, acc)
					var got [2][]float32
					for ki, avx := range []bool{false, true} {
						if avx && !hasAVX {
							got[ki] = got[0]
							continue
						}
						c := append([]float32(nil), c0...)
						withKernel(t, avx, func() { NN(s.m, s.n, s.k, a, ars, acs, b, ldb, c, ldc, acc) })
						got[ki] = c
					}
					for i := 0; i < s.m; i++ {
						for j := 0; j < s.n; j++ {
							g := got[0][i*ldc+j]
							if math.Float32bits(g) != math.Float32bits(got[1][i*ldc+j]) {
								t.Fatalf("C(%d,%d): Go %v, AVX %v", i, j, g, got[1][i*ldc+j])
							}
							if w := want[i*s.n+j]; math.Abs(float64(g)-w) > 1e-5*float64(s.k+1)*(1+math.Abs(w)) {
								t.Fatalf("C(%d,%d) = %v, want %v", i, j, g, w)
							}
						}
						// Padding between rows is never written.
						for j := s.n; j < ldc && i < s.m-1; j++ {
							if got[0][i*ldc+j] != c0[i*ldc+j] || got[1][i*ldc+j] != c0[i*ldc+j] {
								t.Fatalf("C row %d padding written", i)
							}
						}
					}
				})
			}
		}
	}
}

// TestNTMatchesReferenceAndKernelsAgree does the same for NT.
func TestNTMatchesReferenceAndKernelsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range shapes {
		for _, acc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dx%dx%d/acc=%v", s.m, s.n, s.k, acc), func(t *testing.T) {
				lda, ldb, ldc := s.k+2, s.k+5, s.n+1
				a := randSlice(r, (s.m-1)*lda+s.k)
				b := randSlice(r, (s.n-1)*ldb+s.k)
				c0 := randSlice(r, (s.m-1)*ldc+s.n)
				var got [2][]float32
				for ki, avx := range []bool{false, true} {
					if avx && !hasAVX {
						got[ki] = got[0]
						continue
					}
					c := append([]float32(nil), c0...)
					withKernel(t, avx, func() { NT(s.m, s.n, s.k, a, lda, b, ldb, c, ldc, acc) })
					got[ki] = c
				}
				for i := 0; i < s.m; i++ {
					for j := 0; j < s.n; j++ {
						w := 0.0
						if acc {
							w = float64(c0[i*ldc+j])
						}
						for l := 0; l < s.k; l++ {
							w += float64(a[i*lda+l]) * float64(b[j*ldb+l])
						}
						g := got[0][i*ldc+j]
						if math.Float32bits(g) != math.Float32bits(got[1][i*ldc+j]) {
							t.Fatalf("C(%d,%d): Go %v, AVX %v", i, j, g, got[1][i*ldc+j])
						}
						if math.Abs(float64(g)-w) > 1e-5*float64(s.k+1)*(1+math.Abs(w)) {
							t.Fatalf("C(%d,%d) = %v, want %v", i, j, g, w)
						}
					}
				}
			})
		}
	}
}

// TestSummationOrderIsTheDocumentedOne pins the order on inputs where
// float32 rounding makes it visible: NN sums left to right, NT in eight
// lanes combined as documented.
func TestSummationOrderIsTheDocumentedOne(t *testing.T) {
	big, one := float32(1<<24), float32(1)
	// NN, 1x1: ((0 + 2^24) + 1) + 1 = 2^24 in float32 (each +1 rounds away);
	// another order would keep the ones.
	for _, avx := range []bool{false, true} {
		if avx && !hasAVX {
			continue
		}
		withKernel(t, avx, func() {
			a := []float32{big, one, one}
			b := []float32{1, 1, 1}
			c := []float32{0}
			NN(1, 1, 3, a, 3, 1, b, 1, c, 1, false)
			if c[0] != big {
				t.Fatalf("avx=%v: NN sum %v, want %v (left to right)", avx, c[0], big)
			}
			// NT, k = 9: lane 0 holds 2^24 + 1 (l = 0 and 8), lanes 1..7 hold 1;
			// (((2^24+1)+1)+(1+1)) + ((1+1)+(1+1)) rounds as documented.
			av := []float32{big, 1, 1, 1, 1, 1, 1, 1, one}
			bv := []float32{1, 1, 1, 1, 1, 1, 1, 1, 1}
			var p [8]float32
			p[0] = big + one
			for q := 1; q < 8; q++ {
				p[q] = 1
			}
			want := ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))
			NT(1, 1, 9, av, 9, bv, 9, c, 1, false)
			if c[0] != want {
				t.Fatalf("avx=%v: NT sum %v, want %v", avx, c[0], want)
			}
		})
	}
}

func TestPanicsOnShortSlices(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	a, b, c := make([]float32, 6), make([]float32, 6), make([]float32, 4)
	mustPanic("NN short A", func() { NN(2, 2, 4, a, 4, 1, b, 2, c, 2, false) })
	mustPanic("NN short C", func() { NN(2, 3, 3, a, 3, 1, b, 3, c, 3, false) })
	mustPanic("NT short B", func() { NT(2, 2, 4, a, 3, b, 4, c, 2, false) })
}

func BenchmarkNN(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, s := range []shape{{16, 196, 200}, {8, 784, 25}, {8, 196, 400}, {32, 256, 784}, {784, 256, 32}} {
		for _, avx := range []bool{false, true} {
			if avx && !hasAVX {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", s.m, s.n, s.k, map[bool]string{true: "avx", false: "go"}[avx]), func(b *testing.B) {
				a, bb, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
				defer useKernels(avx, false)()
				c0 := cpuNanos()
				for b.Loop() {
					NN(s.m, s.n, s.k, a, s.k, 1, bb, s.n, c, s.n, false)
				}
				reportFlops(b, s, c0)
			})
		}
	}
}

func BenchmarkNT(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, s := range []shape{{16, 200, 196}, {8, 25, 784}} {
		for _, avx := range []bool{false, true} {
			if avx && !hasAVX {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", s.m, s.n, s.k, map[bool]string{true: "avx", false: "go"}[avx]), func(b *testing.B) {
				a, bb, c := randSlice(r, s.m*s.k), randSlice(r, s.k*s.n), make([]float32, s.m*s.n)
				defer useKernels(avx, false)()
				c0 := cpuNanos()
				for b.Loop() {
					NT(s.m, s.n, s.k, a, s.k, bb, s.k, c, s.n, true)
				}
				reportFlops(b, s, c0)
			})
		}
	}
}

// reportFlops reports GFLOP/s of wall time and, where getrusage works, of
// CPU time since c0.
func reportFlops(b *testing.B, s shape, c0 int64) {
	flops := 2 * float64(s.m*s.n*s.k) * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	if cpu := cpuNanos() - c0; cpu > 0 && c0 > 0 {
		b.ReportMetric(flops/float64(cpu), "cpu-GFLOP/s")
	}
}

// TestRowsVariantsMatchNNAndNT checks NNRows and NTRows against NN and NT
// on the same rows copied into a row-major matrix: the same bits, with
// overlapping rows (as a convolution's patches overlap), for both kernels.
func TestRowsVariantsMatchNNAndNT(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, s := range shapes {
		for _, avx := range []bool{false, true} {
			if avx && !hasAVX {
				continue
			}
			t.Run(fmt.Sprintf("%dx%dx%d/avx=%v", s.m, s.n, s.k, avx), func(t *testing.T) {
				defer useKernels(avx, false)()
				// NN: k rows of width n at increasing, overlapping offsets.
				pool := randSlice(r, 3*s.k+s.n+5)
				rows := make([]int, s.k)
				for l := range rows {
					rows[l] = 3*l + r.IntN(3)
				}
				bm := make([]float32, s.k*s.n)
				for l := range rows {
					copy(bm[l*s.n:(l+1)*s.n], pool[rows[l]:rows[l]+s.n])
				}
				a := randSlice(r, s.m*s.k)
				for _, acc := range []bool{false, true} {
					c0 := randSlice(r, s.m*s.n)
					got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
					NNRows(s.m, s.n, s.k, a, s.k, 1, pool, rows, got, s.n, acc)
					NN(s.m, s.n, s.k, a, s.k, 1, bm, s.n, want, s.n, acc)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("NNRows acc=%v [%d] = %v, NN %v", acc, i, got[i], want[i])
						}
					}
				}
				// NT: n rows of width k.
				pool = randSlice(r, 2*s.n+s.k+5)
				rows = make([]int, s.n)
				for j := range rows {
					rows[j] = 2*j + r.IntN(2)
				}
				bt := make([]float32, s.n*s.k)
				for j := range rows {
					copy(bt[j*s.k:(j+1)*s.k], pool[rows[j]:rows[j]+s.k])
				}
				for _, acc := range []bool{false, true} {
					c0 := randSlice(r, s.m*s.n)
					got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
					NTRows(s.m, s.n, s.k, a, s.k, pool, rows, got, s.n, acc)
					NT(s.m, s.n, s.k, a, s.k, bt, s.k, want, s.n, acc)
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("NTRows acc=%v [%d] = %v, NT %v", acc, i, got[i], want[i])
						}
					}
				}
			})
		}
	}
	mustPanic := func(f func()) {
		defer func() {
			if recover() == nil {
				t.Error("no panic for a row that does not fit")
			}
		}()
		f()
	}
	mustPanic(func() {
		NNRows(1, 4, 2, make([]float32, 2), 2, 1, make([]float32, 6), []int{0, 3}, make([]float32, 4), 4, false)
	})
	mustPanic(func() {
		NTRows(1, 2, 4, make([]float32, 4), 4, make([]float32, 6), []int{0, 3}, make([]float32, 2), 2, false)
	})
}
