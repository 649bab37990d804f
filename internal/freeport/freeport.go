// Package freeport picks loopback TCP ports for servers that a test or a
// harness starts in another process, where the port must be chosen before
// the process binds it.
//
// Asking the kernel for port 0 and closing the listener returns a port of
// the ephemeral range, which any outgoing connection on the machine may take
// before the other process binds it (a busy fault-injection run makes
// hundreds of connections a second). Addr instead draws ports below the
// ephemeral range (read from /proc/sys/net/ipv4/ip_local_port_range on
// Linux), which the kernel never hands out by itself, and checks that each
// is free; only other explicit binds can still collide. Two tests that run
// at once (go test runs packages in parallel, each in a process of its own)
// drew the same port often enough to fail CI once ("bind: address already
// in use" for a fault-suite worker), so a drawn port is also claimed with a
// file created exclusively under the temporary directory: no other caller
// on the machine is handed it again for claimTTL.
package freeport

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// low is the lowest port Addr draws; below it are well-known and
// registered services.
const low = 20000

// Addr returns "127.0.0.1:port" for a port that was free a moment ago and
// that outgoing connections do not take. It falls back to a port of the
// kernel's choosing when no port below the ephemeral range is free after a
// few tries, or the range cannot be read. Errors: only when no loopback
// port can be bound at all.
func Addr() (string, error) {
	if hi := ephemeralStart(); hi > low+100 {
		for range 64 {
			port := low + rand.IntN(hi-low)
			if !claim(port) {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				continue
			}
			addr := l.Addr().String()
			_ = l.Close()
			return addr, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("freeport: %w", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr, nil
}

// ephemeralStart returns the first port of the kernel's ephemeral range, or
// 0 when it is unknown.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 0 || n > 65535 {
		return 0
	}
	return n
}

// claimTTL is how long a port drawn by Addr is not handed out again, to
// any process on the machine (longer than a test's worker takes to bind
// it; a port is drawn anew for every worker start).
const claimTTL = 10 * time.Minute

// claim marks port as drawn, machine-wide, by creating a file for it under
// the temporary directory exclusively; it reports false when another draw
// claimed it within claimTTL. A claim older than that is taken over. When
// the directory cannot be used, every port counts as unclaimed.
func claim(port int) bool {
	dir := filepath.Join(os.TempDir(), "elastictrain-freeport")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	name := filepath.Join(dir, strconv.Itoa(port))
	for range 2 {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err == nil {
			_ = f.Close()
			return true
		}
		if !errors.Is(err, fs.ErrExist) {
			return true
		}
		fi, err := os.Stat(name)
		if err != nil || time.Since(fi.ModTime()) < claimTTL {
			return false
		}
		_ = os.Remove(name) // stale: take it over (one retry)
	}
	return false
}
