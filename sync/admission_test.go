package sync

import (
	"container/list"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// flood holds silent connections to one address, dialed from a given
// loopback address.
type flood struct {
	conns []net.Conn
}

func (f *flood) open(t *testing.T, from, to string, n int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	for range n {
		c, err := d.Dial("tcp", to)
		if err != nil {
			t.Fatalf("flood connection %d from %s: %v", len(f.conns), from, err)
		}
		f.conns = append(f.conns, c)
	}
}

func (f *flood) close() {
	for _, c := range f.conns {
		c.Close()
	}
}

// fakeClock moves a Transport's clock of connection ages.
type fakeClock struct{ off atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *fakeClock) advance(d time.Duration) { c.off.Add(int64(d)) }

func withClock(tr *Transport) *fakeClock {
	c := &fakeClock{}
	tr.mu.Lock()
	tr.now = c.now
	tr.mu.Unlock()
	return c
}

func tcpConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.LocalSockets = false // peers dial 127.0.0.1 over TCP, like a flood would
	cfg.HandshakeTimeout = time.Minute
	return cfg
}

func connectTwo(t *testing.T, a, b *Transport, round uint64) {
	t.Helper()
	ra, rb, ea, eb := connectPair(a, b, round, round)
	if ea != nil || eb != nil {
		t.Fatalf("Connect: %v / %v", ea, eb)
	}
	ra.Close()
	rb.Close()
}

// needLoopback2 skips where 127.0.0.2 is not a loopback address (Linux
// routes all of 127/8 to loopback; macOS does not by default).
func needLoopback2(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on this host: %v", err)
	}
	ln.Close()
}

// A flood of silent connections from another address holds more than that
// address's share: once they are parkMinAge old the oldest silent ones are
// parked (held open, unread), whether or not more connections arrive;
// nothing is closed, and the job's peers connect as if nothing happened.
func TestSilentFloodFromAnotherAddressIsParked(t *testing.T) {
	needLoopback2(t)
	cfg := tcpConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	clock := withClock(a)
	var f flood
	defer f.close()
	f.open(t, "127.0.0.2", a.Addr(), maxPendingPerAddr+100)
	// Every connection admitted before the clock moves: a Dial returns
	// once the kernel completed the handshake, maybe before the Transport
	// accepted it, and one admitted after the advance is young, so the
	// second flood below would find fewer old ones to park in its place.
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Unauthenticated == maxPendingPerAddr+100 })
	clock.advance(time.Second) // the flood is older than parkMinAge now
	waitFor(t, 10*time.Second, func() bool {
		st := a.Stats()
		return st.Unauthenticated == maxPendingPerAddr+100 && st.Parked == 100
	})
	f.open(t, "127.0.0.2", a.Addr(), 100)
	total := maxPendingPerAddr + 200
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Unauthenticated == total })
	st := a.Stats()
	if st.Parked != uint64(total-maxPendingPerAddr) || st.Evicted != 0 {
		t.Fatalf("stats %+v: want %d parked, none closed", st, total-maxPendingPerAddr)
	}
	if pending, _ := admissionOf(a, "127.0.0.2"); len(pending) != maxPendingPerAddr {
		t.Fatalf("%d connections of the flood read at once, want its share %d", len(pending), maxPendingPerAddr)
	}
	connectTwo(t, a, b, 1)
	connectTwo(t, b, a, 2) // a accepts as the higher rank too
}

// On one host a flood shares 127.0.0.1 with the job's peers, and may exhaust
// the Transport's bound on open unauthenticated connections (set by the
// open-file limit; lowered here): a new connection is still always let in,
// the oldest parked one making room, so the peers are never shut out.
func TestSameAddressFloodNeverShutsPeersOut(t *testing.T) {
	cfg := tcpConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	clock := withClock(a)
	const limit = 300
	a.mu.Lock()
	a.adm.limit = limit
	a.mu.Unlock()
	var f flood
	defer f.close()
	f.open(t, "127.0.0.1", a.Addr(), 250)
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Unauthenticated == 250 })
	clock.advance(time.Second)
	f.open(t, "127.0.0.1", a.Addr(), 250)
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Evicted == 200 })
	if st := a.Stats(); st.Unauthenticated != limit {
		t.Fatalf("stats %+v: want the bound of %d held", st, limit)
	}
	connectTwo(t, a, b, 1)
	connectTwo(t, b, a, 2)
	// The connections closed were the oldest parked ones: the first
	// flood connections see their end, the last ones are still open.
	for i, c := range []net.Conn{f.conns[0], f.conns[len(f.conns)-1]} {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		closed := err != nil && !isTimeout(err)
		if closed != (i == 0) {
			t.Errorf("flood connection %d: read %v", i, err)
		}
	}
}

// A connection that sends nothing is parked at the handshake timeout and
// closed once its hold is over (a minute or so; shortened here).
func TestSilentConnectionParkedAtHandshakeTimeoutThenClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.HandshakeTimeout = 100 * time.Millisecond
	a := listenOne(t, cfg)
	a.mu.Lock()
	a.adm.hold = 300 * time.Millisecond
	a.mu.Unlock()
	c, err := net.Dial("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Parked == 1 })
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); isTimeout(err) || err == nil {
		t.Fatalf("read: %v, want the connection closed by the worker", err)
	}
	waitFor(t, 5*time.Second, func() bool { return a.Stats().Unauthenticated == 0 })
	if st := a.Stats(); st.Evicted != 1 || st.Refused != 0 {
		t.Fatalf("stats %+v: want the silent connection parked, then closed", st)
	}
}

// A connection parked to make room is closed once its hold is over.
func TestParkedConnectionExpires(t *testing.T) {
	needLoopback2(t)
	cfg := tcpConfig(t)
	a := listenOne(t, cfg)
	clock := withClock(a)
	const share = 4
	a.mu.Lock()
	a.adm.share = [2]int{share, share}
	a.adm.hold = 500 * time.Millisecond
	a.mu.Unlock()
	var f flood
	defer f.close()
	f.open(t, "127.0.0.2", a.Addr(), share)
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Unauthenticated == share })
	clock.advance(time.Second)
	f.open(t, "127.0.0.2", a.Addr(), 1)
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Parked >= 1 })
	c := f.conns[0] // the oldest: parked
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); isTimeout(err) || err == nil {
		t.Errorf("parked connection: read %v, want it closed", err)
	}
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Evicted == 1 })
	if st := a.Stats(); st.Parked != 1 || st.Unauthenticated != share {
		t.Fatalf("stats %+v: want one parked and closed, the others still read", st)
	}
}

// A peer that begins its handshake is never parked, however old it is.
func TestParkingSkipsConnectionsWithBytes(t *testing.T) {
	needLoopback2(t)
	cfg := tcpConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	clock := withClock(a)
	var f flood
	defer f.close()
	f.open(t, "127.0.0.2", a.Addr(), maxPendingPerAddr)
	waitFor(t, 10*time.Second, func() bool { return a.Stats().Unauthenticated == maxPendingPerAddr })
	// One of the old connections sends a byte of a hello: it is read, not
	// parked, and stays in the handshake until its timeout.
	if _, err := f.conns[0].Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Second)
	f.open(t, "127.0.0.2", a.Addr(), 1)
	// The one with a byte may be parked for an instant (its goroutine
	// read the byte just before the park looked for it) and taken back
	// at once; its address then makes room from its silent ones.
	talker := f.conns[0].LocalAddr().String()
	waitFor(t, 10*time.Second, func() bool {
		pending, parked := admissionOf(a, "127.0.0.2")
		c, ok := find(pending, talker)
		return len(pending) == maxPendingPerAddr && len(parked) == 1 && ok && c.active
	})
	_, parked := admissionOf(a, "127.0.0.2")
	if parked[0].remote != f.conns[1].LocalAddr().String() {
		t.Fatalf("parked %v, want the second-oldest connection %v", parked[0].remote, f.conns[1].LocalAddr())
	}
	connectTwo(t, b, a, 1)
}

// admittedConn is what a test reads of an inConn while the Transport's lock
// is held.
type admittedConn struct {
	remote         string
	parked, active bool
}

// admissionOf returns, copied under tr's lock, the connections of the remote
// address addr that are read for their handshake and every parked
// connection, oldest first. It never fails while the lock is held: a test
// that dies holding it leaves its cleanup's Close waiting for the lock
// until the test binary times out (with the serveConn goroutines all
// blocked behind it).
func admissionOf(tr *Transport, addr string) (pending, parked []admittedConn) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	read := func(l *list.List) []admittedConn {
		var out []admittedConn
		for el := l.Front(); el != nil; el = el.Next() {
			if e, ok := el.Value.(*inConn); ok {
				out = append(out, admittedConn{remote: e.c.RemoteAddr().String(), parked: e.parked, active: e.active})
			}
		}
		return out
	}
	if a := tr.adm.addrs[addr]; a != nil {
		pending = read(&a.pending)
	}
	return pending, read(&tr.adm.parked)
}

// find returns the connection of cs from remote.
func find(cs []admittedConn, remote string) (admittedConn, bool) {
	for _, c := range cs {
		if c.remote == remote {
			return c, true
		}
	}
	return admittedConn{}, false
}

// A dialer whose hello goes unanswered (the listener parked the connection,
// or hangs) redials after the handshake timeout instead of waiting for the
// whole DialTimeout on one connection.
func TestDialerRedialsAListenerThatDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int64
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			held = append(held, c) // never answered
		}
	}()
	cfg := tcpConfig(t)
	cfg.DialTimeout = 2 * time.Second
	cfg.HandshakeTimeout = 100 * time.Millisecond
	a := listenOne(t, cfg)
	_, err = a.Connect(t.Context(), World{Round: 1, Rank: 0, Addrs: []string{a.Addr(), ln.Addr().String()}})
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("Connect: %v, want ErrTimeout", err)
	}
	ln.Close()
	<-done
	for _, c := range held {
		c.Close()
	}
	// Rank 0 dials four connections (control, mesh, two lanes); without
	// redials the listener would see exactly those.
	if n := accepted.Load(); n <= 4 {
		t.Errorf("%d connections reached the silent listener, want redials beyond the first 4", n)
	}
}
