package sync

import (
	"context"
	"errors"
	"testing"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// TestBadFramesRefused: an oversized, garbled or truncated frame from a peer
// fails the operation with ErrBadFrame (a truncated one also names the peer)
// instead of a panic or a hang, and closes the connections.
func TestBadFramesRefused(t *testing.T) {
	cfg := smallConfig(t)
	// The frame rank 0 expects from rank 1 for a direct allreduce of 10
	// float32 values as the first operation.
	want := wire.Header{Kind: wire.KindAllReduce, Op: uint8(OpSum) | 4<<4, Round: 1, Seq: 1, Total: 40, Length: 40}
	frame := func(h wire.Header, payload int) []byte {
		b := make([]byte, wire.HeaderSize+payload)
		h.Put(b)
		return b
	}
	oversized := want
	oversized.Length = uint32(cfg.MaxFrameBytes + 1)
	cases := []struct {
		name     string
		bytes    []byte
		closeNow bool
		peerErr  bool
	}{
		{"oversized", frame(oversized, 0), false, false},
		{"bad magic", append([]byte{0xde, 0xad}, frame(want, 40)[2:]...), false, false},
		{"unknown kind", func() []byte { b := frame(want, 40); b[2] = 99; return b }(), false, false},
		{"truncated payload", frame(want, 40)[:wire.HeaderSize+20], true, true},
		{"truncated header", frame(want, 40)[:wire.HeaderSize-3], true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newTestWorld(t, 2, cfg)
			// Rank 1 misbehaves on its mesh connection to rank 0.
			p := w.rings[1].peers[0]
			if _, err := p.mesh.Write(c.bytes); err != nil {
				t.Fatal(err)
			}
			if c.closeNow {
				// End the stream (rank 1 can still read what rank 0 sends).
				if err := p.mesh.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			err := w.rings[0].AllReduceFloat32(context.Background(), make([]float32, 10), OpSum)
			if !errors.Is(err, ErrBadFrame) {
				t.Fatalf("got %v, want ErrBadFrame", err)
			}
			var pe *PeerError
			if c.peerErr && (!errors.As(err, &pe) || pe.Rank != 1) {
				t.Fatalf("got %v, want a PeerError naming rank 1", err)
			}
			// The misbehaving side learns of it too.
			if err := w.rings[1].AllReduceFloat32(context.Background(), make([]float32, 10), OpSum); err == nil {
				t.Fatal("rank 1: no error")
			}
		})
	}
}

// TestBadFrameOnLane: garbage on a ring lane during a large allreduce.
func TestBadFrameOnLane(t *testing.T) {
	w := newTestWorld(t, 2, smallConfig(t))
	garbage := make([]byte, 4*wire.HeaderSize)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	w.rings[1].lanes[0].right.Write(garbage)
	err := w.rings[0].AllReduceFloat32(context.Background(), make([]float32, 100000), OpSum)
	if !errors.Is(err, ErrBadFrame) {
		t.Fatalf("got %v, want ErrBadFrame", err)
	}
}
