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

// im2col writes the patches of one image x (c, h, w) for a kh×kw kernel
// with zero padding (ph, pw) and stride 1 into cols, a (c*kh*kw) × (oh*ow)
// row-major matrix: row (ci*kh+ky)*kw+kx, column oy*ow+ox holds
// x[ci][oy+ky-ph][ox+kx-pw], or 0 outside the image. It first copies each
// channel into the zero-bordered plane xp ((h+2ph) × (w+2pw) elements), so
// that every row segment of cols is one contiguous copy.
func im2col(x []float32, c, h, w, kh, kw, ph, pw, oh, ow int, cols, xp []float32) {
	wp := w + 2*pw
	xp = xp[:(h+2*ph)*wp]
	clear(xp[:ph*wp])
	clear(xp[(h+ph)*wp:])
	p := oh * ow
	r := 0
	for ci := 0; ci < c; ci++ {
		plane := x[ci*h*w : (ci+1)*h*w]
		for y := 0; y < h; y++ {
			row := xp[(y+ph)*wp : (y+ph+1)*wp]
			clear(row[:pw])
			copy(row[pw:pw+w], plane[y*w:(y+1)*w])
			clear(row[pw+w:])
		}
		for ky := 0; ky < kh; ky++ {
			for kx := 0; kx < kw; kx++ {
				row := cols[r*p : (r+1)*p]
				r++
				src := xp[ky*wp+kx:]
				for oy := 0; oy < oh; oy++ {
					copySeg(row[oy*ow:oy*ow+ow], src[oy*wp:oy*wp+ow])
				}
			}
		}
	}
}

// copySeg copies src into dst (the same length): for the short rows of
// im2col, four elements (one 16-byte move) at a time and a last,
// overlapping block, which is about twice as fast as a memmove call per
// row of 14.
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

// convScratch holds the per-call buffers of the convolution kernels; it is
// reused across calls so that a step allocates nothing.
type convScratch struct {
	cols []float32 // im2col of one image
	xp   []float32 // one zero-bordered channel of that image
	wt   []float32 // flipped, transposed filters for the input gradient
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// convForward computes y (n, m, oh, ow) from x (n, c, h, w) and filters f
// (m, c, kh, kw): per image, im2col and one matrix product (m × c·kh·kw)
// · (c·kh·kw × oh·ow), whose result is already that image's NCHW output.
func convForward(g convGeom, x, f, y []float32, s *convScratch) {
	k, p := g.c*g.kh*g.kw, g.oh*g.ow
	s.cols = grow(s.cols, k*p)
	s.xp = grow(s.xp, (g.h+2*g.ph)*(g.w+2*g.pw))
	for i := 0; i < g.n; i++ {
		im2col(x[i*g.c*g.h*g.w:(i+1)*g.c*g.h*g.w], g.c, g.h, g.w, g.kh, g.kw, g.ph, g.pw, g.oh, g.ow, s.cols, s.xp)
		gemm.NN(g.m, p, k, f, k, 1, s.cols, p, y[i*g.m*p:(i+1)*g.m*p], p, false)
	}
}

// convFilterGrad computes df (m, c, kh, kw), the gradient of the filters,
// from x and the output gradient dy (n, m, oh, ow): the sum over images,
// in image order, of dy_i (m × oh·ow) · im2col(x_i)ᵀ.
func convFilterGrad(g convGeom, x, dy, df []float32, s *convScratch) {
	k, p := g.c*g.kh*g.kw, g.oh*g.ow
	s.cols = grow(s.cols, k*p)
	s.xp = grow(s.xp, (g.h+2*g.ph)*(g.w+2*g.pw))
	if g.n == 0 {
		clear(df)
	}
	for i := 0; i < g.n; i++ {
		im2col(x[i*g.c*g.h*g.w:(i+1)*g.c*g.h*g.w], g.c, g.h, g.w, g.kh, g.kw, g.ph, g.pw, g.oh, g.ow, s.cols, s.xp)
		gemm.NT(g.m, k, p, dy[i*g.m*p:(i+1)*g.m*p], p, s.cols, p, df, k, i > 0)
	}
}

// convInputGrad computes dx (n, c, h, w), the gradient of the input, from
// the filters and dy: a stride-1 convolution of dy, padded by (kh-1-ph,
// kw-1-pw), with the filters flipped in both spatial axes and their two
// channel axes swapped. Per image that is im2col of dy and one product
// (c × m·kh·kw) · (m·kh·kw × h·w) that lands in NCHW order. It needs
// ph < kh and pw < kw.
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
	hw, p := g.h*g.w, g.oh*g.ow
	s.cols = grow(s.cols, kk*hw)
	s.xp = grow(s.xp, (g.oh+2*(g.kh-1-g.ph))*(g.ow+2*(g.kw-1-g.pw)))
	for i := 0; i < g.n; i++ {
		im2col(dy[i*g.m*p:(i+1)*g.m*p], g.m, g.oh, g.ow, g.kh, g.kw, g.kh-1-g.ph, g.kw-1-g.pw, g.h, g.w, s.cols, s.xp)
		gemm.NN(g.c, hw, kk, s.wt, kk, 1, s.cols, hw, dx[i*g.c*hw:(i+1)*g.c*hw], hw, false)
	}
}
