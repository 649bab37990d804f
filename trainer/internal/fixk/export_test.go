package fixk

// hasAVX2 reports whether this build and CPU have the AVX2 kernels.
var hasAVX2 = useAVX2

// useKernel selects the AVX2 kernels (avx) or the portable Go code; it
// returns a function that restores the previous choice.
func useKernel(avx bool) (restore func()) {
	old := useAVX2
	setUseAVX2(avx)
	return func() { setUseAVX2(old) }
}
