//go:build unix

package sync

import (
	"errors"
	"net"
	"syscall"
)

// peek says, without reading, whether bytes (or the end of the stream)
// wait on c.
func peek(c net.Conn) peekResult {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peekNone
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return peekNone
	}
	res := peekNone
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n > 0:
			res = peekData
		case n == 0 && err == nil:
			res = peekClosed
		}
	})
	return res
}

// fdLimit is the process's limit on open files, 0 if unknown.
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0
	}
	return int(min(rl.Cur, 1<<30))
}

// isFDLimit reports an accept error caused by the file descriptor limit.
func isFDLimit(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
