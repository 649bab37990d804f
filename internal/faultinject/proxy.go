package faultinject

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy with network faults, placed on one link (a worker's
// connections to Redis, or the connections its peers open to its collective
// port). It forwards every accepted connection to Upstream and can, at any
// moment:
//
//   - add latency to every chunk of bytes, in both directions (SetLatency);
//   - limit the bandwidth of each direction of each connection (SetBandwidth);
//   - blackhole the link (SetBlackhole): bytes are held, not forwarded, and
//     new connections are accepted but not connected upstream, as in a
//     partition; when the blackhole lifts, held bytes flow on (as TCP
//     retransmission would deliver them after a short partition);
//   - cut the link (Cut): reset every open connection, and with
//     SetRefuse(true) reset new ones at once.
//
// With SetCapture(n) it keeps the first n bytes each new connection sent
// towards Upstream (used to replay a genuine handshake).
//
// A Proxy is safe for concurrent use. Close stops the listener and every
// connection and waits for all goroutines it started. It is a test tool: it
// trusts its configuration and never inspects the bytes it forwards.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu        sync.Mutex
	latency   time.Duration
	rate      int64 // bytes per second per direction; 0 = unlimited
	blackhole bool
	refuse    bool
	heal      chan struct{} // closed when the current blackhole lifts
	capN      int
	captured  [][]byte
	links     map[*link]struct{}
	isClosed  bool
	stats     ProxyStats

	closed chan struct{}
	wg     sync.WaitGroup
}

// ProxyStats counts what a Proxy did; see Proxy.Stats.
type ProxyStats struct {
	Accepted int   // connections accepted
	Refused  int   // connections reset at once (SetRefuse)
	Cut      int   // open connections reset by Cut
	Bytes    int64 // bytes forwarded, both directions
}

// NewProxy listens on listen ("127.0.0.1:0" picks a free port) and forwards
// each connection to upstream (host:port, dialled when the connection
// arrives). Errors: listen errors.
func NewProxy(listen, upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("faultinject: proxy listen %s: %w", listen, err)
	}
	heal := make(chan struct{})
	close(heal)
	p := &Proxy{ln: ln, upstream: upstream, heal: heal, links: map[*link]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr returns the proxy's listening address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream returns the address connections are forwarded to.
func (p *Proxy) Upstream() string { return p.upstream }

// SetLatency delays every chunk of bytes by d in each direction (0 = none).
// It applies to bytes read after the call.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

// SetBandwidth limits each direction of each connection to bytesPerSecond
// (0 = unlimited).
func (p *Proxy) SetBandwidth(bytesPerSecond int64) {
	p.mu.Lock()
	p.rate = max(bytesPerSecond, 0)
	p.mu.Unlock()
}

// SetBlackhole starts (true) or lifts (false) a blackhole: while it lasts,
// nothing is forwarded in either direction and new connections are held
// before their upstream dial.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on == p.blackhole {
		return
	}
	p.blackhole = on
	if on {
		p.heal = make(chan struct{})
	} else {
		close(p.heal)
	}
}

// SetRefuse makes the proxy reset (true) or forward (false) new connections.
func (p *Proxy) SetRefuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// SetCapture keeps the first n bytes that each connection accepted from now
// on sends towards Upstream (0 stops capturing). See Captured.
func (p *Proxy) SetCapture(n int) {
	p.mu.Lock()
	p.capN = max(n, 0)
	p.mu.Unlock()
}

// Captured returns copies of the bytes captured so far, one slice per
// connection, in order of arrival.
func (p *Proxy) Captured() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]byte, len(p.captured))
	for i, b := range p.captured {
		out[i] = append([]byte(nil), b...)
	}
	return out
}

// Cut resets every open connection (both sides see a reset, not a clean
// close) and returns how many it cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.stats.Cut += len(links)
	p.mu.Unlock()
	for _, l := range links {
		l.kill(true)
	}
	return len(links)
}

// Conns returns the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Heal lifts every fault: no latency, no bandwidth limit, no blackhole, no
// refusal. Open connections stay open.
func (p *Proxy) Heal() {
	p.SetLatency(0)
	p.SetBandwidth(0)
	p.SetRefuse(false)
	p.SetBlackhole(false)
}

// Stats returns counters of the proxy's work so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops accepting, closes every connection and waits for every
// goroutine of the proxy. Safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.isClosed {
		p.mu.Unlock()
		return nil
	}
	p.isClosed = true
	close(p.closed)
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.kill(false)
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (e.g. out of descriptors): back off a little.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
			case <-p.closed:
				t.Stop()
				return
			}
			continue
		}
		p.mu.Lock()
		if p.isClosed {
			p.mu.Unlock()
			c.Close()
			return
		}
		if p.refuse {
			p.stats.Refused++
			p.mu.Unlock()
			reset(c)
			continue
		}
		p.stats.Accepted++
		l := &link{p: p, client: c, done: make(chan struct{})}
		if p.capN > 0 {
			l.capLeft = p.capN
			l.capIdx = len(p.captured)
			p.captured = append(p.captured, nil)
		}
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

// reset closes c with an RST (linger 0) when it is a TCP connection.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// link is one proxied connection: client <-> upstream.
type link struct {
	p        *Proxy
	client   net.Conn
	mu       sync.Mutex
	upstream net.Conn
	dead     bool
	done     chan struct{}
	capLeft  int
	capIdx   int
}

// waitOpen blocks while the proxy is blackholed; false when the link or
// proxy died meanwhile.
func (l *link) waitOpen() bool {
	for {
		l.p.mu.Lock()
		heal := l.p.heal
		l.p.mu.Unlock()
		select {
		case <-heal:
			l.p.mu.Lock()
			open := !l.p.blackhole
			l.p.mu.Unlock()
			if open {
				return true
			}
		case <-l.done:
			return false
		}
	}
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer func() {
		l.p.mu.Lock()
		delete(l.p.links, l)
		l.p.mu.Unlock()
	}()
	if !l.waitOpen() {
		l.kill(false)
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	up, err := d.Dial("tcp", l.p.upstream)
	if err != nil {
		l.kill(true)
		return
	}
	l.mu.Lock()
	if l.dead {
		l.mu.Unlock()
		up.Close()
		return
	}
	l.upstream = up
	l.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pipe(l.client, up, true) }()
	go func() { defer wg.Done(); l.pipe(up, l.client, false) }()
	wg.Wait()
	l.kill(false)
}

// kill closes both sides (with a reset when rst) once.
func (l *link) kill(rst bool) {
	l.mu.Lock()
	if l.dead {
		l.mu.Unlock()
		return
	}
	l.dead = true
	close(l.done)
	up := l.upstream
	l.mu.Unlock()
	if rst {
		reset(l.client)
		if up != nil {
			reset(up)
		}
		return
	}
	l.client.Close()
	if up != nil {
		up.Close()
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through the link's faults: a reader goroutine
// stamps chunks, this goroutine delivers them after the latency, within the
// bandwidth, and only while no blackhole is on. At EOF it half-closes dst
// once every chunk is delivered.
func (l *link) pipe(src, dst net.Conn, toUpstream bool) {
	q := make(chan chunk, 64)
	go func() {
		defer close(q)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if toUpstream {
					l.capture(buf[:n])
				}
				select {
				case q <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		for range q { // let the reader finish (the link is dead or src hit EOF)
		}
	}()
	for c := range q {
		if !l.waitOpen() {
			return
		}
		l.p.mu.Lock()
		lat, rate := l.p.latency, l.p.rate
		l.p.mu.Unlock()
		if wait := time.Until(c.at.Add(lat)); wait > 0 && !l.sleep(wait) {
			return
		}
		if !l.waitOpen() {
			return
		}
		for len(c.b) > 0 {
			n := len(c.b)
			if rate > 0 {
				n = int(min(int64(n), max(rate/20, 1))) // 50 ms slices
			}
			if _, err := dst.Write(c.b[:n]); err != nil {
				l.kill(false)
				return
			}
			l.p.mu.Lock()
			l.p.stats.Bytes += int64(n)
			l.p.mu.Unlock()
			c.b = c.b[n:]
			if rate > 0 && !l.sleep(time.Duration(float64(n)/float64(rate)*float64(time.Second))) {
				return
			}
		}
	}
	// src is done: pass the end of stream on.
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		l.kill(false)
	}
}

func (l *link) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.done:
		return false
	}
}

func (l *link) capture(b []byte) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.capLeft <= 0 {
		return
	}
	n := min(len(b), l.capLeft)
	l.p.captured[l.capIdx] = append(l.p.captured[l.capIdx], b[:n]...)
	l.capLeft -= n
}
