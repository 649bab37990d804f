package testredis_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

func TestMain(m *testing.M) { testredis.VerifyTestMain(m) }

func TestSharedClientPings(t *testing.T) {
	t.Parallel()
	c := testredis.Client(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if testredis.Addr(t) == "" {
		t.Fatal("empty addr")
	}
}

func TestJobIDUniqueAndSanitized(t *testing.T) {
	t.Parallel()
	a, b := testredis.JobID(t), testredis.JobID(t)
	if a == b {
		t.Fatalf("two JobIDs equal: %q", a)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]+$`).MatchString(a) {
		t.Fatalf("JobID %q has characters outside [A-Za-z0-9_-]", a)
	}
	t.Run("sub/with spaces{and}braces", func(t *testing.T) {
		id := testredis.JobID(t)
		if !regexp.MustCompile(`^[A-Za-z0-9_-]+$`).MatchString(id) {
			t.Fatalf("JobID %q has characters outside [A-Za-z0-9_-]", id)
		}
	})
}

func TestPrivateServerStopRestartComesBackEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testredis.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if s.Running() {
		t.Fatal("Running after Stop")
	}
	if err := c.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET succeeded on a stopped server")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Get(ctx, "k").Err()
		if err == redis.Nil {
			break // reachable and empty
		}
		if err == nil {
			t.Fatal("key survived Restart")
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not reachable after Restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
