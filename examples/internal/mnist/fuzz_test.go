package mnist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzParseIDXHeader: an IDX header read from a data file of any content
// is a header within the size bound or ErrBadIDX; never a panic.
func FuzzParseIDXHeader(f *testing.F) {
	good := binary.BigEndian.AppendUint32(nil, imagesMagic)
	for _, d := range []uint32{60000, 28, 28} {
		good = binary.BigEndian.AppendUint32(good, d)
	}
	f.Add(good, true)
	f.Add(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, labelsMagic), 10000), false)
	f.Add(good[:9], true)
	f.Add(append(good[:4], 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1), true)
	f.Fuzz(func(t *testing.T, b []byte, images bool) {
		magic := uint32(labelsMagic)
		if images {
			magic = imagesMagic
		}
		h, err := parseIDXHeader(bytes.NewReader(b), "fuzz", magic)
		if err != nil {
			if !errors.Is(err, ErrBadIDX) {
				t.Fatalf("error %v does not wrap ErrBadIDX", err)
			}
			return
		}
		if n, ok := h.dataBytes(); !ok || n > maxIDXBytes || len(h.dims) != int(magic&0xff) {
			t.Fatalf("accepted header %+v", h)
		}
	})
}
