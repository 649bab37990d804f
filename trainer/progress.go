package trainer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/elastictrain/elastictrain/elastic"
	esync "github.com/elastictrain/elastictrain/sync"
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
// The data fetches, the synchronous checkpoint writes (the final one, and
// those of jobs with partitions), rank 0's checkpoint load at the start of
// a round and the user's Busy phases also tell the round's peers
// (sync.BusyMarker: KindBusy frames on the round's control connections,
// every 500 ms while the phase lasts), whose collectives then wait for
// them instead of timing out after sync.Config.OpTimeout, up to
// sync.Config.BusyTimeout; a phase still open when a round connects tells
// that round's peers too. Phases in which the peers take part themselves
// (collectives, the rest of the state transfer) and asynchronous
// checkpoint writes do not.
//
// Every phase of the worker's own (elastic.Agent.Busy: the fetches, the
// writes, the loads, the user's) is bounded by
// elastic.Config.PhaseTimeout: one open longer is a hang, and the Agent
// leaves the job for it as for a loop without progress; the peers, which
// were waiting for it, see the member gone and re-form without it. Waiting
// for peers (collectives, connects, the state transfer, the time between
// rounds) is marked with elastic.Agent.Waiting, which their own timeouts
// bound instead.
//
// What is left is the StepFunc and the user's own code run from the loop
// (hooks): a step function blocked for longer than the progress timeout is
// a hang. A long phase of the user's own (an evaluation in OnStep, a first
// step that compiles a graph) is marked with Busy(ctx, ...) inside a
// StepFunc, or Trainer.Busy anywhere.

// liveness holds the Agent of the running round (nil between Runs) and,
// once the round is connected, its Synchronizer's busy marks.
type liveness struct {
	mu      sync.Mutex
	agent   *elastic.Agent
	peers   esync.BusyMarker // the round's Synchronizer, when it has the capability
	between func()           // the "between rounds" phase opened when the last round ended
	// open counts the phases marked for the peers (busy) and not yet
	// done, whichever round they began in; remote ends the peers' mark
	// the connected round holds for them (nil: none). A phase opened
	// before the round connected (Trainer.Busy from another goroutine, a
	// fetch that spans a round change) so tells the new round's peers
	// too, and they wait for it instead of timing out after
	// sync.Config.OpTimeout.
	open   int
	remote func()
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

// connected records the round's Synchronizer: from now on a marked phase
// also tells the round's peers (sync.BusyMarker), whose collectives then
// wait for it instead of timing out after sync.Config.OpTimeout.
func (l *liveness) connected(comm esync.Synchronizer) {
	m, _ := comm.(esync.BusyMarker)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.peers = m
	if m != nil && l.open > 0 && l.remote == nil {
		l.remote = m.Busy()
	}
}

// leaveRound opens the phase between rounds on agent (ended by the next
// enterRound; an Agent replaced meanwhile is closed and judges nothing).
func (l *liveness) leaveRound(agent *elastic.Agent) {
	done := agent.Waiting("between rounds")
	l.mu.Lock()
	prev, remote := l.between, l.remote
	l.between = done
	l.peers, l.remote = nil, nil
	l.mu.Unlock()
	if remote != nil {
		remote()
	}
	if prev != nil {
		prev()
	}
}

// busy opens a phase on the current Agent (judged by
// elastic.Config.PhaseTimeout) and, while a round is connected, on its
// Synchronizer (the peers wait for it, also when it began before the
// round connected); without an Agent it does nothing.
func (l *liveness) busy(phase string) (done func()) {
	l.mu.Lock()
	a := l.agent
	if a == nil {
		l.mu.Unlock()
		return func() {}
	}
	l.open++
	if l.open == 1 && l.peers != nil && l.remote == nil {
		l.remote = l.peers.Busy()
	}
	l.mu.Unlock()
	local := a.Busy(phase)
	var ended atomic.Bool
	return func() {
		if !ended.CompareAndSwap(false, true) {
			return
		}
		l.mu.Lock()
		var remote func()
		if l.open--; l.open == 0 {
			remote, l.remote = l.remote, nil
		}
		l.mu.Unlock()
		if remote != nil {
			remote()
		}
		local()
	}
}

// waiting opens a phase in which the loop waits for its peers (the state
// transfer's collectives) on the current Agent only: their own timeouts
// bound it, not elastic.Config.PhaseTimeout, and the peers, who take part,
// are not told.
func (l *liveness) waiting(phase string) (done func()) {
	l.mu.Lock()
	a := l.agent
	l.mu.Unlock()
	if a == nil {
		return func() {}
	}
	return a.Waiting(phase)
}

// busyLocal opens a phase on the current Agent only: work beside the
// loop that holds no peer up (an asynchronous checkpoint write), which
// must not stretch the peers' collectives.
func (l *liveness) busyLocal(phase string) (done func()) {
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

// noteSilent logs, after a round that failed on a collective's timeout,
// one WARN per rank the timeout named silent (sync.TimeoutError.Silent:
// neither waiting in the collective nor marked busy, so hung, stopped, or
// slower than sync.Config.OpTimeout allows), with its member ID and
// address: the survivors of a hang can tell which rank it was from their
// own logs within OpTimeout of the stall, before the rendezvous acts on
// it (the hung rank's own Agent leaves the job after
// elastic.Config.ProgressTimeout).
func (t *Trainer[B]) noteSilent(world elastic.World, err error) {
	var te *esync.TimeoutError
	if !errors.As(err, &te) {
		return
	}
	for _, r := range te.Silent {
		if r < 0 || r >= len(world.Members) || r == world.Rank {
			continue
		}
		m := world.Members[r]
		t.log.Warn("a collective timed out on a silent rank (neither waiting in it nor marked busy: hung, stopped, or slower than OpTimeout)",
			"silent_rank", r, "silent_member", m.ID, "silent_addr", m.Addr, "round", world.Round, "reported_by", te.From)
	}
}
