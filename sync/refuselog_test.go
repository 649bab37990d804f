package sync

import (
	"context"
	"github.com/elastictrain/elastictrain/sync/internal/wire"
	"io"
	"log/slog"
	"net"
	gosync "sync"
	"testing"
	"time"
)

// captureHandler is a slog.Handler that keeps every record.
type captureHandler struct {
	mu    *gosync.Mutex
	recs  *[]slog.Record
	attrs []slog.Attr
}

func newCapture() *captureHandler {
	return &captureHandler{mu: new(gosync.Mutex), recs: new([]slog.Record)}
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	*h.recs = append(*h.recs, r)
	h.mu.Unlock()
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *captureHandler) WithGroup(string) slog.Handler { return h }

// records returns the records with message msg, each as its attributes.
func (h *captureHandler) records(msg string) []map[string]slog.Value {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range *h.recs {
		if r.Message != msg {
			continue
		}
		m := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
		out = append(out, m)
	}
	return out
}

// garbage dials addr, sends bytes that are no handshake and reads until
// the Transport closes the connection (it counts and logs the refusal
// before it answers).
func garbage(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{0xff, 0, 0}); err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
}

// TestRefusedConnectionWarningsAreRateLimited: a flood of garbage
// connections logs the first refuseLogBurst refusals of an interval one
// by one and then one summary line with the count of the others and the
// last error (it logged one WARN line per connection: 1000+ for a flood of
// 3000), while TransportStats counts every refusal.
func TestRefusedConnectionWarningsAreRateLimited(t *testing.T) {
	const flood = 1000
	h := newCapture()
	cfg := tcpConfig(t)
	cfg.Logger = slog.New(h)
	tr, err := Listen(context.Background(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer tr.Close()
	clock := withClock(tr)
	for range flood {
		garbage(t, tr.Addr())
	}
	// A refusal of another kind in the same interval is logged on its
	// own line: the flood does not hide a dialer of another job.
	c, err := net.DialTimeout("tcp", tr.Addr(), 10*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hello := wire.AppendHello(nil, &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: 1, To: 0, JobID: "another-job"})
	if err := wire.WriteMsg(c, nil, wire.MsgHello, hello); err != nil {
		t.Fatalf("hello: %v", err)
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	c.Close()
	const one, summary = "sync: refused connection", "sync: refused connections not logged one by one"
	if n := len(h.records(one)); n != refuseLogBurst+1 {
		t.Errorf("%d refusals logged one by one in the flood's interval, want %d (of the flood) and the other job's", n, refuseLogBurst)
	}
	// The next interval: its first refusal is logged, after the summary
	// of the flood's interval (unless its timer fired already).
	clock.advance(refuseLogInterval)
	garbage(t, tr.Addr())
	tr.Close()
	if n := len(h.records(one)); n != refuseLogBurst+2 {
		t.Errorf("%d refusals logged one by one, want %d", n, refuseLogBurst+2)
	}
	sums := h.records(summary)
	var suppressed uint64
	for _, s := range sums {
		suppressed += s["suppressed"].Uint64()
		if s["err"].String() == "" || s["last_remote"].String() == "" {
			t.Errorf("summary %v without the last error and remote", s)
		}
	}
	t.Logf("%d connections: %d lines one by one, %d summary line(s): %v", flood+1, len(h.records(one)), len(sums), sums)
	// One line, unless the interval's timer (real time) fired during the
	// flood: then the count is split, and still exact.
	if len(sums) < 1 || suppressed != flood-refuseLogBurst {
		t.Errorf("%d summary lines suppressing %d refusals, want them to suppress %d", len(sums), suppressed, flood-refuseLogBurst)
	}
	if len(sums) > 0 && sums[len(sums)-1]["refused_total"].Uint64() != flood+1 {
		t.Errorf("the last summary gives %v refusals in all, want %d (the flood's and the other job's)", sums[len(sums)-1]["refused_total"], flood+1)
	}
	st := tr.Stats()
	if st.Refused != flood+2 || st.RefusedMalformed != flood+1 || st.RefusedJob != 1 {
		t.Errorf("stats count %d refusals (%d malformed, %d of another job), want %d (%d, 1)", st.Refused, st.RefusedMalformed, st.RefusedJob, flood+2, flood+1)
	}
}
