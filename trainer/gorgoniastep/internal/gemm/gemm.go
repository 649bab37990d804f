// Package gemm multiplies small row-major float32 matrices for the
// convolution ops of package cpuops: C = A·B and C = A·Bᵀ, with or without
// accumulating into C.
//
// # Summation order (bit-identity)
//
// Every output element is summed in one fixed order that depends on the
// shapes alone, the same on every CPU and in every build:
//
//   - NN: s = 0; for l = 0..k-1: s += A(i,l)·B(l,j); then C(i,j) = s, or
//     C(i,j) + s when accumulating.
//   - NT: eight partial sums p[q] over l ≡ q (mod 8), l < k rounded up to a
//     multiple of 8 (the missing terms are +0·+0), combined as
//     ((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7)), then stored or added like NN.
//
// Each product is rounded to float32 before it is added (no fused
// multiply-add), so the AVX kernels on amd64 and the portable Go code give
// the same bits; tests check this. Build with the purego tag to use only the
// portable code.
//
// # OpenBLAS
//
// Built with -tags openblas (cgo, linked with -lopenblas, e.g. Debian's
// libopenblas-dev), NN and NT call cblas_sgemm instead (NNRows and NTRows,
// whose B is not a matrix BLAS can describe, do not), single-threaded
// unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set. OpenBLAS sums in
// its own order, which depends on the CPU it detects at run time (and may
// depend on its thread count): its results agree with the Go kernels
// within float32 rounding, and are the same bits only between processes
// that load the same library on the same kind of CPU with the same thread
// count.
//
// # Concurrency
//
// The functions keep no state; concurrent calls are safe when their output
// matrices do not overlap.
package gemm

import "fmt"

// Kernel names the implementation in use: "openblas" (built with
// -tags openblas), "avx" (amd64 with AVX) or "go" (portable, or
// -tags purego).
func Kernel() string {
	switch {
	case useBLAS:
		return "openblas"
	case useAVX:
		return "avx"
	}
	return "go"
}

// NN sets C (m×n) to A·B, or adds A·B to C when acc is true. A (m×k) is
// read as A(i,l) = a[i*ars + l*acs], so a row-major A has ars = its row
// length and acs = 1, and a transposed one ars = 1, acs = its row length.
// B (k×n) is row-major with row length ldb, C row-major with row length
// ldc. It panics if a slice is too short for the shapes, like an index out
// of range.
func NN(m, n, k int, a []float32, ars, acs int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	checkOut(m, n, c, ldc)
	if k <= 0 {
		if !acc {
			for i := 0; i < m; i++ {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return
	}
	if ars < 0 || acs < 0 || (m-1)*ars+(k-1)*acs >= len(a) {
		panic(fmt.Sprintf("gemm: A of %d elements too short for %dx%d with strides %d, %d", len(a), m, k, ars, acs))
	}
	if ldb < n || (k-1)*ldb+n > len(b) {
		panic(fmt.Sprintf("gemm: B of %d elements too short for %dx%d with row length %d", len(b), k, n, ldb))
	}
	if useBLAS && blasNN(m, n, k, a, ars, acs, b, ldb, c, ldc, acc) {
		return
	}
	i := 0
	if useAVX {
		for ; i+4 <= m; i += 4 {
			nn4AVX(k, n, &a[i*ars], ars, acs, &b[0], ldb, &c[i*ldc], ldc, acc)
		}
	}
	for ; i < m; i++ {
		nnRowGo(n, k, a[i*ars:], acs, b, ldb, c[i*ldc:i*ldc+n], acc)
	}
}

// nnRowGo computes one row of NN in the documented order: it walks B row
// by row (contiguous), keeping the running sums of up to 64 columns at a
// time.
func nnRowGo(n, k int, a []float32, acs int, b []float32, ldb int, c []float32, acc bool) {
	var s [64]float32
	for j0 := 0; j0 < n; j0 += len(s) {
		w := min(len(s), n-j0)
		sum := s[:w]
		clear(sum)
		for l := 0; l < k; l++ {
			x := a[l*acs]
			row := b[l*ldb+j0 : l*ldb+j0+w]
			for j, y := range row {
				sum[j] += float32(x * y) // the conversion forbids fusing into an FMA
			}
		}
		out := c[j0 : j0+w]
		if acc {
			for j := range out {
				out[j] += sum[j]
			}
		} else {
			copy(out, sum)
		}
	}
}

// NT sets C (m×n) to A·Bᵀ, or adds it to C when acc is true: C(i,j) is the
// dot product of row i of A (m×k, row length lda) and row j of B (n×k, row
// length ldb), summed as the package documentation says. C is row-major
// with row length ldc. It panics if a slice is too short for the shapes.
func NT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	checkOut(m, n, c, ldc)
	if k <= 0 {
		if !acc {
			for i := 0; i < m; i++ {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return
	}
	if lda < k || (m-1)*lda+k > len(a) {
		panic(fmt.Sprintf("gemm: A of %d elements too short for %dx%d with row length %d", len(a), m, k, lda))
	}
	if ldb < k || (n-1)*ldb+k > len(b) {
		panic(fmt.Sprintf("gemm: B of %d elements too short for %dx%d with row length %d", len(b), n, k, ldb))
	}
	if useBLAS && blasNT(m, n, k, a, lda, b, ldb, c, ldc, acc) {
		return
	}
	i := 0
	if useAVX {
		for ; i+4 <= m; i += 4 {
			j := 0
			for ; j+2 <= n; j += 2 {
				nt4x2AVX(k, &a[i*lda], lda, &b[j*ldb], ldb, &c[i*ldc+j], ldc, acc)
			}
			if j < n && n >= 2 {
				// The last, odd column: compute columns n-2 and n-1 into a
				// scratch tile and keep the second (same bits as a 4x1
				// kernel would give, since each element is summed alone).
				var t [8]float32
				nt4x2AVX(k, &a[i*lda], lda, &b[(n-2)*ldb], ldb, &t[0], 2, false)
				for r := 0; r < 4; r++ {
					store(&c[(i+r)*ldc+n-1], t[2*r+1], acc)
				}
				j = n
			}
			for ; j < n; j++ {
				for r := i; r < i+4; r++ {
					store(&c[r*ldc+j], dot8Go(k, a[r*lda:r*lda+k], b[j*ldb:j*ldb+k]), acc)
				}
			}
		}
	}
	for ; i < m; i++ {
		for j := 0; j < n; j++ {
			store(&c[i*ldc+j], dot8Go(k, a[i*lda:i*lda+k], b[j*ldb:j*ldb+k]), acc)
		}
	}
}

func store(c *float32, s float32, acc bool) {
	if acc {
		*c += s
	} else {
		*c = s
	}
}

// dot8Go is the dot product of a and b (k elements each) in NT's order.
func dot8Go(k int, a, b []float32) float32 {
	var p [8]float32
	l := 0
	for ; l+8 <= k; l += 8 {
		aa, bb := a[l:l+8:l+8], b[l:l+8:l+8]
		for q := range p {
			p[q] += float32(aa[q] * bb[q])
		}
	}
	if l < k {
		for q := range p {
			var prod float32 // +0·+0 past the end, as a masked load gives
			if l+q < k {
				prod = float32(a[l+q] * b[l+q])
			}
			p[q] += prod
		}
	}
	return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))
}

func checkOut(m, n int, c []float32, ldc int) {
	if ldc < n || (m-1)*ldc+n > len(c) {
		panic(fmt.Sprintf("gemm: C of %d elements too short for %dx%d with row length %d", len(c), m, n, ldc))
	}
}
