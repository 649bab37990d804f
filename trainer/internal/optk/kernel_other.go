//go:build !amd64 || purego

package optk

const useAVX = false

func setUseAVX(bool) {}

func adamAVX(n int, val, grad, mIn, vIn, mOut, vOut *float32, c *AdamCoeffs) {
	panic("optk: no AVX kernel in this build")
}
