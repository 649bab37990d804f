package faultinject_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestRedisSentinelFailoverLosingWrites: the workers reach Redis through
// go-redis' failover client (redis.NewFailoverClient) and three real
// redis-sentinel processes that watch a real master and its replica. The
// replica replicates through a proxy; mid-training the proxy holds the
// replication stream back while the membership changes (the master records
// the change and the round that follows it; the replica never sees them),
// then the replication link is reset and the master SIGKILLed. The
// Sentinels promote the replica, so the store the job goes on with has
// lost those acknowledged writes: the round the workers train in, a
// membership change and every heartbeat since the hold. The job must train
// on to the end with every invariant: every sample of every epoch exactly
// once (audit.Verify through the harness), identical parameters on
// every rank, no worker left blocked, and a worker that arrives after the
// failover is admitted.
func TestRedisSentinelFailoverLosingWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lost changes the membership while the replica is held back and
		// returns the number of workers that then train.
		lost func(t *testing.T, h *faultinject.Harness) int
	}{
		{"a join", func(t *testing.T, h *faultinject.Harness) int {
			_, err := h.AddWorker(context.Background())
			require.NoError(t, err)
			return h.Config().Workers + 1
		}},
		{"a graceful leave", func(t *testing.T, h *faultinject.Harness) int {
			require.NoError(t, h.Signal(h.Workers()[0], syscall.SIGTERM))
			return h.Config().Workers - 1
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { failoverLosing(t, tc.lost) })
	}
}

func failoverLosing(t *testing.T, lost func(t *testing.T, h *faultinject.Harness) int) {
	ctx := context.Background()
	var link *faultinject.Proxy
	set := testredis.StartSentinel(t, testredis.SentinelConfig{ReplicaLink: func(master string) (string, error) {
		p, err := faultinject.NewProxy("127.0.0.1:0", master)
		if err != nil {
			return "", err
		}
		link = p
		t.Cleanup(func() { _ = p.Close() })
		return p.Addr(), nil
	}})

	cfg := testConfig(t, set.MasterAddr())
	cfg.RedisSentinels, cfg.RedisMaster = set.SentinelAddrs(), testredis.SentinelMaster
	cfg.Epochs, cfg.StepDelay = 8, 8*time.Millisecond
	// The SDK's default lease (3 s) outlasts the failover (down-after
	// 500 ms, then the Sentinels' vote and the promotion), so the
	// members keep their leases across it and meet the rolled-back state.
	cfg.LeaseTTL, cfg.HeartbeatInterval = 3*time.Second, 300*time.Millisecond
	cfg.OutageBudget = 20 * time.Second
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log of the first master:\n%s", set.Log(set.MasterAddr()))
			t.Logf("log of the replica:\n%s", set.Log(set.ReplicaAddr()))
			// The Sentinels' own logs say why a failover did not happen
			// (+tilt under a starved machine, -failover-abort-no-good-slave).
			for _, a := range set.SentinelAddrs() {
				t.Logf("log of Sentinel %s:\n%s", a, set.Log(a))
			}
		}
	})

	bounded := func(d time.Duration) (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) }
	c, cancel := bounded(30 * time.Second)
	require.NoError(t, h.WaitStep(c, 30))
	cancel()

	// Hold the replication stream back, then change the membership: the
	// master alone learns of the change and of the round that follows it.
	link.SetBlackhole(true)
	before := h.Status()
	training := lost(t, h)
	c, cancel = bounded(30 * time.Second)
	st, err := h.WaitFor(c, func(s testStatus) bool {
		return s.MaxRound > before.MaxRound && s.Ranked == training && s.Live == training || s.Finished > 0
	})
	cancel()
	require.NoError(t, err, "the membership change did not form a round: %+v", st)
	require.Zero(t, st.Finished, "the job finished before the failover; make it longer")
	c, cancel = bounded(10 * time.Second)
	masterOff, err := testredis.ReplOffset(c, set.MasterAddr())
	require.NoError(t, err)
	replicaOff, err := testredis.ReplOffset(c, set.ReplicaAddr())
	require.NoError(t, err)
	cancel()
	require.Greater(t, masterOff, replicaOff, "the replica must lack acknowledged writes when its master dies")
	t.Logf("the master dies %d bytes of writes ahead of its replica (round %d, step %d)", masterOff-replicaOff, st.MaxRound, st.MaxStep)

	// Reset the replication link (the bytes the proxy holds are dropped,
	// and the replica cannot reconnect), then kill the master.
	link.SetRefuse(true)
	link.Cut()
	killedAt := time.Now()
	set.Kill(set.MasterAddr())
	c, cancel = bounded(30 * time.Second)
	var promoted string
	for promoted != set.ReplicaAddr() && c.Err() == nil {
		promoted, _ = set.CurrentMaster(c)
		if promoted != set.ReplicaAddr() {
			_ = sleepCtx(c, 50*time.Millisecond)
		}
	}
	cancel()
	require.Equal(t, set.ReplicaAddr(), promoted, "the Sentinels did not promote the replica")
	t.Logf("the Sentinels promoted the replica %.2f s after the kill", time.Since(killedAt).Seconds())
	// The offset at the promotion, not the replica's offset now: the
	// workers write to the new master as soon as they find it.
	off, err := testredis.PromotionOffset(ctx, set.ReplicaAddr())
	require.NoError(t, err)
	require.Less(t, off, masterOff, "the promoted replica had received the held writes")

	// Training goes on against the promoted replica, and a worker that
	// arrives now is admitted within a few leases.
	after := h.Status()
	_, err = h.AddWorker(ctx)
	require.NoError(t, err)
	c, cancel = bounded(20 * time.Second)
	st, err = h.WaitFor(c, func(s testStatus) bool {
		return s.MaxRound > after.MaxRound && s.Ranked == training+1 && s.MaxStep >= after.MaxStep+20 || s.Finished > 0
	})
	cancel()
	require.NoError(t, err, "after the failover the new worker was not admitted, or the job made no progress: %+v", st)
	require.Zero(t, st.Finished, "the job finished before the new worker joined; make it longer")
	t.Logf("round %d with %d workers at step %d, %.2f s after the kill", st.MaxRound, st.Ranked, st.MaxStep, time.Since(killedAt).Seconds())

	res := h.Finish(ctx, faultinject.Bounds{Exit: 90 * time.Second})
	require.Empty(t, res.Violations)
	require.Equal(t, training+1, res.Finished, "every worker that trains ends with the job finished")
	require.Zero(t, res.Audit.Missing)
	require.Zero(t, res.Audit.Duplicates)
}

type testStatus = faultinject.Status

// logWorkersOnFailure logs every worker's log file when t has failed, at
// cleanup (registered before the harness closes, so it runs after).
func logWorkersOnFailure(t *testing.T, h *faultinject.Harness) {
	t.Cleanup(func() {
		if t.Failed() {
			for _, w := range h.Workers() {
				b, _ := os.ReadFile(w.LogPath)
				t.Logf("log of worker %d:\n%s", w.Index, b)
			}
		}
	})
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
