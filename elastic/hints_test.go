package elastic_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// nextHint waits for a hint that satisfies ok.
func nextHint(t *testing.T, w store.Watcher, what string, ok func(store.Hint) bool) store.Hint {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case h := <-w.C():
			if ok(h) {
				return h
			}
		case <-timeout:
			t.Fatalf("no %s hint", what)
		}
	}
}

// formRound registers n members (records padded to pad bytes of Host) and
// closes a round of all of them; it returns the incarnation and round.
func formRound(t *testing.T, s store.Store, job string, n, pad int) (string, uint64) {
	t.Helper()
	ctx := context.Background()
	p := store.Params{MinWorkers: 1, MaxWorkers: n, LastCall: time.Hour, LeaseTTL: time.Minute, StateTTL: time.Hour}
	var v store.View
	for i := range n {
		var err error
		v, err = s.Join(ctx, store.JoinRequest{JobID: job, NewIncarnation: "inc-" + job, Arrive: true, Params: p,
			Member: elastic.Member{ID: fmt.Sprintf("m%04d", i), Host: strings.Repeat("h", pad), Addr: "127.0.0.1:1"}})
		if err != nil || v.Code != store.CodeOK {
			t.Fatalf("join %d: %+v %v", i, v, err)
		}
	}
	if v.Open || v.Size != n {
		t.Fatalf("round of %d did not close: %+v", n, v)
	}
	return v.Incarnation, v.Round
}

// A closed round's hint carries its roster, also when the roster is larger
// than a Pub/Sub message carries (the Redis store's watcher then reads it
// once per process), and a round opened after a closed one is announced as
// open with its number: members learn that their round is over without a
// store call of their own.
func TestHintsCarryTheRosterAndTheNextRound(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				name   string
				n, pad int
			}{{"small", 3, 0}, {"larger than a message", 400, 200}} {
				s := k.make(t)
				job := testredis.JobID(t) + "-" + strings.ReplaceAll(tc.name, " ", "-")
				ctx := context.Background()
				w, err := s.Watch(ctx, job)
				if err != nil {
					t.Fatal(err)
				}
				inc, round := formRound(t, s, job, tc.n, tc.pad)
				h := nextHint(t, w, "close", func(h store.Hint) bool { return h.Round == round && !h.Open })
				if h.Incarnation != inc || len(h.Members) != tc.n || h.Members[tc.n-1].ID != fmt.Sprintf("m%04d", tc.n-1) {
					t.Fatalf("%s: close hint of round %d: inc %q, %d members", tc.name, round, h.Incarnation, len(h.Members))
				}
				p := store.Params{MinWorkers: 1, MaxWorkers: tc.n, LastCall: time.Hour, LeaseTTL: time.Minute, StateTTL: time.Hour}
				// A member lost: the survivors re-form the next round in the
				// report's own call, and its close hint carries them.
				v, err := s.Report(ctx, store.ReportRequest{MemberRequest: store.MemberRequest{JobID: job, MemberID: "m0000", Incarnation: inc, Params: p},
					Round: round, Target: "m0001"})
				if err != nil || v.Code != store.CodeOK || v.Open || v.Round <= round || v.Size != tc.n-1 {
					t.Fatalf("report: %+v %v", v, err)
				}
				h = nextHint(t, w, "close after the loss", func(h store.Hint) bool { return h.Round == v.Round && !h.Open })
				if h.Incarnation != inc || h.Version != v.Version || len(h.Members) != tc.n-1 ||
					slices.ContainsFunc(h.Members, func(m elastic.Member) bool { return m.ID == "m0001" }) {
					t.Fatalf("%s: close hint after the loss: %+v, view round %d version %d", tc.name, h.Round, v.Round, v.Version)
				}
				// A ranked member that holds the round leaves it (Join):
				// the next round opens, announced as open.
				v, err = s.Join(ctx, store.JoinRequest{JobID: job, Member: elastic.Member{ID: "m0000", Host: strings.Repeat("h", tc.pad), Addr: "127.0.0.1:1"},
					Incarnation: inc, NewIncarnation: "unused", RoundHint: v.Round, HaveRound: v.Round, Arrive: true, Params: p})
				if err != nil || v.Code != store.CodeOK || !v.Open || v.Role != store.RoleArrived {
					t.Fatalf("leaving join: %+v %v", v, err)
				}
				h = nextHint(t, w, "open", func(h store.Hint) bool { return h.Open })
				if h.Round != v.Round || h.Incarnation != inc || h.Version != v.Version || h.Members != nil {
					t.Fatalf("%s: open hint %+v, view round %d version %d", tc.name, h, v.Round, v.Version)
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Watchers of one job on one client share one Pub/Sub subscription; each
// still receives every hint, and the subscription goes with the last one.
func TestWatchersShareOneSubscription(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testredis.Client(t)
	job := testredis.JobID(t)
	channel := store.KeyPrefix + "{" + job + "}:events"
	subs := func() int64 {
		t.Helper()
		n, err := c.PubSubNumSub(ctx, channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[channel]
	}
	var ws []store.Watcher
	for range 5 {
		w, err := store.NewRedis(c).Watch(ctx, job)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if n := subs(); n != 1 {
		t.Fatalf("%d subscriptions for 5 watchers on one client", n)
	}
	other := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	defer other.Close()
	w2, err := store.NewRedis(other).Watch(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if n := subs(); n != 2 {
		t.Fatalf("%d subscriptions for watchers on two clients", n)
	}
	_, round := formRound(t, store.NewRedis(c), job, 2, 0)
	for i, w := range append(ws, w2) {
		nextHint(t, w, fmt.Sprintf("close (watcher %d)", i), func(h store.Hint) bool { return h.Round == round && len(h.Members) == 2 })
	}
	for _, w := range ws[:4] {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := subs(); n != 2 {
		t.Fatalf("%d subscriptions with one watcher left on each client", n)
	}
	_ = ws[4].Close()
	_ = w2.Close()
	waitFor(t, 5*time.Second, "the subscriptions to go", func() bool { return subs() == 0 })
}

// A member that holds its World learns from the open hint alone that its
// round is over: ChangePending and RoundSuperseded both turn true, with
// heartbeats far apart (the hint explains the version they would see, so
// they do not re-read the view either). Here a peer left the round with
// Join (as a trainer does to admit a joiner, or after a failed collective).
func TestOpenHintSupersedesTheRound(t *testing.T) {
	onBothStores(t, 2, 2, time.Hour, func(t *testing.T, s store.Store, cfg elastic.Config) {
		cfg.LeaseTTL, cfg.HeartbeatInterval = time.Minute, 20*time.Second
		agents := []*elastic.Agent{newAgent(t, s, cfg), newAgent(t, s, cfg)}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ws := joinAll(t, ctx, agents)
		checkRound(t, ws, agents)
		a, b := agents[0], agents[1]
		if b.ChangePending() || b.RoundSuperseded() {
			t.Fatal("change pending in a round nothing happened to")
		}
		next := make(chan elastic.World, 1)
		go func() {
			w, err := a.Join(ctx) // a leaves its round: the next one opens, expecting b
			if err != nil {
				t.Error(err)
			}
			next <- w
		}()
		waitFor(t, 5*time.Second, "the survivor to see its round superseded", func() bool {
			return b.ChangePending() && b.RoundSuperseded()
		})
		wb, err := b.Join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkRound(t, []elastic.World{<-next, wb}, agents)
		if wb.Size != 2 || wb.Round <= ws[0].Round {
			t.Fatalf("next round %d of %d", wb.Round, wb.Size)
		}
		if b.ChangePending() || b.RoundSuperseded() {
			t.Fatal("change still pending in the next round")
		}
	})
}

// countingStore counts the store calls of one Agent other than heartbeats.
type countingStore struct {
	store.Store
	calls atomic.Int64
}

func (s *countingStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	s.calls.Add(1)
	return s.Store.Join(ctx, r)
}

func (s *countingStore) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	s.calls.Add(1)
	return s.Store.Check(ctx, r)
}

// A member lost from a round: the survivors re-form the next round in the
// call that evicted it (here a report), and a survivor takes its new World
// from the close hint alone: ChangePending turns true, and its Join returns
// the next round without a store call (no Join, no Check), with heartbeats
// far apart. In a round of n members that is n store calls fewer per loss.
func TestSurvivorTakesTheReformedRoundFromTheHint(t *testing.T) {
	onBothStores(t, 2, 3, time.Hour, func(t *testing.T, s store.Store, cfg elastic.Config) {
		cfg.LeaseTTL, cfg.HeartbeatInterval = time.Minute, 20*time.Second
		cs := &countingStore{Store: s}
		a, b, c := newAgent(t, s, cfg), newAgent(t, cs, cfg), newAgent(t, s, cfg)
		agents := []*elastic.Agent{a, b, c}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ws := joinAll(t, ctx, agents)
		checkRound(t, ws, agents)
		_ = c.Close() // c dies
		before := cs.calls.Load()
		if err := a.ReportFailure(ctx, ws[0].Round, c.Member().ID); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the survivor to see the change", func() bool {
			return b.ChangePending() && b.RoundSuperseded()
		})
		wb, err := b.Join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := cs.calls.Load() - before; n != 0 {
			t.Fatalf("the survivor made %d store calls to take the re-formed round", n)
		}
		wa, err := a.Join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkRound(t, []elastic.World{wa, wb}, []*elastic.Agent{a, b})
		if wb.Round <= ws[0].Round || wb.Size != 2 || wa.Round != wb.Round || b.ChangePending() || a.ChangePending() {
			t.Fatalf("after the loss: a in round %d, b in round %d of %d; pending %v %v", wa.Round, wb.Round, wb.Size, a.ChangePending(), b.ChangePending())
		}
	})
}

// Anything published on a job's channel is at most a hint: a message that
// names a closed round the store does not hold (a stale or forged one) is
// delivered as a version hint without members, garbage as an empty hint,
// and the watcher goes on delivering real hints after them.
func TestWatcherSurvivesGarbageOnTheChannel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testredis.Client(t)
	s := store.NewRedis(c)
	job := testredis.JobID(t)
	channel := store.KeyPrefix + "{" + job + "}:events"
	w, err := s.Watch(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, msg := range []string{"", "\x00\xff", "5\n7\ninc-none", "9\n3\ninc\nnot json", "18446744073709551616\n1\nx", "6\n0\n\nopen"} {
		if err := c.Publish(ctx, channel, msg).Err(); err != nil {
			t.Fatal(err)
		}
		h := nextHint(t, w, fmt.Sprintf("%q", msg), func(store.Hint) bool { return true })
		if h.Members != nil || (h.Open && h.Round == 0) {
			t.Fatalf("%q gave %+v", msg, h)
		}
	}
	_, round := formRound(t, s, job, 2, 0)
	nextHint(t, w, "close after the garbage", func(h store.Hint) bool { return h.Round == round && len(h.Members) == 2 })
}
