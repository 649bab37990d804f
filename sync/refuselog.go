package sync

import (
	"errors"
	"time"
)

// Rate limit of the "sync: refused connection" warnings (a flood of
// garbage connections must not flood the log too). Per Transport and kind
// of refusal (malformed, authentication, job, round, other), at most
// refuseLogBurst refusals are logged one by one in each refuseLogInterval,
// so a flood of one kind never hides the first refusals of another (a
// peer with a stale secret among garbage);
// the rest of that interval's refusals are counted, and one summary line
// with the count and the last of them follows when the interval ends (or
// the Transport closes). TransportStats keeps counting every refusal.
const (
	refuseLogBurst    = 5
	refuseLogInterval = 10 * time.Second
)

// refuseLog is the state of the rate limit, under Transport.mu.
type refuseLog struct {
	start      time.Time        // of the current interval (Transport.now)
	logged     [refuseKinds]int // refusals of each kind logged one by one in it
	suppressed uint64           // refusals not logged since the last summary
	lastRemote string           // the last of them
	lastErr    error            //
	timer      *time.Timer      // fires the summary at the interval's end; nil when none is due
}

// refusalSummary is a summary line due to be logged.
type refusalSummary struct {
	suppressed uint64
	total      uint64
	lastRemote string
	lastErr    error
}

func (t *Transport) logSummary(s *refusalSummary) {
	if s == nil {
		return
	}
	t.log.Warn("sync: refused connections not logged one by one", "suppressed", s.suppressed,
		"interval", refuseLogInterval, "refused_total", s.total, "last_remote", s.lastRemote, "err", s.lastErr)
}

// takeSummaryLocked returns the pending summary (nil when nothing was
// suppressed) and resets the count; Transport.mu held.
func (t *Transport) takeSummaryLocked() *refusalSummary {
	l := &t.refuseLog
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if l.suppressed == 0 {
		return nil
	}
	s := &refusalSummary{suppressed: l.suppressed, total: t.stats.Refused, lastRemote: l.lastRemote, lastErr: l.lastErr}
	l.suppressed, l.lastRemote, l.lastErr = 0, "", nil
	return s
}

// noteRefusalLocked decides whether the refusal of remote with err is
// logged on its own line (one), and returns the summary of the interval
// before when this refusal starts a new one; Transport.mu held.
func (t *Transport) noteRefusalLocked(remote string, err error) (one bool, prev *refusalSummary) {
	l := &t.refuseLog
	now := t.now()
	if l.start.IsZero() || now.Sub(l.start) >= refuseLogInterval || now.Before(l.start) {
		prev = t.takeSummaryLocked()
		l.start, l.logged = now, [refuseKinds]int{}
	}
	if k := refusalKind(err); l.logged[k] < refuseLogBurst {
		l.logged[k]++
		return true, prev
	}
	l.suppressed++
	l.lastRemote, l.lastErr = remote, err
	if l.timer == nil && !t.isClosed {
		l.timer = time.AfterFunc(l.start.Add(refuseLogInterval).Sub(now), t.flushRefusals)
	}
	return false, prev
}

// flushRefusals logs the summary of the interval that ended (the timer's
// function).
func (t *Transport) flushRefusals() {
	t.mu.Lock()
	t.refuseLog.timer = nil // this one fired
	s := t.takeSummaryLocked()
	t.mu.Unlock()
	t.logSummary(s)
}

// Kinds of refusal, as TransportStats counts them and the log's rate
// limit tells them apart.
const (
	refusedMalformed = iota
	refusedAuth
	refusedJob
	refusedRound
	refusedOther
	refuseKinds // the number of kinds
)

// refusalKind classifies a refusal. An authentication failure counts as
// one even when it also wraps ErrBadFrame.
func refusalKind(err error) int {
	switch {
	case errors.Is(err, ErrAuth):
		return refusedAuth
	case errors.Is(err, ErrJobMismatch):
		return refusedJob
	case errors.Is(err, ErrRoundMismatch):
		return refusedRound
	case errors.Is(err, ErrBadFrame):
		return refusedMalformed
	}
	return refusedOther
}
