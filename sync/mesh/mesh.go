// Package mesh is what a round of package sync's Transport hands a
// protocol: the round's membership (World), one authenticated stream to
// every other rank, the round's failure state, and the errors both report.
// The collectives (sync.Ring) and the parameter server
// (sync/paramserver) are protocols on it; neither reaches into the other's
// state, and a protocol sees the transport only through Mesh.
//
// It sits below sync so that a protocol package can be imported by sync
// (for its deprecated aliases) without an import cycle: sync.World,
// sync.PeerError and sync's sentinel errors are this package's, under the
// same names.
package mesh

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// Sentinel errors of package sync (sync.ErrPeerLost and the others are
// these values). Every error of a round wraps one of them (or a context
// error), so callers branch with errors.Is.
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
	// kind, a length over the frame limit, a truncated frame or handshake).
	ErrBadFrame = errors.New("sync: bad frame")
	// ErrMismatch: ranks disagree on the operation (sequence number, kind,
	// reduction op, element type, buffer length or root). Reported on every rank.
	ErrMismatch = errors.New("sync: ranks disagree on the operation")
	// ErrClosed: the round, Transport or local Synchronizer was closed.
	ErrClosed = errors.New("sync: closed")
	// ErrTimeout: an operation did not complete within the round's
	// OpTimeout, or a round was not formed within the dial timeout.
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
	Round uint64 // the round
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

// Aborted wraps a context's error (ctx.Err()) as this rank's abort: an
// error wrapping both ErrAborted and err.
func Aborted(err error) error { return fmt.Errorf("%w: %w", ErrAborted, err) }

// World is one round's membership as this rank sees it, a plain value that
// the rendezvous (package elastic) provides or a test builds by hand.
type World struct {
	JobID string   // the job; must equal the Transport's job ID (empty means that one)
	Round uint64   // the rendezvous generation; connections of older rounds are refused
	Rank  int      // this process's rank, 0 <= Rank < len(Addrs)
	Addrs []string // peer addresses (host:port, as from Transport.Addr) in rank order; world size = len(Addrs)
}

// Size returns the world size, len(w.Addrs).
func (w World) Size() int { return len(w.Addrs) }

// Validate checks the rank and addresses. Errors wrap ErrInvalid.
func (w World) Validate() error {
	if len(w.Addrs) == 0 {
		return fmt.Errorf("%w: world has no addresses", ErrInvalid)
	}
	if w.Rank < 0 || w.Rank >= len(w.Addrs) {
		return fmt.Errorf("%w: rank %d outside world size %d", ErrInvalid, w.Rank, len(w.Addrs))
	}
	if len(w.Addrs) > 1<<16 {
		return fmt.Errorf("%w: world size %d exceeds %d", ErrInvalid, len(w.Addrs), 1<<16)
	}
	for i, a := range w.Addrs {
		if a == "" && i != w.Rank {
			return fmt.Errorf("%w: empty address for rank %d", ErrInvalid, i)
		}
	}
	return nil
}

// Reason says why a rank failed a round; the other ranks learn it from
// the abort notice Mesh.Fail sends.
type Reason uint8

// Failure reasons.
const (
	// ReasonNone fails the round here without telling the peers.
	ReasonNone Reason = 0
	// ReasonPeerLost: the blamed rank's connection failed.
	ReasonPeerLost Reason = Reason(wire.ReasonPeerLost)
	// ReasonTimeout: this rank timed out waiting.
	ReasonTimeout Reason = Reason(wire.ReasonTimeout)
	// ReasonCanceled: this rank's context was cancelled, or it closed in the
	// middle of an operation.
	ReasonCanceled Reason = Reason(wire.ReasonCanceled)
	// ReasonProtocol: this rank saw a malformed or mismatched frame.
	ReasonProtocol Reason = Reason(wire.ReasonProtocol)
)

// VerdictGrace is how long a rank whose stream to a peer broke waits for
// the round's control connections to say which rank really failed (the
// peer may only have closed because a third rank died) before it blames
// that peer.
const VerdictGrace = 500 * time.Millisecond

// Stream is the connection to one peer: Conn for writing (and closing),
// Reader for reading. Reader may hold bytes the peer sent before the
// stream was handed over, so a protocol reads through it, never from Conn.
type Stream struct {
	Conn   net.Conn
	Reader *bufio.Reader
}

// Mesh is one formed round as a protocol sees it: what sync's
// Transport.ConnectMesh returns.
//
// Contract. Every rank of the World calls ConnectMesh for the same round;
// each gets a Mesh whose Stream(q) is an authenticated, round-checked
// connection to rank q. The Mesh's owner may first run the agreement
// methods (AllGather, Broadcast, Barrier: every rank the same calls in the
// same order) and then use the streams, which are then its own: the Mesh
// reads nothing from them any more. A protocol frames its own messages on
// the streams, must carry the round in each and refuse others.
//
// Failure. Fail records the first cause of failure (later causes are
// ignored; the first is returned), tells every other rank with an abort
// notice unless reason is ReasonNone, and closes the streams so every
// blocked read or write returns. Err is the recorded cause (nil while the
// round works); Dead is closed once there is one. A peer that left
// gracefully (closed its end with nothing in flight) is PeerClosed. The
// control connections keep watching the peers after the streams are
// handed over, so a dead rank fails the round on every rank without any
// stream traffic.
//
// Stream, Err, Dead, PeerClosed, Fail and Close are safe for concurrent
// use; the agreement methods are called from one goroutine. Close is a
// graceful leave when the agreement methods are idle; it waits for the
// Mesh's goroutines and is safe to call more than once.
type Mesh interface {
	// World returns the round's World (with JobID filled in).
	World() World
	// OpTimeout bounds every wait of an operation on the round (the
	// Transport's Config.OpTimeout).
	OpTimeout() time.Duration
	// MaxFrameBytes bounds a frame's payload (the Transport's
	// Config.MaxFrameBytes); a protocol refuses larger frames.
	MaxFrameBytes() int
	// Stream returns the stream to rank q; ok is false for this rank or a
	// rank outside the world.
	Stream(q int) (s Stream, ok bool)
	// AllGather leaves every rank's send (all of one length) in recv
	// (len(send)*Size bytes), in rank order.
	AllGather(ctx context.Context, send, recv []byte) error
	// Broadcast copies root's buf into buf on every rank.
	Broadcast(ctx context.Context, buf []byte, root int) error
	// Barrier returns once every rank entered it.
	Barrier(ctx context.Context) error
	// Fail breaks the round with cause (see the contract).
	Fail(cause error, reason Reason, blamed int) error
	// Err returns the cause that broke the round, or nil.
	Err() error
	// Dead is closed once the round is broken or closed.
	Dead() <-chan struct{}
	// PeerClosed reports whether rank q closed its end gracefully.
	PeerClosed(q int) bool
	// Close leaves the round and closes every stream.
	Close() error
}

// Dialer forms rounds: sync's *Transport is one.
type Dialer interface {
	// ConnectMesh forms round w (see sync.Transport.Connect for its errors)
	// and returns it as a Mesh.
	ConnectMesh(ctx context.Context, w World) (Mesh, error)
}
