package elastic

import (
	"errors"
	"fmt"

	"github.com/elastictrain/elastictrain/elastic/store"
)

var (
	// ErrFenced means this member was evicted (its lease lapsed, a peer
	// reported it failed, or it left) or acted under a round that is no longer
	// its own. The member can never act again: make a new Agent with a new
	// Member (NewMember) and join as a newcomer.
	ErrFenced = errors.New("elastic: member fenced (evicted); rejoin as a new member")

	// ErrJobFinished means some member called Finish for this job ID; the job
	// takes no more rounds.
	ErrJobFinished = errors.New("elastic: job finished")

	// ErrStoreUnavailable means the store could not be reached for longer
	// than Config.OutageBudget. It is sticky for the Agent: make a new Agent
	// once the store is back.
	ErrStoreUnavailable = errors.New("elastic: store unavailable past the outage budget")

	// ErrJoinTimeout means Join did not obtain a rank within
	// Config.JoinTimeout.
	ErrJoinTimeout = errors.New("elastic: join timed out")

	// ErrClosed means the Agent was closed, or left the job with Leave.
	ErrClosed = errors.New("elastic: agent closed")

	// ErrBadState means the store returned data that does not parse (a
	// corrupted or foreign key, a wrong reply shape): store.ErrBadState,
	// the same value. Agents treat it like an outage: they retry within the
	// outage budget, except ErrWrongType, which wraps it.
	ErrBadState = store.ErrBadState

	// ErrWrongType means a key of the job holds another Redis type than
	// the rendezvous uses: store.ErrWrongType, the same value. It wraps
	// ErrBadState, but retrying cannot help: the Agent fails at once with
	// an error wrapping both it and ErrStoreUnavailable (sticky, like an
	// outage past its budget). Delete the key, or run the job under
	// another ID.
	ErrWrongType = store.ErrWrongType

	// ErrNoPermission means Redis refused a call of the job for want of
	// permission (a NOPERM answer): store.ErrNoPermission, the same value.
	// No retry heals it: the Agent fails at once with an error wrapping it
	// and ErrStoreUnavailable, like ErrWrongType. Grant the workers' user
	// the job's keys and channel (~et:{<job>}:*, &et:{<job>}:*) and
	// EVALSHA, EVAL and PUBLISH.
	ErrNoPermission = store.ErrNoPermission
)

// permanent reports whether a store error is one no retry heals: the
// Agent fails at once instead of spending its outage budget.
func permanent(err error) bool {
	return errors.Is(err, ErrWrongType) || errors.Is(err, ErrNoPermission)
}

// permanentError is the Agent's sticky error for a store failure that no
// retry heals (ErrWrongType, ErrNoPermission): it reads as its cause and matches both the
// cause and ErrStoreUnavailable, which callers already stop on.
type permanentError struct{ err error }

func (e *permanentError) Error() string {
	return fmt.Sprintf("elastic: store unusable, not retried: %v", e.err)
}

func (e *permanentError) Unwrap() []error { return []error{ErrStoreUnavailable, e.err} }

// StoreError wraps a failed store call (network error, timeout, malformed
// reply) with the operation and job it concerned: the stores' error type,
// store.Error. errors.Is(err, ErrBadState) and the underlying network
// errors still match through Unwrap.
type StoreError = store.Error
