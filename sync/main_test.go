package sync

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const helperEnv = "ELASTICTRAIN_SYNC_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(m.Run()) // a child rank of a failure test: no leak check
	}
	goleak.VerifyTestMain(m)
}

// testConfig returns a Config with a job ID unique to the test and a random secret.
func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	var b [8]byte
	rand.Read(b[:])
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(name) > 200 {
		name = name[:200]
	}
	cfg.JobID = fmt.Sprintf("%s-%x", name, b)
	cfg.Secret = make([]byte, 32)
	rand.Read(cfg.Secret)
	cfg.DialTimeout = 10 * time.Second
	cfg.OpTimeout = 30 * time.Second
	return cfg
}

// testWorld is an in-process world: n transports on loopback and the Rings
// of one round.
type testWorld struct {
	cfg   Config
	ts    []*Transport
	rings []*Ring
}

func listenAll(t testing.TB, n int, cfg Config) ([]*Transport, []string) {
	t.Helper()
	ts := make([]*Transport, n)
	addrs := make([]string, n)
	for i := range ts {
		tr, err := Listen(context.Background(), "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		ts[i], addrs[i] = tr, tr.Addr()
		t.Cleanup(func() { tr.Close() })
	}
	return ts, addrs
}

// tryConnectAll connects round `round` as rank i on ts[i], concurrently,
// for a world of len(addrs) ranks; it closes nothing.
func tryConnectAll(ts []*Transport, addrs []string, round uint64) ([]*Ring, []error) {
	rings := make([]*Ring, len(ts))
	errs := make([]error, len(ts))
	var wg gosync.WaitGroup
	for i, tr := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rings[i], errs[i] = tr.Connect(context.Background(), World{Round: round, Rank: i, Addrs: addrs})
		}()
	}
	wg.Wait()
	return rings, errs
}

// connectAll connects round `round` on every transport concurrently.
func connectAll(t testing.TB, ts []*Transport, addrs []string, round uint64) []*Ring {
	t.Helper()
	rings, errs := tryConnectAll(ts, addrs, round)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Connect rank %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rings {
			r.Close()
		}
	})
	return rings
}

func newTestWorld(t testing.TB, n int, cfg Config) *testWorld {
	t.Helper()
	ts, addrs := listenAll(t, n, cfg)
	return &testWorld{cfg: cfg, ts: ts, rings: connectAll(t, ts, addrs, 1)}
}

// each runs f on every rank concurrently and returns the errors by rank.
func (w *testWorld) each(f func(rank int, r *Ring) error) []error {
	errs := make([]error, len(w.rings))
	var wg gosync.WaitGroup
	for i, r := range w.rings {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, r)
		}()
	}
	wg.Wait()
	return errs
}

func (w *testWorld) must(t testing.TB, what string, f func(rank int, r *Ring) error) {
	t.Helper()
	for i, err := range w.each(f) {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, i, err)
		}
	}
}
