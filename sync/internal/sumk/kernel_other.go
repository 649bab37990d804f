//go:build !amd64 || purego

package sumk

const useAVX = false

func setUseAVX(bool) {}

func toAVX(n int, o, x, y *float64) { panic("sumk: no AVX kernel in this build") }

func to32AVX(n int, o, x, y *float32) { panic("sumk: no AVX kernel in this build") }
