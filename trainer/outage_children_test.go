package trainer_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
	. "github.com/elastictrain/elastictrain/trainer"
)

// TestStoreCutForGoodStopsEverything (issue 14, Must show 5, in process):
// two workers train over real Redis, each through a plain
// redis.NewClient(&redis.Options{Addr: ...}) whose link passes a TCP
// proxy, and the SDK's real ring over TCP. One worker's link is
// blackholed for good: its Run returns within OutageBudget + 2 s of the
// cut with one error that says "store unavailable", and it has stopped
// its children: every goroutine it started (the Agent's heartbeat and
// progress watch, the checkpointer, the transport's listener and accept
// loop, the round's ring goroutines and collective watch, failure
// reports) is gone, checked with goleak against the goroutines that ran
// before it started (the proxy and the client's pool are the test's).
func TestStoreCutForGoodStopsEverything(t *testing.T) {
	proxy, err := faultinject.NewProxy("127.0.0.1:0", testredis.Addr(t))
	require.NoError(t, err)
	defer proxy.Close()
	cutClient := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	defer cutClient.Close()
	require.NoError(t, cutClient.Ping(t.Context()).Err())

	j := newJob(t, nil)
	j.epochs = 1000 // the job must not finish first
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 1
		c.Elastic.OutageBudget = 2 * time.Second
		c.CheckpointEvery = 20
	}
	dir, err := NewLocalDir(t.TempDir(), 2)
	require.NoError(t, err)
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(dir)} }
	stores := []store.Store{store.NewRedis(testredis.Client(t)), store.NewRedis(cutClient)}
	var n int
	j.store = func() store.Store { s := stores[n]; n++; return s }
	a := j.start()
	a.waitStep(t, 5)
	// Every goroutine that runs now, but the second worker's.
	before := goleak.IgnoreCurrent()
	b := j.start()
	b.waitStep(t, 40)

	proxy.SetBlackhole(true)
	cut := time.Now()
	select {
	case <-b.done:
	case <-time.After(j.config().Elastic.OutageBudget + 10*time.Second):
		t.Fatal("the cut-off worker still runs")
	}
	took := time.Since(cut)
	t.Logf("the cut-off worker stopped %v after the cut (bound %v) with: %v; load %s",
		took, j.config().Elastic.OutageBudget+2*time.Second, b.err, loadAvgNow())
	require.Less(t, took, j.config().Elastic.OutageBudget+2*time.Second)
	require.ErrorIs(t, b.err, elastic.ErrStoreUnavailable)
	require.Contains(t, b.err.Error(), "store unavailable")

	// The cut-off worker's children are gone while the other worker and
	// everything older still run: goleak ignores what ran before b
	// started, and the surviving worker's goroutines then were those of
	// a round of one; its later rounds' goroutines are told apart by
	// stopping it first.
	a.cancel()
	<-a.done
	cutClient.Close()
	proxy.Close()
	goleak.VerifyNone(t, before)
}

// loadAvgNow returns /proc/loadavg, for the figures' context.
func loadAvgNow() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}
