//go:build openblas

package gemm

import (
	"os"

	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/internal/gemm/cblas"
)

// useBLAS routes NN and NT to OpenBLAS's cblas_sgemm (see the package
// documentation).
var useBLAS = true

func init() {
	// One thread per process unless the environment says otherwise: a
	// data-parallel job runs one worker per core (torchrun likewise sets
	// OMP_NUM_THREADS=1), and a fixed count keeps results reproducible.
	if os.Getenv("OPENBLAS_NUM_THREADS") == "" && os.Getenv("OMP_NUM_THREADS") == "" {
		cblas.SetThreads(1)
	}
}

func setUseBLAS(on bool) { useBLAS = on }

func beta(acc bool) float32 {
	if acc {
		return 1
	}
	return 0
}

// blasNN is NN through cblas_sgemm when A is row-major (acs == 1) or
// transposed (ars == 1); it reports false for other strides.
func blasNN(m, n, k int, a []float32, ars, acs int, b []float32, ldb int, c []float32, ldc int, acc bool) bool {
	switch {
	case acs == 1 && ars >= k:
		cblas.Sgemm(false, false, m, n, k, a, ars, b, ldb, beta(acc), c, ldc)
	case ars == 1 && acs >= m:
		cblas.Sgemm(true, false, m, n, k, a, acs, b, ldb, beta(acc), c, ldc)
	default:
		return false
	}
	return true
}

// blasNT is NT through cblas_sgemm.
func blasNT(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) bool {
	cblas.Sgemm(false, true, m, n, k, a, lda, b, ldb, beta(acc), c, ldc)
	return true
}
