package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// forwarder is one Forward: a listener on the gateway and the connections
// it relays. Net.Close closes it and waits for its goroutines.
type forwarder struct {
	ln       net.Listener
	upstream string
	wg       sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Forward makes a service of the caller's namespace (one the hosts cannot
// reach, such as a server on 127.0.0.1) reachable from every host: it
// listens on a free port of the Gateway and relays each connection, byte
// for byte both ways, to upstream (host:port, dialled from the caller's
// namespace within 5 s of each connection's arrival). It returns the
// address the hosts dial (Gateway:port). The relay runs until Close.
// Errors: a closed Net, or the listen error.
func (n *Net) Forward(upstream string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return "", errors.New("netns: Forward on a closed Net")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(n.gateway.String(), "0"))
	if err != nil {
		return "", fmt.Errorf("netns: forward to %s: %w", upstream, err)
	}
	f := &forwarder{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	n.forwards = append(n.forwards, f)
	f.wg.Add(1)
	go f.accept(n.life)
	return ln.Addr().String(), nil
}

func (f *forwarder) accept(life context.Context) {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (out of descriptors, say): back off a little.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
			case <-life.Done():
				t.Stop()
				return
			}
			continue
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go f.relay(life, c)
	}
}

// track registers c for Close; false once closed.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

// relay copies between the host's connection c and a new connection to
// the upstream, both ways, until both directions have ended: the end of
// one direction (EOF) is passed on as a half-close (CloseWrite), and an
// error in either ends both.
func (f *forwarder) relay(life context.Context, c net.Conn) {
	defer f.wg.Done()
	defer f.untrack(c)
	ctx, cancel := context.WithTimeout(life, 5*time.Second)
	up, err := (&net.Dialer{}).DialContext(ctx, "tcp", f.upstream)
	cancel()
	if err != nil {
		return // the host sees its connection closed
	}
	if !f.track(up) {
		up.Close()
		return
	}
	defer f.untrack(up)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		if _, err := io.Copy(dst, src); err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
				return
			}
		}
		c.Close() // ends the other direction's copy too
		up.Close()
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// close stops the listener and every relayed connection, and waits for
// the forwarder's goroutines.
func (f *forwarder) close() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.ln.Close()
	f.wg.Wait()
}
