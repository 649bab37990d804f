package faultinject_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/netns"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A host whose link is cut in the middle of training (the worker on it
// keeps running but nothing reaches it or leaves it, no reset either: a
// pulled cable) is left behind: the others form a round without it within
// the detection time (its lease, Config.LeaseTTL, lapses; no connection
// closes to tell them sooner) and train on. When the link comes back, its
// worker finds itself fenced and rejoins as a new member, and the job ends
// with every invariant of the fault suite: every sample exactly once,
// identical parameters on every rank, checkpoints that restore.
func TestCutHostIsLeftBehindAndRejoinsAsANewMember(t *testing.T) {
	n := netns.ForTest(t, "h0", "h1", "h2", "redis")
	redisHost := n.Host("redis")
	srv := testredis.StartOn(t, redisHost.IP().String(), func(name string, args ...string) *exec.Cmd {
		return redisHost.Command(context.Background(), name, args...)
	})
	cfg := testConfig(t, srv.Addr())
	cfg.Hosts = []*netns.Host{n.Host("h0"), n.Host("h1"), n.Host("h2")}
	cfg.Epochs = 5
	cfg.StepDelay = 20 * time.Millisecond // 500 steps: the job lasts well past the cut and the return
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()

	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, h.WaitStep(wctx, 30))
	// The cut lasts past the lease (and the survivors' recovery), within
	// the workers' outage budget for Redis.
	fault := faultinject.Fault{Kind: faultinject.HostCut, Target: 1, Duration: 3 * cfg.LeaseTTL}
	in, err := h.Inject(ctx, fault)
	require.NoError(t, err)
	require.Empty(t, in.Skipped)
	cutWorker := h.Workers()[in.Worker]
	t.Logf("cut host %s of worker %d at step %d (round %d) for %v", cutWorker.Host.Name(), in.Worker, in.Step, in.Round, fault.Duration)

	// Left behind: the others' first step in a round of 2 after the cut.
	var left, back *faultinject.StepMark
	require.Eventually(t, func() bool {
		for _, m := range h.Steps() {
			if m.At.After(in.At) && m.Round > in.Round && m.Size == 2 && left == nil {
				left = &m
			}
			if left != nil && m.Round > left.Round && m.Size == 3 && back == nil {
				back = &m
			}
		}
		return back != nil || h.Status().Finished > 0
	}, 60*time.Second, 10*time.Millisecond, "no round of 2 after the cut, then of 3 after the link came back")
	require.NotNil(t, left, "no round of 2 after the cut")
	require.NotNil(t, back, "no round of 3 after the link returned")
	leftAfter := left.At.Sub(in.At)
	t.Logf("the others trained in round %d (2 workers) %v after the cut; round %d with the worker back %v after the link returned",
		left.Round, leftAfter.Round(time.Millisecond), back.Round, back.At.Sub(in.Healed).Round(time.Millisecond))
	// Detection is the lease: it lapses at most LeaseTTL after the last
	// heartbeat before the cut; the new round then forms (last call) and
	// trains. Bounded by the lease plus the round's own formation, well
	// before the link returns.
	require.Less(t, leftAfter, cfg.LeaseTTL+cfg.LastCall+2*time.Second, "left behind within the detection time")
	require.True(t, left.At.Before(in.Healed), "the others went on while the host was still cut off")
	require.True(t, back.At.After(in.Healed), "the round of 3 formed once the link was back")

	res := h.Finish(ctx, faultinject.Bounds{})
	require.Empty(t, res.Violations)
	require.Equal(t, 3, res.Finished, "the cut worker finished the job too")
	log, err := os.ReadFile(cutWorker.LogPath)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(log), "fenced; rejoining as a new member"), "the cut worker came back as a new member")
}
