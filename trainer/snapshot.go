package trainer

import (
	"encoding/binary"
	"fmt"
	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"hash/crc32"
	"slices"
)

// snapshot is one commit: everything needed to continue training exactly
// from a step boundary. It is what rollbacks restore, what joiners receive by
// broadcast and what durable checkpoints hold.
type snapshot struct {
	step       int64       // global steps applied since the job began
	gen        uint64      // lineage: new at every restore or fresh start (see Audit)
	base       int64       // step at which lineage gen began: the restored checkpoint's, or 0
	values     [][]float32 // copy of every Param.Value, in model order
	optName    string
	opt        []byte            // Optimizer.AppendState, unless optFrozen holds the state
	optFrozen  optim.FrozenState // the state of an optimizer that freezes it (optim.StateFreezer); then opt is nil
	cursor     []byte            // the loader state after the step: a Loader's dataloader.Cursor.MarshalBinary, or a StatefulLoader's State
	recoveries []int64
	user       []byte // Stateful.AppendState, if the user registered one

	// Version 3 (zero when a version 1 or 2 snapshot is decoded):
	seq       uint64 // commits taken in the job's history up to this one (agreement key: several commits may share a step)
	epoch     int64  // the epoch and step within it where the data continues (RoundInfo.Epoch, EpochStep)
	epochStep int64
	parts     []partManifests // durable checkpoints of jobs with partitions: every rank's manifest of each partition

	// Version 4 (named sections after the version 3 fields; written only
	// when one is not empty, else the encoding is version 3):
	autoscale []byte // the resource adjustment policy's state (section "autoscale")
	detExp    []byte // deterministic mode's gradient exponent after the step (section "detscale", encodeDetExp)
}

// partManifests is one partition's part of a durable checkpoint: the
// manifest each rank's Checkpoint returned, in the rank order of the round
// that wrote it.
type partManifests struct {
	name      string
	manifests [][]byte
}

// Snapshot encodings: version 4 appends named sections (a count, then a
// name and bytes each; a reader skips names it does not know) and is
// written only when a section has content, so a job without them writes
// version 3; version 3 appends the commit number, the data
// position and the partitions' manifests after the user state; version 2
// added the lineage base after gen; versions 1 (no base, so base 0) and 2
// still decode, so older checkpoints load.
const (
	snapshotMagicV4 = "ETSNAP04"
	snapshotMagic   = "ETSNAP03"
	snapshotMagicV2 = "ETSNAP02"
	snapshotMagicV1 = "ETSNAP01"
)

// maxPartitionRanks bounds the ranks of one partition's manifests in a
// decoded snapshot (the world size bound of package sync).
const maxPartitionRanks = 1 << 16

// sectionAutoscale names the policy state's section of a version 4 snapshot.
const sectionAutoscale = "autoscale"

// sectionDetExp names deterministic mode's gradient exponent's section.
const sectionDetExp = "detscale"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// take copies the live state into s, reusing s's buffers.
func (s *snapshot) take(step int64, gen uint64, base int64, params []Param, opt optim.Optimizer, cursor []byte, recoveries []int64, user []byte) {
	s.step, s.gen, s.base = step, gen, base
	if len(s.values) != len(params) {
		s.values = make([][]float32, len(params))
	}
	for i, p := range params {
		if len(s.values[i]) != len(p.Value) {
			s.values[i] = make([]float32, len(p.Value))
		}
		copy(s.values[i], p.Value)
	}
	s.optName = opt.Name()
	if f, ok := opt.(optim.StateFreezer); ok {
		// Held as it is, not encoded: the optimizer writes its next state
		// elsewhere (the largest part of a commit otherwise).
		s.optFrozen, s.opt = f.FreezeState(s.optFrozen), nil
	} else {
		s.optFrozen, s.opt = nil, opt.AppendState(s.opt[:0])
	}
	s.cursor = append(s.cursor[:0], cursor...)
	s.recoveries = append(s.recoveries[:0], recoveries...)
	s.user = append(s.user[:0], user...)
}

// optState returns the optimizer's state in Optimizer.AppendState's
// encoding (a new slice when the snapshot holds it frozen).
func (s *snapshot) optState() []byte {
	if s.optFrozen != nil {
		return s.optFrozen.AppendState(nil)
	}
	return s.opt
}

// clone returns a deep copy.
func (s *snapshot) clone() *snapshot {
	c := &snapshot{step: s.step, gen: s.gen, base: s.base, optName: s.optName, seq: s.seq, epoch: s.epoch, epochStep: s.epochStep,
		autoscale: slices.Clone(s.autoscale), detExp: slices.Clone(s.detExp)}
	for _, p := range s.parts {
		m := make([][]byte, len(p.manifests))
		for i, b := range p.manifests {
			m[i] = slices.Clone(b)
		}
		c.parts = append(c.parts, partManifests{name: p.name, manifests: m})
	}
	c.values = make([][]float32, len(s.values))
	for i, v := range s.values {
		c.values[i] = slices.Clone(v)
	}
	c.opt = slices.Clone(s.optState())
	c.cursor = slices.Clone(s.cursor)
	c.recoveries = slices.Clone(s.recoveries)
	c.user = slices.Clone(s.user)
	return c
}

// restoreInto writes the snapshot's values into the live parameters and the
// optimizer; shapes must match.
func (s *snapshot) restoreInto(params []Param, opt optim.Optimizer) error {
	if len(s.values) != len(params) {
		return fmt.Errorf("%w: snapshot has %d tensors, model has %d", ErrShapeMismatch, len(s.values), len(params))
	}
	for i, p := range params {
		if len(s.values[i]) != len(p.Value) {
			return fmt.Errorf("%w: %q has %d values in the snapshot, %d in the model", ErrShapeMismatch, p.Name, len(s.values[i]), len(p.Value))
		}
	}
	if s.optName != opt.Name() {
		return fmt.Errorf("%w: snapshot optimizer %q, configured %q", ErrShapeMismatch, s.optName, opt.Name())
	}
	if err := opt.LoadState(s.optState(), params); err != nil {
		return err
	}
	for i, p := range params {
		copy(p.Value, s.values[i])
	}
	return nil
}

// encode appends the snapshot's wire and disk form to dst: magic, step,
// lineage (gen, base), parameters with names and shapes, optimizer, loader
// state, recoveries, user state, commit number, data position (epoch,
// step within it), every partition's manifests (name, then one per rank),
// then a CRC-32C of all of it.
func (s *snapshot) encode(dst []byte, params []Param) []byte {
	start := len(dst)
	if len(s.autoscale) > 0 || len(s.detExp) > 0 {
		dst = append(dst, snapshotMagicV4...)
	} else {
		dst = append(dst, snapshotMagic...)
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.step))
	dst = binary.LittleEndian.AppendUint64(dst, s.gen)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.base))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(params)))
	for i, p := range params {
		dst = enc.AppendString(dst, p.Name)
		dst = append(dst, uint8(len(p.Shape)))
		for _, d := range p.Shape {
			dst = binary.LittleEndian.AppendUint64(dst, uint64(d))
		}
		dst = enc.AppendFloats(dst, s.values[i])
	}
	dst = enc.AppendString(dst, s.optName)
	if s.optFrozen != nil {
		at := len(dst)
		dst = binary.LittleEndian.AppendUint64(dst, 0)
		dst = s.optFrozen.AppendState(dst)
		binary.LittleEndian.PutUint64(dst[at:], uint64(len(dst)-at-8))
	} else {
		dst = enc.AppendBytes(dst, s.opt)
	}
	dst = enc.AppendBytes(dst, s.cursor)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s.recoveries)))
	for _, r := range s.recoveries {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r))
	}
	dst = enc.AppendBytes(dst, s.user)
	dst = binary.LittleEndian.AppendUint64(dst, s.seq)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.epoch))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(s.epochStep))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s.parts)))
	for _, p := range s.parts {
		dst = enc.AppendString(dst, p.name)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p.manifests)))
		for _, m := range p.manifests {
			dst = enc.AppendBytes(dst, m)
		}
	}
	if n := sections(s.autoscale, s.detExp); n > 0 {
		dst = binary.LittleEndian.AppendUint32(dst, n)
		if len(s.autoscale) > 0 {
			dst = enc.AppendString(dst, sectionAutoscale)
			dst = enc.AppendBytes(dst, s.autoscale)
		}
		if len(s.detExp) > 0 {
			dst = enc.AppendString(dst, sectionDetExp)
			dst = enc.AppendBytes(dst, s.detExp)
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// sections counts the non-empty sections.
func sections(bs ...[]byte) uint32 {
	n := uint32(0)
	for _, b := range bs {
		if len(b) > 0 {
			n++
		}
	}
	return n
}

// owned copies a decoded field out of its input, so a snapshot never keeps
// the whole input alive: a received state broadcast or a read checkpoint is
// several times the part a field is, and a snapshot lives on (and its
// buffers are reused by later commits) long after. An empty field stays
// empty but not nil, and points into nothing.
func owned(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) == 0 {
		return []byte{}
	}
	return slices.Clone(b)
}

// snapshotBody checks an encoded snapshot's length, checksum and magic
// (any version) and returns its body (without the checksum) and magic.
func snapshotBody(b []byte) (body []byte, magic string, err error) {
	if len(b) < len(snapshotMagic)+4 {
		return nil, "", fmt.Errorf("%w: %d bytes is too short", ErrCorruptState, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if got := crc32.Checksum(body, castagnoli); got != sum {
		return nil, "", fmt.Errorf("%w: checksum %08x, want %08x", ErrCorruptState, got, sum)
	}
	magic = string(body[:len(snapshotMagic)])
	if magic != snapshotMagicV4 && magic != snapshotMagic && magic != snapshotMagicV2 && magic != snapshotMagicV1 {
		return nil, "", fmt.Errorf("%w: bad magic %q", ErrCorruptState, magic)
	}
	return body, magic, nil
}

// decodeSnapshot parses b, checking it against the model's parameters. It
// never panics; any problem is ErrCorruptState or ErrShapeMismatch. The
// snapshot shares no memory with b.
func decodeSnapshot(b []byte, params []Param) (*snapshot, error) {
	body, magic, err := snapshotBody(b)
	if err != nil {
		return nil, err
	}
	r := enc.Reader{B: body, Off: len(snapshotMagic)}
	s := &snapshot{step: int64(r.U64()), gen: r.U64()}
	if magic != snapshotMagicV1 {
		s.base = int64(r.U64())
	}
	n := int(r.U32())
	if r.Err == nil && n != len(params) {
		return nil, fmt.Errorf("%w: snapshot has %d tensors, model has %d", ErrShapeMismatch, n, len(params))
	}
	s.values = make([][]float32, len(params))
	for i, p := range params {
		name := r.Str()
		nd := int(r.U8())
		shape := make([]int, 0, nd)
		for range nd {
			shape = append(shape, int(r.U64()))
		}
		if r.Err != nil {
			break
		}
		if name != p.Name || !slices.Equal(shape, p.Shape) {
			return nil, fmt.Errorf("%w: tensor %d is %q%v in the snapshot, %q%v in the model", ErrShapeMismatch, i, name, shape, p.Name, p.Shape)
		}
		s.values[i] = make([]float32, len(p.Value))
		r.FloatsInto(s.values[i])
	}
	s.optName = r.Str()
	s.opt = owned(r.Bytes())
	s.cursor = owned(r.Bytes())
	nr := int(r.U32())
	if r.Err == nil && nr > (len(body)-r.Off)/8 {
		r.Fail("recovery count exceeds input")
	}
	for range nr {
		if r.Err != nil {
			break
		}
		s.recoveries = append(s.recoveries, int64(r.U64()))
	}
	s.user = owned(r.Bytes())
	if magic == snapshotMagic || magic == snapshotMagicV4 {
		s.seq = r.U64()
		s.epoch, s.epochStep = int64(r.U64()), int64(r.U64())
		np := int(r.U32())
		if r.Err == nil && np > (len(body)-r.Off)/8 {
			r.Fail("partition count exceeds input")
		}
		for range np {
			if r.Err != nil {
				break
			}
			p := partManifests{name: r.Str()}
			nm := int(r.U32())
			if r.Err == nil && (nm > maxPartitionRanks || nm > (len(body)-r.Off)/8) {
				r.Fail("manifest count exceeds input")
			}
			for range nm {
				if r.Err != nil {
					break
				}
				p.manifests = append(p.manifests, owned(r.Bytes()))
			}
			s.parts = append(s.parts, p)
		}
	} else {
		s.seq = uint64(s.step) // older histories committed at most once per step
	}
	if magic == snapshotMagicV4 {
		ns := int(r.U32())
		if r.Err == nil && ns > (len(body)-r.Off)/12 {
			r.Fail("section count exceeds input")
		}
		for range ns {
			if r.Err != nil {
				break
			}
			name, data := r.Str(), r.Bytes()
			switch name {
			case sectionAutoscale:
				s.autoscale = owned(data)
			case sectionDetExp:
				s.detExp = owned(data)
			}
		}
	}
	if err := r.Done(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptState, err)
	}
	if s.step < 0 || s.base < 0 || s.base > s.step || s.epoch < 0 || s.epochStep < 0 {
		return nil, fmt.Errorf("%w: step %d with lineage base %d, data position %d/%d", ErrCorruptState, s.step, s.base, s.epoch, s.epochStep)
	}
	return s, nil
}
