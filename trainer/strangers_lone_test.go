package trainer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/sync"
	. "github.com/elastictrain/elastictrain/trainer"
)

// authThenHang is a Backend for a worker nobody authenticates: its first
// Connect fails authentication with every peer (a *sync.AuthError with
// nobody on its side), later ones wait until the round is aborted; each
// Connect announces its round on connecting first.
type authThenHang struct {
	calls      int
	connecting chan uint64
}

func (b *authThenHang) Listen(context.Context) (string, error) { return "127.0.0.1:1", nil }
func (b *authThenHang) Close() error                           { return nil }
func (b *authThenHang) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	b.calls++
	b.connecting <- w.Round
	if b.calls == 1 {
		var failed []int
		for r := range w.Addrs {
			if r != w.Rank {
				failed = append(failed, r)
			}
		}
		return nil, &sync.AuthError{Round: w.Round, Rank: w.Rank, Size: len(w.Addrs), Failed: failed,
			Err: &sync.PeerError{Rank: failed[0], Round: w.Round, Err: sync.ErrAuth}}
	}
	<-ctx.Done()
	return nil, fmt.Errorf("connect round %d: %w", w.Round, ctx.Err())
}

// A worker that failed authentication with its only peer (a pair in a
// fresh job: neither side may report the other) and whose next connect
// with that peer is aborted because the peer left (it gave up) stops with
// ErrFailureBudget, counting that round, instead of rejoining alone below
// MinWorkers and waiting out JoinTimeout (an hour here).
func TestLoneStrangerWhosePeerLeftMidConnectGivesUp(t *testing.T) {
	j := newJob(t, stores(t)["redis"])
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers, c.Elastic.MaxWorkers, c.MaxRecoveries, c.Elastic.JoinTimeout = 2, 2, 5, time.Hour
	}
	be := &authThenHang{connecting: make(chan uint64, 2)}
	j.opts = func(int) []Option { return []Option{WithBackend(be)} }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The peer: a member that takes each round and, in the second, leaves.
	pc := j.config().Elastic
	pc.JobID = j.id
	peer, err := elastic.NewAgent(store.NewRedis(testredis.Client(t)), elastic.NewMember("127.0.0.1:2"), pc)
	require.NoError(t, err)
	defer peer.Close()
	s := j.start()
	connected := func(round uint64) {
		t.Helper()
		select {
		case r := <-be.connecting:
			require.Equal(t, round, r)
		case <-s.done:
			t.Fatalf("the stranger ended before its connect in round %d: %v", round, s.err)
		case <-ctx.Done():
			t.Fatalf("the stranger never connected in round %d", round)
		}
	}
	w1, err := peer.Join(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, w1.Size)
	connected(w1.Round)       // and fails authentication
	w2, err := peer.Join(ctx) // with the stranger's rejoin
	require.NoError(t, err)
	require.Greater(t, w2.Round, w1.Round)
	connected(w2.Round)
	require.NoError(t, peer.Leave(ctx))

	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancel()
		<-s.done
		t.Fatalf("the stranger still waits alone after its peer left: %v", s.err)
	}
	require.ErrorIs(t, s.err, ErrFailureBudget)
	var bud *BudgetError
	require.ErrorAs(t, s.err, &bud)
	require.Equal(t, 2, bud.Unformed, "both rounds count")
	require.Contains(t, s.err.Error(), "authentication failed")
}
