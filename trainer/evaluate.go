package trainer

import (
	"context"
	"fmt"
	"log/slog"
	stdsync "sync"
	"sync/atomic"
	"time"
)

// Evaluation is a periodic evaluation of the model that never stalls the
// loop: every Every global steps, at the commit of that step, the trainer
// copies the committed parameters (one copy of their values, on the loop
// goroutine) and hands the copy to Func on a goroutine of its own. When
// the previous evaluation is still running, that commit's evaluation is
// skipped (Skipped counts them) rather than waiting for it. Set it with
// WithEvaluation.
type Evaluation struct {
	// Every is the interval in global steps (> 0); an evaluation runs at
	// the first commit at or after each multiple of it.
	Every int64
	// AllRanks evaluates on every rank; by default only rank 0 does.
	AllRanks bool
	// Func evaluates params (names, shapes and a copy of the committed
	// values of step; Grad is nil), valid until it returns. ctx ends when
	// Run returns; Run waits for a running Func to return, up to
	// StopTimeout.
	Func func(ctx context.Context, step int64, params []Param)
	// StopTimeout bounds how long Run, as it returns, waits for a running
	// Func after ending its ctx. A Func still running then (one that does
	// not watch its ctx) is left to finish on its own goroutine, with its
	// copy of the parameters, and Run logs a WARN saying so. Zero means
	// DefaultEvaluationStopTimeout; negative is invalid.
	StopTimeout time.Duration
}

// DefaultEvaluationStopTimeout is Evaluation.StopTimeout's default.
const DefaultEvaluationStopTimeout = 10 * time.Second

// WithEvaluation runs e (see Evaluation). New reports ErrInvalidConfig for
// Every < 1 or a nil Func.
func WithEvaluation(e Evaluation) Option { return func(o *options) { o.eval = &e } }

// evaluator owns the evaluation goroutine of one Run.
type evaluator struct {
	e       Evaluation
	next    int64 // the step at or after which the next evaluation is due
	rank    atomic.Int64
	busy    atomic.Bool
	skipped atomic.Int64
	bufs    [2][]Param // double buffer: the loop fills the one not being evaluated
	cur     int
	ctx     context.Context
	cancel  context.CancelFunc
	wg      stdsync.WaitGroup
}

func newEvaluator(e Evaluation, params []Param) (*evaluator, error) {
	if e.Every < 1 || e.Func == nil || e.StopTimeout < 0 {
		return nil, fmt.Errorf("%w: Evaluation needs Every >= 1 (got %d), a Func and StopTimeout >= 0 (got %v)", ErrInvalidConfig, e.Every, e.StopTimeout)
	}
	if e.StopTimeout == 0 {
		e.StopTimeout = DefaultEvaluationStopTimeout
	}
	ev := &evaluator{e: e, next: e.Every}
	for b := range ev.bufs {
		ev.bufs[b] = make([]Param, len(params))
		for i, p := range params {
			ev.bufs[b][i] = Param{Name: p.Name, Shape: p.Shape, Value: make([]float32, len(p.Value))}
		}
	}
	ev.ctx, ev.cancel = context.WithCancel(context.Background())
	return ev, nil
}

// committed is called on the loop goroutine after the commit of step.
func (ev *evaluator) committed(step int64, params []Param) {
	if step < ev.next || (!ev.e.AllRanks && ev.rank.Load() != 0) {
		return
	}
	for ev.next <= step {
		ev.next += ev.e.Every
	}
	if !ev.busy.CompareAndSwap(false, true) {
		ev.skipped.Add(1)
		return
	}
	buf := ev.bufs[ev.cur]
	ev.cur = 1 - ev.cur
	for i, p := range params {
		copy(buf[i].Value, p.Value)
	}
	ev.wg.Add(1)
	go func() {
		defer ev.wg.Done()
		defer ev.busy.Store(false)
		if ev.ctx.Err() == nil {
			ev.e.Func(ev.ctx, step, buf)
		}
	}()
}

// close cancels a running evaluation and waits for it, up to
// Evaluation.StopTimeout; past it, it logs a WARN on log and returns.
func (ev *evaluator) close(log *slog.Logger) {
	ev.cancel()
	done := make(chan struct{})
	go func() { ev.wg.Wait(); close(done) }()
	t := time.NewTimer(ev.e.StopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn("an evaluation is still running after its context ended; not waiting for it (its Func does not watch its ctx)",
			"stop_timeout", ev.e.StopTimeout)
	}
}

// EvaluationsSkipped returns how many due evaluations were skipped because the
// previous one was still running. Safe from any goroutine.
func (t *Trainer[B]) EvaluationsSkipped() int64 {
	if t.eval == nil {
		return 0
	}
	return t.eval.skipped.Load()
}
