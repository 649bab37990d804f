// Package sumk holds the element-wise sums of the collectives'
// reductions: o = x + y, one pass, in float64 (To) and float32 (To32),
// with AVX assembly on amd64.
//
// # Bit-identity
//
// Each element is one IEEE 754 addition (double in To, single in To32),
// so the assembly and the portable Go code give the same bits for every
// input; of two NaNs the sum keeps x's, as the gc compiler's normal build of the Go code does (its
// race-detector build may keep y's: IEEE 754 leaves the choice open).
// Tests check this. Build with the purego tag to use only the portable
// code.
//
// # Concurrency
//
// To keeps no state; concurrent calls are safe when their outputs do not
// overlap their other slices.
package sumk

// Kernel names the implementation in use: "avx" (amd64 with AVX) or "go"
// (portable, or -tags purego).
func Kernel() string {
	if useAVX {
		return "avx"
	}
	return "go"
}

// To sets o[i] = x[i] + y[i] for every i below len(o). o may be x or y
// (the same elements, not shifted); x and y must hold at least len(o)
// values; To panics otherwise.
func To(o, x, y []float64) {
	n := len(o)
	x, y = x[:n], y[:n]
	done := 0
	if useAVX && n >= 8 {
		done = n &^ 7
		toAVX(done, &o[0], &x[0], &y[0])
	}
	addGo(o[done:], x[done:], y[done:])
}

// addGo is the portable form of To and To32: the reference the assembly
// matches (one instantiation per element type, each adding in its own
// precision).
func addGo[T float32 | float64](o, x, y []T) {
	x, y = x[:len(o)], y[:len(o)]
	i := 0
	for ; i+4 <= len(o); i += 4 {
		o[i] = x[i] + y[i]
		o[i+1] = x[i+1] + y[i+1]
		o[i+2] = x[i+2] + y[i+2]
		o[i+3] = x[i+3] + y[i+3]
	}
	for ; i < len(o); i++ {
		o[i] = x[i] + y[i]
	}
}

// To32 is To in float32: o[i] = x[i] + y[i], each rounded to float32, for
// every i below len(o) (the ordered allreduce's additions). The same
// conditions and bits as To: of two NaNs the sum keeps x's.
func To32(o, x, y []float32) {
	n := len(o)
	x, y = x[:n], y[:n]
	done := 0
	if useAVX && n >= 16 {
		done = n &^ 15
		to32AVX(done, &o[0], &x[0], &y[0])
	}
	addGo(o[done:], x[done:], y[done:])
}
