package elastic

import (
	"bytes"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// noteGone names exactly the members of the last round that the new one
// lacks, whatever order the new roster has (the forward scan, the look
// back, and the set past a few misses).
func TestNoteGoneNamesExactlyTheMissing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		prev := World{Round: 1}
		for i := range n {
			prev.Members = append(prev.Members, Member{ID: fmt.Sprintf("m%02d", i), Addr: "h:1"})
		}
		self := prev.Members[rng.IntN(n)].ID
		var kept, gone []string
		next := World{Round: 2}
		for _, m := range prev.Members {
			if m.ID != self && rng.IntN(3) == 0 && trial%4 != 0 {
				gone = append(gone, m.ID)
				continue
			}
			kept = append(kept, m.ID)
			next.Members = append(next.Members, m)
		}
		if trial%2 == 1 { // an order the forward scan does not expect
			rng.Shuffle(len(next.Members), func(i, j int) { next.Members[i], next.Members[j] = next.Members[j], next.Members[i] })
		}
		next.Members = append(next.Members, Member{ID: "newcomer", Addr: "h:2"})
		var buf bytes.Buffer
		a := &Agent{self: Member{ID: self}, log: slog.New(slog.NewTextHandler(&buf, nil))}
		a.noteGone(prev, true, next)
		var named []string
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if _, rest, ok := strings.Cut(line, "gone_member="); ok {
				named = append(named, strings.Fields(rest)[0])
			}
		}
		slices.Sort(gone)
		slices.Sort(named)
		if !slices.Equal(named, gone) {
			t.Fatalf("trial %d: named %v, gone %v (kept %v)", trial, named, gone, kept)
		}
	}
}
