package sync

import (
	"unsafe"

	"github.com/elastictrain/elastictrain/sync/internal/sumk"
)

// reduceFunc folds src into dst element-wise (dst = dst op src); both hold
// whole elements of the same type.
type reduceFunc func(dst, src []byte)

// reduceToFunc sets out to a op b element-wise; out may be a or b.
type reduceToFunc func(out, a, b []byte)

// scaleFunc divides every element of dst by n (for OpAvg).
type scaleFunc func(dst []byte, n int)

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*4)
}

func f64Bytes(v []float64) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*8)
}

func b32(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func b64(b []byte) []float64 {
	if len(b) < 8 {
		return nil
	}
	return unsafe.Slice((*float64)(unsafe.Pointer(&b[0])), len(b)/8)
}

func kernels(elem int, op Op) (reduceFunc, scaleFunc) {
	if elem == 4 {
		switch op {
		case OpMax:
			return max32, scale32
		case OpMin:
			return min32, scale32
		}
		return sum32, scale32
	}
	switch op {
	case OpMax:
		return max64, scale64
	case OpMin:
		return min64, scale64
	}
	return sum64, scale64
}

// reduceTo returns the reduceToFunc of op for elements of elem bytes.
func reduceTo(elem int, op Op) reduceToFunc {
	if elem == 4 {
		return reduceTos32[op]
	}
	return reduceTos64[op]
}

// reduceTos32 and reduceTos64 hold the reduceToFuncs by Op, made once (an
// operation does not allocate). Sums take sumk's vector kernels (the
// two-rank exchange's out = a + b), the same bits as a scalar loop's.
var reduceTos32, reduceTos64 = reduceTosOf(b32, sumk.To32), reduceTosOf(b64, sumk.To)

func reduceTosOf[T float32 | float64](view func([]byte) []T, sumTo func(o, x, y []T)) [OpMin + 1]reduceToFunc {
	sum := func(out, a, b []byte) { sumTo(view(out), view(a), view(b)) }
	return [...]reduceToFunc{
		OpSum: sum,
		OpAvg: sum, // divided after the sum
		OpMax: func(out, a, b []byte) { pickTo(view(out), view(a), view(b), true) },
		OpMin: func(out, a, b []byte) { pickTo(view(out), view(a), view(b), false) },
	}
}

// pickTo sets o[i] to x[i], or to y[i] where that is larger (larger) or
// smaller (!larger), as max32 and min32 keep dst's value; o may be x or y.
func pickTo[T float32 | float64](o, x, y []T, larger bool) {
	x, y = x[:len(o)], y[:len(o)]
	for i := range o {
		v, w := x[i], y[i]
		if larger && w > v || !larger && w < v {
			v = w
		}
		o[i] = v
	}
}

func sum32(dst, src []byte) {
	d, s := b32(dst), b32(src)
	s = s[:len(d)]
	i := 0
	for ; i+4 <= len(d); i += 4 {
		d[i] += s[i]
		d[i+1] += s[i+1]
		d[i+2] += s[i+2]
		d[i+3] += s[i+3]
	}
	for ; i < len(d); i++ {
		d[i] += s[i]
	}
}

func sum64(dst, src []byte) {
	d, s := b64(dst), b64(src)
	sumk.To(d, d, s[:len(d)]) // d[i] + s[i], d's NaN kept of two, as d[i] += s[i]
}

func max32(dst, src []byte) {
	d, s := b32(dst), b32(src)
	s = s[:len(d)]
	for i := range d {
		if s[i] > d[i] {
			d[i] = s[i]
		}
	}
}

func min32(dst, src []byte) {
	d, s := b32(dst), b32(src)
	s = s[:len(d)]
	for i := range d {
		if s[i] < d[i] {
			d[i] = s[i]
		}
	}
}

func max64(dst, src []byte) {
	d, s := b64(dst), b64(src)
	s = s[:len(d)]
	for i := range d {
		if s[i] > d[i] {
			d[i] = s[i]
		}
	}
}

func min64(dst, src []byte) {
	d, s := b64(dst), b64(src)
	s = s[:len(d)]
	for i := range d {
		if s[i] < d[i] {
			d[i] = s[i]
		}
	}
}

func scale32(dst []byte, n int) {
	d := b32(dst)
	f := float32(n)
	for i := range d {
		d[i] /= f
	}
}

func scale64(dst []byte, n int) {
	d := b64(dst)
	f := float64(n)
	for i := range d {
		d[i] /= f
	}
}
