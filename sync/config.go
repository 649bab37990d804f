package sync

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Config holds the settings of a Transport and the Rings it connects.
// Start from DefaultConfig; Listen calls Validate. JobID, Secret,
// ChunkBytes, DirectBytes, Streams and Hierarchy must be equal on every
// rank of a job (they shape the wire traffic). Every connection's
// handshake checks them: another JobID or Secret fails Connect with
// ErrJobMismatch or an *AuthError; another ChunkBytes (compared rounded
// down to a multiple of 8), DirectBytes, Streams or Hierarchy, sent only
// once the peer proved the secret, fails Connect on both ends as soon as
// the ranks' layouts are known (at most LayoutGrace, not DialTimeout,
// after the first mismatch) with a *LayoutError
// (ErrLayoutMismatch) naming the setting, each rank's value as configured,
// and which ranks agree. The other fields may differ between ranks.
type Config struct {
	// JobID names the job; a connection from another job is refused
	// (ErrJobMismatch). Required; at most 255 bytes.
	JobID string
	// Secret is the job's shared secret; every connection proves knowledge
	// of it with HMAC-SHA256 over fresh nonces (ErrAuth if not). Required,
	// at least 16 bytes; 32 random bytes are recommended.
	Secret []byte
	// DialTimeout bounds Connect: forming every connection of a round,
	// including waiting for peers that reach Connect later. Default 30 s.
	DialTimeout time.Duration
	// HoldTimeout is how long an authenticated connection for a future round
	// is held waiting for this rank's Connect of that round before it is
	// refused as not ready (the dialer retries until its DialTimeout).
	// Default 10 s.
	HoldTimeout time.Duration
	// HandshakeTimeout bounds the accepting side of a handshake: a
	// connection that has begun its handshake and not proved the job
	// secret this long after it was accepted is closed; one that sent
	// nothing is parked then (held open unread, and closed a minute or so
	// after it was accepted; see Transport). Peers send their first
	// handshake message as soon as they connect. Zero means the default,
	// 5 s, or DialTimeout if that is shorter.
	HandshakeTimeout time.Duration
	// OpTimeout bounds every collective operation on top of the context's
	// deadline: a peer that stops sending (hung, SIGSTOPped, partitioned)
	// turns into ErrTimeout after at most this long. It must also cover how
	// far ranks arrive apart at a collective (step-time skew). Default 60 s.
	//
	// Time a peer spends in a phase it marked busy (Ring.Busy; the trainer
	// marks data fetches, checkpoint writes, state transfer and the user's
	// trainer.Busy phases) does not count: while the ranks an operation
	// waits for are each either waiting in the same operation or marked
	// busy, the operation's deadline moves to OpTimeout after the last sign
	// of a busy peer, up to BusyTimeout. A rank that is neither (its loop
	// is stuck outside any marked phase) is named in the operation's
	// *TimeoutError (Silent) after OpTimeout.
	OpTimeout time.Duration
	// BusyTimeout bounds how long an operation waits for peers marked
	// busy, from the operation's start (at least OpTimeout): a marked
	// phase longer than this fails the operation with a *TimeoutError
	// naming the busy ranks. Zero means the default, 30 minutes.
	BusyTimeout time.Duration
	// ChunkBytes is the pipelining unit of the ring algorithms, in bytes
	// (rounded down to a multiple of 8). Default 256 KiB.
	ChunkBytes int
	// DirectBytes: buffers of at most this many bytes use the latency path
	// (one direct exchange between every pair of ranks over the mesh
	// connections) instead of the ring. It must fit the kernel's socket
	// buffers (writes of this size never block). Default 32 KiB.
	DirectBytes int
	// MaxFrameBytes bounds the payload of one frame read from the network,
	// in bytes; larger frames close the connection with ErrBadFrame. Must be
	// at least ChunkBytes and DirectBytes. Default 16 MiB.
	MaxFrameBytes int
	// Streams is the number of parallel connections (lanes) per ring link;
	// large buffers are split over them. Default 2.
	Streams int
	// LocalSockets lets ranks on the same host talk over Unix domain sockets
	// (Linux abstract namespace, named after the advertised address) instead
	// of loopback TCP; links between hosts stay TCP. Default true.
	LocalSockets bool
	// SharedMemory lets ring lanes between ranks on the same host (over
	// LocalSockets) carry their payloads through shared memory
	// (a sealed memfd passed over the socket) instead of the socket; headers
	// and credits stay on the socket. Linux amd64/arm64. Default true.
	SharedMemory bool
	// Hierarchy selects the allreduce of large buffers in rounds whose
	// ranks share hosts (see Hierarchy; hosts are told apart by the host
	// part of the advertised addresses). Default HierarchyAuto.
	Hierarchy Hierarchy
	// AdvertiseAddr is the address peers dial, returned by Transport.Addr
	// and advertised through the rendezvous: host:port, or a host alone
	// (or host:0), which takes the listener's port. Empty (the default)
	// means the listener's address, with an unspecified host (0.0.0.0,
	// ::) replaced by this host's address: the IPv4 address of the
	// interface that holds the default route, else the first IPv4 address
	// of an interface that is up and not loopback (link-local addresses
	// last), else such an IPv6 address, else 127.0.0.1. On a host with
	// several networks, set it (on Kubernetes: the pod IP, from
	// status.podIP).
	AdvertiseAddr string
	// ServerTLS, when set, wraps every accepted TCP connection in TLS;
	// ClientTLS, when set, wraps every dialed one (its ServerName defaults
	// to the peer's host: set it to the name in the job's certificate when
	// peers' addresses change, as pod IPs do). Set both or neither.
	// Connections over Unix sockets (LocalSockets: ranks on this host) are
	// not wrapped: they never leave the host, the secret's handshake
	// authenticates them, and they keep shared memory. Default nil (plain
	// TCP; the secret still authenticates but does not encrypt).
	ServerTLS, ClientTLS *tls.Config
	// Logger receives warnings (refused handshakes: the first 5 of every
	// 10 s one by one, then one line counting the rest) and debug messages.
	// Default: discard.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with the defaults documented on each field;
// JobID and Secret are left empty and must be set.
func DefaultConfig() Config {
	return Config{
		DialTimeout:   30 * time.Second,
		HoldTimeout:   10 * time.Second,
		OpTimeout:     60 * time.Second,
		BusyTimeout:   DefaultBusyTimeout,
		ChunkBytes:    256 << 10,
		DirectBytes:   32 << 10,
		MaxFrameBytes: 16 << 20,
		Streams:       2,
		LocalSockets:  true,
		SharedMemory:  true,
	}
}

// Validate reports the first invalid field with an error wrapping ErrInvalid.
func (c Config) Validate() error {
	switch {
	case c.JobID == "":
		return fmt.Errorf("%w: Config.JobID is empty", ErrInvalid)
	case len(c.JobID) > 255:
		return fmt.Errorf("%w: Config.JobID is %d bytes, at most 255", ErrInvalid, len(c.JobID))
	case len(c.Secret) < 16:
		return fmt.Errorf("%w: Config.Secret is %d bytes, want at least 16", ErrInvalid, len(c.Secret))
	case c.DialTimeout <= 0:
		return fmt.Errorf("%w: Config.DialTimeout %v must be positive", ErrInvalid, c.DialTimeout)
	case c.HoldTimeout <= 0:
		return fmt.Errorf("%w: Config.HoldTimeout %v must be positive", ErrInvalid, c.HoldTimeout)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("%w: Config.HandshakeTimeout %v is negative", ErrInvalid, c.HandshakeTimeout)
	case c.OpTimeout <= 0:
		return fmt.Errorf("%w: Config.OpTimeout %v must be positive", ErrInvalid, c.OpTimeout)
	case c.BusyTimeout < 0:
		return fmt.Errorf("%w: Config.BusyTimeout %v is negative", ErrInvalid, c.BusyTimeout)
	case c.ChunkBytes < 64:
		return fmt.Errorf("%w: Config.ChunkBytes %d, want at least 64", ErrInvalid, c.ChunkBytes)
	case c.DirectBytes < 0:
		return fmt.Errorf("%w: Config.DirectBytes %d is negative", ErrInvalid, c.DirectBytes)
	case c.MaxFrameBytes < c.ChunkBytes || c.MaxFrameBytes < c.DirectBytes:
		return fmt.Errorf("%w: Config.MaxFrameBytes %d is below ChunkBytes %d or DirectBytes %d", ErrInvalid, c.MaxFrameBytes, c.ChunkBytes, c.DirectBytes)
	case c.MaxFrameBytes > 1<<30:
		return fmt.Errorf("%w: Config.MaxFrameBytes %d exceeds 1 GiB", ErrInvalid, c.MaxFrameBytes)
	case c.Streams < 1 || c.Streams > 64:
		return fmt.Errorf("%w: Config.Streams %d, want 1..64", ErrInvalid, c.Streams)
	case (c.ServerTLS == nil) != (c.ClientTLS == nil):
		return fmt.Errorf("%w: set both Config.ServerTLS and Config.ClientTLS, or neither", ErrInvalid)
	case c.Hierarchy > maxHierarchy:
		return fmt.Errorf("%w: unknown Config.Hierarchy %v", ErrInvalid, c.Hierarchy)
	}
	return nil
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// defaultHandshakeTimeout is HandshakeTimeout when it is zero.
const defaultHandshakeTimeout = 5 * time.Second

func (c Config) handshakeTimeout() time.Duration {
	if c.HandshakeTimeout > 0 {
		return c.HandshakeTimeout
	}
	return min(defaultHandshakeTimeout, c.DialTimeout)
}

func (c Config) chunkBytes() int { return c.ChunkBytes &^ 7 }

// DefaultBusyTimeout is Config.BusyTimeout when it is zero.
const DefaultBusyTimeout = 30 * time.Minute

// busyTimeout is how long after its start an operation may wait for busy
// peers: BusyTimeout (or its default), at least OpTimeout.
func (c Config) busyTimeout() time.Duration {
	b := c.BusyTimeout
	if b <= 0 {
		b = DefaultBusyTimeout
	}
	return max(b, c.OpTimeout)
}
