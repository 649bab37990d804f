package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// slowRefreshStore answers every heartbeat with a version the Agent does
// not hold, so each beat goes on to refresh its view with a Check, and
// holds every such Check until its deadline: beats pile up in their
// refresh after their store slot was released. Once piled members of them
// are in flight, the heartbeats answer fenced.
type slowRefreshStore struct {
	store.Store
	armed   atomic.Bool
	inCheck atomic.Int64
	piled   int64
}

func (s *slowRefreshStore) Heartbeat(ctx context.Context, r store.MemberRequest) (store.Beat, error) {
	b, err := s.Store.Heartbeat(ctx, r)
	if err != nil || !s.armed.Load() {
		return b, err
	}
	if s.inCheck.Load() >= s.piled {
		b.Code = store.CodeFenced
		return b, nil
	}
	b.Version += 1000
	return b, nil
}

func (s *slowRefreshStore) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	if !s.armed.Load() {
		return s.Store.Check(ctx, r)
	}
	s.inCheck.Add(1)
	<-ctx.Done()
	return store.View{}, ctx.Err()
}

// TestCloseReturnsWithBeatsPiledUp: more heartbeats than the Agent keeps in
// flight can be finishing at once (each releases its store slot before the
// refresh it runs); when the Agent turned terminal meanwhile, Close still
// returns. (The beats once blocked on their result channel, so Close hung
// on every Agent of a 4096-member bench that left after a loaded hold.)
func TestCloseReturnsWithBeatsPiledUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := &slowRefreshStore{Store: store.NewMemory(), piled: 30}
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

// leaveThenBeatStore holds a Leave, after its eviction took effect, until
// one of the leaver's own heartbeats has been answered (fenced: the member
// is gone) and handled by the Agent (its log says so).
type leaveThenBeatStore struct {
	store.Store
	handled  chan struct{} // closed by the log handler on the Agent's first record about being gone
	errAfter atomic.Value  // the Agent's Err once the beat was handled, before Leave returned
	a        *elastic.Agent
}

func (s *leaveThenBeatStore) Leave(ctx context.Context, r store.MemberRequest) (store.View, error) {
	v, err := s.Store.Leave(ctx, r)
	select {
	case <-s.handled:
	case <-ctx.Done():
		return v, ctx.Err()
	}
	s.errAfter.Store(fmt.Sprint(s.a.Err()))
	return v, err
}

// goneLog closes handled at the first record that says the Agent saw
// itself gone (fenced, or the leave's own effect).
type goneLog struct {
	handled chan struct{}
	once    *sync.Once
}

func (h goneLog) Enabled(context.Context, slog.Level) bool { return true }
func (h goneLog) Handle(_ context.Context, r slog.Record) error {
	gone := strings.Contains(r.Message, "leaving")
	r.Attrs(func(at slog.Attr) bool {
		gone = gone || strings.Contains(at.Value.String(), "fenced")
		return true
	})
	if gone {
		h.once.Do(func() { close(h.handled) })
	}
	return nil
}
func (h goneLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h goneLog) WithGroup(string) slog.Handler      { return h }

// TestLeavingIsNotFenced: a heartbeat that runs after the member's own
// Leave evicted it is answered "not registered"; that is the leave's
// effect, not an eviction by the job, so the Agent does not turn fenced
// (a trainer's last Leave at the job's end logged every such member as
// fenced).
func TestLeavingIsNotFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	handled := make(chan struct{})
	s := &leaveThenBeatStore{Store: store.NewMemory(), handled: handled}
	cfg := elastic.DefaultConfig()
	cfg.JobID = "leave-beat"
	cfg.LastCall = 0
	cfg.LeaseTTL = 4 * time.Second // the leave's deadline (LeaseTTL/2) is far off
	cfg.HeartbeatInterval = 5 * time.Millisecond
	cfg.Logger = slog.New(goneLog{handled: handled, once: new(sync.Once)})
	a, err := elastic.NewAgent(s, elastic.NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.a = a
	defer a.Close()
	if _, err := a.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.errAfter.Load().(string); got != "<nil>" {
		t.Fatalf("while its Leave was in flight, the Agent's own eviction made it: %s", got)
	}
	if err := a.Err(); !errors.Is(err, elastic.ErrClosed) || errors.Is(err, elastic.ErrFenced) {
		t.Fatalf("after Leave: %v, want ErrClosed", err)
	}
}
