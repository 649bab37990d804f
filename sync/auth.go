package sync

import (
	"errors"
	"fmt"
	"time"
)

// authGrace bounds how long a Connect that met a peer failing
// authentication goes on forming its other connections, to learn whether
// this rank is on the majority side of the failure.
const authGrace = time.Second

// AuthError is Connect's error when a peer this rank dialed, at the address
// the World gives for it, did not prove the job secret (or refused this
// rank's proof, or serves another job). errors.Is(err, ErrAuth) (or
// ErrJobMismatch) holds, and errors.As finds the *PeerError of the first
// such peer.
//
// Only members that hold the same secret prove it to one another, so the
// members of a round fall into groups by secret, and at most one group can
// be more than half of the round. Connect therefore does not give up at the
// first failure: for up to a second it goes on forming the other
// connections of the round and reports which ranks proved the secret to
// this rank. When this rank and those are more than half of the round
// (Majority), this rank is in the only group that can be, and the Failed
// ranks are the ones that do not hold the job's secret: a caller may evict
// them. A rank that nobody proved the secret to (Proved is empty) is most
// likely the one with the wrong secret. A minority, such as strangers that
// share a wrong secret among themselves, can never be a majority; in a
// round of two nobody is.
type AuthError struct {
	Round uint64 // the round of the Connect
	Rank  int    // this rank
	Size  int    // the world size
	// Proved lists, in ascending order, the ranks that proved the job
	// secret to this rank during this Connect, on a connection either
	// side dialed.
	Proved []int
	// Failed lists, in ascending order, the ranks whose listener, dialed
	// by this rank at the World's address, did not prove the job secret,
	// refused this rank's proof, or serves another job. A rank that also
	// proved the secret on another connection is in Proved, not here.
	Failed []int
	// Err is the first failure: a *PeerError wrapping ErrAuth or
	// ErrJobMismatch.
	Err error
}

// Error implements error.
func (e *AuthError) Error() string {
	return fmt.Sprintf("sync: connect round %d rank %d: ranks %v failed authentication; ranks %v proved the job secret (%d of the round's %d members authenticate one another with this rank): %v",
		e.Round, e.Rank, e.Failed, e.Proved, 1+len(e.Proved), e.Size, e.Err)
}

// Unwrap returns the first failure.
func (e *AuthError) Unwrap() error { return e.Err }

// Majority reports whether this rank and the ranks in Proved are more than
// half of the round's members.
func (e *AuthError) Majority() bool { return 2*(1+len(e.Proved)) > e.Size }

// authTally is what the dials of one Connect learnt about authentication.
type authTally struct {
	failed map[int]bool // ranks whose listener failed authentication
	first  error        // the first such failure
}

// authFailure reports a dial error that says the listener at a peer's
// address does not share this job and secret.
func authFailure(err error) bool {
	var pe *PeerError
	return errors.As(err, &pe) && (errors.Is(err, ErrAuth) || errors.Is(err, ErrJobMismatch))
}

// authSettled reports whether a Connect doomed by an authentication
// failure has learnt enough: no dial is in flight (so no peer sees this
// rank drop a handshake half-way), and every peer proved the secret,
// failed, or claimed to fail; or this rank has a majority; or not even
// half of the round can prove the secret to this rank any more. dialing is
// the number of dials still in flight.
func (t *Transport) authSettled(st *connectState, a *authTally, dialing int) bool {
	if dialing > 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return st.settledLocked(func(p int) bool { return st.proved[p] }, func(p int) bool { return a.failed[p] || st.claimed[p] })
}

// settledLocked is the rule of a doomed Connect that has learnt enough:
// of the round's n members, this rank's group (itself and the peers for
// which same holds) and the peers still open (neither same nor other),
// either none is open, or the group is more than half of the round, or
// it cannot reach half any more. Transport.mu held.
func (st *connectState) settledLocked(same, other func(p int) bool) bool {
	n := st.w.Size()
	k, open := 1, 0
	for p := range n {
		switch {
		case !st.peer(p):
		case same(p):
			k++
		case !other(p):
			open++
		}
	}
	return open == 0 || 2*k > n || 2*(k+open) < n
}

// authError builds the AuthError of a doomed Connect.
func (t *Transport) authError(st *connectState, a *authTally) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := &AuthError{Round: st.w.Round, Rank: st.w.Rank, Size: st.w.Size(), Err: a.first}
	for p := range st.w.Size() {
		switch {
		case !st.peer(p):
		case st.proved[p]:
			e.Proved = append(e.Proved, p)
		case a.failed[p]:
			e.Failed = append(e.Failed, p)
		}
	}
	return e
}
