package trainer_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// logLine is one record a recorder saw: its time, message and attributes
// as "key=value" text.
type logLine struct {
	at   time.Time
	text string
}

// recorder is a slog.Handler that hands every record to a channel.
type recorder struct {
	lines chan logLine
	attrs string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	b.WriteString(r.attrs)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	select {
	case r.lines <- logLine{at: time.Now(), text: b.String()}:
	default:
	}
	return nil
}
func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(r.attrs)
	for _, a := range as {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	return &recorder{lines: r.lines, attrs: b.String()}
}
func (r *recorder) WithGroup(string) slog.Handler { return r }

// waitLines collects the lines that contain want until n of them arrived
// (or 20 s passed) and returns them.
func waitLines(t *testing.T, lines <-chan logLine, want string, n int) []logLine {
	t.Helper()
	var got []logLine
	deadline := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case l := <-lines:
			if strings.Contains(l.text, want) {
				got = append(got, l)
			}
		case <-deadline:
			t.Fatalf("saw %d lines with %q in 20 s, want %d: %v", len(got), want, n, got)
		}
	}
	return got
}

// requireEvery3s checks that the lines came at most 3 s apart.
func requireEvery3s(t *testing.T, ls []logLine) {
	t.Helper()
	for i := 1; i < len(ls); i++ {
		require.LessOrEqual(t, ls[i].at.Sub(ls[i-1].at), 3*time.Second, "line %d came %v after the one before: %v", i, ls[i].at.Sub(ls[i-1].at), ls)
	}
}

// loggedWorker starts one worker whose only logger is WithLogger's.
func loggedWorker(t *testing.T, st store.Store, min, epochs int, lines chan logLine, mutate ...func(*Config)) (cancel func(), done <-chan error) {
	prob := trainertest.NewProblem(480, 4, 0.05, 7)
	m := trainertest.NewModel(4)
	m.StepDelay = 2 * time.Millisecond
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch = 16
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.JobID = testredis.JobID(t)
	cfg.Epochs = epochs
	cfg.Elastic.MinWorkers = min
	cfg.Elastic.LastCall = 300 * time.Millisecond
	cfg.Elastic.LeaseTTL = time.Second
	cfg.Elastic.HeartbeatInterval = 100 * time.Millisecond
	cfg.Sync.Secret = []byte("a test secret of 32 bytes length")
	for _, f := range mutate {
		f(&cfg)
	}
	require.Nil(t, cfg.Elastic.Logger)
	tr, err := New(m.Params(), NewSGD(0.1), loader, m.Step, st, cfg, WithLogger(slog.New(&recorder{lines: lines})))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	ch, fin := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(fin)
		defer loader.Close()
		_, err := tr.Run(ctx)
		ch <- err
	}()
	var once stdsync.Once
	cancel = func() { once.Do(func() { stop(); <-fin }) }
	t.Cleanup(cancel)
	return cancel, ch
}

// A lone worker below MinWorkers once waited its whole join timeout (10
// min) without a line unless Config.Elastic.Logger was set too. With only
// WithLogger, the wait is logged when it begins and then at least every
// 3 s, with the counts.
func TestAWaitBelowMinWorkersIsLoggedWithTheCounts(t *testing.T) {
	lines := make(chan logLine, 1024)
	start := time.Now()
	cancel, _ := loggedWorker(t, store.NewRedis(testredis.Client(t)), 2, 1, lines)
	got := waitLines(t, lines, "waiting for workers", 3)
	cancel()
	require.Less(t, got[0].at.Sub(start), 3*time.Second, "the first line comes as the wait begins: %v", got)
	requireEvery3s(t, got)
	for _, l := range got {
		require.Contains(t, l.text, "1 of min 2", "%s", l.text)
	}
}

// A Redis outage was silent with only WithLogger set. Now it is logged
// when it begins and then at least every 3 s, with the real cause.
func TestARedisOutageIsLoggedWithItsCause(t *testing.T) {
	srv := testredis.Start(t)
	// Deadlines long beside a refused connection's answer (as in
	// TestAStoreThatCannotHealSaysSoWithItsCause): a loaded machine still
	// sees each attempt end with its cause.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { client.Close() })
	lines := make(chan logLine, 1024)
	// go-redis' own lines go to the same logger, not to stderr.
	redisLines := make(chan logLine, 1024)
	redis.SetLogger(store.RedisLogger(slog.New(&recorder{lines: redisLines})))
	defer redis.SetLogger(store.RedisLogger(nil))
	cancel, _ := loggedWorker(t, store.NewRedis(client), 1, 1000, lines, func(cfg *Config) { cfg.Elastic.LeaseTTL = 4 * time.Second })
	waitLines(t, lines, "round formed", 1)
	srv.Stop()
	stopped := time.Now()
	got := waitLines(t, lines, "store ", 3)
	require.NoError(t, srv.Restart()) // so that go-redis' dialer stops before the leak check
	cancel()
	waitLines(t, redisLines, "component=go-redis", 1)
	require.Less(t, got[0].at.Sub(stopped), 3*time.Second, "the first line comes as the outage begins: %v", got)
	requireEvery3s(t, got)
	// The first failure may be the dropped connection (EOF); from then on
	// the server refuses connections, and the lines say so.
	for _, l := range got[1:] {
		require.Contains(t, l.text, "connection refused", "the real cause: %s", l.text)
	}
}

// A store error that cannot heal (a name that does not resolve, a server
// that speaks another protocol) is logged as it happens with its cause,
// again while it lasts, and once more when the outage budget runs out;
// Run returns elastic.ErrStoreUnavailable.
func TestAStoreThatCannotHealSaysSoWithItsCause(t *testing.T) {
	// A server that answers every connection with something other than
	// the Redis protocol.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
		}
	}()
	// The name is looked up through a DNS server of the test's own that
	// answers every query "no such name": the machine's resolver may take
	// longer than the dial's deadline to say so (then the cause read
	// "i/o timeout"), which is not what this test is about.
	dialer := &net.Dialer{Resolver: nxdomainResolver(t)}
	for _, c := range []struct{ name, addr, cause string }{
		{"a name that does not resolve", "no-such-host.invalid:6379", "no such host"},
		{"a server of another protocol", ln.Addr().String(), "HTTP/1.1 400"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The dial's and the agent's deadlines (half a lease) are long
			// beside the answers, which come from loopback servers, so that
			// on a loaded machine every attempt still ends with its cause
			// rather than a deadline.
			client := redis.NewClient(&redis.Options{Addr: c.addr, MaxRetries: -1, DialTimeout: 2 * time.Second,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return dialer.DialContext(ctx, network, addr)
				}})
			t.Cleanup(func() { client.Close() })
			lines := make(chan logLine, 1024)
			_, done := loggedWorker(t, store.NewRedis(client), 1, 1, lines, func(cfg *Config) {
				cfg.Elastic.OutageBudget = 2500 * time.Millisecond
				cfg.Elastic.LeaseTTL = 4 * time.Second
			})
			got := waitLines(t, lines, "store ", 3)
			requireEvery3s(t, got)
			for _, l := range got {
				require.Contains(t, l.text, c.cause, "the real cause: %s", l.text)
			}
			require.Contains(t, waitLines(t, lines, "giving up", 1)[0].text, c.cause)
			require.ErrorIs(t, <-done, elastic.ErrStoreUnavailable)
		})
	}
}

// nxdomainResolver is a resolver whose DNS server, started for the test on
// a loopback UDP port, answers every query with NXDOMAIN (RFC 1035 4.1.1:
// the query's ID and question echoed, QR set, RCODE 3).
func nxdomainResolver(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			resp := append([]byte(nil), buf[:n]...)
			resp[2] = 0x80 | resp[2]&0x01 // QR, and the query's RD
			resp[3] = 0x80 | 3            // RA, RCODE 3: no such name
			resp[6], resp[7], resp[8], resp[9], resp[10], resp[11] = 0, 0, 0, 0, 0, 0
			pc.WriteTo(resp, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}
