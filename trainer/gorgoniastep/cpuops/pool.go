package cpuops

// poolGeom is the geometry of a non-overlapping max-pool: input
// (n, c, h, w), window kh×kw with stride (kh, kw) and no padding, output
// (n, c, h/kh, w/kw); trailing rows and columns that fill no window are
// ignored.
type poolGeom struct {
	n, c, h, w, kh, kw, oh, ow int
}

func newPoolGeom(x []int, kh, kw int) poolGeom {
	return poolGeom{n: x[0], c: x[1], h: x[2], w: x[3], kh: kh, kw: kw, oh: x[2] / kh, ow: x[3] / kw}
}

// argmax returns the offset in plane of the largest element of the window
// whose top-left corner is (y0, x0), the first in row-major order among
// equals, and its value.
func argmax(plane []float32, w, y0, x0, kh, kw int) (int, float32) {
	best := y0*w + x0
	bv := plane[best]
	for dy := 0; dy < kh; dy++ {
		row := (y0+dy)*w + x0
		for dx := 0; dx < kw; dx++ {
			if v := plane[row+dx]; v > bv {
				best, bv = row+dx, v
			}
		}
	}
	return best, bv
}

// reluMaxPool computes y = max(0, max over each window of x): ReLU then
// max-pooling, or the other way round, which is the same.
func reluMaxPool(g poolGeom, x, y []float32) {
	in, out := g.h*g.w, g.oh*g.ow
	for p := 0; p < g.n*g.c; p++ {
		plane, dst := x[p*in:(p+1)*in], y[p*out:(p+1)*out]
		if g.kh == 2 && g.kw == 2 {
			for oy := 0; oy < g.oh; oy++ {
				r0 := plane[2*oy*g.w : 2*oy*g.w+2*g.ow]
				r1 := plane[(2*oy+1)*g.w : (2*oy+1)*g.w+2*g.ow]
				d := dst[oy*g.ow : (oy+1)*g.ow]
				for ox := range d {
					_, v := max4(r0[2*ox], r0[2*ox+1], r1[2*ox], r1[2*ox+1])
					d[ox] = max(v, 0)
				}
			}
			continue
		}
		for oy := 0; oy < g.oh; oy++ {
			for ox := 0; ox < g.ow; ox++ {
				_, v := argmax(plane, g.w, oy*g.kh, ox*g.kw, g.kh, g.kw)
				dst[oy*g.ow+ox] = max(v, 0)
			}
		}
	}
}

// max4 returns the position (0..3) and value of the largest of a, b, c, d,
// the first among equals: argmax's order for a 2x2 window. It compares
// pairs, then the winners, selecting indices rather than branching: on
// random activations a branch per comparison is mispredicted half the
// time.
func max4(a, b, c, d float32) (int, float32) {
	v := [4]float32{a, b, c, d}
	i := b2i(b > a)
	j := 2 + b2i(d > c)
	if v[j] > v[i] {
		i = j
	}
	return i, v[i]
}

// b2i is 1 for true and 0 for false; the compiler makes it a SETcc.
func b2i(b bool) int {
	var i int
	if b {
		i = 1
	}
	return i
}

// reluMaxPoolGrad computes dx from x and the output gradient dy: each
// window passes dy to its largest input (the first in row-major order
// among equals) when that input is positive; every other element of dx is
// 0.
func reluMaxPoolGrad(g poolGeom, x, dy, dx []float32) {
	in, out := g.h*g.w, g.oh*g.ow
	if g.kh != 2 || g.kw != 2 {
		clear(dx)
	}
	for p := 0; p < g.n*g.c; p++ {
		plane, grad, d := x[p*in:(p+1)*in], dx[p*in:(p+1)*in], dy[p*out:(p+1)*out]
		if g.kh == 2 && g.kw == 2 {
			for oy := 0; oy < g.oh; oy++ {
				r0 := plane[2*oy*g.w : 2*oy*g.w+2*g.ow]
				r1 := plane[(2*oy+1)*g.w : (2*oy+1)*g.w+2*g.ow]
				g0 := grad[2*oy*g.w : (2*oy+1)*g.w]
				g1 := grad[(2*oy+1)*g.w : (2*oy+2)*g.w]
				dd := d[oy*g.ow : (oy+1)*g.ow]
				for ox, v := range dd {
					var q [4]float32
					if i, m := max4(r0[2*ox], r0[2*ox+1], r1[2*ox], r1[2*ox+1]); m > 0 {
						q[i] = v
					}
					g0[2*ox], g0[2*ox+1], g1[2*ox], g1[2*ox+1] = q[0], q[1], q[2], q[3]
				}
				clear(g0[2*g.ow:]) // a last, odd column fills no window
				clear(g1[2*g.ow:])
			}
			clear(grad[2*g.oh*g.w:]) // nor does a last, odd row
			continue
		}
		for oy := 0; oy < g.oh; oy++ {
			for ox := 0; ox < g.ow; ox++ {
				if i, v := argmax(plane, g.w, oy*g.kh, ox*g.kw, g.kh, g.kw); v > 0 {
					grad[i] = d[oy*g.ow+ox]
				}
			}
		}
	}
}

// reluMaxPool2x2Codes is reluMaxPool for 2x2 windows that also records, in
// codes (one per output), the position 0..3 of each window's winner, or 4
// when its maximum is not positive (no gradient).
func reluMaxPool2x2Codes(g poolGeom, x, y []float32, codes []uint8) {
	in, out := g.h*g.w, g.oh*g.ow
	for p := 0; p < g.n*g.c; p++ {
		plane, dst, cd := x[p*in:(p+1)*in], y[p*out:(p+1)*out], codes[p*out:(p+1)*out]
		for oy := 0; oy < g.oh; oy++ {
			r0 := plane[2*oy*g.w : 2*oy*g.w+2*g.ow]
			r1 := plane[(2*oy+1)*g.w : (2*oy+1)*g.w+2*g.ow]
			d := dst[oy*g.ow : (oy+1)*g.ow]
			c := cd[oy*g.ow : (oy+1)*g.ow]
			for ox := range d {
				i, v := max4(r0[2*ox], r0[2*ox+1], r1[2*ox], r1[2*ox+1])
				if !(v > 0) {
					i = 4
				}
				c[ox] = uint8(i)
				d[ox] = max(v, 0)
			}
		}
	}
}

// reluMaxPool2x2GradCodes is reluMaxPoolGrad for 2x2 windows from the codes
// of reluMaxPool2x2Codes: no comparison, no read of the input.
func reluMaxPool2x2GradCodes(g poolGeom, codes []uint8, dy, dx []float32) {
	in, out := g.h*g.w, g.oh*g.ow
	for p := 0; p < g.n*g.c; p++ {
		grad, d, cd := dx[p*in:(p+1)*in], dy[p*out:(p+1)*out], codes[p*out:(p+1)*out]
		for oy := 0; oy < g.oh; oy++ {
			g0 := grad[2*oy*g.w : (2*oy+1)*g.w]
			g1 := grad[(2*oy+1)*g.w : (2*oy+2)*g.w]
			dd := d[oy*g.ow : (oy+1)*g.ow]
			c := cd[oy*g.ow : (oy+1)*g.ow]
			for ox, v := range dd {
				var q [8]float32
				q[c[ox]&7] = v // code 4: into q[4], which is not written out
				g0[2*ox], g0[2*ox+1], g1[2*ox], g1[2*ox+1] = q[0], q[1], q[2], q[3]
			}
			clear(g0[2*g.ow:]) // a last, odd column fills no window
			clear(g1[2*g.ow:])
		}
		clear(grad[2*g.oh*g.w:]) // nor does a last, odd row
	}
}
