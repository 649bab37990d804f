package cpuops

import (
	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/internal/gemm"
)

// convGeom is the geometry of one stride-1 2-D convolution: input
// (n, c, h, w), filters (m, c, kh, kw), zero padding (ph, pw), output
// (n, m, oh, ow).
type convGeom struct {
	n, c, h, w     int
	m, kh, kw      int
	ph, pw, oh, ow int
}

func newConvGeom(x, f []int, ph, pw int) convGeom {
	g := convGeom{n: x[0], c: x[1], h: x[2], w: x[3], m: f[0], kh: f[2], kw: f[3], ph: ph, pw: pw}
	g.oh = g.h + 2*ph - g.kh + 1
	g.ow = g.w + 2*pw - g.kw + 1
	return g
}

// Patches in place (implicit im2col). For a stride-1 convolution of an
// image zero-padded to (c, hp, wp), the patch row of filter tap
// (ci, ky, kx), read over the padded width, is the contiguous run
// xp[ci*hp*wp + ky*wp + kx :][:oh*wp]: column oy*wp + ox holds the input
// under output (oy, ox) for ox < ow, and a pad column's neighbour for
// ox >= ow. So one product of the filters with those rows, taken where
// they lie in the padded image (gemm.NNRows), gives the output on the
// padded width; dropping its last wp-ow columns of each row gives the
// output. Compared with copying every patch into a matrix first (im2col),
// this computes (wp/ow - 1) more columns (29% for the CNN's second layer)
// and copies nothing but the padded image and the output rows.

// padImage writes the image x (c, h, w) into xp with ph zero rows above and
// below and pw zero columns left and right of every channel, followed by
// slack zeros (the last patch row reads kw-1 elements past the last
// channel). It returns the padded height and width.
func padImage(x []float32, c, h, w, ph, pw int, xp []float32) (hp, wp int) {
	hp, wp = h+2*ph, w+2*pw
	clear(xp)
	for ci := 0; ci < c; ci++ {
		for y := 0; y < h; y++ {
			copySeg(xp[(ci*hp+y+ph)*wp+pw:][:w], x[(ci*h+y)*w:][:w])
		}
	}
	return hp, wp
}

// patchRows sets rows[(ci*kh+ky)*kw+kx] to the offset ci*hp*wp + ky*wp + kx
// of that tap's patch row in a padded image.
func patchRows(rows []int, c, kh, kw, hp, wp int) {
	r := 0
	for ci := 0; ci < c; ci++ {
		for ky := 0; ky < kh; ky++ {
			for kx := 0; kx < kw; kx++ {
				rows[r] = ci*hp*wp + ky*wp + kx
				r++
			}
		}
	}
}

// narrow copies the rows of ch planes of height oh from the padded width wp
// (src) to the width ow (dst).
func narrow(dst, src []float32, ch, oh, ow, wp int) {
	for p := 0; p < ch*oh; p++ {
		copySeg(dst[p*ow:][:ow], src[p*wp:][:ow])
	}
}

// copySeg copies src into dst (the same length): for short rows, four
// elements (one 16-byte move) at a time and a last, overlapping block,
// which is about twice as fast as a memmove call per row of 14.
func copySeg(dst, src []float32) {
	n := len(dst)
	if n < 4 {
		copy(dst, src)
		return
	}
	src = src[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		*(*[4]float32)(dst[i : i+4]) = *(*[4]float32)(src[i : i+4])
	}
	if i < n {
		*(*[4]float32)(dst[n-4 : n]) = *(*[4]float32)(src[n-4 : n])
	}
}

// convScratch holds the buffers of the convolution kernels; they are
// reused across calls so that a step allocates nothing.
type convScratch struct {
	xp   []float32 // a zero-padded image, with slack
	wide []float32 // an output (or output gradient) on the padded width
	rows []int     // the patch rows' offsets in xp
	wt   []float32 // flipped, transposed filters for the input gradient
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

// convForward computes y (n, m, oh, ow) from x (n, c, h, w) and filters f
// (m, c, kh, kw): per image, one product (m × c·kh·kw) · (c·kh·kw ×
// oh·wp) of the filters with the patch rows in place in the padded image,
// narrowed to NCHW. Each output element is summed over the taps in
// (ci, ky, kx) order.
func convForward(g convGeom, x, f, y []float32, s *convScratch) {
	k := g.c * g.kh * g.kw
	hp, wp := g.h+2*g.ph, g.w+2*g.pw
	s.xp = grow(s.xp, g.c*hp*wp+g.kw-1)
	s.wide = grow(s.wide, g.m*g.oh*wp)
	s.rows = growInts(s.rows, k)
	patchRows(s.rows, g.c, g.kh, g.kw, hp, wp)
	for i := 0; i < g.n; i++ {
		padImage(x[i*g.c*g.h*g.w:][:g.c*g.h*g.w], g.c, g.h, g.w, g.ph, g.pw, s.xp)
		gemm.NNRows(g.m, g.oh*wp, k, f, k, 1, s.xp, s.rows, s.wide, g.oh*wp, false)
		narrow(y[i*g.m*g.oh*g.ow:][:g.m*g.oh*g.ow], s.wide, g.m, g.oh, g.ow, wp)
	}
}

// convFilterGrad computes df (m, c, kh, kw), the gradient of the filters,
// from x and the output gradient dy (n, m, oh, ow): the sum over images,
// in image order, of dy_i · patchesᵀ, with dy_i widened to the padded
// width by zeros (so the pad columns' neighbours count for nothing).
func convFilterGrad(g convGeom, x, dy, df []float32, s *convScratch) {
	k := g.c * g.kh * g.kw
	hp, wp := g.h+2*g.ph, g.w+2*g.pw
	q := g.oh * wp
	s.xp = grow(s.xp, g.c*hp*wp+g.kw-1)
	s.wide = grow(s.wide, g.m*q)
	s.rows = growInts(s.rows, k)
	patchRows(s.rows, g.c, g.kh, g.kw, hp, wp)
	if g.n == 0 {
		clear(df)
	}
	clear(s.wide)
	for i := 0; i < g.n; i++ {
		padImage(x[i*g.c*g.h*g.w:][:g.c*g.h*g.w], g.c, g.h, g.w, g.ph, g.pw, s.xp)
		d := dy[i*g.m*g.oh*g.ow:][:g.m*g.oh*g.ow]
		for p := 0; p < g.m*g.oh; p++ { // the pad columns stay 0
			copySeg(s.wide[p*wp:][:g.ow], d[p*g.ow:][:g.ow])
		}
		gemm.NTRows(g.m, k, q, s.wide, q, s.xp, s.rows, df, k, i > 0)
	}
}

// convInputGrad computes dx (n, c, h, w), the gradient of the input, from
// the filters and dy: a stride-1 convolution of dy, padded by (kh-1-ph,
// kw-1-pw), with the filters flipped in both spatial axes and their two
// channel axes swapped, computed like convForward. It needs ph < kh and
// pw < kw.
func convInputGrad(g convGeom, f, dy, dx []float32, s *convScratch) {
	kk := g.m * g.kh * g.kw
	s.wt = grow(s.wt, g.c*kk)
	for mi := 0; mi < g.m; mi++ {
		for ci := 0; ci < g.c; ci++ {
			for ky := 0; ky < g.kh; ky++ {
				for kx := 0; kx < g.kw; kx++ {
					s.wt[ci*kk+(mi*g.kh+ky)*g.kw+kx] = f[((mi*g.c+ci)*g.kh+g.kh-1-ky)*g.kw+g.kw-1-kx]
				}
			}
		}
	}
	qh, qw := g.kh-1-g.ph, g.kw-1-g.pw
	hp, wp := g.oh+2*qh, g.ow+2*qw
	s.xp = grow(s.xp, g.m*hp*wp+g.kw-1)
	s.wide = grow(s.wide, g.c*g.h*wp)
	s.rows = growInts(s.rows, kk)
	patchRows(s.rows, g.m, g.kh, g.kw, hp, wp)
	for i := 0; i < g.n; i++ {
		padImage(dy[i*g.m*g.oh*g.ow:][:g.m*g.oh*g.ow], g.m, g.oh, g.ow, qh, qw, s.xp)
		gemm.NNRows(g.c, g.h*wp, kk, s.wt, kk, 1, s.xp, s.rows, s.wide, g.h*wp, false)
		narrow(dx[i*g.c*g.h*g.w:][:g.c*g.h*g.w], s.wide, g.c, g.h, g.w, wp)
	}
}
