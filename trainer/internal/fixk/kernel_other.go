//go:build !amd64 || purego

package fixk

const useAVX2 = false

func setUseAVX2(bool) {}

func maxAbsAVX2(n int, x *float32) uint32 { panic("fixk: no AVX2 kernel in this build") }

func setAVX2(n int, f *float64, x *float32, scale float64) uint32 {
	panic("fixk: no AVX2 kernel in this build")
}

func set2AVX2(n int, f *float64, g0, g1 *float32, scale float64) uint32 {
	panic("fixk: no AVX2 kernel in this build")
}

func addAVX2(n int, f *float64, x *float32, scale float64) uint32 {
	panic("fixk: no AVX2 kernel in this build")
}

func unfixAVX2(n int, dst *float32, f *float64, unscale, inv float64) {
	panic("fixk: no AVX2 kernel in this build")
}
