package gemm

// hasAVX reports whether this build and CPU have the AVX kernels.
var hasAVX = useAVX

// useKernels selects the AVX kernels (avx) or the portable Go code, and
// OpenBLAS (blas, only in a build with it); it returns a function that
// restores the previous choice.
func useKernels(avx, blas bool) (restore func()) {
	oldAVX, oldBLAS := useAVX, useBLAS
	setUseAVX(avx)
	setUseBLAS(blas)
	return func() {
		setUseAVX(oldAVX)
		setUseBLAS(oldBLAS)
	}
}
