package sync

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"net"
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
// connection during a small allreduce (lane false), or on its ring lane
// during a large one (lane true), then ends the stream. The receiving rank
// never panics and never hangs: it fails with an error (or completes, if
// the bytes happen to be the right frames).
func FuzzPeerFrames(f *testing.F) {
	want := wire.Header{Kind: wire.KindAllReduce, Op: uint8(OpSum) | 4<<4, Round: 1, Seq: 1, Total: 40, Length: 40}
	good := make([]byte, wire.HeaderSize+40)
	want.Put(good)
	f.Add(false, good)
	f.Add(false, good[:wire.HeaderSize+7])
	abort := make([]byte, wire.HeaderSize+wire.AbortSize)
	(&wire.Header{Kind: wire.KindAbort, Round: 1, Length: wire.AbortSize}).Put(abort)
	(&wire.Abort{Origin: 1, Blamed: 0, Reason: wire.ReasonProtocol}).Put(abort[wire.HeaderSize:])
	f.Add(false, abort)
	f.Add(false, []byte("garbage"))
	lane := wire.Header{Kind: wire.KindAllReduce, Op: uint8(OpSum) | 4<<4, Round: 1, Seq: 1, Total: 400000, Length: 4096}
	laneFrame := make([]byte, wire.HeaderSize)
	lane.Put(laneFrame)
	f.Add(true, laneFrame)
	f.Add(true, []byte("garbage on a lane"))
	f.Fuzz(func(t *testing.T, onLane bool, data []byte) {
		cfg := smallConfig(t)
		cfg.OpTimeout = 10 * time.Second
		w := newTestWorld(t, 2, cfg)
		c, n := w.rings[1].peers[0].mesh, 10
		if onLane {
			c, n = w.rings[1].lanes[0].right, 100000
		}
		var wg gosync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Write(data)
			if cw, ok := c.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := w.rings[0].AllReduceFloat32(ctx, make([]float32, n), OpSum)
		w.rings[0].Close()
		w.rings[1].Close()
		wg.Wait()
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout) {
			t.Fatalf("the receiving rank hung: %v", err)
		}
	})
}

// FuzzPSPlan: a parameter-server plan broadcast by rank 0 decodes to a
// consistent plan or an error (the caller bounds it to 4..16 MiB bytes).
func FuzzPSPlan(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0, 0, 0, 'l', 'o', 's', 't'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 4 || len(b) > 1<<24 {
			return // refused by the caller before parsePlan
		}
		p, err := parsePlan(b)
		if err != nil {
			return
		}
		if !p.init && (p.oldShards < 1 || len(p.src) != p.oldShards) {
			t.Fatalf("inconsistent plan %+v", p)
		}
	})
}

// FuzzDecodeShardInfo: shard files read from a ShardStore describe
// themselves or fail with ErrCorruptShard; never a panic. With fixCRC the
// input gets a valid checksum appended, so the fuzzer reaches the decoder
// behind it.
func FuzzDecodeShardInfo(f *testing.F) {
	specs := psTables()
	for _, d := range []*psShardData{newShardData(specs, 0, 2), newShardData(specs, 1, 3)} {
		b := encodeShard(nil, specs, d)
		f.Add(b, false)
		f.Add(b[:len(b)-4], true)
	}
	f.Add([]byte("ETPS"), false)
	f.Fuzz(func(t *testing.T, b []byte, fixCRC bool) {
		if fixCRC {
			b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, psCRC))
		}
		info, err := DecodeShardInfo(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptShard) {
				t.Fatalf("error %v does not wrap ErrCorruptShard", err)
			}
			return
		}
		if info.Shards < 1 || info.Shard < 0 || info.Shard >= info.Shards {
			t.Fatalf("accepted shard %d of %d", info.Shard, info.Shards)
		}
		if _, err := decodeShard(b, specs); err != nil && !errors.Is(err, ErrCorruptShard) {
			t.Fatalf("decodeShard error %v does not wrap ErrCorruptShard", err)
		}
	})
}
