package trainer

import (
	"context"
	"sync"

	"github.com/elastictrain/elastictrain/elastic"
)

// Progress liveness (issue 14). The rendezvous counts a worker whose loop
// makes no progress for elastic.Config.ProgressTimeout (default 15 s) as
// hung: its Agent leaves the job, the others re-form without it, and the
// worker meets ErrFenced when it wakes and rejoins as a new member. The
// trainer marks progress and the phases it drives itself:
//
//   - every collective and connect (waiting for peers is not a hang), whose
//     end at every step is the step's progress;
//   - the state transfer at the start of a round (a checkpoint load, the
//     broadcast of the newest commit, the loader's and partitions' restore);
//   - every data fetch (the loader's Next, so a slow Get in a dataset);
//   - every checkpoint write (CheckpointStore.Save, also asynchronous ones);
//   - the time between rounds (failure reports, pauses) up to the next Join,
//     during which the Agent rests the watch itself.
//
// What is left is the StepFunc and the user's own code run from the loop
// (hooks): a step function blocked for longer than the progress timeout is
// a hang. A long phase of the user's own (an evaluation in OnStep, a first
// step that compiles a graph) is marked with Busy(ctx, ...) inside a
// StepFunc, or Trainer.Busy anywhere.

// liveness holds the Agent of the running round (nil between Runs).
type liveness struct {
	mu      sync.Mutex
	agent   *elastic.Agent
	between func() // the "between rounds" phase opened when the last round ended
}

type busyKey struct{}

// enterRound records agent as the round's Agent, ends the phase between
// rounds, and returns ctx carrying the marker Busy looks for.
func (l *liveness) enterRound(ctx context.Context, agent *elastic.Agent) context.Context {
	l.mu.Lock()
	between := l.between
	l.agent, l.between = agent, nil
	l.mu.Unlock()
	if between != nil {
		between()
	}
	return context.WithValue(ctx, busyKey{}, l)
}

// leaveRound opens the phase between rounds on agent (ended by the next
// enterRound; an Agent replaced meanwhile is closed and judges nothing).
func (l *liveness) leaveRound(agent *elastic.Agent) {
	done := agent.Busy("between rounds")
	l.mu.Lock()
	prev := l.between
	l.between = done
	l.mu.Unlock()
	if prev != nil {
		prev()
	}
}

// busy opens a phase on the current Agent; without one it does nothing.
func (l *liveness) busy(phase string) (done func()) {
	l.mu.Lock()
	a := l.agent
	l.mu.Unlock()
	if a == nil {
		return func() {}
	}
	return a.Busy(phase)
}

// Busy marks a long phase of the caller's own code (an evaluation, a large
// data load, a first step that compiles) as busy, not hung, for the
// rendezvous' progress watch (elastic.Config.ProgressTimeout); call the
// returned done when it ends (more than once is harmless). ctx is a context
// the trainer passed (a StepFunc's); with any other ctx Busy does nothing
// (use Trainer.Busy). Phases the trainer drives itself (data fetches,
// checkpoint writes, state transfer, collectives) are marked already.
// Safe for concurrent use; no I/O.
func Busy(ctx context.Context, phase string) (done func()) {
	if l, ok := ctx.Value(busyKey{}).(*liveness); ok {
		return l.busy(phase)
	}
	return func() {}
}

// Busy marks a long phase of the caller's own code as busy, not hung, like
// the package-level Busy, from anywhere (a hook, another goroutine). Outside
// a round it does nothing. Safe for concurrent use; no I/O.
func (t *Trainer[B]) Busy(phase string) (done func()) { return t.live.busy(phase) }
