//go:build openblas

package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestOpenBLASMatchesGoKernels checks the OpenBLAS build against the
// package's own kernels: equal within float32 rounding (the summation
// orders differ), for row-major, transposed and other A strides (which
// fall back to the Go kernels), with and without accumulation.
func TestOpenBLASMatchesGoKernels(t *testing.T) {
	if Kernel() != "openblas" {
		t.Fatalf("Kernel() = %q in a build with -tags openblas", Kernel())
	}
	r := rand.New(rand.NewPCG(7, 7))
	for _, s := range shapes {
		for _, layout := range []string{"rowmajor", "transposed", "strided"} {
			for _, acc := range []bool{false, true} {
				t.Run(fmt.Sprintf("NN/%dx%dx%d/%s/acc=%v", s.m, s.n, s.k, layout, acc), func(t *testing.T) {
					ars, acs := s.k, 1
					switch layout {
					case "transposed":
						ars, acs = 1, s.m
					case "strided":
						ars, acs = 2*s.k+1, 2
					}
					a := randSlice(r, (s.m-1)*ars+(s.k-1)*acs+1)
					b := randSlice(r, s.k*s.n)
					c0 := randSlice(r, s.m*s.n)
					got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
					NN(s.m, s.n, s.k, a, ars, acs, b, s.n, got, s.n, acc)
					func() {
						defer useKernels(hasAVX, false)()
						NN(s.m, s.n, s.k, a, ars, acs, b, s.n, want, s.n, acc)
					}()
					near(t, got, want, s.k)
				})
			}
		}
		for _, acc := range []bool{false, true} {
			t.Run(fmt.Sprintf("NT/%dx%dx%d/acc=%v", s.m, s.n, s.k, acc), func(t *testing.T) {
				a, b := randSlice(r, s.m*s.k), randSlice(r, s.n*s.k)
				c0 := randSlice(r, s.m*s.n)
				got, want := append([]float32(nil), c0...), append([]float32(nil), c0...)
				NT(s.m, s.n, s.k, a, s.k, b, s.k, got, s.n, acc)
				func() {
					defer useKernels(hasAVX, false)()
					NT(s.m, s.n, s.k, a, s.k, b, s.k, want, s.n, acc)
				}()
				near(t, got, want, s.k)
			})
		}
	}
}

// near allows what float32 rounding allows for sums of k products of
// unit normals: a relative 1e-6 per term, against the sum of magnitudes.
func near(t *testing.T, got, want []float32, k int) {
	t.Helper()
	for i := range got {
		tol := 1e-6 * float64(k+1) * (1 + math.Abs(float64(want[i])))
		if d := math.Abs(float64(got[i] - want[i])); d > tol {
			t.Fatalf("element %d: OpenBLAS %v, Go kernels %v (tolerance %.2g)", i, got[i], want[i], tol)
		}
	}
}
