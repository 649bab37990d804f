//go:build !openblas

package gemm

// useBLAS is false: this build has no OpenBLAS (see blas_openblas.go).
const useBLAS = false

func setUseBLAS(bool) {}

func blasNN(m, n, k int, a []float32, ars, acs int, b []float32, ldb int, c []float32, ldc int, acc bool) bool {
	return false
}

func blasNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) bool {
	return false
}
