package store

import (
	"errors"
	"testing"
)

// TestARosterNamingAMemberTwiceIsBadState: two records with one ID would
// give one member two ranks; the roster is refused as ErrBadState.
func TestARosterNamingAMemberTwiceIsBadState(t *testing.T) {
	a, b := Member{ID: "a", Addr: "x:1"}, Member{ID: "b", Addr: "x:2"}
	if _, err := parseRoster(a.record() + "\n" + b.record()); err != nil {
		t.Fatalf("a good roster: %v", err)
	}
	_, err := parseRoster(a.record() + "\n" + b.record() + "\n" + a.record())
	if !errors.Is(err, ErrBadState) {
		t.Fatalf("a roster naming %q twice: %v, want ErrBadState", a.ID, err)
	}
}
