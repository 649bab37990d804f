package standalone_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/elastic/standalone"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeysExpireInRealTime(t *testing.T) {
	ctx := context.Background()
	s, err := standalone.Start(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()

	if err := c.Set(ctx, "k", "v", 100*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("get before expiry = %q, %v", v, err)
	}
	start := time.Now()
	deadline := start.Add(2 * time.Second)
	for {
		n, err := c.Exists(ctx, "k").Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("key with 100 ms TTL still present after 2 s")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("key expired after %v, before its TTL", el)
	}
}

func TestLuaAndPubSub(t *testing.T) {
	ctx := context.Background()
	s, err := standalone.Start(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	n, err := redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`).Run(ctx, c, []string{"{j}:n"}, 5).Int()
	if err != nil || n != 5 {
		t.Fatalf("script = %d, %v", n, err)
	}
	sub := c.Subscribe(ctx, "ch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, "ch", "hi").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-sub.Channel():
		if m.Payload != "hi" {
			t.Fatalf("payload %q", m.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no message")
	}
}

func TestCloseTwiceAndStartCanceled(t *testing.T) {
	s, err := standalone.Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, standalone.ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := standalone.Start(ctx, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start(canceled) = %v", err)
	}
	if _, err := standalone.Start(context.Background(), "256.0.0.1:bad"); err == nil {
		t.Fatal("bad address accepted")
	}
}
