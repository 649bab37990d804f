package wire

import (
	"bytes"
	"errors"
	"io"
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
				ParseReject(p)
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
