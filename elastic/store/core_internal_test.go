package store

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"
)

// A clock-driven table test of the core through the in-memory store: lease
// expiry and the last-call deadline follow the injected clock exactly.
func TestCoreClock(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	s := NewMemory()
	s.SetClock(func() time.Time { return now })
	p := Params{MinWorkers: 2, MaxWorkers: 4, LastCall: 500 * time.Millisecond, LeaseTTL: 3 * time.Second, StateTTL: time.Minute}
	mem := func(id string) Member { return Member{ID: id, Addr: id + ":1"} }
	join := func(id, inc string) View {
		t.Helper()
		v, err := s.Join(ctx, JoinRequest{JobID: "j", Member: mem(id), Incarnation: inc, NewIncarnation: "inc1", Arrive: true, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	check := func(id string) View {
		t.Helper()
		v, err := s.Check(ctx, MemberRequest{JobID: "j", MemberID: id, Incarnation: "inc1", Params: p})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	steps := []struct {
		name    string
		advance time.Duration
		do      func() View
		want    func(View) bool
	}{
		{"a arrives alone: forming, no deadline", 0, func() View { return join("a", "") }, func(v View) bool { return v.Open && v.Role == RoleArrived && v.Wait == 0 }},
		{"b reaches MinWorkers: deadline in 500ms", 0, func() View { return join("b", "") }, func(v View) bool { return v.Open && v.Wait == 500*time.Millisecond }},
		{"499ms later still open", 499 * time.Millisecond, func() View { return check("a") }, func(v View) bool { return v.Open && v.Wait == time.Millisecond }},
		{"at the deadline it closes", time.Millisecond, func() View { return check("a") }, func(v View) bool { return !v.Open && v.Size == 2 && v.Rank == 0 }},
		{"c arrives late: pending, admissible", 0, func() View { return join("c", "") }, func(v View) bool { return v.Role == RolePending }},
		{"a sees one admissible pending joiner", 0, func() View { return check("a") }, func(v View) bool { return v.Pending == 1 && v.Round == 1 }},
		// a calls at least every LeaseTTL/2, so the job is never silent
		// and nobody earns a silence credit (see TestSilenceCredit).
		{"at t=1.9s a renews; b (last renewed at t=0) and c go quiet", 1400 * time.Millisecond, func() View { return check("a") }, func(v View) bool { return !v.Open && v.Size == 2 }},
		{"at t=2.9s a renews", 1000 * time.Millisecond, func() View { return check("a") }, func(v View) bool { return !v.Open && v.Size == 2 }},
		{"at 3s after b's last renewal b's lease lapses: the survivor and the waiting joiner form round 2 at once", 100 * time.Millisecond, func() View { return check("a") }, func(v View) bool {
			return !v.Open && v.Round == 2 && v.Role == RoleRanked && v.Rank == 0 && v.Size == 2 && v.Members[1].ID == "c"
		}},
		{"b is fenced", 0, func() View { return check("b") }, func(v View) bool { return v.Code == CodeFenced }},
	}
	for _, st := range steps {
		now = now.Add(st.advance)
		v := st.do()
		if !st.want(v) {
			t.Fatalf("%s: view %+v", st.name, v)
		}
	}
}

// Malformed store replies give ErrBadState, never a panic.
func TestParseViewRejectsGarbage(t *testing.T) {
	good := []any{int64(0), "inc", int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(1), `{"id":"a","addr":"h:1"}`}
	if v, err := parseView(good); err != nil {
		t.Fatal(err)
	} else if _, err := v.toView(); err != nil {
		t.Fatal(err)
	}
	bad := [][]any{
		nil,
		{int64(0)},
		{"x", "inc", int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0)},
		{int64(9), "inc", int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0)},
		{int64(0), int64(5), int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0)},
		{int64(0), "inc", int64(-3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0)},
		{int64(0), "inc", int64(3), int64(2), int64(0), int64(7), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0)},
		{int64(0), "inc", int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(0), []any{}},
		{int64(0), "inc", int64(3), int64(2), int64(0), int64(1), int64(0), int64(1), int64(0), int64(0), int64(1), int64(-1)},
	}
	for i, b := range bad {
		if _, err := parseView(b); err == nil {
			t.Errorf("case %d: garbage accepted", i)
		}
	}
	// Record problems surface in toView.
	for i, recs := range [][]string{{"not json"}, {`{"addr":"no id"}`}, {}, {"{}", "{}"}} {
		v := rawView{View: View{Role: RoleRanked, Rank: 0, Size: 1}, records: recs}
		if _, err := v.toView(); err == nil {
			t.Errorf("records case %d accepted", i)
		}
	}
}

func TestParseHint(t *testing.T) {
	if h := parseHint("7"); h.Version != 7 || h.Members != nil {
		t.Fatalf("plain hint %+v", h)
	}
	h := parseHint("9\n4\ninc\n{\"id\":\"a\",\"addr\":\"h:1\"}\n{\"id\":\"b\",\"addr\":\"h:2\"}")
	if h.Version != 9 || h.Round != 4 || h.Incarnation != "inc" || len(h.Members) != 2 || h.Members[1].ID != "b" {
		t.Fatalf("close hint %+v", h)
	}
	for _, bad := range []string{"", "x", "9\nnotanumber\ninc\n{}", "9\n4\ninc\nnot json", "9\n4\ninc\n{\"addr\":\"no id\"}"} {
		h := parseHint(bad)
		if h.Members != nil {
			t.Errorf("%q: members from a malformed hint", bad)
		}
	}
}

// The scripts and core.go bound the roster of a hint by the same number.
func TestHintRosterMaxAgrees(t *testing.T) {
	if hintRosterMaxLua != strconv.Itoa(hintRosterMax) {
		t.Fatalf("scripts bound hints at %s bytes, core.go at %d", hintRosterMaxLua, hintRosterMax)
	}
}

// TestCoreDropsAnArrivalWithoutARecord: the core's twin of the scripts'
// ghost check (TestAStrayPendingEntryDoesNotWedgeTheJob): an arrived ID
// with no member record is left out when the round closes.
func TestCoreDropsAnArrivalWithoutARecord(t *testing.T) {
	j := &coreJob{
		st: &coreState{Inc: "i", Round: 2, Open: true, Reform: true, Arrived: []string{"a", "ghost", "b"}, Back: []string{"a", "ghost"},
			Ord: map[string]int64{"a": 1, "b": 2, "ghost": 3}, Since: map[string]int64{"a": 1}},
		members: map[string]string{"a": Member{ID: "a"}.record(), "b": Member{ID: "b"}.record()},
		leases:  map[string]int64{"a": 1e12, "b": 1e12},
	}
	var c opCtx
	j.tryClose(1000, Params{MinWorkers: 1, MaxWorkers: 3, LastCall: time.Hour, LeaseTTL: 3 * time.Second}, &c)
	if j.st.Open || !slices.Equal(j.st.Ranked, []string{"a", "b"}) || !c.closed {
		t.Fatalf("after tryClose: open %v ranked %v closed %v; want [a b] closed", j.st.Open, j.st.Ranked, c.closed)
	}
}
