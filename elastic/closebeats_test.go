package elastic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

// slowRefreshStore answers every heartbeat with a version the Agent does
// not hold, so each beat goes on to refresh its view with a Check, and
// holds every such Check until its deadline: beats pile up in their
// refresh after their store slot was released. Once piled members of them
// are in flight, the heartbeats answer fenced.
type slowRefreshStore struct {
	elastic.Store
	armed   atomic.Bool
	inCheck atomic.Int64
	piled   int64
}

func (s *slowRefreshStore) Heartbeat(ctx context.Context, r elastic.MemberRequest) (elastic.Beat, error) {
	b, err := s.Store.Heartbeat(ctx, r)
	if err != nil || !s.armed.Load() {
		return b, err
	}
	if s.inCheck.Load() >= s.piled {
		b.Code = elastic.CodeFenced
		return b, nil
	}
	b.Version += 1000
	return b, nil
}

func (s *slowRefreshStore) Check(ctx context.Context, r elastic.MemberRequest) (elastic.View, error) {
	if !s.armed.Load() {
		return s.Store.Check(ctx, r)
	}
	s.inCheck.Add(1)
	<-ctx.Done()
	return elastic.View{}, ctx.Err()
}

// TestCloseReturnsWithBeatsPiledUp: more heartbeats than the Agent keeps in
// flight can be finishing at once (each releases its store slot before the
// refresh it runs); when the Agent turned terminal meanwhile, Close still
// returns. (The beats once blocked on their result channel, so Close hung
// on every Agent of a 4096-member bench that left after a loaded hold.)
func TestCloseReturnsWithBeatsPiledUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := &slowRefreshStore{Store: elastic.NewMemoryStore(), piled: 30}
	cfg := elastic.DefaultConfig()
	cfg.JobID = "close-beats"
	cfg.LastCall = 0
	cfg.LeaseTTL = time.Second
	cfg.HeartbeatInterval = 5 * time.Millisecond // maxBeatsInFlight 10
	cfg.StateTTL = time.Hour
	a, err := elastic.NewAgent(s, elastic.NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Join(ctx); err != nil {
		t.Fatal(err)
	}
	s.armed.Store(true)
	for a.Err() == nil {
		select {
		case <-a.Changes():
		case <-time.After(time.Minute):
			t.Fatal("the Agent was never fenced")
		}
	}
	closed := make(chan struct{})
	go func() {
		_ = a.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatalf("Close did not return (%d refreshes were in flight when the Agent was fenced)", s.inCheck.Load())
	}
}
