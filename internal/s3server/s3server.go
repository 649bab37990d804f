// Package s3server builds and runs a real S3-compatible server for tests:
// VersityGW (Apache-2.0) with its POSIX backend, built from the Go module
// proxy at the version the tools module beside this file pins
// (tools/go.mod, go.sum), as a process of its own on a free loopback port.
// The first build downloads the server's modules (most of the 128 MB a cold
// run of objstore/s3's tests fetches) and compiles them (210 s of a 475 s
// cold run on 2 busy cores); later builds are a link from Go's build cache.
//
// Its users are the tests of the S3 checkpoint store (module objstore/s3)
// and of the Kubernetes example's workers, which checkpoint to it (module
// examples/kubernetes): it lives in the core module's internal/, which every
// module of the repository may import, not under objstore/s3, which only
// that module's packages could.
package s3server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/internal/freeport"
)

// Credentials of the server's root user.
const (
	AccessKey = "elastictrain-test"
	SecretKey = "elastictrain-test-secret-key-0123456789"
)

// StartTimeout bounds how long Start waits for a started server to answer.
const StartTimeout = 60 * time.Second

var (
	buildMu  sync.Mutex
	buildBin string
)

// Binary builds the server once per test process (Go's build cache makes
// a rebuild a link) and returns its path. The build runs in the tools
// module with GOWORK=off and -mod=readonly, so it uses exactly the pinned
// versions; GOFLAGS from the environment still apply.
func Binary(t testing.TB) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildBin != "" {
		return buildBin
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("s3server: cannot locate the tools module")
	}
	dir, err := os.MkdirTemp("", "s3server-bin-")
	if err != nil {
		t.Fatalf("s3server: %v", err)
	}
	// Kept for the process's other tests; removed when the process exits
	// through the test binary's TestMain (Cleanup), or left in the
	// temporary directory otherwise.
	bin := filepath.Join(dir, "versitygw")
	start := time.Now()
	cmd := exec.Command("go", "build", "-mod=readonly", "-o", bin, "github.com/versity/versitygw/cmd/versitygw")
	cmd.Dir = filepath.Join(filepath.Dir(self), "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("s3server: building VersityGW in %s: %v\n%s", cmd.Dir, err, out.Bytes())
	}
	t.Logf("s3server: built VersityGW in %v", time.Since(start).Round(time.Millisecond))
	buildBin = bin
	return bin
}

// Cleanup removes the binary Binary built; call it from TestMain after
// m.Run.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildBin != "" {
		os.RemoveAll(filepath.Dir(buildBin))
		buildBin = ""
	}
}

// Server is one VersityGW process serving the buckets under Root. Its
// methods are meant for the test goroutine.
type Server struct {
	// Addr is the server's host:port.
	Addr string
	// Root is the POSIX backend's directory: a directory per bucket, a
	// file per object.
	Root string

	t    testing.TB
	bin  string
	cmd  *exec.Cmd
	done chan struct{}
	log  *bytes.Buffer
}

// Start builds the server (Binary) and starts it on a free port, over a
// new directory; it returns once the server answers its health check.
// The server is killed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{Root: t.TempDir(), t: t, bin: Binary(t)}
	t.Cleanup(func() { s.Kill() })
	s.Restart()
	return s
}

// Restart starts the server again over the same directory and on the same
// address (a client keeps working across a kill and a restart); the
// previous process must have been killed.
func (s *Server) Restart() {
	t := s.t
	t.Helper()
	if s.cmd != nil {
		select {
		case <-s.done:
		default:
			t.Fatal("s3server: Restart while the server runs")
		}
	}
	if s.Addr == "" {
		addr, err := freeport.Addr()
		if err != nil {
			t.Fatalf("s3server: %v", err)
		}
		s.Addr = addr
	}
	addr := s.Addr
	s.log = &bytes.Buffer{}
	s.cmd = exec.Command(s.bin, "--access", AccessKey, "--secret", SecretKey, "--port", addr, "--health", "/health", "posix", s.Root)
	s.cmd.Stdout, s.cmd.Stderr = &syncWriter{w: s.log}, &syncWriter{w: s.log}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("s3server: start %s: %v", s.bin, err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { // owned by the Server: ends when the process does
		cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond) // polling: the process has no readiness signal but its port
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-s.done:
			t.Fatalf("s3server: VersityGW exited before it answered: %v\n%s", s.cmd.ProcessState, s.Log())
		case <-ctx.Done():
			t.Fatalf("s3server: VersityGW did not answer at %s within %v (last: %v)\n%s", addr, StartTimeout, err, s.Log())
		case <-tick.C:
		}
	}
}

// Kill SIGKILLs the server and waits until the process is gone; a server
// already dead is left as it is.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.t.Errorf("s3server: kill: %v", err)
	}
	<-s.done
}

// Log returns what the server printed.
func (s *Server) Log() string {
	if s.log == nil {
		return ""
	}
	logMu.Lock()
	defer logMu.Unlock()
	return s.log.String()
}

var logMu sync.Mutex

type syncWriter struct{ w *bytes.Buffer }

func (w *syncWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return w.w.Write(p)
}

// String names the server in test logs.
func (s *Server) String() string { return fmt.Sprintf("VersityGW at %s over %s", s.Addr, s.Root) }
