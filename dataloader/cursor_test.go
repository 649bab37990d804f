package dataloader

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
)

func validCursor() Cursor {
	return Cursor{Seed: 0xfeedface_01234567, DatasetLen: 60000, GlobalBatch: 64, Epoch: 3, Position: 640, Shuffle: true}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, c := range []Cursor{
		validCursor(),
		{DatasetLen: 1, GlobalBatch: 1},
		{Seed: ^uint64(0), DatasetLen: 10, GlobalBatch: 4, Epoch: 1 << 40, Position: 8},
	} {
		b, err := c.MarshalBinary()
		mustNoError(t, err)
		mustEqual(t, CursorSize, len(b))
		var d Cursor
		mustNoError(t, d.UnmarshalBinary(b))
		mustEqual(t, c, d, "restore(save(x)) == x")
		b2, err := d.MarshalBinary()
		mustNoError(t, err)
		mustTrue(t, bytes.Equal(b, b2), "save(restore(x)) == x")
	}
}

func TestCursorMarshalRejectsInvalid(t *testing.T) {
	for _, c := range []Cursor{
		{},
		{DatasetLen: 10, GlobalBatch: 0},
		{DatasetLen: 10, GlobalBatch: 4, Epoch: -1},
		{DatasetLen: 10, GlobalBatch: 4, Position: 10},
		{DatasetLen: 10, GlobalBatch: 4, Position: 3},
		{DatasetLen: 10, GlobalBatch: 4, Position: -4},
	} {
		_, err := c.MarshalBinary()
		mustErrorIs(t, err, ErrInvalidCursor, "%+v", c)
	}
}

// reseal recomputes the checksum after a test modified a field, so the
// decoder's other checks are reached.
func reseal(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[48:], crc32.Checksum(b[:48], castagnoli))
	return b
}

func TestCursorUnmarshalRejectsBadInput(t *testing.T) {
	good, err := validCursor().MarshalBinary()
	mustNoError(t, err)
	mod := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	cases := map[string][]byte{
		"empty":        nil,
		"short":        good[:51],
		"long":         append(bytes.Clone(good), 0),
		"magic":        mod(func(b []byte) []byte { b[0] = 'X'; return reseal(b) }),
		"version":      mod(func(b []byte) []byte { b[4] = 2; return reseal(b) }),
		"flags":        mod(func(b []byte) []byte { b[5] |= 0x80; return reseal(b) }),
		"reserved":     mod(func(b []byte) []byte { b[7] = 1; return reseal(b) }),
		"checksum":     mod(func(b []byte) []byte { b[20] ^= 1; return b }),
		"bad crc only": mod(func(b []byte) []byte { b[50] ^= 0xff; return b }),
		"int overflow": mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[32:], 1<<63); return reseal(b) }),
		"zero length":  mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 0); return reseal(b) }),
		"misaligned":   mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[40:], 65); return reseal(b) }),
		"past end":     mod(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[40:], 60032); return reseal(b) }),
	}
	for name, in := range cases {
		c := Cursor{Epoch: 77}
		err := c.UnmarshalBinary(in)
		mustErrorIs(t, err, ErrCorruptCursor, name)
		mustEqual(t, Cursor{Epoch: 77}, c, "%s: cursor modified on error", name)
	}
}

// FuzzCursorUnmarshal checks that any input either fails with
// ErrCorruptCursor or decodes to a valid cursor that encodes back to the
// same bytes; it never panics. The seed corpus runs as a normal test.
func FuzzCursorUnmarshal(f *testing.F) {
	good, _ := validCursor().MarshalBinary()
	f.Add(good)
	f.Add([]byte{})
	f.Add(good[:10])
	f.Add(reseal(append(bytes.Repeat([]byte{0xff}, 48), 0, 0, 0, 0)))
	small, _ := Cursor{DatasetLen: 1, GlobalBatch: 1}.MarshalBinary()
	f.Add(small)
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Cursor
		if err := c.UnmarshalBinary(data); err != nil {
			mustErrorIs(t, err, ErrCorruptCursor)
			return
		}
		mustNoError(t, c.Validate())
		b, err := c.MarshalBinary()
		mustNoError(t, err)
		mustTrue(t, bytes.Equal(b, data), "re-encoding differs")
	})
}
