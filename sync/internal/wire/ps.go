package wire

import (
	"encoding/binary"
	"fmt"
)

// Parameter-server frames travel on the mesh connections of a Ring formed
// by a Transport dedicated to the parameter server, so they inherit its
// handshake (job ID, round, rank, HMAC of the job secret) and its round
// fencing. A parameter-server frame is a fixed 48-byte header followed by
// Length payload bytes; all integers are little-endian:
//
//	offset size field
//	0      2    magic 0xE7A2
//	2      1    kind (PSPull ... PSReplicate)
//	3      1    flags (PSFlagLast) or, in a PSError, the error code
//	4      4    length of the payload in bytes
//	8      8    round
//	16     8    request ID (a reply carries its request's ID)
//	24     8    step: the sync step, the pulled version, the commit step
//	32     8    aux: kind-specific (PSFetch: old shard count << 32 | old shard;
//	            PSReplicate: shard count << 32 | shard)
//	40     4    table index (PSCommit, PSFetch of all tables: the shard index)
//	44     4    count of rows in the payload
//
// Payloads: PSPull carries Count row IDs (uint64); its reply Count*dim
// float32 values. PSPush carries Count row IDs then Count*dim float32
// gradients; its reply is empty. PSCommit, PSReady and PSBarrier are empty both ways. PSFetch
// carries Count row IDs; its reply Count*(dim+state) float32 values. A
// PSError carries a human-readable text of at most MaxRejectText bytes.
// PSReplicate carries the base step (int64: the commit the rows change),
// Count local row indices (uint64) then Count*(dim+state) float32 values
// of table Table; flags PSFlagBegin and PSFlagEnd (the first and last
// frame of a commit to this replica) and PSFlagFull (the frames of this
// commit carry every row);
// its reply is empty.

// PSHeaderSize is the size of a parameter-server frame header in bytes.
const PSHeaderSize = 48

// PSMagic opens every parameter-server frame header.
const PSMagic uint16 = 0xE7A2

// PSKind says what a parameter-server frame carries.
type PSKind uint8

// Parameter-server frame kinds.
const (
	PSPull    PSKind = 1 // request: rows of one table
	PSPush    PSKind = 2 // request: sparse row gradients of one table
	PSCommit  PSKind = 3 // request: snapshot a shard at a step
	PSFetch   PSKind = 4 // request: rows and optimizer state of a committed shard
	PSReply   PSKind = 5 // the successful reply to the request with the same ID
	PSError   PSKind = 6 // the failed reply to the request with the same ID
	PSReady   PSKind = 7 // request: answered once the server's shards hold their rows
	PSBarrier PSKind = 8 // request: answered once the server entered barrier number Step
	// PSReplicate: request: rows of a committed shard for a replica's copy
	PSReplicate PSKind = 9
	maxPS              = PSReplicate
)

// PSFlagLast marks the last push frame of one worker's step for a shard.
const PSFlagLast = 1

// PSReplicate flags: PSFlagBegin marks the first frame of a commit sent to
// one replica, PSFlagEnd its last (the replica's copy holds the commit only
// once it arrived), PSFlagFull a commit whose frames carry every row of
// the shard (the replica's copy starts over).
const (
	PSFlagBegin = 2
	PSFlagFull  = 4
	PSFlagEnd   = 8
)

// String names the kind for error messages.
func (k PSKind) String() string {
	switch k {
	case PSPull:
		return "pull"
	case PSPush:
		return "push"
	case PSCommit:
		return "commit"
	case PSFetch:
		return "fetch"
	case PSReply:
		return "reply"
	case PSError:
		return "error"
	case PSReady:
		return "ready"
	case PSBarrier:
		return "barrier"
	case PSReplicate:
		return "replicate"
	}
	return fmt.Sprintf("pskind(%d)", uint8(k))
}

// PSHeader is a decoded parameter-server frame header.
type PSHeader struct {
	Kind   PSKind
	Flags  uint8
	Length uint32
	Round  uint64
	ID     uint64
	Step   int64
	Aux    uint64
	Table  uint32
	Count  uint32
}

// Put writes h into b[:PSHeaderSize]; b must be at least PSHeaderSize long.
func (h *PSHeader) Put(b []byte) {
	_ = b[PSHeaderSize-1]
	binary.LittleEndian.PutUint16(b[0:], PSMagic)
	b[2] = byte(h.Kind)
	b[3] = h.Flags
	binary.LittleEndian.PutUint32(b[4:], h.Length)
	binary.LittleEndian.PutUint64(b[8:], h.Round)
	binary.LittleEndian.PutUint64(b[16:], h.ID)
	binary.LittleEndian.PutUint64(b[24:], uint64(h.Step))
	binary.LittleEndian.PutUint64(b[32:], h.Aux)
	binary.LittleEndian.PutUint32(b[40:], h.Table)
	binary.LittleEndian.PutUint32(b[44:], h.Count)
}

// ParsePSHeader decodes a parameter-server frame header from b. It fails
// with an error wrapping ErrMalformed when b is shorter than PSHeaderSize,
// the magic is wrong, the kind is unknown or the payload length exceeds
// maxLen bytes. It never panics.
func ParsePSHeader(b []byte, maxLen int) (PSHeader, error) {
	if len(b) < PSHeaderSize {
		return PSHeader{}, fmt.Errorf("%w: parameter-server header of %d bytes, want %d", ErrMalformed, len(b), PSHeaderSize)
	}
	if m := binary.LittleEndian.Uint16(b[0:]); m != PSMagic {
		return PSHeader{}, fmt.Errorf("%w: bad parameter-server magic %#04x", ErrMalformed, m)
	}
	h := PSHeader{
		Kind:   PSKind(b[2]),
		Flags:  b[3],
		Length: binary.LittleEndian.Uint32(b[4:]),
		Round:  binary.LittleEndian.Uint64(b[8:]),
		ID:     binary.LittleEndian.Uint64(b[16:]),
		Step:   int64(binary.LittleEndian.Uint64(b[24:])),
		Aux:    binary.LittleEndian.Uint64(b[32:]),
		Table:  binary.LittleEndian.Uint32(b[40:]),
		Count:  binary.LittleEndian.Uint32(b[44:]),
	}
	if h.Kind == 0 || h.Kind > maxPS {
		return PSHeader{}, fmt.Errorf("%w: unknown parameter-server frame kind %d", ErrMalformed, uint8(h.Kind))
	}
	if maxLen < 0 || uint64(h.Length) > uint64(maxLen) {
		return PSHeader{}, fmt.Errorf("%w: parameter-server payload of %d bytes exceeds the limit of %d", ErrMalformed, h.Length, maxLen)
	}
	return h, nil
}
