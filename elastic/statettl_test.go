package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestHeldRoundOutlivesStateTTL: in a held round whose members only
// heartbeat (and now and then Check, which changes nothing), the job's keys
// are renewed before StateTTL runs out, for many StateTTLs: no key expires
// under the members (they would all look evicted, or lost), and every key
// that exists still carries a TTL (none is left without one).
func TestHeldRoundOutlivesStateTTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testredis.Client(t)
	s := elastic.NewRedisStore(c)
	job := testredis.JobID(t)
	p := elastic.Params{MinWorkers: 2, MaxWorkers: 2, LastCall: time.Hour, LeaseTTL: 300 * time.Millisecond, StateTTL: 400 * time.Millisecond}
	var inc string
	var round uint64
	for _, id := range []string{"a", "b"} {
		v, err := s.Join(ctx, elastic.JoinRequest{JobID: job, Member: elastic.Member{ID: id, Addr: "h:1"}, NewIncarnation: "i-" + job, Arrive: true, Params: p})
		if err != nil {
			t.Fatal(err)
		}
		inc, round = v.Incarnation, v.Round
	}
	end := time.Now().Add(5 * p.StateTTL)
	for i := 0; time.Now().Before(end); i++ {
		for _, id := range []string{"a", "b"} {
			req := elastic.MemberRequest{JobID: job, MemberID: id, Incarnation: inc, Params: p, HaveRound: round}
			b, err := s.Heartbeat(ctx, req)
			if err != nil || b.Code != elastic.CodeOK {
				t.Fatalf("beat %d of %s: %+v %v", i, id, b, err)
			}
			if i%4 == 0 {
				v, err := s.Check(ctx, req)
				if err != nil || v.Code != elastic.CodeOK || v.Role != elastic.RoleRanked || v.Round != round || v.Open {
					t.Fatalf("check %d of %s: %+v %v", i, id, v, err)
				}
			}
		}
		time.Sleep(p.LeaseTTL / 6) // the heartbeat interval
	}
	prefix := elastic.KeyPrefix + "{" + job + "}:"
	for _, k := range []string{"state", "meta", "members", "leases", "ord", "rank", "roster"} {
		ttl, err := c.PTTL(ctx, prefix+k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > p.StateTTL {
			t.Errorf("%s: PTTL %v after %v of heartbeats (StateTTL %v)", k, ttl, 5*p.StateTTL, p.StateTTL)
		}
	}
}
