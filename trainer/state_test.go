package trainer

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func testParams() []Param {
	return []Param{
		{Name: "w", Shape: []int{2, 3}, Value: []float32{1, 2, 3, 4, 5, 6}, Grad: []float32{.1, .2, .3, .4, .5, .6}},
		{Name: "b", Shape: []int{3}, Value: []float32{-1, 0, 1}, Grad: []float32{.5, -.5, .25}},
	}
}

func cloneParams(ps []Param) []Param {
	out := make([]Param, len(ps))
	for i, p := range ps {
		out[i] = Param{Name: p.Name, Shape: slices.Clone(p.Shape), Value: slices.Clone(p.Value), Grad: slices.Clone(p.Grad)}
	}
	return out
}

func testSnapshot(ps []Param, opt Optimizer) *snapshot {
	s := &snapshot{}
	s.take(42, 7, 40, ps, opt, []byte("cursor-bytes"), []int64{1, 2, 3}, []byte("user"))
	return s
}

func TestSnapshotEncodeDecodeRoundTrip(t *testing.T) {
	ps := testParams()
	opt := NewAdam(0.01)
	require.NoError(t, opt.Step(ps))
	s := testSnapshot(ps, opt)
	b := s.encode(nil, ps)
	got, err := decodeSnapshot(b, ps)
	require.NoError(t, err)
	require.Equal(t, s.step, got.step)
	require.Equal(t, s.gen, got.gen)
	require.Equal(t, s.base, got.base)
	require.Equal(t, s.values, got.values)
	require.Equal(t, s.optState(), got.opt)
	require.Equal(t, s.cursor, got.cursor)
	require.Equal(t, s.recoveries, got.recoveries)
	require.Equal(t, s.user, got.user)
	require.Equal(t, b, got.encode(nil, ps))

	// restoreInto brings the live model back.
	live := cloneParams(ps)
	for _, p := range live {
		clear(p.Value)
	}
	opt2 := NewAdam(1)
	require.NoError(t, got.restoreInto(live, opt2))
	for i := range ps {
		require.Equal(t, ps[i].Value, live[i].Value)
	}
	require.Equal(t, opt.AppendState(nil), opt2.AppendState(nil))
}

// encodeV2 returns s (without partitions) in the version 2 encoding: the
// version 3 one without its tail (commit number, data position, partition
// count: 28 bytes).
func encodeV2(s *snapshot, ps []Param) []byte {
	v3 := s.encode(nil, ps)
	body := slices.Concat([]byte(snapshotMagicV2), v3[len(snapshotMagic):len(v3)-4-28])
	return binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

// Checkpoints written before the lineage base was added (version 1) still
// load, with base 0.
func TestSnapshotVersion1StillDecodes(t *testing.T) {
	ps := testParams()
	s := testSnapshot(ps, NewSGD(0.1))
	v2 := encodeV2(s, ps)
	body := slices.Concat([]byte(snapshotMagicV1), v2[len(snapshotMagic):24], v2[32:len(v2)-4])
	v1 := binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
	got, err := decodeSnapshot(v1, ps)
	require.NoError(t, err)
	require.Equal(t, s.step, got.step)
	require.Equal(t, s.gen, got.gen)
	require.Zero(t, got.base)
	require.Equal(t, s.values, got.values)
	require.Equal(t, s.user, got.user)
}

// Checkpoints written before commit numbers, data positions and
// partitions (version 2) still load: their loader state is the cursor,
// their commit number their step.
func TestSnapshotVersion2StillDecodes(t *testing.T) {
	ps := testParams()
	s := testSnapshot(ps, NewSGD(0.1))
	got, err := decodeSnapshot(encodeV2(s, ps), ps)
	require.NoError(t, err)
	require.Equal(t, s.step, got.step)
	require.Equal(t, s.base, got.base)
	require.Equal(t, s.cursor, got.cursor)
	require.Equal(t, s.user, got.user)
	require.EqualValues(t, s.step, got.seq)
	require.Empty(t, got.parts)
}

// Version 3 carries the commit number, the data position and every
// partition's manifests, and decodes back to the same bytes.
func TestSnapshotVersion3RoundTrip(t *testing.T) {
	ps := testParams()
	s := testSnapshot(ps, NewSGD(0.1))
	s.seq, s.epoch, s.epochStep = 99, 2, 17
	s.parts = []partManifests{{name: "emb", manifests: [][]byte{[]byte("rank 0"), {}, []byte("rank 2")}}, {name: "other", manifests: [][]byte{nil}}}
	b := s.encode(nil, ps)
	got, err := decodeSnapshot(b, ps)
	require.NoError(t, err)
	require.Equal(t, uint64(99), got.seq)
	require.Equal(t, int64(2), got.epoch)
	require.Equal(t, int64(17), got.epochStep)
	require.Equal(t, [][]byte{[]byte("rank 0"), {}, []byte("rank 2")}, got.manifests("emb"))
	require.Len(t, got.manifests("other"), 1)
	require.Nil(t, got.manifests("missing"))
	require.Equal(t, b, got.encode(nil, ps))
	require.Equal(t, b, got.clone().encode(nil, ps))
}

func TestSnapshotDecodeRejectsCorruption(t *testing.T) {
	ps := testParams()
	b := testSnapshot(ps, NewSGD(0.1)).encode(nil, ps)
	for i := range b {
		for _, bit := range []byte{1, 0x80} {
			c := slices.Clone(b)
			c[i] ^= bit
			_, err := decodeSnapshot(c, ps)
			require.Error(t, err, "flip at %d", i)
		}
	}
	for n := range len(b) {
		_, err := decodeSnapshot(b[:n], ps)
		require.ErrorIs(t, err, ErrCorruptState, "truncated to %d", n)
	}
	// Another model: a clear shape error.
	other := cloneParams(ps)
	other[1].Shape = []int{1, 3}
	_, err := decodeSnapshot(b, other)
	require.ErrorIs(t, err, ErrShapeMismatch)
}

func FuzzDecodeSnapshot(f *testing.F) {
	ps := testParams()
	f.Add(testSnapshot(ps, NewAdam(0.1)).encode(nil, ps))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSnapshot(b, ps)
		if err == nil && len(s.values) != len(ps) {
			t.Fatalf("decoded %d tensors", len(s.values))
		}
	})
}

func TestVerifyAudit(t *testing.T) {
	expected := func(int) []int { return []int{0, 1, 2, 3, 4, 5} }
	gen := uint64(1)
	step := func(round uint64, s int64, ix ...int) AuditEntry {
		return AuditEntry{Kind: "step", Gen: gen, Round: round, Step: s, Indices: ix}
	}
	agreed := func(round uint64, s int64, restored bool) AuditEntry {
		e := AuditEntry{Kind: "agreed", Gen: gen, Round: round, Step: s, Restored: restored}
		if restored {
			e.Base = s
		}
		return e
	}
	newGen := func(e AuditEntry) AuditEntry { e.Gen = 2; return e }
	cases := []struct {
		name      string
		log       []AuditEntry
		miss, dup int
	}{
		{"clean", []AuditEntry{agreed(1, 0, true), step(1, 1, 0, 1), step(1, 1, 2), step(1, 2, 3, 4, 5)}, 0, 0},
		{"missing", []AuditEntry{step(1, 1, 0, 1), step(1, 2, 3, 4, 5)}, 1, 0},
		{"duplicate", []AuditEntry{step(1, 1, 0, 1, 2), step(1, 2, 2, 3, 4, 5)}, 0, 1},
		{"unexpected", []AuditEntry{step(1, 1, 0, 1, 2, 9), step(1, 2, 3, 4, 5)}, 0, 1},
		{"rolled back then redone", []AuditEntry{
			step(1, 1, 0, 1, 2), step(1, 2, 3, 4), agreed(2, 1, false), step(2, 2, 3, 4, 5)}, 0, 0},
		{"zombie write after agreement is dropped", []AuditEntry{
			step(1, 1, 0, 1, 2), agreed(2, 1, false), step(1, 2, 3), step(2, 2, 3, 4, 5)}, 0, 0},
		{"restart from checkpoint drops later steps of the old lineage", []AuditEntry{
			step(7, 1, 0, 1, 2), step(7, 2, 3, 4, 5), newGen(agreed(1, 1, true)), newGen(step(1, 2, 3, 4, 5))}, 0, 0},
		{"restart with round numbers starting over", []AuditEntry{
			step(1, 1, 0, 1, 2), step(1, 2, 3, 4, 5), newGen(step(1, 2, 3, 4, 5)), newGen(agreed(1, 1, true))}, 0, 0},
		{"restored round failed before its first step: a later agreement of the lineage drops the old steps", []AuditEntry{
			step(7, 1, 0, 1, 2), step(7, 2, 3, 4, 5), newGen(step(1, 2, 3, 4, 5)),
			newGen(AuditEntry{Kind: "agreed", Round: 2, Step: 1, Base: 1}), newGen(step(2, 2, 3, 4, 5))}, 0, 0},
		{"agreement written after the round's first steps", []AuditEntry{
			step(1, 1, 0, 1, 2), step(1, 2, 3, 4), step(2, 2, 3, 4, 5), agreed(2, 1, false)}, 0, 0},
		{"a round that ended without applying its step drops it", []AuditEntry{
			agreed(1, 0, true), step(1, 1, 0, 1, 2), step(1, 2, 3, 4, 5), {Kind: "agreed", Gen: gen, Round: 1, Step: 1, Ended: true}}, 3, 0},
		{"a round's end drops nothing of a later round", []AuditEntry{
			agreed(1, 0, true), step(1, 1, 0, 1, 2), step(1, 2, 3, 4), {Kind: "agreed", Gen: gen, Round: 1, Step: 1, Ended: true},
			agreed(2, 1, false), step(2, 2, 3, 4, 5)}, 0, 0},
		{"kept step of a dead rank counts", []AuditEntry{
			step(1, 1, 0, 1), step(1, 1, 2), step(1, 2, 3, 4), step(1, 2, 5), agreed(2, 2, false)}, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := VerifyAudit(c.log, 1, expected)
			require.Equal(t, c.miss, rep.Missing, "missing")
			require.Equal(t, c.dup, rep.Duplicates, "duplicates")
		})
	}
}

func TestFileAuditRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := OpenFileAudit(path)
	require.NoError(t, err)
	require.NoError(t, a.RecordAgreed(AuditEntry{Gen: 9, Round: 1, Step: 0, Restored: true}))
	require.NoError(t, a.RecordStep(AuditEntry{Round: 1, Rank: 1, Step: 1, Epoch: 0, Indices: []int{3, 1}}))
	require.NoError(t, a.Close())
	// A torn last line (a crash mid-write) is ignored.
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	f.WriteString(`{"kind":"step","rou`)
	f.Close()
	f, err = os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	es, err := ReadAuditLog(f)
	require.NoError(t, err)
	require.Len(t, es, 2)
	require.Equal(t, []int{3, 1}, es[1].Indices)
	require.Equal(t, "step", es[1].Kind)
}

// A decoded snapshot reused by a later commit must not overwrite its own
// fields: appending to one byte field may not spill into the next.
func TestDecodedSnapshotReuseKeepsFieldsApart(t *testing.T) {
	ps := testParams()
	fresh := NewMomentum(0.1, 0.9) // no velocity yet: a short state
	s := &snapshot{}
	s.take(1, 1, 0, ps, fresh, []byte("cursor-1"), nil, nil)
	got, err := decodeSnapshot(s.encode(nil, ps), ps)
	require.NoError(t, err)
	stepped := NewMomentum(0.1, 0.9)
	require.NoError(t, stepped.Step(ps)) // now a long state
	got.take(2, 1, 0, ps, stepped, []byte("cursor-2"), nil, nil)
	require.Equal(t, stepped.AppendState(nil), got.opt)
	require.Equal(t, []byte("cursor-2"), got.cursor)
	other := NewMomentum(1, 0)
	require.NoError(t, other.LoadState(got.opt, ps))
}
