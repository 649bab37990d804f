package trainertest_test

import (
	"context"
	"errors"
	gosync "sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/synctest"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connectAll connects every backend to one round and returns the
// Synchronizers and errors, in rank order.
func connectAll(ctx context.Context, round uint64, addrs []string, bs ...*trainertest.Backend) ([]sync.Synchronizer, []error) {
	ss, errs := make([]sync.Synchronizer, len(bs)), make([]error, len(bs))
	var wg gosync.WaitGroup
	for i, b := range bs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ss[i], errs[i] = b.Connect(ctx, sync.World{JobID: "j", Round: round, Rank: i, Addrs: addrs})
		}()
	}
	wg.Wait()
	return ss, errs
}

func listen(t *testing.T, n *trainertest.Network, k int) ([]*trainertest.Backend, []string) {
	var bs []*trainertest.Backend
	var addrs []string
	for range k {
		b := n.Backend()
		a, err := b.Listen(context.Background())
		require.NoError(t, err)
		bs, addrs = append(bs, b), append(addrs, a)
	}
	return bs, addrs
}

func TestBackendsFormARound(t *testing.T) {
	ctx := context.Background()
	n := trainertest.NewNetwork(trainertest.NetworkConfig{})
	bs, addrs := listen(t, n, 3)
	ss, errs := connectAll(ctx, 1, addrs, bs...)
	require.NoError(t, errors.Join(errs...))
	sums := make([]float64, 3)
	var wg gosync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := []float64{float64(i)}
			if err := s.AllReduceFloat64(ctx, v, sync.OpSum); err == nil {
				sums[i] = v[0]
			}
		}()
	}
	wg.Wait()
	require.Equal(t, []float64{3, 3, 3}, sums)
	_, ok := ss[0].(sync.AllGatherer)
	require.True(t, ok)
	for _, b := range bs {
		require.Equal(t, 1, b.Connects())
	}
}

func TestConnectNamesAnUnreachablePeer(t *testing.T) {
	n := trainertest.NewNetwork(trainertest.NetworkConfig{})
	bs, addrs := listen(t, n, 2)
	addrs = append(addrs, "mem-nobody")
	_, errs := connectAll(context.Background(), 1, addrs, bs...)
	for _, err := range errs {
		var pe *sync.PeerError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 2, pe.Rank)
		require.ErrorIs(t, err, trainertest.ErrUnreachable)
	}
}

func TestKilledBackendIsNamedByItsPeers(t *testing.T) {
	ctx := context.Background()
	n := trainertest.NewNetwork(trainertest.NetworkConfig{})
	bs, addrs := listen(t, n, 3)
	ss, errs := connectAll(ctx, 1, addrs, bs...)
	require.NoError(t, errors.Join(errs...))
	bs[1].Kill()
	for _, r := range []int{0, 2} {
		err := ss[r].Barrier(ctx)
		var pe *sync.PeerError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 1, pe.Rank)
		require.ErrorIs(t, err, synctest.ErrKilled)
	}
	require.ErrorIs(t, ss[1].Barrier(ctx), sync.ErrClosed)
	// The next round that names it does not form.
	_, errs = connectAll(ctx, 2, addrs, bs...)
	var pe *sync.PeerError
	require.ErrorAs(t, errs[0], &pe)
	require.Equal(t, 1, pe.Rank)
}

func TestOnGroupInjectsFaults(t *testing.T) {
	ctx := context.Background()
	injected := errors.New("injected")
	n := trainertest.NewNetwork(trainertest.NetworkConfig{OnGroup: func(w sync.World, g *synctest.Group) {
		g.FailAt(0, 1, injected)
	}})
	bs, addrs := listen(t, n, 2)
	ss, errs := connectAll(ctx, 5, addrs, bs...)
	require.NoError(t, errors.Join(errs...))
	require.ErrorIs(t, ss[0].Barrier(ctx), injected)
	var pe *sync.PeerError
	require.ErrorAs(t, ss[1].Barrier(ctx), &pe)
	require.Equal(t, 0, pe.Rank)
	require.Equal(t, uint64(5), pe.Round)
}

func TestCancelledConnectAbortsItsPeers(t *testing.T) {
	n := trainertest.NewNetwork(trainertest.NetworkConfig{})
	bs, addrs := listen(t, n, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := bs[0].Connect(ctx, sync.World{JobID: "j", Round: 1, Rank: 0, Addrs: addrs})
	require.ErrorIs(t, err, context.Canceled)
	_, err = bs[1].Connect(context.Background(), sync.World{JobID: "j", Round: 1, Rank: 1, Addrs: addrs})
	var pe *sync.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 0, pe.Rank)
	require.ErrorIs(t, err, sync.ErrAborted)
}
