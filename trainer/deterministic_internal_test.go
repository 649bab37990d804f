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
