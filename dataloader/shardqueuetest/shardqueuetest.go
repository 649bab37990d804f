package shardqueuetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
)

// NewQueue returns a fresh, empty queue for cfg; whatever it allocates it
// releases through t.Cleanup.
type NewQueue func(t *testing.T, cfg dataloader.ShardConfig) dataloader.ShardQueue

// TTL is the lease TTL the suite uses where leases must expire.
const TTL = 300 * time.Millisecond

// Run runs the suite as subtests of t; queues that implement the optional
// dataloader.ShardReclaimer get its case too (ReclaimRevokesAllButKept).
func Run(t *testing.T, newQueue NewQueue) {
	t.Run("LeaseOrderAndDrain", func(t *testing.T) { testLeaseOrderAndDrain(t, newQueue) })
	t.Run("AckSemantics", func(t *testing.T) { testAckSemantics(t, newQueue) })
	t.Run("ExpiryReleasesShard", func(t *testing.T) { testExpiry(t, newQueue) })
	t.Run("RenewExtendsLease", func(t *testing.T) { testRenew(t, newQueue) })
	t.Run("EpochsAreIndependent", func(t *testing.T) { testEpochs(t, newQueue) })
	t.Run("ConcurrentWorkersExactlyOnce", func(t *testing.T) { testConcurrent(t, newQueue) })
	t.Run("FasterWorkersTakeMore", func(t *testing.T) { testFaster(t, newQueue) })
	if _, ok := newQueue(t, dataloader.ShardConfig{DatasetLen: 1, ShardSize: 1, LeaseTTL: time.Minute}).(dataloader.ShardReclaimer); ok {
		t.Run("ReclaimRevokesAllButKept", func(t *testing.T) { testReclaim(t, newQueue) })
	}
}

// testReclaim is run for queues that are dataloader.ShardReclaimers.
func testReclaim(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 10, ShardSize: 2, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	r := q.(dataloader.ShardReclaimer)
	ctx := context.Background()
	if n, err := r.Reclaim(ctx, 0, nil); err != nil || n != 0 {
		fatalf(t, "reclaim of an epoch never used: %d, %v; want 0, nil", n, err)
	}
	var s [4]dataloader.Shard // 0 acked, 1 kept, 2 and 3 revoked; shard 4 never leased
	for i := range s {
		var err error
		if s[i], err = q.Lease(ctx, 0, fmt.Sprintf("w%d", i)); err != nil || s[i].Index != i {
			fatalf(t, "lease %d: %+v %v", i, s[i], err)
		}
	}
	if err := q.Ack(ctx, s[0]); err != nil {
		fatalf(t, "ack: %v", err)
	}
	forged := s[3]
	forged.Token += 1000 // the right shard with another token does not keep it
	other := s[2]
	other.Epoch = 1 // a lease of another epoch does not keep it either
	n, err := r.Reclaim(ctx, 0, []dataloader.Shard{s[0], s[1], forged, other})
	if err != nil || n != 2 {
		fatalf(t, "reclaim: %d, %v; want 2 revoked", n, err)
	}
	if n, err := r.Reclaim(ctx, 0, []dataloader.Shard{s[1]}); err != nil || n != 0 {
		fatalf(t, "second reclaim: %d, %v; want 0 (revoked leases are not counted again)", n, err)
	}
	for _, x := range s[2:] {
		if err := q.Ack(ctx, x); !errors.Is(err, dataloader.ErrLeaseLost) {
			fatalf(t, "late ack of revoked shard %d: %v, want ErrLeaseLost", x.Index, err)
		}
		if _, err := q.Renew(ctx, x); !errors.Is(err, dataloader.ErrLeaseLost) {
			fatalf(t, "renew of revoked shard %d: %v, want ErrLeaseLost", x.Index, err)
		}
	}
	if _, err := q.Renew(ctx, s[1]); err != nil {
		fatalf(t, "renew of the kept lease: %v", err)
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 5, Acked: 1, Leased: 3, Pending: 1})
	// The revoked shards come first, at once, with new tokens; then the
	// never-leased one.
	got := map[int]dataloader.Shard{}
	for range 3 {
		x, err := q.Lease(ctx, 0, "new")
		if err != nil {
			fatalf(t, "lease after reclaim: %v", err)
		}
		got[x.Index] = x
	}
	for _, old := range s[2:] {
		x, ok := got[old.Index]
		if !ok || x.Token == old.Token || x.Attempt != 2 || x.Worker != "new" {
			fatalf(t, "after reclaim the leases are %+v; want shard %d again with a new token, attempt 2, worker new", got, old.Index)
		}
		if err := q.Ack(ctx, old); !errors.Is(err, dataloader.ErrLeaseLost) {
			fatalf(t, "ack of revoked shard %d after its re-lease: %v, want ErrLeaseLost", old.Index, err)
		}
		if err := q.Ack(ctx, x); err != nil {
			fatalf(t, "ack by the new holder: %v", err)
		}
	}
	if _, ok := got[4]; !ok {
		fatalf(t, "after reclaim the leases are %+v; want the never-leased shard 4 third", got)
	}
	if err := q.Ack(ctx, s[1]); err != nil {
		fatalf(t, "ack of the kept lease: %v", err)
	}
	if err := q.Ack(ctx, got[4]); err != nil {
		fatalf(t, "ack: %v", err)
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 5, Acked: 5})
	if _, err := q.Lease(ctx, 0, "new"); !errors.Is(err, dataloader.ErrEpochDone) {
		fatalf(t, "lease after every shard is acked: %v, want ErrEpochDone", err)
	}
}

func fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf(format, args...)
}

func checkProgress(t *testing.T, q dataloader.ShardQueue, epoch int, want dataloader.ShardProgress) {
	t.Helper()
	got, err := q.Progress(context.Background(), epoch)
	if err != nil {
		fatalf(t, "Progress: %v", err)
	}
	if got != want {
		fatalf(t, "Progress(%d) = %+v, want %+v", epoch, got, want)
	}
}

func testLeaseOrderAndDrain(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 10, ShardSize: 3, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	ctx := context.Background()
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 4, Pending: 4})
	var shards []dataloader.Shard
	before := time.Now()
	for i := range 4 {
		s, err := q.Lease(ctx, 0, "w1")
		if err != nil {
			fatalf(t, "lease %d: %v", i, err)
		}
		lo, hi := cfg.ShardRange(i)
		if s.Epoch != 0 || s.Index != i || s.Lo != lo || s.Hi != hi || s.Worker != "w1" || s.Attempt != 1 {
			fatalf(t, "lease %d gave %+v, want index %d [%d,%d) worker w1 attempt 1", i, s, i, lo, hi)
		}
		// The deadline comes from the queue's clock; allow for skew.
		if d := s.Deadline.Sub(before); d < time.Minute-5*time.Second || d > time.Minute+5*time.Second {
			fatalf(t, "lease %d deadline %v is not about LeaseTTL from now", i, s.Deadline)
		}
		for _, o := range shards {
			if o.Token == s.Token {
				fatalf(t, "two leases with token %d", s.Token)
			}
		}
		shards = append(shards, s)
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 4, Leased: 4})
	_, err := q.Lease(ctx, 0, "w2")
	var busy *dataloader.BusyError
	if !errors.As(err, &busy) || !errors.Is(err, dataloader.ErrNoShardFree) {
		fatalf(t, "lease with all shards leased: %v, want a BusyError", err)
	}
	if busy.RetryAt.Sub(shards[0].Deadline).Abs() > 5*time.Millisecond {
		fatalf(t, "RetryAt %v, want the earliest deadline %v", busy.RetryAt, shards[0].Deadline)
	}
	for _, s := range shards {
		if err := q.Ack(ctx, s); err != nil {
			fatalf(t, "ack %d: %v", s.Index, err)
		}
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 4, Acked: 4})
	if _, err := q.Lease(ctx, 0, "w1"); !errors.Is(err, dataloader.ErrEpochDone) {
		fatalf(t, "lease after all acked: %v, want ErrEpochDone", err)
	}
	if _, err := dataloader.LeaseWait(ctx, q, 0, "w1", 0); !errors.Is(err, dataloader.ErrEpochDone) {
		fatalf(t, "LeaseWait after all acked: %v, want ErrEpochDone", err)
	}
}

func testAckSemantics(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 4, ShardSize: 2, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	ctx := context.Background()
	s, err := q.Lease(ctx, 0, "w")
	if err != nil {
		fatalf(t, "lease: %v", err)
	}
	forged := s
	forged.Token += 1000
	if err := q.Ack(ctx, forged); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "ack with a wrong token: %v, want ErrLeaseLost", err)
	}
	if _, err := q.Renew(ctx, forged); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "renew with a wrong token: %v, want ErrLeaseLost", err)
	}
	never := dataloader.Shard{Epoch: 0, Index: 1, Token: 1 << 40}
	if err := q.Ack(ctx, never); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "ack of a shard never leased: %v, want ErrLeaseLost", err)
	}
	if err := q.Ack(ctx, dataloader.Shard{Epoch: 7, Index: 0, Token: 1}); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "ack in an unknown epoch: %v, want ErrLeaseLost", err)
	}
	if err := q.Ack(ctx, s); err != nil {
		fatalf(t, "ack: %v", err)
	}
	if err := q.Ack(ctx, s); err != nil {
		fatalf(t, "repeated ack of the same lease: %v, want nil", err)
	}
	if err := q.Ack(ctx, forged); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "ack of an acked shard under another token: %v, want ErrLeaseLost", err)
	}
	if _, err := q.Renew(ctx, s); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "renew of an acked shard: %v, want ErrLeaseLost", err)
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 2, Acked: 1, Pending: 1})
}

// waitExpired waits (polling, with a deadline) until Lease grants shard
// index again, and returns that lease.
func waitExpired(t *testing.T, q dataloader.ShardQueue, epoch int, worker string, held dataloader.Shard) dataloader.Shard {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), held.Deadline.Sub(time.Now())+time.Second)
	defer cancel()
	s, err := dataloader.LeaseWait(ctx, q, epoch, worker, 10*time.Millisecond)
	if err != nil {
		fatalf(t, "shard %d not served again within its lease + 1 s: %v", held.Index, err)
	}
	return s
}

func testExpiry(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 2, ShardSize: 2, LeaseTTL: TTL}
	q := newQueue(t, cfg)
	ctx := context.Background()
	a, err := q.Lease(ctx, 0, "a")
	if err != nil {
		fatalf(t, "lease: %v", err)
	}
	b := waitExpired(t, q, 0, "b", a)
	if b.Index != a.Index || b.Attempt != 2 || b.Worker != "b" || b.Token == a.Token {
		fatalf(t, "re-lease %+v after %+v: want same index, attempt 2, worker b, new token", b, a)
	}
	if err := q.Ack(ctx, a); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "ack by the worker whose lease expired and was re-leased: %v, want ErrLeaseLost", err)
	}
	if _, err := q.Renew(ctx, a); !errors.Is(err, dataloader.ErrLeaseLost) {
		fatalf(t, "renew by the worker whose lease was re-leased: %v, want ErrLeaseLost", err)
	}
	if err := q.Ack(ctx, b); err != nil {
		fatalf(t, "ack by the new holder: %v", err)
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 1, Acked: 1})

	// A lease that expired but was not leased again can still be acked.
	q2 := newQueue(t, cfg)
	c, err := q2.Lease(ctx, 0, "c")
	if err != nil {
		fatalf(t, "lease: %v", err)
	}
	// Wait (on a timer, for the lease's own expiry) until its deadline has passed.
	<-time.After(time.Until(c.Deadline.Add(20 * time.Millisecond)))
	if err := q2.Ack(ctx, c); err != nil {
		fatalf(t, "late ack with no re-lease: %v, want nil", err)
	}
	checkProgress(t, q2, 0, dataloader.ShardProgress{Total: 1, Acked: 1})
}

// shortCtx returns a context that ends after d.
func shortCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testRenew(t *testing.T, newQueue NewQueue) {
	// A longer lease than the suite's TTL: each iteration below must renew
	// within it, and a loaded machine can stall a goroutine for a while.
	const ttl = 4 * TTL
	cfg := dataloader.ShardConfig{DatasetLen: 1, ShardSize: 1, LeaseTTL: ttl}
	q := newQueue(t, cfg)
	ctx := context.Background()
	s, err := q.Lease(ctx, 0, "w")
	if err != nil {
		fatalf(t, "lease: %v", err)
	}
	// Keep renewing across several TTLs: nobody else gets the shard.
	end := time.Now().Add(5 * ttl / 2)
	for time.Now().Before(end) {
		r, err := q.Renew(ctx, s)
		if err != nil {
			fatalf(t, "renew: %v", err)
		}
		if r.Deadline.Before(s.Deadline) || r.Token != s.Token || r.Index != s.Index {
			fatalf(t, "renew gave %+v after %+v", r, s)
		}
		s = r
		if _, err := q.Lease(ctx, 0, "other"); !errors.Is(err, dataloader.ErrNoShardFree) {
			fatalf(t, "lease while renewed: %v, want ErrNoShardFree", err)
		}
		if o, err := dataloader.LeaseWait(shortCtx(t, ttl/10), q, 0, "other-waits", time.Millisecond); err == nil {
			fatalf(t, "another worker leased the renewed shard: %+v", o)
		}
	}
	if err := q.Ack(ctx, s); err != nil {
		fatalf(t, "ack after renewals: %v", err)
	}
}

func testEpochs(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 3, ShardSize: 1, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	ctx := context.Background()
	for e := range 3 {
		for i := range 3 {
			s, err := q.Lease(ctx, e, "w")
			if err != nil || s.Index != i || s.Epoch != e {
				fatalf(t, "epoch %d lease %d: %+v %v", e, i, s, err)
			}
			if e != 1 {
				if err := q.Ack(ctx, s); err != nil {
					fatalf(t, "ack: %v", err)
				}
			}
		}
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: 3, Acked: 3})
	checkProgress(t, q, 1, dataloader.ShardProgress{Total: 3, Leased: 3})
	checkProgress(t, q, 2, dataloader.ShardProgress{Total: 3, Acked: 3})
	checkProgress(t, q, 3, dataloader.ShardProgress{Total: 3, Pending: 3})
}

// drain runs workers concurrently until the epoch is done; work(worker,
// shard) is called before each ack. It returns acked shard indices per worker.
func drain(t *testing.T, q dataloader.ShardQueue, epoch int, workers []string, work func(w string, s dataloader.Shard)) map[string][]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	acked := map[string][]int{}
	var wg sync.WaitGroup
	errs := make(chan error, len(workers))
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				s, err := dataloader.LeaseWait(ctx, q, epoch, w, 5*time.Millisecond)
				if errors.Is(err, dataloader.ErrEpochDone) {
					return
				}
				if err != nil {
					errs <- fmt.Errorf("worker %s: %w", w, err)
					return
				}
				work(w, s)
				if err := q.Ack(ctx, s); err != nil {
					errs <- fmt.Errorf("worker %s ack %d: %w", w, s.Index, err)
					return
				}
				mu.Lock()
				acked[w] = append(acked[w], s.Index)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fatalf(t, "%v", err)
	}
	return acked
}

func testConcurrent(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 1000, ShardSize: 7, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	acked := drain(t, q, 0, []string{"w0", "w1", "w2", "w3", "w4", "w5"}, func(string, dataloader.Shard) {})
	count := make([]int, cfg.NumShards())
	for _, idx := range acked {
		for _, i := range idx {
			count[i]++
		}
	}
	for i, c := range count {
		if c != 1 {
			fatalf(t, "shard %d acked %d times", i, c)
		}
	}
	checkProgress(t, q, 0, dataloader.ShardProgress{Total: cfg.NumShards(), Acked: cfg.NumShards()})
}

func testFaster(t *testing.T, newQueue NewQueue) {
	cfg := dataloader.ShardConfig{DatasetLen: 40, ShardSize: 1, LeaseTTL: time.Minute}
	q := newQueue(t, cfg)
	// The slow worker finishes one shard per three of the fast worker's: it
	// waits for a tick the fast worker sends after every third shard, or for
	// release once no shard is left to lease.
	tick := make(chan struct{}, 64)
	release := make(chan struct{})
	var once sync.Once
	fastCount := 0
	acked := drain(t, q, 0, []string{"fast", "slow"}, func(w string, s dataloader.Shard) {
		if w == "slow" {
			select {
			case <-tick:
			case <-release:
			}
			return
		}
		fastCount++
		if fastCount%3 == 0 {
			tick <- struct{}{}
		}
		p, err := q.Progress(context.Background(), 0)
		if err != nil || p.Pending == 0 {
			once.Do(func() { close(release) })
		}
	})
	once.Do(func() { close(release) })
	if len(acked["fast"]) < 2*len(acked["slow"]) {
		fatalf(t, "fast worker acked %d shards, slow %d: want fast >= 2x slow", len(acked["fast"]), len(acked["slow"]))
	}
	if len(acked["fast"])+len(acked["slow"]) != 40 {
		fatalf(t, "acked %d shards in all, want 40", len(acked["fast"])+len(acked["slow"]))
	}
}
