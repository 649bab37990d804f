// Package optk holds the element-wise kernels of the trainer's built-in
// optimizers: one fused pass over a parameter's values, gradients and
// optimizer state per update.
//
// # Bit-identity
//
// Every kernel performs, for each element, the same float32 operations in
// the same order as its portable Go form (each product and quotient rounded
// to float32 before the next operation, no fused multiply-add; the square
// root correctly rounded to float32), so the AVX assembly on amd64 and the
// portable Go code give the same bits for every finite and infinite input;
// tests check this. Build with the purego tag to use only the portable code.
//
// # Concurrency
//
// The functions keep no state; concurrent calls are safe when their output
// slices do not overlap.
package optk

import (
	"fmt"
	"math"
)

// Kernel names the implementation in use: "avx" (amd64 with AVX) or "go"
// (portable, or -tags purego).
func Kernel() string {
	if useAVX {
		return "avx"
	}
	return "go"
}

// AdamCoeffs are the scalars of one Adam update (Kingma & Ba, ICLR 2015,
// with the bias corrections folded into the step size Alpha).
type AdamCoeffs struct {
	// GScale multiplies every gradient before use (1: none). With
	// StoreGrad the scaled gradient is written back.
	GScale float32
	// B1 and C1 are beta1 and 1-beta1 (as float32: C1 is computed in
	// float32 from B1 by the caller); B2 and C2 likewise for beta2.
	B1, C1, B2, C2 float32
	// Alpha is the bias-corrected step size, Eps the denominator's epsilon.
	Alpha, Eps float32
	// StoreGrad writes g*GScale back into g.
	StoreGrad bool
}

// Adam applies one Adam update to every element i of val:
//
//	gi = g[i]*GScale                  (stored in g[i] with StoreGrad)
//	mOut[i] = B1*mIn[i] + C1*gi
//	vOut[i] = B2*vIn[i] + (C2*gi)*gi
//	val[i] = val[i] - (Alpha*mOut[i]) / (sqrt(vOut[i]) + Eps)
//
// mOut may be mIn and vOut may be vIn (an update in place); otherwise no
// two slices may overlap. Every slice must hold at least len(val) elements;
// Adam panics otherwise.
func Adam(val, g, mIn, vIn, mOut, vOut []float32, c *AdamCoeffs) {
	n := len(val)
	if len(g) < n || len(mIn) < n || len(vIn) < n || len(mOut) < n || len(vOut) < n {
		panic(fmt.Sprintf("optk: Adam of %d values with %d gradients, moments %d/%d in and %d/%d out",
			n, len(g), len(mIn), len(vIn), len(mOut), len(vOut)))
	}
	done := 0
	if useAVX && n >= 8 {
		done = n &^ 7
		adamAVX(done, &val[0], &g[0], &mIn[0], &vIn[0], &mOut[0], &vOut[0], c)
	}
	adamGo(val[done:n], g[done:n], mIn[done:n], vIn[done:n], mOut[done:n], vOut[done:n], c)
}

// adamGo is the portable form of Adam: the reference the assembly matches.
func adamGo(val, g, mIn, vIn, mOut, vOut []float32, c *AdamCoeffs) {
	gs, b1, c1, b2, c2, alpha, eps := c.GScale, c.B1, c.C1, c.B2, c.C2, c.Alpha, c.Eps
	g, mIn, vIn, mOut, vOut = g[:len(val)], mIn[:len(val)], vIn[:len(val)], mOut[:len(val)], vOut[:len(val)]
	for i := range val {
		gi := g[i] * gs
		if c.StoreGrad {
			g[i] = gi
		}
		m := b1*mIn[i] + c1*gi
		v := b2*vIn[i] + c2*gi*gi
		mOut[i], vOut[i] = m, v
		val[i] -= alpha * m / (float32(math.Sqrt(float64(v))) + eps)
	}
}
