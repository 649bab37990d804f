package faultinject_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Issue 14 (liveness that tells slow from dead from hung) with real worker
// processes, a real Redis and a proxy on each worker's store link. The long
// variants (10 lease periods of latency) run with
//
//	ELASTICTRAIN_LIVENESS_FULL=1 go test -count=1 -run 'TestLiveness' ./internal/faultinject
func livenessFull() bool { return os.Getenv("ELASTICTRAIN_LIVENESS_FULL") == "1" }

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// stepsIn returns the highest global step reported at or before t.
func stepAt(h *faultinject.Harness, t time.Time) int64 {
	var s int64
	for _, m := range h.Steps() {
		if !m.At.After(t) {
			s = max(s, m.Step)
		}
	}
	return s
}

// waitBack waits until worker w, released from a fault, steps again in a
// round of size, and fails the test if the job finished first: a worker
// the job finished without exits with an error, which Finish counts as a
// violation, so a test whose job is too short for the way back would fail
// there with a less telling message.
func waitBack(t *testing.T, h *faultinject.Harness, w *faultinject.Worker, size int) {
	t.Helper()
	since := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := h.WaitFor(ctx, func(s faultinject.Status) bool {
		for _, m := range h.Steps() {
			if m.At.After(since) && m.Size == size && m.Worker == w.Index {
				return true
			}
		}
		return s.Finished > 0
	})
	require.NoError(t, err, "worker %d did not step in a round of %d within 60 s of its release", w.Index, size)
	require.Zero(t, h.Status().Finished, "the job finished before worker %d came back; raise Epochs", w.Index)
	t.Logf("worker %d stepped in a round of %d again %v after its release", w.Index, size, time.Since(since).Round(time.Millisecond))
}

// TestLivenessSlowStoreLink (Must show 1): one worker's Redis link gets
// 0.7 x LeaseTTL of latency each way for several lease periods: no round
// changes, and the job steps at least half as fast as undisturbed. From a
// healed link, 1.5 x LeaseTTL of latency leaves that worker behind: the
// others step in a round without it within LeaseTTL + 1 s. The job then
// finishes with every invariant.
func TestLivenessSlowStoreLink(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.ProxyRedis = true
	cfg.RedisTimeout = 5 * time.Second // go-redis' own timeouts above the link's round trip
	// Enough epochs that the job outlasts the slow worker's return: a
	// worker left behind rejoins once the backlog queued at 1.5 x LeaseTTL
	// drains (about 1.5 s after the link heals), and the job must not
	// finish without it (ci of 2026-12-02: 25 epochs ended 1.4 s after the
	// cut, and the slow worker exited 'finished without this worker').
	periods := 3
	cfg.Epochs = 45
	if livenessFull() {
		periods, cfg.Epochs = 10, 100
	}
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 50))

	t0 := time.Now()
	time.Sleep(2 * time.Second) // measuring the undisturbed rate over a fixed window
	t1 := time.Now()
	base := float64(stepAt(h, t1)-stepAt(h, t0)) / t1.Sub(t0).Seconds()
	require.Positive(t, base, "no step in the undisturbed window")
	round := h.Status().MaxRound

	slow := h.Workers()[0]
	slow.RedisProxy.SetLatency(cfg.LeaseTTL * 7 / 10)
	time.Sleep(time.Duration(periods) * cfg.LeaseTTL) // the fault's duration
	t2 := time.Now()
	during := float64(stepAt(h, t2)-stepAt(h, t1)) / t2.Sub(t1).Seconds()
	st := h.Status()
	require.Zero(t, st.Finished, "the job finished before the measurement ended; raise Epochs")
	require.Equal(t, round, st.MaxRound, "round changes under 0.7 x LeaseTTL latency")
	require.GreaterOrEqual(t, during, base/2, "steps per second: %.1f undisturbed, %.1f with latency", base, during)
	t.Logf("%d lease periods with 0.7 x LeaseTTL latency: %.1f steps/s (undisturbed %.1f), no round change; load %s",
		periods, during, base, loadavg())

	slow.RedisProxy.SetLatency(0)
	time.Sleep(time.Second) // the backlog drains (heartbeats overlap; nothing to wait on)
	require.Equal(t, round, h.Status().MaxRound, "round change when the latency lifted")
	slow.RedisProxy.SetLatency(cfg.LeaseTTL * 3 / 2)
	cut := time.Now()
	st, err = h.WaitFor(ctx, func(faultinject.Status) bool {
		for _, m := range h.Steps() {
			if m.At.After(cut) && m.Size == 2 && m.Worker != slow.Index {
				return true
			}
		}
		return time.Since(cut) > 20*time.Second
	})
	require.NoError(t, err)
	var left time.Duration
	for _, m := range h.Steps() {
		if m.At.After(cut) && m.Size == 2 && m.Worker != slow.Index {
			left = m.At.Sub(cut)
			break
		}
	}
	require.NotZero(t, left, "the others never stepped without the slow worker")
	t.Logf("1.5 x LeaseTTL latency: the others step without the slow worker %v after it began (bound %v); load %s",
		left, cfg.LeaseTTL+time.Second, loadavg())
	require.Less(t, left, cfg.LeaseTTL+time.Second)
	slow.RedisProxy.SetLatency(0)
	waitBack(t, h, slow, 3)
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
}

// finishBounds bounds the exit of a job that ran its faults and trains on:
// the job's remaining steps take what they take at this machine's rate, so
// the exit bound is Bounds' default (2 min) plus twice the time they take
// at the rate of the run so far (faults and recoveries included, which
// only lengthens it). A fixed bound failed under load: a run of 45 epochs
// stopped at step 3510 of 4500 at 18 steps/s when its 2 min ran out.
func finishBounds(h *faultinject.Harness, cfg faultinject.Config) faultinject.Bounds {
	steps := h.Steps()
	b := faultinject.Bounds{Exit: 2 * time.Minute}
	if len(steps) < 2 {
		return b
	}
	first, last := steps[0], steps[len(steps)-1]
	for _, m := range steps {
		if m.Step > last.Step {
			last = m
		}
	}
	span := last.At.Sub(first.At)
	if last.Step <= first.Step || span <= 0 {
		return b
	}
	remaining := cfg.TotalSteps() - last.Step
	b.Exit += 2 * time.Duration(float64(remaining)*float64(span)/float64(last.Step-first.Step))
	return b
}

// TestLivenessShortPause (Must show 4, last point): with the default lease
// (3 s) a 700 ms SIGSTOP/SIGCONT pause of one worker changes nothing: no
// round change, and the job finishes with every invariant.
func TestLivenessShortPause(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.LeaseTTL, cfg.HeartbeatInterval = 3*time.Second, 500*time.Millisecond
	cfg.Epochs = 6
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 50))
	round := h.Status().MaxRound
	w := h.Workers()[1]
	require.NoError(t, h.Signal(w, syscall.SIGSTOP))
	time.Sleep(700 * time.Millisecond) // the pause itself
	require.NoError(t, h.Signal(w, syscall.SIGCONT))
	resumed := time.Now()
	at := stepAt(h, resumed)
	_, err = h.WaitFor(ctx, func(s faultinject.Status) bool { return s.MaxStep >= at+100 || s.Finished > 0 })
	require.NoError(t, err)
	require.Equal(t, round, h.Status().MaxRound, "a 700 ms pause changed the round")
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
	t.Logf("700 ms pause: round %d throughout; load %s", round, loadavg())
}

// TestLivenessStoreBlackholedForGood (Must show 5, processes): one worker's
// Redis link is blackholed for good. With the workers' plain
// redis.NewClient, that worker stops within OutageBudget + 2 s of the cut
// with one error that says "store unavailable"; the others finish.
func TestLivenessStoreBlackholedForGood(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.ProxyRedis = true
	cfg.OutageBudget = 3 * time.Second
	cfg.RedisTimeout = 3 * time.Second // go-redis' default ReadTimeout: the Agent's own deadlines must hold
	cfg.Epochs = 12
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 50))
	cutOff := h.Workers()[2]
	cutOff.RedisProxy.SetBlackhole(true)
	cut := time.Now()
	_, err = h.WaitFor(ctx, func(faultinject.Status) bool {
		return h.Result(cutOff).Exited || time.Since(cut) > cfg.OutageBudget+10*time.Second
	})
	require.NoError(t, err)
	took := time.Since(cut)
	r := h.Result(cutOff)
	require.True(t, r.Exited, "still running %v after the cut", took)
	t.Logf("blackholed worker exited %v after the cut (bound %v) with %q; load %s", took, cfg.OutageBudget+2*time.Second, r.Err, loadavg())
	require.Less(t, took, cfg.OutageBudget+2*time.Second)
	require.Contains(t, r.Err, "store unavailable")
	require.Equal(t, faultinject.ExitError, r.ExitCode)
	cutOff.RedisProxy.SetBlackhole(false)
	res := h.Finish(ctx, finishBounds(h, cfg))
	for _, v := range res.Violations {
		if !strings.Contains(v, "store unavailable") {
			t.Errorf("violation: %s", v)
		}
	}
}

// TestLivenessHungStepFunction (Must show 2, and 4 with the default
// progress timeout under ELASTICTRAIN_LIVENESS_FULL=1): one worker's step
// function blocks for good, ignoring its context, while its process and
// heartbeats live on. Within ProgressTimeout + 1 s the others step in a
// round without it, and each names it (its address) in a WARN; when it
// wakes it is fenced, rejoins as a new member, and the job finishes with
// every invariant (audit exact, identical parameters).
func TestLivenessHungStepFunction(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.Hangs = true
	cfg.ProgressTimeout = 2 * time.Second
	bound := cfg.ProgressTimeout + time.Second
	cfg.OpTimeout = 10 * time.Second // above the progress timeout: the hang, not the collective's timeout, ends the round
	cfg.Epochs = 12
	if livenessFull() {
		cfg.ProgressTimeout = 0 // the default, 15 s: the survivors must train within 20 s
		cfg.OpTimeout = 20 * time.Second
		bound = 20 * time.Second
		cfg.Epochs = 80
	}
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 50))
	hung := h.Workers()[1]
	require.NoError(t, h.Hang(hung, true))
	at := time.Now()
	var took time.Duration
	_, err = h.WaitFor(ctx, func(faultinject.Status) bool {
		for _, m := range h.Steps() {
			if m.At.After(at) && m.Size == 2 && m.Worker != hung.Index {
				took = m.At.Sub(at)
				return true
			}
		}
		return time.Since(at) > bound+10*time.Second
	})
	require.NoError(t, err)
	require.NotZero(t, took, "the others never stepped without the hung worker")
	t.Logf("the others step without the hung worker %v after its step function blocked (bound %v); load %s", took, bound, loadavg())
	require.Less(t, took, bound)
	require.Zero(t, h.Status().Finished, "the job finished before the measurement ended; raise Epochs")
	for _, w := range h.Workers() {
		if w == hung {
			continue
		}
		log, err := os.ReadFile(w.LogPath)
		require.NoError(t, err)
		require.Contains(t, string(log), `"gone_addr":"`+hung.Addr+`"`, "worker %d names the hung worker", w.Index)
	}
	require.NoError(t, h.Hang(hung, false))
	waitBack(t, h, hung, 3)
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
	log, err := os.ReadFile(hung.LogPath)
	require.NoError(t, err)
	require.Contains(t, string(log), "no progress", "the hung worker was fenced for it when it woke")
}

// TestLivenessLongMarkedPhases (Must show 3): with OpTimeout 5 s and the
// progress timeout at 5 s too, three phases of 12 s on one rank each: a
// fetch inside the dataset's Get before worker 1's first step, a phase of
// worker 2's own marked with trainer.Busy in its step function, and the
// final checkpoint's CheckpointStore.Save on rank 0 (which the others wait
// for). The SDK marks the fetch and the write; only the user's phase
// needs the call. No round changes in any of them (every step of the job
// is in the first round), nobody is counted as hung, no collective times
// out, and the job finishes with every invariant.
func TestLivenessLongMarkedPhases(t *testing.T) {
	const phase = 12 * time.Second
	cfg := testConfig(t, testredis.Addr(t))
	cfg.MinWorkers = 3 // every worker in the first round
	cfg.OpTimeout = 5 * time.Second
	cfg.ProgressTimeout = 5 * time.Second
	cfg.CheckpointEvery = 0 // the final checkpoint is the first Save
	cfg.Epochs = 4
	cfg.Phases = []faultinject.Phase{
		{Worker: 1, Kind: faultinject.PhaseGet, For: phase},
		{Worker: 2, Kind: faultinject.PhaseBusy, For: phase, AtStep: 100},
	}
	for w := range 3 { // rank 0 writes, whichever worker it is
		cfg.Phases = append(cfg.Phases, faultinject.Phase{Worker: w, Kind: faultinject.PhaseSave, For: phase})
	}
	ctx := context.Background()
	start := time.Now()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	res := h.Finish(ctx, faultinject.Bounds{Start: 2 * phase})
	wall := time.Since(start)
	require.Empty(t, res.Violations)
	require.Equal(t, 3, res.Finished)
	steps := h.Steps()
	require.NotEmpty(t, steps)
	round := steps[0].Round
	for _, m := range steps {
		require.Equal(t, round, m.Round, "a round change: worker %d stepped in round %d at step %d", m.Worker, m.Round, m.Step)
		require.Equal(t, 3, m.Size)
	}
	var saw [3]bool
	for _, w := range h.Workers() {
		log, err := os.ReadFile(w.LogPath)
		require.NoError(t, err)
		s := string(log)
		require.NotContains(t, s, "no progress", "worker %d was counted as hung", w.Index)
		require.NotContains(t, s, "round failed", "worker %d saw its round fail", w.Index)
		saw[0] = saw[0] || strings.Contains(s, "slow dataset fetch")
		saw[1] = saw[1] || strings.Contains(s, "marked busy (faultinject)")
		saw[2] = saw[2] || strings.Contains(s, "slow checkpoint save")
	}
	require.Equal(t, [3]bool{true, true, true}, saw, "every phase ran (fetch, user's, save)")
	require.GreaterOrEqual(t, wall, 3*phase, "the three phases held the job up")
	t.Logf("three 12 s phases with OpTimeout %v and ProgressTimeout %v: one round (%d), the job finished in %v; load %s",
		cfg.OpTimeout, cfg.ProgressTimeout, round, wall.Round(time.Millisecond), loadavg())
}

// logTimeOf returns the time of the first JSON log line of path that
// contains every one of subs (zero when none does).
func logTimeOf(t *testing.T, path string, subs ...string) time.Time {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if !ok {
			continue
		}
		var rec struct {
			Time time.Time `json:"time"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line %q", line)
		return rec.Time
	}
	return time.Time{}
}

// TestLivenessHungRankNamedWithinOpTimeout (Must show 4): with the default
// progress timeout (15 s) and an OpTimeout below it (5 s), one worker's
// step function blocks for good. Its peers' collective stalls at once;
// within OpTimeout + 1 s each of them names the hung worker (its address)
// in a WARN, and within 20 s of the hang they train in a round without it.
func TestLivenessHungRankNamedWithinOpTimeout(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.Hangs = true
	cfg.ProgressTimeout = 0 // the default, 15 s
	cfg.OpTimeout = 5 * time.Second
	cfg.Epochs = 80
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 50))
	hung := h.Workers()[1]
	require.NoError(t, h.Hang(hung, true))
	at := time.Now()
	var took time.Duration
	_, err = h.WaitFor(ctx, func(faultinject.Status) bool {
		for _, m := range h.Steps() {
			if m.At.After(at) && m.Size == 2 && m.Worker != hung.Index {
				took = m.At.Sub(at)
				return true
			}
		}
		return time.Since(at) > 40*time.Second
	})
	require.NoError(t, err)
	require.NotZero(t, took, "the others never stepped without the hung worker")
	require.Zero(t, h.Status().Finished, "the job finished before the measurement ended; raise Epochs")
	for _, w := range h.Workers() {
		if w == hung {
			continue
		}
		named := logTimeOf(t, w.LogPath, "silent rank", `"silent_addr":"`+hung.Addr+`"`)
		require.False(t, named.IsZero(), "worker %d never named the hung worker as silent (the others stepped without it %v after the hang)", w.Index, took)
		t.Logf("worker %d named the hung worker %v after the hang (bound OpTimeout + 1 s = %v)", w.Index, named.Sub(at).Round(time.Millisecond), cfg.OpTimeout+time.Second)
		require.Less(t, named.Sub(at), cfg.OpTimeout+time.Second, "worker %d", w.Index)
	}
	t.Logf("the others train without the hung worker %v after the hang (bound 20 s); load %s", took.Round(time.Millisecond), loadavg())
	require.Less(t, took, 20*time.Second)
	require.NoError(t, h.Hang(hung, false))
	waitBack(t, h, hung, 3)
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
}

// TestLivenessStuckFetchIsLeftBehind (issue 29, Must show 5): one worker's
// dataset Get stops answering (it ignores its context) mid-job, inside the
// data fetch the SDK marks busy. The marked phase has a bound of its own
// (elastic.Config.PhaseTimeout, 2 s here; the progress timeout stays at
// its default, 15 s, and the peers, told the rank is busy, would wait up
// to sync's BusyTimeout, 30 min): within PhaseTimeout + 1 s of the fetch's
// start the others name the worker (its address) in a WARN and step in a
// round of two. The bound's slack is the mechanism's: the check runs at
// every heartbeat (150 ms), then one leave and a re-form of two. When the
// fetch returns, the worker is fenced, rejoins as a new member, and the
// job finishes with every invariant.
func TestLivenessStuckFetchIsLeftBehind(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.MinWorkers = 2
	cfg.PhaseTimeout = 2 * time.Second
	bound := cfg.PhaseTimeout + time.Second
	cfg.Epochs = 15
	cfg.Phases = []faultinject.Phase{{Worker: 1, Kind: faultinject.PhaseStuckGet, AtStep: 40, For: bound + 3*time.Second}}
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	victim := h.Workers()[1]

	// The fetch's start, from the victim's own log (a poll with a
	// deadline: the job's reports stop while the fetch holds it up).
	giveUp := time.Now().Add(2 * time.Minute)
	poll := time.NewTicker(50 * time.Millisecond) // the log file has no event to wait on
	defer poll.Stop()
	stuckAt := logTimeOf(t, victim.LogPath, "dataset fetch stuck")
	for ; stuckAt.IsZero(); stuckAt = logTimeOf(t, victim.LogPath, "dataset fetch stuck") {
		require.True(t, time.Now().Before(giveUp), "worker 1's fetch never got stuck")
		require.Zero(t, h.Status().Finished, "the job finished first; raise Epochs")
		<-poll.C
	}
	wctx, cancel := context.WithTimeout(ctx, bound+20*time.Second)
	defer cancel()
	var took time.Duration
	_, err = h.WaitFor(wctx, func(faultinject.Status) bool {
		for _, m := range h.Steps() {
			if m.At.After(stuckAt) && m.Size == 2 && m.Worker != victim.Index {
				took = m.At.Sub(stuckAt)
				return true
			}
		}
		return false
	})
	require.NoError(t, err, "the others never stepped without the worker whose fetch is stuck")
	t.Logf("the others step in a round of two %v after worker 1's fetch got stuck (bound %v); load %s", took, bound, loadavg())
	require.Less(t, took, bound)
	for _, w := range h.Workers() {
		if w == victim {
			continue
		}
		named := logTimeOf(t, w.LogPath, `"level":"WARN"`, `"gone_addr":"`+victim.Addr+`"`)
		require.False(t, named.IsZero(), "worker %d names the stuck worker in a WARN", w.Index)
		require.Less(t, named.Sub(stuckAt), bound, "worker %d named it %v after the fetch got stuck", w.Index, named.Sub(stuckAt))
	}
	own := logTimeOf(t, victim.LogPath, `"level":"WARN"`, "outlasted the phase timeout", `"phase":"data fetch"`)
	require.False(t, own.IsZero(), "the stuck worker names its phase in a WARN")
	waitBack(t, h, victim, 3)
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
	log, err := os.ReadFile(victim.LogPath)
	require.NoError(t, err)
	require.Contains(t, string(log), "fenced; rejoining as a new member", "the stuck worker was fenced when its fetch returned")
}

// TestWorkerLeftBehindAtTheEnd (#29 item 10): a worker paused until the
// others have finished the job without it exits with
// launch.StatusJobFinished and an error that says its parameters are not the
// final model (the SDK's verdict), and the harness agrees: it is no
// violation, and every invariant of the job holds.
func TestWorkerLeftBehindAtTheEnd(t *testing.T) {
	cfg := testConfig(t, testredis.Addr(t))
	cfg.Epochs = 3
	ctx := context.Background()
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	logWorkersOnFailure(t, h)
	require.NoError(t, h.WaitStep(ctx, 10))
	paused := h.Workers()[0]
	require.NoError(t, h.Signal(paused, syscall.SIGSTOP))
	// The others evict it when its lease lapses and finish without it.
	_, err = h.WaitFor(ctx, func(s faultinject.Status) bool { return s.Finished == 2 })
	require.NoError(t, err)
	require.NoError(t, h.Signal(paused, syscall.SIGCONT))
	res := h.Finish(ctx, finishBounds(h, cfg))
	require.Empty(t, res.Violations)
	require.Equal(t, 2, res.Finished)
	r := h.Result(paused)
	require.Equal(t, faultinject.ExitJobFinished, r.ExitCode, "error: %s", r.Err)
	require.Contains(t, r.Err, "finished without this worker")
}
