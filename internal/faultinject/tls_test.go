package faultinject_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
)

// writeCerts writes a CA and a server certificate for 127.0.0.1 signed by
// it (PEM) into dir and returns the CA pool and the file paths.
func writeCerts(t *testing.T, dir string) (pool *x509.CertPool, caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "faultinject test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "redis"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, write("ca.pem", "CERTIFICATE", caDER), write("redis.pem", "CERTIFICATE", srvDER), write("redis.key", "EC PRIVATE KEY", keyDER)
}

// startTLSRedis runs a private redis-server that speaks only TLS on a free
// port and requires the ACL user; t.Cleanup kills it.
func startTLSRedis(t *testing.T, certFile, keyFile, caFile string, pool *x509.CertPool, user, password string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	require.NoError(t, err, "redis-server is needed for the TLS test")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", "0", "--tls-port", port,
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--loglevel", "warning", "--dir", t.TempDir(),
		"--user", user, "on", ">"+password, "~et:*", "&et:*", "+@all", "-@dangerous", "--user", "default", "off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, MaxRetries: -1,
		TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("TLS redis-server on %s does not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

// Redis over TLS with an ACL user, set through go-redis options
// (redis.Options.TLSConfig, Username, Password): a job whose workers reach
// a TLS-only redis-server trains to the end with every invariant; a plain
// TCP client gets nothing from that port.
func TestRedisTLSWithACLUser(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pool, caFile, certFile, keyFile := writeCerts(t, dir)
	const user, password = "trainer", "the trainer's password over TLS"
	addr := startTLSRedis(t, certFile, keyFile, caFile, pool, user, password)

	plain := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second})
	defer plain.Close()
	require.Error(t, plain.Ping(ctx).Err(), "plain TCP is refused on the TLS port")

	cfg := testConfig(t, addr)
	cfg.Epochs = 1
	cfg.RedisUser, cfg.RedisPassword, cfg.RedisCAFile = user, password, caFile
	res := faultinject.Run(ctx, cfg, nil, faultinject.Bounds{})
	require.Empty(t, res.Violations)
	require.Equal(t, 3, res.Finished)
}
