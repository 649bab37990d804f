package netns_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/netns"
)

// The test binary re-executed inside a namespace with helperEnv set runs
// one small network program (see helperMain).
const helperEnv = "ELASTICTRAIN_NETNS_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	goleak.VerifyTestMain(m)
}

// helperMain runs mode "echo ADDR" (serve an echo on ADDR, print
// "LISTEN addr"), "sink ADDR" (accept one connection, read it to the end,
// print "GOT n") or "send ADDR N" (send N bytes to ADDR, exit).
func helperMain(mode string) int {
	f := strings.Fields(mode)
	switch f[0] {
	case "echo":
		ln, err := net.Listen("tcp", f[1])
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		fmt.Println("LISTEN", ln.Addr())
		for {
			c, err := ln.Accept()
			if err != nil {
				return 1
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	case "sink":
		ln, err := net.Listen("tcp", f[1])
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		fmt.Println("LISTEN", ln.Addr())
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		n, _ := io.Copy(io.Discard, c)
		fmt.Println("GOT", n)
		return 0
	case "send":
		n, _ := strconv.Atoi(f[2])
		c, err := net.Dial("tcp", f[1])
		if err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		_, err = io.CopyN(c, zeros{}, int64(n))
		c.Close()
		if err != nil {
			return 1
		}
		return 0
	}
	return 2
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// helper starts the helper in mode on h and returns it with its stdout.
func helper(t *testing.T, h *netns.Host, mode string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := h.Command(context.Background(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// listening waits for the helper's "LISTEN addr" line.
func listening(t *testing.T, sc *bufio.Scanner) string {
	t.Helper()
	require.True(t, sc.Scan(), "helper printed nothing")
	addr, ok := strings.CutPrefix(sc.Text(), "LISTEN ")
	require.True(t, ok, "helper: %s", sc.Text())
	return addr
}

// Hosts have their own addresses and reach each other, and the caller
// reaches them, over the bridge; a program runs inside a host through
// Command and binds that host's address, which no other host has.
func TestHostsHaveTheirOwnAddressesAndTalk(t *testing.T) {
	n := netns.ForTest(t, "a", "b")
	a, b := n.Host("a"), n.Host("b")
	require.NotEqual(t, a.IP(), b.IP())
	require.True(t, n.Prefix().Contains(a.IP()) && n.Prefix().Contains(b.IP()) && n.Prefix().Contains(n.Gateway()))

	_, sc := helper(t, a, "echo "+a.Addr(0))
	addr := listening(t, sc)
	require.True(t, strings.HasPrefix(addr, a.IP().String()+":"), addr)

	// From the caller's namespace, through the bridge.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	echo(t, c, "hello", 5*time.Second)
	require.Equal(t, n.Gateway().String(), c.LocalAddr().(*net.TCPAddr).IP.String(), "the caller talks from the gateway")

	// From host b: its sender connects to a's address from b's.
	_, sink := helper(t, a, "sink "+a.Addr(0))
	sinkAddr := listening(t, sink)
	send := b.Command(context.Background(), os.Args[0], "-test.run=^$")
	send.Env = append(os.Environ(), helperEnv+"=send "+sinkAddr+" 100000")
	require.NoError(t, send.Run())
	require.True(t, sink.Scan())
	require.Equal(t, "GOT 100000", sink.Text())

	// b cannot bind a's address: it is not on b.
	bad := b.Command(context.Background(), os.Args[0], "-test.run=^$")
	bad.Env = append(os.Environ(), helperEnv+"=echo "+a.Addr(0))
	o, _ := bad.Output()
	require.Contains(t, string(o), "ERR")
}

func echo(t *testing.T, c net.Conn, msg string, within time.Duration) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(within)))
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
}

// A cut link passes nothing either way and resets nothing: an open
// connection sees silence, a new one cannot be made; after Restore the
// held bytes arrive on the same connection and new ones connect.
func TestCutLinkIsSilentAndRestoreHeals(t *testing.T) {
	n := netns.ForTest(t, "a")
	a := n.Host("a")
	_, sc := helper(t, a, "echo "+a.Addr(0))
	addr := listening(t, sc)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	echo(t, c, "before", 5*time.Second)

	ctx := context.Background()
	require.NoError(t, a.Cut(ctx))
	require.NoError(t, c.SetDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = c.Write([]byte("during"))
	require.NoError(t, err, "the write is buffered")
	_, err = c.Read(make([]byte, 6))
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "a cut link is silent, not reset: %v", err)
	_, err = net.DialTimeout("tcp", addr, 300*time.Millisecond)
	require.Error(t, err, "no new connection through a cut link")

	require.NoError(t, a.Restore(ctx))
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	buf := make([]byte, 6)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err, "TCP retransmits what was held once the link is back")
	require.Equal(t, "during", string(buf))
	c2, err := net.DialTimeout("tcp", addr, 10*time.Second)
	require.NoError(t, err)
	c2.Close()
}

// Cap limits both directions of a host's link: a transfer cannot beat the
// rate (a lower bound on time, which load cannot break), and the
// qdisc is on both ends; Cap(0) removes it.
func TestCapLimitsBothDirections(t *testing.T) {
	n := netns.ForTest(t, "a")
	a := n.Host("a")
	ctx := context.Background()
	const rate = 8_000_000 // bits/s: 1 MB/s
	const size = 1_000_000
	require.NoError(t, a.Cap(ctx, rate))
	out, err := a.Run(ctx, "tc", "qdisc", "show", "dev", "eth0")
	require.NoError(t, err)
	require.Contains(t, string(out), "tbf")
	require.Contains(t, string(out), "rate 8Mbit")

	// Into the host: the caller sends to a sink on a.
	_, sink := helper(t, a, "sink "+a.Addr(0))
	addr := listening(t, sink)
	start := time.Now()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = io.CopyN(c, zeros{}, size)
	require.NoError(t, err)
	c.Close()
	require.True(t, sink.Scan())
	require.Equal(t, fmt.Sprint("GOT ", size), sink.Text())
	in := time.Since(start)

	// Out of the host: a sends to a sink here.
	ln, err := net.Listen("tcp", n.Gateway().String()+":0")
	require.NoError(t, err)
	defer ln.Close()
	send := a.Command(ctx, os.Args[0], "-test.run=^$")
	send.Env = append(os.Environ(), helperEnv+"=send "+ln.Addr().String()+" "+strconv.Itoa(size))
	require.NoError(t, send.Start())
	conn, err := ln.Accept()
	require.NoError(t, err)
	start = time.Now()
	got, _ := io.Copy(io.Discard, conn)
	outT := time.Since(start)
	conn.Close()
	require.NoError(t, send.Wait())
	require.EqualValues(t, size, got)

	// size bytes at 1 MB/s, less the 32 KiB burst: at least ~0.96 s.
	minT := time.Duration(float64(size-(32<<10)) / (rate / 8) * float64(time.Second) * 0.9)
	require.GreaterOrEqual(t, in, minT, "into the host")
	require.GreaterOrEqual(t, outT, minT, "out of the host")
	t.Logf("1 MB at 8 Mbit/s: in %v, out %v (bound %v)", in, outT, minT)

	require.NoError(t, a.Cap(ctx, 0))
	out, err = a.Run(ctx, "tc", "qdisc", "show", "dev", "eth0")
	require.NoError(t, err)
	require.NotContains(t, string(out), "tbf")
}

// Latency comes from the fault suite's user-space proxy (no netem here): a
// proxy in the caller's namespace on the gateway forwards to a host, and a
// round trip through it takes at least twice the latency set.
func TestLatencyThroughTheFaultProxy(t *testing.T) {
	n := netns.ForTest(t, "a")
	a := n.Host("a")
	_, sc := helper(t, a, "echo "+a.Addr(0))
	addr := listening(t, sc)
	p, err := faultinject.NewProxy(n.Gateway().String()+":0", addr)
	require.NoError(t, err)
	defer p.Close()
	p.SetLatency(100 * time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	echo(t, c, "ping", 10*time.Second)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

// Close kills what runs in the hosts (started through Command or not) and
// removes the namespaces, veths and bridge.
func TestCloseRemovesEverything(t *testing.T) {
	requireNetns(t)
	n, err := netns.New(context.Background(), "a", "b")
	require.NoError(t, err)
	a := n.Host("a")
	cmd := a.Command(context.Background(), "sleep", "600")
	require.NoError(t, cmd.Start())
	ns := []string{a.Namespace(), n.Host("b").Namespace()}
	require.NoError(t, n.Close())
	err = cmd.Wait()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v", err)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
	list, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	for _, name := range ns {
		require.NotContains(t, string(list), name)
	}
	links, err := exec.Command("ip", "-o", "link", "show").Output()
	require.NoError(t, err)
	id := strings.TrimSuffix(strings.TrimPrefix(ns[0], "et-"), "-a")
	require.NotContains(t, string(links), "etb-"+id)
	require.NotContains(t, string(links), "etv-"+id)
	require.NoError(t, n.Close(), "Close twice")
}

// What a killed test binary left behind (named after a process that no
// longer runs) is removed by the next New.
func TestNewSweepsWhatDeadProcessesLeft(t *testing.T) {
	requireNetns(t)
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	id := strconv.FormatInt(int64(gone.Process.Pid), 36) + "-1"
	stale := "et-" + id + "-x"
	require.NoError(t, exec.Command("ip", "netns", "add", stale).Run())
	require.NoError(t, exec.Command("ip", "link", "add", "name", "etb-"+id, "type", "bridge").Run())
	netns.ForTest(t, "a")
	list, _ := exec.Command("ip", "netns", "list").Output()
	require.NotContains(t, string(list), stale)
	require.Error(t, exec.Command("ip", "link", "show", "etb-"+id).Run(), "the stale bridge is gone")
}

// requireNetns skips t where namespaces cannot be made, as ForTest does
// (failing it in CI).
func requireNetns(t *testing.T) {
	t.Helper()
	netns.RequireForTest(t)
}
