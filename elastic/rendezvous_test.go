package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

func ids(ws ...*elastic.Agent) []string {
	out := make([]string, len(ws))
	for i, a := range ws {
		out[i] = a.Member().ID
	}
	return out
}

func TestFormation(t *testing.T) {
	cases := []struct {
		name     string
		min, max int
		lastCall time.Duration
		run      func(t *testing.T, s *spyStore, mk func() *elastic.Agent)
	}{
		{"closes at MaxWorkers without waiting for LastCall", 1, 3, time.Hour, func(t *testing.T, s *spyStore, mk func() *elastic.Agent) {
			as := []*elastic.Agent{mk(), mk(), mk()}
			ws := joinAll(t, context.Background(), as)
			checkRound(t, ws, as)
		}},
		{"LastCall gathers arrivals a moment apart", 2, 8, time.Second, func(t *testing.T, s *spyStore, mk func() *elastic.Agent) {
			as := []*elastic.Agent{mk(), mk(), mk(), mk()}
			w0, w1 := startWorker(t, as[0]), startWorker(t, as[1])
			s.waitArrived(t, ids(as[0], as[1])...) // MinWorkers reached: last call runs
			w2, w3 := startWorker(t, as[2]), startWorker(t, as[3])
			ws := awaitRound(t, 20*time.Second, w0, w1, w2, w3)
			checkRound(t, ws, as)
		}},
		{"below MinWorkers no round closes", 3, 8, 0, func(t *testing.T, s *spyStore, mk func() *elastic.Agent) {
			as := []*elastic.Agent{mk(), mk(), mk()}
			w0, w1 := startWorker(t, as[0]), startWorker(t, as[1])
			s.waitArrived(t, ids(as[0], as[1])...)
			select {
			case w := <-w0.worlds:
				t.Fatalf("a round closed below MinWorkers: %+v", w)
			case w := <-w1.worlds:
				t.Fatalf("a round closed below MinWorkers: %+v", w)
			default:
			}
			w2 := startWorker(t, as[2])
			ws := awaitRound(t, 20*time.Second, w0, w1, w2)
			checkRound(t, ws, as)
		}},
		{"arrivals beyond MaxWorkers wait as pending", 1, 2, time.Hour, func(t *testing.T, s *spyStore, mk func() *elastic.Agent) {
			as := []*elastic.Agent{mk(), mk(), mk()}
			w0 := startWorker(t, as[0])
			s.waitArrived(t, as[0].Member().ID)
			w1 := startWorker(t, as[1])
			ws := awaitRound(t, 20*time.Second, w0, w1)
			checkRound(t, ws, as[:2])
			w2 := startWorker(t, as[2])
			s.waitArrived(t, as[2].Member().ID)
			// The round is full: the pending joiner cannot be admitted, so the
			// running members must not be told to re-form.
			if as[0].ChangePending() || as[1].ChangePending() {
				t.Fatal("ChangePending with a full round and a pending joiner")
			}
			// When a member leaves, the pending joiner takes its place; the
			// survivor keeps rank 0 as the oldest.
			w1.stop()
			if err := as[1].Leave(context.Background()); err != nil {
				t.Fatal(err)
			}
			ws = awaitRound(t, 20*time.Second, w0, w2)
			checkRound(t, ws, []*elastic.Agent{as[0], as[2]})
			if ws[0].Rank != 0 || ws[1].Rank != 1 {
				t.Fatalf("ranks: survivor %d, newcomer %d", ws[0].Rank, ws[1].Rank)
			}
		}},
	}
	for _, k := range allKinds() {
		for _, tc := range cases {
			t.Run(k.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				s := newSpy(k.make(t))
				cfg := testConfig(t)
				cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = tc.min, tc.max, tc.lastCall
				tc.run(t, s, func() *elastic.Agent { return newAgent(t, s, cfg) })
			})
		}
	}
}

func TestSimultaneousJoinersNeverSplit(t *testing.T) {
	cases := []struct {
		name          string
		min, max, rep int
		lastCall      time.Duration
	}{
		// Closes at the 12th arrival: no two rounds may form on the way.
		{"closing at MaxWorkers", 1, 12, 5, time.Hour},
		// The first arrival starts the last call; all must land in it.
		{"closing after LastCall", 1, 64, 1, time.Second},
	}
	for _, k := range allKinds() {
		for _, tc := range cases {
			t.Run(k.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				s := k.make(t)
				for rep := range tc.rep {
					cfg := testConfig(t)
					cfg.JobID += fmt.Sprint(rep)
					cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = tc.min, tc.max, tc.lastCall
					// Nothing here may depend on lease expiry: 36 agents of
					// parallel subtests on a loaded 2-core machine must not
					// miss a 1.5 s lease and be fenced.
					cfg.LeaseTTL = 10 * time.Second
					as := make([]*elastic.Agent, 12)
					for i := range as {
						as[i] = newAgent(t, s, cfg)
					}
					ws := joinAll(t, context.Background(), as) // all released at once
					checkRound(t, ws, as)
				}
			})
		}
	}
}

// TestRanksAcrossRounds walks a job through arrivals, a leave, a re-join
// without change and a failure report, checking the rank rules each round.
func TestRanksAcrossRounds(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newSpy(k.make(t))
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.LastCall = 3, 0
			cfg.LeaseTTL = 10 * time.Second // nothing here may depend on lease expiry
			A, B, C, D := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
			wA := startWorker(t, A)
			s.waitArrived(t, A.Member().ID)
			wB := startWorker(t, B)
			s.waitArrived(t, B.Member().ID)
			wC := startWorker(t, C)
			ws := awaitRound(t, 20*time.Second, wA, wB, wC)
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			wantOrder := func(ws []elastic.World, order ...*elastic.Agent) {
				t.Helper()
				if got, want := ws[0].MemberIDs(), ids(order...); !slices.Equal(got, want) {
					t.Fatalf("round %d rank order %v, want %v", ws[0].Round, got, want)
				}
			}
			wantOrder(ws, A, B, C) // arrival order
			r1 := ws[0].Round

			// A late joiner: the running members learn of it and take it in
			// at their next Join; it takes the next rank.
			wD := startWorker(t, D)
			ws = awaitRound(t, 20*time.Second, wA, wB, wC, wD)
			wantOrder(ws, A, B, C, D)
			r2 := ws[0].Round
			if r2 <= r1 {
				t.Fatalf("round did not grow: %d -> %d", r1, r2)
			}

			// Rank 0 leaves: survivors keep their order, rank 0 goes to the
			// oldest survivor.
			wA.stop()
			if err := A.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			ws = awaitRound(t, 20*time.Second, wB, wC, wD)
			wantOrder(ws, B, C, D)
			r3 := ws[0].Round

			// The same membership re-joining gives the same ranks.
			wB.stop()
			wC.stop()
			wD.stop()
			ws = joinAll(t, ctx, []*elastic.Agent{B, C, D})
			checkRound(t, ws, []*elastic.Agent{B, C, D})
			wantOrder(ws, B, C, D)
			if ws[0].Round != r3+1 {
				t.Fatalf("re-join gave round %d, want %d", ws[0].Round, r3+1)
			}

			// E arrives and is taken in at the next Join; then C is reported
			// failed: B keeps rank 0, D and E move up.
			E := newAgent(t, s, cfg)
			wE := startWorker(t, E)
			s.waitArrived(t, E.Member().ID)
			ws = joinAll(t, ctx, []*elastic.Agent{B, C, D})
			wB, wC, wD = startWorker(t, B), startWorker(t, C), startWorker(t, D)
			ws = awaitRound(t, 20*time.Second, wB, wC, wD, wE)
			wantOrder(ws, B, C, D, E)
			wC.stop()
			if err := B.ReportFailure(ctx, ws[0].Round, C.Member().ID); err != nil {
				t.Fatal(err)
			}
			ws = awaitRound(t, 20*time.Second, wB, wD, wE)
			wantOrder(ws, B, D, E)
		})
	}
}

func TestLateJoinerNotifiesRunningMembers(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newSpy(k.make(t))
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.LastCall = 2, 0
			cfg.HeartbeatInterval = time.Second // the hint must come from Pub/Sub, not the heartbeat poll
			cfg.LeaseTTL = 10 * time.Second
			A, B, C := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B})
			checkRound(t, ws, []*elastic.Agent{A, B})
			// Drain hints left from forming.
			for _, a := range []*elastic.Agent{A, B} {
				select {
				case <-a.Changes():
				default:
				}
			}
			wC := startWorker(t, C)
			for _, a := range []*elastic.Agent{A, B} {
				select {
				case <-a.Changes():
				case <-time.After(10 * time.Second):
					t.Fatal("no change hint after a late joiner arrived")
				}
				if !a.ChangePending() {
					t.Fatal("hint without ChangePending")
				}
			}
			wA, wB := startWorker(t, A), startWorker(t, B)
			ws = awaitRound(t, 20*time.Second, wA, wB, wC)
			if ws[2].Rank != 2 {
				t.Fatalf("late joiner rank %d, want 2", ws[2].Rank)
			}
		})
	}
}

func TestLeaseExpiryOpensOneNewRound(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour // forms at exactly 3
			A, B, C := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			// C dies silently: its heartbeats stop, nobody reports it.
			requireOneExpiry(t, ctx, cfg, ws[0].Round, C, A, B)
		})
	}
}

func TestFailureReportEvictsAtOnce(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			cfg.LeaseTTL = 20 * time.Second // a World within this cannot come from lease expiry
			cfg.HeartbeatInterval = time.Second
			A, B, C := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			r := ws[0].Round
			_ = C.Close() // C crashes
			start := time.Now()
			if err := A.ReportFailure(ctx, r, C.Member().ID); err != nil {
				t.Fatal(err)
			}
			if !A.ChangePending() {
				t.Fatal("reporter does not see the change")
			}
			wA, wB := startWorker(t, A), startWorker(t, B)
			ws = awaitRound(t, 10*time.Second, wA, wB)
			if el := time.Since(start); el >= cfg.LeaseTTL {
				t.Fatalf("next World after %v: not faster than the lease", el)
			}
			if ws[0].Round != r+1 {
				t.Fatalf("round %d, want %d", ws[0].Round, r+1)
			}
			// B's report of the same failure arrives late: ignored.
			if err := B.ReportFailure(ctx, r, C.Member().ID); err != nil {
				t.Fatal(err)
			}
			// A stale report (round r) against a live member of round r+1: ignored.
			if err := B.ReportFailure(ctx, r, A.Member().ID); err != nil {
				t.Fatal(err)
			}
			if err := A.ReportFailure(ctx, 0, B.Member().ID); err != nil {
				t.Fatal(err)
			}
			// Nobody was evicted: a re-join gives the same two members.
			wA.stop()
			wB.stop()
			ws = joinAll(t, ctx, []*elastic.Agent{A, B})
			checkRound(t, ws, []*elastic.Agent{A, B})
			if ws[0].Round != r+2 {
				t.Fatalf("stale reports changed the job: round %d, want %d", ws[0].Round, r+2)
			}
		})
	}
}

// TestFencedMemberCannotAct: a member evicted while alive (a false report
// here; a lapsed lease in TestPausedProcessIsFenced) gets ErrFenced from
// everything and cannot disturb the round that replaced it.
func TestFencedMemberCannotAct(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 2, time.Hour
			cfg.LeaseTTL = 20 * time.Second
			A, B := newAgent(t, s, cfg), newAgent(t, s, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B})
			r := ws[0].Round
			if err := A.ReportFailure(ctx, r, B.Member().ID); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "B fenced", func() bool { return errors.Is(B.Err(), elastic.ErrFenced) })
			if !B.ChangePending() {
				t.Fatal("fenced member has no change pending")
			}
			if _, err := B.Join(ctx); !errors.Is(err, elastic.ErrFenced) {
				t.Fatalf("Join by fenced member: %v", err)
			}
			if err := B.ReportFailure(ctx, r, A.Member().ID); !errors.Is(err, elastic.ErrFenced) {
				t.Fatalf("ReportFailure by fenced member: %v", err)
			}
			if err := B.Finish(ctx); !errors.Is(err, elastic.ErrFenced) {
				t.Fatalf("Finish by fenced member: %v", err)
			}
			// A is alone and unharmed.
			wA := startWorker(t, A)
			ws = awaitRound(t, 10*time.Second, wA)
			if ws[0].Size != 1 || ws[0].Round != r+1 {
				t.Fatalf("A's world %+v", ws[0])
			}
			// B comes back as a new member and is admitted.
			B2 := newAgent(t, s, cfg)
			wB2 := startWorker(t, B2)
			ws = awaitRound(t, 10*time.Second, wA, wB2)
			if ws[1].Rank != 1 {
				t.Fatalf("new member rank %d", ws[1].Rank)
			}
		})
	}
}

func TestGracefulLeave(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, 3, time.Hour
			cfg.LeaseTTL = 20 * time.Second // a World within this cannot come from lease expiry
			A, B, C := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
			ws := joinAll(t, ctx, []*elastic.Agent{A, B, C})
			checkRound(t, ws, []*elastic.Agent{A, B, C})
			r := ws[0].Round
			start := time.Now()
			if err := C.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := C.Join(ctx); !errors.Is(err, elastic.ErrClosed) {
				t.Fatalf("Join after Leave: %v", err)
			}
			waitFor(t, 10*time.Second, "survivors see the leave", func() bool { return A.ChangePending() && B.ChangePending() })
			ws = joinAll(t, ctx, []*elastic.Agent{A, B})
			checkRound(t, ws, []*elastic.Agent{A, B})
			if el := time.Since(start); el >= cfg.LeaseTTL {
				t.Fatalf("re-formed after %v: not faster than the lease", el)
			}
			if ws[0].Round != r+1 {
				t.Fatalf("after leave: round %d, want %d", ws[0].Round, r+1)
			}
		})
	}
}

func TestFinish(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := k.make(t)
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.LastCall = 2, 0
			A, B := newAgent(t, s, cfg), newAgent(t, s, cfg)
			joinAll(t, ctx, []*elastic.Agent{A, B})
			if err := A.Finish(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "B sees the job finished", B.ChangePending)
			if _, err := B.Join(ctx); !errors.Is(err, elastic.ErrJobFinished) {
				t.Fatalf("Join after Finish: %v", err)
			}
			if _, err := A.Join(ctx); !errors.Is(err, elastic.ErrJobFinished) {
				t.Fatalf("Join by the finisher: %v", err)
			}
			late := newAgent(t, s, cfg)
			if _, err := late.Join(ctx); !errors.Is(err, elastic.ErrJobFinished) {
				t.Fatalf("Join by a new member of a finished job: %v", err)
			}
		})
	}
}

// requireOneExpiry closes dead (its heartbeats stop, nobody reports or
// leaves) and requires that the survivors see the change only once its
// lease could have lapsed, then form exactly round r+1 together.
func requireOneExpiry(t *testing.T, ctx context.Context, cfg elastic.Config, r uint64, dead *elastic.Agent, survivors ...*elastic.Agent) {
	t.Helper()
	_ = dead.Close()
	died := time.Now()
	waitFor(t, cfg.LeaseTTL+5*time.Second, "ChangePending after the dead member's lease lapsed", func() bool {
		for _, a := range survivors {
			if !a.ChangePending() {
				return false
			}
		}
		return true
	})
	if el := time.Since(died); el < cfg.LeaseTTL/2 {
		t.Fatalf("change seen %v after the death, before the lease could lapse", el)
	}
	ws := joinAll(t, ctx, survivors)
	checkRound(t, ws, survivors)
	if ws[0].Round != r+1 {
		t.Fatalf("round after one expiry = %d, want exactly %d", ws[0].Round, r+1)
	}
}
