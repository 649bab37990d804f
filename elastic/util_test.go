package elastic_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/elastictest"
	"github.com/elastictrain/elastictrain/elastic/store"
)

func newClient(addr string) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
}

func newAgent(t *testing.T, s store.Store, cfg elastic.Config) *elastic.Agent {
	t.Helper()
	a, err := elastic.NewAgent(s, elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", 10000+len(t.Name()))), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// joinAll runs Join on every agent concurrently and returns the Worlds.
func joinAll(t *testing.T, ctx context.Context, agents []*elastic.Agent) []elastic.World {
	t.Helper()
	return elastictest.JoinAll(t, ctx, agents...)
}

// checkRound asserts that worlds are one consistent round: same round
// number and member list, ranks 0..W-1 each held once, Members[Rank] is self.
func checkRound(t *testing.T, worlds []elastic.World, agents []*elastic.Agent) {
	t.Helper()
	if len(worlds) == 0 {
		t.Fatal("no worlds")
	}
	w0 := worlds[0]
	seen := make([]bool, w0.Size)
	for i, w := range worlds {
		if w.Round != w0.Round || w.Size != w0.Size || !slices.Equal(w.MemberIDs(), w0.MemberIDs()) {
			t.Fatalf("world %d = round %d %v, world 0 = round %d %v", i, w.Round, w.MemberIDs(), w0.Round, w0.MemberIDs())
		}
		if len(w.Members) != w.Size || w.Rank < 0 || w.Rank >= w.Size {
			t.Fatalf("world %d: rank %d size %d members %d", i, w.Rank, w.Size, len(w.Members))
		}
		if seen[w.Rank] {
			t.Fatalf("rank %d held twice in round %d", w.Rank, w.Round)
		}
		seen[w.Rank] = true
		if agents != nil && w.Members[w.Rank].ID != agents[i].Member().ID {
			t.Fatalf("world %d: Members[Rank] = %s, self = %s", i, w.Members[w.Rank].ID, agents[i].Member().ID)
		}
	}
	if len(worlds) != w0.Size {
		t.Fatalf("%d worlds for size %d", len(worlds), w0.Size)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// dropRedisJob deletes a job's keys, as a Redis restarted empty would (only
// this job's keys: the server is shared).
func dropRedisJob(t *testing.T, s store.Store, jobID string) {
	t.Helper()
	rs, ok := s.(*store.Redis)
	if !ok {
		t.Fatalf("not a Redis store: %T", s)
	}
	if err := rs.DropJob(context.Background(), jobID); err != nil {
		t.Fatal(err)
	}
}

// spyStore forwards to a Store and reports every Join/Check view.
type spyStore struct {
	store.Store
	views chan spyView
}

type spyView struct {
	member string
	v      store.View
}

func newSpy(s store.Store) *spyStore { return &spyStore{Store: s, views: make(chan spyView, 4096)} }

func (s *spyStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	v, err := s.Store.Join(ctx, r)
	if err == nil {
		s.views <- spyView{r.Member.ID, v}
	}
	return v, err
}

// waitArrived waits until each of the given members was seen arrived (or
// pending) in a Join answer.
func (s *spyStore) waitArrived(t *testing.T, ids ...string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	timeout := time.After(20 * time.Second)
	for len(want) > 0 {
		select {
		case sv := <-s.views:
			if sv.v.Role == store.RoleArrived || sv.v.Role == store.RolePending || sv.v.Role == store.RoleRanked {
				delete(want, sv.member)
			}
		case <-timeout:
			t.Fatalf("members %v never arrived", want)
		}
	}
}

// worker emulates a trainer: Join, train until ChangePending, Join again.
type worker struct {
	a      *elastic.Agent
	worlds chan elastic.World
	errs   chan error
	cancel context.CancelFunc
	done   chan struct{}
}

func startWorker(t *testing.T, a *elastic.Agent) *worker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{a: a, worlds: make(chan elastic.World, 64), errs: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			world, err := a.Join(ctx)
			if err != nil {
				if ctx.Err() == nil {
					w.errs <- err
				}
				return
			}
			w.worlds <- world
			for !a.ChangePending() {
				select {
				case <-ctx.Done():
					return
				case <-a.Changes():
				case <-tick.C: // ChangePending also turns true on a stale lease, with no hint
				}
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
}

// awaitRound waits until every worker's latest World is the same round of
// exactly len(ws) members, and returns those Worlds.
func awaitRound(t *testing.T, timeout time.Duration, ws ...*worker) []elastic.World {
	t.Helper()
	latest := make([]elastic.World, len(ws))
	have := make([]bool, len(ws))
	deadline := time.After(timeout)
	for {
		ok := true
		for i := range ws {
			if !have[i] || latest[i].Size != len(ws) || latest[i].Round != latest[0].Round {
				ok = false
			}
		}
		if ok {
			return latest
		}
		cases := make([]chan elastic.World, len(ws))
		for i, w := range ws {
			cases[i] = w.worlds
		}
		select {
		case <-deadline:
			t.Fatalf("no common round of %d within %v; latest %+v", len(ws), timeout, latest)
		default:
		}
		got := false
		for i, w := range ws {
			select {
			case wd := <-w.worlds:
				latest[i], have[i], got = wd, true, true
			case err := <-w.errs:
				t.Fatalf("worker %d: %v", i, err)
			default:
			}
		}
		if !got {
			select {
			case <-deadline:
				t.Fatalf("no common round of %d within %v; latest %+v", len(ws), timeout, latest)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
}

// next returns the worker's next World.
func (w *worker) next(t *testing.T, timeout time.Duration) elastic.World {
	t.Helper()
	select {
	case wd := <-w.worlds:
		return wd
	case err := <-w.errs:
		t.Fatalf("worker: %v", err)
	case <-time.After(timeout):
		t.Fatalf("worker: no World within %v", timeout)
	}
	return elastic.World{}
}
