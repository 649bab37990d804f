package elastic_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	base := elastic.DefaultConfig()
	base.JobID = "job-1"
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*elastic.Config)
	}{
		{"empty job", func(c *elastic.Config) { c.JobID = "" }},
		{"brace in job", func(c *elastic.Config) { c.JobID = "a{b}" }},
		{"space in job", func(c *elastic.Config) { c.JobID = "a b" }},
		{"long job", func(c *elastic.Config) { c.JobID = strings.Repeat("x", elastic.MaxJobIDLen+1) }},
		{"min 0", func(c *elastic.Config) { c.MinWorkers = 0 }},
		{"max < min", func(c *elastic.Config) { c.MinWorkers, c.MaxWorkers = 4, 3 }},
		{"negative last call", func(c *elastic.Config) { c.LastCall = -1 }},
		{"no join timeout", func(c *elastic.Config) { c.JoinTimeout = 0 }},
		{"tiny lease", func(c *elastic.Config) { c.LeaseTTL = time.Millisecond }},
		{"heartbeat > lease/2", func(c *elastic.Config) { c.HeartbeatInterval = 2 * time.Second }},
		{"no poll", func(c *elastic.Config) { c.PollInterval = 0 }},
		{"no outage budget", func(c *elastic.Config) { c.OutageBudget = 0 }},
		{"state ttl < lease", func(c *elastic.Config) { c.StateTTL = time.Second }},
		{"negative progress timeout", func(c *elastic.Config) { c.ProgressTimeout = -1 }},
		{"negative phase timeout", func(c *elastic.Config) { c.PhaseTimeout = -1 }},
	}
	for _, tc := range cases {
		c := base
		tc.mod(&c)
		if err := c.Validate(); !errors.Is(err, elastic.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", tc.name, err)
		}
		if _, err := elastic.NewAgent(store.NewMemory(), elastic.NewMember(""), c); err == nil {
			t.Errorf("%s: NewAgent accepted the config", tc.name)
		}
	}
	if base.PhaseTimeout != elastic.DefaultPhaseTimeout || elastic.DefaultPhaseTimeout != 10*time.Minute {
		t.Errorf("default PhaseTimeout %v, want 10 min", base.PhaseTimeout)
	}
	if _, err := elastic.NewAgent(nil, elastic.NewMember(""), base); err == nil {
		t.Error("NewAgent accepted a nil store")
	}
	if _, err := elastic.NewAgent(store.NewMemory(), elastic.Member{}, base); err == nil {
		t.Error("NewAgent accepted an empty member ID")
	}
}

func TestNewMemberIdentity(t *testing.T) {
	t.Parallel()
	a, b := elastic.NewMember("127.0.0.1:1"), elastic.NewMember("127.0.0.1:1")
	if a.ID == b.ID || len(a.ID) != 32 {
		t.Fatalf("member IDs %q, %q: want distinct 32-hex IDs", a.ID, b.ID)
	}
	if a.Host != b.Host || a.PID != b.PID || a.Addr != "127.0.0.1:1" {
		t.Fatalf("members %+v %+v", a, b)
	}
	if strings.Contains(a.ID, a.Host) && a.Host != "" {
		t.Fatal("member ID derived from the host name")
	}
}

func TestWorldAddrs(t *testing.T) {
	t.Parallel()
	w := elastic.World{Size: 2, Members: []elastic.Member{{ID: "a", Addr: "h:1"}, {ID: "b", Addr: "h:2"}}}
	if got := w.Addrs(); len(got) != 2 || got[0] != "h:1" || got[1] != "h:2" {
		t.Fatalf("Addrs = %v", got)
	}
}

func TestAgentMisuse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := store.NewMemory()
	cfg := testConfig(t)
	a := newAgent(t, s, cfg)
	if !a.ChangePending() {
		t.Fatal("ChangePending false before the first Join")
	}
	if err := a.ReportFailure(ctx, 1, "x"); err == nil {
		t.Fatal("ReportFailure before Join accepted")
	}
	if err := a.Finish(ctx); err == nil {
		t.Fatal("Finish before Join accepted")
	}
	if _, err := a.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.ReportFailure(ctx, 1, ""); err == nil {
		t.Fatal("ReportFailure with an empty ID accepted")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	// A Join in a job whose round cannot close, with a cancelled context.
	b := newAgent(t, s, func() elastic.Config { c := cfg; c.JobID += "-other"; c.MinWorkers = 5; return c }())
	if _, err := b.Join(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Join with a cancelled ctx: %v", err)
	}
	short := cfg
	short.JobID += "-timeout"
	short.MinWorkers, short.JoinTimeout = 5, 200*time.Millisecond
	c := newAgent(t, s, short)
	if _, err := c.Join(ctx); !errors.Is(err, elastic.ErrJoinTimeout) {
		t.Fatalf("Join past JoinTimeout: %v", err)
	}
	_ = a.Close()
	if _, err := a.Join(ctx); !errors.Is(err, elastic.ErrClosed) {
		t.Fatalf("Join after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestNoGoroutineAfterClose: an Agent's goroutines (lease renewal, Pub/Sub
// subscription) are all gone once Close returns. Not parallel: it compares
// against the goroutines that exist when it starts.
func TestNoGoroutineAfterClose(t *testing.T) {
	for _, k := range []storeKind{memoryKind(), redisKind()} {
		t.Run(k.name, func(t *testing.T) {
			s := k.make(t)
			if k.name == "redis" {
				// Warm the shared client's pool so its connections predate
				// the snapshot.
				_ = testredis.Client(t).Ping(context.Background()).Err()
			}
			opts := []goleak.Option{goleak.IgnoreCurrent()}
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			as := make([]*elastic.Agent, 3)
			for i := range as {
				a, err := elastic.NewAgent(s, elastic.NewMember(""), cfg)
				if err != nil {
					t.Fatal(err)
				}
				as[i] = a
			}
			joinAll(t, context.Background(), as)
			if err := as[2].Leave(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, a := range as {
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			}
			goleak.VerifyNone(t, opts...)
		})
	}
}
