package netns_test

import (
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/netns"
)

// loopbackServer serves on 127.0.0.1, which no host reaches by itself:
// with echo each connection is echoed back, else it is read to its end
// and then answered with the number of bytes it sent (as a client that
// half-closes expects its answer); that number goes on got too.
func loopbackServer(t *testing.T, echo bool) (addr string, got <-chan int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	counts := make(chan int64, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				dst := io.Discard
				if echo {
					dst = c
				}
				n, _ := io.Copy(dst, c)
				if !echo {
					c.Write([]byte(strconv.FormatInt(n, 10)))
				}
				counts <- n
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String(), counts
}

// Forward makes a service on the caller's loopback reachable from a host
// through the gateway, relays both ways, and Close ends its connections
// and goroutines (goleak in TestMain checks the latter).
func TestForwardReachesALoopbackServiceFromTheHosts(t *testing.T) {
	requireNetns(t)
	n, err := netns.New(t.Context(), "a")
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	sink, got := loopbackServer(t, false)
	sinkAddr, err := n.Forward(sink)
	require.NoError(t, err)
	host, _, err := net.SplitHostPort(sinkAddr)
	require.NoError(t, err)
	require.Equal(t, n.Gateway().String(), host, "the hosts dial the gateway")

	// From host a, over its link: 100000 bytes reach the loopback server.
	send := n.Host("a").Command(t.Context(), os.Args[0], "-test.run=^$")
	send.Env = append(os.Environ(), helperEnv+"=send "+sinkAddr+" 100000")
	out, err := send.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, int64(100000), <-got)

	// Both ways, from the caller (which reaches the gateway too); Close
	// then ends the relayed connection.
	echoer, _ := loopbackServer(t, true)
	addr, err := n.Forward(echoer)
	require.NoError(t, err)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	echo(t, c, "hello", 5*time.Second)

	// A client that half-closes gets its answer: the end of what it sent
	// reaches the upstream, which answers after it.
	h, err := net.DialTimeout("tcp", sinkAddr, 5*time.Second)
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, h.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = h.Write(make([]byte, 5000))
	require.NoError(t, err)
	require.NoError(t, h.(*net.TCPConn).CloseWrite())
	answer, err := io.ReadAll(h)
	require.NoError(t, err)
	require.Equal(t, "5000", string(answer))
	require.Equal(t, int64(5000), <-got)

	require.NoError(t, n.Close())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "Close ends the relayed connections")
	_, err = n.Forward(echoer)
	require.ErrorContains(t, err, "closed Net")
}
