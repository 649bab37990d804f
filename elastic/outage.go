package elastic

import (
	"fmt"
	"time"
)

// The outage budget's clock (issue 29, item 6). noteOutage judges the
// budget when a failed call returns, but a call returns only at its own
// deadline (up to a heartbeat's, 2 x LeaseTTL): a store that stopped
// answering just after a heartbeat left was given up budget + up to a
// heartbeat deadline later. So the Agent also knows its calls in flight:
// a call that has had no answer, while nothing else got through since it
// started, is an outage from its start, whether or not it has failed
// yet; a timer fires when the oldest such call's budget runs out, and the
// Agent gives up then. Give-up so lands within OutageBudget of the start
// of the first call the store left unanswered, plus the timer's own
// scheduling delay (outageSlack): the calls in flight return at once
// with the terminal error.

// outageSlack is the slack, beyond OutageBudget, within which an Agent
// gives up once the store answered nothing for the budget: the timer's
// scheduling delay and one lock, milliseconds on an idle machine; stated
// at 1 s, which also holds on two cores under a load average of 20 (a
// timer there was seen 600 ms late), and is a fixed amount, unlike the
// heartbeat deadline (2 x LeaseTTL) the give-up used to wait for.
const outageSlack = time.Second

// callBegin records a store call that starts at sent, in flight until
// callEnd(id), and arms the budget's timer if it is not armed.
func (a *Agent) callBegin(sent time.Time) (id uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inFlight == nil {
		a.inFlight = make(map[uint64]time.Time)
	}
	a.callSeq++
	id = a.callSeq
	a.inFlight[id] = sent
	if a.budgetAt.IsZero() && a.err == nil {
		a.armBudgetLocked(sent.Add(a.cfg.OutageBudget))
	}
	return id
}

// callEnd records that call id returned (answered, failed or abandoned;
// the caller notes which).
func (a *Agent) callEnd(id uint64) {
	a.mu.Lock()
	delete(a.inFlight, id)
	a.mu.Unlock()
}

// armBudgetLocked makes the budget's timer fire at at. Called with a.mu held.
func (a *Agent) armBudgetLocked(at time.Time) {
	a.budgetAt = at
	d := max(time.Until(at), 0) + time.Millisecond
	if a.budgetTimer == nil {
		a.budgetTimer = time.AfterFunc(d, a.checkBudget)
	} else {
		a.budgetTimer.Reset(d)
	}
}

// outageStartLocked is when the current outage began, or zero: the
// earliest of the failed calls' clock (outageSince) and the start of the
// oldest call in flight that started after the last answer (lastOK; a
// call in flight from before it may just be slow). Called with a.mu held.
func (a *Agent) outageStartLocked() time.Time {
	since := a.outageSince
	for _, s := range a.inFlight {
		if s.After(a.lastOK) && (since.IsZero() || s.Before(since)) {
			since = s
		}
	}
	return since
}

// checkBudget runs on the budget's timer: it fails the Agent with
// ErrStoreUnavailable once the store answered nothing for longer than
// OutageBudget, and otherwise re-arms the timer for the outage under way.
func (a *Agent) checkBudget() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.budgetAt = time.Time{}
	if a.err != nil {
		return
	}
	since := a.outageStartLocked()
	if since.IsZero() {
		return
	}
	if waited := time.Since(since); waited >= a.cfg.OutageBudget {
		// Name the cause when a call has failed (a name that does not
		// resolve, a server of another protocol): "no answer" alone
		// hides what an operator has to fix.
		cause := "no answer"
		if a.outageErr != nil {
			cause = "last error: " + a.outageErr.Error()
		}
		a.giveUpLocked(fmt.Errorf("%w: no answer for longer than the outage budget of %v (%v since the oldest call the store left unanswered; %s)",
			ErrStoreUnavailable, a.cfg.OutageBudget, waited.Round(time.Millisecond), cause))
		a.log.Error("store unreachable for the whole outage budget; giving up",
			"budget", a.cfg.OutageBudget.String(), "waited", waited.Round(time.Millisecond).String(), "err", cause)
		return
	}
	a.armBudgetLocked(since.Add(a.cfg.OutageBudget))
}

// giveUpLocked fails the Agent with err (an ErrStoreUnavailable) and ends
// every store call in flight (bounded). Called with a.mu held.
func (a *Agent) giveUpLocked(err error) {
	a.failLocked(err)
	select {
	case <-a.gaveUp:
	default:
		close(a.gaveUp)
	}
}

// stopBudgetLocked stops the budget's timer (Close). Called with a.mu held.
func (a *Agent) stopBudgetLocked() {
	if a.budgetTimer != nil {
		a.budgetTimer.Stop()
	}
}
