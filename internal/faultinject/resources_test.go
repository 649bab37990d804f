package faultinject_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/freeport"
	"log/slog"
	"os"
	"runtime"
	gosync "sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// resourceSample is the heap in use and goroutine count after a recovery.
type resourceSample struct {
	heap       uint64
	goroutines int
}

func sampleResources() resourceSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return resourceSample{heap: ms.HeapInuse, goroutines: runtime.NumGoroutine()}
}

// Must-show 4: three trainers in one process (in-memory store) recover 30
// times in a row from a cut of one rank's peer connections (a real failure:
// reset connections, a failed step, a failure report, an eviction, a
// fenced member rejoining); the heap in use and the goroutine count after
// the 30th recovery are within 10 % of their values after the first.
func TestResourcesFlatAcrossRecoveries(t *testing.T) {
	const (
		ranks      = 3
		recoveries = 30
		steady     = 15 // steps after each recovery before sampling
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := store.NewMemory()
	prob := trainertest.NewProblem(512, 8, 0.05, 3)

	var mu gosync.Mutex
	recovered := 0
	var lastStep int64
	progress := make(chan struct{}, 1)
	poke := func() {
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	jobID := fmt.Sprintf("resources-%d", time.Now().UnixNano())
	proxies := make([]*faultinject.Proxy, ranks)
	errs := make(chan error, ranks)
	var wg gosync.WaitGroup
	for i := range ranks {
		listen, err := freeport.Addr()
		require.NoError(t, err)
		p, err := faultinject.NewProxy("127.0.0.1:0", listen)
		require.NoError(t, err)
		defer p.Close()
		proxies[i] = p

		m := trainertest.NewModel(8)
		m.StepDelay = time.Millisecond
		dcfg := dataloader.DefaultConfig()
		dcfg.GlobalBatch, dcfg.Seed = 16, 3
		loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
		require.NoError(t, err)
		defer loader.Close()
		cfg := trainer.DefaultConfig()
		cfg.JobID = jobID
		cfg.Epochs = 1 << 20 // ended by cancel
		cfg.ListenAddr = listen
		cfg.MaxRecoveries = 10 * recoveries
		cfg.Elastic.MinWorkers = ranks
		cfg.Elastic.LastCall = 50 * time.Millisecond
		cfg.Elastic.LeaseTTL, cfg.Elastic.HeartbeatInterval = time.Second, 100*time.Millisecond
		cfg.Sync.Secret = []byte("resource test secret of 32 bytes")
		cfg.Sync.AdvertiseAddr = p.Addr()
		cfg.Sync.LocalSockets, cfg.Sync.SharedMemory = false, false
		cfg.Sync.OpTimeout, cfg.Sync.DialTimeout = 3*time.Second, 5*time.Second
		hooks := trainer.Hooks{
			OnRound: func(r trainer.RoundInfo) {
				if r.Recovery && r.Rank == 0 {
					mu.Lock()
					recovered++
					mu.Unlock()
				}
			},
			OnStep: func(s trainer.StepInfo) {
				if s.Rank == 0 {
					mu.Lock()
					lastStep = s.Step
					mu.Unlock()
					poke()
				}
			},
		}
		opts := []trainer.Option{trainer.WithHooks(hooks)}
		if os.Getenv("ELASTICTRAIN_TEST_LOG") != "" {
			lg := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("trainer", i)
			opts = append(opts, trainer.WithLogger(lg))
			cfg.Sync.Logger, cfg.Elastic.Logger = lg, lg
		}
		tr, err := trainer.New(m.Params(), optim.NewMomentum(0.01, 0.9), loader, m.Step, st, cfg, opts...)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := tr.Run(ctx)
			errs <- err
		}()
	}
	defer func() { cancel(); wg.Wait() }()

	// waitSteps waits until rank 0 applied n more steps after `recoveries`
	// recoveries were counted.
	waitFor := func(cond func(rec int, step int64) bool) {
		t.Helper()
		deadline := time.NewTimer(60 * time.Second)
		defer deadline.Stop()
		for {
			mu.Lock()
			ok := cond(recovered, lastStep)
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-progress:
			case err := <-errs:
				t.Fatalf("a trainer stopped: %v", err)
			case <-deadline.C:
				t.Fatalf("no progress within 60 s (recoveries %d)", recovered)
			}
		}
	}
	waitFor(func(_ int, step int64) bool { return step >= 5 })
	var first, last resourceSample
	for k := 1; k <= recoveries; k++ {
		mu.Lock()
		before := recovered
		mu.Unlock()
		// Cut one rank's inbound links until that fails a step (a rank no
		// peer dials has no inbound links, and a cut of links the small
		// collectives never use goes unnoticed until they are used).
		for j := 0; ; j++ {
			mu.Lock()
			from := lastStep
			mu.Unlock()
			if proxies[(k+j)%ranks].Cut() == 0 {
				continue
			}
			waitFor(func(rec int, step int64) bool { return rec > before || step >= from+40 })
			mu.Lock()
			done := recovered > before
			mu.Unlock()
			if done {
				break
			}
			require.Less(t, j, 10, "ten cuts did not fail a step")
		}
		mu.Lock()
		at := lastStep
		mu.Unlock()
		waitFor(func(_ int, step int64) bool { return step >= at+steady })
		s := sampleResources()
		if k == 1 {
			first = s
		}
		last = s
		t.Logf("after recovery %2d: heap in use %7d B, %3d goroutines", k, s.heap, s.goroutines)
	}
	t.Logf("after the first: heap %d B, %d goroutines; after the %dth: heap %d B, %d goroutines",
		first.heap, first.goroutines, recoveries, last.heap, last.goroutines)
	require.InDelta(t, float64(first.heap), float64(last.heap), 0.10*float64(first.heap), "heap in use")
	require.InDelta(t, first.goroutines, last.goroutines, 0.10*float64(first.goroutines), "goroutines")
	cancel()
	wg.Wait()
	for range ranks {
		if err := <-errs; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("trainer ended with %v", err)
		}
	}
}
