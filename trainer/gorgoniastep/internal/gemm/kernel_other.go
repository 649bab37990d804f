//go:build !amd64 || purego

package gemm

const useAVX = false

func setUseAVX(bool) {}

func nn4AVX(k, n int, a *float32, ars, acs int, b *float32, ldb int, c *float32, ldc int, acc bool) {
	panic("gemm: no AVX kernel in this build")
}

func nt4x2AVX(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc bool) {
	panic("gemm: no AVX kernel in this build")
}

func nn4RowsAVX(k, n int, a *float32, ars, acs int, b *float32, rows *int, c *float32, ldc int, acc bool) {
	panic("gemm: no AVX kernel in this build")
}
