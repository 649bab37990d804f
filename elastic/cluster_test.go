package elastic_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/elastictest"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// jobRedisKeys are keys of a job as the package doc names them (the ones
// that exist while a round runs).
func jobRedisKeys(jobID string) []string {
	p := store.KeyPrefix + "{" + jobID + "}:"
	return []string{p + "state", p + "meta", p + "members", p + "leases"}
}

// checkJobOnNode asserts, asking the cluster itself, that every key and the
// Pub/Sub channel of the job hash to one slot served by cl.Addrs()[node],
// and that the keys are really stored on that node.
func checkJobOnNode(t *testing.T, cl *testredis.Cluster, jobID string, node int) {
	t.Helper()
	cl.RequireOnNode(t, node, jobRedisKeys(jobID), store.KeyPrefix+"{"+jobID+"}:events")
}

// TestRedisCluster runs rendezvous scenarios on a real Redis Cluster of
// three masters through a go-redis ClusterClient. Each scenario's job ID is
// chosen (with CLUSTER KEYSLOT) so that the scenarios' jobs are spread over
// every node, and each checks that its job's keys share one slot on the
// node it was meant for.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cl := testredis.StartCluster(t)
	cc := cl.Client(t)
	st := store.NewRedis(cc)
	// config returns a fast config whose job lives on the given node. Its
	// leases are long, so a loaded machine does not evict healthy members;
	// the scenario that needs expiry shortens them.
	config := func(t *testing.T, node int) elastic.Config {
		cfg := testConfig(t)
		cfg.JobID = cl.TagOn(t, cfg.JobID, node)
		cfg.LeaseTTL = 10 * time.Second
		return cfg
	}
	ctx := context.Background()
	scenarios := []struct {
		name string
		run  func(t *testing.T, node int)
	}{
		{"formation of a round of four", func(t *testing.T, node int) {
			cfg := config(t, node)
			c := elastictest.NewClusterOn(t, st, 4, cfg)
			ws := c.JoinAll(ctx)
			checkRound(t, ws, c.Agents)
			checkJobOnNode(t, cl, cfg.JobID, node)
			for i, a := range c.Agents {
				if a.ChangePending() {
					t.Fatalf("agent %d: change pending right after forming", i)
				}
			}
		}},
		{"failure report opens the next round", func(t *testing.T, node int) {
			cfg := config(t, node)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			cfg.HeartbeatInterval = time.Second // a new round within LeaseTTL cannot come from lease expiry
			A, B, C := newAgent(t, st, cfg), newAgent(t, st, cfg), newAgent(t, st, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			checkJobOnNode(t, cl, cfg.JobID, node)
			r := ws[0].Round
			_ = C.Close()
			start := time.Now()
			if err := A.ReportFailure(ctx, r, C.Member().ID); err != nil {
				t.Fatal(err)
			}
			ws = awaitRound(t, 10*time.Second, startWorker(t, A), startWorker(t, B))
			checkRound(t, ws, []*elastic.Agent{A, B})
			if el := time.Since(start); el >= cfg.LeaseTTL {
				t.Fatalf("next round after %v: not faster than the lease", el)
			}
			if ws[0].Round != r+1 {
				t.Fatalf("round %d after the report, want %d", ws[0].Round, r+1)
			}
		}},
		{"lease expiry opens one new round", func(t *testing.T, node int) {
			cfg := config(t, node)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			cfg.LeaseTTL = 3 * time.Second // 30 heartbeats: only the dead member's lease lapses
			A, B, C := newAgent(t, st, cfg), newAgent(t, st, cfg), newAgent(t, st, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			checkJobOnNode(t, cl, cfg.JobID, node)
			requireOneExpiry(t, ctx, cfg, ws[0].Round, C, A, B) // C dies silently: no report, no leave
		}},
		{"graceful leave", func(t *testing.T, node int) {
			cfg := config(t, node)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			A, B, C := newAgent(t, st, cfg), newAgent(t, st, cfg), newAgent(t, st, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			checkJobOnNode(t, cl, cfg.JobID, node)
			r := ws[0].Round
			// Rank 0 leaves: the survivors keep their order and the oldest
			// takes rank 0.
			byRank := make([]*elastic.Agent, 3)
			for i, a := range []*elastic.Agent{A, B, C} {
				byRank[ws[i].Rank] = a
			}
			if err := byRank[0].Leave(ctx); err != nil {
				t.Fatal(err)
			}
			survivors := byRank[1:]
			waitFor(t, 10*time.Second, "survivors see the leave", func() bool {
				return survivors[0].ChangePending() && survivors[1].ChangePending()
			})
			ws = joinAll(t, ctx, survivors)
			checkRound(t, ws, survivors)
			if ws[0].Round != r+1 || !slices.Equal(ws[0].MemberIDs(), ids(survivors...)) {
				t.Fatalf("after the leave: round %d %v, want round %d %v", ws[0].Round, ws[0].MemberIDs(), r+1, ids(survivors...))
			}
		}},
		{"finish", func(t *testing.T, node int) {
			cfg := config(t, node)
			c := elastictest.NewClusterOn(t, st, 2, cfg)
			c.JoinAll(ctx)
			checkJobOnNode(t, cl, cfg.JobID, node)
			A, B := c.Agents[0], c.Agents[1]
			if err := A.Finish(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "B sees the job finished", B.ChangePending)
			if _, err := B.Join(ctx); !errors.Is(err, elastic.ErrJobFinished) {
				t.Fatalf("Join after Finish: %v", err)
			}
			if _, err := newAgent(t, st, cfg).Join(ctx); !errors.Is(err, elastic.ErrJobFinished) {
				t.Fatalf("Join by a new member of a finished job: %v", err)
			}
		}},
		{"keys dropped: members re-form with the same ranks", func(t *testing.T, node int) {
			cfg := config(t, node)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			as := []*elastic.Agent{newAgent(t, st, cfg), newAgent(t, st, cfg), newAgent(t, st, cfg)}
			ws := []*worker{startWorker(t, as[0]), startWorker(t, as[1]), startWorker(t, as[2])}
			before := awaitRound(t, 20*time.Second, ws...)
			checkRound(t, before, as)
			checkJobOnNode(t, cl, cfg.JobID, node)
			dropRedisJob(t, st, cfg.JobID) // one DEL of the four keys: one slot
			after := awaitRound(t, 20*time.Second, ws...)
			checkRound(t, after, as)
			if after[0].Round <= before[0].Round || !slices.Equal(after[0].MemberIDs(), before[0].MemberIDs()) {
				t.Fatalf("round %d %v -> round %d %v", before[0].Round, before[0].MemberIDs(), after[0].Round, after[0].MemberIDs())
			}
		}},
		{"hints arrive over Pub/Sub", func(t *testing.T, node int) {
			cfg := config(t, node)
			cfg.MinWorkers, cfg.LastCall = 2, 0
			// No heartbeat (which also polls the version) before the
			// deadline below: a change seen in time came from a hint.
			cfg.HeartbeatInterval, cfg.LeaseTTL = 10*time.Second, 30*time.Second
			const hintWithin = 5 * time.Second
			w, err := st.Watch(ctx, cfg.JobID)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			// PUBLISH is cluster-wide: a subscriber on a node that does not
			// serve the job's slot hears the job's hints too.
			other := cl.Addrs()[(node+1)%len(cl.Addrs())]
			rc := redis.NewClient(&redis.Options{Addr: other})
			defer rc.Close()
			ps := rc.Subscribe(ctx, store.KeyPrefix+"{"+cfg.JobID+"}:events")
			defer ps.Close()
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatal(err)
			}
			A, B, C := newAgent(t, st, cfg), newAgent(t, st, cfg), newAgent(t, st, cfg)
			start := time.Now()
			ws := joinAll(t, ctx, []*elastic.Agent{A, B})
			checkRound(t, ws, []*elastic.Agent{A, B})
			checkJobOnNode(t, cl, cfg.JobID, node)
			// The store's watcher gets the closing hint with the round's members.
			timeout := time.After(hintWithin)
			for got := false; !got; {
				select {
				case h := <-w.C():
					got = h.Round == ws[0].Round && slices.Equal(memberIDs(h.Members), ws[0].MemberIDs())
				case <-timeout:
					t.Fatalf("no hint of round %d within %v", ws[0].Round, hintWithin)
				}
			}
			select {
			case m := <-ps.Channel():
				if v, err := strconv.ParseUint(strings.SplitN(m.Payload, "\n", 2)[0], 10, 64); err != nil || v == 0 {
					t.Fatalf("hint on another node: %q", m.Payload)
				}
			case <-time.After(hintWithin):
				t.Fatalf("no hint on node %s, which does not serve the job", other)
			}
			// A late joiner: the running members learn of it from a hint.
			for _, a := range []*elastic.Agent{A, B} {
				select {
				case <-a.Changes():
				default:
				}
			}
			startWorker(t, C)
			for _, a := range []*elastic.Agent{A, B} {
				select {
				case <-a.Changes():
				case <-time.After(hintWithin):
					t.Fatal("no change hint after a late joiner arrived")
				}
				if !a.ChangePending() {
					t.Fatal("hint without ChangePending")
				}
			}
			if el := time.Since(start); el >= cfg.HeartbeatInterval {
				t.Fatalf("took %v: a heartbeat may have found the change, not a hint", el)
			}
		}},
		{"control: a script over two jobs' keys is refused", func(t *testing.T, node int) {
			// Proves the cluster enforces slots, so the scenarios above pass
			// because each job keeps to one slot, not because nothing checks.
			a, b := config(t, node), config(t, (node+1)%len(cl.Addrs()))
			keys := []string{jobRedisKeys(a.JobID)[0], jobRedisKeys(b.JobID)[0]}
			err := cc.Eval(ctx, "return redis.call('EXISTS', KEYS[1], KEYS[2])", keys).Err()
			if err == nil || !strings.Contains(err.Error(), "CROSSSLOT") {
				t.Fatalf("a script over %v: %v, want CROSSSLOT", keys, err)
			}
		}},
	}
	for i, sc := range scenarios {
		node := i % len(cl.Addrs())
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, node)
		})
	}
}

func memberIDs(ms []elastic.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}
