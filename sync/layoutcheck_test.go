package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// A rank whose wire layout differs from its peers' (another Streams: its
// lanes never complete; another ChunkBytes: its chunks never match) once
// made Connect wait out DialTimeout on every rank, round after round. Now
// the handshake compares the layouts once the peer proved the secret, and
// every rank's Connect fails with a *LayoutError naming the setting and
// the values as configured, and which ranks agree: the ranks that share
// the job's layout are a majority, the odd one is not.
func TestALayoutMismatchFailsConnectOnEveryRankNamingIt(t *testing.T) {
	for _, c := range []struct {
		name    string
		odd     func(*Config)
		setting string
		job     string // the others' value as configured
		value   string // the odd rank's
	}{
		{"streams", func(c *Config) { c.Streams = 1 }, "sync streams", "2", "1"},
		{"chunk bytes", func(c *Config) { c.ChunkBytes = 64 << 10 }, "sync chunk bytes", "262144", "65536"},
	} {
		for odd := range 3 {
			t.Run(fmt.Sprintf("%s at rank %d", c.name, odd), func(t *testing.T) {
				ts, addrs := listenLayouts(t, 3, func(r int, cfg *Config) {
					if r == odd {
						c.odd(cfg)
					}
				})
				rings, errs := tryConnectAll(ts, addrs, 1)
				for _, r := range rings {
					if r != nil {
						r.Close()
						t.Fatal("a round formed from ranks with different layouts")
					}
				}
				want := make([]string, 3)
				for r := range want {
					want[r] = c.job
				}
				want[odd] = c.value
				for r, err := range errs {
					checkLayoutError(t, r, err, c.setting, want)
				}
			})
		}
	}
}

// listenLayouts starts n transports of one job, rank r's Config as set
// makes it, and returns them with their addresses. DialTimeout is never
// waited out: a timeout fails the test.
func listenLayouts(t *testing.T, n int, set func(r int, cfg *Config)) ([]*Transport, []string) {
	t.Helper()
	base := testConfig(t)
	base.DialTimeout = 30 * time.Second
	ts := make([]*Transport, n)
	addrs := make([]string, n)
	for r := range ts {
		cfg := base
		set(r, &cfg)
		ts[r] = listenOne(t, cfg)
		addrs[r] = ts[r].Addr()
	}
	return ts, addrs
}

// Of two ranks whose layouts differ, neither is a majority; a peer that
// dialed before this rank reached Connect of its round (held, in the past
// a hang until DialTimeout) is judged all the same.
func TestALayoutMismatchOfAPairIsNobodysMajority(t *testing.T) {
	base := testConfig(t)
	base.DialTimeout = 30 * time.Second
	odd := base
	odd.DirectBytes = 4 << 10
	refused := make(chan struct{}, 64)
	odd.Logger = slog.New(signalHandler{msg: "sync: refused connection", c: refused})
	a, b := listenOne(t, base), listenOne(t, odd)
	addrs := []string{a.Addr(), b.Addr()}
	errs := make(chan error, 1)
	go func() {
		_, err := a.Connect(context.Background(), World{Round: 7, Rank: 0, Addrs: addrs})
		errs <- err
	}()
	// Rank 1 reaches Connect once rank 0's dial was judged (refused on
	// its layout, which rank 1 remembers for round 7). Rank 0's Connect
	// may end before rank 1 logged the refusal (it ends on that refusal:
	// the CI's race pass saw it first), so only the refusal is waited for.
	select {
	case <-refused:
	case <-time.After(base.DialTimeout):
		t.Fatal("rank 1 never judged rank 0's dial")
	}
	_, errB := b.Connect(context.Background(), World{Round: 7, Rank: 1, Addrs: addrs})
	for r, err := range []error{<-errs, errB} {
		var le *LayoutError
		if !errors.As(err, &le) || le.Majority() || len(le.Agree) != 0 || !slices.Equal(le.Differ, []int{1 - r}) {
			t.Fatalf("rank %d: %v, want a *LayoutError, no majority", r, err)
		}
		if le.Diffs[0].Setting != "sync direct bytes" || !slices.Equal(le.Diffs[0].Values, []string{"32768", "4096"}) {
			t.Errorf("rank %d: %+v", r, le.Diffs)
		}
	}
}

// A proof without a layout (a peer of an older release) is refused as
// malformed, with a message that says so, and never panics; one for a
// round this rank has left is refused as stale, as before layouts. A
// layout refusal from a listener that has not proved the secret is not
// believed.
func TestAProofWithoutALayoutIsMalformed(t *testing.T) {
	cfg := testConfig(t)
	tr := listenOne(t, cfg)
	legacy := func(round uint64) (uint8, string) {
		hello := wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: round, From: 0, To: 1, JobID: cfg.JobID}
		c, hb := rawHello(t, tr, hello)
		defer c.Close()
		buf := make([]byte, wire.MaxMsgBytes)
		typ, p, err := wire.ReadMsg(c, buf)
		if err != nil || typ != wire.MsgChallenge {
			t.Fatalf("challenge: %d %v", typ, err)
		}
		wire.WriteMsg(c, nil, wire.MsgProof, proof(cfg.Secret, "client", hb, p[:wire.NonceSize]))
		typ, p, err = wire.ReadMsg(c, buf)
		if err != nil || typ != wire.MsgReject {
			t.Fatalf("want a reject: %d %v", typ, err)
		}
		code, text, err := wire.ParseReject(p)
		if err != nil {
			t.Fatal(err)
		}
		return code, text
	}
	if code, text := legacy(5); code != wire.RejectMalformed || !strings.Contains(text, "no transport layout") {
		t.Fatalf("legacy proof: code %d %q", code, text)
	}
	// Move the transport on to round 6 (a world of one forms at once).
	ring, err := tr.Connect(context.Background(), World{Round: 6, Rank: 0, Addrs: []string{tr.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	ring.Close()
	if code, text := legacy(5); code != wire.RejectRound || !strings.Contains(text, "moved on") {
		t.Fatalf("legacy proof of an old round: code %d %q", code, text)
	}

	// A listener that sends a layout refusal instead of its challenge.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		l := wire.Layout{ChunkBytes: 64, Streams: 9}
		wire.ReadMsg(c, make([]byte, wire.MaxMsgBytes))
		wire.WriteMsg(c, nil, wire.MsgReject, wire.AppendLayoutReject(nil, &l, "fake"))
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	proved, err := tr.clientHandshake(ctx, c, &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: 9, To: 1, JobID: cfg.JobID})
	if proved || !errors.Is(err, ErrBadFrame) || errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("unproven layout refusal: proved %v, %v; want ErrBadFrame only", proved, err)
	}
}

// signalHandler is a slog.Handler that signals c (without blocking) for
// every record with message msg.
type signalHandler struct {
	msg string
	c   chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.c <- struct{}{}:
		default:
		}
	}
	return nil
}

func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h signalHandler) WithGroup(string) slog.Handler      { return h }

// checkLayoutError checks rank r's Connect error in a round whose ranks
// configured want for setting: a *LayoutError whose Differ names ranks
// of another value (at least one) and Agree ranks of r's, with their
// values and r's own right and "unknown" for the ranks it did not learn of
// (a peer late on a loaded host, past LayoutGrace); a rank of the
// majority value that learnt of every peer is a Majority, any other not.
func checkLayoutError(t *testing.T, r int, err error, setting string, want []string) {
	t.Helper()
	var le *LayoutError
	if !errors.As(err, &le) || !errors.Is(err, ErrLayoutMismatch) {
		t.Errorf("rank %d: %v, want a *LayoutError", r, err)
		return
	}
	if len(le.Diffs) != 1 || le.Diffs[0].Setting != setting || len(le.Diffs[0].Values) != len(want) {
		t.Errorf("rank %d: diffs %+v, want %s of %d ranks", r, le.Diffs, setting, len(want))
		return
	}
	if len(le.Differ) == 0 {
		t.Errorf("rank %d: %v names no rank that differs", r, err)
		return
	}
	vals := le.Diffs[0].Values
	for p := range want {
		known := p == r || slices.Contains(le.Agree, p) || slices.Contains(le.Differ, p)
		switch {
		case slices.Contains(le.Agree, p) && want[p] != want[r], slices.Contains(le.Differ, p) && want[p] == want[r]:
			t.Errorf("rank %d: agree %v differ %v, but rank %d has %s", r, le.Agree, le.Differ, p, want[p])
		case known && vals[p] != want[p], !known && vals[p] != "unknown":
			t.Errorf("rank %d: value %q for rank %d, want %q (known %v)", r, vals[p], p, want[p], known)
		}
	}
	for _, v := range []string{setting, want[r], want[le.Differ[0]]} {
		if !strings.Contains(err.Error(), v) {
			t.Errorf("rank %d: %q does not name %q", r, err, v)
		}
	}
	same := 0
	for _, v := range want {
		if v == want[r] {
			same++
		}
	}
	if full := 1+len(le.Agree)+len(le.Differ) == len(want); full && le.Majority() != (2*same > len(want)) {
		t.Errorf("rank %d: majority %v with %d of %d ranks sharing its value", r, le.Majority(), same, len(want))
	}
}

// A rank that learns of the mismatch only second-hand (its dial refused
// with wire.RejectLayoutRound by a peer whose Connect of the round already
// failed) before it meets the odd rank itself still fails with a
// *LayoutError naming the odd rank's value: the refusal carries the
// layouts the refusing rank learnt. Once, under load, such a rank saw
// only the peer's plain refusal. The order is forced: rank 2 fails first
// (it meets the odd rank 0 on its lanes, waits LayoutGrace for rank 1),
// then rank 1 meets only rank 2, then rank 0 connects.
func TestALayoutMismatchLearntSecondHandIsALayoutError(t *testing.T) {
	ts, addrs := listenLayouts(t, 3, func(r int, cfg *Config) {
		switch r {
		case 0:
			cfg.Streams = 1
		case 2:
			cfg.HandshakeTimeout = time.Second // its LayoutGrace, waited out for rank 1
		}
	})
	want := []string{"1", "2", "2"}
	for _, r := range []int{2, 1, 0} {
		ring, err := ts[r].Connect(context.Background(), World{Round: 1, Rank: r, Addrs: addrs})
		if ring != nil {
			ring.Close()
			t.Fatal("a round formed from ranks with different layouts")
		}
		checkLayoutError(t, r, err, "sync streams", want)
		var le *LayoutError
		if errors.As(err, &le) && r == 1 && (!slices.Equal(le.Agree, []int{2}) || !slices.Equal(le.Differ, []int{0}) || !le.Majority()) {
			t.Errorf("rank 1: agree %v differ %v, want [2] and [0], a majority", le.Agree, le.Differ)
		}
	}
}

// A RejectLayoutRound reports what the failed rank learnt, the ranks that
// differ first when not all fit; its receiver takes the ranks of its round
// it has not learnt of itself, and a malformed report is a bad frame, not
// a layout mismatch.
func TestALayoutRoundRefusalReportsTheLayoutsLearnt(t *testing.T) {
	mine := wire.Layout{ChunkBytes: 1024, Streams: 2}
	odd := wire.Layout{ChunkBytes: 1024, Streams: 1}
	var l layoutTally
	n := wire.MaxRoundLayouts + 10
	for p := 1; p < n; p++ {
		if p%10 == 0 {
			l.differs(p, odd)
		} else {
			l.agreeWith(p)
		}
	}
	ls := l.report(mine)
	if len(ls) != wire.MaxRoundLayouts || !slices.IsSortedFunc(ls, func(a, b wire.RankLayout) int { return int(a.Rank) - int(b.Rank) }) {
		t.Fatalf("report of %d ranks: %d layouts %v, want %d in rank order", n-1, len(ls), ls, wire.MaxRoundLayouts)
	}
	for p := 10; p < n; p += 10 {
		if !slices.Contains(ls, wire.RankLayout{Rank: uint32(p), Layout: odd}) {
			t.Errorf("report leaves off rank %d, which differs", p)
		}
	}

	err := parseRefusal(wire.AppendLayoutRoundReject(nil, []wire.RankLayout{{Rank: 0, Layout: mine}, {Rank: 1, Layout: odd}, {Rank: 3, Layout: odd}, {Rank: 9, Layout: odd}}, "failed"))
	var rl *peerRoundLayoutError
	if !errors.As(err, &rl) || !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("parseRefusal: %v, want a round's layout refusal", err)
	}
	st := newConnectState(World{Round: 1, Rank: 2, Addrs: make([]string, 4)})
	st.layout.differs(3, wire.Layout{ChunkBytes: 8, Streams: 1}) // met first-hand: kept
	st.layout.learnt(st, mine, rl.layouts)
	if !st.layout.agree[0] || st.layout.differ[1] != odd || st.layout.differ[3].ChunkBytes != 8 || st.layout.knows(9) || st.layout.knows(2) {
		t.Errorf("learnt: agree %v differ %v", st.layout.agree, st.layout.differ)
	}
	for _, bad := range [][]byte{{wire.RejectLayoutRound}, {wire.RejectLayoutRound, 1, 0}, wire.AppendReject(nil, wire.RejectLayoutRound, "sync: text of a release before reports")} {
		if err := parseRefusal(bad); !errors.Is(err, ErrBadFrame) || errors.Is(err, ErrLayoutMismatch) {
			t.Errorf("parseRefusal(%q): %v, want ErrBadFrame only", bad, err)
		}
	}
}
