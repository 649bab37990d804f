package sync

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"sort"
	"strings"
	gosync "sync"
	"time"
	"unsafe"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// keepAlive makes the kernel probe idle TCP connections, so that a peer
// whose host vanished (no FIN, no RST) is noticed on the control
// connections after about Idle + Count*Interval even between operations.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 5}

// maxHeld bounds the authenticated connections held for future rounds;
// connections over the bound are refused as not ready (the dialer retries).
// Connections that have not authenticated yet are bounded per remote address
// (see admission.go).
const maxHeld = 4096

// littleEndian is true on the hosts this package supports: the wire format
// is little-endian and buffers are sent as they lie in memory.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Transport owns this process's listener for its whole life and forms one
// Ring per round with Connect. Connections for a round this rank has not yet
// reached are authenticated and held (up to Config.HoldTimeout); connections
// for an older round are refused.
//
// Incoming connections that have not proved the secret yet are bounded per
// remote address and by the process's open-file limit without ever turning
// the newest away (see Config.HandshakeTimeout and TransportStats.Parked):
// a flood of silent connections cannot shut the job's peers out.
//
// A Transport is safe for concurrent use, but Connect calls must not overlap
// (one round at a time). Close stops every goroutine it started and closes
// the Rings it connected.
type Transport struct {
	// beforeRing, when set (by tests), runs in Connect once every
	// connection of the round is formed, before the Ring starts its loops.
	beforeRing func(World)

	cfg    Config
	log    *slog.Logger
	ln     net.Listener
	uln    net.Listener // Unix listener for same-host peers, or nil
	addr   string
	closed chan struct{}
	wg     gosync.WaitGroup

	mu         gosync.Mutex
	isClosed   bool
	haveRound  bool
	round      uint64
	connecting *connectState
	held       map[connKey]*heldConn
	adm        admission
	rings      map[*Ring]struct{}
	stats      TransportStats
	refuseLog  refuseLog
	lays       layoutBook       // layout mismatches of future rounds, the last round failed on one (layoutcheck.go)
	now        func() time.Time // the clock of connection ages and log intervals (tests move it)
}

// TransportStats counts handshakes; see Transport.Stats.
type TransportStats struct {
	Accepted         uint64 // incoming connections that passed the handshake and joined a round
	Refused          uint64 // incoming connections refused or lost during the handshake (any reason)
	RefusedAuth      uint64 // ... because a proof of the secret (or TLS) failed, on either side (ErrAuth)
	RefusedJob       uint64 // ... because the dialer is in another job (ErrJobMismatch)
	RefusedRound     uint64 // ... because of the round or rank (ErrRoundMismatch)
	RefusedMalformed uint64 // ... because a handshake message did not decode (ErrBadFrame)
	LastRefusal      error  // the most recent refusal, nil if none
	LastRefusedAt    time.Time
	// Parked counts connections that had sent nothing when newer ones
	// needed their room, or by their handshake timeout: they were held
	// open unread (no goroutine, no buffer) for about a minute.
	Parked uint64
	// Evicted counts unauthenticated connections closed to make room (over
	// the bound that the open-file limit sets) or closed while parked.
	Evicted uint64
	// Unauthenticated is how many accepted connections are in the
	// handshake or parked right now.
	Unauthenticated int
}

type connKey struct {
	round    uint64
	from, to int
	kind     uint8
	lane     int
}

// String names the connection for error messages.
func (k connKey) String() string {
	kind := "control"
	switch k.kind {
	case wire.ConnMesh:
		kind = "mesh"
	case wire.ConnLane:
		kind = fmt.Sprintf("lane %d", k.lane&0xff)
		switch k.lane >> 8 {
		case groupHost:
			kind += " of the host ring"
		case groupCross:
			kind += " of the ring between hosts"
		}
	}
	return fmt.Sprintf("%s connection from rank %d to rank %d", kind, k.from, k.to)
}

// refusal is a handshake refusal: the code goes on the wire, err to the log
// and the caller.
type refusal struct {
	code uint8
	err  error
	// payload, when set, is the MsgReject payload (code and text), for a
	// code whose text carries more than err's message.
	payload []byte
}

type decision struct {
	ref *refusal      // nil: accepted
	st  *connectState // where to deliver when accepted
}

type heldConn struct {
	key    connKey
	decide chan decision // capacity 1
}

type acceptedConn struct {
	key  connKey
	conn net.Conn
	err  error
}

type connectState struct {
	w      World
	expect map[connKey]bool // accepted slots; true once filled
	got    chan acceptedConn
	done   bool // under Transport.mu: Connect no longer takes deliveries
	// What this round's handshakes say about who holds the secret (see
	// AuthError), under Transport.mu: the ranks that proved it, in either
	// direction, and the ranks that a failed handshake accepted here
	// claimed to be (unverified: anyone can claim a rank).
	proved, claimed map[int]bool
	layout          layoutTally   // the peers' layouts met (see LayoutError)
	note            chan struct{} // capacity 1: proved, claimed or layout changed
}

func newConnectState(w World) *connectState {
	return &connectState{w: w, expect: map[connKey]bool{}, proved: map[int]bool{}, claimed: map[int]bool{}, note: make(chan struct{}, 1)}
}

func (st *connectState) peer(rank int) bool {
	return rank >= 0 && rank < st.w.Size() && rank != st.w.Rank
}

// provedLocked records that rank proved the secret; Transport.mu held.
func (st *connectState) provedLocked(rank int) {
	if st.peer(rank) && !st.proved[rank] {
		st.proved[rank] = true
		notify(st.note)
	}
}

// claimAuthFailure records, for the Connect in progress, that a dialer
// claiming a rank of its round failed authentication with this rank.
func (t *Transport) claimAuthFailure(h wire.Hello) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.connecting
	if st == nil || h.Round != st.w.Round || int(h.To) != st.w.Rank || !st.peer(int(h.From)) || st.claimed[int(h.From)] {
		return
	}
	st.claimed[int(h.From)] = true
	notify(st.note)
}

// noteProved records that the peer this rank dialed proved the secret.
func (t *Transport) noteProved(st *connectState, rank int) {
	t.mu.Lock()
	st.provedLocked(rank)
	t.mu.Unlock()
}

// Listen starts listening on addr (host:port; port 0 picks a free port;
// host 0.0.0.0 or empty listens on every address of the host) for the
// whole life of the process and returns the Transport, whose Addr is what
// peers dial (see Config.AdvertiseAddr). With
// cfg.LocalSockets on Linux it also listens on an abstract Unix socket named
// after the advertised address, for peers on the same host. The context
// bounds only the listen call. Errors: cfg.Validate errors (ErrInvalid),
// listen errors.
func Listen(ctx context.Context, addr string, cfg Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !littleEndian {
		return nil, fmt.Errorf("%w: package sync supports little-endian hosts only", ErrInvalid)
	}
	lc := net.ListenConfig{KeepAliveConfig: keepAlive}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sync: listen %s: %w", addr, err)
	}
	t := &Transport{
		cfg:    cfg,
		log:    cfg.logger(),
		ln:     ln,
		closed: make(chan struct{}),
		held:   make(map[connKey]*heldConn),
		adm:    newAdmission(),
		now:    time.Now,
		rings:  make(map[*Ring]struct{}),
	}
	if t.addr, err = advertisedAddr(cfg.AdvertiseAddr, ln.Addr().(*net.TCPAddr)); err != nil {
		ln.Close()
		return nil, err
	}
	if cfg.LocalSockets && runtime.GOOS == "linux" {
		uln, err := lc.Listen(ctx, "unix", localSocketName(t.addr))
		if err != nil {
			t.log.Warn("sync: no Unix socket for same-host peers; using TCP", "addr", t.addr, "err", err)
		} else {
			t.uln = uln
		}
	}
	t.wg.Add(1)
	go t.acceptLoop(t.ln)
	if t.uln != nil {
		t.wg.Add(1)
		go t.acceptLoop(t.uln)
	}
	return t, nil
}

// localSocketName is the abstract Unix socket of the transport advertising addr.
func localSocketName(addr string) string { return "@elastictrain-sync/" + addr }

// Addr returns the address peers should dial (host:port), to be advertised
// through the rendezvous.
func (t *Transport) Addr() string { return t.addr }

// Stats returns handshake counters, for monitoring and tests.
func (t *Transport) Stats() TransportStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	st.Unauthenticated = t.adm.pending.Len() + t.adm.parked.Len()
	return st
}

// Close stops the listeners, refuses connections being handshaken or held,
// closes every Ring this Transport connected and waits for all their
// goroutines. Safe to call more than once.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.isClosed {
		t.mu.Unlock()
		return nil
	}
	t.isClosed = true
	close(t.closed)
	t.closeAdmittedLocked()
	rings := make([]*Ring, 0, len(t.rings))
	for r := range t.rings {
		rings = append(rings, r)
	}
	t.mu.Unlock()
	t.ln.Close()
	if t.uln != nil {
		t.uln.Close()
	}
	for _, r := range rings {
		r.Close()
	}
	t.wg.Wait()
	// The refusals not logged one by one, up to the last handshake's.
	t.mu.Lock()
	summary := t.takeSummaryLocked()
	t.mu.Unlock()
	t.logSummary(summary)
	return nil
}

func (t *Transport) acceptLoop(ln net.Listener) {
	defer t.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-t.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if isFDLimit(err) && t.shedOne() {
				// Out of file descriptors while unauthenticated
				// connections hold some: the oldest silent one makes
				// room for whoever is waiting in the accept queue.
				continue
			}
			// Transient (e.g. out of file descriptors): back off, bounded.
			t.log.Warn("sync: accept failed", "err", err)
			tm := time.NewTimer(backoff)
			select {
			case <-tm.C:
			case <-t.closed:
				tm.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		e := t.admit(c)
		if e == nil {
			c.Close()
			continue
		}
		t.wg.Add(1)
		go t.serveConn(e)
	}
}

// refused counts the refusal of a connection from remote and logs it
// (rate-limited: see refuseLog).
func (t *Transport) refused(remote string, err error) {
	t.mu.Lock()
	one, prev := t.noteRefusalLocked(remote, err) // prev: the refusals before this one
	t.refusedLocked(err)
	t.mu.Unlock()
	t.logSummary(prev)
	if one {
		t.log.Warn("sync: refused connection", "remote", remote, "err", err)
	}
}

func (t *Transport) refusedLocked(err error) {
	t.stats.Refused++
	switch refusalKind(err) {
	case refusedAuth:
		t.stats.RefusedAuth++
	case refusedJob:
		t.stats.RefusedJob++
	case refusedRound:
		t.stats.RefusedRound++
	case refusedMalformed:
		t.stats.RefusedMalformed++
	}
	t.stats.LastRefusal = err
	t.stats.LastRefusedAt = time.Now()
}

// serveConn runs the server side of the handshake of one accepted connection
// and hands it to Connect. The connection may be parked while it has sent
// nothing (see admission.go): serveConn then leaves it to the park.
func (t *Transport) serveConn(e *inConn) {
	defer t.wg.Done()
	raw := e.c
	delivered, parked := false, false
	defer func() {
		if parked {
			return // the park holds it now
		}
		t.mu.Lock()
		t.dropLocked(e)
		t.mu.Unlock()
		if !delivered {
			if e.rejected {
				lingerClose(raw)
			}
			raw.Close()
		}
	}()
	remote := raw.RemoteAddr().String()
	if remote == "" || remote == "@" {
		remote = "unix"
	}
	// The first byte tells a connection that has begun its handshake from
	// a silent one, which newer connections may push into the park.
	var first [1]byte
	n, rerr := raw.Read(first[:])
	t.mu.Lock()
	switch {
	case e.gone: // evicted, or the Transport is closing
		t.mu.Unlock()
		return
	case e.parked && n == 0 && isTimeout(rerr):
		parked = true
		t.mu.Unlock()
		return
	case n == 0 && isTimeout(rerr):
		// Silent until the handshake timeout: parked like one that made
		// room, so that a flooder does not reconnect at once.
		t.parkLocked(e)
		parked = true
		t.mu.Unlock()
		return
	case n == 0:
		// Closed by the dialer before a byte.
		t.dropLocked(e)
		err := fmt.Errorf("%w: connection from %s sent nothing: %v", ErrPeerLost, remote, rerr)
		t.refusedLocked(err)
		t.mu.Unlock()
		t.log.Debug("sync: dropped a silent connection", "remote", remote, "err", rerr)
		return
	case e.parked:
		// Its first byte arrived as it was parked (the byte was read
		// before the park's peek could see it): it is taken back, and its
		// address, over its share again, makes room from its silent ones.
		t.unparkLocked(e)
		e.active = true
		t.enforceShareLocked(e.a, e)
	}
	e.active = true
	t.mu.Unlock()
	raw.SetDeadline(e.deadline) // a park may have moved the read deadline
	var c net.Conn = &prefixConn{Conn: raw, p: first[:n]}
	// TLS protects links between hosts; a Unix socket never leaves this
	// host (and keeps shared memory), so it is authenticated by the
	// handshake alone.
	if _, local := raw.(*net.UnixConn); t.cfg.ServerTLS != nil && !local {
		tc := tls.Server(c, t.cfg.ServerTLS)
		if err := tc.Handshake(); err != nil {
			t.refused(remote, fmt.Errorf("%w: TLS handshake: %v", ErrAuth, err))
			// The TLS alert was written: drain before closing, as after
			// a refusal, so that a reset does not overtake it.
			e.rejected = true
			return
		}
		c = tc
	}
	key, d, ok := t.serverHandshake(c, e, remote)
	if !ok {
		return
	}
	if pc, plain := c.(*prefixConn); plain {
		if len(pc.p) != 0 { // the hello is longer than one byte: cannot happen
			t.refused(remote, fmt.Errorf("%w: handshake left %d bytes unread", ErrBadFrame, len(pc.p)))
			return
		}
		// Deliver the raw connection (shared-memory negotiation needs the
		// *net.UnixConn): the byte read first is consumed.
		c = raw
	}
	c.SetDeadline(time.Now().Add(t.cfg.DialTimeout))
	scratch := make([]byte, 0, 64)
	if d.ref != nil {
		t.refused(remote, d.ref.err)
		payload := d.ref.payload
		if payload == nil {
			payload = wire.AppendReject(nil, d.ref.code, d.ref.err.Error())
		}
		wire.WriteMsg(c, scratch, wire.MsgReject, payload)
		e.rejected = true
		return
	}
	err := wire.WriteMsg(c, scratch, wire.MsgAccept, nil)
	c.SetDeadline(time.Time{})
	t.mu.Lock()
	defer t.mu.Unlock()
	if d.st.done {
		return // Connect gave up on this round
	}
	if err != nil {
		d.st.got <- acceptedConn{key: key, err: fmt.Errorf("%w: %v: sending accept: %v", ErrPeerLost, key, err)}
		return
	}
	t.stats.Accepted++
	d.st.got <- acceptedConn{key: key, conn: c}
	delivered = true
}

// serverHandshake authenticates the dialer of e (read through c) and decides
// where its connection goes. ok is false when the connection was refused
// and logged already.
func (t *Transport) serverHandshake(c net.Conn, e *inConn, remote string) (connKey, decision, bool) {
	buf := make([]byte, wire.MaxMsgBytes)
	scratch := make([]byte, 0, 128)
	reject := func(code uint8, err error) (connKey, decision, bool) {
		t.refused(remote, err) // counted before the dialer can see the refusal
		wire.WriteMsg(c, scratch, wire.MsgReject, wire.AppendReject(nil, code, err.Error()))
		e.rejected = true
		return connKey{}, decision{}, false
	}
	typ, p, err := wire.ReadMsg(c, buf)
	if err != nil {
		return reject(wire.RejectMalformed, handshakeReadErr("hello", err))
	}
	if typ != wire.MsgHello {
		return reject(wire.RejectMalformed, fmt.Errorf("%w: handshake message %d, want hello", ErrBadFrame, typ))
	}
	hello, err := wire.ParseHello(p)
	if err != nil {
		return reject(wire.RejectMalformed, fmt.Errorf("%w: %v", ErrBadFrame, err))
	}
	helloBytes := append([]byte(nil), p...)
	if hello.JobID != t.cfg.JobID {
		return reject(wire.RejectJob, fmt.Errorf("%w: dialer is in job %q, this rank serves job %q", ErrJobMismatch, hello.JobID, t.cfg.JobID))
	}
	// A dialer of an older round is refused only after the secrets are
	// checked both ways (place): a stranger whose peers evicted it and
	// moved on must still learn that they do not share its secret, or it
	// takes its failed round for an ordinary change and joins again (see
	// AuthError), and an unauthenticated dialer learns no round number.
	var nonce [wire.NonceSize]byte
	rand.Read(nonce[:])
	challenge := append(nonce[:], proof(t.cfg.Secret, "server", helloBytes, nonce[:])...)
	if err := wire.WriteMsg(c, scratch, wire.MsgChallenge, challenge); err != nil {
		t.refused(remote, fmt.Errorf("%w: sending challenge: %v", ErrPeerLost, err))
		return connKey{}, decision{}, false
	}
	typ, p, err = wire.ReadMsg(c, buf)
	switch {
	case err != nil:
		return reject(wire.RejectMalformed, handshakeReadErr("proof", err))
	case typ == wire.MsgReject:
		code, text, perr := wire.ParseReject(p)
		if perr != nil {
			t.refused(remote, fmt.Errorf("%w: %v", ErrBadFrame, perr))
		} else {
			if code == wire.RejectAuth {
				t.claimAuthFailure(hello)
			}
			t.refused(remote, fmt.Errorf("%w: dialer refused this rank (code %d): %s", rejectSentinel(code), code, text))
		}
		return connKey{}, decision{}, false
	case typ != wire.MsgProof || (len(p) != wire.ProofSize && len(p) != wire.ProofSize+wire.LayoutSize):
		return reject(wire.RejectMalformed, fmt.Errorf("%w: handshake message %d of %d bytes, want a proof and a layout", ErrBadFrame, typ, len(p)))
	case !hmac.Equal(p[:wire.ProofSize], proof(t.cfg.Secret, "client", helloBytes, append(nonce[:], p[wire.ProofSize:]...))):
		t.claimAuthFailure(hello)
		return reject(wire.RejectAuth, fmt.Errorf("%w: the dialer's proof of the job secret does not verify (wrong or missing secret)", ErrAuth))
	}
	key := connKey{round: hello.Round, from: int(hello.From), to: int(hello.To), kind: hello.ConnKind, lane: int(hello.Lane)}
	// The dialer proved the secret: its layout may be judged and this
	// rank's told (see LayoutError).
	if ref := t.judgeLayout(key, p[wire.ProofSize:]); ref != nil {
		t.refused(remote, ref.err)
		wire.WriteMsg(c, scratch, wire.MsgReject, ref.payload)
		e.rejected = true
		return connKey{}, decision{}, false
	}
	d, h := t.place(key, e)
	if h == nil {
		return key, d, true
	}
	tm := time.NewTimer(t.cfg.HoldTimeout)
	defer tm.Stop()
	select {
	case d = <-h.decide:
	case <-t.closed:
		t.mu.Lock()
		delete(t.held, key)
		t.mu.Unlock()
		d = decision{ref: &refusal{code: wire.RejectClosed, err: fmt.Errorf("%w: transport closing", ErrClosed)}}
	case <-tm.C:
		t.mu.Lock()
		if t.held[key] == h {
			delete(t.held, key)
			d = decision{ref: &refusal{code: wire.RejectNotReady, err: fmt.Errorf("%w: held a %v for round %d for %v but this rank did not reach Connect of that round", errNotReady, key, key.round, t.cfg.HoldTimeout)}}
		}
		t.mu.Unlock()
		if d.ref == nil && d.st == nil {
			d = <-h.decide // claimed by Connect at the same instant
		}
	}
	return key, d, true
}

// handshakeReadErr classifies a failed handshake read: undecodable or
// truncated bytes are ErrBadFrame; a connection closed between messages is
// a lost peer.
func handshakeReadErr(what string, err error) error {
	if errors.Is(err, wire.ErrMalformed) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: reading %s: %v", ErrBadFrame, what, err)
	}
	return fmt.Errorf("%w: connection closed while reading %s: %v", ErrPeerLost, what, err)
}

// place decides on an authenticated connection: deliver to the Connect in
// progress, refuse, or hold it for a future round (h != nil). The
// connection leaves admission (it is no longer a stranger's), its address
// is trusted from now on, and the Connect of its round learns that the
// dialer proved the secret.
func (t *Transport) place(key connKey, e *inConn) (decision, *heldConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked(e)
	t.trustLocked(e.a.key)
	if st := t.connecting; st != nil && key.round == st.w.Round {
		st.provedLocked(key.from)
		st.layout.agreeWith(key.from) // judgeLayout let it through
	}
	switch {
	case t.isClosed:
		return decision{ref: &refusal{code: wire.RejectClosed, err: fmt.Errorf("%w: transport closing", ErrClosed)}}, nil
	case t.haveRound && key.round < t.round:
		return decision{ref: &refusal{code: wire.RejectRound, err: fmt.Errorf("%w: dialer is in round %d, this rank has moved on to round %d", ErrRoundMismatch, key.round, t.round)}}, nil
	case t.haveRound && key.round == t.round:
		if t.connecting == nil && t.lays.failed && t.lays.failedRound == key.round {
			return decision{ref: t.layoutRoundRefusalLocked(key.round)}, nil
		}
		if t.connecting == nil {
			return decision{ref: &refusal{code: wire.RejectRound, err: fmt.Errorf("%w: round %d is already formed on this rank", ErrRoundMismatch, key.round)}}, nil
		}
		return claim(t.connecting, key), nil
	}
	if old, dup := t.held[key]; dup {
		// A redial of the same connection: the newer one is the live one.
		old.decide <- decision{ref: &refusal{code: wire.RejectNotReady, err: fmt.Errorf("%w: %v for round %d superseded by a newer dial", errNotReady, key, key.round)}}
		delete(t.held, key)
	}
	if len(t.held) >= maxHeld {
		return decision{ref: &refusal{code: wire.RejectNotReady, err: fmt.Errorf("%w: %d connections already held for future rounds", errNotReady, len(t.held))}}, nil
	}
	h := &heldConn{key: key, decide: make(chan decision, 1)}
	t.held[key] = h
	return decision{}, h
}

// claim fills the slot of key in st. Called with t.mu held.
func claim(st *connectState, key connKey) decision {
	if key.to != st.w.Rank {
		return decision{ref: &refusal{code: wire.RejectRank, err: fmt.Errorf("%w: dialer wants rank %d but this is rank %d of round %d", ErrRoundMismatch, key.to, st.w.Rank, key.round)}}
	}
	filled, ok := st.expect[key]
	if !ok {
		return decision{ref: &refusal{code: wire.RejectRank, err: fmt.Errorf("%w: unexpected %v in round %d of world size %d", ErrRoundMismatch, key, key.round, st.w.Size())}}
	}
	if filled {
		return decision{ref: &refusal{code: wire.RejectRank, err: fmt.Errorf("%w: duplicate %v in round %d", ErrRoundMismatch, key, key.round)}}
	}
	st.expect[key] = true
	return decision{st: st}
}

// errNotReady is the retryable refusal of a connection for a round the peer
// has not reached yet.
var errNotReady = errors.New("sync: peer not ready for the round")

func rejectSentinel(code uint8) error {
	switch code {
	case wire.RejectJob:
		return ErrJobMismatch
	case wire.RejectRound, wire.RejectRank:
		return ErrRoundMismatch
	case wire.RejectAuth:
		return ErrAuth
	case wire.RejectNotReady:
		return errNotReady
	case wire.RejectClosed:
		return ErrClosed
	case wire.RejectLayout, wire.RejectLayoutRound:
		return ErrLayoutMismatch
	}
	return ErrBadFrame
}

// proof is HMAC-SHA256(secret, label || 0 || hello || nonce).
func proof(secret []byte, label string, hello, nonce []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("elastictrain/sync v1 " + label))
	m.Write([]byte{0})
	m.Write(hello)
	m.Write(nonce)
	return m.Sum(nil)
}

// clientHandshake runs the dialer's side on c within ctx. proved is true
// once the peer proved the secret (even if it then refused the connection).
func (t *Transport) clientHandshake(ctx context.Context, c net.Conn, hello *wire.Hello) (proved bool, err error) {
	end, _ := ctx.Deadline() // zero: none
	c.SetDeadline(end)
	// A listener that reads the hello answers it at once; one that does
	// not (it parked this connection among a flood's) is redialed after
	// the handshake timeout rather than waited for until ctx ends.
	challengeBy := time.Now().Add(t.cfg.handshakeTimeout())
	if !end.IsZero() && end.Before(challengeBy) {
		challengeBy = end
	}
	c.SetReadDeadline(challengeBy)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	defer c.SetDeadline(time.Time{})
	rand.Read(hello.Nonce[:])
	helloBytes := wire.AppendHello(nil, hello)
	scratch := make([]byte, 0, 128)
	buf := make([]byte, wire.MaxMsgBytes)
	if err := wire.WriteMsg(c, scratch, wire.MsgHello, helloBytes); err != nil {
		return false, fmt.Errorf("%w: sending hello: %v", errRetry, err)
	}
	typ, p, err := wire.ReadMsg(c, buf)
	if err != nil {
		return false, t.readErr(ctx, "challenge", err)
	}
	c.SetReadDeadline(end)
	if ctx.Err() != nil {
		c.SetDeadline(time.Unix(1, 0)) // cancelled meanwhile: keep it so
	}
	if typ == wire.MsgReject {
		err := parseRefusal(p)
		if errors.Is(err, ErrLayoutMismatch) {
			// Only a peer that proved the secret may speak of layouts.
			return false, fmt.Errorf("%w: a layout refusal before the peer proved the job secret", ErrBadFrame)
		}
		return false, err
	}
	if typ != wire.MsgChallenge || len(p) != wire.NonceSize+wire.ProofSize {
		return false, fmt.Errorf("%w: handshake message %d of %d bytes, want a challenge", ErrBadFrame, typ, len(p))
	}
	nonce := append([]byte(nil), p[:wire.NonceSize]...)
	if !hmac.Equal(p[wire.NonceSize:], proof(t.cfg.Secret, "server", helloBytes, nonce)) {
		err := fmt.Errorf("%w: the peer's proof of the job secret does not verify (wrong secret)", ErrAuth)
		wire.WriteMsg(c, scratch, wire.MsgReject, wire.AppendReject(nil, wire.RejectAuth, err.Error()))
		return false, err
	}
	// The proof covers this rank's layout, which follows it.
	lay := t.cfg.wireLayout()
	lb := wire.AppendLayout(nil, &lay)
	if err := wire.WriteMsg(c, scratch, wire.MsgProof, append(proof(t.cfg.Secret, "client", helloBytes, append(nonce, lb...)), lb...)); err != nil {
		return true, fmt.Errorf("%w: sending proof: %v", errRetry, err)
	}
	typ, p, err = wire.ReadMsg(c, buf)
	if err != nil {
		return true, t.readErr(ctx, "accept", err)
	}
	switch typ {
	case wire.MsgAccept:
		return true, nil
	case wire.MsgReject:
		return true, parseRefusal(p)
	}
	return true, fmt.Errorf("%w: handshake message %d, want accept", ErrBadFrame, typ)
}

func (t *Transport) readErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, wire.ErrMalformed) {
		return fmt.Errorf("%w: reading %s: %v", ErrBadFrame, what, err)
	}
	return fmt.Errorf("%w: reading %s: %v", errRetry, what, err)
}

func parseRefusal(p []byte) error {
	code, text, err := wire.ParseReject(p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	switch code {
	case wire.RejectLayout:
		l, msg, err := wire.ParseLayoutReject(text)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadFrame, err)
		}
		return &peerLayoutError{layout: l, text: msg}
	case wire.RejectLayoutRound:
		ls, msg, err := wire.ParseLayoutRoundReject(text)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadFrame, err)
		}
		return &peerRoundLayoutError{layouts: ls, text: msg}
	}
	return fmt.Errorf("%w: refused by peer: %s", rejectSentinel(code), text)
}

// errRetry marks a transient dial failure.
var errRetry = errors.New("sync: transient connection failure")

func retryable(err error) bool {
	return errors.Is(err, errRetry) || errors.Is(err, errNotReady) || errors.Is(err, ErrClosed)
}

// dialOnce opens a raw connection to addr: the peer's Unix socket if it is on
// this host and LocalSockets is on, else TCP and then TLS if configured.
func (t *Transport) dialOnce(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAliveConfig: keepAlive}
	var c net.Conn
	var err error
	if t.cfg.LocalSockets && runtime.GOOS == "linux" {
		c, err = d.DialContext(ctx, "unix", localSocketName(addr))
	}
	if c == nil {
		c, err = d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errRetry, err)
		}
	}
	if _, local := c.(*net.UnixConn); t.cfg.ClientTLS == nil || local {
		return c, nil
	}
	cfg := t.cfg.ClientTLS.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: TLS handshake with %s: %v", ErrAuth, addr, err)
	}
	return tc, nil
}

// dialPeer dials one connection of the round to peer, retrying transient
// failures until ctx ends, and tells st when the peer proves the secret.
func (t *Transport) dialPeer(ctx context.Context, st *connectState, peer int, kind uint8, lane int) (net.Conn, error) {
	w := st.w
	hello := wire.Hello{
		Version:  wire.ProtocolVersion,
		ConnKind: kind,
		Lane:     uint16(lane),
		Round:    w.Round,
		From:     uint32(w.Rank),
		To:       uint32(peer),
		JobID:    w.JobID,
	}
	backoff := 5 * time.Millisecond
	for {
		c, err := t.dialOnce(ctx, w.Addrs[peer])
		if err == nil {
			var proved bool
			proved, err = t.clientHandshake(ctx, c, &hello)
			if proved {
				t.noteProved(st, peer)
			}
			if err == nil {
				return c, nil
			}
			c.Close()
		}
		key := connKey{round: w.Round, from: w.Rank, to: peer, kind: kind, lane: lane}
		if !retryable(err) && err != ctx.Err() {
			err = fmt.Errorf("%v at %s: %w", key, w.Addrs[peer], err)
			if errors.Is(err, ErrAuth) || errors.Is(err, ErrJobMismatch) {
				// The peer at that address does not share our job or
				// secret: name it, so the caller can tell which rank it
				// could not authenticate (one side is misconfigured).
				err = &PeerError{Rank: peer, Round: w.Round, Err: err}
			}
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%v at %s: %w (last error: %v)", key, w.Addrs[peer], ctx.Err(), err)
		}
		tm := time.NewTimer(backoff)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// ringConns are the connections of one round, by role.
type ringConns struct {
	ctrl, mesh []net.Conn // by peer rank; nil for self
	// by group, then lane: to the group's next member (this rank sends) and
	// from its previous one (this rank receives); nil for groups this rank
	// is not in.
	right, left [numGroups][]net.Conn
}

func (rc *ringConns) closeAll() {
	all := [][]net.Conn{rc.ctrl, rc.mesh}
	for g := range numGroups {
		all = append(all, rc.right[g], rc.left[g])
	}
	for _, s := range all {
		for _, c := range s {
			if c != nil {
				c.Close()
			}
		}
	}
}

// laneID is the Lane field of a lane connection's Hello: the group in the
// high byte, the lane in the low one.
func laneID(group, lane int) int { return group<<8 | lane }

func (rc *ringConns) put(key connKey, peer int, c net.Conn, dialed bool) {
	switch key.kind {
	case wire.ConnControl:
		rc.ctrl[peer] = c
	case wire.ConnMesh:
		rc.mesh[peer] = c
	case wire.ConnLane:
		g, l := key.lane>>8, key.lane&0xff
		if dialed {
			rc.right[g][l] = c
		} else {
			rc.left[g][l] = c
		}
	}
}

// Connect forms the connections of round w.Round and returns its Ring:
// a control and a mesh connection to every other rank (the lower rank
// dials), and Config.Streams lane connections to the right neighbour
// (rank+1 mod size) and from the left one; when the round's allreduce is
// hierarchical (Config.Hierarchy, decided from w.Addrs), also
// Config.Streams lanes to and from the neighbours in the ring of this
// rank's host and in the ring between hosts. Every connection is authenticated
// (job ID, round, rank, HMAC of the secret over fresh nonces). It waits up
// to Config.DialTimeout for peers that reach Connect later.
//
// Errors: ErrInvalid (bad World), ErrJobMismatch (w.JobID differs from
// Config.JobID), ErrRoundMismatch (w.Round is older than, or the same as, a
// round already connected, or a peer is in another round), ErrAuth (a peer
// does not know the secret: an *AuthError saying which ranks proved the
// secret and which failed, after up to a second more of forming the other
// connections), ErrLayoutMismatch (a peer that proved the secret has
// another ChunkBytes, DirectBytes, Streams or Hierarchy: a *LayoutError
// naming the settings, every rank's value and which ranks agree, once it
// learnt every peer's layout or at most Config.LayoutGrace later), ErrTimeout (not all connections formed within
// DialTimeout; the message names the missing ones), ErrClosed, ctx errors.
func (t *Transport) Connect(ctx context.Context, w World) (*Ring, error) {
	if w.JobID == "" {
		w.JobID = t.cfg.JobID
	} else if w.JobID != t.cfg.JobID {
		return nil, fmt.Errorf("%w: World.JobID %q, Config.JobID %q", ErrJobMismatch, w.JobID, t.cfg.JobID)
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	w.Addrs = append([]string(nil), w.Addrs...)
	n, rank := w.Size(), w.Rank
	streams := t.cfg.Streams
	lay := newLayout(w.Addrs, t.cfg.Hierarchy)
	if n > 1 {
		t.warnLoopback(w)
	}
	st := newConnectState(w)
	type target struct {
		peer int
		kind uint8
		lane int
	}
	var dials []target
	if n > 1 {
		for p := 0; p < n; p++ {
			switch {
			case p < rank:
				st.expect[connKey{w.Round, p, rank, wire.ConnControl, 0}] = false
				st.expect[connKey{w.Round, p, rank, wire.ConnMesh, 0}] = false
			case p > rank:
				dials = append(dials, target{p, wire.ConnControl, 0}, target{p, wire.ConnMesh, 0})
			}
		}
		for gi, members := range lay.groups(rank) {
			if len(members) < 2 {
				continue
			}
			g := group{members: members, pos: slices.Index(members, rank)}
			for l := 0; l < streams; l++ {
				st.expect[connKey{w.Round, g.left(), rank, wire.ConnLane, laneID(gi, l)}] = false
				dials = append(dials, target{g.right(), wire.ConnLane, laneID(gi, l)})
			}
		}
	}
	nAccept := len(st.expect)
	st.got = make(chan acceptedConn, nAccept)

	t.mu.Lock()
	switch {
	case t.isClosed:
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: transport", ErrClosed)
	case t.connecting != nil:
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: Connect of round %d already in progress", ErrInvalid, t.round)
	case t.haveRound && w.Round <= t.round:
		cur := t.round
		t.mu.Unlock()
		return nil, fmt.Errorf("%w: round %d is not newer than round %d this transport already connected", ErrRoundMismatch, w.Round, cur)
	}
	t.haveRound, t.round, t.connecting = true, w.Round, st
	t.trustWorldLocked(w)
	t.takePendingLayoutsLocked(st)
	for key, h := range t.held {
		switch {
		case key.round < w.Round:
			h.decide <- decision{ref: &refusal{code: wire.RejectRound, err: fmt.Errorf("%w: dialer is in round %d, this rank has moved on to round %d", ErrRoundMismatch, key.round, w.Round)}}
			delete(t.held, key)
		case key.round == w.Round:
			st.provedLocked(key.from)     // held connections are authenticated
			st.layout.agreeWith(key.from) // and of this rank's layout
			h.decide <- claim(st, key)
			delete(t.held, key)
		}
	}
	t.mu.Unlock()
	finish := func() {
		t.mu.Lock()
		st.done = true
		if t.connecting == st {
			t.connecting = nil
		}
		t.mu.Unlock()
	}

	cctx, cancel := context.WithTimeout(ctx, t.cfg.DialTimeout)
	defer cancel()
	type dialResult struct {
		target
		conn net.Conn
		err  error
	}
	results := make(chan dialResult, len(dials))
	var wg gosync.WaitGroup
	for _, d := range dials {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := t.dialPeer(cctx, st, d.peer, d.kind, d.lane)
			results <- dialResult{d, c, err}
		}()
	}
	rc := &ringConns{ctrl: make([]net.Conn, n), mesh: make([]net.Conn, n)}
	for gi, members := range lay.groups(rank) {
		if n > 1 && len(members) >= 2 {
			rc.right[gi], rc.left[gi] = make([]net.Conn, streams), make([]net.Conn, streams)
		}
	}
	remaining := len(dials) + nAccept
	dialing := len(dials)
	var firstErr error
	// A dialed peer that fails authentication dooms the round, and so does
	// a peer whose layout differs. Connect then goes on forming the other
	// connections for a while, to learn which side of the failure holds
	// the majority of the round (see AuthError and LayoutError).
	auth := authTally{failed: map[int]bool{}}
	var grace <-chan time.Time
	startGrace := func(d time.Duration) {
		if grace == nil {
			tm := time.NewTimer(d)
			grace = tm.C
			context.AfterFunc(cctx, func() { tm.Stop() })
		}
	}
	layoutDoomed := t.layoutDoomed(st) // mismatches met before this Connect began
	if layoutDoomed {
		startGrace(t.cfg.LayoutGrace())
	}
	for remaining > 0 && firstErr == nil {
		select {
		case r := <-results:
			remaining--
			dialing--
			layoutFailed := t.noteDialLayout(st, r.peer, r.err)
			switch {
			case r.err == nil:
				rc.put(connKey{kind: r.kind, lane: r.lane}, r.peer, r.conn, true)
			case authFailure(r.err):
				auth.failed[r.peer] = true
				if auth.first == nil {
					auth.first = r.err
					startGrace(authGrace)
				}
			case layoutFailed:
				layoutDoomed = true
				startGrace(t.cfg.LayoutGrace())
			case (auth.first != nil || layoutDoomed) && cctx.Err() == nil:
				// Doomed already: a peer that gave up on the round
				// (it settled first) says nothing about the secret.
			default:
				firstErr = r.err
				if cctx.Err() != nil {
					firstErr = t.connectTimeout(ctx, w, lay, rc)
				}
			}
		case a := <-st.got:
			remaining--
			switch {
			case a.err == nil:
				rc.put(a.key, a.key.from, a.conn, false)
			case auth.first != nil || layoutDoomed:
			default:
				firstErr = a.err
			}
		case <-st.note: // a peer proved the secret, claimed to fail it, or sent another layout
			if !layoutDoomed && t.layoutDoomed(st) {
				layoutDoomed = true
				startGrace(t.cfg.LayoutGrace())
			}
		case <-grace:
			firstErr = t.doomedError(st, &auth)
		case <-cctx.Done():
			firstErr = t.connectTimeout(ctx, w, lay, rc)
			if auth.first != nil || layoutDoomed {
				firstErr = t.doomedError(st, &auth)
			}
		case <-t.closed:
			firstErr = fmt.Errorf("%w: transport closed during Connect", ErrClosed)
		}
		switch {
		case firstErr != nil:
		case auth.first != nil && t.authSettled(st, &auth, dialing):
			firstErr = t.authError(st, &auth)
		case auth.first == nil && layoutDoomed && t.layoutSettled(st, dialing):
			firstErr = t.layoutError(st)
		}
	}
	if firstErr == nil && (auth.first != nil || layoutDoomed) {
		firstErr = t.doomedError(st, &auth) // every other connection formed
	}
	if firstErr != nil {
		cancel()
		wg.Wait()
		if layoutDoomed {
			t.mu.Lock()
			t.layoutFailedLocked(st)
			t.mu.Unlock()
		}
		finish()
		close(results)
		for r := range results {
			if r.conn != nil {
				r.conn.Close()
			}
		}
		for {
			select {
			case a := <-st.got:
				if a.conn != nil {
					a.conn.Close()
				}
				continue
			default:
			}
			break
		}
		if ctx.Err() != nil {
			abortConnect(rc, w)
		}
		rc.closeAll()
		var ae *AuthError
		var le *LayoutError
		if !errors.As(firstErr, &ae) && !errors.As(firstErr, &le) && !errors.Is(firstErr, ErrTimeout) && !errors.Is(firstErr, context.Canceled) && !errors.Is(firstErr, context.DeadlineExceeded) {
			firstErr = fmt.Errorf("sync: connect round %d rank %d: %w", w.Round, w.Rank, firstErr)
		}
		return nil, firstErr
	}
	wg.Wait()
	finish()
	tx, rx, err := negotiateShm(cctx, t.cfg, rc)
	if err != nil {
		if ctx.Err() != nil {
			abortConnect(rc, w)
		}
		rc.closeAll()
		return nil, fmt.Errorf("sync: connect round %d rank %d: %w", w.Round, w.Rank, err)
	}
	if t.beforeRing != nil {
		t.beforeRing(w)
	}
	r := newRing(t, w, lay, rc, tx, rx)
	t.mu.Lock()
	if t.isClosed {
		t.mu.Unlock()
		r.Close()
		return nil, fmt.Errorf("%w: transport", ErrClosed)
	}
	t.rings[r] = struct{}{}
	t.mu.Unlock()
	return r, nil
}

// connectTimeout builds the error for a Connect that ran out of time, naming
// the connections still missing.
func (t *Transport) connectTimeout(ctx context.Context, w World, lay layout, rc *ringConns) error {
	// One pass over what is missing: the descriptions for the message, and
	// the peers involved. A single unreachable peer is named in a
	// PeerError; a rank cut off from everyone names nobody, and neither
	// does a world of two, where either side could be the one at fault.
	var missing []string
	peers := map[int]bool{}
	t.mu.Lock()
	// A refusal while this Connect waited, or within a DialTimeout before
	// it began (a peer whose TLS certificate or secret is wrong may dial
	// before this rank calls Connect; a timeout alone would hide it), is
	// named; it
	// does not make the timeout an ErrAuth: the refused connection may not
	// be a peer of this round, and a healthy rank must not treat a
	// stranger's failure as its own permanent error.
	var meanwhile string
	if at := t.stats.LastRefusedAt; t.stats.LastRefusal != nil && !at.IsZero() && time.Since(at) <= 2*t.cfg.DialTimeout {
		meanwhile = fmt.Sprintf("; refused meanwhile: %v", t.stats.LastRefusal)
	}
	if st := t.connecting; st != nil {
		for k, filled := range st.expect {
			if !filled {
				missing = append(missing, k.String())
				peers[k.from] = true
			}
		}
	}
	t.mu.Unlock()
	for p, c := range rc.ctrl {
		if p > w.Rank && c == nil {
			missing = append(missing, fmt.Sprintf("control connection to rank %d", p))
			peers[p] = true
		}
	}
	for p, c := range rc.mesh {
		if p > w.Rank && c == nil {
			peers[p] = true
		}
	}
	for gi, members := range lay.groups(w.Rank) {
		if len(members) < 2 {
			continue
		}
		g := group{members: members, pos: slices.Index(members, w.Rank)}
		for l, c := range rc.right[gi] {
			if c == nil {
				missing = append(missing, connKey{kind: wire.ConnLane, lane: laneID(gi, l), from: w.Rank, to: g.right()}.String())
				peers[g.right()] = true
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 6 {
		missing = append(missing[:6], fmt.Sprintf("and %d more", len(missing)-6))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sync: connect round %d rank %d: %w (missing: %s)", w.Round, w.Rank, err, strings.Join(missing, "; "))
	}
	err := fmt.Errorf("%w: connect round %d rank %d: not formed within DialTimeout %v (missing: %s)%s", ErrTimeout, w.Round, w.Rank, t.cfg.DialTimeout, strings.Join(missing, "; "), meanwhile)
	if len(peers) == 1 && w.Size() >= 3 {
		for p := range peers {
			return &PeerError{Rank: p, Round: w.Round, Err: err}
		}
	}
	return err
}

func (t *Transport) forget(r *Ring) {
	t.mu.Lock()
	delete(t.rings, r)
	t.mu.Unlock()
}
