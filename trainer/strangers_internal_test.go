package trainer

import (
	"context"
	"errors"
	"fmt"
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

// When a pair that keeps failing before a step loses its other member while
// this worker connects, Run stops at once (ErrFailureBudget) rather than wait
// alone below MinWorkers until JoinTimeout; a failed authentication counts as
// usual, and a pair's first failed round or a larger round never stops Run
// this way.
func TestLonePeerGone(t *testing.T) {
	aborted := fmt.Errorf("%w: trainer: connect round 3: %w", errAbortChange, context.Canceled)
	lost := fmt.Errorf("trainer: connect round 3: %w", &sync.PeerError{Rank: 1, Round: 3, Err: sync.ErrClosed})
	auth := fmt.Errorf("trainer: connect round 3: %w", &sync.AuthError{Round: 3, Size: 2, Failed: []int{1}})
	for _, tc := range []struct {
		name string
		err  error
		size int
		n    int
		want bool
	}{
		{"superseded pair after a failed round", aborted, 2, 2, true},
		{"superseded pair at the budget", aborted, 2, 3, true},
		{"peer closed after a failed round", lost, 2, 2, true},
		{"a pair's first round", aborted, 2, 1, false},
		{"failed authentication", auth, 2, 2, false},
		{"three members", aborted, 3, 2, false},
		{"another failure", errors.New("trainer: step failed"), 2, 2, false},
	} {
		if got := lonePeerGone(tc.err, tc.size, tc.n); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
