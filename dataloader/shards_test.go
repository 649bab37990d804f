package dataloader_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/shardqueuetest"
)

func TestMemoryQueueConformance(t *testing.T) {
	shardqueuetest.Run(t, func(t *testing.T, cfg dataloader.ShardConfig) dataloader.ShardQueue {
		q, err := dataloader.NewMemoryQueue(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return q
	})
}

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestMemoryQueueExpiryWithInjectedClock: expired leases come back
// earliest-deadline first, before never-leased shards.
func TestMemoryQueueExpiryWithInjectedClock(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	q, err := dataloader.NewMemoryQueueWithClock(dataloader.ShardConfig{DatasetLen: 5, ShardSize: 1, LeaseTTL: 10 * time.Second}, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s0, _ := q.Lease(ctx, 0, "a")
	clk.Advance(time.Second)
	s1, _ := q.Lease(ctx, 0, "b")
	clk.Advance(9500 * time.Millisecond) // s0 expired (10.5 s), s1 not (9.5 s)
	r, err := q.Lease(ctx, 0, "c")
	if err != nil || r.Index != s0.Index || r.Attempt != 2 {
		t.Fatalf("after s0 expired: %+v %v, want shard %d attempt 2", r, err, s0.Index)
	}
	n, err := q.Lease(ctx, 0, "c")
	if err != nil || n.Index != 2 {
		t.Fatalf("next lease %+v %v, want the never-leased shard 2", n, err)
	}
	clk.Advance(time.Second) // s1 expired
	r1, err := q.Lease(ctx, 0, "d")
	if err != nil || r1.Index != s1.Index {
		t.Fatalf("after s1 expired: %+v %v", r1, err)
	}
	if err := q.Ack(ctx, s1); !errors.Is(err, dataloader.ErrLeaseLost) {
		t.Fatalf("stale ack: %v", err)
	}
}

func TestShardConfig(t *testing.T) {
	c := dataloader.DefaultShardConfig()
	if c.Validate() == nil {
		t.Fatal("DefaultShardConfig without DatasetLen validated")
	}
	c.DatasetLen = 2500
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.NumShards() != 3 {
		t.Fatalf("NumShards %d", c.NumShards())
	}
	if lo, hi := c.ShardRange(2); lo != 2048 || hi != 2500 {
		t.Fatalf("ShardRange(2) = %d, %d", lo, hi)
	}
	if lo, hi := c.ShardRange(3); lo != 0 || hi != 0 {
		t.Fatalf("ShardRange(3) = %d, %d", lo, hi)
	}
	for _, bad := range []dataloader.ShardConfig{
		{DatasetLen: 1, ShardSize: 0, LeaseTTL: time.Second},
		{DatasetLen: 1, ShardSize: 1, LeaseTTL: time.Microsecond},
	} {
		if err := bad.Validate(); !errors.Is(err, dataloader.ErrInvalidConfig) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	s := dataloader.Shard{Lo: 1, Hi: 3}
	if got := s.Indices([]int{9, 8, 7, 6}); len(got) != 2 || got[0] != 8 || got[1] != 7 {
		t.Fatalf("Indices %v", got)
	}
	if got := (dataloader.Shard{Lo: 3, Hi: 9}).Indices([]int{1, 2}); got != nil {
		t.Fatalf("Indices past the order: %v", got)
	}
}
