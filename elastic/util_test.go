package elastic_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
)

func newClient(addr string) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}})
}

func newAgent(t *testing.T, s elastic.Store, cfg elastic.Config) *elastic.Agent {
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
	worlds := make([]elastic.World, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worlds[i], errs[i] = a.Join(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("agent %d: Join: %v", i, err)
		}
	}
	return worlds
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
