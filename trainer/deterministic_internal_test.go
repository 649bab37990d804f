package trainer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
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
