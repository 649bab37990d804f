package store

import (
	"errors"
	"fmt"
)

// The errors a store returns, wrapped in an *Error. Package elastic
// declares the same values under the same names (elastic.ErrBadState is
// ErrBadState), so errors.Is matches either.
var (
	// ErrBadState means the store returned data that does not parse (a
	// corrupted or foreign key, a wrong reply shape). Agents treat it like an
	// outage: they retry within the outage budget (a job state that does not
	// parse is replaced when the job re-forms), except ErrWrongType, which
	// wraps it.
	ErrBadState = errors.New("elastic: malformed store state")

	// ErrWrongType means a key of the job holds another Redis type than
	// the rendezvous uses (Redis answered WRONGTYPE: something else wrote
	// it); the message names the key. It wraps ErrBadState, but retrying
	// cannot help: the Agent fails at once with an error wrapping both it
	// and elastic.ErrStoreUnavailable (sticky, like an outage past its
	// budget). Delete the key, or run the job under another ID.
	ErrWrongType = fmt.Errorf("%w: a key of the job holds the wrong Redis type", ErrBadState)

	// ErrNoPermission means Redis refused a call of the job for want of
	// permission (a NOPERM answer: the client's ACL user may not run the
	// scripts, or touch one of the job's keys or its channel); the message
	// carries Redis' words, which name the command or key. No retry heals
	// it: the Agent fails at once with an error wrapping it and
	// elastic.ErrStoreUnavailable, like ErrWrongType. Grant the workers'
	// user the job's keys and channel (~et:{<job>}:*, &et:{<job>}:*) and
	// EVALSHA, EVAL and PUBLISH.
	ErrNoPermission = errors.New("elastic: Redis refused the job's call (no permission)")
)

// Error wraps a failed store call (network error, timeout, malformed
// reply) with the operation and job it concerned. errors.Is(err,
// ErrBadState) and the underlying network errors still match through
// Unwrap. Package elastic names it StoreError.
type Error struct {
	Op    string // store operation: "join", "check", "heartbeat", "report", "leave", "finish", "watch", "drop", "mark", "unmark"
	JobID string
	Err   error
}

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("elastic: store %s (job %q): %v", e.Op, e.JobID, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }
