package elastic

import (
	"testing"
	"time"
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
		a, err := NewAgent(NewMemoryStore(), NewMember("127.0.0.1:1"), c)
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
