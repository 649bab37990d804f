//go:build unix

package cpuops

import (
	"math/rand/v2"
	"syscall"
	"testing"
)

func BenchmarkMicroConv2(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	g := newConvGeom([]int{1, 8, 14, 14}, []int{16, 8, 5, 5}, 2, 2)
	x, f, dy := randData(r, 8*14*14), randData(r, 16*8*25), randData(r, 16*14*14)
	y, dx, df := make([]float32, len(dy)), make([]float32, len(x)), make([]float32, len(f))
	var s convScratch
	b.Run("forward", func(b *testing.B) { cpuLoop(b, func() { convForward(g, x, f, y, &s) }) })
	b.Run("filtergrad", func(b *testing.B) { cpuLoop(b, func() { convFilterGrad(g, x, dy, df, &s) }) })
	b.Run("inputgrad", func(b *testing.B) { cpuLoop(b, func() { convInputGrad(g, f, dy, dx, &s) }) })
}

func BenchmarkMicroPoolGrad(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	g := newPoolGeom([]int{1, 8, 28, 28}, 2, 2)
	x := randData(r, 8*28*28)
	dy := randData(r, 8*14*14)
	dx := make([]float32, len(x))
	cpuLoop(b, func() { reluMaxPoolGrad(g, x, dy, dx) })
}

func BenchmarkMicroPool(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	g := newPoolGeom([]int{1, 8, 28, 28}, 2, 2)
	x := randData(r, 8*28*28)
	y := make([]float32, 8*14*14)
	cpuLoop(b, func() { reluMaxPool(g, x, y) })
}

func cpuNow() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

func cpuLoop(b *testing.B, f func()) {
	c0 := cpuNow()
	for b.Loop() {
		f()
	}
	b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
}
