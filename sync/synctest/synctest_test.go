package synctest_test

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/synctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// each runs f on every rank of g concurrently and returns their errors.
func each(g *synctest.Group, f func(r *synctest.Rank) error) []error {
	errs := make([]error, g.Size())
	var wg gosync.WaitGroup
	for i := range g.Size() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(g.Rank(i))
		}()
	}
	wg.Wait()
	return errs
}

func TestCollectives(t *testing.T) {
	ctx := context.Background()
	g := synctest.NewGroup(3, synctest.Config{})
	out := make([][]float64, 3)
	out32 := make([][]float32, 3)
	bc := make([][]byte, 3)
	ag := make([][]byte, 3)
	errs := each(g, func(r *synctest.Rank) error {
		k := r.Rank()
		v := []float64{float64(k), float64(10 * k)}
		if err := r.AllReduceFloat64(ctx, v, sync.OpSum); err != nil {
			return err
		}
		out[k] = v
		m := []float32{float32(k), -float32(k)}
		if err := r.AllReduceFloat32(ctx, m, sync.OpMax); err != nil {
			return err
		}
		out32[k] = m
		b := []byte{byte(k), byte(k)}
		if err := r.Broadcast(ctx, b, 2); err != nil {
			return err
		}
		bc[k] = b
		recv := make([]byte, 3)
		if err := r.AllGather(ctx, []byte{byte('a' + k)}, recv); err != nil {
			return err
		}
		ag[k] = recv
		return r.Barrier(ctx)
	})
	for k := range 3 {
		require.NoError(t, errs[k])
		require.Equal(t, []float64{3, 30}, out[k])
		require.Equal(t, []float32{2, 0}, out32[k])
		require.Equal(t, []byte{2, 2}, bc[k])
		require.Equal(t, []byte("abc"), ag[k])
	}
}

func TestMismatchFailsEveryRank(t *testing.T) {
	g := synctest.NewGroup(2, synctest.Config{})
	errs := each(g, func(r *synctest.Rank) error {
		return r.AllReduceFloat64(context.Background(), make([]float64, 1+r.Rank()), sync.OpSum)
	})
	for _, err := range errs {
		require.ErrorIs(t, err, sync.ErrMismatch)
	}
	// Broken for good.
	require.ErrorIs(t, g.Rank(0).Barrier(context.Background()), sync.ErrMismatch)
}

func TestKillNamesTheRankOnItsPeers(t *testing.T) {
	g := synctest.NewGroup(3, synctest.Config{})
	started := make(chan struct{}, 2)
	errs := make([]error, 3)
	var wg gosync.WaitGroup
	for _, k := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started <- struct{}{}
			errs[k] = g.Rank(k).Barrier(context.Background())
		}()
	}
	<-started
	<-started
	g.Kill(1)
	wg.Wait()
	for _, k := range []int{0, 2} {
		var pe *sync.PeerError
		require.ErrorAs(t, errs[k], &pe)
		require.Equal(t, 1, pe.Rank)
		require.ErrorIs(t, errs[k], synctest.ErrKilled)
		require.NotErrorIs(t, errs[k], sync.ErrAborted, "a killed peer is lost, not aborting on purpose")
	}
	require.ErrorIs(t, g.Rank(1).Barrier(context.Background()), sync.ErrClosed)
}

func TestFailAtOperationK(t *testing.T) {
	g := synctest.NewGroup(2, synctest.Config{})
	injected := errors.New("injected")
	g.FailAt(1, 3, injected)
	var done [2]int
	errs := each(g, func(r *synctest.Rank) error {
		for {
			if err := r.AllReduceFloat64(context.Background(), []float64{1}, sync.OpSum); err != nil {
				return err
			}
			done[r.Rank()]++
		}
	})
	require.Equal(t, [2]int{2, 2}, done, "two operations completed before the third failed")
	require.ErrorIs(t, errs[1], injected)
	var pe *sync.PeerError
	require.ErrorAs(t, errs[0], &pe)
	require.Equal(t, 1, pe.Rank)
}

func TestCancelAbortsPeersWithErrAborted(t *testing.T) {
	g := synctest.NewGroup(2, synctest.Config{Round: 7})
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, 2)
	var wg gosync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = g.Rank(0).Barrier(ctx) }()
	go func() { defer wg.Done(); errs[1] = g.Rank(1).Barrier(context.Background()) }()
	cancel()
	wg.Wait()
	if errs[0] == nil { // rank 1 arrived before the cancel: completed
		require.NoError(t, errs[1])
		return
	}
	require.ErrorIs(t, errs[0], context.Canceled)
	var pe *sync.PeerError
	require.ErrorAs(t, errs[1], &pe)
	require.Equal(t, 0, pe.Rank)
	require.Equal(t, uint64(7), pe.Round)
	require.ErrorIs(t, errs[1], sync.ErrAborted)
}

func TestDropTimesOut(t *testing.T) {
	g := synctest.NewGroup(2, synctest.Config{OpTimeout: 50 * time.Millisecond})
	g.Drop(0)
	errs := each(g, func(r *synctest.Rank) error { return r.Barrier(context.Background()) })
	for _, err := range errs {
		require.ErrorIs(t, err, sync.ErrTimeout)
	}
}

func TestDelayedRankStillCompletes(t *testing.T) {
	g := synctest.NewGroup(2, synctest.Config{})
	g.Delay(1, 20*time.Millisecond)
	start := time.Now()
	errs := each(g, func(r *synctest.Rank) error { return r.Barrier(context.Background()) })
	require.NoError(t, errors.Join(errs...))
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
}

// Example runs one allreduce over three in-memory ranks.
func Example() {
	g := synctest.NewGroup(3, synctest.Config{})
	sums := make([]float64, 3)
	var wg gosync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := []float64{float64(r + 1)}
			if err := g.Rank(r).AllReduceFloat64(context.Background(), buf, sync.OpSum); err == nil {
				sums[r] = buf[0]
			}
		}()
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [6 6 6]
}

// TestBusyRankHoldsPeers: as on a *sync.Ring, a rank marked busy for three
// times OpTimeout before it arrives does not fail the others' operation;
// one marked busy for good fails it after BusyTimeout.
func TestBusyRankHoldsPeers(t *testing.T) {
	const opTimeout = 200 * time.Millisecond
	for _, forGood := range []bool{false, true} {
		g := synctest.NewGroup(3, synctest.Config{OpTimeout: opTimeout, BusyTimeout: time.Second})
		errs := make([]error, 3)
		start := time.Now()
		var wg gosync.WaitGroup
		for r := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rk := g.Rank(r)
				if r == 1 {
					done := rk.Busy()
					time.Sleep(3 * opTimeout) // the long phase itself
					if forGood {
						return
					}
					done()
				}
				errs[r] = rk.Barrier(context.Background())
			}()
		}
		wg.Wait()
		took := time.Since(start)
		if forGood {
			require.ErrorIs(t, errs[0], sync.ErrTimeout)
			require.GreaterOrEqual(t, took, time.Second, "failed before BusyTimeout")
			continue
		}
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
		require.GreaterOrEqual(t, took, 3*opTimeout)
	}
}

// TestOrderedAllReduce: every rank's out is the sequential float32 sum,
// from +0, of the parts in rank order, whatever the world size and the
// split (ranks without parts included): (1 + 1e8) - 1e8 is 0, where the
// ranks' own sums would give 1. A part of the wrong length fails its rank
// with ErrInvalid and the others with ErrMismatch, without waiting.
func TestOrderedAllReduce(t *testing.T) {
	ctx := context.Background()
	global := [][]float32{{1, -2.5}, {1e8, 3}, {-1e8, 0.25}}
	want := []float32{0, 0.75}
	for _, bounds := range [][]int{{0, 3}, {0, 1, 3}, {0, 0, 3}, {0, 2, 2, 3}, {0, 1, 2, 3}, {0, 0, 1, 1, 3}} {
		n := len(bounds) - 1
		g := synctest.NewGroup(n, synctest.Config{})
		outs := make([][]float32, n)
		errs := each(g, func(r *synctest.Rank) error {
			k := r.Rank()
			outs[k] = []float32{9, 9}
			var o sync.OrderedReducer = r
			return o.AllReduceOrderedFloat32(ctx, global[bounds[k]:bounds[k+1]], outs[k])
		})
		for k := range n {
			require.NoError(t, errs[k], "split %v rank %d", bounds, k)
			require.Equal(t, want, outs[k], "split %v rank %d", bounds, k)
		}
	}
	g := synctest.NewGroup(2, synctest.Config{})
	errs := each(g, func(r *synctest.Rank) error {
		part := make([]float32, 2+r.Rank())
		return r.AllReduceOrderedFloat32(ctx, [][]float32{part}, make([]float32, 2))
	})
	require.ErrorIs(t, errs[1], sync.ErrInvalid)
	require.ErrorIs(t, errs[0], sync.ErrMismatch)
}
