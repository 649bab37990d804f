// Package enc holds the little-endian helpers shared by the trainer's
// snapshot encoding and the optimizers' state encodings (trainer/optim).
// The Reader never panics on short or malformed input: the first problem is
// kept in Err, later reads return zero values, and Done reports it.
package enc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// AppendF64 appends f's IEEE 754 bits, 8 bytes.
func AppendF64(dst []byte, f float64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(f))
}

// AppendBool appends one byte, 1 for true, 0 for false.
func AppendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// AppendBytes appends b's length (8 bytes), then b.
func AppendBytes(dst, b []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(b)))
	return append(dst, b...)
}

// AppendString appends s's length (4 bytes), then s.
func AppendString(dst []byte, s string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

// AppendFloats appends v's length (8 bytes), then each value's bits (4
// bytes each).
func AppendFloats(dst []byte, v []float32) []byte {
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

// AppendTensors writes a tensor count, then each tensor; a nil list (state
// not created yet) is written as count 0.
func AppendTensors(dst []byte, ts [][]float32) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ts)))
	for _, t := range ts {
		dst = AppendFloats(dst, t)
	}
	return dst
}

var errShort = errors.New("input too short")

// Reader reads what the Append functions wrote, from B at Off. Not safe
// for concurrent use.
type Reader struct {
	B   []byte // the input
	Off int    // the offset of the next read in B
	Err error  // the first problem met, or nil
}

// Take returns the next n bytes of B (capacity capped at n), or nil once
// an error is met.
func (r *Reader) Take(n int) []byte {
	if r.Err != nil {
		return nil
	}
	if n < 0 || n > len(r.B)-r.Off {
		r.Err = fmt.Errorf("%w: need %d bytes at offset %d of %d", errShort, n, r.Off, len(r.B))
		return nil
	}
	// Capped, so a caller that appends to the result (a snapshot buffer
	// reused by a later commit) reallocates instead of overwriting the
	// bytes that follow in the input.
	s := r.B[r.Off : r.Off+n : r.Off+n]
	r.Off += n
	return s
}

// U8 reads one byte.
func (r *Reader) U8() uint8 {
	if s := r.Take(1); s != nil {
		return s[0]
	}
	return 0
}

// U32 reads a little-endian uint32.
func (r *Reader) U32() uint32 {
	if s := r.Take(4); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

// U64 reads a little-endian uint64.
func (r *Reader) U64() uint64 {
	if s := r.Take(8); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

// F64 reads what AppendF64 wrote.
func (r *Reader) F64() float64 { return math.Float64frombits(r.U64()) }

// Bool reads what AppendBool wrote; another byte is an error.
func (r *Reader) Bool() bool {
	switch r.U8() {
	case 0:
		return false
	case 1:
		return true
	default:
		r.Fail("bad boolean")
		return false
	}
}

// Fail records msg as the error unless one is recorded already.
func (r *Reader) Fail(msg string) {
	if r.Err == nil {
		r.Err = errors.New(msg)
	}
}

// Length reads a uint64 length and checks that at least n*unit bytes remain,
// so a corrupt length cannot make us allocate gigabytes.
func (r *Reader) Length(unit int) int {
	n := r.U64()
	if r.Err != nil {
		return 0
	}
	if n > uint64(len(r.B)-r.Off)/uint64(unit) {
		r.Fail(fmt.Sprintf("length %d exceeds the %d bytes left", n, len(r.B)-r.Off))
		return 0
	}
	return int(n)
}

// Bytes reads what AppendBytes wrote (a slice of B, capped).
func (r *Reader) Bytes() []byte {
	n := r.Length(1)
	return r.Take(n)
}

// Str reads what AppendString wrote.
func (r *Reader) Str() string {
	n := r.U32()
	return string(r.Take(int(n)))
}

// FloatsInto reads a float vector that must have exactly len(dst) elements.
func (r *Reader) FloatsInto(dst []float32) {
	n := r.Length(4)
	if r.Err != nil {
		return
	}
	if n != len(dst) {
		r.Fail(fmt.Sprintf("tensor has %d values, want %d", n, len(dst)))
		return
	}
	s := r.Take(4 * n)
	if littleEndian && n > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), s)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(s[4*i:]))
	}
}

// Tensors reads a tensor list written by AppendTensors that must hold n
// tensors, tensor i of size(i) values; count 0 yields nil (state not
// created yet).
func (r *Reader) Tensors(n int, size func(i int) int) [][]float32 {
	got := int(r.U32())
	if r.Err != nil || got == 0 {
		return nil
	}
	if got != n {
		r.Fail(fmt.Sprintf("%d state tensors for %d parameters", got, n))
		return nil
	}
	out := make([][]float32, n)
	for i := range out {
		out[i] = make([]float32, size(i))
		r.FloatsInto(out[i])
	}
	return out
}

// Done returns the first error met, or an error when bytes are left over.
func (r *Reader) Done() error {
	if r.Err != nil {
		return r.Err
	}
	if r.Off != len(r.B) {
		return fmt.Errorf("%d trailing bytes", len(r.B)-r.Off)
	}
	return nil
}
