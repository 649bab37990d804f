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
	"net"
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
	mr       *miniredis.Miniredis
	ln       net.Listener
	stop     chan struct{}
	done     chan struct{} // the ticker returned
	accepted chan struct{} // the accept loop returned

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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("standalone: listen on %q: %w", addr, err)
	}
	// miniredis without a listener of its own (its first Dial starts it
	// so): the accept loop hands it each connection behind a guardConn.
	mr := miniredis.NewMiniRedis()
	c, err := mr.Dial()
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("standalone: start: %w", err)
	}
	c.Close()
	s := &Server{mr: mr, ln: ln, stop: make(chan struct{}), done: make(chan struct{}), accepted: make(chan struct{})}
	go s.tick()
	go s.accept()
	return s, nil
}

// accept hands every connection to the server, until the listener closes.
// An error of Accept's own (out of file descriptors under a flood of
// connections) is waited out, 5 ms doubling to 1 s, as net/http's server does.
func (s *Server) accept() {
	defer close(s.accepted)
	srv := s.mr.Server()
	var wait time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			wait = min(max(2*wait, 5*time.Millisecond), time.Second)
			select {
			case <-s.stop:
				return
			case <-time.After(wait):
			}
			continue
		}
		wait = 0
		srv.ServeConn(&guardConn{Conn: c})
	}
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
func (s *Server) Addr() string { return s.ln.Addr().String() }

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
	s.ln.Close()
	<-s.accepted
	s.mr.Close() // closes the connections it serves, and waits for them
	return nil
}
