// Package fixk holds the per-value passes of the trainer's deterministic
// mode: gradients rounded to integers at a power-of-two scale and summed in
// float64 (exact in any order), the largest |gradient| tracked on the way,
// and the exact sums scaled back to float32.
//
// # Bit-identity
//
// Every kernel performs, for each value, the same IEEE 754 operations in
// the same order as its portable Go form: the float32 gradient widened to
// float64, multiplied by the scale, 1.5*2^52 added and subtracted (no
// fused multiply-add), the products of Unfix each rounded to float64
// before the conversion to float32. The largest magnitude is an integer
// maximum of float32 bit patterns with the sign cleared. So the AVX2
// assembly on amd64 and the portable Go code give the same bits for every
// input: NaNs (with their payloads), infinities, subnormals and -0; tests
// check this. Of two NaNs added, IEEE 754 leaves open which one the sum
// keeps: the assembly keeps the one the gc compiler's normal build of the
// Go code keeps (its race-detector build may keep the other). Only a step
// with a NaN gradient has such sums, and no rank applies it. Build with
// the purego tag to use only the portable code.
//
// # Concurrency
//
// The functions keep no state; concurrent calls are safe when their output
// slices do not overlap.
package fixk

import (
	"fmt"
	"math"
)

// Magic rounds a float64 below 2^51 in magnitude to the nearest integer
// (ties to even): (x + Magic) - Magic.
const Magic = 1.5 * (1 << 52)

// absMask clears a float32 bit pattern's sign.
const absMask = 1<<31 - 1

// Kernel names the implementation in use: "avx2" (amd64 with AVX2) or
// "go" (portable, or -tags purego).
func Kernel() string {
	if useAVX2 {
		return "avx2"
	}
	return "go"
}

// Sum sets f[i] to the sum over k of gs[k][i] rounded to an integer at
// scale, (float64(x)*scale + Magic) - Magic, and returns the largest
// float32 bit pattern with the sign cleared of every value it reads (bits
// above 0x7f800000, +Inf's, mean some value is a NaN). With f nil it only
// finds that maximum, over the whole of every gs[k]; otherwise every gs[k]
// must hold at least len(f) values (Sum panics otherwise) and only the
// first len(f) are read. With no runs, f is cleared. The sums are added
// as sumGo adds them: for two runs gs[0]'s value plus gs[1]'s, for more the
// runs in order into a cleared f.
func Sum(f []float64, gs [][]float32, scale float64) uint32 {
	if !useAVX2 {
		return sumGo(f, gs, scale)
	}
	var mb uint32
	if f == nil {
		for _, g := range gs {
			mb = max(mb, MaxAbs(g))
		}
		return mb
	}
	switch len(gs) {
	case 0:
		clear(f)
	case 1:
		mb = Set(f, gs[0], scale)
	case 2:
		mb = Set2(f, gs[0], gs[1], scale)
	default:
		// sumGo adds the first run to a cleared f: 0 + r is r's bits for
		// every rounded r (never -0, and a NaN keeps its payload).
		mb = Set(f, gs[0], scale)
		for _, g := range gs[1:] {
			mb = max(mb, Add(f, g, scale))
		}
	}
	return mb
}

// sumGo is the portable form of Sum: the reference the assembly matches.
func sumGo(f []float64, gs [][]float32, scale float64) uint32 {
	var mb uint32
	if f == nil {
		for _, g := range gs {
			for _, x := range g {
				mb = max(mb, math.Float32bits(x)&absMask)
			}
		}
		return mb
	}
	switch len(gs) {
	case 1:
		g := gs[0][:len(f)]
		for i, x := range g {
			f[i] = (float64(x)*scale + Magic) - Magic
			mb = max(mb, math.Float32bits(x)&absMask)
		}
	case 2:
		g0, g1 := gs[0][:len(f)], gs[1][:len(f)]
		for i, x := range g0 {
			y := g1[i]
			f[i] = ((float64(x)*scale + Magic) - Magic) + ((float64(y)*scale + Magic) - Magic)
			mb = max(mb, math.Float32bits(x)&absMask, math.Float32bits(y)&absMask)
		}
	default:
		clear(f)
		for _, g := range gs {
			g = g[:len(f)]
			for i, x := range g {
				f[i] += (float64(x)*scale + Magic) - Magic
				mb = max(mb, math.Float32bits(x)&absMask)
			}
		}
	}
	return mb
}

// MaxAbs returns the largest float32 bit pattern with the sign cleared of
// the values of g (0 for none; above 0x7f800000 when some value is a NaN).
func MaxAbs(g []float32) uint32 {
	n := len(g)
	done, mb := 0, uint32(0)
	if useAVX2 && n >= 8 {
		done = n &^ 7
		mb = maxAbsAVX2(done, &g[0])
	}
	return max(mb, maxAbsGo(g[done:]))
}

func maxAbsGo(g []float32) uint32 {
	var mb uint32
	for _, x := range g {
		mb = max(mb, math.Float32bits(x)&absMask)
	}
	return mb
}

// Set sets f[i] = (float64(g[i])*scale + Magic) - Magic and returns
// MaxAbs(g[:len(f)]). g must hold at least len(f) values; Set panics
// otherwise.
func Set(f []float64, g []float32, scale float64) uint32 {
	n := len(f)
	g = g[:n]
	done, mb := 0, uint32(0)
	if useAVX2 && n >= 8 {
		done = n &^ 7
		mb = setAVX2(done, &f[0], &g[0], scale)
	}
	return max(mb, setGo(f[done:], g[done:], scale))
}

func setGo(f []float64, g []float32, scale float64) uint32 {
	var mb uint32
	g = g[:len(f)]
	for i, x := range g {
		f[i] = (float64(x)*scale + Magic) - Magic
		mb = max(mb, math.Float32bits(x)&absMask)
	}
	return mb
}

// Set2 sets f[i] to g0[i] rounded plus g1[i] rounded (as Set rounds; of two
// NaNs the sum keeps g0's) and returns the larger of MaxAbs(g0[:len(f)])
// and MaxAbs(g1[:len(f)]). g0 and g1 must hold at least len(f) values;
// Set2 panics otherwise.
func Set2(f []float64, g0, g1 []float32, scale float64) uint32 {
	n := len(f)
	g0, g1 = g0[:n], g1[:n]
	done, mb := 0, uint32(0)
	if useAVX2 && n >= 8 {
		done = n &^ 7
		mb = set2AVX2(done, &f[0], &g0[0], &g1[0], scale)
	}
	return max(mb, set2Go(f[done:], g0[done:], g1[done:], scale))
}

func set2Go(f []float64, g0, g1 []float32, scale float64) uint32 {
	var mb uint32
	g0, g1 = g0[:len(f)], g1[:len(f)]
	for i, x := range g0 {
		y := g1[i]
		f[i] = ((float64(x)*scale + Magic) - Magic) + ((float64(y)*scale + Magic) - Magic)
		mb = max(mb, math.Float32bits(x)&absMask, math.Float32bits(y)&absMask)
	}
	return mb
}

// Add adds g[i] rounded (as Set rounds) to f[i] (of two NaNs the sum keeps
// g's) and returns MaxAbs(g[:len(f)]). g must hold at least len(f) values;
// Add panics otherwise.
func Add(f []float64, g []float32, scale float64) uint32 {
	n := len(f)
	g = g[:n]
	done, mb := 0, uint32(0)
	if useAVX2 && n >= 8 {
		done = n &^ 7
		mb = addAVX2(done, &f[0], &g[0], scale)
	}
	return max(mb, addGo(f[done:], g[done:], scale))
}

func addGo(f []float64, g []float32, scale float64) uint32 {
	var mb uint32
	g = g[:len(f)]
	for i, x := range g {
		f[i] += (float64(x)*scale + Magic) - Magic
		mb = max(mb, math.Float32bits(x)&absMask)
	}
	return mb
}

// Unfix sets dst[i] = float32(f[i] * unscale * inv), the products rounded
// to float64 left to right. f must hold at least len(dst) values; Unfix
// panics otherwise.
func Unfix(dst []float32, f []float64, unscale, inv float64) {
	n := len(dst)
	if len(f) < n {
		panic(fmt.Sprintf("fixk: Unfix of %d values from %d sums", n, len(f)))
	}
	done := 0
	if useAVX2 && n >= 8 {
		done = n &^ 7
		unfixAVX2(done, &dst[0], &f[0], unscale, inv)
	}
	unfixGo(dst[done:], f[done:n], unscale, inv)
}

func unfixGo(dst []float32, f []float64, unscale, inv float64) {
	f = f[:len(dst)]
	for i := range dst {
		dst[i] = float32(f[i] * unscale * inv)
	}
}
