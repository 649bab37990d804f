package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// flood holds n silent TCP connections from the local address from to the
// address to, and reopens each one the worker closes, until its context
// ends: the slowloris a stranger on the network can mount against a
// worker's peer port.
type flood struct {
	n        int
	from, to string
	opened   atomic.Int64 // connections opened, reopenings included
	live     atomic.Int64 // open now, as far as the flood can tell
	first    atomic.Int64 // connections opened at least once
	failures atomic.Int64 // dials that failed
	ready    chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

// floodDials bounds the flood's dials in flight, so that its first burst
// fits the kernel's accept queue instead of having SYNs dropped.
const floodDials = 256

func startFlood(ctx context.Context, n int, from, to string) *flood {
	ctx, cancel := context.WithCancel(ctx)
	f := &flood{n: n, from: from, to: to, ready: make(chan struct{}), cancel: cancel}
	sem := make(chan struct{}, floodDials)
	f.wg.Add(n)
	for range n {
		go f.hold(ctx, sem)
	}
	return f
}

func (f *flood) hold(ctx context.Context, sem chan struct{}) {
	defer f.wg.Done()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(f.from)}, Timeout: 10 * time.Second}
	var buf [1]byte
	once := false
	for ctx.Err() == nil {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		c, err := d.DialContext(ctx, "tcp", f.to)
		<-sem
		if err != nil {
			f.failures.Add(1)
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		f.opened.Add(1)
		f.live.Add(1)
		if !once {
			once = true
			if f.first.Add(1) == int64(f.n) {
				f.once.Do(func() { close(f.ready) })
			}
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		c.Read(buf[:]) // until the worker closes it
		stop()
		c.Close()
		f.live.Add(-1)
	}
}

// stop ends the flood and waits for its goroutines.
func (f *flood) stop() {
	f.cancel()
	f.wg.Wait()
}

// checkFiles makes sure this process may hold n more open files: Go raises
// the soft limit to the hard one at start-up, so the hard limit is what
// counts.
func checkFiles(n int) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("open-file limit: %w", err)
	}
	need := uint64(n) + 1024
	if rl.Cur >= need {
		return nil
	}
	if rl.Max < need {
		return fmt.Errorf("-idle-conns %d needs %d open files, but the hard limit (ulimit -Hn) is %d: raise it or lower -idle-conns", n, need, rl.Max)
	}
	rl.Cur = need
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("raising the open-file limit to %d: %w", need, err)
	}
	return nil
}

// envFlood marks the flood process in its environment (a test binary
// re-executed as one knows it by that).
const envFlood = "ELASTICTRAIN_RECOVERY_BENCH_FLOOD"

// floodMain is the flood process: it holds the flood until its standard
// input closes, writing "opened-once open opened failures" lines to stdout
// every 20 ms.
func floodMain(c *config, stdout, stderr io.Writer) int {
	if c.idleConns < 1 {
		fmt.Fprintln(stderr, "recovery-bench flood: -idle-conns must be at least 1")
		return 2
	}
	if err := checkFiles(c.idleConns); err != nil {
		fmt.Fprintf(stderr, "recovery-bench flood: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		io.Copy(io.Discard, os.Stdin) // the bench closes it to stop the flood
		cancel()
	}()
	f := startFlood(ctx, c.idleConns, c.idleFrom, c.floodTo)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		fmt.Fprintf(stdout, "%d %d %d %d\n", f.first.Load(), f.live.Load(), f.opened.Load(), f.failures.Load())
	}
	f.stop()
	return 0
}

// floodProc is the bench's side of a flood process: the flood comes from
// another process, as a stranger's would, not from the process that hosts
// the embedded store.
type floodProc struct {
	cmd                    *exec.Cmd
	stdin                  io.WriteCloser
	live, opened, failures atomic.Int64
	ready, exited          chan struct{}
	readErr                error
}

func startFloodProc(n int, from, to string) (*floodProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-flood-to", to, "-idle-conns", fmt.Sprint(n), "-idle-from", from)
	cmd.Env = append(os.Environ(), envFlood+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("flood process: %w", err)
	}
	p := &floodProc{cmd: cmd, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(out)
		isReady := false
		for sc.Scan() {
			var v [4]int64
			if _, err := fmt.Sscan(sc.Text(), &v[0], &v[1], &v[2], &v[3]); err != nil {
				p.readErr = fmt.Errorf("flood process said %q: %w", sc.Text(), err)
				return
			}
			p.live.Store(v[1])
			p.opened.Store(v[2])
			p.failures.Store(v[3])
			if !isReady && v[0] == int64(n) {
				isReady = true
				close(p.ready)
			}
		}
	}()
	return p, nil
}

// stop ends the flood process and waits for it.
func (p *floodProc) stop() error {
	p.stdin.Close()
	t := time.AfterFunc(10*time.Second, func() { p.cmd.Process.Kill() })
	defer t.Stop()
	<-p.exited
	err := p.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("flood process: %w", err)
	}
	return p.readErr
}
