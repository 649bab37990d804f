package elastic_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A client whose ACL user may not touch the job's keys gets NOPERM on every
// call, which no retry heals: Join fails at once with ErrNoPermission (and
// ErrStoreUnavailable) carrying Redis' words, instead of retrying for the
// whole outage budget (an hour here; the test's context, 20 s, would end
// first).
func TestNoPermissionFailsAtOnce(t *testing.T) {
	t.Parallel()
	srv := testredis.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := newClient(srv.Addr())
	defer admin.Close()
	// A user for another job's keys only (a common ACL mistake).
	if err := admin.Do(ctx, "ACL", "SETUSER", "otherjob", "on", ">pw", "~other:*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "otherjob", Password: "pw"})
	defer c.Close()
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers = 1, 1
	cfg.OutageBudget = time.Hour
	a := newAgent(t, store.NewRedis(c), cfg)
	_, err := a.Join(ctx)
	for _, want := range []error{elastic.ErrNoPermission, elastic.ErrStoreUnavailable} {
		if !errors.Is(err, want) {
			t.Fatalf("Join without permission on the job's keys: %v, want it to wrap %v", err, want)
		}
	}
	if !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Join without permission: %v, want Redis' NOPERM words", err)
	}
	if !errors.Is(a.Err(), elastic.ErrNoPermission) {
		t.Fatalf("Agent.Err() = %v, want ErrNoPermission", a.Err())
	}
}
