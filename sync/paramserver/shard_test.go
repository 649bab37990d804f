package paramserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// psTables are the tables of most tests: one of each optimizer.
func psTables() []TableSpec {
	return []TableSpec{
		{Name: "users", Rows: 97, Dim: 3, Optimizer: NewSparseAdagrad(0.1), InitScale: 0.5, Seed: 1},
		{Name: "items", Rows: 61, Dim: 5, Optimizer: NewSparseAdam(0.01), InitScale: 0.5, Seed: 2},
		{Name: "bias", Rows: 13, Dim: 1, Optimizer: NewSparseSGD(0.5), Seed: 3},
	}
}

// TestPSShardEncoding: a shard round-trips through its encoding; any
// truncation or flipped bit is ErrCorruptShard, never a panic; a store
// holding a corrupt shard fails the restore with ErrCorruptShard.
func TestPSShardEncoding(t *testing.T) {
	specs := psTables()
	d := newShardData(specs, 1, 3)
	initShardData(specs, d)
	d.step = 42
	b := encodeShard(nil, specs, d)
	got, err := decodeShard(b, specs)
	if err != nil {
		t.Fatal(err)
	}
	if got.step != 42 || got.shards != 3 || got.shard != 1 || fmt.Sprint(got.tables) != fmt.Sprint(d.tables) {
		t.Fatal("round trip changed the shard")
	}
	info, err := DecodeShardInfo(b)
	if err != nil || info.Step != 42 || len(info.Tables) != 3 || info.Tables[1].Name != "items" || info.Tables[1].Held != ShardRows(61, 1, 3) {
		t.Fatalf("DecodeShardInfo = %+v, %v", info, err)
	}
	for n := 0; n < len(b); n += 1 + n/7 {
		if _, err := decodeShard(b[:n], specs); !errors.Is(err, ErrCorruptShard) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	for i := 0; i < len(b); i += 3 {
		c := append([]byte(nil), b...)
		c[i] ^= 0x10
		if _, err := decodeShard(c, specs); !errors.Is(err, ErrCorruptShard) {
			t.Fatalf("bit flipped at %d: %v", i, err)
		}
	}
	other := psTables()
	other[1].Dim = 6
	if _, err := decodeShard(b, other); !errors.Is(err, ErrCorruptShard) {
		t.Fatalf("other table specs: %v", err)
	}
}

// FuzzPSHeader: the frame header decoder never panics and rejects what it
// cannot bound.
func FuzzPSHeader(f *testing.F) {
	var b [wire.PSHeaderSize]byte
	(&wire.PSHeader{Kind: wire.PSPush, Length: 16, Round: 3, Count: 1}).Put(b[:])
	f.Add(b[:])
	f.Add([]byte{0xa2, 0xe7, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := wire.ParsePSHeader(data, 1<<20)
		if err == nil && (h.Length > 1<<20 || h.Kind == 0 || h.Kind > wire.PSReplicate) {
			t.Fatalf("accepted %+v", h)
		}
	})
}

// FuzzPSShardDecode: the shard decoder never panics on any input.
func FuzzPSShardDecode(f *testing.F) {
	specs := psTables()
	d := newShardData(specs, 0, 2)
	f.Add(encodeShard(nil, specs, d))
	f.Add([]byte("ETPS"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := decodeShard(data, specs); err != nil && !errors.Is(err, ErrCorruptShard) {
			t.Fatalf("error %v does not wrap ErrCorruptShard", err)
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
