package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Every key of a job has a TTL of at most StateTTL after every kind of
// call, including calls that create a key without a visible change (the
// first survivor arriving in a re-formed round creates the arrived and back
// sets), although the scripts renew the TTLs only when a call may have
// created a key, on a visible change, or once half of StateTTL is spent.
// And heartbeats alone renew them once half of StateTTL is spent.
func TestEveryKeyOfTheJobHasATTL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testredis.Client(t)
	s := store.NewRedis(c)
	job := testredis.JobID(t)
	p := store.Params{MinWorkers: 1, MaxWorkers: 4, LastCall: time.Hour, LeaseTTL: time.Minute, StateTTL: 2 * time.Second}
	keys := store.JobKeys(job)
	checkTTLs := func(when string) {
		t.Helper()
		for _, k := range keys {
			n, err := c.Exists(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				continue
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 0 || ttl > p.StateTTL {
				t.Fatalf("%s: %s has TTL %v (StateTTL %v)", when, k, ttl, p.StateTTL)
			}
		}
	}
	var inc string
	registered := map[string]bool{}
	join := func(id string) store.View {
		t.Helper()
		r := store.JoinRequest{JobID: job, Member: store.Member{ID: id, Addr: id + ":1"},
			NewIncarnation: "inc-" + job, Arrive: true, Params: p}
		if registered[id] {
			r.Incarnation = inc
		}
		v, err := s.Join(ctx, r)
		if err != nil || v.Code != store.CodeOK {
			t.Fatalf("join %s: %+v %v", id, v, err)
		}
		inc, registered[id] = v.Incarnation, true
		return v
	}
	mr := func(id string) store.MemberRequest {
		return store.MemberRequest{JobID: job, MemberID: id, Incarnation: inc, Params: p}
	}
	var round uint64
	for _, id := range []string{"a", "b", "c", "d"} {
		round = join(id).Round
		checkTTLs("join " + id)
	}
	// d is lost: the next round opens with a, b and c expected and nobody
	// arrived yet, so the arrived and back sets do not exist.
	if _, err := s.Report(ctx, store.ReportRequest{MemberRequest: mr("a"), Round: round, Target: "d"}); err != nil {
		t.Fatal(err)
	}
	checkTTLs("report")
	if v := join("a"); !v.Open || v.Role != store.RoleArrived {
		t.Fatalf("a: %+v", v) // the round still waits for b and c: no visible change
	}
	checkTTLs("first survivor arrives")
	join("b")
	if v := join("c"); v.Open || v.Role != store.RoleRanked {
		t.Fatalf("c: %+v", v)
	}
	checkTTLs("round closes")
	join("e")
	checkTTLs("newcomer")
	// Heartbeats alone keep the keys: once half of StateTTL is spent (here:
	// the renewal time set back, the TTLs shortened as if time had passed),
	// the next heartbeat gives every key StateTTL again.
	short := p.StateTTL / 10
	for _, k := range keys {
		_ = c.PExpire(ctx, k, short).Err()
	}
	if err := c.HSet(ctx, keys[1], "ttlat", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Heartbeat(ctx, mr("a")); err != nil || b.Code != store.CodeOK {
		t.Fatalf("heartbeat: %+v %v", b, err)
	}
	checkTTLs("heartbeat")
	for _, k := range keys {
		if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl > 0 && ttl <= short {
			t.Fatalf("%s kept its short TTL %v through a heartbeat due to renew it", k, ttl)
		}
	}
}
