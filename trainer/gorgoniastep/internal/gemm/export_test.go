package gemm

// hasAVX reports whether this build and CPU have the AVX kernels.
var hasAVX = useAVX

func setAVX(on bool) { setUseAVX(on) }
