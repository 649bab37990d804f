package standalone

import (
	"context"

	"github.com/elastictrain/elastictrain/internal/embedredis"
)

// TickInterval is how often the ticker goroutine advances the TTL clock of the
// embedded server: a key with a TTL expires at most this late (10 ms).
const TickInterval = embedredis.TickInterval

// ErrClosed is returned by Close when the server was already closed.
var ErrClosed = embedredis.ErrClosed

// Server is an embedded Redis-protocol server whose key TTLs lapse in real
// time. It is safe for concurrent use; Close must be called to release the
// listener and the ticker goroutine.
type Server struct {
	s *embedredis.Server
}

// Start starts an embedded server listening on addr ("host:port"). An empty
// addr or "127.0.0.1:0" picks a free loopback port; read it back with Addr.
// The ctx bounds only the start-up (it is checked before listening); the
// server runs until Close. Errors: the ctx error, or a listen error wrapped
// with the address.
func Start(ctx context.Context, addr string) (*Server, error) {
	s, err := embedredis.Start(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &Server{s: s}, nil
}

// Addr returns the "host:port" the server listens on.
func (s *Server) Addr() string { return s.s.Addr() }

// Close stops the ticker goroutine and the server and waits for both. Clients
// still connected see their connections closed. A second Close returns
// ErrClosed.
func (s *Server) Close() error { return s.s.Close() }
