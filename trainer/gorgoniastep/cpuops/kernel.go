package cpuops

import "github.com/elastictrain/elastictrain/trainer/gorgoniastep/internal/gemm"

// Kernel names the matrix kernels Dense and Conv2D use: "openblas" (built
// with -tags openblas: the same bits only between workers with the same
// libopenblas on the same kind of CPU, so the trainer's deterministic mode
// holds only there), "avx" (amd64 with AVX) or "go" (portable, or -tags
// purego); the last two give the same bits on every CPU.
func Kernel() string { return gemm.Kernel() }
