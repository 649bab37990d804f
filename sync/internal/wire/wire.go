// Package wire holds the byte layouts of package sync: the frame header that
// precedes every message of a collective, the control payload of an abort,
// and the messages of the connection handshake.
//
// # Frames
//
// A frame is a fixed 40-byte header followed by Length payload bytes. All
// integers are little-endian:
//
//	offset size field
//	0      2    magic 0xE7A1
//	2      1    kind (KindAllReduce ... KindBusy)
//	3      1    op (reduction operator and element type, kind-specific)
//	4      4    length of the payload in bytes
//	8      8    round
//	16     8    sequence number of the operation within the round
//	24     8    total bytes of the operation's buffer
//	32     8    aux (broadcast root; the phase and piece of a hierarchical
//	            allreduce's frame; otherwise 0)
//
// # Handshake messages
//
// A handshake message is a type byte, a 2-byte payload length (at most
// MaxMsgBytes) and the payload. The decoders never trust a length they have
// not bounded, and they never panic on any input. The dialer sends a
// MsgHello; the listener a MsgChallenge (its nonce and its proof of the
// secret); the dialer a MsgProof (its proof, then its Layout); the
// listener a MsgAccept or a MsgReject. A MsgProof of ProofSize bytes
// alone (a peer of a release before Layout) is malformed unless the
// listener refuses it for another reason first.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ErrMalformed reports bytes that do not decode as the expected message.
var ErrMalformed = errors.New("wire: malformed message")

// HeaderSize is the size of a frame header in bytes.
const HeaderSize = 40

// Magic opens every frame header.
const Magic uint16 = 0xE7A1

// Kind says what a frame carries.
type Kind uint8

// Frame kinds.
const (
	KindAllReduce Kind = 1 // a chunk of an allreduce (op byte: Op | elem<<4)
	KindBroadcast Kind = 2 // a chunk of a broadcast (aux: root)
	KindAllGather Kind = 3 // a chunk of an allgather
	KindBarrier   Kind = 4 // a barrier token, empty payload
	KindAbort     Kind = 5 // control: the round is aborted (payload: Abort)
	KindClose     Kind = 6 // control: the sender closed its end gracefully
	// KindAnnounce (control): the sender has been waiting in operation Seq
	// for a while; the payload is that operation's frame header (Length 0),
	// so that a peer in another operation of the same sequence number can
	// tell it disagrees even when neither reads the other's data connections.
	KindAnnounce Kind = 7
	// KindBusy (control, empty payload): the sender is in a phase marked
	// busy (a data load, a checkpoint write, an evaluation) and is not
	// waiting in any operation; sent every half second while the phase
	// lasts, so that peers waiting for it extend their operation's deadline.
	KindBusy Kind = 8
	maxKind       = KindBusy
)

// String names the kind for error messages.
func (k Kind) String() string {
	switch k {
	case KindAllReduce:
		return "allreduce"
	case KindBroadcast:
		return "broadcast"
	case KindAllGather:
		return "allgather"
	case KindBarrier:
		return "barrier"
	case KindAbort:
		return "abort"
	case KindClose:
		return "close"
	case KindAnnounce:
		return "announce"
	case KindBusy:
		return "busy"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Header is the decoded frame header.
type Header struct {
	Kind   Kind
	Op     uint8
	Length uint32
	Round  uint64
	Seq    uint64
	Total  uint64
	Aux    uint64
}

// Put writes h into b[:HeaderSize]; b must be at least HeaderSize long.
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], Magic)
	b[2] = byte(h.Kind)
	b[3] = h.Op
	binary.LittleEndian.PutUint32(b[4:], h.Length)
	binary.LittleEndian.PutUint64(b[8:], h.Round)
	binary.LittleEndian.PutUint64(b[16:], h.Seq)
	binary.LittleEndian.PutUint64(b[24:], h.Total)
	binary.LittleEndian.PutUint64(b[32:], h.Aux)
}

// ParseHeader decodes a frame header from b. It fails with an error wrapping
// ErrMalformed when b is shorter than HeaderSize, the magic is wrong, the kind
// is unknown or the payload length exceeds maxLen bytes.
func ParseHeader(b []byte, maxLen int) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes, want %d", ErrMalformed, len(b), HeaderSize)
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != Magic {
		return Header{}, fmt.Errorf("%w: bad magic %#04x", ErrMalformed, m)
	}
	h := Header{
		Kind:   Kind(b[2]),
		Op:     b[3],
		Length: binary.LittleEndian.Uint32(b[4:]),
		Round:  binary.LittleEndian.Uint64(b[8:]),
		Seq:    binary.LittleEndian.Uint64(b[16:]),
		Total:  binary.LittleEndian.Uint64(b[24:]),
		Aux:    binary.LittleEndian.Uint64(b[32:]),
	}
	if h.Kind == 0 || h.Kind > maxKind {
		return Header{}, fmt.Errorf("%w: unknown frame kind %d", ErrMalformed, uint8(h.Kind))
	}
	if maxLen < 0 || uint64(h.Length) > uint64(maxLen) {
		return Header{}, fmt.Errorf("%w: frame payload of %d bytes exceeds the limit of %d", ErrMalformed, h.Length, maxLen)
	}
	return h, nil
}

// Abort reasons carried by a KindAbort frame.
const (
	ReasonPeerLost = 1 // Blamed rank's connection failed
	ReasonTimeout  = 2 // the origin timed out waiting
	ReasonCanceled = 3 // the origin's context was cancelled or it closed mid-operation
	ReasonProtocol = 4 // the origin saw a malformed or mismatched frame
	maxReason      = ReasonProtocol
)

// AbortSize is the size in bytes of the fixed part of a KindAbort payload
// (Origin, Blamed, Reason), which is all of it unless a verdict follows.
const AbortSize = 9

// A ReasonTimeout abort may carry the origin's verdict after the fixed
// part, so that the ranks that learn of the timeout from the notice name
// the same ranks as the one that gave up (little-endian):
//
//	offset size            field
//	9      8               waited: how long the operation had run, ns (>= 0)
//	17     4               nSilent
//	21     4               nBusy
//	25     4*nSilent       the silent ranks, strictly ascending
//	...    4*nBusy         the busy ranks, strictly ascending
//
// The lists are disjoint, hold ranks of the world other than the origin,
// and together at most worldSize-1 of them; MaxAbortSize bounds the payload.
const abortVerdictFixed = 8 + 4 + 4

// MaxAbortSize is the largest KindAbort payload a world of worldSize ranks
// can carry, in bytes (a verdict naming every other rank).
func MaxAbortSize(worldSize int) int {
	return AbortSize + abortVerdictFixed + 4*max(worldSize-1, 0)
}

// Abort is the payload of a KindAbort frame: which rank sent it, which rank it
// blames (-1 for none) and why, and for a timeout optionally the origin's
// verdict on its peers (Verdict true: Waited, Silent, Busy are set).
type Abort struct {
	Origin int32
	Blamed int32
	Reason uint8

	Verdict bool
	Waited  int64 // ns the operation had run on Origin
	Silent  []int // ascending
	Busy    []int // ascending
}

// Size is the encoded size of a in bytes.
func (a *Abort) Size() int {
	if !a.Verdict {
		return AbortSize
	}
	return AbortSize + abortVerdictFixed + 4*(len(a.Silent)+len(a.Busy))
}

// Put writes the fixed part of a into b[:AbortSize] (use AppendAbort for
// an Abort with a verdict).
func (a *Abort) Put(b []byte) {
	_ = b[AbortSize-1]
	binary.LittleEndian.PutUint32(b[0:], uint32(a.Origin))
	binary.LittleEndian.PutUint32(b[4:], uint32(a.Blamed))
	b[8] = a.Reason
}

// AppendAbort appends the encoded payload of a (Size bytes) to dst.
func AppendAbort(dst []byte, a *Abort) []byte {
	var fixed [AbortSize]byte
	a.Put(fixed[:])
	dst = append(dst, fixed[:]...)
	if !a.Verdict {
		return dst
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(a.Waited))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(a.Silent)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(a.Busy)))
	for _, r := range a.Silent {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r))
	}
	for _, r := range a.Busy {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(r))
	}
	return dst
}

// ParseAbort decodes an abort payload (with or without a verdict); ranks
// are checked against worldSize. Any inconsistency (a length that does not
// match the counts, a count over the world, a rank outside it, a list out
// of order or overlapping the other, a verdict on another reason than
// ReasonTimeout) gives an error wrapping ErrMalformed.
func ParseAbort(b []byte, worldSize int) (Abort, error) {
	if len(b) != AbortSize && len(b) < AbortSize+abortVerdictFixed {
		return Abort{}, fmt.Errorf("%w: abort payload of %d bytes, want %d or at least %d", ErrMalformed, len(b), AbortSize, AbortSize+abortVerdictFixed)
	}
	a := Abort{
		Origin: int32(binary.LittleEndian.Uint32(b[0:])),
		Blamed: int32(binary.LittleEndian.Uint32(b[4:])),
		Reason: b[8],
	}
	if a.Origin < 0 || int(a.Origin) >= worldSize || a.Blamed < -1 || int(a.Blamed) >= worldSize {
		return Abort{}, fmt.Errorf("%w: abort names rank %d/%d outside world size %d", ErrMalformed, a.Origin, a.Blamed, worldSize)
	}
	if a.Reason == 0 || a.Reason > maxReason {
		return Abort{}, fmt.Errorf("%w: unknown abort reason %d", ErrMalformed, a.Reason)
	}
	if len(b) == AbortSize {
		return a, nil
	}
	if a.Reason != ReasonTimeout {
		return Abort{}, fmt.Errorf("%w: abort of reason %d carries a verdict", ErrMalformed, a.Reason)
	}
	v := b[AbortSize:]
	a.Verdict = true
	a.Waited = int64(binary.LittleEndian.Uint64(v[0:]))
	nS := uint64(binary.LittleEndian.Uint32(v[8:]))
	nB := uint64(binary.LittleEndian.Uint32(v[12:]))
	if a.Waited < 0 {
		return Abort{}, fmt.Errorf("%w: abort verdict waited %d ns", ErrMalformed, a.Waited)
	}
	if nS+nB > uint64(max(worldSize-1, 0)) {
		return Abort{}, fmt.Errorf("%w: abort verdict names %d+%d ranks in a world of %d", ErrMalformed, nS, nB, worldSize)
	}
	if uint64(len(v)) != abortVerdictFixed+4*(nS+nB) {
		return Abort{}, fmt.Errorf("%w: abort verdict of %d bytes for %d+%d ranks", ErrMalformed, len(v), nS, nB)
	}
	list := func(at, n int) ([]int, error) {
		if n == 0 {
			return nil, nil
		}
		out := make([]int, n)
		for i := range out {
			r := binary.LittleEndian.Uint32(v[at+4*i:])
			if uint64(r) >= uint64(worldSize) || int32(r) == a.Origin || (i > 0 && int(r) <= out[i-1]) {
				return nil, fmt.Errorf("%w: abort verdict rank %d (at %d) outside the world of %d, the origin or out of order", ErrMalformed, r, i, worldSize)
			}
			out[i] = int(r)
		}
		return out, nil
	}
	var err error
	if a.Silent, err = list(abortVerdictFixed, int(nS)); err != nil {
		return Abort{}, err
	}
	if a.Busy, err = list(abortVerdictFixed+4*int(nS), int(nB)); err != nil {
		return Abort{}, err
	}
	for i, j := 0, 0; i < len(a.Silent) && j < len(a.Busy); {
		switch {
		case a.Silent[i] == a.Busy[j]:
			return Abort{}, fmt.Errorf("%w: abort verdict names rank %d both silent and busy", ErrMalformed, a.Silent[i])
		case a.Silent[i] < a.Busy[j]:
			i++
		default:
			j++
		}
	}
	return a, nil
}

// Handshake message types.
const (
	MsgHello     = 1
	MsgChallenge = 2
	MsgProof     = 3
	MsgAccept    = 4
	MsgReject    = 5
)

// MaxMsgBytes bounds the payload of one handshake message.
const MaxMsgBytes = 1024

// NonceSize and ProofSize are the sizes of a handshake nonce and of an
// HMAC-SHA256 proof in bytes.
const (
	NonceSize = 32
	ProofSize = 32
)

// ProtocolVersion is the handshake version this package speaks: 2 since
// the two-rank allreduce's exchange and the RejectLayoutRound report (a
// rank of version 1 reads neither), 1 before.
const ProtocolVersion = 2

// Connection kinds named in a Hello.
const (
	ConnControl = 1 // control messages (abort, close) between a pair of ranks
	ConnMesh    = 2 // small direct collectives between a pair of ranks
	ConnLane    = 3 // one stream of a ring, from a rank to the next rank of that ring
)

// A ConnLane Hello's Lane names the stream: the low byte is its index
// (0..Streams-1), the high byte the ring of the round it belongs to (0 the
// ring of all ranks, 1 the ring of the dialer's host, 2 the ring between
// hosts of the hierarchical allreduce).

// MaxJobIDBytes bounds the job ID carried in a Hello.
const MaxJobIDBytes = 255

// Hello opens a connection: the dialer says who it is and what it wants.
type Hello struct {
	Version  uint8
	ConnKind uint8
	Lane     uint16
	Round    uint64
	From     uint32 // the dialer's rank
	To       uint32 // the rank the dialer expects to reach
	Nonce    [NonceSize]byte
	JobID    string
}

// AppendHello appends the encoded payload of h to dst.
func AppendHello(dst []byte, h *Hello) []byte {
	dst = append(dst, h.Version, h.ConnKind)
	dst = binary.LittleEndian.AppendUint16(dst, h.Lane)
	dst = binary.LittleEndian.AppendUint64(dst, h.Round)
	dst = binary.LittleEndian.AppendUint32(dst, h.From)
	dst = binary.LittleEndian.AppendUint32(dst, h.To)
	dst = append(dst, h.Nonce[:]...)
	job := h.JobID
	if len(job) > MaxJobIDBytes {
		job = job[:MaxJobIDBytes]
	}
	dst = append(dst, byte(len(job)))
	return append(dst, job...)
}

const helloFixed = 1 + 1 + 2 + 8 + 4 + 4 + NonceSize + 1

// ParseHello decodes a Hello payload.
func ParseHello(b []byte) (Hello, error) {
	if len(b) < helloFixed {
		return Hello{}, fmt.Errorf("%w: hello of %d bytes, want at least %d", ErrMalformed, len(b), helloFixed)
	}
	var h Hello
	h.Version = b[0]
	h.ConnKind = b[1]
	h.Lane = binary.LittleEndian.Uint16(b[2:])
	h.Round = binary.LittleEndian.Uint64(b[4:])
	h.From = binary.LittleEndian.Uint32(b[12:])
	h.To = binary.LittleEndian.Uint32(b[16:])
	copy(h.Nonce[:], b[20:20+NonceSize])
	n := int(b[helloFixed-1])
	if len(b) != helloFixed+n {
		return Hello{}, fmt.Errorf("%w: hello job ID length %d does not match %d trailing bytes", ErrMalformed, n, len(b)-helloFixed)
	}
	h.JobID = string(b[helloFixed:])
	if h.Version != ProtocolVersion {
		return Hello{}, fmt.Errorf("%w: protocol version %d, want %d", ErrMalformed, h.Version, ProtocolVersion)
	}
	if h.ConnKind < ConnControl || h.ConnKind > ConnLane {
		return Hello{}, fmt.Errorf("%w: unknown connection kind %d", ErrMalformed, h.ConnKind)
	}
	return h, nil
}

// Reject codes carried by a MsgReject.
const (
	RejectMalformed = 1 // the peer's message did not decode
	RejectJob       = 2 // a different job
	RejectRound     = 3 // a round this rank has already left (or already formed)
	RejectAuth      = 4 // the secret proof did not verify
	RejectNotReady  = 5 // this rank did not reach Connect for that round in time; retry
	RejectRank      = 6 // this rank is not the rank the dialer asked for, or the slot is taken
	RejectClosed    = 7 // the transport is closing
	// RejectLayout: the dialer's Layout (sent with its proof) differs from
	// this rank's; the text starts with this rank's Layout (LayoutSize
	// bytes, see AppendLayoutReject).
	RejectLayout = 8
	// RejectLayoutRound: this rank's Connect of the dialer's round failed
	// because the layouts of that round's ranks differ (the dialer's
	// matched this rank's; another rank's did not); the text starts with
	// the layouts this rank learnt, by rank (see AppendLayoutRoundReject).
	RejectLayoutRound = 9
	maxReject         = RejectLayoutRound
)

// Layout is the part of a rank's configuration that shapes the wire
// traffic of a round and must be equal on every rank (sync.Config's
// ChunkBytes, DirectBytes, Streams and Hierarchy, as configured). The
// dialer sends it after its proof of the secret (MsgProof: the proof, then
// the Layout, which the proof's HMAC covers); the listener compares it
// with its own after the proof verified, and refuses a different one with
// RejectLayout, carrying its own. So neither side tells its layout to a
// peer that has not proved the secret. Encoded in LayoutSize bytes,
// little-endian:
//
//	offset size field
//	0      4    ChunkBytes
//	4      4    DirectBytes
//	8      1    Streams (1..255)
//	9      1    Hierarchy
type Layout struct {
	ChunkBytes  uint32
	DirectBytes uint32
	Streams     uint8
	Hierarchy   uint8
}

// LayoutSize is the size of an encoded Layout in bytes.
const LayoutSize = 10

// AppendLayout appends the encoded l (LayoutSize bytes) to dst.
func AppendLayout(dst []byte, l *Layout) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, l.ChunkBytes)
	dst = binary.LittleEndian.AppendUint32(dst, l.DirectBytes)
	return append(dst, l.Streams, l.Hierarchy)
}

// ParseLayout decodes a Layout from exactly LayoutSize bytes; another
// length or zero Streams gives an error wrapping ErrMalformed.
func ParseLayout(b []byte) (Layout, error) {
	if len(b) != LayoutSize {
		return Layout{}, fmt.Errorf("%w: transport layout of %d bytes, want %d", ErrMalformed, len(b), LayoutSize)
	}
	l := Layout{
		ChunkBytes:  binary.LittleEndian.Uint32(b[0:]),
		DirectBytes: binary.LittleEndian.Uint32(b[4:]),
		Streams:     b[8],
		Hierarchy:   b[9],
	}
	if l.Streams == 0 {
		return Layout{}, fmt.Errorf("%w: transport layout with 0 streams", ErrMalformed)
	}
	return l, nil
}

// AppendLayoutReject appends a RejectLayout payload: the code, the
// refusing rank's Layout, then text (truncated so that the whole fits
// 1+MaxRejectText bytes).
func AppendLayoutReject(dst []byte, l *Layout, text string) []byte {
	if len(text) > MaxRejectText-LayoutSize {
		text = text[:MaxRejectText-LayoutSize]
	}
	dst = append(dst, RejectLayout)
	dst = AppendLayout(dst, l)
	return append(dst, text...)
}

// ParseLayoutReject splits the text of a RejectLayout (as ParseReject
// returns it) into the refusing rank's Layout and the message.
func ParseLayoutReject(text string) (Layout, string, error) {
	if len(text) < LayoutSize {
		return Layout{}, "", fmt.Errorf("%w: layout refusal of %d bytes, want at least %d", ErrMalformed, len(text), LayoutSize)
	}
	l, err := ParseLayout([]byte(text[:LayoutSize]))
	if err != nil {
		return Layout{}, "", err
	}
	return l, text[LayoutSize:], nil
}

// RankLayout is the Layout of one rank of a round, as a RejectLayoutRound
// reports it.
type RankLayout struct {
	Rank   uint32
	Layout Layout
}

// rankLayoutSize is the size of an encoded RankLayout: the rank (4 bytes,
// little-endian), then its Layout.
const rankLayoutSize = 4 + LayoutSize

// MaxRoundLayouts bounds the layouts a RejectLayoutRound carries (so that
// they fit MaxRejectText with room for a message).
const MaxRoundLayouts = 32

// AppendLayoutRoundReject appends a RejectLayoutRound payload: the code,
// the number of layouts (a byte, 0..MaxRoundLayouts), each RankLayout
// (the rank as 4 bytes, then its Layout) in ascending rank order, then
// text (truncated so that the whole fits 1+MaxRejectText bytes). ls must
// be in strictly ascending rank order, at most MaxRoundLayouts long (the
// ones past that are left off).
func AppendLayoutRoundReject(dst []byte, ls []RankLayout, text string) []byte {
	ls = ls[:min(len(ls), MaxRoundLayouts)]
	if room := MaxRejectText - 1 - rankLayoutSize*len(ls); len(text) > room {
		text = text[:room]
	}
	dst = append(dst, RejectLayoutRound, byte(len(ls)))
	for i := range ls {
		dst = binary.LittleEndian.AppendUint32(dst, ls[i].Rank)
		dst = AppendLayout(dst, &ls[i].Layout)
	}
	return append(dst, text...)
}

// ParseLayoutRoundReject splits the text of a RejectLayoutRound (as
// ParseReject returns it) into the layouts the refusing rank learnt, by
// rank, and the message. A count over MaxRoundLayouts or past the end,
// ranks not strictly ascending or a malformed Layout give an error
// wrapping ErrMalformed.
func ParseLayoutRoundReject(text string) ([]RankLayout, string, error) {
	if len(text) < 1 {
		return nil, "", fmt.Errorf("%w: layout round refusal of 0 bytes", ErrMalformed)
	}
	n := int(text[0])
	if n > MaxRoundLayouts || len(text) < 1+n*rankLayoutSize {
		return nil, "", fmt.Errorf("%w: layout round refusal of %d bytes with %d layouts (at most %d, %d bytes each)", ErrMalformed, len(text), n, MaxRoundLayouts, rankLayoutSize)
	}
	ls := make([]RankLayout, n)
	b := []byte(text[1 : 1+n*rankLayoutSize])
	for i := range ls {
		e := b[i*rankLayoutSize : (i+1)*rankLayoutSize]
		ls[i].Rank = binary.LittleEndian.Uint32(e)
		if i > 0 && ls[i].Rank <= ls[i-1].Rank {
			return nil, "", fmt.Errorf("%w: layout round refusal names rank %d after rank %d", ErrMalformed, ls[i].Rank, ls[i-1].Rank)
		}
		l, err := ParseLayout(e[4:])
		if err != nil {
			return nil, "", err
		}
		ls[i].Layout = l
	}
	return ls, text[1+n*rankLayoutSize:], nil
}

// MaxRejectText bounds the human-readable text of a MsgReject.
const MaxRejectText = 512

// AppendReject appends a reject payload with code and text (truncated to
// MaxRejectText bytes).
func AppendReject(dst []byte, code uint8, text string) []byte {
	if len(text) > MaxRejectText {
		text = text[:MaxRejectText]
	}
	dst = append(dst, code)
	return append(dst, text...)
}

// ParseReject decodes a reject payload.
func ParseReject(b []byte) (code uint8, text string, err error) {
	if len(b) < 1 || len(b) > 1+MaxRejectText {
		return 0, "", fmt.Errorf("%w: reject of %d bytes", ErrMalformed, len(b))
	}
	if b[0] == 0 || b[0] > maxReject {
		return 0, "", fmt.Errorf("%w: unknown reject code %d", ErrMalformed, b[0])
	}
	return b[0], string(b[1:]), nil
}

// WriteMsg writes one handshake message using scratch (grown as needed) as
// the output buffer, so the whole message leaves in one write.
func WriteMsg(w io.Writer, scratch []byte, typ uint8, payload []byte) error {
	if len(payload) > MaxMsgBytes {
		return fmt.Errorf("%w: handshake payload of %d bytes exceeds %d", ErrMalformed, len(payload), MaxMsgBytes)
	}
	b := append(scratch[:0], typ)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(payload)))
	b = append(b, payload...)
	_, err := w.Write(b)
	return err
}

// ReadMsg reads one handshake message into buf (which must hold MaxMsgBytes)
// and returns its type and payload (aliasing buf). A length over MaxMsgBytes
// or an unknown type gives an error wrapping ErrMalformed; a short read
// gives io.ErrUnexpectedEOF or io.EOF.
func ReadMsg(r io.Reader, buf []byte) (uint8, []byte, error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	typ := hdr[0]
	n := int(binary.LittleEndian.Uint16(hdr[1:]))
	if typ < MsgHello || typ > MsgReject {
		return 0, nil, fmt.Errorf("%w: unknown handshake message type %d", ErrMalformed, typ)
	}
	if n > MaxMsgBytes || n > len(buf) {
		return 0, nil, fmt.Errorf("%w: handshake message of %d bytes exceeds %d", ErrMalformed, n, MaxMsgBytes)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return typ, buf[:n], nil
}
