package sync

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/internal/netns"
)

// Ranks on hosts of their own: child processes of this test binary, each
// inside a network namespace (internal/netns), so that peers reach each
// other over real links with their own addresses, not loopback.

const hostRankEnv = "ELASTICTRAIN_SYNC_HOST_RANK"

// hostRankSpec is what a child rank is told (JSON in hostRankEnv).
type hostRankSpec struct {
	Job         string    `json:"job"`
	Secret      string    `json:"secret"` // hex
	Rank        int       `json:"rank"`
	Listen      string    `json:"listen"`
	Hierarchy   Hierarchy `json:"hierarchy"`
	OpTimeout   int64     `json:"op_timeout_ms"`
	DialTimeout int64     `json:"dial_timeout_ms"` // 0: 20 s
	Elems       int       `json:"elems"`
	Loop        bool      `json:"loop"` // allreduce until an error, then report it
	// TLS between ranks: PEM files, and the name every peer's certificate
	// carries (ClientTLS.ServerName), as with one certificate per job.
	CA, Cert, Key, ServerName string
}

// TestHostRankProcess is a child rank of the namespace tests (re-exec of
// the test binary inside a host). It is inert unless hostRankEnv is set.
// Protocol on stdout: "ADDR <addr>"; after "WORLD <addrs>" on stdin,
// "HIER <mode>", then "SUM <sha256 of the float64 allreduce>" and "DONE",
// or with Loop "RUNNING" after the first allreduce and "ERR timeout=<bool>
// lost=<bool> peer=<rank> <message>" when one fails; "FATAL <message>" on
// any other error.
func TestHostRankProcess(t *testing.T) {
	if os.Getenv(hostRankEnv) == "" {
		return
	}
	os.Exit(hostRankMain())
}

func hostRankMain() int {
	var s hostRankSpec
	fatal := func(err error) int {
		fmt.Println("FATAL", err)
		return 1
	}
	if err := json.Unmarshal([]byte(os.Getenv(hostRankEnv)), &s); err != nil {
		return fatal(err)
	}
	cfg := DefaultConfig()
	cfg.JobID = s.Job
	cfg.Secret, _ = hex.DecodeString(s.Secret)
	cfg.Hierarchy = s.Hierarchy
	cfg.OpTimeout = time.Duration(s.OpTimeout) * time.Millisecond
	cfg.DialTimeout = 20 * time.Second
	if s.DialTimeout > 0 {
		cfg.DialTimeout = time.Duration(s.DialTimeout) * time.Millisecond
	}
	if s.CA != "" {
		var err error
		if cfg.ServerTLS, cfg.ClientTLS, err = jobTLS(s.CA, s.Cert, s.Key, s.ServerName); err != nil {
			return fatal(err)
		}
	}
	ctx := context.Background()
	tr, err := Listen(ctx, s.Listen, cfg)
	if err != nil {
		return fatal(err)
	}
	defer tr.Close()
	fmt.Println("ADDR", tr.Addr())
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "WORLD ") {
		return fatal(fmt.Errorf("bad world line %q: %v", line, err))
	}
	addrs := strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "WORLD ")), ",")
	ring, err := tr.Connect(ctx, World{Round: 1, Rank: s.Rank, Addrs: addrs})
	if err != nil {
		return fatal(err)
	}
	defer ring.Close()
	fmt.Println("HIER", ring.Hierarchy())
	if !s.Loop {
		v := make([]float64, s.Elems)
		for i := range v {
			v[i] = float64((s.Rank + 1) * (i%1000 + 1))
		}
		if err := ring.AllReduceFloat64(ctx, v, OpSum); err != nil {
			return fatal(err)
		}
		fmt.Printf("SUM %x\n", sha256.Sum256(f64Bytes(v)))
		if err := ring.Barrier(ctx); err != nil {
			return fatal(err)
		}
		fmt.Println("DONE")
		return 0
	}
	buf := make([]float32, s.Elems)
	for i := 0; ; i++ {
		if err := ring.AllReduceFloat32(ctx, buf, OpSum); err != nil {
			peer := -1
			var pe *PeerError
			if errors.As(err, &pe) {
				peer = pe.Rank
			}
			fmt.Printf("ERR timeout=%v lost=%v peer=%d %v\n", errors.Is(err, ErrTimeout), errors.Is(err, ErrPeerLost), peer, err)
			return 0
		}
		if i == 0 {
			fmt.Println("RUNNING")
		}
	}
}

// jobTLS builds a rank's TLS configs from one job-wide certificate: the
// server asks for and verifies the peer's certificate (mutual TLS), and
// the client checks the server's against serverName rather than the
// peer's IP address (pod IPs change; the job's name does not).
func jobTLS(caFile, certFile, keyFile, serverName string) (server, client *tls.Config, err error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("no certificate in %s", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS13}
	return server, client, nil
}

// writeJobCert writes a CA and one certificate for DNS name `name` (server
// and client use) signed by it into dir; it returns the three file paths.
func writeJobCert(t *testing.T, dir, name string) (ca, cert, key string) {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "job CA " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &k.PublicKey, caKey)
	must(err)
	kDER, err := x509.MarshalECPrivateKey(k)
	must(err)
	write := func(file, typ string, b []byte) string {
		p := filepath.Join(dir, file)
		must(os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600))
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("peer.pem", "CERTIFICATE", der), write("peer.key", "EC PRIVATE KEY", kDER)
}

// hostRank is a running child rank.
type hostRank struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// line returns the child's next stdout line, failing t after d.
func (k *hostRank) line(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-k.lines:
		if !ok {
			t.Fatal("child rank exited")
		}
		return l
	case <-time.After(d):
		t.Fatalf("no line from the child rank within %v", d)
	}
	return ""
}

// startHostRanks starts rank r of a world on hosts[r], with spec(r)
// (Rank set to r), exchanges the addresses and returns the ranks and their
// advertised addresses.
func startHostRanks(t *testing.T, hosts []*netns.Host, spec func(r int) hostRankSpec) ([]*hostRank, []string) {
	t.Helper()
	kids := make([]*hostRank, len(hosts))
	addrs := make([]string, len(hosts))
	for r, h := range hosts {
		s := spec(r)
		s.Rank = r
		js, _ := json.Marshal(s)
		cmd := h.Command(context.Background(), os.Args[0], "-test.run=^TestHostRankProcess$")
		cmd.Env = append(os.Environ(), hostRankEnv+"="+string(js))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		k := &hostRank{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
		kids[r] = k
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
		}()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	for r, k := range kids {
		l := k.line(t, 20*time.Second)
		a, ok := strings.CutPrefix(l, "ADDR ")
		if !ok {
			t.Fatalf("rank %d: %s", r, l)
		}
		addrs[r] = a
	}
	for _, k := range kids {
		fmt.Fprintln(k.stdin, "WORLD "+strings.Join(addrs, ","))
	}
	return kids, addrs
}

func newHostSpec(t *testing.T, elems int) hostRankSpec {
	cfg := testConfig(t)
	return hostRankSpec{Job: cfg.JobID, Secret: hex.EncodeToString(cfg.Secret), Listen: "0.0.0.0:0", OpTimeout: 30_000, Elems: elems}
}

// wantSum is the sha256 of the allreduce of the children's float64 values
// over n ranks.
func wantSum(n, elems int) string {
	v := make([]float64, elems)
	for i := range v {
		for r := 0; r < n; r++ {
			v[i] += float64((r + 1) * (i%1000 + 1))
		}
	}
	return fmt.Sprintf("%x", sha256.Sum256(f64Bytes(v)))
}

// Workers that listen on every address of their host (ListenAddr
// "0.0.0.0:0") advertise their host's own address, reach each other across
// hosts by it, choose the hierarchical allreduce from those addresses when
// hosts hold several ranks (and the flat ring when they hold one), and
// agree bit for bit with the flat ring.
func TestRanksOnHostsAdvertiseTheirAddressesAndAllReduce(t *testing.T) {
	n := netns.ForTest(t, "a", "b", "c", "d")
	a, b, c, d := n.Host("a"), n.Host("b"), n.Host("c"), n.Host("d")
	const elems = 3<<20/8 + 5 // 3 MiB of float64, more than one piece
	for _, tc := range []struct {
		name  string
		hosts []*netns.Host
		mode  Hierarchy
		want  Hierarchy
	}{
		{"2 hosts x 2 ranks", []*netns.Host{a, a, b, b}, HierarchyAuto, HierarchyStriped},
		{"2 hosts x 2 ranks leaders, interleaved", []*netns.Host{a, b, a, b}, HierarchyLeaders, HierarchyLeaders},
		{"2 hosts x 2 ranks flat", []*netns.Host{a, a, b, b}, HierarchyOff, HierarchyOff},
		{"4 hosts x 1 rank", []*netns.Host{a, b, c, d}, HierarchyAuto, HierarchyOff},
		{"3 + 1", []*netns.Host{a, a, b, a}, HierarchyAuto, HierarchyLeaders},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := newHostSpec(t, elems)
			spec.Hierarchy = tc.mode
			kids, addrs := startHostRanks(t, tc.hosts, same(spec))
			for r, h := range tc.hosts {
				if host, _, _ := net.SplitHostPort(addrs[r]); host != h.IP().String() {
					t.Fatalf("rank %d on host %s advertises %s, want its host's address %s", r, h.Name(), addrs[r], h.IP())
				}
			}
			want := wantSum(len(kids), elems)
			for r, k := range kids {
				if l := k.line(t, 30*time.Second); l != "HIER "+tc.want.String() {
					t.Fatalf("rank %d: %s, want HIER %v", r, l, tc.want)
				}
				if l := k.line(t, 60*time.Second); l != "SUM "+want {
					t.Fatalf("rank %d: %s, want SUM %s", r, l, want)
				}
				if l := k.line(t, 30*time.Second); l != "DONE" {
					t.Fatalf("rank %d: %s", r, l)
				}
			}
		})
	}
}

// TLS between hosts, as a job on a cluster sets it: one certificate for
// the job (a DNS name every rank presents, checked instead of the peers'
// changing IP addresses: ClientTLS.ServerName), mutual (ServerTLS asks for
// and verifies the client's). A round of ranks on two hosts allreduces
// over it; a rank whose certificate another CA signed is refused.
func TestTLSBetweenHosts(t *testing.T) {
	n := netns.ForTest(t, "a", "b")
	a, b := n.Host("a"), n.Host("b")
	dir := t.TempDir()
	const name = "peers.job.test"
	ca, cert, key := writeJobCert(t, dir, name)
	const elems = 1<<20/8 + 3
	t.Run("allreduce", func(t *testing.T) {
		spec := newHostSpec(t, elems)
		spec.CA, spec.Cert, spec.Key, spec.ServerName = ca, cert, key, name
		kids, _ := startHostRanks(t, []*netns.Host{a, a, b, b}, same(spec))
		want := wantSum(4, elems)
		for r, k := range kids {
			if l := k.line(t, 30*time.Second); !strings.HasPrefix(l, "HIER ") {
				t.Fatalf("rank %d: %s", r, l)
			}
			if l := k.line(t, 60*time.Second); l != "SUM "+want {
				t.Fatalf("rank %d: %s", r, l)
			}
		}
	})
	t.Run("a certificate of another CA is refused", func(t *testing.T) {
		otherDir := t.TempDir()
		oca, ocert, okey := writeJobCert(t, otherDir, name)
		spec := newHostSpec(t, 1000)
		spec.CA, spec.Cert, spec.Key, spec.ServerName = ca, cert, key, name
		rogue := spec
		rogue.CA, rogue.Cert, rogue.Key = oca, ocert, okey
		kids, _ := startHostRanks(t, []*netns.Host{a, b}, func(r int) hostRankSpec { return []hostRankSpec{spec, rogue}[r] })
		// The rogue rank fails with ErrAuth: its client handshake finds
		// the job's certificate signed by a CA it does not trust. The
		// job's rank refuses the rogue's certificate; its Connect fails
		// with ErrAuth when its own dial reached the rogue's listener
		// first, or, when the rogue had already exited (under a CPU hog,
		// ci of 2026-12-05), at DialTimeout, naming the refused TLS
		// handshake. A refusal never makes a healthy rank's Connect an
		// ErrAuth by itself: it may be a stranger's.
		if l := kids[1].line(t, 30*time.Second); !strings.HasPrefix(l, "FATAL") || !strings.Contains(l, ErrAuth.Error()) {
			t.Fatalf("rank 1 (rogue): %s, want a Connect failing with %v", l, ErrAuth)
		}
		if l := kids[0].line(t, 30*time.Second); !strings.HasPrefix(l, "FATAL") ||
			!(strings.Contains(l, ErrAuth.Error()) || strings.Contains(l, "refused meanwhile: "+ErrAuth.Error()+": TLS handshake")) {
			t.Fatalf("rank 0: %s, want a Connect failing with %v or timing out naming the refused TLS handshake", l, ErrAuth)
		}
	})
	t.Run("a rank without TLS is refused", func(t *testing.T) {
		spec := newHostSpec(t, 1000)
		spec.CA, spec.Cert, spec.Key, spec.ServerName = ca, cert, key, name
		spec.DialTimeout = 3000 // the plain rank retries (it sees the TLS side hang up) until then
		plain := spec
		plain.CA, plain.Cert, plain.Key = "", "", ""
		kids, _ := startHostRanks(t, []*netns.Host{a, b}, func(r int) hostRankSpec { return []hostRankSpec{spec, plain}[r] })
		for r, k := range kids {
			if l := k.line(t, 60*time.Second); !strings.HasPrefix(l, "FATAL") {
				t.Fatalf("rank %d: %s, want a Connect that fails", r, l)
			}
		}
	})
}

func same(s hostRankSpec) func(int) hostRankSpec { return func(int) hostRankSpec { return s } }

// A host whose link is cut in the middle of a hierarchical allreduce
// (silence, no reset: the cut end stays up) makes every rank, on either
// side of the cut, fail within OpTimeout, never hang.
func TestCutLinkFailsTheAllReduceWithinOpTimeout(t *testing.T) {
	n := netns.ForTest(t, "a", "b")
	a, b := n.Host("a"), n.Host("b")
	spec := newHostSpec(t, 4<<20/4)
	spec.Loop = true
	const opTimeout = 2 * time.Second
	spec.OpTimeout = opTimeout.Milliseconds()
	kids, _ := startHostRanks(t, []*netns.Host{a, a, b, b}, same(spec))
	for r, k := range kids {
		if l := k.line(t, 30*time.Second); !strings.HasPrefix(l, "HIER ") {
			t.Fatalf("rank %d: %s", r, l)
		}
		if l := k.line(t, 30*time.Second); l != "RUNNING" {
			t.Fatalf("rank %d: %s", r, l)
		}
	}
	ctx := context.Background()
	if err := b.Cut(ctx); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	for r, k := range kids {
		l := k.line(t, 2*opTimeout+10*time.Second)
		if !strings.HasPrefix(l, "ERR ") || !(strings.Contains(l, "timeout=true") || strings.Contains(l, "lost=true")) {
			t.Fatalf("rank %d: %s, want ErrTimeout or a lost peer", r, l)
		}
		t.Logf("rank %d after %.1f s: %s", r, time.Since(cut).Seconds(), l)
	}
	if el := time.Since(cut); el > 2*opTimeout+5*time.Second {
		t.Fatalf("the ranks took %v to fail, OpTimeout %v", el, opTimeout)
	}
}
