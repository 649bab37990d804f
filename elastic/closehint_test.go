package elastic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// A heartbeat's answer says the job's latest round and whether it forms.
func TestHeartbeatSaysTheRoundAndWhetherItForms(t *testing.T) {
	onBothStores(t, 2, 2, time.Hour, func(t *testing.T, s store.Store, cfg elastic.Config) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		p := store.Params{MinWorkers: 2, MaxWorkers: 2, LastCall: time.Hour, LeaseTTL: time.Minute, StateTTL: time.Hour}
		m := elastic.NewMember("127.0.0.1:1")
		v, err := s.Join(ctx, store.JoinRequest{JobID: cfg.JobID, Member: m, NewIncarnation: "inc-1", Arrive: true, Params: p})
		if err != nil || !v.Open {
			t.Fatalf("first arrival: %+v, %v", v, err)
		}
		req := store.MemberRequest{JobID: cfg.JobID, MemberID: m.ID, Incarnation: v.Incarnation, Params: p}
		b, err := s.Heartbeat(ctx, req)
		if err != nil || b.Code != store.CodeOK || b.Round != v.Round || !b.Open {
			t.Fatalf("while the round forms: %+v, %v; want round %d open", b, err, v.Round)
		}
		m2 := elastic.NewMember("127.0.0.1:2")
		v2, err := s.Join(ctx, store.JoinRequest{JobID: cfg.JobID, Member: m2, NewIncarnation: "inc-2", Arrive: true, Params: p})
		if err != nil || v2.Open || v2.Role != store.RoleRanked {
			t.Fatalf("second arrival closes the round: %+v, %v", v2, err)
		}
		b, err = s.Heartbeat(ctx, req)
		if err != nil || b.Code != store.CodeOK || b.Round != v2.Round || b.Open {
			t.Fatalf("after the close: %+v, %v; want round %d closed", b, err, v2.Round)
		}
	})
}

// slowHints delays every hint of the stores' Watchers by delay, as a
// process busy reading a large round's roster does, and counts Checks.
type slowHints struct {
	store.Store
	delay  time.Duration
	checks atomic.Int64
}

func (s *slowHints) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	s.checks.Add(1)
	return s.Store.Check(ctx, r)
}

func (s *slowHints) Watch(ctx context.Context, jobID string) (store.Watcher, error) {
	w, err := s.Store.Watch(ctx, jobID)
	if err != nil {
		return nil, err
	}
	d := &delayedWatcher{w: w, c: make(chan store.Hint, 16), stop: make(chan struct{}), done: make(chan struct{})}
	go d.run(s.delay)
	return d, nil
}

type delayedWatcher struct {
	w    store.Watcher
	c    chan store.Hint
	stop chan struct{}
	done chan struct{}
}

func (d *delayedWatcher) run(delay time.Duration) {
	defer close(d.done)
	type timed struct {
		h   store.Hint
		due time.Time
	}
	q := make(chan timed, 64)
	recvDone := make(chan struct{})
	go func() { // each hint is due delay after it came, however many queue
		defer close(recvDone)
		for {
			select {
			case h := <-d.w.C():
				select {
				case q <- timed{h, time.Now().Add(delay)}:
				case <-d.stop:
					return
				}
			case <-d.stop:
				return
			}
		}
	}()
	defer func() { <-recvDone }()
	for {
		select {
		case x := <-q:
			t := time.NewTimer(time.Until(x.due))
			select {
			case <-t.C:
			case <-d.stop:
				t.Stop()
				return
			}
			select {
			case d.c <- x.h:
			case <-d.stop:
				return
			}
		case <-d.stop:
			return
		}
	}
}

func (d *delayedWatcher) C() <-chan store.Hint { return d.c }
func (d *delayedWatcher) Close() error {
	close(d.stop)
	<-d.done
	return d.w.Close()
}

// Members waiting in a forming round whose heartbeat tells them it closed
// before the close's hint arrives wait for the hint, which brings their
// World, instead of each reading the store at once: when a round of 4096
// closed, the heartbeats of the ~100 ms before the hint reached the
// members sent thousands of Checks.
func TestHeartbeatBeforeTheCloseHintSendsNoCheck(t *testing.T) {
	onBothStores(t, 4, 4, time.Hour, func(t *testing.T, s store.Store, cfg elastic.Config) {
		cfg.LeaseTTL, cfg.HeartbeatInterval = 3*time.Second, 50*time.Millisecond
		spy := newSpy(s)
		slow := &slowHints{Store: spy, delay: 600 * time.Millisecond} // many heartbeats, under closeWait (1 s)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		agents := []*elastic.Agent{newAgent(t, slow, cfg), newAgent(t, slow, cfg), newAgent(t, slow, cfg)}
		joined := make(chan []elastic.World, 1)
		go func() { joined <- joinAll(t, ctx, agents) }()
		spy.waitArrived(t, agents[0].Member().ID, agents[1].Member().ID, agents[2].Member().ID)
		before := slow.checks.Load()
		last := newAgent(t, slow, cfg)
		start := time.Now()
		w, err := last.Join(ctx) // closes the round
		if err != nil {
			t.Fatal(err)
		}
		worlds := <-joined
		took := time.Since(start)
		checkRound(t, append(worlds, w), append(agents, last))
		if n := slow.checks.Load() - before; n != 0 {
			t.Errorf("%d Checks while the close's hint was on its way (%v); want none", n, took)
		}
	})
}
