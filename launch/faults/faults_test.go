package faults

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFaultsFlagParsesAndRejects(t *testing.T) {
	var list []Fault
	require.NoError(t, Flag{Kind: Kill, List: &list}.Set("1@300"))
	require.NoError(t, Flag{Kind: Join, List: &list}.Set("2@600"))
	require.NoError(t, Flag{Kind: Kill, List: &list}.Set("0@7"))
	require.Equal(t, []Fault{{Kind: Kill, Rank: 1, Step: 300}, {Kind: Join, Rank: 2, Step: 600}, {Kind: Kill, Rank: 0, Step: 7}}, list)
	require.Equal(t, "1@300,0@7", Flag{Kind: Kill, List: &list}.String())
	require.Equal(t, "", Flag{Kind: Kill}.String())
	for _, bad := range []string{"", "x", "1", "1@", "@5", "1@0", "-1@5", "1@-2", "a@b", "1@5x"} {
		require.Error(t, Flag{Kind: Kill, List: &list}.Set(bad), bad)
	}
	require.ErrorContains(t, Flag{Kind: Join, List: &list}.Set("0@5"), "want at least 1")
	require.Len(t, list, 3, "a rejected value adds nothing")
}

func TestCheckFaultsBoundsJoinsByMax(t *testing.T) {
	for _, tc := range []struct {
		faults       []Fault
		workers, max int
		want         string // "" = accepted
	}{
		{nil, 2, 2, ""},
		{[]Fault{{Kind: Join, Rank: 2, Step: 10}}, 2, 4, ""},
		{[]Fault{{Kind: Join, Rank: 2, Step: 10}, {Kind: Kill, Rank: 3, Step: 20}}, 2, 4, ""},
		{[]Fault{{Kind: Join, Rank: 3, Step: 10}}, 2, 4, "-join: 2 workers plus 3 joining would start 5, above -max 4 (at most 2 may join)"},
		{[]Fault{{Kind: Join, Rank: 1, Step: 10}, {Kind: Join, Rank: 1, Step: 20}}, 2, 3, "plus 2 joining would start 4, above -max 3"},
		{[]Fault{{Kind: Join, Rank: 100000, Step: 1}}, 2, 64, "-join: 2 workers plus 100000 joining would start 100002, above -max 64"},
		{[]Fault{{Kind: Join, Rank: math.MaxInt, Step: 1}, {Kind: Join, Rank: math.MaxInt, Step: 1}}, 2, 64, fmt.Sprintf("plus %d joining", math.MaxInt)},
		{[]Fault{{Kind: Kill, Rank: 2, Step: 10}}, 2, 64, "-kill 2@10: no worker can hold rank 2"},
	} {
		err := Check(tc.faults, tc.workers, tc.max)
		if tc.want == "" {
			require.NoError(t, err, "%v", tc.faults)
			continue
		}
		require.ErrorContains(t, err, tc.want, "%v", tc.faults)
	}
}
