package sync

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by this package wraps one of them (or
// a context error), so callers branch with errors.Is.
var (
	// ErrPeerLost: a rank of the round failed (its connection closed or reset,
	// or it aborted the operation). The error is a *PeerError naming the rank.
	ErrPeerLost = errors.New("sync: peer lost")
	// ErrAuth: the handshake's HMAC proof of the shared secret did not verify
	// (wrong or missing secret), on either side.
	ErrAuth = errors.New("sync: authentication failed")
	// ErrJobMismatch: the peer belongs to another job ID.
	ErrJobMismatch = errors.New("sync: job ID mismatch")
	// ErrRoundMismatch: the peer is in another round than the one asked for
	// (older rounds are refused), or is not the rank asked for in that round.
	ErrRoundMismatch = errors.New("sync: round mismatch")
	// ErrBadFrame: bytes from the network did not decode (bad magic, unknown
	// kind, a length over Config.MaxFrameBytes, a truncated frame or handshake).
	ErrBadFrame = errors.New("sync: bad frame")
	// ErrMismatch: ranks disagree on the operation (sequence number, kind,
	// reduction op, element type, buffer length or root). Reported on every rank.
	ErrMismatch = errors.New("sync: ranks disagree on the operation")
	// ErrClosed: the Ring, Transport or local Synchronizer was closed.
	ErrClosed = errors.New("sync: closed")
	// ErrTimeout: an operation did not complete within Config.OpTimeout, or
	// Connect did not form the round within Config.DialTimeout.
	ErrTimeout = errors.New("sync: timeout")
	// ErrAborted: a rank aborted the operation (its context was cancelled or
	// it was closed in the middle of an operation).
	ErrAborted = errors.New("sync: aborted")
	// ErrInvalid: an argument is out of range (unknown Op, root outside the
	// world, buffers of the wrong length, a bad World or Config).
	ErrInvalid = errors.New("sync: invalid argument")
)

// PeerError names the rank whose failure made an operation fail. Use
// errors.As to get the rank; errors.Is(err, ErrPeerLost) is true for every
// PeerError, and Err tells why (for example ErrAborted or ErrClosed wrapped
// with the connection error).
type PeerError struct {
	Rank  int    // the rank that failed, in Round
	Round uint64 // the round of the Ring
	Err   error  // the cause
}

// Error implements error. A rank that aborted on purpose (its context was
// cancelled, e.g. because the rendezvous moved on without a hung peer, or it
// was closed) is alive and says so: the message then reads "aborted", not
// "lost", so a log does not blame the rank that noticed the trouble.
func (e *PeerError) Error() string {
	if errors.Is(e.Err, ErrAborted) {
		return fmt.Sprintf("sync: rank %d of round %d aborted the operation: %v", e.Rank, e.Round, e.Err)
	}
	return fmt.Sprintf("sync: rank %d of round %d lost: %v", e.Rank, e.Round, e.Err)
}

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// Is reports true for ErrPeerLost.
func (e *PeerError) Is(target error) bool { return target == ErrPeerLost }
