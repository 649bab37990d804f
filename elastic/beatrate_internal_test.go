package elastic

import (
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// The heartbeat interval follows the round's size once the job would
// exceed MaxHeartbeatRate: 4096 members at the default rate renew every
// second, never beyond LeaseTTL/3, and a negative rate keeps
// HeartbeatInterval. Config.HeartbeatEvery says the same.
func TestBeatIntervalFollowsTheRoundSize(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID = "beat-rate"
	for _, tc := range []struct {
		rate, size int
		lease      time.Duration
		want       time.Duration
	}{
		{0, 0, 3 * time.Second, 500 * time.Millisecond},
		{0, 1024, 3 * time.Second, 500 * time.Millisecond},
		{0, 2048, 3 * time.Second, 500 * time.Millisecond},
		{0, 3072, 3 * time.Second, 750 * time.Millisecond},
		{0, 4096, 3 * time.Second, time.Second},
		{0, 16384, 3 * time.Second, time.Second},      // LeaseTTL/3 caps it
		{0, 16384, 12 * time.Second, 4 * time.Second}, // a longer lease lets it grow
		{1000, 1000, 3 * time.Second, time.Second},
		{-1, 16384, 3 * time.Second, 500 * time.Millisecond},
	} {
		c := cfg
		c.MaxHeartbeatRate, c.LeaseTTL = tc.rate, tc.lease
		a, err := NewAgent(store.NewMemory(), NewMember("127.0.0.1:1"), c)
		if err != nil {
			t.Fatal(err)
		}
		a.world.Size = tc.size
		if got := a.beatInterval(); got != tc.want {
			t.Errorf("rate %d, %d members, lease %v: interval %v, want %v", tc.rate, tc.size, tc.lease, got, tc.want)
		}
		if got := c.HeartbeatEvery(tc.size); got != tc.want {
			t.Errorf("rate %d, %d members, lease %v: HeartbeatEvery %v, want %v", tc.rate, tc.size, tc.lease, got, tc.want)
		}
		_ = a.Close()
	}
}

// A Join waiting in a forming round spreads its re-read after a hint that
// names no round over n/MaxHeartbeatRate (at most LeaseTTL/3), n the
// members gathered or the leases the job's last renewal reported; a hint
// that names a round, or another state than arrived-and-open, re-reads at
// once.
func TestRereadSpreadFollowsTheJobsSize(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID = "reread-spread"
	a, err := NewAgent(store.NewMemory(), NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	gathering := store.View{Code: store.CodeOK, Open: true, Role: store.RoleArrived, Arrived: 2048}
	for range 100 {
		if d := a.rereadSpread(gathering, store.Hint{Version: 7}); d <= 0 || d > 500*time.Millisecond {
			t.Fatalf("2048 gathered: spread %v, want in (0, 500ms]", d)
		}
	}
	a.jobLeases.Store(8192) // the job is larger than the arrivals seen: LeaseTTL/3 caps it
	var longest time.Duration
	for range 100 {
		longest = max(longest, a.rereadSpread(gathering, store.Hint{Version: 7}))
	}
	if longest <= 500*time.Millisecond || longest > cfg.LeaseTTL/3 {
		t.Fatalf("8192 leases: longest spread %v, want in (500ms, %v]", longest, cfg.LeaseTTL/3)
	}
	for name, tc := range map[string]struct {
		v store.View
		h store.Hint
	}{
		"hint names a round": {gathering, store.Hint{Version: 7, Round: 3, Incarnation: "x"}},
		"ranked":             {store.View{Code: store.CodeOK, Role: store.RoleRanked}, store.Hint{Version: 7}},
		"expected":           {store.View{Code: store.CodeOK, Open: true, Role: store.RoleExpected}, store.Hint{Version: 7}},
	} {
		if d := a.rereadSpread(tc.v, tc.h); d != 0 {
			t.Errorf("%s: spread %v, want 0", name, d)
		}
	}
	a.cfg.MaxHeartbeatRate = -1
	if d := a.rereadSpread(gathering, store.Hint{Version: 7}); d != 0 {
		t.Errorf("no rate bound: spread %v, want 0", d)
	}
}

// A Join waiting in a forming round re-reads the store, when nothing woke
// it, at most every max(PollInterval, LeaseTTL/2) in a small job and every
// 4 x n / MaxHeartbeatRate seconds in a large one: the gathering's
// safety-net re-reads stay a quarter of its heartbeat rate (at a fixed
// LeaseTTL/2, 4096 members gathering re-read 2700 times a second).
func TestGatherRereadFollowsTheJobsSize(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JobID = "gather-reread"
	a, err := NewAgent(store.NewMemory(), NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, tc := range []struct {
		arrived, leases int
		want            time.Duration
	}{
		{2, 0, cfg.LeaseTTL / 2},
		{1024, 0, cfg.LeaseTTL / 2}, // 4 x 0.25 s is below LeaseTTL/2
		{4096, 0, 4 * time.Second},
		{100, 8192, 8 * time.Second}, // the leases count the job
	} {
		a.jobLeases.Store(int64(tc.leases))
		v := store.View{Code: store.CodeOK, Open: true, Role: store.RoleArrived, Arrived: tc.arrived}
		if got := a.gatherReread(v); got != tc.want {
			t.Errorf("%d arrived, %d leases: re-read every %v, want %v", tc.arrived, tc.leases, got, tc.want)
		}
	}
	a.jobLeases.Store(0)
	a.cfg.MaxHeartbeatRate = -1
	if got := a.gatherReread(store.View{Code: store.CodeOK, Open: true, Role: store.RoleArrived, Arrived: 4096}); got != cfg.LeaseTTL/2 {
		t.Errorf("no rate bound: re-read every %v, want %v", got, cfg.LeaseTTL/2)
	}
}
