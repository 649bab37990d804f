package dataloader

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Cursor is a Loader's whole position: which epoch, and which position of
// that epoch's order the next global batch starts at, plus the values the
// order depends on (seed, dataset length, shuffle) and the global batch size
// that fixes the step boundaries. It is a small comparable value; save it
// with MarshalBinary alongside a checkpoint and give it back to
// Loader.Reset, for the same or another world size.
//
// A valid Cursor has DatasetLen > 0, GlobalBatch > 0, Epoch >= 0, and
// 0 <= Position < DatasetLen with Position a multiple of GlobalBatch (see
// Validate). Position is the first position of step Position/GlobalBatch;
// the cursor after the last step of an epoch is (Epoch+1, 0).
type Cursor struct {
	// Seed is the shuffle seed (Config.Seed).
	Seed uint64
	// DatasetLen is the number of samples in the dataset (Dataset.Len()).
	DatasetLen int
	// GlobalBatch is the global batch size in samples (Config.GlobalBatch).
	GlobalBatch int
	// Epoch is the epoch of the next global batch, from 0.
	Epoch int
	// Position is the position in the epoch's order where the next global
	// batch starts, in samples, from 0.
	Position int
	// Shuffle records Config.Shuffle: whether the order is Order(Seed,
	// Epoch, DatasetLen) or the identity. (An addition to the contract's
	// fields: restoring with the other setting would change the order.)
	Shuffle bool
}

// Cursor wire format, version 1 (52 bytes, integers little-endian):
//
//	0..3   magic "ETDC"
//	4      format version (1)
//	5      flags: bit 0 = Shuffle; other bits must be 0
//	6..7   reserved, must be 0
//	8..15  Seed
//	16..23 DatasetLen
//	24..31 GlobalBatch
//	32..39 Epoch
//	40..47 Position
//	48..51 CRC-32C (Castagnoli) of bytes 0..47
const (
	cursorMagic   = "ETDC"
	cursorVersion = 1
	cursorLen     = CursorSize
	flagShuffle   = 1 << 0
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CursorSize is the length in bytes of an encoded Cursor (format version 1).
const CursorSize = 52

// Validate reports whether c is consistent in itself (see Cursor). It
// returns an error wrapping ErrInvalidCursor naming the bad field, or nil.
// It does not check c against a Loader; Loader.Reset does that.
func (c Cursor) Validate() error {
	switch {
	case c.DatasetLen <= 0:
		return fmt.Errorf("%w: dataset length %d, want > 0", ErrInvalidCursor, c.DatasetLen)
	case c.GlobalBatch <= 0:
		return fmt.Errorf("%w: global batch %d, want > 0", ErrInvalidCursor, c.GlobalBatch)
	case c.Epoch < 0:
		return fmt.Errorf("%w: epoch %d, want >= 0", ErrInvalidCursor, c.Epoch)
	case c.Position < 0 || c.Position >= c.DatasetLen:
		return fmt.Errorf("%w: position %d outside dataset of %d samples", ErrInvalidCursor, c.Position, c.DatasetLen)
	case c.Position%c.GlobalBatch != 0:
		return fmt.Errorf("%w: position %d is not a multiple of the global batch %d", ErrInvalidCursor, c.Position, c.GlobalBatch)
	}
	return nil
}

// Step returns the index within its epoch of the global batch the cursor
// points at: Position / GlobalBatch (0 if GlobalBatch <= 0).
func (c Cursor) Step() int {
	if c.GlobalBatch <= 0 {
		return 0
	}
	return c.Position / c.GlobalBatch
}

// String formats the cursor for logs, e.g. "epoch 3 position 128 (step 2)".
func (c Cursor) String() string {
	return fmt.Sprintf("epoch %d position %d (step %d)", c.Epoch, c.Position, c.Step())
}

// MarshalBinary encodes c in the versioned, checksummed format above
// (CursorSize bytes). It returns an error wrapping ErrInvalidCursor if c
// fails Validate, so only cursors a Loader accepts are ever written.
func (c Cursor) MarshalBinary() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.AppendBinary(make([]byte, 0, cursorLen))
}

// AppendBinary appends the encoding of c (see MarshalBinary) to b.
func (c Cursor) AppendBinary(b []byte) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	start := len(b)
	b = append(b, cursorMagic...)
	var flags byte
	if c.Shuffle {
		flags |= flagShuffle
	}
	b = append(b, cursorVersion, flags, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, c.Seed)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.DatasetLen))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.GlobalBatch))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Epoch))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Position))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
	return b, nil
}

// UnmarshalBinary decodes data written by MarshalBinary into c. Any bad
// input (wrong length, magic, unknown version or flags, non-zero reserved
// bytes, checksum mismatch, values that do not fit an int, or a decoded
// cursor that fails Validate) gives an error wrapping ErrCorruptCursor with
// the detail, and leaves c unchanged. It never panics.
func (c *Cursor) UnmarshalBinary(data []byte) error {
	if len(data) != cursorLen {
		return fmt.Errorf("%w: %d bytes, want %d", ErrCorruptCursor, len(data), cursorLen)
	}
	if string(data[:4]) != cursorMagic {
		return fmt.Errorf("%w: bad magic %q", ErrCorruptCursor, data[:4])
	}
	if data[4] != cursorVersion {
		return fmt.Errorf("%w: unknown format version %d (this build reads %d)", ErrCorruptCursor, data[4], cursorVersion)
	}
	want := binary.LittleEndian.Uint32(data[48:])
	if got := crc32.Checksum(data[:48], castagnoli); got != want {
		return fmt.Errorf("%w: checksum %08x, stored %08x", ErrCorruptCursor, got, want)
	}
	if data[5]&^flagShuffle != 0 {
		return fmt.Errorf("%w: unknown flags %#02x", ErrCorruptCursor, data[5])
	}
	if data[6] != 0 || data[7] != 0 {
		return fmt.Errorf("%w: non-zero reserved bytes", ErrCorruptCursor)
	}
	var ints [4]int
	for i, name := range [...]string{"dataset length", "global batch", "epoch", "position"} {
		v := binary.LittleEndian.Uint64(data[16+8*i:])
		if v > math.MaxInt {
			return fmt.Errorf("%w: %s %d does not fit an int", ErrCorruptCursor, name, v)
		}
		ints[i] = int(v)
	}
	d := Cursor{
		Seed:        binary.LittleEndian.Uint64(data[8:]),
		DatasetLen:  ints[0],
		GlobalBatch: ints[1],
		Epoch:       ints[2],
		Position:    ints[3],
		Shuffle:     data[5]&flagShuffle != 0,
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrCorruptCursor, err)
	}
	*c = d
	return nil
}
