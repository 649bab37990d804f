package main

import (
	"bytes"
	"testing"
)

// FuzzDecodeSnapshot: a worker snapshot received by broadcast decodes or
// fails with an error; never a panic, and what decodes encodes back to the
// same bytes.
func FuzzDecodeSnapshot(f *testing.F) {
	s := &snapshot{step: 7, recoveries: 1, cursor: []byte("cursor"), dense: []float32{1, -2, 3.5}, opt: []byte{1, 2}, data: []byte(`{"a":1}`)}
	f.Add(s.encode())
	f.Add((&snapshot{}).encode())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeSnapshot(b)
		if err != nil {
			return
		}
		if enc := got.encode(); !bytes.Equal(enc, b[:len(enc)]) {
			t.Fatalf("decoded snapshot encodes differently")
		}
	})
}
