package netns_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/netns"
)

func TestParseLayout(t *testing.T) {
	for in, want := range map[string][2]int{"2x2": {2, 2}, "4X1": {4, 1}, " 1x1 ": {1, 1}, "64x4": {64, 4}, "1x256": {1, 256}} {
		h, l, err := netns.ParseLayout(in)
		require.NoError(t, err, in)
		require.Equal(t, want, [2]int{h, l}, in)
	}
	for _, bad := range []string{"", "2", "x2", "2x", "0x3", "2x0", "-1x2", "axb", "65x1", "2x129", "2x2x2", "2 x 2",
		"2x4611686018427387904", "4x4611686018427387904", "1x99999999999999999999"} {
		_, _, err := netns.ParseLayout(bad)
		require.ErrorContains(t, err, "want HxL", "%q", bad)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]int64{"1gbit": 1e9, "500mbit": 5e8, "2.5Gbit": 2.5e9, "64kbit": 64e3, "0": 0, "0mbit": 0,
		"1000bit": 1000, "100MBIT": 1e8, "1e3": 1000} {
		got, err := netns.ParseRate(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "fast", "-1gbit", "mbit", "NaN", "nanmbit", "inf", "+Infgbit", "1e300gbit", "0.5bit", "1 gbit/s"} {
		_, err := netns.ParseRate(bad)
		require.ErrorContains(t, err, "want a rate such as", "%q", bad)
	}
}
