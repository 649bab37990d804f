package elastic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// ErrNoProgress is wrapped, together with ErrFenced, by the terminal error
// of an Agent whose worker made no progress for Config.ProgressTimeout
// while no phase was marked: the Agent counted the worker as hung and left
// the job for it. Like any fenced member, the worker must join again as a
// new Member.
var ErrNoProgress = errors.New("elastic: no progress within the progress timeout (hung)")

// progressWatch is the Agent's record of its worker's progress: liveness of
// the training loop, not of the process (the heartbeat goroutine keeps
// running while a step function is blocked forever).
type progressWatch struct {
	armed atomic.Bool  // Progress or Busy was called at least once
	last  atomic.Int64 // local ns since the Agent's start: last progress
	open  atomic.Int64 // phases marked busy or waiting and not yet done

	mu      sync.Mutex
	bounded map[*openPhase]struct{} // phases marked busy (Config.PhaseTimeout) and not yet done
}

// openPhase is one phase marked with Busy, judged by Config.PhaseTimeout.
type openPhase struct {
	name  string
	start time.Time
}

// oldest returns the phase marked busy that has been open the longest, or
// nil. O(open phases): a worker holds a handful at most.
func (p *progressWatch) oldest() *openPhase {
	p.mu.Lock()
	defer p.mu.Unlock()
	var o *openPhase
	for ph := range p.bounded {
		if o == nil || ph.start.Before(o.start) {
			o = ph
		}
	}
	return o
}

// Progress records that the worker's loop made progress (a step, a phase
// boundary) now. The trainer calls it at every step; a user of the Agent
// without the trainer calls it from its own loop. The first call starts the
// progress watch (Config.ProgressTimeout). Safe for concurrent use; no I/O.
func (a *Agent) Progress() {
	a.prog.last.Store(int64(time.Since(a.start)))
	a.prog.armed.Store(true)
}

// Busy marks the start of a long phase of the worker's own that makes no
// steps but is not a hang (a data load, an evaluation, a checkpoint
// write): while at least one phase is open, the Agent does not count the
// worker as hung for want of progress (Config.ProgressTimeout). A phase
// still open after Config.PhaseTimeout (10 min by default) is a hang
// itself: the Agent leaves the job for the worker, as for a loop without
// progress, and names the phase. Call the returned done when the phase
// ends (more than once is harmless); ending a phase counts as progress.
// phase names the phase in the log records. Mark waiting for peers
// (a collective) with Waiting instead. Safe for concurrent use; no I/O.
func (a *Agent) Busy(phase string) (done func()) { return a.mark(phase, true) }

// Waiting marks the start of a phase in which the worker waits for its
// peers or the store (a collective, a connect, the time between rounds),
// which their own timeouts bound: like Busy, it keeps the worker from
// being counted as hung for want of progress, but Config.PhaseTimeout
// does not judge it. Call the returned done when it ends (more than once
// is harmless); ending it counts as progress. Safe for concurrent use; no
// I/O.
func (a *Agent) Waiting(phase string) (done func()) { return a.mark(phase, false) }

func (a *Agent) mark(phase string, bounded bool) (done func()) {
	p := &a.prog
	p.open.Add(1)
	p.armed.Store(true)
	start := time.Now()
	var rec *openPhase
	if bounded {
		rec = &openPhase{name: phase, start: start}
		p.mu.Lock()
		if p.bounded == nil {
			p.bounded = make(map[*openPhase]struct{})
		}
		p.bounded[rec] = struct{}{}
		p.mu.Unlock()
	}
	var ended atomic.Bool
	return func() {
		if ended.CompareAndSwap(false, true) {
			if rec != nil {
				p.mu.Lock()
				delete(p.bounded, rec)
				p.mu.Unlock()
			}
			a.Progress()
			p.open.Add(-1)
			if d := time.Since(start); a.cfg.ProgressTimeout > 0 && d > a.cfg.ProgressTimeout {
				a.log.Info("a marked phase outlasted the progress timeout (busy, not hung)",
					"phase", phase, "took", d, "progress_timeout", a.cfg.ProgressTimeout)
			}
		}
	}
}

// restProgress restarts the progress clock (Join returned: waiting for a
// round is not a hang).
func (a *Agent) restProgress() { a.prog.last.Store(int64(time.Since(a.start))) }

// checkProgress runs on the background goroutine at every heartbeat tick:
// once the worker made no progress for ProgressTimeout outside any marked
// phase and outside Join, the Agent leaves the job for it (the store evicts
// it at once, so the survivors re-form within a heartbeat) and fails with
// ErrFenced wrapping ErrNoProgress. It reports whether it did.
func (a *Agent) checkProgress() bool {
	if a.checkPhases() {
		return true
	}
	p := &a.prog
	if a.cfg.ProgressTimeout <= 0 || !p.armed.Load() || p.open.Load() > 0 {
		return false
	}
	idle := time.Duration(int64(time.Since(a.start)) - p.last.Load())
	if idle <= a.cfg.ProgressTimeout {
		return false
	}
	if !a.judged() || p.open.Load() > 0 {
		return false
	}
	a.log.Warn("no progress: no step and no marked phase; leaving the job as hung",
		"idle", idle, "progress_timeout", a.cfg.ProgressTimeout)
	a.leaveHung(fmt.Errorf("%w: %w (no step and no marked phase for %v; job %q, member %s)",
		ErrFenced, ErrNoProgress, idle.Round(time.Millisecond), a.cfg.JobID, a.self.ID))
	return true
}

// judged reports whether the worker may be counted as hung now: it holds
// a membership, is not inside Join, and its Agent has not failed.
func (a *Agent) judged() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.joining && a.inc != "" && a.err == nil
}

// checkPhases runs with checkProgress: once a phase marked with Busy has
// been open for longer than Config.PhaseTimeout, outside Join, the Agent
// leaves the job for the worker as hung (a data source that never
// answers) and fails with ErrFenced wrapping ErrNoProgress, naming the
// phase. It reports whether it did.
func (a *Agent) checkPhases() bool {
	if a.cfg.PhaseTimeout <= 0 {
		return false
	}
	ph := a.prog.oldest()
	if ph == nil {
		return false
	}
	open := time.Since(ph.start)
	if open <= a.cfg.PhaseTimeout || !a.judged() {
		return false
	}
	a.log.Warn("a marked phase outlasted the phase timeout; leaving the job as hung",
		"phase", ph.name, "open_for", open.Round(time.Millisecond).String(), "phase_timeout", a.cfg.PhaseTimeout.String())
	a.leaveHung(fmt.Errorf("%w: %w (phase %q open for %v, over the phase timeout of %v; job %q, member %s)",
		ErrFenced, ErrNoProgress, ph.name, open.Round(time.Millisecond), a.cfg.PhaseTimeout, a.cfg.JobID, a.self.ID))
	return true
}

// leaveHung leaves the job for a worker counted as hung (the store evicts
// it at once, so the survivors re-form within a heartbeat) and fails the
// Agent with cause.
func (a *Agent) leaveHung(cause error) {
	req := a.memberRequest()
	sent := time.Now()
	a.mu.Lock()
	a.leaving = true // a beat that sees us gone must not take the error below's place
	a.mu.Unlock()
	if _, err := bounded(a, context.Background(), "leave", a.opTimeout(),
		func(c context.Context) (store.View, error) { return a.store.Leave(c, req) }, nil, nil); err != nil && !errors.Is(err, ErrClosed) {
		// The lease still lapses once the Agent stops renewing it.
		_ = a.noteOutage(err, sent, time.Time{})
		a.log.Warn("could not leave the job; the lease will lapse", "err", err)
	}
	a.fail(cause)
}

// noteGone logs, on a member that formed round w after prev, one WARN per
// member of prev that is not in w (evicted: its lease lapsed, a peer
// reported it, it left, or its own Agent counted it as hung), naming its
// member ID, address and rank in prev: the survivors of a hang or a crash
// can tell from their own logs which rank it was. A member announced with
// ExpectLeave is logged at INFO as having left gracefully instead. Called
// with a.mu held.
func (a *Agent) noteGone(prev World, hadPrev bool, w World) {
	if !hadPrev || prev.Round == w.Round {
		return
	}
	// Survivors keep their relative order (ranks follow seniority, then
	// arrival order), so one forward scan through the new roster finds
	// them in O(members); a member not found ahead is looked for in the
	// whole roster (gone, or an order the scan did not expect), and past a
	// few such members a set takes over. A nested search was O(members^2)
	// per Agent: seconds for a process of a thousand Agents.
	const scansBeforeSet = 8
	var in map[string]bool
	j, misses := 0, 0
	for rank, m := range prev.Members {
		if m.ID == a.self.ID {
			continue
		}
		if in == nil {
			k := j
			for k < len(w.Members) && w.Members[k].ID != m.ID {
				k++
			}
			if k < len(w.Members) {
				j = k + 1
				continue
			}
			if misses++; misses > scansBeforeSet {
				in = make(map[string]bool, len(w.Members))
				for _, n := range w.Members {
					in[n.ID] = true
				}
			} else if slices.ContainsFunc(w.Members[:j], func(n Member) bool { return n.ID == m.ID }) {
				continue
			}
		}
		if in != nil && in[m.ID] {
			continue
		}
		if a.leavers[m.ID] {
			a.log.Info("a member of the last round left gracefully (preempted, or scaled down)",
				"gone_member", m.ID, "gone_addr", m.Addr, "gone_rank", rank, "last_round", prev.Round, "round", w.Round)
			continue
		}
		a.log.Warn("a member of the last round is gone (evicted: crashed, hung, left, or reported)",
			"gone_member", m.ID, "gone_addr", m.Addr, "gone_rank", rank, "last_round", prev.Round, "round", w.Round)
	}
	clear(a.leavers) // said once: the next round's departures are news again
}

// ExpectLeave tells the Agent that members of its current round leave
// gracefully (the training loop agreed on it with them: a preemption, a
// scale-down), so that the round formed without them logs at INFO that
// they left, not the WARN for a member gone without notice (crashed, hung,
// or reported). It changes nothing else: the store learns of a leave only
// from the leaving member's Leave (or its lease). IDs that are not members
// of the round are ignored when the next round forms. Safe for concurrent
// use.
func (a *Agent) ExpectLeave(memberIDs ...string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.leavers == nil {
		a.leavers = make(map[string]bool, len(memberIDs))
	}
	for _, id := range memberIDs {
		a.leavers[id] = true
	}
}
