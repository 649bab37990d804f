//go:build amd64 && !purego

package fixk

import "golang.org/x/sys/cpu"

// useAVX2 selects the assembly kernels: 256-bit AVX conversions,
// multiplies, adds and subtracts (no FMA) and AVX2 integer maxima,
// available when the CPU and the OS support AVX2.
var useAVX2 = cpu.X86.HasAVX2

func setUseAVX2(on bool) { useAVX2 = on && cpu.X86.HasAVX2 }

// maxAbsAVX2 is MaxAbs of n values, n a positive multiple of 8.
//
//go:noescape
func maxAbsAVX2(n int, x *float32) uint32

// setAVX2 is Set of n values, n a positive multiple of 8.
//
//go:noescape
func setAVX2(n int, f *float64, x *float32, scale float64) uint32

// set2AVX2 is Set2 of n values, n a positive multiple of 8.
//
//go:noescape
func set2AVX2(n int, f *float64, g0, g1 *float32, scale float64) uint32

// addAVX2 is Add of n values, n a positive multiple of 8.
//
//go:noescape
func addAVX2(n int, f *float64, x *float32, scale float64) uint32

// unfixAVX2 is Unfix of n values, n a positive multiple of 8.
//
//go:noescape
func unfixAVX2(n int, dst *float32, f *float64, unscale, inv float64)
