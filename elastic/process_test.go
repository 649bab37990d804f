package elastic_test

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// awaitChildren waits until every child's latest World is one common round
// of exactly len(cs) members, and returns it.
func awaitChildren(t *testing.T, timeout time.Duration, cs ...*child) childEvent {
	t.Helper()
	deadline := time.Now().Add(timeout)
	latest := make([]childEvent, len(cs))
	for {
		ok := true
		for i := range latest {
			if latest[i].Size != len(cs) || latest[i].Round != latest[0].Round {
				ok = false
			}
		}
		if ok {
			ranks := make([]int, len(cs))
			for i, e := range latest {
				if !slices.Equal(e.Members, latest[0].Members) || e.Members[e.Rank] != e.ID {
					t.Fatalf("children disagree: %+v", latest)
				}
				ranks[i] = e.Rank
			}
			slices.Sort(ranks)
			for i, r := range ranks {
				if r != i {
					t.Fatalf("ranks %v are not 0..%d", ranks, len(cs)-1)
				}
			}
			return latest[0]
		}
		progressed := false
		for i, c := range cs {
			select {
			case e, open := <-c.events:
				if !open || e.Event == "error" {
					t.Fatalf("child %d: exited or failed: %+v", i, e)
				}
				latest[i], progressed = e, true
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no common round of %d within %v: %+v", len(cs), timeout, latest)
		}
		if !progressed {
			time.Sleep(2 * time.Millisecond) // polling with a deadline
		}
	}
}

// TestMultiProcessKill: 4 OS processes join through real Redis; one is
// SIGKILLed; the other 3 hold a World of size 3 within LeaseTTL + 1 s.
func TestMultiProcessKill(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 4, time.Hour // forms at exactly 4
	cfg.LeaseTTL = 2 * time.Second
	cfg.HeartbeatInterval = 200 * time.Millisecond
	spec := childSpec{mode: "member", addr: testredis.Addr(t), cfg: cfg}
	cs := []*child{startChild(t, spec), startChild(t, spec), startChild(t, spec), startChild(t, spec)}
	first := awaitChildren(t, 30*time.Second, cs...)

	victim := cs[1]
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	survivors := []*child{cs[0], cs[2], cs[3]}
	next := awaitChildren(t, cfg.LeaseTTL+time.Second, survivors...)
	el := time.Since(killed)
	if next.Round <= first.Round {
		t.Fatalf("round did not grow: %d -> %d", first.Round, next.Round)
	}
	t.Logf("survivors hold round %d of 3, %v after SIGKILL (LeaseTTL %v)", next.Round, el, cfg.LeaseTTL)
}

// TestPausedProcessIsFenced: a process stopped with SIGSTOP loses its lease
// and is evicted; after SIGCONT it cannot act under its old rank: its report
// and its Join answer ErrFenced, and the new round is untouched.
func TestPausedProcessIsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
	cfg.LeaseTTL = time.Second
	cfg.HeartbeatInterval = 100 * time.Millisecond
	p := startChild(t, childSpec{mode: "paused", addr: testredis.Addr(t), cfg: cfg})
	s := store.NewRedis(testredis.Client(t))
	A, B := newAgent(t, s, cfg), newAgent(t, s, cfg)
	wA, wB := startWorker(t, A), startWorker(t, B)
	for _, w := range []*worker{wA, wB} {
		if got := w.next(t, 30*time.Second); got.Size != 3 {
			t.Fatalf("first world %+v", got)
		}
	}
	pw := p.next(t, 30*time.Second)
	if pw.Event != "world" || pw.Size != 3 {
		t.Fatalf("paused child's first event %+v", pw)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ws := awaitRound(t, cfg.LeaseTTL+5*time.Second, wA, wB)
	if slices.Contains(ws[0].MemberIDs(), pw.ID) {
		t.Fatal("paused member still in the new round")
	}
	if ws[0].Round <= pw.Round {
		t.Fatalf("round did not grow: %d -> %d", pw.Round, ws[0].Round)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rep := p.next(t, 10*time.Second)
	if rep.Event != "fenced-report" || !rep.Fenced {
		t.Fatalf("report under the old rank was not fenced: %+v", rep)
	}
	join := p.next(t, 10*time.Second)
	if join.Event != "fenced-join" || !join.Fenced {
		t.Fatalf("Join after the pause was not fenced: %+v", join)
	}
	// The zombie's report of round pw.Round changed nothing: A and B keep
	// their round (no change pending) and a re-join gives the same two.
	if A.ChangePending() || B.ChangePending() {
		t.Fatal("the zombie disturbed the new round")
	}
	wA.stop()
	wB.stop()
	again := joinAll(t, ctx, []*elastic.Agent{A, B})
	checkRound(t, again, []*elastic.Agent{A, B})
	if again[0].Round != ws[0].Round+1 {
		t.Fatalf("round %d, want %d", again[0].Round, ws[0].Round+1)
	}
}
