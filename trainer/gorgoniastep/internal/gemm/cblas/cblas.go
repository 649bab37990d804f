//go:build openblas

package cblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>

// Declared here rather than taken from the header, which differs between
// the cblas.h alternatives a Debian system may select.
void openblas_set_num_threads(int num_threads);
*/
import "C"

import "unsafe"

// SetThreads sets OpenBLAS's thread count for the process.
func SetThreads(n int) { C.openblas_set_num_threads(C.int(n)) }

// Sgemm computes C = op(A)·op(B) + beta·C for row-major matrices, with
// op(A) of m×k (transA: A is stored k×m), op(B) of k×n (transB: B is
// stored n×k) and alpha 1. The caller checks the shapes; the slices must
// be non-empty.
func Sgemm(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ta, tb := uint32(C.CblasNoTrans), uint32(C.CblasNoTrans)
	if transA {
		ta = C.CblasTrans
	}
	if transB {
		tb = C.CblasTrans
	}
	C.cblas_sgemm(C.CblasRowMajor, ta, tb, C.blasint(m), C.blasint(n), C.blasint(k), 1,
		(*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda), (*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}
