package trainer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// liveHeap is the heap in use after two full collections (the second
// frees what the first's finalizers released), in bytes.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// A restored commit owns only what it keeps: 30 recoveries of a job whose
// model holds 4 MB of parameters (SGD: no optimizer state), on the same
// two long-lived workers, leave the live heap at every recovery within 5 %
// of the first recovery's, without jumps between levels. (Decoded commits
// once kept slices into the whole received state broadcast, so each held
// a multiple of its own size, alternating with the commits it replaced.)
func TestRecoveriesKeepTheHeapLevel(t *testing.T) {
	const (
		recoveries = 30
		padValues  = 1 << 20 // 4 MB of float32
	)
	prob := trainertest.NewProblem(480, 4, 0.05, 9)
	cfg := trainertest.Config(t.Name())
	cfg.Epochs = 2 // 60 steps; the failures take 2 steps each (one of them redone)
	cfg.Elastic.MinWorkers = 2
	cfg.Elastic.LastCall = 20 * time.Millisecond
	cfg.MaxRecoveries = 10 * recoveries
	c := trainertest.NewCluster(t, trainertest.ClusterConfig{Timeout: 2 * time.Minute})

	// Every round's start is a meeting point: both workers wait in
	// OnRound (their state installed, the broadcast done) while the test
	// measures the heap.
	type arrival struct {
		round uint64
		rec   bool
	}
	var measuring atomic.Bool
	measuring.Store(true)
	arrive := make(chan arrival, 2)
	release := make(chan struct{})

	var fired atomic.Int64
	var firedMu stdsync.Mutex
	failedAt := map[int64]bool{}
	start := func() *trainertest.Worker {
		return c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
			m := trainertest.NewModel(prob.Dim)
			pad := make([]float32, padValues)
			padGrad := make([]float32, padValues)
			params := append(m.Params(), Param{Name: "pad", Shape: []int{padValues}, Value: pad, Grad: padGrad})
			step := func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
				return m.Step(ctx, b) // pad's gradient stays zero
			}
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed = 16, 9
			loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			hooks := Hooks{OnRound: func(r RoundInfo) {
				if measuring.Load() {
					arrive <- arrival{round: r.Round, rec: r.Recovery}
					<-release
				}
			}}
			tr, err := New(params, NewSGD(0.05), loader, step, w.Store, cfg, append(w.Options(), WithHooks(hooks))...)
			if err != nil {
				return nil, err
			}
			// From step 3 on (once both ranks filled their commit buffers:
			// long-lived ranks), rank 1 fails each step once after its
			// allreduce, until the test has its recoveries.
			SetAfterReduceHook(tr, func(rank int, s int64) error {
				if rank != 1 || s < 3 || fired.Load() >= recoveries {
					return nil
				}
				firedMu.Lock()
				defer firedMu.Unlock()
				if failedAt[s] {
					return nil
				}
				failedAt[s] = true
				fired.Add(1)
				return errors.New("injected failure after the allreduce")
			})
			return tr, nil
		})
	}
	ws := []*trainertest.Worker{start(), start()}

	var heaps []uint64
	var rounds []string
	timeout := time.After(90 * time.Second)
	for len(heaps) < recoveries {
		var a [2]arrival
		for i := range a {
			select {
			case a[i] = <-arrive:
			case <-timeout:
				t.Fatalf("after %d recovery measurements (%v): no round start", len(heaps), rounds)
			}
		}
		require.Equal(t, a[0].round, a[1].round, "both workers met at one round's start")
		if a[0].rec || a[1].rec {
			heaps = append(heaps, liveHeap())
			rounds = append(rounds, fmt.Sprint(a[0].round))
		}
		if len(heaps) == recoveries {
			measuring.Store(false)
		}
		release <- struct{}{}
		release <- struct{}{}
	}
	c.Wait()
	for _, w := range ws {
		res, err := w.Result()
		require.NoError(t, err)
		require.True(t, res.Finished)
		require.GreaterOrEqual(t, res.Recoveries, recoveries)
	}

	first := float64(heaps[0])
	lo, hi := heaps[0], heaps[0]
	for i, h := range heaps {
		lo, hi = min(lo, h), max(hi, h)
		if d := float64(h)/first - 1; d > 0.05 || d < -0.05 {
			t.Errorf("recovery %d (round %s): live heap %.1f MB, %+.1f %% of the first recovery's %.1f MB",
				i+1, rounds[i], float64(h)/(1<<20), 100*d, first/(1<<20))
		}
	}
	t.Logf("live heap over %d recoveries: %.1f-%.1f MB (first %.1f MB)", len(heaps), float64(lo)/(1<<20), float64(hi)/(1<<20), first/(1<<20))
}
