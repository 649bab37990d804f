package netns_test

import (
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/netns"
)

// loopbackServer serves on 127.0.0.1, which no host reaches by itself:
// each connection is echoed, and the bytes it sent are counted on got.
func loopbackServer(t *testing.T) (addr string, got <-chan int64) {
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
				n, _ := io.Copy(c, c)
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
	upstream, got := loopbackServer(t)
	addr, err := n.Forward(upstream)
	require.NoError(t, err)
	host, _, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.Equal(t, n.Gateway().String(), host, "the hosts dial the gateway")

	// From host a, over its link: 100000 bytes reach the loopback server.
	send := n.Host("a").Command(t.Context(), os.Args[0], "-test.run=^$")
	send.Env = append(os.Environ(), helperEnv+"=send "+addr+" 100000")
	out, err := send.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, int64(100000), <-got)

	// Both ways, from the caller (which reaches the gateway too); Close
	// then ends the relayed connection.
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	echo(t, c, "hello", 5*time.Second)
	require.NoError(t, n.Close())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "Close ends the relayed connections")
	_, err = n.Forward(upstream)
	require.ErrorContains(t, err, "closed Net")
}
