package sync

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"slices"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// connectPair connects rank 0 on a and rank 1 on b concurrently.
func connectPair(a, b *Transport, roundA, roundB uint64) (ra, rb *Ring, ea, eb error) {
	addrs := []string{a.Addr(), b.Addr()}
	var wg gosync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		ra, ea = a.Connect(context.Background(), World{Round: roundA, Rank: 0, Addrs: addrs})
	}()
	go func() {
		defer wg.Done()
		rb, eb = b.Connect(context.Background(), World{Round: roundB, Rank: 1, Addrs: addrs})
	}()
	wg.Wait()
	return
}

func listenOne(t *testing.T, cfg Config) *Transport {
	t.Helper()
	tr, err := Listen(context.Background(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func TestWrongSecretRefusedBothSides(t *testing.T) {
	cfg := testConfig(t)
	cfg.DialTimeout = 3 * time.Second
	other := cfg
	other.Secret = append([]byte(nil), cfg.Secret...)
	other.Secret[0] ^= 1
	a, b := listenOne(t, cfg), listenOne(t, other)
	_, _, ea, eb := connectPair(a, b, 1, 1)
	for i, err := range []error{ea, eb} {
		if !errors.Is(err, ErrAuth) {
			t.Errorf("rank %d Connect: %v, want ErrAuth", i, err)
		}
	}
	for i, tr := range []*Transport{a, b} {
		// The dialer's refusal reaches the server asynchronously.
		waitFor(t, 2*time.Second, func() bool { return tr.Stats().RefusedAuth > 0 })
		if st := tr.Stats(); st.Accepted != 0 {
			t.Errorf("rank %d server side: %+v, want a refusal wrapping ErrAuth and nothing accepted", i, st)
		}
	}
}

func TestWrongJobRefusedBothSides(t *testing.T) {
	cfg := testConfig(t)
	cfg.DialTimeout = 3 * time.Second
	other := cfg
	other.JobID += "-other"
	a, b := listenOne(t, cfg), listenOne(t, other)
	_, _, ea, eb := connectPair(a, b, 1, 1)
	for i, err := range []error{ea, eb} {
		if !errors.Is(err, ErrJobMismatch) {
			t.Errorf("rank %d Connect: %v, want ErrJobMismatch", i, err)
		}
	}
	for _, tr := range []*Transport{a, b} {
		waitFor(t, 2*time.Second, func() bool { return tr.Stats().RefusedJob > 0 })
	}
	if _, err := a.Connect(context.Background(), World{JobID: "x", Round: 9, Addrs: []string{a.Addr()}}); !errors.Is(err, ErrJobMismatch) {
		t.Errorf("World.JobID differing from Config.JobID: %v", err)
	}
}

func TestStaleRoundRefused(t *testing.T) {
	cfg := testConfig(t)
	cfg.DialTimeout = 3 * time.Second
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	// b moves on to round 5 (alone), then a dials it for round 3.
	rb, err := b.Connect(context.Background(), World{Round: 5, Rank: 0, Addrs: []string{b.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	_, err = a.Connect(context.Background(), World{Round: 3, Rank: 0, Addrs: []string{a.Addr(), b.Addr()}})
	if !errors.Is(err, ErrRoundMismatch) {
		t.Fatalf("Connect to a peer in a newer round: %v, want ErrRoundMismatch", err)
	}
	if st := b.Stats(); st.RefusedRound == 0 {
		t.Fatalf("server side: %+v, want a refusal wrapping ErrRoundMismatch", st)
	}
	// This transport refuses to go back to an older or the same round.
	for _, round := range []uint64{4, 5} {
		if _, err := b.Connect(context.Background(), World{Round: round, Addrs: []string{b.Addr()}}); !errors.Is(err, ErrRoundMismatch) {
			t.Fatalf("Connect round %d after round 5: %v", round, err)
		}
	}
}

// TestFutureRoundHeld: a connection for a round this rank has not reached is
// held, not refused, and joins the round when this rank connects.
func TestFutureRoundHeld(t *testing.T) {
	cfg := testConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	addrs := []string{a.Addr(), b.Addr()}
	type res struct {
		r   *Ring
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := a.Connect(context.Background(), World{Round: 7, Rank: 0, Addrs: addrs})
		ch <- res{r, err}
	}()
	waitFor(t, 5*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.held) > 0
	})
	rb, err := b.Connect(context.Background(), World{Round: 7, Rank: 1, Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	got := <-ch
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.r.Close()
	errs := make(chan error, 1)
	go func() { errs <- got.r.Barrier(context.Background()) }()
	if err := rb.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// rawHandshake opens a plain TCP connection to tr and sends a hello.
func rawHello(t *testing.T, tr *Transport, hello wire.Hello) (net.Conn, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	hb := wire.AppendHello(nil, &hello)
	if err := wire.WriteMsg(c, nil, wire.MsgHello, hb); err != nil {
		t.Fatal(err)
	}
	return c, hb
}

// proofMsg is the payload of a genuine MsgProof of cfg's rank over hello
// hb and the listener's nonce: the proof, then the layout it covers.
func proofMsg(cfg Config, hb, nonce []byte) []byte {
	l := cfg.wireLayout()
	lb := wire.AppendLayout(nil, &l)
	return append(proof(cfg.Secret, "client", hb, append(slices.Clip(nonce), lb...)), lb...)
}

func readReject(t *testing.T, c net.Conn) uint8 {
	t.Helper()
	typ, p, err := wire.ReadMsg(c, make([]byte, wire.MaxMsgBytes))
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	if typ != wire.MsgReject {
		t.Fatalf("got message %d, want a reject", typ)
	}
	code, _, err := wire.ParseReject(p)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// TestReplayedHandshakeRefused: a proof recorded from one handshake does not
// authenticate another (the server's nonce is fresh), and a missing proof
// is refused.
func TestReplayedHandshakeRefused(t *testing.T) {
	cfg := testConfig(t)
	tr := listenOne(t, cfg)
	hello := wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: 42, From: 0, To: 1, JobID: cfg.JobID}
	rand.Read(hello.Nonce[:])
	buf := make([]byte, wire.MaxMsgBytes)
	// A genuine handshake (held: round 42 is in the future).
	c1, hb := rawHello(t, tr, hello)
	defer c1.Close()
	typ, p, err := wire.ReadMsg(c1, buf)
	if err != nil || typ != wire.MsgChallenge {
		t.Fatalf("challenge: %d %v", typ, err)
	}
	recorded := proofMsg(cfg, hb, p[:wire.NonceSize])
	if err := wire.WriteMsg(c1, nil, wire.MsgProof, recorded); err != nil {
		t.Fatal(err)
	}
	// The replay: same hello, recorded proof.
	c2, _ := rawHello(t, tr, hello)
	defer c2.Close()
	if typ, _, err := wire.ReadMsg(c2, buf); err != nil || typ != wire.MsgChallenge {
		t.Fatalf("challenge: %d %v", typ, err)
	}
	wire.WriteMsg(c2, nil, wire.MsgProof, recorded)
	if code := readReject(t, c2); code != wire.RejectAuth {
		t.Fatalf("replayed proof: reject code %d, want %d", code, wire.RejectAuth)
	}
	if st := tr.Stats(); st.RefusedAuth != 1 || !errors.Is(st.LastRefusal, ErrAuth) {
		t.Fatalf("server side: %+v", st)
	}
	// No secret at all: an all-zero proof.
	c3, _ := rawHello(t, tr, hello)
	defer c3.Close()
	wire.ReadMsg(c3, buf)
	wire.WriteMsg(c3, nil, wire.MsgProof, make([]byte, wire.ProofSize+wire.LayoutSize))
	if code := readReject(t, c3); code != wire.RejectAuth {
		t.Fatalf("missing secret: reject code %d", code)
	}
}

// TestMalformedHandshakeRefused: garbage, oversized and truncated handshake
// messages are refused without a panic, and the transport keeps working.
func TestMalformedHandshakeRefused(t *testing.T) {
	cfg := testConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	good := wire.AppendHello(nil, &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnMesh, Round: 1, To: 1, JobID: cfg.JobID})
	oversized := []byte{wire.MsgHello, 0xff, 0xff}
	truncated := append([]byte{wire.MsgHello, 0, 0}, good[:10]...)
	binary.LittleEndian.PutUint16(truncated[1:], uint16(len(good)))
	badVersion := append([]byte(nil), good...)
	badVersion[0] = 99
	cases := []struct {
		name  string
		bytes []byte
		reply bool // the server can still answer with a reject
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), true},
		{"oversized", oversized, true},
		{"truncated", truncated, false},
		{"bad version", append([]byte{wire.MsgHello, byte(len(badVersion)), 0}, badVersion...), true},
		{"proof first", append([]byte{wire.MsgProof, wire.ProofSize, 0}, make([]byte, wire.ProofSize)...), true},
	}
	for _, c := range cases {
		before := b.Stats().Refused
		conn, err := net.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(c.bytes)
		if c.reply {
			if code := readReject(t, conn); code != wire.RejectMalformed {
				t.Errorf("%s: reject code %d", c.name, code)
			}
		} else {
			conn.(*net.TCPConn).CloseWrite()
		}
		waitFor(t, 5*time.Second, func() bool { return b.Stats().Refused > before })
		if st := b.Stats(); st.RefusedMalformed == 0 || !errors.Is(st.LastRefusal, ErrBadFrame) {
			t.Errorf("%s: server side %v, want ErrBadFrame", c.name, st.LastRefusal)
		}
		conn.Close()
	}
	ra, rb, ea, eb := connectPair(a, b, 1, 1)
	if ea != nil || eb != nil {
		t.Fatalf("Connect after malformed handshakes: %v %v", ea, eb)
	}
	ra.Close()
	rb.Close()
}

// TestConnectTimeoutNamesMissing: a peer that never connects makes Connect
// fail with ErrTimeout naming what is missing.
func TestConnectTimeoutNamesMissing(t *testing.T) {
	cfg := testConfig(t)
	cfg.DialTimeout = 300 * time.Millisecond
	cfg.HoldTimeout = 100 * time.Millisecond
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	_, err := a.Connect(context.Background(), World{Round: 1, Rank: 0, Addrs: []string{a.Addr(), b.Addr()}})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	t.Log(err)
}

func selfSignedTLS(t *testing.T) (*tls.Config, *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "elastictrain test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS13}
	client := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	return server, client
}

func TestTLS(t *testing.T) {
	for _, local := range []bool{false, true} {
		cfg := smallConfig(t)
		cfg.LocalSockets = local
		cfg.ServerTLS, cfg.ClientTLS = selfSignedTLS(t)
		w := newTestWorld(t, 3, cfg)
		checkAllReduce(t, w, nil2rng(), 5003, OpSum)
		checkAllReduce(t, w, nil2rng(), 10, OpAvg)
		// TLS is for links between hosts: Unix sockets (same host) are
		// not wrapped and keep their shared memory; TCP ones are wrapped.
		l := w.rings[0].lanes[0]
		if _, isTLS := l.right.(*tls.Conn); isTLS == local || (l.tx != nil) != local {
			t.Fatalf("LocalSockets %v: lane 0 is %T, shared memory %v", local, l.right, l.tx != nil)
		}
	}
	// A client that does not trust the server's certificate is refused
	// (over TCP: the link TLS protects).
	cfg := testConfig(t)
	cfg.LocalSockets = false
	cfg.DialTimeout = 2 * time.Second
	cfg.ServerTLS, cfg.ClientTLS = selfSignedTLS(t)
	other := cfg
	_, other.ClientTLS = selfSignedTLS(t)
	a, b := listenOne(t, other), listenOne(t, cfg)
	_, err := a.Connect(context.Background(), World{Round: 1, Rank: 0, Addrs: []string{a.Addr(), b.Addr()}})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("untrusted certificate: %v, want ErrAuth", err)
	}
}

// A rank whose peer was refused for its TLS certificate, and which then
// never connects, times out naming the refusal (hosts_test's rogue rank
// exits once its own Connect failed, so its peer's can only time out); the
// timeout stays an ErrTimeout, not an ErrAuth: a refused connection may be
// a stranger's, not the rank's own permanent failure.
func TestConnectTimeoutNamesARefusalMeanwhile(t *testing.T) {
	cfg := testConfig(t)
	cfg.LocalSockets = false
	cfg.DialTimeout = time.Second
	cfg.ServerTLS, cfg.ClientTLS = selfSignedTLS(t)
	rogue := cfg
	_, rogue.ClientTLS = selfSignedTLS(t) // does not trust the job's certificate
	rogue.DialTimeout = 3 * time.Second
	r, j := listenOne(t, rogue), listenOne(t, cfg)
	addrs := []string{r.Addr(), j.Addr()}
	rogueErr := make(chan error, 1)
	go func() {
		_, err := r.Connect(context.Background(), World{Round: 1, Rank: 0, Addrs: addrs})
		rogueErr <- err
	}()
	// The rogue's dial reaches the job's rank, which refuses it (the rogue
	// aborts the TLS handshake); then the rogue leaves, as its process
	// would.
	if err := <-rogueErr; !errors.Is(err, ErrAuth) {
		t.Fatalf("rogue: %v, want ErrAuth", err)
	}
	r.Close()
	_, err := j.Connect(context.Background(), World{Round: 1, Rank: 1, Addrs: addrs})
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrAuth) {
		t.Fatalf("got %v, want ErrTimeout (not ErrAuth)", err)
	}
	if !strings.Contains(err.Error(), "refused meanwhile: "+ErrAuth.Error()+": TLS handshake") {
		t.Fatalf("got %v, want the refused TLS handshake named", err)
	}
}

// TestCloseDuringConnect: closing the Transport ends a Connect in progress
// with ErrClosed, and leaves no goroutine behind (goleak in TestMain).
func TestCloseDuringConnect(t *testing.T) {
	cfg := testConfig(t)
	a, b := listenOne(t, cfg), listenOne(t, cfg)
	done := make(chan error, 1)
	go func() {
		_, err := a.Connect(context.Background(), World{Round: 1, Rank: 0, Addrs: []string{a.Addr(), b.Addr()}})
		done <- err
	}()
	waitFor(t, 2*time.Second, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.connecting != nil
	})
	start := time.Now()
	a.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("got %v, want ErrClosed", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("took %v", el)
	}
}

// A rank that cannot authenticate one peer (its secret differs), or that
// one peer never reaches, gets a *PeerError naming that peer, so the
// caller knows whom to report; the peer is named only where it is the one
// link missing.
func TestConnectNamesThePeerItCannotAuthenticateOrReach(t *testing.T) {
	t.Run("wrong secret", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DialTimeout = 3 * time.Second
		other := cfg
		other.Secret = append([]byte(nil), cfg.Secret...)
		other.Secret[0] ^= 1
		trs := []*Transport{listenOne(t, cfg), listenOne(t, cfg), listenOne(t, other)}
		_, errs := tryConnectAll(trs, []string{trs[0].Addr(), trs[1].Addr(), trs[2].Addr()}, 1)
		// A rank whose Connect failed first refuses the rest of that
		// round, so a healthy rank may see that refusal instead; but no
		// healthy rank names anyone but rank 2, and one of them does.
		named := 0
		for rank := range 2 {
			var pe *PeerError
			if errs[rank] == nil {
				t.Errorf("rank %d connected", rank)
			} else if errors.As(errs[rank], &pe) {
				if pe.Rank != 2 || !errors.Is(errs[rank], ErrAuth) {
					t.Errorf("rank %d: %v, want a PeerError naming rank 2 and wrapping ErrAuth", rank, errs[rank])
				}
				named++
			}
		}
		if named == 0 {
			t.Errorf("no healthy rank named rank 2: %v", errs[:2])
		}
		if !errors.Is(errs[2], ErrAuth) {
			t.Errorf("rank 2: %v, want ErrAuth", errs[2])
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DialTimeout = 500 * time.Millisecond
		a, b := listenOne(t, cfg), listenOne(t, cfg)
		gone := listenOne(t, cfg)
		addrs := []string{a.Addr(), b.Addr(), gone.Addr()}
		gone.Close() // rank 2 never answers
		_, errs := tryConnectAll([]*Transport{a, b}, addrs, 1)
		for rank, err := range errs {
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Rank != 2 || !errors.Is(err, ErrTimeout) {
				t.Errorf("rank %d: %v, want a PeerError naming rank 2 and wrapping ErrTimeout", rank, err)
			}
		}
	})
}

// A refused dialer gets its refusal and then an orderly end of the
// connection even when more bytes follow its proof (a replayed handshake
// arrives with the frames that came after it). Closing with unread input
// would reset the connection instead, and a dialer still writing (its own
// proof, say) would fail on the reset before it could read the refusal.
func TestRefusalEndsInAnOrderlyClose(t *testing.T) {
	cfg := testConfig(t)
	tr := listenOne(t, cfg)
	var msg bytes.Buffer
	wire.WriteMsg(&msg, nil, wire.MsgHello, wire.AppendHello(nil, &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: 1, From: 1, To: 0, JobID: cfg.JobID}))
	wire.WriteMsg(&msg, nil, wire.MsgProof, make([]byte, wire.ProofSize)) // not over this server's nonce
	msg.Write(make([]byte, 16<<10))                                       // what followed it
	c, err := net.Dial("tcp", tr.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(msg.Bytes()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, wire.MaxMsgBytes)
	var code uint8
	for code == 0 {
		typ, p, err := wire.ReadMsg(c, buf)
		if err != nil {
			t.Fatalf("%v before the refusal", err)
		}
		if typ == wire.MsgReject {
			code, _, _ = wire.ParseReject(p)
		}
	}
	if code != wire.RejectAuth {
		t.Fatalf("refusal code %d, want RejectAuth", code)
	}
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("after the refusal: %v, want EOF (an orderly close, not a reset)", err)
	}
}
