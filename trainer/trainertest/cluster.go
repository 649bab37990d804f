package trainertest

import (
	"context"
	"errors"
	"fmt"
	gosync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/trainer"
)

// Config returns a trainer.Config for in-process tests of job jobID:
// trainer.DefaultConfig with leases of 1 s (heartbeats every 100 ms), a
// last call of 200 ms, a store outage budget of 1 s (so a worker that
// Cluster.Kill cut off gives up at once instead of retrying for 30 s) and
// collective timeouts of 5 s. Its Sync settings are those of the default
// ring (with a test secret), so the same Config also serves trainers that
// use TCP.
func Config(jobID string) trainer.Config {
	c := trainer.DefaultConfig()
	c.JobID = jobID
	c.Elastic.LeaseTTL = time.Second
	c.Elastic.HeartbeatInterval = 100 * time.Millisecond
	c.Elastic.LastCall = 200 * time.Millisecond
	c.Elastic.OutageBudget = time.Second
	c.Sync.OpTimeout = 5 * time.Second
	c.Sync.Secret = []byte("trainertest secret of 32 bytes..")
	return c
}

// Runner is what a Cluster runs on each worker: a *trainer.Trainer of any
// batch type.
type Runner interface {
	Run(ctx context.Context) (trainer.Result, error)
}

// ClusterConfig tunes a Cluster. The zero value is valid.
type ClusterConfig struct {
	// Store is the rendezvous store every worker shares. Default: a new
	// store.NewMemory.
	Store store.Store
	// Network configures the in-memory Backends' Network.
	Network NetworkConfig
	// Timeout bounds Wait. Default 60 s.
	Timeout time.Duration
}

// Cluster runs the workers of one elastic job in one test: one trainer
// per worker, each on its own goroutine with its own in-memory Backend
// (no TCP) and its own handle on the shared rendezvous store. Kill makes
// a worker vanish the way a SIGKILLed process does. Workers still running
// when the test ends are stopped by t.Cleanup. Its methods are meant for
// the test goroutine.
type Cluster struct {
	Store   store.Store
	Network *Network

	t       testing.TB
	timeout time.Duration
	mu      gosync.Mutex
	workers []*Worker
	wg      gosync.WaitGroup
}

// NewCluster returns an empty Cluster.
func NewCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = store.NewMemory()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	c := &Cluster{Store: cfg.Store, Network: NewNetwork(cfg.Network), t: t, timeout: cfg.Timeout}
	t.Cleanup(func() {
		for _, w := range c.Workers() {
			w.cancel()
		}
		c.wg.Wait()
	})
	return c
}

// Worker is one worker of a Cluster.
type Worker struct {
	// Index numbers the workers in the order Start made them, from 0.
	Index int
	// Backend is the worker's in-memory Backend (Options passes it).
	Backend *Backend
	// Store is the worker's handle on the Cluster's store: pass it to
	// trainer.New. Kill cuts it.
	Store store.Store

	cut    *cutStore
	cancel context.CancelFunc
	done   chan struct{}
	res    trainer.Result
	err    error
	killed atomic.Bool
}

// Options returns the trainer options the worker's trainer must be given
// (WithBackend with its Backend).
func (w *Worker) Options() []trainer.Option { return []trainer.Option{trainer.WithBackend(w.Backend)} }

// Done is closed when the worker's Run returned.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Result returns what Run returned; valid once Done is closed.
func (w *Worker) Result() (trainer.Result, error) {
	<-w.done
	return w.res, w.err
}

// Killed reports whether Kill was called on the worker.
func (w *Worker) Killed() bool { return w.killed.Load() }

// Start starts one more worker: build makes its trainer (give it w.Store
// and w.Options()), and Run runs on a goroutine of the Cluster's. A build
// error fails the test.
func (c *Cluster) Start(build func(w *Worker) (Runner, error)) *Worker {
	c.t.Helper()
	c.mu.Lock()
	w := &Worker{Index: len(c.workers), Backend: c.Network.Backend(), done: make(chan struct{})}
	c.mu.Unlock()
	w.cut = &cutStore{Store: c.Store}
	w.Store = w.cut
	r, err := build(w)
	if err != nil {
		c.t.Fatalf("trainertest: worker %d: %v", w.Index, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	c.mu.Lock()
	c.workers = append(c.workers, w)
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(w.done)
		w.res, w.err = r.Run(ctx)
	}()
	return w
}

// Workers returns every worker started so far.
func (c *Cluster) Workers() []*Worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Worker(nil), c.workers...)
}

// Kill makes w vanish as a SIGKILLed process does: its store handle stops
// working (it neither leaves nor renews its lease), its Backend is killed
// (its peers' collectives fail with a *sync.PeerError naming its rank, so
// they report it and re-form at once), and its Run is cancelled.
func (c *Cluster) Kill(w *Worker) {
	w.killed.Store(true)
	w.cut.cut.Store(true)
	w.Backend.Kill()
	w.cancel()
}

// Stop cancels w's Run (it leaves the rendezvous gracefully).
func (c *Cluster) Stop(w *Worker) { w.cancel() }

// Wait waits until the Run of every worker not killed returned, or fails
// the test after ClusterConfig.Timeout (cancelling them all). A killed
// worker's Run returns on its own later (its rendezvous agent tries to
// leave through the cut store until its outage budget, or 5 s, runs out);
// t.Cleanup waits for it.
func (c *Cluster) Wait() {
	c.t.Helper()
	timeout := time.After(c.timeout)
	for _, w := range c.Workers() {
		if w.Killed() {
			continue
		}
		select {
		case <-w.done:
		case <-timeout:
			for _, w := range c.Workers() {
				w.cancel()
			}
			c.wg.Wait()
			c.t.Fatalf("trainertest: the cluster's workers did not finish within %v", c.timeout)
		}
	}
}

// ErrStoreCut is what a killed worker's store handle returns.
var ErrStoreCut = errors.New("trainertest: store handle of a killed worker")

// cutStore is a worker's handle on the shared store; once cut, every call
// fails, as a dead process's would never arrive.
type cutStore struct {
	store.Store
	cut atomic.Bool
}

func (s *cutStore) check() error {
	if s.cut.Load() {
		return ErrStoreCut
	}
	return nil
}

func (s *cutStore) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	if err := s.check(); err != nil {
		return store.View{}, err
	}
	return s.Store.Join(ctx, r)
}

func (s *cutStore) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	if err := s.check(); err != nil {
		return store.View{}, err
	}
	return s.Store.Check(ctx, r)
}

func (s *cutStore) Heartbeat(ctx context.Context, r store.MemberRequest) (store.Beat, error) {
	if err := s.check(); err != nil {
		return store.Beat{}, err
	}
	return s.Store.Heartbeat(ctx, r)
}

func (s *cutStore) Report(ctx context.Context, r store.ReportRequest) (store.View, error) {
	if err := s.check(); err != nil {
		return store.View{}, err
	}
	return s.Store.Report(ctx, r)
}

func (s *cutStore) Leave(ctx context.Context, r store.MemberRequest) (store.View, error) {
	if err := s.check(); err != nil {
		return store.View{}, err
	}
	return s.Store.Leave(ctx, r)
}

func (s *cutStore) Finish(ctx context.Context, r store.MemberRequest) (store.View, error) {
	if err := s.check(); err != nil {
		return store.View{}, err
	}
	return s.Store.Finish(ctx, r)
}

func (s *cutStore) Watch(ctx context.Context, jobID string) (store.Watcher, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.Store.Watch(ctx, jobID)
}

var _ store.Store = (*cutStore)(nil)

// String names the worker in test logs.
func (w *Worker) String() string { return fmt.Sprintf("worker %d (%s)", w.Index, w.Backend.Addr()) }
