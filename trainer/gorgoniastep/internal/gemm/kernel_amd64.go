//go:build amd64 && !purego

package gemm

import "golang.org/x/sys/cpu"

// useAVX selects the assembly kernels: 256-bit AVX loads, multiplies and
// adds (no FMA, see the package documentation), available when the CPU and
// the OS support AVX.
var useAVX = cpu.X86.HasAVX

func setUseAVX(on bool) { useAVX = on && cpu.X86.HasAVX }

// nn4AVX computes rows 0..3 of NN: C[0:4][0:n] (=|+=) A[0:4][0:k]·B[0:k][0:n].
// Strides are in elements.
//
//go:noescape
func nn4AVX(k, n int, a *float32, ars, acs int, b *float32, ldb int, c *float32, ldc int, acc bool)

// nt4x2AVX computes the 4×2 tile C[0:4][0:2] of NT.
//
//go:noescape
func nt4x2AVX(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc bool)

// nn4RowsAVX is nn4AVX with B(l, j) = b[rows[l] + j].
//
//go:noescape
func nn4RowsAVX(k, n int, a *float32, ars, acs int, b *float32, rows *int, c *float32, ldc int, acc bool)
