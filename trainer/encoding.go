package trainer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// Little-endian helpers shared by the snapshot and optimizer encodings. The
// reader never panics on short or malformed input: the first problem is kept
// in err, later reads return zero values, and done reports it.

func appendF64(dst []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

func appendFloats(dst []byte, v []float32) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(v)))
	if littleEndian && len(v) > 0 {
		// The in-memory form is the encoding: one copy (commits encode the
		// optimizer state every step, so this is on the hot path).
		return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))...)
	}
	for _, f := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
	}
	return dst
}

// littleEndian reports whether this machine stores numbers little-endian.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// appendTensors writes a tensor count, then each tensor; a nil list (state
// not created yet) is written as count 0.
func appendTensors(dst []byte, ts [][]float32) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ts)))
	for _, t := range ts {
		dst = appendFloats(dst, t)
	}
	return dst
}

var errShort = errors.New("input too short")

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = fmt.Errorf("%w: need %d bytes at offset %d of %d", errShort, n, r.off, len(r.b))
		return nil
	}
	// Capped, so a caller that appends to the result (a snapshot buffer
	// reused by a later commit) reallocates instead of overwriting the
	// bytes that follow in the input.
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8() uint8 {
	if s := r.take(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

func (r *reader) f64() float64 { return math.Float64frombits(r.u64()) }

func (r *reader) bool() bool {
	switch r.u8() {
	case 0:
		return false
	case 1:
		return true
	default:
		r.fail("bad boolean")
		return false
	}
}

func (r *reader) fail(msg string) {
	if r.err == nil {
		r.err = errors.New(msg)
	}
}

// length reads a uint64 length and checks that at least n*unit bytes remain,
// so a corrupt length cannot make us allocate gigabytes.
func (r *reader) length(unit int) int {
	n := r.u64()
	if r.err != nil {
		return 0
	}
	if n > uint64(len(r.b)-r.off)/uint64(unit) {
		r.fail(fmt.Sprintf("length %d exceeds the %d bytes left", n, len(r.b)-r.off))
		return 0
	}
	return int(n)
}

func (r *reader) bytes() []byte {
	n := r.length(1)
	return r.take(n)
}

func (r *reader) string() string {
	n := r.u32()
	return string(r.take(int(n)))
}

// floatsInto reads a float vector that must have exactly len(dst) elements.
func (r *reader) floatsInto(dst []float32) {
	n := r.length(4)
	if r.err != nil {
		return
	}
	if n != len(dst) {
		r.fail(fmt.Sprintf("tensor has %d values, want %d", n, len(dst)))
		return
	}
	s := r.take(4 * n)
	if littleEndian && n > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), s)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(s[4*i:]))
	}
}

// tensors reads a tensor list written by appendTensors whose shapes must
// match params; count 0 yields nil (state not created yet).
func (r *reader) tensors(params []Param) [][]float32 {
	n := int(r.u32())
	if r.err != nil || n == 0 {
		return nil
	}
	if n != len(params) {
		r.fail(fmt.Sprintf("%d state tensors for %d parameters", n, len(params)))
		return nil
	}
	out := make([][]float32, n)
	for i, p := range params {
		out[i] = make([]float32, len(p.Value))
		r.floatsInto(out[i])
	}
	return out
}

func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return fmt.Errorf("%d trailing bytes", len(r.b)-r.off)
	}
	return nil
}
