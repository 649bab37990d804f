package paramserver

import (
	"context"
	"fmt"
	"github.com/elastictrain/elastictrain/sync/mesh"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	gosync "sync"

	"github.com/elastictrain/elastictrain/internal/atomicfile"
)

// ShardKey names one committed shard: shard Shard of a layout of Shards
// shards, at step Step.
type ShardKey struct {
	Step   int64
	Shards int
	Shard  int
}

// ShardStore keeps committed parameter-server shards (rows and optimizer
// state, encoded as DecodeShardInfo describes) outside the processes that
// host them, so a host's death loses no rows and a whole job can restart
// onto any number of shards. Every process of a job must see the same
// store. Implementations must be safe for concurrent use by many
// goroutines and processes; a shard that SaveShard returned nil for must
// be readable by LoadShard from every process, whole (never partly
// written).
type ShardStore interface {
	// SaveShard durably stores data under key, replacing any previous value.
	SaveShard(ctx context.Context, key ShardKey, data []byte) error
	// LoadShard returns the data saved under key; an error wrapping
	// fs.ErrNotExist when there is none.
	LoadShard(ctx context.Context, key ShardKey) ([]byte, error)
	// ListShards returns the keys saved for step, in any order.
	ListShards(ctx context.Context, step int64) ([]ShardKey, error)
}

// MemoryShardStore is a ShardStore in this process's memory, for tests and
// single-process jobs. Safe for concurrent use.
type MemoryShardStore struct {
	mu gosync.Mutex
	m  map[ShardKey][]byte
}

// NewMemoryShardStore returns an empty MemoryShardStore.
func NewMemoryShardStore() *MemoryShardStore {
	return &MemoryShardStore{m: map[ShardKey][]byte{}}
}

// SaveShard implements ShardStore; it keeps a copy of data.
func (s *MemoryShardStore) SaveShard(ctx context.Context, key ShardKey, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = slices.Clone(data)
	return nil
}

// LoadShard implements ShardStore.
func (s *MemoryShardStore) LoadShard(ctx context.Context, key ShardKey) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.m[key]
	if !ok {
		return nil, fmt.Errorf("sync: shard %d/%d of step %d: %w", key.Shard, key.Shards, key.Step, fs.ErrNotExist)
	}
	return slices.Clone(d), nil
}

// ListShards implements ShardStore.
func (s *MemoryShardStore) ListShards(ctx context.Context, step int64) ([]ShardKey, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []ShardKey
	for k := range s.m {
		if k.Step == step {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// Delete removes key (tests use it to simulate a lost shard).
func (s *MemoryShardStore) Delete(key ShardKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
}

// DirShardStore is a ShardStore in a local (or shared network) directory:
// dir/step-<step>/of-<shards>/shard-<shard>.bin, each written to a temporary
// file, fsynced and renamed into place, and the directory fsynced (the
// module's one atomic file writer, shared with the trainer's checkpoints),
// so a crash leaves either the old or the new file whole (the encoding's
// checksum catches anything else).
// Safe for concurrent use by goroutines and processes.
type DirShardStore struct {
	dir  string
	keep int
}

// NewDirShardStore returns a store in dir (created if missing) that keeps
// the shards of the newest keep steps and removes older ones after each
// save (keep <= 0 keeps everything). Keep at least 3 so that a restore
// step is never removed while a round uses it.
func NewDirShardStore(dir string, keep int) (*DirShardStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sync: shard store: %w", err)
	}
	return &DirShardStore{dir: dir, keep: keep}, nil
}

func (s *DirShardStore) path(k ShardKey) string {
	return filepath.Join(s.stepDir(k.Step), fmt.Sprintf("of-%05d", k.Shards), fmt.Sprintf("shard-%05d.bin", k.Shard))
}

func (s *DirShardStore) stepDir(step int64) string {
	return filepath.Join(s.dir, fmt.Sprintf("step-%020d", step))
}

// Path returns the file in which key is (or would be) stored.
func (s *DirShardStore) Path(key ShardKey) string { return s.path(key) }

// Dir returns the store's directory.
func (s *DirShardStore) Dir() string { return s.dir }

// SaveShard implements ShardStore.
func (s *DirShardStore) SaveShard(ctx context.Context, key ShardKey, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key.Step < 0 || key.Shards < 1 || key.Shard < 0 || key.Shard >= key.Shards {
		return fmt.Errorf("%w: shard key %+v", mesh.ErrInvalid, key)
	}
	p := s.path(key)
	if err := atomicfile.MkdirAll(filepath.Dir(p)); err != nil {
		return fmt.Errorf("sync: shard store: %w", err)
	}
	if _, err := atomicfile.Write(p, data); err != nil {
		return fmt.Errorf("sync: shard store: save %s: %w", p, err)
	}
	s.prune(key.Step)
	return nil
}

// prune removes the directories of steps older than the keep newest.
func (s *DirShardStore) prune(latest int64) {
	if s.keep <= 0 {
		return
	}
	steps := s.steps()
	if len(steps) <= s.keep {
		return
	}
	for _, st := range steps[:len(steps)-s.keep] {
		if st < latest {
			atomicfile.RemoveAll(s.stepDir(st))
		}
	}
}

// steps lists the steps present, ascending.
func (s *DirShardStore) steps() []int64 {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil
	}
	var steps []int64
	for _, e := range ents {
		if v, ok := strings.CutPrefix(e.Name(), "step-"); ok && e.IsDir() {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				steps = append(steps, n)
			}
		}
	}
	slices.Sort(steps)
	return steps
}

// LoadShard implements ShardStore.
func (s *DirShardStore) LoadShard(ctx context.Context, key ShardKey) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.path(key))
	if err != nil {
		return nil, fmt.Errorf("sync: shard store: %w", err)
	}
	return b, nil
}

// ListShards implements ShardStore.
func (s *DirShardStore) ListShards(ctx context.Context, step int64) ([]ShardKey, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	root := s.stepDir(step)
	layouts, err := os.ReadDir(root)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("sync: shard store: %w", err)
	}
	var keys []ShardKey
	for _, l := range layouts {
		v, ok := strings.CutPrefix(l.Name(), "of-")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || !l.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, l.Name()))
		if err != nil {
			continue
		}
		for _, f := range files {
			v, ok := strings.CutPrefix(f.Name(), "shard-")
			v, ok2 := strings.CutSuffix(v, ".bin")
			i, err := strconv.Atoi(v)
			if ok && ok2 && err == nil {
				keys = append(keys, ShardKey{Step: step, Shards: n, Shard: i})
			}
		}
	}
	return keys, nil
}

// Steps returns the steps with shards in the store, ascending.
func (s *DirShardStore) Steps() []int64 { return s.steps() }

// RemoveAfter removes the shards of every step after step: commits of a
// history that was rolled back or abandoned (a round restored an older
// commit, a whole-job restart an older checkpoint), which must not be
// mistaken for the new history's commits of the same step numbers. Call it
// while no process of the job saves shards.
func (s *DirShardStore) RemoveAfter(ctx context.Context, step int64) error {
	for _, st := range s.steps() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if st > step {
			if err := atomicfile.RemoveAll(s.stepDir(st)); err != nil {
				return fmt.Errorf("sync: shard store: %w", err)
			}
		}
	}
	return nil
}
