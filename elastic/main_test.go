package elastic_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	// go-redis logs every failed dial; the outage tests cause many.
	redis.SetLogger(quietLogger{})
	testredis.VerifyTestMain(m)
}

// storeKind makes a Store for a test; the same tests run on each kind.
type storeKind struct {
	name string
	make func(t *testing.T) store.Store
}

func memoryKind() storeKind {
	return storeKind{"memory", func(t *testing.T) store.Store { return store.NewMemory() }}
}

func redisKind() storeKind {
	return storeKind{"redis", func(t *testing.T) store.Store { return store.NewRedis(testredis.Client(t)) }}
}

// onBothStores runs f as parallel subtests, "memory" and "redis", each
// with its own store and a fresh testConfig whose MinWorkers, MaxWorkers
// and LastCall are set to min, max and lastCall.
func onBothStores(t *testing.T, min, max int, lastCall time.Duration, f func(t *testing.T, s store.Store, cfg elastic.Config)) {
	for _, k := range []storeKind{memoryKind(), redisKind()} {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = min, max, lastCall
			f(t, k.make(t), cfg)
		})
	}
}

// standaloneKind runs the Redis store against the embedded server
// (elastic/standalone's), checking that the Lua scripts run there too.
func standaloneKind() storeKind {
	return storeKind{"standalone", func(t *testing.T) store.Store { return store.NewRedis(testredis.EmbeddedClient(t)) }}
}

func allKinds() []storeKind { return []storeKind{memoryKind(), redisKind(), standaloneKind()} }

// testConfig is a fast configuration for tests.
func testConfig(t *testing.T) elastic.Config {
	c := elastic.DefaultConfig()
	c.JobID = testredis.JobID(t)
	c.LastCall = 100 * time.Millisecond
	c.LeaseTTL = 1500 * time.Millisecond
	c.HeartbeatInterval = 100 * time.Millisecond
	c.PollInterval = 50 * time.Millisecond
	c.OutageBudget = 10 * time.Second
	c.JoinTimeout = 30 * time.Second
	c.StateTTL = 2 * time.Minute
	return c
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
