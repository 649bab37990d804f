package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/elastictrain/elastictrain/sync/mesh"
)

// Durable checkpoints taken from memory
//
// A commit lives in the memory of its shard's host and replicas only
// (Config.Store aside). A durable checkpoint of the tables is then taken
// from that memory: AppendCommitted encodes a committed shard this process
// holds, in the encoding a ShardStore holds, without touching a disk; the
// caller writes the bytes wherever its checkpoints go (package trainer/ps
// puts them in the trainer's one checkpoint blob, which the trainer writes
// in the background). A later job restores such a checkpoint through
// SetRestoreSource: a read-only ShardStore over the checkpoint's shards,
// which Round and ReadTables consult like Config.Store and Commit never
// writes to.

// AppendCommitted appends to dst the encoding (see DecodeShardInfo) of the
// committed shard key as this process holds it in memory: a shard it hosts
// or replicates, at the newest commit of that shard or the one before it.
// It copies the rows under the shard's lock and does no I/O, so the cost
// is one pass over the shard's rows and optimizer state. Errors: wrapping
// ErrRowsLost when this process holds no commit of key.Step of that shard.
// Safe for concurrent use with the current round's traffic.
func (ps *Server) AppendCommitted(dst []byte, key ShardKey) ([]byte, error) {
	im := ps.image(memKey{key.Shards, key.Shard}, false)
	out := dst
	if im == nil || !im.view(key.Step, func(d *psShardData) { out = encodeShard(dst, ps.tables, d) }) {
		return dst, fmt.Errorf("%w: this process holds no commit of shard %d of %d at step %d", ErrRowsLost, key.Shard, key.Shards, key.Step)
	}
	return out, nil
}

// SetRestoreSource sets a read-only source of committed shards (a durable
// checkpoint's) that the next rounds (Round) and ReadTables consult besides
// Config.Store, for shards no live rank holds; Commit never writes to it.
// nil removes it. It must list and load the same shards on every process
// of a round. Safe for concurrent use.
func (ps *Server) SetRestoreSource(src ShardStore) {
	ps.mu.Lock()
	ps.source = src
	ps.mu.Unlock()
}

// readStore returns where shards no live rank holds are read from:
// Config.Store, the restore source, both, or nil.
func (ps *Server) readStore() ShardStore {
	ps.mu.Lock()
	src := ps.source
	ps.mu.Unlock()
	switch {
	case src == nil:
		return ps.cfg.Store
	case ps.cfg.Store == nil:
		return src
	}
	return unionStore{src, ps.cfg.Store}
}

// unionStore reads from a, then from b; it is never written to.
type unionStore struct{ a, b ShardStore }

func (u unionStore) SaveShard(context.Context, ShardKey, []byte) error {
	return fmt.Errorf("%w: the restore source is read-only", mesh.ErrInvalid)
}

func (u unionStore) LoadShard(ctx context.Context, key ShardKey) ([]byte, error) {
	b, err := u.a.LoadShard(ctx, key)
	if errors.Is(err, fs.ErrNotExist) {
		return u.b.LoadShard(ctx, key)
	}
	return b, err
}

func (u unionStore) ListShards(ctx context.Context, step int64) ([]ShardKey, error) {
	ka, err := u.a.ListShards(ctx, step)
	if err != nil {
		return nil, err
	}
	kb, err := u.b.ListShards(ctx, step)
	if err != nil {
		return nil, err
	}
	return append(ka, kb...), nil
}
