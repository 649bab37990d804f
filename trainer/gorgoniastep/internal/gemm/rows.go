package gemm

import "fmt"

// NNRows is NN with the rows of B anywhere in one slice: B(l, j) =
// b[rows[l] + j] for l < k (len(rows) >= k) and j < n. A convolution uses
// it to multiply with the patches of an image in place: row l of its
// patch matrix starts at an offset of the zero-padded image (implicit
// im2col). The summation order is NN's, so the result is the same bits as
// NN with those rows copied into a row-major B. It panics if a row does
// not fit in b or a slice is too short.
func NNRows(m, n, k int, a []float32, ars, acs int, b []float32, rows []int, c []float32, ldc int, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	checkOut(m, n, c, ldc)
	if k <= 0 {
		NN(m, n, 0, nil, 0, 0, nil, 0, c, ldc, acc)
		return
	}
	if ars < 0 || acs < 0 || (m-1)*ars+(k-1)*acs >= len(a) {
		panic(fmt.Sprintf("gemm: A of %d elements too short for %dx%d with strides %d, %d", len(a), m, k, ars, acs))
	}
	checkRows(rows, k, n, b)
	i := 0
	if useAVX {
		for ; i+4 <= m; i += 4 {
			nn4RowsAVX(k, n, &a[i*ars], ars, acs, &b[0], &rows[0], &c[i*ldc], ldc, acc)
		}
	}
	var s [64]float32
	for ; i < m; i++ {
		ai, ci := a[i*ars:], c[i*ldc:i*ldc+n]
		for j0 := 0; j0 < n; j0 += len(s) {
			w := min(len(s), n-j0)
			sum := s[:w]
			clear(sum)
			for l := 0; l < k; l++ {
				x := ai[l*acs]
				for j, y := range b[rows[l]+j0 : rows[l]+j0+w] {
					sum[j] += float32(x * y) // the conversion forbids fusing into an FMA
				}
			}
			out := ci[j0 : j0+w]
			if acc {
				for j := range out {
					out[j] += sum[j]
				}
			} else {
				copy(out, sum)
			}
		}
	}
}

// NTRows is NT with the rows of B anywhere in one slice: row j of B is
// b[rows[j] : rows[j]+k] for j < n (len(rows) >= n). The summation order
// is NT's. It panics if a row does not fit in b or a slice is too short.
func NTRows(m, n, k int, a []float32, lda int, b []float32, rows []int, c []float32, ldc int, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	checkOut(m, n, c, ldc)
	if k <= 0 {
		NT(m, n, 0, nil, 0, nil, 0, c, ldc, acc)
		return
	}
	if lda < k || (m-1)*lda+k > len(a) {
		panic(fmt.Sprintf("gemm: A of %d elements too short for %dx%d with row length %d", len(a), m, k, lda))
	}
	checkRows(rows, n, k, b)
	row := func(j int) []float32 { return b[rows[j] : rows[j]+k] }
	i := 0
	if useAVX {
		for ; i+4 <= m; i += 4 {
			j := 0
			// A pair of rows is one base and a stride, whatever the offsets.
			for ; j+2 <= n; j += 2 {
				nt4x2AVX(k, &a[i*lda], lda, &b[rows[j]], rows[j+1]-rows[j], &c[i*ldc+j], ldc, acc)
			}
			if j < n && n >= 2 {
				var t [8]float32
				nt4x2AVX(k, &a[i*lda], lda, &b[rows[n-2]], rows[n-1]-rows[n-2], &t[0], 2, false)
				for r := 0; r < 4; r++ {
					store(&c[(i+r)*ldc+n-1], t[2*r+1], acc)
				}
				j = n
			}
			for ; j < n; j++ {
				for r := i; r < i+4; r++ {
					store(&c[r*ldc+j], dot8Go(k, a[r*lda:r*lda+k], row(j)), acc)
				}
			}
		}
	}
	for ; i < m; i++ {
		for j := 0; j < n; j++ {
			store(&c[i*ldc+j], dot8Go(k, a[i*lda:i*lda+k], row(j)), acc)
		}
	}
}

// checkRows panics unless rows has count offsets, each with width
// elements of b from it.
func checkRows(rows []int, count, width int, b []float32) {
	if len(rows) < count {
		panic(fmt.Sprintf("gemm: %d row offsets for %d rows", len(rows), count))
	}
	for _, r := range rows[:count] {
		if r < 0 || r+width > len(b) {
			panic(fmt.Sprintf("gemm: a row at offset %d of width %d does not fit in %d elements", r, width, len(b)))
		}
	}
}
