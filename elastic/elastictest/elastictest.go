package elastictest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// FastConfig returns a Config tuned for tests: LastCall 0, LeaseTTL 1.5 s,
// HeartbeatInterval 100 ms, PollInterval 50 ms, OutageBudget 10 s,
// JoinTimeout 30 s, StateTTL 2 min; MinWorkers 1, MaxWorkers 1024.
func FastConfig(jobID string) elastic.Config {
	c := elastic.DefaultConfig()
	c.JobID = jobID
	c.LastCall = 0
	c.LeaseTTL = 1500 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	c.PollInterval = 50 * time.Millisecond
	c.OutageBudget = 10 * time.Second
	c.JoinTimeout = 30 * time.Second
	c.StateTTL = 2 * time.Minute
	return c
}

// NewMemoryStore returns an empty in-memory store (store.NewMemory) with
// its test controls: SetClock drives the store's time, SetDown simulates
// an outage (every call fails with a *store.Error wrapping the given error
// until SetDown(nil)), Drop deletes a job as a Redis restarted empty would.
// Safe for concurrent use.
func NewMemoryStore() *store.Memory { return store.NewMemory() }

// Cluster is n Agents of one job over one Store. Its methods are meant for
// the test goroutine.
type Cluster struct {
	Store  store.Store
	Agents []*elastic.Agent
	t      testing.TB
}

// NewCluster makes n Agents over a fresh in-memory store. cfg.MinWorkers and
// cfg.MaxWorkers are set to n so that JoinAll forms one round of all n.
func NewCluster(t testing.TB, n int, cfg elastic.Config) *Cluster {
	t.Helper()
	return NewClusterOn(t, NewMemoryStore(), n, cfg)
}

// NewClusterOn is NewCluster over a given store. Member addresses are
// "127.0.0.1:0" placeholders; set real ones with your own NewAgent if the
// test dials peers.
func NewClusterOn(t testing.TB, s store.Store, n int, cfg elastic.Config) *Cluster {
	t.Helper()
	if n < 1 {
		t.Fatalf("elastictest: cluster of %d", n)
	}
	cfg.MinWorkers, cfg.MaxWorkers = n, n
	c := &Cluster{Store: s, t: t}
	for i := range n {
		a, err := elastic.NewAgent(s, elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", i)), cfg)
		if err != nil {
			t.Fatalf("elastictest: %v", err)
		}
		t.Cleanup(func() { _ = a.Close() })
		c.Agents = append(c.Agents, a)
	}
	return c
}

// JoinAll calls Join on every agent concurrently and returns the Worlds in
// agent order; it fails the test on any error.
func (c *Cluster) JoinAll(ctx context.Context) []elastic.World {
	c.t.Helper()
	return JoinAll(c.t, ctx, c.Agents...)
}

// JoinAll calls Join on the given agents concurrently and returns their
// Worlds in order; it fails the test on any error.
func JoinAll(t testing.TB, ctx context.Context, agents ...*elastic.Agent) []elastic.World {
	t.Helper()
	ws := make([]elastic.World, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i], errs[i] = a.Join(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("elastictest: agent %d: Join: %v", i, err)
		}
	}
	return ws
}
