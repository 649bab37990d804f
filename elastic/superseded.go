package elastic

import "github.com/elastictrain/elastictrain/elastic/store"

// RoundSuperseded reports, without I/O, whether the round of the last Join
// can no longer go on as formed, by what the store last said: a newer round
// exists or is forming (a member was lost, evicted or left, or a peer called
// Join), this member is not ranked in it, the store lost its state, or the
// Agent hit a terminal error (fenced, job finished). Unlike ChangePending it
// is false for changes a round takes at its next step boundary: joiners
// waiting to be admitted, and this member's own lease renewals being late
// (a loaded machine; the store decides whether the lease lapsed, and then
// says so). So a collective in flight may be aborted when it is true
// (nobody will complete it), never merely because someone is waiting.
// It is true before the first Join. Safe for concurrent use.
func (a *Agent) RoundSuperseded() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := a.view
	return a.err != nil || a.lost || !a.hasWorld || v.Round != a.world.Round || v.Open || v.Role != store.RoleRanked ||
		a.supRound > a.world.Round // an open hint said so (supersededLocked)
}
