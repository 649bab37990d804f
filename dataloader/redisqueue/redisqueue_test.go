package redisqueue_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/dataloader/shardqueuetest"
	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestMain(m *testing.M) { testredis.VerifyTestMain(m) }

func newQueue(t *testing.T, c redis.UniversalClient, job string, sc dataloader.ShardConfig) *redisqueue.Queue {
	t.Helper()
	cfg := redisqueue.DefaultConfig()
	cfg.Shards, cfg.JobID = sc, job
	q, err := redisqueue.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestConformance(t *testing.T) {
	c := testredis.Client(t)
	shardqueuetest.Run(t, func(t *testing.T, sc dataloader.ShardConfig) dataloader.ShardQueue {
		return newQueue(t, c, testredis.JobID(t), sc)
	})
}

func TestConfig(t *testing.T) {
	c := testredis.Client(t)
	cfg := redisqueue.DefaultConfig()
	cfg.Shards.DatasetLen = 10
	for _, job := range []string{"", "a{b", "a}b"} {
		cfg.JobID = job
		if _, err := redisqueue.New(c, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
			t.Fatalf("JobID %q: %v", job, err)
		}
	}
	cfg.JobID = "ok"
	for _, prefix := range []string{"x{}:", "{tenant}:", "a}"} {
		cfg.Prefix = prefix
		if _, err := redisqueue.New(c, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
			t.Fatalf("Prefix %q: %v", prefix, err)
		}
	}
	cfg.Prefix = redisqueue.DefaultConfig().Prefix
	cfg.KeyTTL = time.Second
	if _, err := redisqueue.New(c, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
		t.Fatalf("KeyTTL below LeaseTTL: %v", err)
	}
	cfg.KeyTTL = time.Hour
	if _, err := redisqueue.New(nil, cfg); !errors.Is(err, dataloader.ErrInvalidConfig) {
		t.Fatalf("nil client: %v", err)
	}
}

// TestLayoutMismatchAndGarbage: a queue with another layout, or keys
// holding garbage, get a clear error, never a panic.
func TestLayoutMismatchAndGarbage(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	job := testredis.JobID(t)
	a := newQueue(t, c, job, dataloader.ShardConfig{DatasetLen: 100, ShardSize: 10, LeaseTTL: time.Minute})
	b := newQueue(t, c, job, dataloader.ShardConfig{DatasetLen: 100, ShardSize: 20, LeaseTTL: time.Minute})
	if _, err := a.Lease(ctx, 0, "w"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lease(ctx, 0, "w"); !errors.Is(err, dataloader.ErrShardMismatch) {
		t.Fatalf("lease with another shard size: %v", err)
	}
	if _, err := b.Progress(ctx, 0); !errors.Is(err, dataloader.ErrShardMismatch) {
		t.Fatalf("progress with another shard size: %v", err)
	}
	// The keys carry the job as a hash tag and have a TTL.
	meta := "elastictrain:{" + job + "}:shards:0:meta"
	ttl, err := c.PTTL(ctx, meta).Result()
	if err != nil || ttl <= 0 || ttl > 7*24*time.Hour {
		t.Fatalf("PTTL(%s) = %v, %v; want a TTL of at most 7 days", meta, ttl, err)
	}
	// Garbage in the stored state.
	if err := c.HSet(ctx, meta, "n", "not-a-number").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lease(ctx, 0, "w"); !errors.Is(err, dataloader.ErrShardMismatch) {
		t.Fatalf("lease over garbage: %v", err)
	}
	if _, err := a.Progress(ctx, 0); err == nil {
		t.Fatal("progress over garbage: no error")
	}
	if err := c.Set(ctx, meta, "a string, not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lease(ctx, 0, "w"); err == nil {
		t.Fatal("lease over a wrong-type key: no error")
	}
	if err := a.Ack(ctx, dataloader.Shard{Epoch: 0, Index: 1, Token: 5}); !errors.Is(err, dataloader.ErrLeaseLost) {
		t.Fatalf("ack of a never-leased shard: %v", err)
	}
}

// Environment of the worker child processes.
const (
	envRole  = "REDISQUEUE_CHILD_ROLE" // "victim" or "worker"
	envAddr  = "REDISQUEUE_CHILD_ADDR"
	envJob   = "REDISQUEUE_CHILD_JOB"
	envName  = "REDISQUEUE_CHILD_NAME"
	killSize = 600
	killStep = 40
	killSeed = 7
	killTTL  = time.Second
)

func killShards() dataloader.ShardConfig {
	return dataloader.ShardConfig{DatasetLen: killSize, ShardSize: killStep, LeaseTTL: killTTL}
}

// TestHelperProcess is the worker child of TestSIGKILLedWorker. As
// "victim" it acks two shards, then leases a third, prints HOLD and blocks
// until killed. As "worker" it leases and acks until the epoch is done,
// printing ACK <index> <token> <attempt> <granted ms> after each ack.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		return // not a child
	}
	c := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr)})
	defer c.Close()
	q := newQueue(t, c, os.Getenv(envJob), killShards())
	name := os.Getenv(envName)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	order := dataloader.Order(killSeed, 0, killSize)
	for n := 0; ; n++ {
		s, err := dataloader.LeaseWait(ctx, q, 0, name, 20*time.Millisecond)
		if errors.Is(err, dataloader.ErrEpochDone) {
			fmt.Println("DONE")
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		granted := s.Deadline.Add(-killTTL).UnixMilli()
		if role == "victim" && n == 2 {
			fmt.Printf("HOLD %d %d %d\n", s.Index, s.Token, s.Deadline.UnixMilli())
			os.Stdout.Sync()
			<-ctx.Done() // held until SIGKILL
			t.Fatal("victim was not killed")
		}
		sum := 0
		for _, id := range s.Indices(order) { // the "training" on the shard's samples
			sum += id
		}
		if err := q.Ack(ctx, s); err != nil {
			fmt.Printf("LOST %d %v\n", s.Index, err)
			continue
		}
		fmt.Printf("ACK %d %d %d %d\n", s.Index, s.Token, s.Attempt, granted)
		os.Stdout.Sync()
	}
}

type child struct {
	name  string
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func startChild(t *testing.T, role, name, addr, job string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envRole+"="+role, envAddr+"="+addr, envJob+"="+job, envName+"="+name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{name: name, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(ch.done)
		defer close(ch.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-ch.done
		_ = cmd.Wait()
	})
	return ch
}

type ack struct {
	worker         string
	index, attempt int
	token          uint64
	grantedMs      int64
}

func parseAck(worker, line string) (ack, bool) {
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != "ACK" {
		return ack{}, false
	}
	a := ack{worker: worker}
	a.index, _ = strconv.Atoi(f[1])
	a.token, _ = strconv.ParseUint(f[2], 10, 64)
	a.attempt, _ = strconv.Atoi(f[3])
	a.grantedMs, _ = strconv.ParseInt(f[4], 10, 64)
	return a, true
}

// TestSIGKILLedWorker: a worker process holding a shard is SIGKILLed while
// two other worker processes drain the epoch. The held shard is served
// again within its lease + 1 s (by the Redis clock), and every sample id of
// the epoch is acked exactly once.
func TestSIGKILLedWorker(t *testing.T) {
	addr := testredis.Addr(t)
	job := testredis.JobID(t)
	ctx := context.Background()
	deadline := time.After(30 * time.Second)

	var acks []ack
	victim := startChild(t, "victim", "victim", addr, job)
	var holdIndex int
	var holdDeadlineMs int64
	for holding := false; !holding; {
		select {
		case line, ok := <-victim.lines:
			if !ok {
				t.Fatal("victim exited before holding a shard")
			}
			if a, ok := parseAck("victim", line); ok {
				acks = append(acks, a)
			}
			var tok uint64
			if n, _ := fmt.Sscanf(line, "HOLD %d %d %d", &holdIndex, &tok, &holdDeadlineMs); n == 3 {
				holding = true
			}
		case <-deadline:
			t.Fatal("victim never held a shard")
		}
	}
	if len(acks) != 2 {
		t.Fatalf("victim acked %d shards before holding one, want 2", len(acks))
	}

	workers := []*child{startChild(t, "worker", "w1", addr, job), startChild(t, "worker", "w2", addr, job)}
	// Kill the victim once a healthy worker has acked a shard, i.e. while
	// the others are working.
	var mu sync.Mutex
	collect := func(w *child, first chan<- struct{}) {
		sent := false
		for line := range w.lines {
			if a, ok := parseAck(w.name, line); ok {
				mu.Lock()
				acks = append(acks, a)
				mu.Unlock()
				if !sent {
					first <- struct{}{}
					sent = true
				}
			}
		}
	}
	first := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); collect(w, first) }()
	}
	select {
	case <-first:
	case <-deadline:
		t.Fatal("no healthy worker acked a shard")
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	err := victim.cmd.Wait()
	if ws, ok := victim.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("victim did not die of SIGKILL: %v", err)
	}

	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-deadline:
		t.Fatal("healthy workers did not finish the epoch")
	}
	for _, w := range workers {
		if err := w.cmd.Wait(); err != nil {
			t.Fatalf("worker %s: %v", w.name, err)
		}
	}

	// The held shard was served again, within its lease + 1 s.
	var reserved *ack
	for i := range acks {
		if acks[i].index == holdIndex {
			if reserved != nil {
				t.Fatalf("held shard %d acked twice: %+v and %+v", holdIndex, *reserved, acks[i])
			}
			reserved = &acks[i]
		}
	}
	if reserved == nil {
		t.Fatalf("held shard %d was never acked", holdIndex)
	}
	if reserved.attempt != 2 || reserved.worker == "victim" {
		t.Fatalf("held shard re-served as %+v, want attempt 2 by a healthy worker", *reserved)
	}
	late := time.Duration(reserved.grantedMs-holdDeadlineMs) * time.Millisecond
	t.Logf("shard %d: lease expired at %d ms, served again %v after expiry (lease %v) to %s",
		holdIndex, holdDeadlineMs, late, killTTL, reserved.worker)
	if late < 0 || late > time.Second {
		t.Fatalf("held shard served again %v after its lease expired, want within [0, 1 s]", late)
	}

	// Every id of the epoch was acked exactly once.
	order := dataloader.Order(killSeed, 0, killSize)
	count := make([]int, killSize)
	sc := killShards()
	for _, a := range acks {
		lo, hi := sc.ShardRange(a.index)
		for _, id := range order[lo:hi] {
			count[id]++
		}
	}
	for id, c := range count {
		if c != 1 {
			t.Fatalf("sample %d acked %d times", id, c)
		}
	}
	q := newQueue(t, testredis.Client(t), job, sc)
	p, err := q.Progress(ctx, 0)
	if err != nil || !p.Done() || p.Acked != sc.NumShards() {
		t.Fatalf("progress %+v %v, want all %d shards acked", p, err, sc.NumShards())
	}
}

// TestConformanceEmbedded runs the suite against the embedded server
// (elastic/standalone, miniredis), the fallback for single-host jobs
// without a redis-server: its Lua, TIME and TTLs must serve the queue too.
func TestConformanceEmbedded(t *testing.T) {
	srv, err := standalone.Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	shardqueuetest.Run(t, func(t *testing.T, sc dataloader.ShardConfig) dataloader.ShardQueue {
		return newQueue(t, c, testredis.JobID(t), sc)
	})
}

// TestGarbageLeaseMembersAreDropped: members of an epoch's leases set that
// name no shard of the layout ("abc", "-1", "01", "1.5", an index past
// the last shard), with tokens or not, are dropped by Reclaim and Lease,
// never granted, and never turn into a malformed-lease error (issue #20:
// Reclaim revoked them like leases, so Lease picked them first and
// failed, once per lease period).
func TestGarbageLeaseMembersAreDropped(t *testing.T) {
	c := testredis.Client(t)
	ctx := context.Background()
	job := testredis.JobID(t)
	sc := dataloader.ShardConfig{DatasetLen: 40, ShardSize: 10, LeaseTTL: time.Minute}
	q := newQueue(t, c, job, sc)
	held, err := q.Lease(ctx, 0, "w")
	if err != nil {
		t.Fatal(err)
	}
	base := "elastictrain:{" + job + "}:shards:0:"
	garbage := []string{"abc", "-1", "01", "1.5", "4", "99", "", " 2"}
	for _, g := range garbage {
		if err := c.ZAdd(ctx, base+"leases", redis.Z{Score: 0, Member: g}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, base+"state", "t:"+g, 7, "w:"+g, "x", "a:"+g, 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	n, err := q.Reclaim(ctx, 0, []dataloader.Shard{held})
	if err != nil || n != 0 {
		t.Fatalf("Reclaim over garbage members: %d revoked, %v; want 0 (the only lease is kept)", n, err)
	}
	if p, err := q.Progress(ctx, 0); err != nil || p.Leased != 1 {
		t.Fatalf("progress after Reclaim: %+v, %v; want the one real lease", p, err)
	}
	// Garbage that arrives after a Reclaim is dropped by Lease itself.
	if err := c.ZAdd(ctx, base+"leases", redis.Z{Score: 0, Member: "late"}).Err(); err != nil {
		t.Fatal(err)
	}
	acked := map[int]bool{}
	for {
		s, err := q.Lease(ctx, 0, "w")
		if errors.Is(err, dataloader.ErrNoShardFree) {
			break
		}
		if err != nil {
			t.Fatalf("Lease over garbage members: %v", err)
		}
		if s.Index < 0 || s.Index >= sc.NumShards() || s.Index == held.Index || acked[s.Index] {
			t.Fatalf("granted %+v", s)
		}
		if err := q.Ack(ctx, s); err != nil {
			t.Fatal(err)
		}
		acked[s.Index] = true
	}
	if err := q.Ack(ctx, held); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Lease(ctx, 0, "w"); !errors.Is(err, dataloader.ErrEpochDone) {
		t.Fatalf("after every shard is acked: %v, want ErrEpochDone", err)
	}
	members, err := c.ZRange(ctx, base+"leases", 0, -1).Result()
	if err != nil || len(members) != 0 {
		t.Fatalf("leases set holds %q (%v) after the epoch is done", members, err)
	}
	fields, err := c.HKeys(ctx, base+"state").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		for _, g := range append(garbage, "late") {
			if len(f) > 2 && f[2:] == g {
				t.Fatalf("state field %q of garbage member %q left", f, g)
			}
		}
	}
}
