package wire

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{Kind: KindBroadcast, Op: 3, Length: 77, Round: 1 << 40, Seq: 12, Total: 999, Aux: 5}
	b := make([]byte, HeaderSize)
	h.Put(b)
	got, err := ParseHeader(b, 100)
	if err != nil || got != h {
		t.Fatalf("got %+v %v, want %+v", got, err, h)
	}
	if _, err := ParseHeader(b, 76); !errors.Is(err, ErrMalformed) {
		t.Fatalf("over the limit: %v", err)
	}
}

func TestHelloRoundTrip(t *testing.T) {
	h := Hello{Version: ProtocolVersion, ConnKind: ConnLane, Lane: 3, Round: 9, From: 1, To: 2, JobID: "job-a"}
	h.Nonce[5] = 7
	got, err := ParseHello(AppendHello(nil, &h))
	if err != nil || got != h {
		t.Fatalf("got %+v %v", got, err)
	}
}

// A Layout travels after the dialer's proof and in a RejectLayout; short,
// long and zero-stream encodings are malformed, never a panic.
func TestLayoutRoundTrip(t *testing.T) {
	l := Layout{ChunkBytes: 256 << 10, DirectBytes: 32 << 10, Streams: 2, Hierarchy: 1}
	b := AppendLayout(nil, &l)
	if len(b) != LayoutSize {
		t.Fatalf("%d bytes, want %d", len(b), LayoutSize)
	}
	if got, err := ParseLayout(b); err != nil || got != l {
		t.Fatalf("got %+v %v", got, err)
	}
	for _, bad := range [][]byte{nil, b[:LayoutSize-1], append(slices.Clone(b), 0), {1, 0, 0, 0, 1, 0, 0, 0, 0, 0}} {
		if _, err := ParseLayout(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ParseLayout(%v): %v, want ErrMalformed", bad, err)
		}
	}
	long := string(make([]byte, 2*MaxRejectText))
	code, text, err := ParseReject(AppendLayoutReject(nil, &l, long))
	if err != nil || code != RejectLayout {
		t.Fatalf("ParseReject: %d %v", code, err)
	}
	got, msg, err := ParseLayoutReject(text)
	if err != nil || got != l || len(msg) != MaxRejectText-LayoutSize {
		t.Fatalf("ParseLayoutReject: %+v %d bytes %v", got, len(msg), err)
	}
	if _, _, err := ParseLayoutReject("short"); !errors.Is(err, ErrMalformed) {
		t.Fatalf("short layout refusal: %v", err)
	}
}

// A RejectLayoutRound carries the layouts the refusing rank learnt, by
// rank, then its message; too many layouts are left off, the message is
// cut to fit, and a count past the end, ranks out of order or a malformed
// layout are malformed, never a panic.
func TestLayoutRoundRejectRoundTrip(t *testing.T) {
	ls := []RankLayout{{Rank: 1, Layout: Layout{ChunkBytes: 64, Streams: 1}}, {Rank: 7, Layout: Layout{ChunkBytes: 128, DirectBytes: 8, Streams: 3, Hierarchy: 2}}}
	long := string(make([]byte, 2*MaxRejectText))
	for _, c := range []struct {
		ls   []RankLayout
		text string
		msg  int // the message's length after the round trip
	}{
		{ls, "failed", 6},
		{nil, "failed", 6},
		{ls, long, MaxRejectText - 1 - 2*rankLayoutSize},
	} {
		p := AppendLayoutRoundReject(nil, c.ls, c.text)
		code, text, err := ParseReject(p)
		if err != nil || code != RejectLayoutRound {
			t.Fatalf("ParseReject: %d %v", code, err)
		}
		got, msg, err := ParseLayoutRoundReject(text)
		if err != nil || !slices.Equal(got, c.ls) || len(msg) != c.msg {
			t.Fatalf("ParseLayoutRoundReject: %+v %d bytes %v, want %+v %d bytes", got, len(msg), err, c.ls, c.msg)
		}
	}
	many := make([]RankLayout, MaxRoundLayouts+5)
	for i := range many {
		many[i] = RankLayout{Rank: uint32(i), Layout: Layout{Streams: 1}}
	}
	p := AppendLayoutRoundReject(nil, many, long)
	if _, text, err := ParseReject(p); err != nil {
		t.Fatalf("ParseReject of %d layouts: %v", len(many), err)
	} else if got, _, err := ParseLayoutRoundReject(text); err != nil || !slices.Equal(got, many[:MaxRoundLayouts]) {
		t.Fatalf("%d layouts: got %d %v, want the first %d", len(many), len(got), err, MaxRoundLayouts)
	}
	ok := string(AppendLayoutRoundReject(nil, ls, "x")[1:])
	for name, bad := range map[string]string{
		"empty":          "",
		"count past end": ok[:1+rankLayoutSize],
		"too many":       string([]byte{MaxRoundLayouts + 1}) + string(make([]byte, (MaxRoundLayouts+1)*rankLayoutSize)),
		"out of order":   string(AppendLayoutRoundReject(nil, []RankLayout{ls[1], ls[0]}, "x")[1:]),
		"repeated rank":  string(AppendLayoutRoundReject(nil, []RankLayout{ls[0], ls[0]}, "x")[1:]),
		"zero streams":   string(AppendLayoutRoundReject(nil, []RankLayout{{Rank: 1}}, "x")[1:]),
	} {
		if _, _, err := ParseLayoutRoundReject(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzParseLayoutRoundReject: the RejectLayoutRound decoder never panics,
// accepts at most MaxRoundLayouts layouts in ascending rank order, and
// what it accepts (of a whole reject payload) re-encodes to the same
// bytes.
func FuzzParseLayoutRoundReject(f *testing.F) {
	f.Add(AppendLayoutRoundReject(nil, []RankLayout{{Rank: 0, Layout: Layout{ChunkBytes: 64, Streams: 1}}, {Rank: 2, Layout: Layout{Streams: 2, Hierarchy: 1}}}, "round 1 failed"))
	f.Add(AppendLayoutRoundReject(nil, nil, "none"))
	f.Add([]byte{RejectLayoutRound, 1, 0, 0, 0})
	f.Add([]byte{RejectLayoutRound, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		code, text, err := ParseReject(b)
		if err != nil || code != RejectLayoutRound {
			return
		}
		ls, msg, err := ParseLayoutRoundReject(text)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(ls) > MaxRoundLayouts {
			t.Fatalf("accepted %d layouts", len(ls))
		}
		for i := 1; i < len(ls); i++ {
			if ls[i].Rank <= ls[i-1].Rank {
				t.Fatalf("accepted rank %d after rank %d", ls[i].Rank, ls[i-1].Rank)
			}
		}
		if !bytes.Equal(AppendLayoutRoundReject(nil, ls, msg), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzParseHeader: the frame decoder never panics, and whatever it accepts
// encodes back to the same bytes.
func FuzzParseHeader(f *testing.F) {
	ok := make([]byte, HeaderSize)
	(&Header{Kind: KindAllReduce, Op: 0x40, Length: 16, Round: 1, Seq: 2, Total: 16}).Put(ok)
	f.Add(ok)
	f.Add(ok[:HeaderSize-1])
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b, 1<<20)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if h.Length > 1<<20 {
			t.Fatalf("accepted length %d over the limit", h.Length)
		}
		out := make([]byte, HeaderSize)
		h.Put(out)
		if !bytes.Equal(out, b[:HeaderSize]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzParseHello: the handshake decoder never panics; accepted hellos
// re-encode to the same bytes.
func FuzzParseHello(f *testing.F) {
	f.Add(AppendHello(nil, &Hello{Version: ProtocolVersion, ConnKind: ConnControl, Round: 1, To: 1, JobID: "j"}))
	f.Add(AppendHello(nil, &Hello{Version: ProtocolVersion, ConnKind: ConnMesh, JobID: string(make([]byte, 255))}))
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendHello(nil, &h), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzReadMsg: the handshake message reader never panics, never returns
// more than MaxMsgBytes, and the abort and reject decoders never panic.
func FuzzReadMsg(f *testing.F) {
	var buf bytes.Buffer
	WriteMsg(&buf, nil, MsgReject, AppendReject(nil, RejectAuth, "no"))
	f.Add(buf.Bytes())
	f.Add([]byte{MsgHello, 0xff, 0xff})
	f.Add([]byte{MsgProof, 32, 0, 1, 2})
	f.Add([]byte{byte(KindAbort), 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		mb := make([]byte, MaxMsgBytes)
		typ, p, err := ReadMsg(bytes.NewReader(b), mb)
		if err == nil {
			if len(p) > MaxMsgBytes {
				t.Fatalf("payload of %d bytes", len(p))
			}
			if typ == MsgReject {
				if code, text, err := ParseReject(p); err == nil && code == RejectLayout {
					ParseLayoutReject(text)
				} else if err == nil && code == RejectLayoutRound {
					ParseLayoutRoundReject(text)
				}
			}
			if typ == MsgProof && len(p) >= ProofSize {
				ParseLayout(p[ProofSize:])
			}
			ParseHello(p)
		} else if !errors.Is(err, ErrMalformed) && err != io.EOF && err != io.ErrUnexpectedEOF {
			t.Fatalf("unexpected error %v", err)
		}
		if a, err := ParseAbort(b, 4); err == nil && (a.Origin < 0 || a.Origin >= 4 || a.Blamed < -1 || a.Blamed >= 4) {
			t.Fatalf("accepted abort %+v", a)
		}
	})
}

// TestAbortVerdictRoundTrip: a timeout's verdict survives the wire, the
// plain 9-byte form still decodes, and malformed verdicts are refused.
func TestAbortVerdictRoundTrip(t *testing.T) {
	a := Abort{Origin: 0, Blamed: 2, Reason: ReasonTimeout, Verdict: true, Waited: 1500e6, Silent: []int{2, 3}, Busy: []int{1}}
	b := AppendAbort(nil, &a)
	if len(b) != a.Size() || len(b) > MaxAbortSize(5) {
		t.Fatalf("encoded %d bytes, Size %d, max %d", len(b), a.Size(), MaxAbortSize(5))
	}
	got, err := ParseAbort(b, 5)
	if err != nil || got.Origin != 0 || got.Blamed != 2 || !got.Verdict || got.Waited != a.Waited ||
		!slices.Equal(got.Silent, a.Silent) || !slices.Equal(got.Busy, a.Busy) {
		t.Fatalf("got %+v %v, want %+v", got, err, a)
	}
	plain := Abort{Origin: 1, Blamed: -1, Reason: ReasonTimeout}
	if got, err := ParseAbort(AppendAbort(nil, &plain), 5); err != nil || got.Verdict || got.Origin != 1 || got.Blamed != -1 {
		t.Fatalf("plain abort: got %+v %v", got, err)
	}
	for name, bad := range map[string]Abort{
		"rank outside the world": {Reason: ReasonTimeout, Verdict: true, Silent: []int{5}},
		"the origin named":       {Reason: ReasonTimeout, Verdict: true, Busy: []int{0}},
		"out of order":           {Reason: ReasonTimeout, Verdict: true, Silent: []int{3, 2}},
		"both lists":             {Reason: ReasonTimeout, Verdict: true, Silent: []int{2}, Busy: []int{2}},
		"too many":               {Reason: ReasonTimeout, Verdict: true, Silent: []int{1, 2, 3, 4, 4}},
		"negative wait":          {Reason: ReasonTimeout, Verdict: true, Waited: -1},
		"verdict on a cancel":    {Reason: ReasonCanceled, Verdict: true},
	} {
		if _, err := ParseAbort(AppendAbort(nil, &bad), 5); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := ParseAbort(b[:len(b)-1], 5); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated verdict: %v, want ErrMalformed", err)
	}
}

// FuzzParseAbort: the abort decoder never panics, accepts only ranks of the
// world (ascending, disjoint lists, at most worldSize-1 of them), never more
// than MaxAbortSize bytes, and what it accepts re-encodes to the same bytes.
func FuzzParseAbort(f *testing.F) {
	f.Add(AppendAbort(nil, &Abort{Origin: 1, Blamed: 0, Reason: ReasonProtocol}), uint8(4))
	f.Add(AppendAbort(nil, &Abort{Origin: 0, Blamed: 2, Reason: ReasonTimeout, Verdict: true, Waited: 7, Silent: []int{2}, Busy: []int{1, 3}}), uint8(4))
	f.Add(AppendAbort(nil, &Abort{Origin: 0, Blamed: -1, Reason: ReasonTimeout, Verdict: true}), uint8(1))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, size uint8) {
		n := int(size)
		a, err := ParseAbort(b, n)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if len(b) > MaxAbortSize(n) {
			t.Fatalf("accepted %d bytes, over MaxAbortSize(%d) = %d", len(b), n, MaxAbortSize(n))
		}
		if len(a.Silent)+len(a.Busy) > n-1 {
			t.Fatalf("accepted %d+%d ranks in a world of %d", len(a.Silent), len(a.Busy), n)
		}
		seen := make(map[int]bool)
		for _, l := range [][]int{a.Silent, a.Busy} {
			for i, r := range l {
				if r < 0 || r >= n || r == int(a.Origin) || seen[r] || (i > 0 && r <= l[i-1]) {
					t.Fatalf("accepted verdict %+v in a world of %d", a, n)
				}
				seen[r] = true
			}
		}
		if !bytes.Equal(AppendAbort(nil, &a), b) {
			t.Fatalf("re-encoding of %+v differs", a)
		}
	})
}
