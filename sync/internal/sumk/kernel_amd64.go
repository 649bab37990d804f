//go:build amd64 && !purego

package sumk

import "golang.org/x/sys/cpu"

// useAVX selects the assembly kernel (256-bit AVX loads and adds),
// available when the CPU and the OS support AVX.
var useAVX = cpu.X86.HasAVX

func setUseAVX(on bool) { useAVX = on && cpu.X86.HasAVX }

// toAVX is To of n elements, n a positive multiple of 8.
//
//go:noescape
func toAVX(n int, o, x, y *float64)

// to32AVX is To32 of n elements, n a positive multiple of 16.
//
//go:noescape
func to32AVX(n int, o, x, y *float32)
