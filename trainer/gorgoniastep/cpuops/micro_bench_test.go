//go:build unix

package cpuops

import (
	"math/rand/v2"
	"syscall"
	"testing"
)

func BenchmarkMicroIm2col(b *testing.B) {
	g := newConvGeom([]int{1, 8, 14, 14}, []int{16, 8, 5, 5}, 2, 2)
	x := make([]float32, g.c*g.h*g.w)
	cols := make([]float32, g.c*g.kh*g.kw*g.oh*g.ow)
	xp := make([]float32, (g.h+2*g.ph)*(g.w+2*g.pw))
	cpuLoop(b, func() { im2col(x, g.c, g.h, g.w, g.kh, g.kw, g.ph, g.pw, g.oh, g.ow, cols, xp) })
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
