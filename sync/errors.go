package sync

import (
	"fmt"
	"github.com/elastictrain/elastictrain/sync/mesh"
	"strings"
	"time"
)

// Sentinel errors. Every error returned by this package wraps one of them (or
// a context error), so callers branch with errors.Is. They are package
// mesh's (the surface a round hands a protocol), so the parameter server's
// errors match them too.
var (
	// ErrPeerLost: a rank of the round failed (its connection closed or reset,
	// or it aborted the operation). The error is a *PeerError naming the rank.
	ErrPeerLost = mesh.ErrPeerLost
	// ErrAuth: the handshake's HMAC proof of the shared secret did not verify
	// (wrong or missing secret), on either side.
	ErrAuth = mesh.ErrAuth
	// ErrJobMismatch: the peer belongs to another job ID.
	ErrJobMismatch = mesh.ErrJobMismatch
	// ErrRoundMismatch: the peer is in another round than the one asked for
	// (older rounds are refused), or is not the rank asked for in that round.
	ErrRoundMismatch = mesh.ErrRoundMismatch
	// ErrBadFrame: bytes from the network did not decode (bad magic, unknown
	// kind, a length over Config.MaxFrameBytes, a truncated frame or handshake).
	ErrBadFrame = mesh.ErrBadFrame
	// ErrMismatch: ranks disagree on the operation (sequence number, kind,
	// reduction op, element type, buffer length or root). Reported on every rank.
	ErrMismatch = mesh.ErrMismatch
	// ErrClosed: the Ring, Transport or local Synchronizer was closed.
	ErrClosed = mesh.ErrClosed
	// ErrTimeout: an operation did not complete within Config.OpTimeout, or
	// Connect did not form the round within Config.DialTimeout.
	ErrTimeout = mesh.ErrTimeout
	// ErrAborted: a rank aborted the operation (its context was cancelled or
	// it was closed in the middle of an operation).
	ErrAborted = mesh.ErrAborted
	// ErrInvalid: an argument is out of range (unknown Op, root outside the
	// world, buffers of the wrong length, a bad World or Config).
	ErrInvalid = mesh.ErrInvalid
)

// PeerError names the rank whose failure made an operation fail (see
// mesh.PeerError). Use errors.As to get the rank; errors.Is(err,
// ErrPeerLost) is true for every PeerError.
type PeerError = mesh.PeerError

// TimeoutError is the error of a Ring operation that made no progress
// within Config.OpTimeout (or waited for busy peers past
// Config.BusyTimeout). errors.Is(err, ErrTimeout) is true for it; use
// errors.As for what the rank that gave up knew of its peers then:
// which were silent (neither waiting in the operation nor marked busy:
// hung, stopped, or slower than OpTimeout allows) and which were busy.
// Ranks that learn of the timeout from that rank's abort notice (directly
// or passed on by another rank) get the same verdict: the same From,
// Silent, Busy and Waited.
type TimeoutError struct {
	Round uint64 // the round of the Ring
	// From is the rank that gave up (this rank, or the one whose abort
	// notice reported it).
	From int
	// Silent lists the ranks, ascending, that were neither waiting in the
	// operation nor marked busy when it gave up; empty when it could tell
	// none (every peer waiting: a network fault, or a peer stopped inside
	// the operation).
	Silent []int
	// Busy lists the ranks that were marked busy (Ring.Busy); non-empty
	// only when the wait for them outlasted Config.BusyTimeout.
	Busy []int
	// Waited is how long the operation had run, on rank From.
	Waited time.Duration
}

// Error implements error.
func (e *TimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v: rank %d of round %d gave up on an operation", ErrTimeout, e.From, e.Round)
	if e.Waited > 0 {
		fmt.Fprintf(&b, " after %v", e.Waited.Round(time.Millisecond))
	}
	if len(e.Busy) > 0 {
		fmt.Fprintf(&b, "; ranks %v were busy past BusyTimeout", e.Busy)
	}
	if len(e.Silent) > 0 {
		fmt.Fprintf(&b, "; silent (neither waiting in the operation nor marked busy: hung, stopped or too slow): ranks %v", e.Silent)
	} else if len(e.Busy) == 0 {
		b.WriteString("; every peer was waiting in the operation or unknown")
	}
	return b.String()
}

// Unwrap returns ErrTimeout.
func (e *TimeoutError) Unwrap() error { return ErrTimeout }
