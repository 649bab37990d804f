package sumk

// hasAVX reports whether this build and CPU have the AVX kernel.
var hasAVX = useAVX

// useKernel selects the AVX kernel (avx) or the portable Go code; it
// returns a function that restores the previous choice.
func useKernel(avx bool) (restore func()) {
	old := useAVX
	setUseAVX(avx)
	return func() { setUseAVX(old) }
}
