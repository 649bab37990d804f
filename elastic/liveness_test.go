package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// livenessFull runs the long acceptance variants of issue 14:
//
//	ELASTICTRAIN_LIVENESS_FULL=1 go test -count=1 -run 'Liveness|SlowStore|Blackholed' ./elastic
func livenessFull() bool { return os.Getenv("ELASTICTRAIN_LIVENESS_FULL") == "1" }

// plainAgent makes an Agent over a plain redis.NewClient (the README's
// client: ContextTimeoutEnabled off) to addr.
func plainAgent(t *testing.T, addr string, cfg elastic.Config, name string) *elastic.Agent {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	a, err := elastic.NewAgent(elastic.NewRedisStore(c), elastic.NewMember("127.0.0.1:"+name), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = a.Close()
		_ = c.Close()
	})
	return a
}

func newProxy(t *testing.T, upstream string) *faultinject.Proxy {
	t.Helper()
	p, err := faultinject.NewProxy("127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestSlowStoreLinkKeepsRound (issue 14, Must show 1): one member's link to
// Redis gets 0.7 x LeaseTTL of latency in each direction (a round trip of
// 1.4 leases). Its lease never lapses in Redis (heartbeats overlap), so
// nothing changes: no member sees ChangePending and the round stays. Then,
// from a healed link, the latency jumps to 1.5 x LeaseTTL: no renewal
// reaches Redis for longer than a lease, its lease lapses on Redis' clock,
// and the other member holds a round without it within LeaseTTL + 1 s.
func TestSlowStoreLinkKeepsRound(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL, cfg.HeartbeatInterval = time.Second, 100*time.Millisecond
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 2, time.Hour
	addr := testredis.Addr(t)
	p := newProxy(t, addr)
	fast := plainAgent(t, addr, cfg, "1")
	slow := plainAgent(t, p.Addr(), cfg, "2")
	ctx := context.Background()
	ws := joinAll(t, ctx, []*elastic.Agent{fast, slow})
	checkRound(t, ws, []*elastic.Agent{fast, slow})
	round := ws[0].Round
	settle := time.Now().Add(3 * cfg.HeartbeatInterval) // let the slow member's heartbeats overlap once
	for time.Now().Before(settle) {
		time.Sleep(cfg.HeartbeatInterval)
	}

	periods := 3
	if livenessFull() {
		periods = 10
	}
	p.SetLatency(cfg.LeaseTTL * 7 / 10)
	end := time.Now().Add(time.Duration(periods) * cfg.LeaseTTL)
	samples := 0
	for time.Now().Before(end) {
		for i, a := range []*elastic.Agent{fast, slow} {
			if a.ChangePending() {
				t.Fatalf("agent %d: ChangePending with 0.7 x LeaseTTL latency on the slow link (after %d samples; err %v)",
					i, samples, a.Err())
			}
		}
		samples++
		time.Sleep(5 * time.Millisecond)
	}
	if r := fast.LastRound(); r != round {
		t.Fatalf("round moved from %d to %d", round, r)
	}
	t.Logf("%d lease periods with 0.7 x LeaseTTL latency: no change (%d samples)", periods, samples)

	// From a healthy link, the latency jumps to 1.5 x LeaseTTL: no renewal
	// reaches Redis for longer than a lease.
	p.SetLatency(0)
	waitFor(t, 5*time.Second, "the slow link's backlog to drain", func() bool { return !slow.ChangePending() })
	healthy := time.Now().Add(2 * cfg.HeartbeatInterval)
	for time.Now().Before(healthy) {
		time.Sleep(cfg.HeartbeatInterval)
	}
	p.SetLatency(cfg.LeaseTTL * 3 / 2)
	cut := time.Now()
	for !fast.ChangePending() {
		if time.Since(cut) > cfg.LeaseTTL+time.Second {
			t.Fatalf("fast member saw no change %v after 1.5 x LeaseTTL latency began", time.Since(cut))
		}
		time.Sleep(5 * time.Millisecond)
	}
	jctx, cancel := context.WithTimeout(ctx, cfg.LeaseTTL+time.Second-time.Since(cut))
	defer cancel()
	w, err := fast.Join(jctx)
	if err != nil {
		t.Fatalf("fast member's Join %v after the latency grew: %v", time.Since(cut), err)
	}
	took := time.Since(cut)
	if w.Size != 1 || w.Members[0].ID != fast.Member().ID {
		t.Fatalf("round %d holds %v, want the fast member alone", w.Round, w.MemberIDs())
	}
	t.Logf("1.5 x LeaseTTL latency: the slow member was left behind after %v (bound %v); load %s",
		took, cfg.LeaseTTL+time.Second, loadavg())
}

// TestBlackholedStoreLink (issue 14, Must show 5): with a plain
// redis.NewClient (ContextTimeoutEnabled off, ReadTimeout 3 s), a store call
// through a blackholed link fails within the Agent's own deadline, and an
// Agent whose link stays blackholed stops within OutageBudget + 2 s of the
// cut (the outage clock starts when the first failed call started) with one
// error that says "store unavailable".
func TestBlackholedStoreLink(t *testing.T) {
	cfg := testConfig(t)
	cfg.LeaseTTL, cfg.HeartbeatInterval = 500*time.Millisecond, 100*time.Millisecond
	cfg.OutageBudget = 1500 * time.Millisecond
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 1, time.Hour
	logs := &firstWarn{}
	cfg.Logger = slog.New(logs)
	p := newProxy(t, testredis.Addr(t))
	a := plainAgent(t, p.Addr(), cfg, "1")
	if _, err := a.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.SetBlackhole(true)
	cut := time.Now()
	defer p.SetBlackhole(false)
	for a.Err() == nil {
		if time.Since(cut) > cfg.OutageBudget+2*time.Second {
			t.Fatalf("agent still running %v after the cut", time.Since(cut))
		}
		time.Sleep(5 * time.Millisecond)
	}
	stopped := time.Since(cut)
	err := a.Err()
	if !errors.Is(err, elastic.ErrStoreUnavailable) || !strings.Contains(err.Error(), "store unavailable") {
		t.Fatalf("error %v, want ErrStoreUnavailable", err)
	}
	first := logs.at().Sub(cut)
	// The heartbeat's own deadline is 2 x LeaseTTL = 1 s, go-redis' read
	// timeout 3 s.
	if first <= 0 || first > 2*cfg.LeaseTTL+500*time.Millisecond {
		t.Fatalf("first failed store call reported %v after the cut, want within the agent's deadline (%v)", first, 2*cfg.LeaseTTL)
	}
	if _, jerr := a.Join(context.Background()); !errors.Is(jerr, elastic.ErrStoreUnavailable) {
		t.Fatalf("Join after the outage: %v", jerr)
	}
	t.Logf("first failure noticed %v after the cut; stopped after %v (bound %v): %v; load %s",
		first, stopped, cfg.OutageBudget+2*time.Second, err, loadavg())
}

// firstWarn is a slog.Handler that records when the first WARN arrived.
type firstWarn struct {
	mu    sync.Mutex
	first time.Time
}

func (h *firstWarn) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *firstWarn) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.first.IsZero() && strings.Contains(r.Message, "store unreachable") {
		h.first = time.Now()
	}
	return nil
}
func (h *firstWarn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *firstWarn) WithGroup(string) slog.Handler      { return h }
func (h *firstWarn) at() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.first
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return fmt.Sprint(err)
	}
	return strings.TrimSpace(string(b))
}
