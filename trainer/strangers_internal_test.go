package trainer

import (
	"testing"

	"github.com/elastictrain/elastictrain/sync"
)

// Who may evict the members that failed authentication: more than half of
// the round, or exactly half holding the trained state; never a minority.
func TestMayReportStrangers(t *testing.T) {
	for _, tc := range []struct {
		size, proved int
		trained      bool
		want         bool
	}{
		{4, 2, false, true},  // three honest of four
		{4, 0, false, false}, // the stranger
		{4, 1, false, false}, // two of four, fresh: a tie
		{4, 1, true, true},   // two of four holding the state
		{2, 0, false, false}, // one of two, fresh
		{2, 0, true, true},   // one of two holding the state: a stranger joined a running job
		{5, 1, true, false},  // two of five, even holding the state: a minority
		{5, 2, false, true},  // three of five
		{3, 1, false, true},  // two of three
		{1, 0, false, true},  // alone (cannot fail authentication, but the rule holds)
	} {
		ae := &sync.AuthError{Size: tc.size, Proved: make([]int, tc.proved)}
		if got := mayReportStrangers(ae, tc.trained); got != tc.want {
			t.Errorf("size %d, %d proved, trained %v: %v, want %v", tc.size, tc.proved, tc.trained, got, tc.want)
		}
	}
}
