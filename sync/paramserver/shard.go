package paramserver

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"math"
	"unsafe"
)

// psTableData is one table's part of a shard: n rows of dim values and
// sdim optimizer state values each, by local index (row / shards).
type psTableData struct {
	n         int64
	dim, sdim int
	val       []float32 // n*dim
	st        []float32 // n*sdim
}

// psShardData is shard `shard` of `shards`: every table's rows with
// r % shards == shard, at step (the sync step or commit step).
type psShardData struct {
	step   int64
	shards int
	shard  int
	tables []psTableData
}

// newShardData allocates shard s of shards for specs, rows zeroed.
func newShardData(specs []TableSpec, s, shards int) *psShardData {
	d := &psShardData{shards: shards, shard: s, tables: make([]psTableData, len(specs))}
	for i := range specs {
		sp := &specs[i]
		n := ShardRows(sp.Rows, s, shards)
		sd := sp.Optimizer.StateDim(sp.Dim)
		d.tables[i] = psTableData{n: n, dim: sp.Dim, sdim: sd, val: make([]float32, n*int64(sp.Dim)), st: make([]float32, n*int64(sd))}
	}
	return d
}

// clone returns a deep copy.
func (d *psShardData) clone() *psShardData {
	c := &psShardData{step: d.step, shards: d.shards, shard: d.shard, tables: make([]psTableData, len(d.tables))}
	for i, t := range d.tables {
		c.tables[i] = t
		c.tables[i].val = append([]float32(nil), t.val...)
		c.tables[i].st = append([]float32(nil), t.st...)
	}
	return c
}

// splitmix64 is one step of SplitMix64 (Steele, Lea & Flood, OOPSLA 2014).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func psNameHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// psInitRow writes the initial values and optimizer state of row into val
// (dim values) and st (state values): a pure function of the spec and row.
func psInitRow(sp *TableSpec, nameHash uint64, row int64, val, st []float32) {
	if sp.InitScale == 0 {
		clear(val)
	} else {
		base := splitmix64(sp.Seed^nameHash) ^ uint64(row)*0xd1b54a32d192ed03
		for k := range val {
			x := splitmix64(base + uint64(k))
			u := float32(x>>40) / (1 << 24) // [0, 1)
			val[k] = sp.InitScale * (2*u - 1)
		}
	}
	switch sp.Optimizer.Kind {
	case SparseAdagrad:
		a := float32(sp.Optimizer.InitialAccumulator)
		for k := range st {
			st[k] = a
		}
	default:
		clear(st)
	}
}

// initShardData fills d (shard d.shard of d.shards) with the initial rows.
func initShardData(specs []TableSpec, d *psShardData) {
	for i := range specs {
		sp := &specs[i]
		t := &d.tables[i]
		h := psNameHash(sp.Name)
		for l := int64(0); l < t.n; l++ {
			row := l*int64(d.shards) + int64(d.shard)
			psInitRow(sp, h, row, t.val[l*int64(t.dim):(l+1)*int64(t.dim)], t.st[l*int64(t.sdim):(l+1)*int64(t.sdim)])
		}
	}
}

// psApply applies one optimizer step with gradient g to the row values w
// and its state st.
func psApply(o *SparseOptimizer, w, st, g []float32) {
	switch o.Kind {
	case SparseSGD:
		lr := float32(o.LR)
		for k, gk := range g {
			w[k] -= lr * gk
		}
	case SparseAdagrad:
		// float32 throughout: the compiler turns the square root into one
		// single-precision instruction.
		lr, eps := float32(o.LR), float32(o.Eps)
		st = st[:len(g)]
		w = w[:len(g)]
		for k, gk := range g {
			a := st[k] + gk*gk
			st[k] = a
			w[k] -= lr * gk / (float32(math.Sqrt(float64(a))) + eps)
		}
	case SparseAdam:
		lr := o.LR
		d := len(g)
		t := float64(st[2*d]) + 1
		st[2*d] = float32(t)
		b1, b2 := o.Beta1, o.Beta2
		c1, c2 := 1-math.Pow(b1, t), 1-math.Pow(b2, t)
		for k, gk := range g {
			gf := float64(gk)
			m := b1*float64(st[k]) + (1-b1)*gf
			v := b2*float64(st[d+k]) + (1-b2)*gf*gf
			st[k], st[d+k] = float32(m), float32(v)
			w[k] = float32(float64(w[k]) - lr*(m/c1)/(math.Sqrt(v/c2)+o.Eps))
		}
	}
}

// f32AsBytes views v as its little-endian bytes (the host is little-endian;
// Listen refuses others).
func f32AsBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// bytesAsF32 views b (len a multiple of 4) as float32 values when it is
// 4-byte aligned, else returns a copy.
func bytesAsF32(b []byte) []float32 {
	n := len(b) / 4
	if n == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
	}
	v := make([]float32, n)
	copy(f32AsBytes(v), b)
	return v
}

// Shard encoding, version 1, little-endian:
//
//	"ETPS" magic, u16 version, i64 step, u32 shards, u32 shard, u32 tables,
//	per table: u16 name length, name, i64 rows, u32 dim, u8 optimizer kind,
//	u32 state dim, u64 n (rows held), n*dim f32 values, n*sdim f32 state;
//	u32 CRC-32C of everything before it.
const psMagic = "ETPS"

const psVersion = 1

var psCRC = crc32.MakeTable(crc32.Castagnoli)

// encodeShard appends the encoding of d (with the specs' names and sizes)
// to dst.
func encodeShard(dst []byte, specs []TableSpec, d *psShardData) []byte {
	start := len(dst)
	dst = append(dst, psMagic...)
	dst = binary.LittleEndian.AppendUint16(dst, psVersion)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(d.step))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(d.shards))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(d.shard))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(d.tables)))
	for i, t := range d.tables {
		sp := &specs[i]
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(sp.Name)))
		dst = append(dst, sp.Name...)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(sp.Rows))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t.dim))
		dst = append(dst, byte(sp.Optimizer.Kind))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t.sdim))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(t.n))
		dst = append(dst, f32AsBytes(t.val)...)
		dst = append(dst, f32AsBytes(t.st)...)
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], psCRC))
}

// ShardInfo describes encoded shard bytes (see DecodeShardInfo).
type ShardInfo struct {
	Step   int64 // the committed step
	Shards int   // the shard count of the layout
	Shard  int   // this shard's index
	Tables []struct {
		Name string
		Rows int64 // rows of the whole table
		Held int64 // rows held by this shard
		Dim  int
	}
}

// DecodeShardInfo checks encoded shard bytes (as a ShardStore holds them:
// versioned, CRC-32C checksummed) and describes them. Errors wrap
// ErrCorruptShard.
func DecodeShardInfo(b []byte) (ShardInfo, error) {
	var info ShardInfo
	d, names, err := decodeShardRaw(b)
	if err != nil {
		return info, err
	}
	info.Step, info.Shards, info.Shard = d.step, d.shards, d.shard
	for i, t := range d.tables {
		info.Tables = append(info.Tables, struct {
			Name string
			Rows int64
			Held int64
			Dim  int
		}{names[i].name, names[i].rows, t.n, t.dim})
	}
	return info, nil
}

type psDecodedName struct {
	name string
	rows int64
	kind SparseKind
}

// decodeShard decodes b and checks it against specs. Errors wrap
// ErrCorruptShard.
func decodeShard(b []byte, specs []TableSpec) (*psShardData, error) {
	d, names, err := decodeShardRaw(b)
	if err != nil {
		return nil, err
	}
	if len(d.tables) != len(specs) {
		return nil, fmt.Errorf("%w: %d tables, this parameter server has %d", ErrCorruptShard, len(d.tables), len(specs))
	}
	for i, sp := range specs {
		t, nm := d.tables[i], names[i]
		if nm.name != sp.Name || nm.rows != sp.Rows || t.dim != sp.Dim || nm.kind != sp.Optimizer.Kind || t.sdim != sp.Optimizer.StateDim(sp.Dim) {
			return nil, fmt.Errorf("%w: table %d is %q (%d rows x %d, %v), want %q (%d rows x %d, %v)", ErrCorruptShard,
				i, nm.name, nm.rows, t.dim, nm.kind, sp.Name, sp.Rows, sp.Dim, sp.Optimizer.Kind)
		}
	}
	return d, nil
}

func decodeShardRaw(b []byte) (*psShardData, []psDecodedName, error) {
	bad := func(format string, a ...any) (*psShardData, []psDecodedName, error) {
		return nil, nil, fmt.Errorf("%w: "+format, append([]any{ErrCorruptShard}, a...)...)
	}
	const fixed = 4 + 2 + 8 + 4 + 4 + 4
	if len(b) < fixed+4 {
		return bad("%d bytes", len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if string(b[:4]) != psMagic {
		return bad("bad magic %q", b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != psVersion {
		return bad("version %d, want %d", v, psVersion)
	}
	if crc32.Checksum(body, psCRC) != sum {
		return bad("checksum mismatch")
	}
	d := &psShardData{
		step:   int64(binary.LittleEndian.Uint64(b[6:])),
		shards: int(binary.LittleEndian.Uint32(b[14:])),
		shard:  int(binary.LittleEndian.Uint32(b[18:])),
	}
	nt := int(binary.LittleEndian.Uint32(b[22:]))
	if d.shards < 1 || d.shards > 1<<16 || d.shard < 0 || d.shard >= d.shards {
		return bad("shard %d of %d", d.shard, d.shards)
	}
	if nt < 1 || nt > 1<<16 {
		return bad("%d tables", nt)
	}
	p := body[fixed:]
	names := make([]psDecodedName, 0, min(nt, 64))
	for i := 0; i < nt; i++ {
		if len(p) < 2 {
			return bad("table %d truncated", i)
		}
		ln := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if len(p) < ln+8+4+1+4+8 {
			return bad("table %d truncated", i)
		}
		nm := psDecodedName{name: string(p[:ln])}
		p = p[ln:]
		nm.rows = int64(binary.LittleEndian.Uint64(p))
		dim := int(binary.LittleEndian.Uint32(p[8:]))
		nm.kind = SparseKind(p[12])
		sdim := int(binary.LittleEndian.Uint32(p[13:]))
		n := int64(binary.LittleEndian.Uint64(p[17:]))
		p = p[25:]
		if nm.rows <= 0 || nm.rows > 1<<40 || dim < 1 || dim > 1<<16 || sdim < 0 || sdim > 2*(1<<16)+1 {
			return bad("table %d: %d rows, dim %d, state %d", i, nm.rows, dim, sdim)
		}
		if n != ShardRows(nm.rows, d.shard, d.shards) {
			return bad("table %d holds %d rows, shard %d of %d of %d rows holds %d", i, n, d.shard, d.shards, nm.rows, ShardRows(nm.rows, d.shard, d.shards))
		}
		need := uint64(n) * uint64(dim+sdim) * 4
		if need > uint64(len(p)) {
			return bad("table %d: %d bytes of rows, %d left", i, need, len(p))
		}
		t := psTableData{n: n, dim: dim, sdim: sdim, val: make([]float32, n*int64(dim)), st: make([]float32, n*int64(sdim))}
		nb := copy(f32AsBytes(t.val), p)
		p = p[nb:]
		nb = copy(f32AsBytes(t.st), p)
		p = p[nb:]
		d.tables = append(d.tables, t)
		names = append(names, nm)
	}
	if len(p) != 0 {
		return bad("%d trailing bytes", len(p))
	}
	return d, names, nil
}
