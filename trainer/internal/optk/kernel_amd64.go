//go:build amd64 && !purego

package optk

import "golang.org/x/sys/cpu"

// useAVX selects the assembly kernels: 256-bit AVX loads, multiplies, adds,
// divisions and square roots (no FMA), available when the CPU and the OS
// support AVX.
var useAVX = cpu.X86.HasAVX

func setUseAVX(on bool) { useAVX = on && cpu.X86.HasAVX }

// adamAVX is Adam on n elements, n a positive multiple of 8.
//
//go:noescape
func adamAVX(n int, val, grad, mIn, vIn, mOut, vOut *float32, c *AdamCoeffs)
