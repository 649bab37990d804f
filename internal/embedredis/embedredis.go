// Package embedredis is the embedded Redis-protocol server whose key TTLs
// lapse in real time: miniredis, whose virtual TTL clock a ticker goroutine
// advances by the wall time elapsed. Package elastic/standalone serves it to
// users (a single-host job's store); internal/testredis falls back on it
// when no redis-server binary is on PATH. It lives here, below both, so
// that the test Redis launcher does not import a package of elastic.
package embedredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TickInterval is how often the ticker goroutine advances the TTL clock of the
// embedded server: a key with a TTL expires at most this late (10 ms).
const TickInterval = 10 * time.Millisecond

// ErrClosed is returned by Close when the server was already closed.
var ErrClosed = errors.New("standalone: server closed") // exported as standalone.ErrClosed

// Server is an embedded Redis-protocol server whose key TTLs lapse in real
// time. It is safe for concurrent use; Close must be called to release the
// listener and the ticker goroutine.
type Server struct {
	mr   *miniredis.Miniredis
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	closed bool
}

// Start starts an embedded server listening on addr ("host:port"). An empty
// addr or "127.0.0.1:0" picks a free loopback port; read it back with Addr.
// The ctx bounds only the start-up (it is checked before listening); the
// server runs until Close. Errors: the ctx error, or a listen error wrapped
// with the address.
func Start(ctx context.Context, addr string) (*Server, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("standalone: start: %w", err)
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("standalone: listen on %q: %w", addr, err)
	}
	s := &Server{mr: mr, stop: make(chan struct{}), done: make(chan struct{})}
	go s.tick()
	return s, nil
}

// tick advances the miniredis TTL clock by the wall time elapsed since the
// previous tick, so that TTLs set by clients lapse in real time.
func (s *Server) tick() {
	defer close(s.done)
	t := time.NewTicker(TickInterval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			// time.Now carries a monotonic reading, so the difference is
			// immune to wall-clock steps.
			cur := time.Now()
			if d := cur.Sub(last); d > 0 {
				s.mr.FastForward(d)
			}
			last = cur
		}
	}
}

// Addr returns the "host:port" the server listens on.
func (s *Server) Addr() string { return s.mr.Addr() }

// Close stops the ticker goroutine and the server and waits for both. Clients
// still connected see their connections closed. A second Close returns
// ErrClosed.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	s.mr.Close()
	return nil
}
