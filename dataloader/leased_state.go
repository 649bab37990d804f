package dataloader

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
	"slices"
)

// The committed state of a LeasedLoader, and each rank's part of it, is
// one versioned, CRC-32C checksummed record:
//
//	magic "ETLS", version 1, kind (1 part, 2 merged), flags (bit 0 shuffle), 0
//	lineage u64, seed u64, dataset length u64, shard size u64
//	epoch u32, steps of the epoch so far u32, rank u32, world size u32
//	consumed: ceil(shards/8) bytes, bit i of byte i/8 set for shard i
//	open:   count u32, then per lease in progress index u32, token u64, position u32
//	done:   count u32, then per consumed, not yet acked lease index u32, token u64, position u32 (= the shard's end)
//	resume: count u32, then per partly trained shard nobody holds index u32, token u64 (0), position u32
//	CRC-32C (Castagnoli) of everything before, u32
//
// Little-endian throughout. Positions are positions of the epoch's order.
// A merged state has rank 0 and the number of parts as world size.

const (
	stateMagic   = "ETLS"
	stateVersion = 1
	stateHeader  = 4 + 4 + 4*8 + 4*4
	stateEntry   = 4 + 8 + 4

	kindPart   = 1
	kindMerged = 2

	// maxEpoch bounds the epoch so that it fits the low bits of the queue's
	// epoch number (see LeasedLoader.QueueEpoch).
	maxEpoch = 1<<epochBits - 1
)

// leaseEntry is one shard of a state's open, done or resume list.
type leaseEntry struct {
	index int
	token uint64
	pos   int
}

// leasedState is a decoded state or part.
type leasedState struct {
	kind       byte
	shuffle    bool
	lineage    uint64
	seed       uint64
	datasetLen int
	shardSize  int
	epoch      int
	epochStep  int
	rank, size int
	consumed   []byte
	open       []leaseEntry
	done       []leaseEntry
	resume     []leaseEntry
}

func bitmapLen(shards int) int { return (shards + 7) / 8 }

func bitSet(b []byte, i int) bool { return b[i/8]&(1<<(i%8)) != 0 }

func setBit(b []byte, i int) { b[i/8] |= 1 << (i % 8) }

func popcount(b []byte) int {
	n := 0
	for _, x := range b {
		n += bits.OnesCount8(x)
	}
	return n
}

func (s *leasedState) encode() []byte {
	n := stateHeader + len(s.consumed) + 12 + stateEntry*(len(s.open)+len(s.done)+len(s.resume)) + 4
	b := make([]byte, 0, n)
	b = append(b, stateMagic...)
	var flags byte
	if s.shuffle {
		flags = 1
	}
	b = append(b, stateVersion, s.kind, flags, 0)
	for _, v := range []uint64{s.lineage, s.seed, uint64(s.datasetLen), uint64(s.shardSize)} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	for _, v := range []int{s.epoch, s.epochStep, s.rank, s.size} {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	b = append(b, s.consumed...)
	for _, list := range [][]leaseEntry{s.open, s.done, s.resume} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(list)))
		for _, e := range list {
			b = binary.LittleEndian.AppendUint32(b, uint32(e.index))
			b = binary.LittleEndian.AppendUint64(b, e.token)
			b = binary.LittleEndian.AppendUint32(b, uint32(e.pos))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func corrupt(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrCorruptState, fmt.Sprintf(format, a...))
}

// decodeState parses b as a state of kind for a loader with layout sc,
// seed and shuffle, and checks every field (see check). It never panics
// and allocates at most what the layout bounds.
func decodeState(b []byte, kind byte, sc ShardConfig, seed uint64, shuffle bool) (*leasedState, error) {
	ns := sc.NumShards()
	nb := bitmapLen(ns)
	if len(b) < stateHeader+nb+12+4 {
		return nil, corrupt("%d bytes, want at least %d", len(b), stateHeader+nb+16)
	}
	body := b[:len(b)-4]
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32.Checksum(body, castagnoli); got != want {
		return nil, corrupt("checksum %08x, want %08x", got, want)
	}
	if string(b[:4]) != stateMagic {
		return nil, corrupt("magic %q", b[:4])
	}
	if b[4] != stateVersion {
		return nil, corrupt("version %d, want %d", b[4], stateVersion)
	}
	if b[5] != kind {
		return nil, corrupt("kind %d, want %d (1 is one rank's part, 2 a merged state)", b[5], kind)
	}
	if b[6]&^1 != 0 || b[7] != 0 {
		return nil, corrupt("flags %#x %#x", b[6], b[7])
	}
	s := &leasedState{kind: kind, shuffle: b[6]&1 != 0}
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	u32 := func(off int) int { return int(binary.LittleEndian.Uint32(b[off:])) }
	s.lineage, s.seed = u64(8), u64(16)
	dlen, size := u64(24), u64(32)
	if dlen != uint64(sc.DatasetLen) || size != uint64(sc.ShardSize) || s.seed != seed || s.shuffle != shuffle {
		return nil, fmt.Errorf("%w: leased state for dataset length %d, shard size %d, seed %d, shuffle %v; loader has %d, %d, %d, %v",
			ErrCursorMismatch, dlen, size, s.seed, s.shuffle, sc.DatasetLen, sc.ShardSize, seed, shuffle)
	}
	s.datasetLen, s.shardSize = sc.DatasetLen, sc.ShardSize
	s.epoch, s.epochStep, s.rank, s.size = u32(40), u32(44), u32(48), u32(52)
	off := stateHeader
	s.consumed = slices.Clone(b[off : off+nb])
	off += nb
	lists := [3]*[]leaseEntry{&s.open, &s.done, &s.resume}
	for li, list := range lists {
		if off+4 > len(body) {
			return nil, corrupt("list %d cut short", li)
		}
		n := u32(off)
		off += 4
		if n < 0 || n > ns || off+n*stateEntry > len(body) {
			return nil, corrupt("list %d announces %d entries; %d shards, %d bytes left", li, n, ns, len(body)-off)
		}
		*list = make([]leaseEntry, n)
		for i := range n {
			(*list)[i] = leaseEntry{index: u32(off), token: u64(off + 4), pos: u32(off + 12)}
			off += stateEntry
		}
	}
	if off != len(body) {
		return nil, corrupt("%d trailing bytes", len(body)-off)
	}
	if err := s.check(sc); err != nil {
		return nil, err
	}
	return s, nil
}

// check validates a state's fields against layout sc: the epoch in range,
// the rank inside the world, no bit past the last shard, every entry
// inside the layout, no shard in two entries, leases in progress and
// resume points not consumed, consumed leases consumed.
func (s *leasedState) check(sc ShardConfig) error {
	ns := sc.NumShards()
	switch {
	case s.epoch < 0 || s.epoch > maxEpoch-1:
		return corrupt("epoch %d beyond %d", s.epoch, maxEpoch-1)
	case s.epochStep < 0:
		return corrupt("step count %d", s.epochStep)
	case s.size < 1 || s.size > 1<<24:
		return corrupt("world size %d", s.size)
	case s.rank < 0, s.kind == kindPart && s.rank >= s.size, s.kind == kindMerged && s.rank != 0:
		return corrupt("rank %d of %d in a state of kind %d", s.rank, s.size, s.kind)
	case len(s.consumed) != bitmapLen(ns):
		return corrupt("consumed bitmap of %d bytes, want %d", len(s.consumed), bitmapLen(ns))
	}
	for i := ns; i < len(s.consumed)*8; i++ {
		if bitSet(s.consumed, i) {
			return corrupt("shard %d consumed, the epoch has %d", i, ns)
		}
	}
	seen := make(map[int]string, len(s.open)+len(s.done)+len(s.resume))
	for _, l := range []struct {
		name string
		list []leaseEntry
	}{{"open", s.open}, {"done", s.done}, {"resume", s.resume}} {
		for _, e := range l.list {
			if e.index < 0 || e.index >= ns {
				return corrupt("%s shard %d, the epoch has %d", l.name, e.index, ns)
			}
			if prev, dup := seen[e.index]; dup {
				return corrupt("shard %d both %s and %s", e.index, prev, l.name)
			}
			seen[e.index] = l.name
			lo, hi := sc.ShardRange(e.index)
			consumed := bitSet(s.consumed, e.index)
			var ok bool
			switch l.name {
			case "open":
				ok = e.token != 0 && e.pos >= lo && e.pos < hi && !consumed
			case "done":
				ok = e.token != 0 && e.pos == hi && consumed
			case "resume":
				ok = e.token == 0 && e.pos > lo && e.pos < hi && !consumed
			}
			if !ok {
				return corrupt("%s shard %d [%d, %d): token %d, position %d, consumed %v", l.name, e.index, lo, hi, e.token, e.pos, consumed)
			}
		}
	}
	return nil
}

// mergeStates merges the parts of ranks 0..len(parts)-1 into one state:
// the same lineage, epoch and step count in every part; the consumed
// shards of any; the leases in progress and consumed leases of all, in
// rank order; the resume points that no rank took up.
func mergeStates(parts [][]byte, sc ShardConfig, seed uint64, shuffle bool) ([]byte, error) {
	if len(parts) == 0 || len(parts) > 1<<24 {
		return nil, corrupt("%d parts", len(parts))
	}
	var out *leasedState
	resume := map[int]leaseEntry{}
	count := map[int]int{}
	for r, b := range parts {
		p, err := decodeState(b, kindPart, sc, seed, shuffle)
		if err != nil {
			return nil, fmt.Errorf("part %d: %w", r, err)
		}
		if p.rank != r || p.size != len(parts) {
			return nil, corrupt("part %d is rank %d of %d, want rank %d of %d", r, p.rank, p.size, r, len(parts))
		}
		if out == nil {
			out = &leasedState{kind: kindMerged, shuffle: shuffle, lineage: p.lineage, seed: seed,
				datasetLen: sc.DatasetLen, shardSize: sc.ShardSize, epoch: p.epoch, epochStep: p.epochStep,
				size: len(parts), consumed: make([]byte, len(p.consumed))}
		}
		if p.lineage != out.lineage || p.epoch != out.epoch || p.epochStep != out.epochStep {
			return nil, corrupt("part %d has lineage %d, epoch %d, step %d; part 0 has %d, %d, %d",
				r, p.lineage, p.epoch, p.epochStep, out.lineage, out.epoch, out.epochStep)
		}
		for i, x := range p.consumed {
			out.consumed[i] |= x
		}
		out.open = append(out.open, p.open...)
		out.done = append(out.done, p.done...)
		for _, e := range p.resume {
			if prev, ok := resume[e.index]; ok && prev.pos != e.pos {
				return nil, corrupt("resume point of shard %d at %d in part %d, at %d before", e.index, e.pos, r, prev.pos)
			}
			resume[e.index] = e
			count[e.index]++
		}
	}
	taken := map[int]bool{}
	for _, e := range out.open {
		taken[e.index] = true
	}
	for i := range resume {
		if count[i] == len(parts) {
			out.resume = append(out.resume, resume[i])
		} else if !taken[i] && !bitSet(out.consumed, i) {
			// A rank drops a resume point only when it leases that
			// shard, which then is in progress or consumed.
			return nil, corrupt("resume point of shard %d missing from %d parts, and nobody holds the shard", i, len(parts)-count[i])
		}
	}
	slices.SortFunc(out.resume, func(a, b leaseEntry) int { return a.index - b.index })
	if err := out.check(sc); err != nil {
		return nil, err
	}
	return out.encode(), nil
}
