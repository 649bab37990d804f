package embedredis

import (
	"fmt"
	"io"
	"net"
	"strconv"
)

// Limits of a request, as a Redis server enforces them (its
// proto-max-bulk-len and the length of an inline header): the embedded
// server allocates a bulk string's buffer from its declared length before
// the bytes arrive, so without them one header such as "$999999999999"
// from any local process ends the launcher with an out-of-memory crash.
const (
	// MaxBulk is the longest bulk string a request may carry, in bytes
	// (32 MiB; the job's own values are at most a few hundred KiB).
	MaxBulk = 32 << 20
	// MaxArgs is the most arguments one request may carry.
	MaxArgs = 1 << 20
	// maxHeader is the longest header line ("*N" or "$N") in bytes.
	maxHeader = 64
	// maxLine is the longest line of any other kind in bytes (the server
	// buffers a line whole before it refuses it).
	maxLine = 64 << 10
)

// guardConn is a client's connection as the embedded server reads it: the
// request headers are checked as they pass (RESP: "*N\r\n" then N bulk
// strings "$L\r\n" and L bytes and "\r\n"), and so is the length of any
// other line. A line past the limits is not handed on: the server reads
// the end of the stream there, answers the requests before it and closes
// the connection, having allocated nothing for it. (No error line: the
// server reads a connection's next request while it answers the one
// before, so a line of the guard's could overtake those answers.) Other
// malformed input is the server's to refuse. Only the server's reader
// goroutine of the connection calls Read.
type guardConn struct {
	net.Conn
	head    []byte // the line read so far, up to maxHeader+1 bytes of it
	lineLen int    // the length of the line read so far
	// skip is the bytes of a bulk string (and its CRLF) still to pass
	// unchecked.
	skip int64
	// bad is why a line broke a limit; from then on Read returns io.EOF.
	bad error
}

func (c *guardConn) Read(p []byte) (int, error) {
	if c.bad != nil {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(p)
	ok, bad := c.scan(p[:n])
	if bad != nil {
		c.bad = bad
		if ok == 0 {
			return 0, io.EOF
		}
		return ok, nil
	}
	return n, err
}

// scan follows the request stream through b. It returns how many bytes
// of b may be handed on and, when a line broke a limit, why: then the
// bytes of that line are withheld (all of b when it began in an earlier
// read, as the server then waits for its end).
func (c *guardConn) scan(b []byte) (int, error) {
	for i := 0; i < len(b); {
		if c.skip > 0 {
			d := min(c.skip, int64(len(b)-i))
			c.skip -= d
			i += int(d)
			continue
		}
		start, earlier := i, c.lineLen
		for i < len(b) && b[i] != '\n' {
			i++
		}
		if room := maxHeader + 1 - len(c.head); room > 0 {
			c.head = append(c.head, b[start:start+min(room, i-start)]...)
		}
		c.lineLen += i - start
		withheld := start
		if earlier > 0 {
			withheld = 0
		}
		if header := len(c.head) > 0 && (c.head[0] == '*' || c.head[0] == '$'); header && c.lineLen > maxHeader {
			return withheld, fmt.Errorf("header longer than %d bytes", maxHeader)
		} else if c.lineLen > maxLine {
			return withheld, fmt.Errorf("line longer than %d bytes", maxLine)
		}
		if i == len(b) {
			return len(b), nil // the line goes on in the next read
		}
		i++ // its '\n'
		err := c.header()
		c.head, c.lineLen = c.head[:0], 0
		if err != nil {
			return withheld, err
		}
	}
	return len(b), nil
}

// header checks a complete line, c.head (without its '\n').
func (c *guardConn) header() error {
	l := c.head
	if len(l) == 0 || (l[0] != '*' && l[0] != '$') {
		return nil // not a header this guard reads: the server refuses it
	}
	if l[len(l)-1] == '\r' {
		l = l[:len(l)-1]
	}
	v, err := strconv.ParseInt(string(l[1:]), 10, 64)
	if err != nil {
		return nil // the server refuses it
	}
	switch {
	case l[0] == '*' && v > MaxArgs:
		return fmt.Errorf("invalid multibulk length (%d arguments, at most %d)", v, MaxArgs)
	case l[0] == '$' && v > MaxBulk:
		return fmt.Errorf("invalid bulk length (%d bytes, at most %d)", v, MaxBulk)
	case l[0] == '$' && v >= 0:
		c.skip = v + 2
	}
	return nil
}
