package store_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial.
	redis.SetLogger(quietLogger{})
	testredis.VerifyTestMain(m)
}

// storeKind makes a Store for a test; the same tests run on each kind.
type storeKind struct {
	name string
	make func(t *testing.T) store.Store
}

func redisKind() storeKind {
	return storeKind{"redis", func(t *testing.T) store.Store { return store.NewRedis(testredis.Client(t)) }}
}

// standaloneKind runs the Redis store against the embedded server
// (elastic/standalone), checking that the Lua scripts run there too.
func standaloneKind() storeKind {
	return storeKind{"standalone", func(t *testing.T) store.Store {
		srv, err := standalone.Start(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{srv.Addr()}})
		t.Cleanup(func() { _ = c.Close() })
		return store.NewRedis(c)
	}}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// dropRedisJob deletes a job's keys, as a Redis restarted empty would (only
// this job's keys: the server is shared).
func dropRedisJob(t *testing.T, s store.Store, jobID string) {
	t.Helper()
	rs, ok := s.(*store.Redis)
	if !ok {
		t.Fatalf("not a Redis store: %T", s)
	}
	if err := rs.DropJob(context.Background(), jobID); err != nil {
		t.Fatal(err)
	}
}
