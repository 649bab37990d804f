package sync

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	gosync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// FuzzClientHandshake feeds arbitrary server bytes to the real dialer side
// of the handshake: it never panics, always ends within its deadline, and
// never accepts a server that cannot prove the secret.
func FuzzClientHandshake(f *testing.F) {
	cfg := DefaultConfig()
	cfg.JobID = "fuzz-job"
	cfg.Secret = []byte("fuzz secret of at least 16 bytes")
	msg := func(typ uint8, payload []byte) []byte {
		var b bytes.Buffer
		wire.WriteMsg(&b, nil, typ, payload)
		return b.Bytes()
	}
	f.Add(msg(wire.MsgChallenge, make([]byte, wire.NonceSize+wire.ProofSize)))
	f.Add(append(msg(wire.MsgChallenge, make([]byte, wire.NonceSize+wire.ProofSize)), msg(wire.MsgAccept, nil)...))
	f.Add(msg(wire.MsgReject, wire.AppendReject(nil, wire.RejectAuth, "no")))
	f.Add(msg(wire.MsgReject, []byte{0}))
	f.Add(msg(wire.MsgReject, wire.AppendLayoutReject(nil, &wire.Layout{ChunkBytes: 64, Streams: 1}, "other")))
	f.Add(append(msg(wire.MsgChallenge, make([]byte, wire.NonceSize+wire.ProofSize)),
		msg(wire.MsgReject, wire.AppendLayoutReject(nil, &wire.Layout{ChunkBytes: 64, Streams: 1}, "other"))...))
	f.Add(append(msg(wire.MsgChallenge, make([]byte, wire.NonceSize+wire.ProofSize)),
		msg(wire.MsgReject, wire.AppendLayoutRoundReject(nil, []wire.RankLayout{{Rank: 2, Layout: wire.Layout{ChunkBytes: 64, Streams: 1}}}, "failed"))...))
	f.Add(msg(wire.MsgReject, []byte{wire.RejectLayoutRound, 3, 0}))
	f.Add(msg(wire.MsgAccept, nil))
	f.Add([]byte{wire.MsgChallenge, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		tr := &Transport{cfg: cfg, log: cfg.logger(), closed: make(chan struct{}),
			held: make(map[connKey]*heldConn), adm: newAdmission(), rings: make(map[*Ring]struct{}), now: time.Now}
		cli, srv := net.Pipe()
		var wg gosync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); srv.Write(in); srv.Close() }()
		go func() { defer wg.Done(); io.Copy(io.Discard, srv) }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		hello := &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnControl, Round: 3, From: 0, To: 1, JobID: cfg.JobID}
		start := time.Now()
		_, err := tr.clientHandshake(ctx, cli, hello)
		cli.Close()
		wg.Wait()
		if err == nil {
			t.Fatalf("the dialer accepted a server that does not know the secret")
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("the handshake outlived its deadline: %v", time.Since(start))
		}
	})
}

// FuzzPeerFrames: an authenticated peer sends arbitrary bytes on its mesh
// connection during a small allreduce (conn%3 == 0), on its ring lane
// during a large one (1), or on its control connection (2: abort notices
// with or without a timeout's verdict, busy, close and announce frames),
// then ends the stream. The receiving rank never panics and never hangs:
// it fails with an error (or completes, if the bytes happen to be the
// right frames); a timeout it reports comes from the peer's notice, and
// names only ranks of the world.
func FuzzPeerFrames(f *testing.F) {
	want := wire.Header{Kind: wire.KindAllReduce, Op: uint8(OpSum) | 4<<4, Round: 1, Seq: 1, Total: 40, Length: 40}
	good := make([]byte, wire.HeaderSize+40)
	want.Put(good)
	f.Add(uint8(0), good)
	f.Add(uint8(0), good[:wire.HeaderSize+7])
	abortFrame := func(a wire.Abort, length int) []byte {
		b := make([]byte, wire.HeaderSize)
		(&wire.Header{Kind: wire.KindAbort, Round: 1, Length: uint32(length)}).Put(b)
		return wire.AppendAbort(b, &a)
	}
	plain := wire.Abort{Origin: 1, Blamed: 0, Reason: wire.ReasonProtocol}
	f.Add(uint8(0), abortFrame(plain, wire.AbortSize))
	f.Add(uint8(0), []byte("garbage"))
	lane := wire.Header{Kind: wire.KindAllReduce, Op: uint8(OpSum) | 4<<4, Round: 1, Seq: 1, Total: 400000, Length: 4096}
	laneFrame := make([]byte, wire.HeaderSize)
	lane.Put(laneFrame)
	f.Add(uint8(1), laneFrame)
	f.Add(uint8(1), []byte("garbage on a lane"))
	verdict := wire.Abort{Origin: 1, Blamed: -1, Reason: wire.ReasonTimeout, Verdict: true, Waited: 5e8, Busy: []int{0}}
	f.Add(uint8(2), abortFrame(plain, wire.AbortSize))
	f.Add(uint8(2), abortFrame(verdict, verdict.Size()))
	f.Add(uint8(2), abortFrame(verdict, verdict.Size()+1))                    // length past the payload
	f.Add(uint8(2), abortFrame(verdict, verdict.Size())[:wire.HeaderSize+12]) // truncated
	f.Add(uint8(2), abortFrame(verdict, wire.MaxAbortSize(2)+4))              // over the bound
	busyClose := make([]byte, 2*wire.HeaderSize)
	(&wire.Header{Kind: wire.KindBusy, Round: 1}).Put(busyClose)
	(&wire.Header{Kind: wire.KindClose, Round: 1}).Put(busyClose[wire.HeaderSize:])
	f.Add(uint8(2), busyClose)
	f.Add(uint8(2), []byte("garbage on the control connection"))
	f.Fuzz(func(t *testing.T, conn uint8, data []byte) {
		cfg := smallConfig(t)
		cfg.OpTimeout = 10 * time.Second
		w := newTestWorld(t, 2, cfg)
		peer := w.rings[1].peers[0]
		c, n := peer.mesh, 10
		var also net.Conn // closed for writing too, so the operation ends
		switch conn % 3 {
		case 1:
			c, n = w.rings[1].lanes[0].right, 100000
		case 2:
			c, also = peer.ctrl, peer.mesh
		}
		var wg gosync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Write(data)
			for _, c := range []net.Conn{c, also} {
				if cw, ok := c.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := w.rings[0].AllReduceFloat32(ctx, make([]float32, n), OpSum)
		w.rings[0].Close()
		w.rings[1].Close()
		wg.Wait()
		var te *TimeoutError
		if errors.As(err, &te) {
			if te.From == 0 {
				t.Fatalf("the receiving rank hung: %v", err)
			}
			for _, r := range append(slices.Clone(te.Silent), te.Busy...) {
				if r < 0 || r >= 2 || r == te.From {
					t.Fatalf("a notice named rank %d: %v", r, err)
				}
			}
		} else if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout) {
			t.Fatalf("the receiving rank hung: %v", err)
		}
	})
}
