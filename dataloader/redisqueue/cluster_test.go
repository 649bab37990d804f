package redisqueue_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/dataloader/shardqueuetest"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// epochKeys are the keys of one epoch as the package doc names them.
func epochKeys(cfg redisqueue.Config, epoch int) []string {
	base := cfg.Prefix + "{" + cfg.JobID + "}:shards:" + strconv.Itoa(epoch) + ":"
	return []string{base + "meta", base + "leases", base + "state"}
}

// checkEpochOnNode asserts, asking the cluster itself, that the epoch's
// keys share one slot served by cl.Addrs()[node] and are stored there.
func checkEpochOnNode(t *testing.T, cl *testredis.Cluster, cfg redisqueue.Config, epoch, node int) {
	t.Helper()
	cl.RequireOnNode(t, node, epochKeys(cfg, epoch))
}

// TestRedisCluster runs the queue on a real Redis Cluster of three masters
// through a go-redis ClusterClient: lease, ack and expiry re-serve on jobs
// placed (with CLUSTER KEYSLOT) on each node in turn, then the whole
// dataloader.ShardQueue conformance suite with its queues spread over the
// nodes.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cl := testredis.StartCluster(t)
	cc := cl.Client(t)
	ctx := context.Background()
	for node := range cl.Addrs() {
		t.Run("lease ack expiry on node "+strconv.Itoa(node), func(t *testing.T) {
			t.Parallel()
			cfg := redisqueue.DefaultConfig()
			cfg.JobID = cl.TagOn(t, testredis.JobID(t), node)
			cfg.Shards = dataloader.ShardConfig{DatasetLen: 3, ShardSize: 1, LeaseTTL: shardqueuetest.TTL}
			q, err := redisqueue.New(cc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			a, err := q.Lease(ctx, 0, "a")
			if err != nil {
				t.Fatal(err)
			}
			checkEpochOnNode(t, cl, cfg, 0, node)
			b, err := q.Lease(ctx, 0, "b")
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Ack(ctx, b); err != nil {
				t.Fatalf("ack: %v", err)
			}
			// a's worker dies: its shard is served again once the lease lapses.
			wctx, cancel := context.WithTimeout(ctx, time.Until(a.Deadline)+2*time.Second)
			defer cancel()
			var again dataloader.Shard
			for again.Index != a.Index || again.Attempt < 2 {
				s, err := dataloader.LeaseWait(wctx, q, 0, "c", 10*time.Millisecond)
				if err != nil {
					t.Fatalf("shard %d not served again after its lease: %v", a.Index, err)
				}
				if s.Index != a.Index {
					if err := q.Ack(ctx, s); err != nil { // the never-leased shard
						t.Fatal(err)
					}
					continue
				}
				again = s
			}
			if again.Worker != "c" || again.Token == a.Token {
				t.Fatalf("re-served %+v after %+v", again, a)
			}
			if err := q.Ack(ctx, a); !errors.Is(err, dataloader.ErrLeaseLost) {
				t.Fatalf("ack by the expired holder: %v, want ErrLeaseLost", err)
			}
			if err := q.Ack(ctx, again); err != nil {
				t.Fatal(err)
			}
			p, err := q.Progress(ctx, 0)
			if err != nil || p != (dataloader.ShardProgress{Total: 3, Acked: 3}) {
				t.Fatalf("progress %+v, %v", p, err)
			}
			if _, err := q.Lease(ctx, 0, "a"); !errors.Is(err, dataloader.ErrEpochDone) {
				t.Fatalf("lease after the epoch: %v, want ErrEpochDone", err)
			}
		})
	}
	t.Run("conformance", func(t *testing.T) {
		t.Parallel()
		n := 0
		shardqueuetest.Run(t, func(t *testing.T, sc dataloader.ShardConfig) dataloader.ShardQueue {
			n++
			return newQueue(t, cc, cl.TagOn(t, testredis.JobID(t), n%len(cl.Addrs())), sc)
		})
	})
	t.Run("a Prefix with braces is refused", func(t *testing.T) {
		t.Parallel()
		// Why: "{}" in the prefix makes the first hash tag empty, so each key
		// hashes whole and the epoch's three keys fall in different slots,
		// where every script would fail with CROSSSLOT.
		cfg := redisqueue.DefaultConfig()
		cfg.JobID = testredis.JobID(t)
		cfg.Prefix = "x{}:"
		cfg.Shards.DatasetLen = 3
		slots := map[int]bool{}
		for _, k := range epochKeys(cfg, 0) {
			slot, _, err := cl.SlotOwner(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			slots[slot] = true
		}
		if len(slots) == 1 {
			t.Fatalf("keys %v share one slot", epochKeys(cfg, 0))
		}
		if _, err := redisqueue.New(cc, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
			t.Fatalf("New with Prefix %q: %v, want ErrInvalidConfig", cfg.Prefix, err)
		}
	})
}
