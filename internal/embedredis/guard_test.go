package embedredis

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func start(t *testing.T) (*Server, *redis.Client) {
	t.Helper()
	s, err := Start(context.Background(), "")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { c.Close() })
	return s, c
}

// raw sends b on a new connection and returns everything the server
// answers until it closes the connection (or 10 s pass: then the test fails).
func raw(t *testing.T, s *Server, b []byte, oneByteAtATime bool) string {
	t.Helper()
	c, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	// Each request below ends with the byte that breaks a limit, so the
	// server has read all of it when it closes (no reset), and the writes
	// and the half-close succeed.
	if oneByteAtATime {
		for i := range b {
			_, err = c.Write(b[i : i+1])
			require.NoError(t, err)
		}
	} else {
		_, err = c.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	var out strings.Builder
	_, err = bufio.NewReader(c).WriteTo(&out)
	require.NoError(t, err, "the server closes the connection: %q", out.String())
	return out.String()
}

// A header that declares a bulk string or an argument count past the
// limits, or a line longer than any header, once made the embedded server
// allocate what it declared: "$999999999999" from any local process ended
// the launcher that served the job's store with an out-of-memory crash
// (this test's process, before the guard). Now the server closes that
// connection; the requests before the line are answered, and the server
// serves everyone else as before.
func TestAHeaderPastTheLimitsClosesItsConnectionOnly(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	set := "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n"
	for name, tc := range map[string]struct{ req, reply string }{
		"a bulk string of 1 TB":  {"*1\r\n$999999999999\r\n", ""},
		"a bulk string one past": {"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$33554433\r\n", ""},
		"a billion arguments":    {"*1000000000\r\n", ""},
		"a header of 65 bytes":   {"*1\r\n$" + strings.Repeat("1", 64), ""},
		"an endless line":        {strings.Repeat("x", maxLine+1), ""},
		"after a good request":   {set + "*1\r\n$999999999999\r\n", "+OK\r\n"},
	} {
		t.Run(name, func(t *testing.T) {
			for _, slow := range []bool{false, true} {
				if slow && len(tc.req) > 1000 {
					continue
				}
				require.Equal(t, tc.reply, raw(t, s, []byte(tc.req), slow), "byte by byte: %v", slow)
			}
			require.NoError(t, c.Set(ctx, "after", name, 0).Err(), "the server serves others")
			v, err := c.Get(ctx, "after").Result()
			require.NoError(t, err)
			require.Equal(t, name, v)
		})
	}
}

// Requests within the limits pass whole, however the reads cut them: a
// value of 1 MiB, one of the largest allowed, a request sent a byte at a
// time, and a pipeline of many.
func TestRequestsWithinTheLimitsPass(t *testing.T) {
	s, c := start(t)
	ctx := context.Background()
	big := strings.Repeat("v", 1<<20)
	require.NoError(t, c.Set(ctx, "big", big, 0).Err())
	got, err := c.Get(ctx, "big").Result()
	require.NoError(t, err)
	require.Equal(t, big, got)
	largest := strings.Repeat("w", MaxBulk)
	require.NoError(t, c.Set(ctx, "largest", largest, 0).Err())
	n, err := c.StrLen(ctx, "largest").Result()
	require.NoError(t, err)
	require.EqualValues(t, MaxBulk, n)

	require.Equal(t, "+OK\r\n$2\r\nv1\r\n",
		raw(t, s, []byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), true))
	pipe := c.Pipeline()
	for i := range 1000 {
		pipe.Set(ctx, "p", i, 0)
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)
	v, err := c.Get(ctx, "p").Int()
	require.NoError(t, err)
	require.Equal(t, 999, v)
}

// FuzzGuard: any byte stream, cut into reads anywhere, is handed on as a
// prefix of itself, whole when no line breaks a limit, and no header past
// the limits is ever handed on complete (with its '\n').
func FuzzGuard(f *testing.F) {
	f.Add([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n"), uint8(3))
	f.Add([]byte("*1\r\n$999999999999\r\n"), uint8(1))
	f.Add([]byte("*2\r\n$-1\r\n*-1\r\n$x\r\n\n\n"), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		step := int(cut)%17 + 1
		var c guardConn
		handed, stopped := 0, false
		for i := 0; i < len(b) && !stopped; i += step {
			piece := b[i:min(i+step, len(b))]
			n, err := c.scan(piece)
			if n < 0 || n > len(piece) || (err == nil && n != len(piece)) {
				t.Fatalf("scan handed on %d of %d bytes (err %v)", n, len(piece), err)
			}
			handed += n
			stopped = err != nil
		}
		// Replay what was handed on: every complete header in it is
		// within the limits.
		var skip int64
		for _, line := range strings.SplitAfter(string(b[:handed]), "\n") {
			if skip > 0 {
				d := min(skip, int64(len(line)))
				skip -= d
				line = line[d:]
			}
			if !strings.HasSuffix(line, "\n") || len(line) < 2 || (line[0] != '*' && line[0] != '$') {
				continue
			}
			v, err := strconv.ParseInt(strings.TrimRight(line[1:], "\r\n"), 10, 64)
			if err != nil {
				continue
			}
			if line[0] == '$' && v > MaxBulk || line[0] == '*' && v > MaxArgs {
				t.Fatalf("header %q handed on", line)
			}
			if line[0] == '$' && v >= 0 {
				skip = v + 2
			}
		}
		if !stopped && handed != len(b) {
			t.Fatalf("handed on %d of %d bytes without a reason", handed, len(b))
		}
	})
}
