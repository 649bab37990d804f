package trainer

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/internal/fixk"
)

// Deterministic mode's gradient exponent travels in the snapshot's
// "detscale" section, with the autoscale section or alone; a snapshot
// without it (an older checkpoint, a fresh start) gives detExpStart.
func TestSnapshotDetScaleSection(t *testing.T) {
	ps := testParams()
	s := testSnapshot(ps, NewSGD(0.1))
	got, err := decodeSnapshot(s.encode(nil, ps), ps)
	require.NoError(t, err)
	require.Equal(t, detExpStart, decodeDetExp(got.detExp), "no section")
	for _, e := range []int{-37, 0, 9} {
		s.detExp = encodeDetExp(s.detExp, e)
		for _, as := range [][]byte{nil, []byte("policy state")} {
			s.autoscale = as
			b := s.encode(nil, ps)
			require.Equal(t, snapshotMagicV4, string(b[:8]))
			got, err := decodeSnapshot(b, ps)
			require.NoError(t, err)
			require.Equal(t, e, decodeDetExp(got.detExp))
			require.Equal(t, e, decodeDetExp(s.clone().detExp))
			require.Equal(t, string(as), string(got.autoscale))
		}
	}
	require.Equal(t, detExpStart, decodeDetExp([]byte{1, 2, 3}), "a damaged section: the start, on every rank alike")
}

// The scale leaves every value below the bound an integer below
// 2^(52-bits(globalSize)), so globalSize of them add exactly; gradExp
// keeps the previous exponent for a step without gradients.
func TestDetScaleBounds(t *testing.T) {
	for _, tc := range []struct{ prev, G int }{{0, 64}, {-20, 1}, {7, 1000}} {
		s, bound := detScaleExp(tc.prev, tc.G)
		below := math.Nextafter(bound, 0)
		x := math.Ldexp(below, s)
		require.Less(t, x*float64(tc.G), math.Ldexp(1, 52), "%+v", tc)
		require.Equal(t, tc.prev+detHeadroom, gradExp(bound, 0)-1, "bound is 2^E")
	}
	require.Equal(t, 3, gradExp(0, 3))
	require.Equal(t, 3, gradExp(math.Inf(1), 3))
	require.Equal(t, 1, gradExp(1, 3), "1 < 2^1")
}

// fixSum's one pass gives each value's fixed-point sum over the
// micro-batches (the rounding of fixedPointSum, added in any order) and
// the largest |gradient|, for one, two and three micro-batches; a NaN
// anywhere shows as bits above +Inf's.
func TestFixSumIsTheRoundedSumAndTheLargestMagnitude(t *testing.T) {
	const n, scale = 37, 1 << 20
	runs := make([][]float32, 3)
	for k := range runs {
		runs[k] = make([]float32, n)
		for i := range n {
			runs[k][i] = float32(math.Sin(float64(7*k+i))) * float32(k+1)
		}
	}
	runs[1][5] = -3.5 // the largest magnitude, negative
	for K := 1; K <= 3; K++ {
		f := make([]float64, n)
		for i := range f {
			f[i] = 12345 // overwritten, not added to
		}
		mb := fixSum(f, runs[:K], scale, 0)
		var want float32
		for i := range n {
			s := 0.0
			for k := range K {
				s += math.RoundToEven(float64(runs[k][i]) * scale)
				want = max(want, float32(math.Abs(float64(runs[k][i]))))
			}
			if f[i] != s {
				t.Fatalf("K=%d: f[%d] = %v, want %v", K, i, f[i], s)
			}
		}
		if got := math.Float32frombits(mb); got != want {
			t.Fatalf("K=%d: largest |g| %v, want %v", K, got, want)
		}
		if got := math.Float32frombits(fixSum(nil, runs[:K], scale, 0)); got != want {
			t.Fatalf("K=%d without sums: largest |g| %v, want %v", K, got, want)
		}
	}
	runs[2][9] = float32(math.NaN())
	if mb := fixSum(make([]float64, n), runs, scale, 0); mb <= 0x7f800000 {
		t.Fatalf("a NaN gave %#x", mb)
	}
}

// convertMaxLoop is convertMax as it was written before its passes moved
// to fixk's kernels: the reference it must match bit for bit.
func convertMaxLoop(fixed []float64, off int, g, dst []float32, scale float64, m float32) float32 {
	if dst != nil {
		copy(dst, g)
	}
	nan := false
	for i, x := range g {
		if fixed != nil {
			fixed[off+i] += (float64(x)*scale + fixk.Magic) - fixk.Magic
		}
		a := math.Float32frombits(math.Float32bits(x) &^ (1 << 31))
		if a > m {
			m = a
		} else if a != a {
			nan = true
		}
	}
	if nan {
		return float32(math.NaN())
	}
	return m
}

// convertMax gives the bits of its element-by-element loop: the sums, the
// copy and the running largest |g| from any start (negative, -0, NaN), for
// runs of every length up to 40 with zeros, subnormals, infinities and
// NaNs mixed in.
func TestConvertMaxIsItsLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	specials := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -1e-40, float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), math.Float32frombits(0xff800001), math.MaxFloat32}
	starts := []float32{0, float32(math.Copysign(0, -1)), -1, 0.25, 1e30, float32(math.Inf(1)), float32(math.NaN())}
	for n := range 41 {
		for _, m0 := range starts {
			for _, rate := range []int{0, 4} {
				g := make([]float32, n)
				for i := range g {
					g[i] = float32(r.NormFloat64()) * float32(r.IntN(4))
					if rate > 0 && r.IntN(rate) == 0 {
						g[i] = specials[r.IntN(len(specials))]
					}
				}
				f0 := make([]float64, n+3)
				for i := range f0 {
					f0[i] = math.Round(r.NormFloat64() * 1e6)
				}
				for _, withFixed := range []bool{false, true} {
					var want, got []float64
					if withFixed {
						want, got = slices.Clone(f0), slices.Clone(f0)
					}
					wd, gd := make([]float32, n), make([]float32, n)
					wm := convertMaxLoop(want, 2, g, wd, 1<<30, m0)
					gm := convertMax(got, 2, g, gd, 1<<30, m0)
					if math.Float32bits(wm) != math.Float32bits(gm) {
						t.Fatalf("n=%d m0=%v fixed=%v: largest |g| %v (%#x), want %v (%#x); g %v",
							n, m0, withFixed, gm, math.Float32bits(gm), wm, math.Float32bits(wm), g)
					}
					for i := range want {
						if math.Float64bits(want[i]) != math.Float64bits(got[i]) {
							t.Fatalf("n=%d: fixed[%d] = %v, want %v", n, i, got[i], want[i])
						}
					}
					if !slices.EqualFunc(wd, gd, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Fatalf("n=%d: the copy differs", n)
					}
				}
			}
		}
	}
}

// The ordered sum's check of the ranks' micro-batches, read from the
// reduced control values: contiguous runs in rank order pass, empty
// shares anywhere included; a gap, an overlap, runs out of rank order or
// a rank whose own micro-batches are not consecutive are refused, naming
// the rank.
func TestMicroRunsMustBeContiguousInRankOrder(t *testing.T) {
	micros := func(idx ...int) []dataloader.Micro[int] {
		m := make([]dataloader.Micro[int], len(idx))
		for k, i := range idx {
			m[k].Index = i
		}
		return m
	}
	reduced := func(shares ...[]dataloader.Micro[int]) []float64 {
		W := len(shares)
		sum := make([]float64, controlLen(W))
		for r, s := range shares {
			ctl := make([]float64, controlLen(W))
			var c control
			c.microFirst, c.micros = orderedRun(s)
			putControl(ctl, r, c)
			for i, v := range ctl {
				sum[i] += v
			}
		}
		return sum
	}
	for _, ok := range [][][]dataloader.Micro[int]{
		{micros(0, 1)},
		{micros(0), micros(1, 2, 3)},
		{micros(), micros(0, 1), micros(), micros(2)},
		{micros(0, 1, 2), micros()},
		{micros(), micros()},
	} {
		require.NoError(t, checkMicroRuns(reduced(ok...), len(ok)), "%v", ok)
	}
	for _, tc := range []struct {
		shares [][]dataloader.Micro[int]
		rank   string
	}{
		{[][]dataloader.Micro[int]{micros(0), micros(2)}, "rank 1"},
		{[][]dataloader.Micro[int]{micros(0, 1), micros(1, 2)}, "rank 1"},
		{[][]dataloader.Micro[int]{micros(2, 3), micros(0, 1)}, "rank 1"},
		{[][]dataloader.Micro[int]{micros(), micros(0, 2), micros(1)}, "rank 1"},
		{[][]dataloader.Micro[int]{micros(1, 0)}, "rank 0"},
	} {
		err := checkMicroRuns(reduced(tc.shares...), len(tc.shares))
		require.ErrorIs(t, err, ErrInvalidConfig, "%v", tc.shares)
		require.ErrorContains(t, err, tc.rank)
	}
}

// largest finds an infinity or a NaN anywhere in a run (the vector
// kernel's blocks and the tail alike), and the largest magnitude of a
// finite run.
func TestLargestFindsEveryNonFiniteValue(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 16, 17, 33} {
		s := make([]float32, n)
		for i := range s {
			s[i] = float32(i) - 4.5
		}
		want := 0.0
		for _, x := range s {
			want = max(want, math.Abs(float64(x)))
		}
		require.Equal(t, want, largest(s), "n %d", n)
		for i := range n {
			for _, bad := range []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())} {
				keep := s[i]
				s[i] = bad
				m := largest(s)
				if bad != bad {
					require.True(t, math.IsNaN(m), "n %d, s[%d] = %v: %v", n, i, bad, m)
				} else {
					require.True(t, math.IsInf(m, 1), "n %d, s[%d] = %v: %v", n, i, bad, m)
				}
				s[i] = keep
			}
		}
		if n > 0 {
			s[n-1] = -math.MaxFloat32
			require.Equal(t, float64(math.MaxFloat32), largest(s), "the largest float32 is finite")
		}
	}
}
