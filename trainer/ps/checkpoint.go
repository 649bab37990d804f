package ps

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	stdsync "sync"
	"time"

	"github.com/elastictrain/elastictrain/internal/atomicfile"
	"github.com/elastictrain/elastictrain/sync/paramserver"
)

// manifestFormat names version 1 of the manifest, which names files in
// Config.Dir, and inlineFormat version 2, which holds the shards (see the
// package doc).
const (
	manifestFormat = "elastictrain-ps/1"
	inlineFormat   = "elastictrain-ps/2"
)

// inlineMagic begins a version 2 manifest: then the shards' bytes in the
// order of its Files, its JSON header, and the little-endian uint32 length
// of that header (last, so the shards are encoded in place).
const inlineMagic = "ETPSCKP2"

// maxManifestBytes bounds the JSON of one rank's manifest read from a
// checkpoint (a version 2 manifest's shard bytes come after it).
const maxManifestBytes = 16 << 20

type manifest struct {
	Format string         `json:"format"`
	Name   string         `json:"name"`
	Step   int64          `json:"step"`
	PSStep int64          `json:"ps_step"`
	Shards int            `json:"shards"`
	Tables string         `json:"tables"`
	Files  []manifestFile `json:"files"`
}

type manifestFile struct {
	Shard  int    `json:"shard"`
	Path   string `json:"path,omitempty"` // version 1: relative to Config.Dir
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // version 1
	CRC32C uint32 `json:"crc32c,omitempty"` // version 2: the shard encoding's own checksum, its last 4 bytes
}

// fileRef is a checkpoint's shard: a file and its expected content
// (version 1), or the bytes a version 2 manifest holds (data non-nil).
type fileRef struct {
	path string
	sum  atomicfile.Sum
	data []byte
}

// Checkpoint implements driver.Partition: it makes this rank's share of
// the shards of the committed step durable apart from the commit files
// (which later commits prune) and returns the manifest that names them.
//
// This rank's share of a layout of n shards is the shards j with
// j % size == rank in the current round (whichever rank wrote them at the
// commit: they are all in Dir once any rank's Commit returned), so the
// manifests of every rank name every shard once. Each is hard-linked (or
// copied) into a new directory ckpt-<step>-<random>/, fsynced, read back
// and checked to decode as shard j of n at the shards' step of step.
//
// Rank 0 then removes the checkpoint directories that no restore can name
// any more: those older than the newest published checkpoint, except the
// ones the trainer's store still lists (see Config.Checkpoints).
//
// Errors: a step this partition did not commit or restore, a missing or
// damaged commit file, I/O errors. Nothing published is touched on error.
func (p *Partition) Checkpoint(ctx context.Context, step int64) ([]byte, error) {
	if p.pending >= 0 { // this round's previous checkpoint: published, or the round would have failed
		p.published = max(p.published, p.pending)
	}
	var rec *commitRec
	for i := range p.commits {
		if p.commits[i].step == step {
			rec = &p.commits[i]
		}
	}
	if rec == nil {
		return nil, fmt.Errorf("ps: checkpoint of step %d, which this partition did not commit", step)
	}
	start := time.Now()
	defer func() { p.ckptTime += time.Since(start).Seconds() }()
	if p.store == nil {
		return p.checkpointInline(ctx, step, rec)
	}
	n := rec.shards
	if n == 0 {
		var err error
		if n, err = p.storedLayout(ctx, rec.ps); err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
		}
		rec.shards = n
	}
	m := manifest{Format: manifestFormat, Name: p.cfg.Name, Step: step, PSStep: rec.ps, Shards: n, Tables: p.tablesHash, Files: []manifestFile{}}
	var dir string
	for j := p.rank; j < n; j += max(p.size, 1) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if dir == "" {
			dir = filepath.Join(p.cfg.Dir, fmt.Sprintf("%s%020d-%s", ckptDirPrefix, step, randomSuffix()))
			if err := atomicfile.MkdirAll(dir); err != nil {
				return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
			}
		}
		key := paramserver.ShardKey{Step: rec.ps, Shards: n, Shard: j}
		dst := filepath.Join(dir, fmt.Sprintf("shard-%05d-of-%05d.bin", j, n))
		if err := atomicfile.Link(p.store.Path(key), dst); err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: shard %d of %d: %w", step, j, n, err)
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
		}
		if err := checkShard(b, key); err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: %s: %w", step, dst, err)
		}
		sum := atomicfile.SumOf(b)
		rel, err := filepath.Rel(p.cfg.Dir, dst)
		if err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
		}
		m.Files = append(m.Files, manifestFile{Shard: j, Path: filepath.ToSlash(rel), Size: sum.Size, SHA256: sum.Hex()})
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
	}
	if p.rank == 0 {
		p.pruneCheckpoints(ctx, step)
	}
	p.pending = step
	return out, nil
}

// checkpointInline returns the version 2 manifest of this rank's share of
// the commit rec (see Checkpoint): the shards this rank hosts in the
// current round, encoded from the commit in its memory. The commit must be
// this round's (the trainer checkpoints only a commit of the round it
// runs, or the restored one, which Restore commits in the round's layout).
func (p *Partition) checkpointInline(ctx context.Context, step int64, rec *commitRec) ([]byte, error) {
	if p.round == nil || rec.round != p.round.Round() || rec.shards != p.round.Shards() {
		return nil, fmt.Errorf("ps: checkpoint of step %d: committed in round %d with %d shards, not in the current round", step, rec.round, rec.shards)
	}
	n := rec.shards
	m := manifest{Format: inlineFormat, Name: p.cfg.Name, Step: step, PSStep: rec.ps, Shards: n, Tables: p.tablesHash, Files: []manifestFile{}}
	data := []byte(inlineMagic)
	for j := range n {
		if p.round.HostOf(j) != p.rank {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		at := len(data)
		var err error
		if data, err = p.ps.AppendCommitted(data, paramserver.ShardKey{Step: rec.ps, Shards: n, Shard: j}); err != nil {
			return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
		}
		part := data[at:]
		m.Files = append(m.Files, manifestFile{Shard: j, Size: int64(len(part)), CRC32C: binary.LittleEndian.Uint32(part[len(part)-4:])})
	}
	hdr, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("ps: checkpoint of step %d: %w", step, err)
	}
	data = append(data, hdr...)
	return binary.LittleEndian.AppendUint32(data, uint32(len(hdr))), nil
}

// checkShard checks that encoded shard bytes are the shard key names.
func checkShard(b []byte, key paramserver.ShardKey) error {
	info, err := paramserver.DecodeShardInfo(b)
	if err != nil {
		return err
	}
	if info.Step != key.Step || info.Shards != key.Shards || info.Shard != key.Shard {
		return fmt.Errorf("%w: holds shard %d of %d at step %d, want %d of %d at step %d", paramserver.ErrCorruptShard,
			info.Shard, info.Shards, info.Step, key.Shard, key.Shards, key.Step)
	}
	return nil
}

// storedLayout returns the shard count of a complete layout of psStep in
// Dir (the smallest when there are several).
func (p *Partition) storedLayout(ctx context.Context, psStep int64) (int, error) {
	keys, err := p.store.ListShards(ctx, psStep)
	if err != nil {
		return 0, err
	}
	have := map[int]map[int]bool{}
	for _, k := range keys {
		if have[k.Shards] == nil {
			have[k.Shards] = map[int]bool{}
		}
		have[k.Shards][k.Shard] = true
	}
	best := 0
	for n, s := range have {
		if len(s) == n && (best == 0 || n < best) {
			best = n
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("%w: no complete layout of the shards' step %d in %s", paramserver.ErrRowsLost, psStep, p.cfg.Dir)
	}
	return best, nil
}

// pruneCheckpoints removes the checkpoint directories that no restore can
// name any more: those of steps older than the newest published
// checkpoint (PartitionRound.Published, or the step of this round's
// previous Checkpoint call, which the trainer published before calling
// again), except, with Config.Checkpoints, those of every checkpoint the
// trainer's store still lists (a restart falls back to an older one when
// the newest does not load). Failures are logged; they only leave files
// behind.
func (p *Partition) pruneCheckpoints(ctx context.Context, step int64) {
	newest, listed := p.published, map[int64]bool{}
	if p.cfg.Checkpoints != nil {
		steps, err := p.cfg.Checkpoints.List(ctx)
		if err != nil {
			p.log.Warn("cannot list checkpoints; keeping every checkpoint's shards", "err", err)
			return
		}
		for _, s := range steps {
			listed[s] = true
			if s <= step && s > newest {
				newest = s
			}
		}
	}
	if newest < 0 {
		return
	}
	dirs, err := p.listCkptDirs()
	if err != nil {
		p.log.Warn("cannot list checkpoint directories", "err", err)
		return
	}
	for d, s := range dirs {
		if s < newest && !listed[s] {
			if err := atomicfile.RemoveAll(d); err != nil {
				p.log.Warn("cannot remove an old checkpoint's shards", "dir", d, "err", err)
			}
		}
	}
}

// restoreSet is what the manifests of a checkpoint name.
type restoreSet struct {
	psStep int64
	shards int
	files  map[int]fileRef
}

// parseManifests checks every rank's manifest of the checkpoint of step
// and that every shard of its layout is named once by a file of the size
// it names. The files' contents are verified when they are loaded.
func (p *Partition) parseManifests(step int64, manifests [][]byte) (restoreSet, error) {
	set := restoreSet{psStep: -1, files: map[int]fileRef{}}
	if len(manifests) == 0 {
		return set, fmt.Errorf("ps: the checkpoint of step %d holds no shards of partition %q (written by a job without it?)", step, p.cfg.Name)
	}
	inline := false
	for i, b := range manifests {
		var data []byte
		if rest, ok := bytes.CutPrefix(b, []byte(inlineMagic)); ok {
			if len(rest) < 4 || uint64(binary.LittleEndian.Uint32(rest[len(rest)-4:])) > uint64(len(rest)-4) {
				return set, fmt.Errorf("ps: manifest %d of the checkpoint of step %d is truncated", i, step)
			}
			at := len(rest) - 4 - int(binary.LittleEndian.Uint32(rest[len(rest)-4:]))
			b, data = rest[at:len(rest)-4], rest[:at:at]
		}
		if len(b) > maxManifestBytes {
			return set, fmt.Errorf("ps: manifest %d of the checkpoint of step %d is %d bytes", i, step, len(b))
		}
		var m manifest
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			return set, fmt.Errorf("ps: manifest %d of the checkpoint of step %d: %w", i, step, err)
		}
		switch {
		case m.Format != manifestFormat && m.Format != inlineFormat:
			return set, fmt.Errorf("ps: manifest %d has format %q, want %q or %q", i, m.Format, manifestFormat, inlineFormat)
		case (m.Format == inlineFormat) != (data != nil):
			return set, fmt.Errorf("ps: manifest %d of format %q is framed as the other format", i, m.Format)
		case i > 0 && (m.Format == inlineFormat) != inline:
			return set, fmt.Errorf("ps: the manifests of the checkpoint of step %d mix formats", step)
		case m.Format == manifestFormat && p.store == nil:
			return set, fmt.Errorf("ps: the checkpoint of step %d names shard files in Config.Dir (format %q), and this partition has no Dir", step, m.Format)
		case m.Name != p.cfg.Name:
			return set, fmt.Errorf("ps: manifest %d is partition %q's, this is %q", i, m.Name, p.cfg.Name)
		case m.Tables != p.tablesHash:
			return set, fmt.Errorf("ps: manifest %d holds other tables (hash %s, this partition's %s)", i, m.Tables, p.tablesHash)
		case m.Step != step:
			return set, fmt.Errorf("ps: manifest %d is of step %d, the checkpoint of step %d", i, m.Step, step)
		case m.Shards < 1 || m.Shards > 1<<16 || m.PSStep < 0:
			return set, fmt.Errorf("ps: manifest %d: %d shards at step %d", i, m.Shards, m.PSStep)
		case set.psStep >= 0 && (m.PSStep != set.psStep || m.Shards != set.shards):
			return set, fmt.Errorf("ps: manifests disagree: %d shards at step %d and %d at step %d", set.shards, set.psStep, m.Shards, m.PSStep)
		}
		set.psStep, set.shards, inline = m.PSStep, m.Shards, m.Format == inlineFormat
		for _, f := range m.Files {
			if f.Shard < 0 || f.Shard >= m.Shards {
				return set, fmt.Errorf("ps: manifest %d names shard %d of %d", i, f.Shard, m.Shards)
			}
			if _, dup := set.files[f.Shard]; dup {
				return set, fmt.Errorf("ps: shard %d is named twice in the checkpoint of step %d", f.Shard, step)
			}
			if inline {
				if f.Size < 8 || f.Size > int64(len(data)) {
					return set, fmt.Errorf("%w: manifest %d: shard %d of %d bytes, %d bytes left", paramserver.ErrCorruptShard, i, f.Shard, f.Size, len(data))
				}
				part := data[:f.Size:f.Size]
				data = data[f.Size:]
				if got := binary.LittleEndian.Uint32(part[len(part)-4:]); got != f.CRC32C {
					return set, fmt.Errorf("%w: manifest %d: shard %d has CRC-32C %08x, its manifest says %08x", paramserver.ErrCorruptShard, i, f.Shard, got, f.CRC32C)
				}
				set.files[f.Shard] = fileRef{data: part}
				continue
			}
			if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
				return set, fmt.Errorf("ps: manifest %d names %q, not a path inside the shard directory", i, f.Path)
			}
			sum, err := atomicfile.ParseSum(f.Size, f.SHA256)
			if err != nil {
				return set, fmt.Errorf("ps: manifest %d, shard %d: %w", i, f.Shard, err)
			}
			set.files[f.Shard] = fileRef{path: filepath.Join(p.cfg.Dir, filepath.FromSlash(f.Path)), sum: sum}
		}
		if len(data) > 0 {
			return set, fmt.Errorf("%w: manifest %d: %d bytes after its shards", paramserver.ErrCorruptShard, i, len(data))
		}
	}
	for j := range set.shards {
		f, ok := set.files[j]
		if !ok {
			return set, fmt.Errorf("ps: the checkpoint of step %d names no file for shard %d of %d", step, j, set.shards)
		}
		if f.data != nil {
			continue
		}
		st, err := os.Stat(f.path)
		if err != nil {
			return set, fmt.Errorf("ps: the checkpoint of step %d: %w", step, err)
		}
		if st.Size() != f.sum.Size {
			return set, fmt.Errorf("%w: %s is %d bytes, its manifest says %d", atomicfile.ErrMismatch, f.path, st.Size(), f.sum.Size)
		}
	}
	return set, nil
}

// viewStore is the parameter server's ShardStore with Dir (dir), and its
// restore source (paramserver.SetRestoreSource) without: during a restore
// from a checkpoint it serves the checkpoint's shards (the files its
// manifests name, each verified against its size and SHA-256, or the
// shards a version 2 manifest holds, each verified by its CRC-32C) in
// place of Dir's commits of that step; without Dir it serves nothing else.
type viewStore struct {
	dir    *paramserver.DirShardStore // nil: no Dir
	mu     stdsync.Mutex
	step   int64
	shards int
	files  map[int]fileRef // nil: no view
}

func (v *viewStore) set(step int64, shards int, files map[int]fileRef) {
	v.mu.Lock()
	v.step, v.shards, v.files = step, shards, files
	v.mu.Unlock()
}

func (v *viewStore) viewed(step int64) (map[int]fileRef, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.files == nil || step != v.step {
		return nil, 0
	}
	return v.files, v.shards
}

// SaveShard implements paramserver.ShardStore: into Dir.
func (v *viewStore) SaveShard(ctx context.Context, key paramserver.ShardKey, data []byte) error {
	if v.dir == nil {
		return fmt.Errorf("ps: a checkpoint being restored is read-only")
	}
	return v.dir.SaveShard(ctx, key, data)
}

// ListShards implements paramserver.ShardStore.
func (v *viewStore) ListShards(ctx context.Context, step int64) ([]paramserver.ShardKey, error) {
	files, n := v.viewed(step)
	if files == nil {
		if v.dir == nil {
			return nil, nil
		}
		return v.dir.ListShards(ctx, step)
	}
	keys := make([]paramserver.ShardKey, 0, n)
	for j := range n {
		keys = append(keys, paramserver.ShardKey{Step: step, Shards: n, Shard: j})
	}
	return keys, nil
}

// LoadShard implements paramserver.ShardStore.
func (v *viewStore) LoadShard(ctx context.Context, key paramserver.ShardKey) ([]byte, error) {
	files, n := v.viewed(key.Step)
	if files == nil {
		if v.dir == nil {
			return nil, fmt.Errorf("ps: no shard %d of %d at step %d outside memory: %w", key.Shard, key.Shards, key.Step, fs.ErrNotExist)
		}
		return v.dir.LoadShard(ctx, key)
	}
	f, ok := files[key.Shard]
	if !ok || key.Shards != n {
		return nil, fmt.Errorf("ps: the checkpoint holds no shard %d of %d: %w", key.Shard, key.Shards, fs.ErrNotExist)
	}
	if f.data != nil {
		if err := checkShard(f.data, key); err != nil { // the CRC-32C of every byte
			return nil, fmt.Errorf("ps: the checkpoint's shard %d of %d: %w", key.Shard, key.Shards, err)
		}
		return f.data, nil
	}
	b, err := atomicfile.ReadVerified(f.path, f.sum)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", paramserver.ErrCorruptShard, err)
	}
	if err := checkShard(b, key); err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	return b, nil
}
