// Package testredis gives tests a Redis to talk to.
//
// # Shared server
//
// Addr returns the address of one Redis shared by every test of the binary:
// $REDIS_ADDR if set, else 127.0.0.1:6379 if it answers PING. If neither
// answers and CI=true, the test fails (CI must provide Redis). Otherwise a
// redis-server is started once per test binary on a free loopback port if the
// binary is on PATH, else an embedded server (package internal/embedredis, which elastic/standalone serves)
// whose keys expire in real time. The shared server is shared: tests keep to
// their own key prefix (JobID) and never flush it.
//
// # Private server
//
// Start launches a private redis-server for a test that stops or restarts
// Redis; Restart brings it back empty on the same port. Without the binary
// (and not in CI) it falls back to the embedded server.
//
// # Cluster
//
// StartCluster launches a private Redis Cluster of three masters
// (redis-server with --cluster-enabled yes, joined by redis-cli --cluster
// create) for a test that must show its keys work across slots and nodes;
// Cluster.TagOn picks hash tags (job IDs) served by a given node. Without
// the binaries the test is skipped, except with CI=true, where it fails.
//
// # Sentinel
//
// StartSentinel launches a private master, a replica and three
// redis-sentinel processes (quorum 2, down-after-milliseconds 500) for a
// failover test; SentinelConfig.ReplicaLink can put a proxy on the
// replication link so a test can make the replica lag. Without the binaries
// the test is skipped, except with CI=true, where it fails.
//
// All functions are safe for concurrent use by parallel tests.
package testredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/elastictrain/elastictrain/internal/freeport"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/internal/embedredis"
)

// DefaultAddr is the address probed when $REDIS_ADDR is empty.
const DefaultAddr = "127.0.0.1:6379"

var shared struct {
	once sync.Once
	addr string
	err  error
	srv  *Server // started by this binary, if any; lives until the process exits
}

// Addr returns the address of the shared Redis for tests (see the package
// doc for how it is chosen). It calls t.Fatal when no Redis can be had.
func Addr(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() { shared.addr, shared.err = resolve() })
	if shared.err != nil {
		t.Fatalf("testredis: %v", shared.err)
	}
	return shared.addr
}

func resolve() (string, error) {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		if err := ping(a, 3*time.Second); err != nil {
			return "", fmt.Errorf("REDIS_ADDR=%s does not answer PING: %w", a, err)
		}
		return a, nil
	}
	if err := ping(DefaultAddr, time.Second); err == nil {
		return DefaultAddr, nil
	}
	if os.Getenv("CI") == "true" {
		return "", fmt.Errorf("no Redis: REDIS_ADDR is empty and %s does not answer PING (CI=true, so no fallback)", DefaultAddr)
	}
	s, err := startServer()
	if err != nil {
		return "", err
	}
	shared.srv = s
	return s.Addr(), nil
}

func ping(addr string, timeout time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: timeout, ReadTimeout: timeout, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// Client returns a client of the shared Redis; t.Cleanup closes it.
func Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{Addr(t)}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// EmbeddedClient starts an embedded Redis-protocol server
// (internal/embedredis, the server elastic/standalone runs) on a free
// loopback port for this test alone and returns a client of it; t.Cleanup
// closes both. For tests that check the rendezvous' scripts run there too.
func EmbeddedClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	srv, err := embedredis.Start(context.Background(), "")
	if err != nil {
		t.Fatalf("testredis: embedded server: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// JobID returns a job ID unique to this test run: the test name reduced to
// [A-Za-z0-9_-] (at most 40 characters) plus 8 random hex digits.
func JobID(t testing.TB) string {
	var b strings.Builder
	for _, r := range t.Name() {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return b.String() + "-" + hex.EncodeToString(rnd[:])
}

// Server is a Redis started by this package: a redis-server child process,
// or an embedded server when the binary is not installed. Its methods are
// safe for concurrent use.
type Server struct {
	mu       sync.Mutex
	addr     string
	cmd      *exec.Cmd
	embedded *embedredis.Server
	running  bool
	// command builds the redis-server process (StartOn); nil: exec.Command.
	command func(name string, args ...string) *exec.Cmd
}

// StartOn launches a private redis-server listening on host:6379, for a
// host of its own (a network namespace of internal/netns: pass its
// Command, so that the server runs inside it; host is its address), and
// waits until it answers from here. It needs the redis-server binary (t
// fails without it: a test of hosts must run against a real server).
// t.Cleanup stops it; Stop and Restart work as for Start.
func StartOn(t testing.TB, host string, command func(name string, args ...string) *exec.Cmd) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("testredis: redis-server not on PATH: %v", err)
	}
	s := &Server{addr: net.JoinHostPort(host, "6379"), command: command}
	if err := s.startProcess(bin); err != nil {
		t.Fatalf("testredis: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Start launches a private Redis on a free loopback port for a test that
// stops or restarts it. t.Cleanup stops it. In CI (CI=true) the redis-server
// binary is required.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := startServer()
	if err != nil {
		t.Fatalf("testredis: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func startServer() (*Server, error) {
	bin, lookErr := exec.LookPath("redis-server")
	if lookErr != nil && os.Getenv("CI") == "true" {
		return nil, fmt.Errorf("redis-server not on PATH (CI=true, so no embedded fallback): %w", lookErr)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		s := &Server{addr: addr}
		if lookErr == nil {
			err = s.startProcess(bin)
		} else {
			err = s.startEmbedded()
		}
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("start redis: %w", lastErr)
}

func freeAddr() (string, error) { return freeport.Addr() }

func (s *Server) startProcess(bin string) error {
	host, port, _ := net.SplitHostPort(s.addr)
	command := s.command
	if command == nil {
		command = exec.Command
	}
	cmd := command(bin,
		"--bind", host, "--port", port,
		"--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--loglevel", "warning",
		"--dir", os.TempDir(), "--dbfilename", "testredis-"+port+".rdb")
	// The server dies with the test binary even if Stop is never called.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", bin, err)
	}
	// No goroutine waits on the child (goleak in other packages' TestMain
	// would see it); an early exit is found by a non-blocking wait4.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := ping(s.addr, 200*time.Millisecond); err == nil {
			break
		}
		var ws syscall.WaitStatus
		if pid, _ := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil); pid == cmd.Process.Pid {
			return fmt.Errorf("redis-server on %s exited at start-up (%v)", s.addr, ws)
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("redis-server on %s did not answer PING within 5s", s.addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd, s.running = cmd, true
	return nil
}

func (s *Server) startEmbedded() error {
	e, err := embedredis.Start(context.Background(), s.addr)
	if err != nil {
		return err
	}
	s.embedded, s.running = e, true
	return nil
}

// Addr returns the "host:port" of the server; it stays the same across
// Restart.
func (s *Server) Addr() string { return s.addr }

// Stop kills the server (SIGKILL, no save) and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if !s.running {
		return
	}
	s.running = false
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
	if s.embedded != nil {
		_ = s.embedded.Close()
		s.embedded = nil
	}
}

// Restart stops the server if it runs and starts it again, empty, on the
// same address. It retries for up to 5 s while the port is still held.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
	bin, lookErr := exec.LookPath("redis-server")
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if lookErr == nil {
			err = s.startProcess(bin)
		} else {
			err = s.startEmbedded()
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testredis: restart on %s: %w", s.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Running reports whether the server is up (started and not stopped).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// VerifyTestMain runs the tests, stops the shared server if this binary
// started one, then fails the binary if goroutines leaked (go.uber.org/goleak).
// Use it instead of goleak.VerifyTestMain in packages whose tests call Addr:
//
//	func TestMain(m *testing.M) { testredis.VerifyTestMain(m) }
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Stop()
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
