package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	stdsync "sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// ckptAbandonAfter is how long close still waits for a write whose context
// it cancelled (a CheckpointStore.Save that honours its context returns at
// once) before it abandons the goroutine: a Save that ignores its context
// cannot hold Run's end beyond its bound plus this.
const ckptAbandonAfter = time.Second

// checkpointer writes durable checkpoints from encoded snapshots on a
// goroutine it owns, so a slow disk never stalls training. At most one write
// is in flight and one waits; a newer submission replaces the waiting one.
//
// Nothing waits for a write without a bound (invariant 4): each write's
// context ends after Config.CheckpointTimeout; saveNow's wait for the
// write in flight ends with its ctx; close's with its ctx (the grace
// period of a preempted worker), after which the write in flight is
// cancelled and reported.
type checkpointer struct {
	store CheckpointStore
	hook  func(step int64, err error)
	mark  func(phase string) (done func()) // marks a write busy for the progress watch; nil: none
	// markPeers marks a synchronous write (saveNow) busy for the progress
	// watch and for the round's peers, which wait for it; nil: none.
	markPeers func(phase string) (done func())
	log       *slog.Logger
	tel       *telemetry
	timeout   time.Duration // bound of one write (Config.CheckpointTimeout); 0: none
	// base is the context of the asynchronous writes: Run's values without
	// its cancellation (a write in flight when Run's ctx ends is still
	// waited for, within its bound); cancelBase ends it at close's bound.
	base       context.Context
	cancelBase context.CancelCauseFunc
	mu         stdsync.Mutex
	cond       *stdsync.Cond
	next       *ckptJob
	busy       bool
	idle       chan struct{} // closed when busy turns false; nil while idle
	cur        *ckptJob      // the asynchronous write in flight, nil: none
	curStart   time.Time
	closing    bool    // close began: asynchronous failures are Run's error
	closeErrs  []error // asynchronous writes that failed once close began
	closed     bool
	writes     int     // successful writes
	writeSecs  float64 // their Save time, seconds
	done       chan struct{}
}

type ckptJob struct {
	step int64
	data []byte
}

// newCheckpointer starts the writer goroutine (none without a store). ctx
// gives the asynchronous writes their values (trace), not their
// cancellation; timeout bounds each write (0: no bound of its own).
func newCheckpointer(ctx context.Context, store CheckpointStore, hook func(int64, error), log *slog.Logger, tel *telemetry,
	timeout time.Duration) *checkpointer {
	c := &checkpointer{store: store, hook: hook, log: log, tel: tel, timeout: timeout, done: make(chan struct{})}
	c.base, c.cancelBase = context.WithCancelCause(context.WithoutCancel(ctx))
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
		for c.busy { // a synchronous write (saveNow) holds the store
			c.cond.Wait()
		}
		c.setBusy(true)
		c.cur, c.curStart = job, time.Now()
		c.mu.Unlock()
		err := c.write(c.base, job)
		c.mu.Lock()
		if err != nil && c.closing {
			c.closeErrs = append(c.closeErrs, fmt.Errorf("%w: the checkpoint of step %d was not written: %w", ErrCheckpoint, job.step, err))
		}
		c.cur = nil
		c.setBusy(false)
		c.mu.Unlock()
	}
}

// setBusy sets busy and wakes its waiters; c.mu held.
func (c *checkpointer) setBusy(b bool) {
	c.busy = b
	if b {
		c.idle = make(chan struct{})
	} else if c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	c.cond.Broadcast()
}

// write runs one Save within c.timeout of ctx.
func (c *checkpointer) write(ctx context.Context, job *ckptJob) error {
	ctx, span := c.tel.tracer.Start(ctx, SpanCheckpoint, trace.WithAttributes(AttrStep.Int64(job.step), AttrBytes.Int(len(job.data))))
	start := time.Now()
	if c.mark != nil {
		defer c.mark("checkpoint save")()
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if c.timeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, c.timeout)
	}
	err := c.store.Save(wctx, job.step, job.data)
	if err != nil && ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("not written within CheckpointTimeout (%v): %w", c.timeout, err)
	} else if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); cause != ctx.Err() {
			err = fmt.Errorf("cancelled after %v: %w: %w", time.Since(start).Round(time.Millisecond), cause, err)
		} else {
			err = fmt.Errorf("cancelled after %v: %w", time.Since(start).Round(time.Millisecond), err)
		}
	}
	cancel()
	endSpan(span, err)
	if err != nil {
		c.log.Error("checkpoint failed", "step", job.step, "err", err)
	} else {
		c.mu.Lock()
		c.writes++
		c.writeSecs += time.Since(start).Seconds()
		c.mu.Unlock()
		c.log.Info("checkpoint written", "step", job.step, "bytes", len(job.data), "seconds", time.Since(start).Seconds())
	}
	if c.hook != nil {
		c.hook(job.step, err)
	}
	return err
}

// writeStats returns how many checkpoints were written and the seconds
// their Save calls took, summed.
func (c *checkpointer) writeStats() (int, float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes, c.writeSecs
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

// saveNow waits for the write in flight (until it ends, within its own
// bound, or until ctx ends), then writes synchronously (used at the end of
// the job and on preemption) and returns the store's error, wrapping
// ErrCheckpoint.
func (c *checkpointer) saveNow(ctx context.Context, step int64, data []byte) error {
	if c.store == nil {
		return nil
	}
	if c.markPeers != nil {
		defer c.markPeers("checkpoint save")()
	}
	start := time.Now()
	c.mu.Lock()
	c.next = nil
	for c.busy {
		idle, cur := c.idle, c.cur
		c.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			what := "a write in flight"
			if cur != nil {
				what = fmt.Sprintf("the write of step %d in flight", cur.step)
			}
			return fmt.Errorf("%w: step %d: not written: waited %v for %s: %w", ErrCheckpoint, step,
				time.Since(start).Round(time.Millisecond), what, context.Cause(ctx))
		}
		c.mu.Lock()
	}
	c.setBusy(true)
	c.mu.Unlock()
	err := c.write(ctx, &ckptJob{step: step, data: data})
	c.mu.Lock()
	c.setBusy(false)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: step %d: %w", ErrCheckpoint, step, err)
	}
	return nil
}

// close finishes the queued write and stops the goroutine. It waits for
// the write in flight and the one queued (each within its own bound,
// Config.CheckpointTimeout) until ctx ends (Run's end passes a context
// that ends with a preempted worker's grace period); then it cancels the
// write, waits up to ckptAbandonAfter for the goroutine, and logs a WARN.
// It returns, wrapping ErrCheckpoint, every asynchronous write that failed
// once close began, naming its step and how long it was waited for.
func (c *checkpointer) close(ctx context.Context) error {
	start := time.Now()
	c.mu.Lock()
	c.closed, c.closing = true, true
	c.cond.Broadcast()
	c.mu.Unlock()
	defer c.cancelBase(nil)
	select {
	case <-c.done:
	case <-ctx.Done():
		c.mu.Lock()
		cur, curStart, queued := c.cur, c.curStart, c.next
		c.next = nil
		c.mu.Unlock()
		cause := context.Cause(ctx)
		if cur != nil {
			c.log.Warn("checkpoint write cancelled at the end of Run: not written", "step", cur.step,
				"waited", time.Since(start).Round(time.Millisecond).String(),
				"write_began", time.Since(curStart).Round(time.Millisecond).String(), "bound", cause.Error())
		}
		if queued != nil {
			c.log.Warn("queued checkpoint dropped at the end of Run: not written", "step", queued.step, "bound", cause.Error())
			c.mu.Lock()
			c.closeErrs = append(c.closeErrs, fmt.Errorf("%w: the checkpoint of step %d was not written: Run's end waited %v: %w",
				ErrCheckpoint, queued.step, time.Since(start).Round(time.Millisecond), cause))
			c.mu.Unlock()
		}
		c.cancelBase(fmt.Errorf("Run's end waited %v for it, past its bound: %w", time.Since(start).Round(time.Millisecond), cause))
		t := time.NewTimer(ckptAbandonAfter)
		select {
		case <-c.done:
			t.Stop()
		case <-t.C:
			c.log.Warn("checkpoint store's Save ignores its cancelled context: its goroutine is abandoned", "after", ckptAbandonAfter.String())
			c.mu.Lock()
			defer c.mu.Unlock()
			if cur != nil {
				c.closeErrs = append(c.closeErrs, fmt.Errorf("%w: the checkpoint of step %d was not written: Run's end waited %v for it and abandoned it: %w",
					ErrCheckpoint, cur.step, time.Since(start).Round(time.Millisecond), cause))
			}
			return errors.Join(c.closeErrs...)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.closeErrs...)
}

// ckptCall bounds one CheckpointStore call outside the checkpointer (List,
// Load) by Config.CheckpointTimeout, so a store that hangs turns into an
// error instead of holding the loop (invariant 4).
func (t *Trainer[B]) ckptCall(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.cfg.CheckpointTimeout)
}

// ckptTimedOut returns, wrapping ErrCheckpoint, err of a call made on
// cctx (from ckptCall on ctx) when it failed because cctx's bound passed
// (not because ctx ended); nil otherwise.
func (t *Trainer[B]) ckptTimedOut(ctx, cctx context.Context, err error, what string) error {
	if err == nil || ctx.Err() != nil || !errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return nil
	}
	return fmt.Errorf("%w: %s: not done within CheckpointTimeout (%v): %w", ErrCheckpoint, what, t.cfg.CheckpointTimeout, err)
}

// ckptTally counts checkpoints and the seconds they took.
type ckptTally struct {
	n       int
	seconds float64
}

// checkpointBlocked records that a periodic checkpoint blocked training on
// this rank for d (Result.CheckpointBlockedSeconds, the metric).
func (t *Trainer[B]) checkpointBlocked(ctx context.Context, d time.Duration) {
	t.ckptBlocked.n++
	t.ckptBlocked.seconds += d.Seconds()
	t.tel.ckptBlocked.Record(ctx, d.Seconds(), t.tel.commonAttrs)
}
