package redisqueue_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

var fuzzJobs atomic.Int64

// FuzzQueueReadsGarbage writes arbitrary values into an epoch's three keys
// (any of them may also be of the wrong type) and runs every queue
// operation over them (Reclaim included) against a real Redis: each returns a result within
// the layout (a shard index < NumShards, a positive token) or an error;
// never a panic.
func FuzzQueueReadsGarbage(f *testing.F) {
	f.Add("10", "4", "0", "3", "1", 5e15, "t:1", "2", uint8(0))
	f.Add("10", "4", "x", "nan", "abc", -1e300, "k:0", "\xff", uint8(0))
	f.Add("1e400", "-4", "99", "0", "99", 1e300, "a:1", "", uint8(5))
	f.Add("10", "4", "3", "0", "0", 0.0, "w:0", "w", uint8(2))
	f.Fuzz(func(t *testing.T, n, size, next, acked, leased string, score float64, stateField, stateValue string, wrongTypes uint8) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := testredis.Client(t)
		sc := dataloader.DefaultShardConfig()
		sc.DatasetLen, sc.ShardSize = 10, 4
		job := fmt.Sprintf("fuzz-queue-%d-%d", time.Now().UnixNano(), fuzzJobs.Add(1))
		q := newQueue(t, c, job, sc)
		base := q.Config().Prefix + "{" + job + "}:shards:0:"
		keys := []string{base + "meta", base + "leases", base + "state"}
		defer c.Del(context.Background(), keys...)
		if score != score {
			score = 0 // NaN is not a valid score
		}
		p := c.TxPipeline()
		for i, k := range keys {
			if wrongTypes&(1<<i) != 0 {
				p.LPush(ctx, k, "wrong type")
				continue
			}
			switch i {
			case 0:
				p.HSet(ctx, k, "n", n, "size", size, "next", next, "seq", next, "acked", acked)
			case 1:
				p.ZAdd(ctx, k, redis.Z{Score: score, Member: leased})
			case 2:
				p.HSet(ctx, k, stateField, stateValue, "t:0", stateValue)
			}
			p.Expire(ctx, k, time.Minute)
		}
		if _, err := p.Exec(ctx); err != nil {
			return // Redis refused the setup; nothing to test
		}
		if s, err := q.Lease(ctx, 0, "w"); err == nil {
			if s.Index < 0 || s.Index >= sc.NumShards() || s.Token == 0 || s.Lo > s.Hi || s.Hi > sc.DatasetLen {
				t.Fatalf("lease out of the layout: %+v", s)
			}
			if _, err := q.Renew(ctx, s); err == nil {
				_ = q.Ack(ctx, s)
			}
		}
		// Whatever the leases set held, after a Lease or Reclaim that
		// succeeded it names only shards of the layout (issue #20: garbage
		// members revoked by Reclaim became a malformed lease once per
		// lease period).
		onlyShards := func(after string) {
			members, err := c.ZRange(ctx, keys[1], 0, -1).Result()
			if err != nil {
				return // the key is of the wrong type
			}
			for _, m := range members {
				i, err := strconv.Atoi(m)
				if err != nil || i < 0 || i >= sc.NumShards() || strconv.Itoa(i) != m {
					t.Fatalf("after %s the leases set holds %q (all: %q)", after, m, members)
				}
			}
		}
		forged := dataloader.Shard{Epoch: 0, Index: 0, Token: 2, Worker: "w"}
		_, _ = q.Renew(ctx, forged)
		_ = q.Ack(ctx, forged)
		if n, err := q.Reclaim(ctx, 0, []dataloader.Shard{forged}); err == nil {
			if n < 0 {
				t.Fatalf("Reclaim revoked %d leases", n)
			}
			onlyShards("Reclaim")
		}
		if s, err := q.Lease(ctx, 0, "w2"); err == nil {
			if s.Index < 0 || s.Index >= sc.NumShards() || s.Token == 0 {
				t.Fatalf("lease after Reclaim out of the layout: %+v", s)
			}
			onlyShards("Lease")
		} else if strings.Contains(err.Error(), "malformed") {
			t.Fatalf("lease after Reclaim: %v", err)
		}
		if p, err := q.Progress(ctx, 0); err == nil && p.Total != sc.NumShards() {
			t.Fatalf("progress of %d shards, layout has %d", p.Total, sc.NumShards())
		}
	})
}
