package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestHeartbeatSweeps: in a held round, a heartbeat is the only call; when
// a member's lease lapsed, the next heartbeat of another member evicts it
// and opens the next round (the heartbeat builds the transitions only then).
func TestHeartbeatSweeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, k := range []storeKind{memoryKind(), redisKind(), standaloneKind()} {
		t.Run(k.name, func(t *testing.T) {
			s := k.make(t)
			job := testredis.JobID(t)
			p := elastic.Params{MinWorkers: 2, MaxWorkers: 2, LastCall: time.Hour, LeaseTTL: 300 * time.Millisecond, StateTTL: time.Hour}
			var inc string
			var round uint64
			for _, id := range []string{"a", "b"} {
				v, err := s.Join(ctx, elastic.JoinRequest{JobID: job, Member: elastic.Member{ID: id, Addr: "h:1"}, NewIncarnation: "i-" + job, Arrive: true, Params: p})
				if err != nil {
					t.Fatal(err)
				}
				inc, round = v.Incarnation, v.Round
			}
			req := elastic.MemberRequest{JobID: job, MemberID: "a", Incarnation: inc, Params: p, HaveRound: round}
			b0, err := s.Heartbeat(ctx, req)
			if err != nil || b0.Code != elastic.CodeOK {
				t.Fatalf("beat %+v %v", b0, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				// a keeps its lease; b's lapses.
				b, err := s.Heartbeat(ctx, req)
				if err != nil {
					t.Fatalf("heartbeat after b's lease lapsed: %v", err)
				}
				if b.Code != elastic.CodeOK {
					t.Fatalf("beat %+v", b)
				}
				if b.Version > b0.Version {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the heartbeats never swept b")
				}
				time.Sleep(50 * time.Millisecond)
			}
			v, err := s.Check(ctx, req)
			if err != nil || !v.Open || v.Round <= round || v.Role != elastic.RoleExpected {
				t.Fatalf("after the sweep: %+v %v", v, err)
			}
		})
	}
}
