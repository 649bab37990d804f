package elastic_test

import (
	"context"
	"errors"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// hidingStore hides from one member, while armed, every answer that ranks
// it in a closed round, and gives it no hints: that member has arrived in a
// round that closed, but its Join has not seen it, as when the Join is
// cancelled (a preemption) at that moment. A hidden call returns when its
// context ends.
type hidingStore struct {
	store.Store
	armed   atomic.Bool
	arrived chan struct{} // closed at the first answer that says arrived
	hid     chan struct{} // closed at the first answer hidden
	once    stdsync.Once
	oa      stdsync.Once
}

func (s *hidingStore) hide(ctx context.Context, v store.View, err error) (store.View, error) {
	if err == nil && v.Role == store.RoleArrived {
		s.oa.Do(func() { close(s.arrived) })
	}
	if err != nil || !s.armed.Load() || v.Role != store.RoleRanked || v.Open {
		return v, err
	}
	s.once.Do(func() { close(s.hid) })
	<-ctx.Done()
	return store.View{}, ctx.Err()
}

func (s *hidingStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	v, err := s.Store.Join(ctx, r)
	return s.hide(ctx, v, err)
}

func (s *hidingStore) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	v, err := s.Store.Check(ctx, r)
	return s.hide(ctx, v, err)
}

func (s *hidingStore) Watch(ctx context.Context, jobID string) (store.Watcher, error) {
	return silentWatcher{}, nil
}

type silentWatcher struct{}

func (silentWatcher) C() <-chan store.Hint { return nil }
func (silentWatcher) Close() error         { return nil }

// A member whose Join is cancelled just after the store ranked it in a
// closed round does not leave it (its leave would fail the round for the
// others while it forms): LeaveUnlessRanked says it is ranked, and its next
// Join returns that very round, so it can leave the round gracefully. A
// member cancelled while its round still forms leaves it, and the round
// forms without it.
func TestLeaveUnlessRanked(t *testing.T) {
	onBothStores(t, 2, 4, 0, func(t *testing.T, s store.Store, cfg elastic.Config) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()

		// Ranked: B arrives, A's arrival closes the round of two, and B's
		// Join never sees it.
		hs := &hidingStore{Store: s, arrived: make(chan struct{}), hid: make(chan struct{})}
		hs.armed.Store(true)
		b := newAgent(t, hs, cfg)
		a := newAgent(t, s, cfg)
		bctx, bcancel := context.WithCancel(ctx)
		berr := make(chan error, 1)
		go func() { _, err := b.Join(bctx); berr <- err }()
		select {
		case <-hs.arrived: // B holds its incarnation: it can ask the store later
		case <-ctx.Done():
			t.Fatal("B never arrived")
		}
		wa, err := a.Join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if wa.Size != 2 {
			t.Fatalf("A's round has %d members, want 2 (B had arrived)", wa.Size)
		}
		select {
		case <-hs.hid:
		case <-ctx.Done():
			t.Fatal("B's Join never asked the store after the round closed")
		}
		bcancel()
		if err := <-berr; !errors.Is(err, context.Canceled) {
			t.Fatalf("B's cancelled Join: %v, want context.Canceled", err)
		}
		hs.armed.Store(false)
		ranked, err := b.LeaveUnlessRanked(ctx)
		if err != nil || !ranked {
			t.Fatalf("LeaveUnlessRanked = %v, %v; want ranked, no error", ranked, err)
		}
		wb, err := b.Join(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if wb.Round != wa.Round || wb.Size != 2 || wb.Members[wb.Rank].ID != b.Member().ID {
			t.Fatalf("B joined %+v, want A's round %d", wb, wa.Round)
		}
		if a.ChangePending() {
			t.Fatal("A's round changed: B's check opened another round")
		}

		// Not ranked: C arrives in a round that cannot close yet (D is
		// not there), is cancelled, and leaves; D and A's round moves on
		// without it.
		cfg2 := cfg
		cfg2.JobID += "-forming"
		spy := newSpy(s)
		c := newAgent(t, spy, cfg2)
		cctx, ccancel := context.WithCancel(ctx)
		cerr := make(chan error, 1)
		go func() { _, err := c.Join(cctx); cerr <- err }()
		spy.waitArrived(t, c.Member().ID)
		ccancel()
		<-cerr
		ranked, err = c.LeaveUnlessRanked(ctx)
		if err != nil || ranked {
			t.Fatalf("LeaveUnlessRanked of a member in a forming round = %v, %v; want left", ranked, err)
		}
		d, e := newAgent(t, s, cfg2), newAgent(t, s, cfg2)
		ws := joinAll(t, ctx, []*elastic.Agent{d, e})
		if slices.ContainsFunc(ws[0].Members, func(m elastic.Member) bool { return m.ID == c.Member().ID }) {
			t.Fatalf("the round %+v holds C, which left", ws[0])
		}
	})
}
