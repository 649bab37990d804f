package faultinject_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
)

// echoServer accepts connections and echoes them until closed; t.Cleanup
// stops it and waits for its goroutines.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T, upstream string) *faultinject.Proxy {
	t.Helper()
	p, err := faultinject.NewProxy("127.0.0.1:0", upstream)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func roundTrip(t *testing.T, c net.Conn, msg []byte) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Write(msg)
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
}

func TestProxyForwardsAndCaptures(t *testing.T) {
	p := newProxy(t, echoServer(t))
	p.SetCapture(5)
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("hello, world"))
	roundTrip(t, c, bytes.Repeat([]byte{7}, 1<<20)) // more than one chunk
	require.Equal(t, [][]byte{[]byte("hello")}, p.Captured())
	// The proxy counts a chunk after writing it, so the echo can reach us
	// a moment before the last count: wait for the condition.
	want := int64(2 * (12 + 1<<20))
	require.Eventually(t, func() bool { return p.Stats().Bytes == want }, 10*time.Second, time.Millisecond,
		"bytes forwarded: %d, want %d", p.Stats().Bytes, want)
}

// Latency delays each direction: a round trip takes at least twice it.
func TestProxyLatency(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("warm"))
	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	roundTrip(t, c, []byte("slow"))
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
}

// Bandwidth: 64 KiB at 256 KiB/s each way takes at least about 0.2 s.
func TestProxyBandwidth(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	p.SetBandwidth(256 << 10)
	start := time.Now()
	roundTrip(t, c, make([]byte, 64<<10))
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

// A blackhole holds the bytes (nothing arrives while it lasts) and delivers
// them when it lifts, on open and on new connections.
func TestProxyBlackhole(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("before"))
	p.SetBlackhole(true)
	_, err := c.Write([]byte("held"))
	require.NoError(t, err)
	c2 := dial(t, p.Addr()) // accepted, but not connected upstream yet
	_, err = c2.Write([]byte("new"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = c.Read(buf)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout(), "nothing arrives through a blackhole: %v", err)
	p.SetBlackhole(false)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "held", string(buf))
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = io.ReadFull(c2, buf[:3])
	require.NoError(t, err)
	require.Equal(t, "new", string(buf[:3]))
}

// Cut resets open connections; with refusal on, new ones are reset at once;
// Heal lets new connections through again.
func TestProxyCutAndRefuse(t *testing.T) {
	p := newProxy(t, echoServer(t))
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("x"))
	p.SetRefuse(true)
	require.Equal(t, 1, p.Cut())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the cut connection ends: %v", err)

	// A refused connection is accepted and reset at once: the reset may
	// reach the client while it is still connecting, or on its first read.
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		t.Cleanup(func() { c2.Close() })
		require.NoError(t, c2.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = c2.Read(make([]byte, 1))
		require.Error(t, err)
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "a refused connection ends: %v", err)
	} else {
		require.ErrorIs(t, err, syscall.ECONNRESET, "a refused connection is reset")
	}
	require.Equal(t, 1, p.Stats().Refused)

	p.Heal()
	roundTrip(t, dial(t, p.Addr()), []byte("again"))
}

// Close ends every connection, including held ones, and returns only when
// every goroutine is gone (goleak in TestMain checks the rest).
func TestProxyCloseEndsEverything(t *testing.T) {
	p, err := faultinject.NewProxy("127.0.0.1:0", echoServer(t))
	require.NoError(t, err)
	c := dial(t, p.Addr())
	roundTrip(t, c, []byte("x"))
	p.SetBlackhole(true)
	dial(t, p.Addr())
	_, err = c.Write([]byte("held"))
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "twice is fine")
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded))
}
