package trainer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
)

// A worker's GOMAXPROCS share (Config.ShareCores) divides its host's cores
// by the round's members on that host, whatever runs elsewhere: a job that
// shrank to one worker per host gives it every core.
func TestCoresShareFollowsTheRoundsMembersOnTheHost(t *testing.T) {
	world := func(rank int, hosts ...string) elastic.World {
		w := elastic.World{Rank: rank, Size: len(hosts)}
		for _, h := range hosts {
			w.Members = append(w.Members, elastic.Member{Host: h})
		}
		return w
	}
	for _, c := range []struct {
		cores int
		w     elastic.World
		want  int
	}{
		{2, world(0, "a"), 2},
		{2, world(1, "a", "a"), 1},
		{2, world(0, "a", "a", "a", "a"), 1}, // never below 1
		{8, world(2, "a", "b", "a", "b"), 4},
		{8, world(1, "a", "b", "a", "a"), 8}, // alone on host b
		{3, world(0, "a", "a"), 1},
	} {
		require.Equal(t, c.want, coresShare(c.cores, c.w), "%d cores, %+v", c.cores, c.w.Members)
	}
}
