package sync

import (
	"container/list"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"time"
)

// Admission of incoming connections until they prove the job secret.
//
// Anyone who can reach a worker's port can open connections and send
// nothing (slowloris). The job's own peers must still get through at once,
// so the bound on connections in the handshake is never enforced by refusing
// the newest one: a new connection is always admitted, and when its remote
// address holds more than its share, or the Transport more than its bound,
// the oldest connection that has sent nothing yet makes room. A peer that
// dials sends its hello at once, so it is never the oldest silent
// connection for long; what makes room is the flood.
//
// Making room does not close a silent connection (a flooder would reconnect
// at once, and each reconnection costs both sides CPU, and may overflow the
// kernel's accept queue that the peers share): it is parked, held open
// without a goroutine or a buffer, and closed parkHold after it was
// accepted (with jitter, so a flood's connections do not all come back at
// the same instant). A connection still silent at the handshake timeout is
// parked too. Only when the open connections reach the bound set by the
// process's file descriptor limit is the oldest parked one closed early.
//
// Shares are per remote address: an IPv4 address, an IPv6 /64, or all Unix
// socket peers together. Addresses the job trusts (hosts of a round this
// Transport connected, or that proved the secret before) get a larger share.
// On one host every peer and every local flooder share 127.0.0.1; there the
// rule that the oldest silent connection makes room is what keeps the peers
// going.
const (
	// maxPendingPerAddr and maxPendingPerTrustedAddr bound the connections
	// of one remote address that are read for a handshake (one goroutine
	// each); over the bound the address's oldest silent one is parked.
	maxPendingPerAddr        = 256
	maxPendingPerTrustedAddr = 1024
	// maxPending bounds those connections over all addresses.
	maxPending = 8192
	// minUnauth and maxUnauth clamp the bound on open connections not yet
	// authenticated (read or parked): 3/4 of the open-file limit.
	minUnauth = 512
	maxUnauth = 32768
	// maxTrusted bounds the remembered trusted addresses.
	maxTrusted = 4096
	// evictScan bounds the connections examined to find a silent one.
	evictScan = 64
	// parkHold is how long a parked connection is held open after it was
	// accepted, plus a jitter of up to half as long.
	parkHold = time.Minute
	// parkMinAge is how long a connection may stay silent before newer
	// ones may push it into the park; a peer sends its hello within
	// microseconds of connecting, so only a flood's connections get this
	// old without a byte.
	parkMinAge = 250 * time.Millisecond
)

// inConn is an accepted connection that has not authenticated yet. Its
// fields are guarded by Transport.mu.
type inConn struct {
	c        net.Conn
	a        *addrConns
	at       time.Time     // accepted, by Transport.now
	born     time.Time     // accepted, by the wall clock
	deadline time.Time     // the handshake must be over by then
	parked   bool          // held unread; no goroutine reads it
	active   bool          // bytes arrived: it is being handshaken, never parked
	gone     bool          // no longer admitted: authenticated, closed or refused
	ae, ge   *list.Element // in a.pending or a.parked; in admission.pending or .parked
	expiry   *time.Timer   // closes it while parked
	rejected bool          // a refusal was written (owned by serveConn's goroutine)
}

// addrConns are the unauthenticated connections of one remote address.
type addrConns struct {
	key             string
	trusted         bool
	pending, parked list.List
	recheck         *time.Timer // armed while over its share with young connections
}

// admission is the Transport's table of unauthenticated connections,
// guarded by Transport.mu.
type admission struct {
	addrs           map[string]*addrConns
	pending, parked list.List     // every read / parked connection, oldest first
	limit           int           // bound on pending + parked
	share           [2]int        // bound on an untrusted / trusted address's pending
	hold            time.Duration // parkHold (tests shorten it)
	trusted         map[string]bool
}

func newAdmission() admission {
	limit := 16384
	if n := fdLimit(); n > 0 {
		limit = min(max(n*3/4, minUnauth), maxUnauth)
	}
	return admission{addrs: map[string]*addrConns{}, trusted: map[string]bool{}, limit: limit,
		share: [2]int{maxPendingPerAddr, maxPendingPerTrustedAddr}, hold: parkHold}
}

// addrKey is the share a remote address belongs to.
func addrKey(a net.Addr) string {
	switch a := a.(type) {
	case *net.TCPAddr:
		return ipKey(a.IP)
	case *net.UnixAddr:
		return "unix"
	}
	return "other"
}

func ipKey(ip net.IP) string {
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// trustLocked gives the address key a trusted share.
func (t *Transport) trustLocked(key string) {
	ad := &t.adm
	if !ad.trusted[key] && len(ad.trusted) < maxTrusted {
		ad.trusted[key] = true
	}
	if a := ad.addrs[key]; a != nil && ad.trusted[key] {
		a.trusted = true
	}
}

// trustWorldLocked trusts the hosts of a round's addresses.
func (t *Transport) trustWorldLocked(w World) {
	for i, addr := range w.Addrs {
		if i == w.Rank {
			continue
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			t.trustLocked(ipKey(ip))
		}
	}
}

// admit registers a newly accepted connection for its handshake and makes
// room for it; nil when the Transport is closed. The caller starts
// serveConn for it.
func (t *Transport) admit(c net.Conn) *inConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.isClosed {
		return nil
	}
	ad := &t.adm
	key := addrKey(c.RemoteAddr())
	a := ad.addrs[key]
	if a == nil {
		a = &addrConns{key: key, trusted: ad.trusted[key]}
		ad.addrs[key] = a
	}
	born := time.Now()
	e := &inConn{c: c, a: a, at: t.now(), born: born, deadline: born.Add(t.cfg.handshakeTimeout())}
	// Set before serveConn runs, so a park's deadline in the past always
	// wins over it.
	c.SetDeadline(e.deadline)
	e.ae, e.ge = a.pending.PushBack(e), ad.pending.PushBack(e)
	// Over its share, an address waits for its connections to reach
	// parkMinAge (a peer's hello arrives well within it); the global
	// bounds hold at once.
	t.enforceShareLocked(a, e)
	for ad.pending.Len() > min(maxPending, ad.limit) && !e.gone {
		t.makeRoomLocked(&ad.pending, e, true)
	}
	for ad.pending.Len()+ad.parked.Len() > ad.limit && !e.gone {
		if ad.parked.Len() > 0 {
			t.evictLocked(ad.parked.Front().Value.(*inConn))
		} else {
			t.makeRoomLocked(&ad.pending, e, true)
		}
	}
	return e
}

// enforceShareLocked parks or closes a's oldest connections while it holds
// more than its share; while the excess is too young for that, it checks
// again when the oldest reaches parkMinAge.
func (t *Transport) enforceShareLocked(a *addrConns, keep *inConn) {
	share := t.adm.share[0]
	if a.trusted {
		share = t.adm.share[1]
	}
	for a.pending.Len() > share && t.makeRoomLocked(&a.pending, keep, false) {
	}
	if a.pending.Len() <= share || a.recheck != nil {
		return
	}
	oldest := a.pending.Front().Value.(*inConn)
	d := max(parkMinAge-t.now().Sub(oldest.at), time.Millisecond)
	a.recheck = time.AfterFunc(d, func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		a.recheck = nil
		if !t.isClosed && t.adm.addrs[a.key] == a {
			t.enforceShareLocked(a, nil)
		}
	})
}

// makeRoomLocked makes room in l (an address's pending list, or the
// global one) for keep, the newest connection: it parks the oldest
// connection that has sent nothing for parkMinAge, else closes the oldest
// one that began its handshake over parkMinAge ago and has not finished it.
// With force it closes the oldest connection but keep when neither exists.
// It reports whether it made room.
func (t *Transport) makeRoomLocked(l *list.List, keep *inConn, force bool) bool {
	var oldest, stalled *inConn
	young := t.now().Add(-parkMinAge)
	n := 0
	for el := l.Front(); el != nil && n < evictScan; el = el.Next() {
		e := el.Value.(*inConn)
		if e == keep {
			continue
		}
		n++
		if oldest == nil {
			oldest = e
		}
		if e.at.After(young) {
			break // the rest are younger still
		}
		if !e.active {
			switch peek(e.c) {
			case peekData:
				e.active = true // its goroutine is about to read it
			case peekClosed:
				t.evictLocked(e)
				return true
			default:
				t.parkLocked(e)
				return true
			}
		}
		if stalled == nil {
			stalled = e
		}
	}
	switch {
	case stalled != nil:
		t.evictLocked(stalled)
	case force && oldest != nil:
		t.evictLocked(oldest)
	case force:
		t.evictLocked(keep) // nothing else to drop (cannot happen with sane bounds)
	default:
		return false
	}
	return true
}

// unlinkLocked removes e from the lists it is on (its address stays).
func (t *Transport) unlinkLocked(e *inConn) {
	ad := &t.adm
	if e.parked {
		e.a.parked.Remove(e.ae)
		ad.parked.Remove(e.ge)
	} else {
		e.a.pending.Remove(e.ae)
		ad.pending.Remove(e.ge)
	}
	if e.expiry != nil {
		e.expiry.Stop()
		e.expiry = nil
	}
}

// parkLocked stops reading e (its goroutine wakes from its read and leaves
// e to the park) and closes it hold after it was accepted, plus a jitter of
// up to half as long.
func (t *Transport) parkLocked(e *inConn) {
	t.unlinkLocked(e)
	e.parked = true
	e.ae, e.ge = e.a.parked.PushBack(e), t.adm.parked.PushBack(e)
	e.c.SetReadDeadline(time.Unix(1, 0))
	hold := t.adm.hold
	d := time.Until(e.born.Add(hold)) + rand.N(hold/2+1)
	e.expiry = time.AfterFunc(max(d, 0), func() { t.expire(e) })
	t.stats.Parked++
}

// unparkLocked takes e back for its handshake: its first bytes arrived as it
// was being parked.
func (t *Transport) unparkLocked(e *inConn) {
	t.unlinkLocked(e)
	e.parked = false
	e.ae, e.ge = e.a.pending.PushBack(e), t.adm.pending.PushBack(e)
}

// dropLocked removes e from admission without closing it (it authenticated,
// or its goroutine closes it).
func (t *Transport) dropLocked(e *inConn) {
	if e.gone {
		return
	}
	t.unlinkLocked(e)
	e.gone = true
	if a := e.a; a.pending.Len() == 0 && a.parked.Len() == 0 && t.adm.addrs[a.key] == a {
		delete(t.adm.addrs, a.key)
		if a.recheck != nil {
			a.recheck.Stop()
			a.recheck = nil
		}
	}
}

// evictLocked closes e to make room; its goroutine, if any, sees e.gone.
func (t *Transport) evictLocked(e *inConn) {
	if e.gone {
		return
	}
	t.dropLocked(e)
	e.c.Close()
	t.stats.Evicted++
}

// expire closes e if it is still parked.
func (t *Transport) expire(e *inConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e.parked && !e.gone {
		t.evictLocked(e)
	}
}

// shedOne closes the oldest parked connection, else the oldest silent one
// being read, to free a file descriptor; false if there is none.
func (t *Transport) shedOne() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el := t.adm.parked.Front(); el != nil {
		t.evictLocked(el.Value.(*inConn))
		return true
	}
	for el := t.adm.pending.Front(); el != nil; el = el.Next() {
		if e := el.Value.(*inConn); !e.active {
			t.evictLocked(e)
			return true
		}
	}
	return false
}

// closeAdmittedLocked closes every unauthenticated connection (Close).
func (t *Transport) closeAdmittedLocked() {
	for _, l := range []*list.List{&t.adm.parked, &t.adm.pending} {
		for l.Len() > 0 {
			e := l.Front().Value.(*inConn)
			t.dropLocked(e)
			e.c.Close()
		}
	}
}

// lingerTime bounds how long a refused connection is drained before it is
// closed.
const lingerTime = 250 * time.Millisecond

// lingerClose ends a connection after a refusal was written to it: it sends
// FIN and discards what the dialer still sends until it closes too (or
// lingerTime passes). Closing with unread input would send a reset, and a
// reset can make the dialer's kernel drop the refusal before it is read
// (a replayed handshake, for one, arrives with more bytes behind it).
func lingerClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(lingerTime))
	io.CopyN(io.Discard, c, 64<<10)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// prefixConn replays the bytes read to tell a silent connection from one
// that has begun its handshake.
type prefixConn struct {
	net.Conn
	p []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.p) > 0 {
		n := copy(b, c.p)
		c.p = c.p[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// peekResult says whether bytes wait on a connection.
type peekResult uint8

const (
	peekNone peekResult = iota // nothing yet (or unknown)
	peekData
	peekClosed
)
