package trainer

import (
	"context"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// checkpointer writes durable checkpoints from encoded snapshots on a
// goroutine it owns, so a slow disk never stalls training. At most one write
// is in flight and one waits; a newer submission replaces the waiting one.
type checkpointer struct {
	store CheckpointStore
	hook  func(step int64, err error)
	mark  func(phase string) (done func()) // marks a write busy for the progress watch; nil: none
	// markPeers marks a synchronous write (saveNow) busy for the progress
	// watch and for the round's peers, which wait for it; nil: none.
	markPeers func(phase string) (done func())
	log       *slog.Logger
	tel       *telemetry
	mu        stdsync.Mutex
	cond      *stdsync.Cond
	next      *ckptJob
	busy      bool
	closed    bool
	done      chan struct{}
}

type ckptJob struct {
	step int64
	data []byte
}

func newCheckpointer(store CheckpointStore, hook func(int64, error), log *slog.Logger, tel *telemetry) *checkpointer {
	c := &checkpointer{store: store, hook: hook, log: log, tel: tel, done: make(chan struct{})}
	c.cond = stdsync.NewCond(&c.mu)
	if store == nil {
		close(c.done)
		return c
	}
	go c.loop()
	return c
}

func (c *checkpointer) loop() {
	defer close(c.done)
	for {
		c.mu.Lock()
		for c.next == nil && !c.closed {
			c.cond.Wait()
		}
		job := c.next
		c.next = nil
		if job == nil { // closed and drained
			c.mu.Unlock()
			return
		}
		c.busy = true
		c.mu.Unlock()
		c.write(context.Background(), job)
		c.mu.Lock()
		c.busy = false
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

func (c *checkpointer) write(ctx context.Context, job *ckptJob) error {
	ctx, span := c.tel.tracer.Start(ctx, SpanCheckpoint, trace.WithAttributes(AttrStep.Int64(job.step), AttrBytes.Int(len(job.data))))
	start := time.Now()
	if c.mark != nil {
		defer c.mark("checkpoint save")()
	}
	err := c.store.Save(ctx, job.step, job.data)
	endSpan(span, err)
	if err != nil {
		c.log.Error("checkpoint failed", "step", job.step, "err", err)
	} else {
		c.log.Info("checkpoint written", "step", job.step, "bytes", len(job.data), "seconds", time.Since(start).Seconds())
	}
	if c.hook != nil {
		c.hook(job.step, err)
	}
	return err
}

// submit queues an asynchronous write; it never blocks on I/O.
func (c *checkpointer) submit(step int64, data []byte) {
	if c.store == nil {
		return
	}
	c.mu.Lock()
	c.next = &ckptJob{step: step, data: data}
	c.cond.Broadcast()
	c.mu.Unlock()
}

// saveNow waits for the write in flight, then writes synchronously (used at
// the end of the job and on preemption) and returns the store's error.
func (c *checkpointer) saveNow(ctx context.Context, step int64, data []byte) error {
	if c.store == nil {
		return nil
	}
	if c.markPeers != nil {
		defer c.markPeers("checkpoint save")()
	}
	c.mu.Lock()
	c.next = nil
	for c.busy {
		c.cond.Wait()
	}
	c.busy = true
	c.mu.Unlock()
	err := c.write(ctx, &ckptJob{step: step, data: data})
	c.mu.Lock()
	c.busy = false
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: step %d: %w", ErrCheckpoint, step, err)
	}
	return nil
}

// close finishes the queued write and stops the goroutine.
func (c *checkpointer) close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	<-c.done
}
