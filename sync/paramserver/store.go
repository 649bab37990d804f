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

	"github.com/elastictrain/elastictrain/internal/stepdir"
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
		return nil, fmt.Errorf("paramserver: shard %d/%d of step %d: %w", key.Shard, key.Shards, key.Step, fs.ErrNotExist)
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
// dir/step-<step>/of-<shards>/shard-<shard>.bin, one directory per step in
// the module's keep-N atomic directory store (internal/stepdir, shared with
// the trainer's checkpoints): each file written to a temporary file,
// fsynced and renamed into place, and the directory fsynced, so a crash
// leaves either the old or the new file whole (the encoding's checksum
// catches anything else). Safe for concurrent use by goroutines and
// processes.
type DirShardStore struct {
	st *stepdir.Store
}

// NewDirShardStore returns a store in dir (created if missing) that keeps
// the shards of the newest keep steps and removes older ones after each
// save (keep <= 0 keeps everything): the step just saved and the keep-1
// newest steps before it; steps after it (another history's, see
// RemoveAfter) are left alone and do not count. Keep at least 3 so that a
// restore step is never removed while a round uses it.
func NewDirShardStore(dir string, keep int) (*DirShardStore, error) {
	st, err := stepdir.New(dir, "step-", "", stepdir.Dir, keep)
	if err != nil {
		return nil, fmt.Errorf("paramserver: shard store: %w", err)
	}
	return &DirShardStore{st: st}, nil
}

// rel is key's file within its step's directory.
func (k ShardKey) rel() string {
	return filepath.Join(fmt.Sprintf("of-%05d", k.Shards), fmt.Sprintf("shard-%05d.bin", k.Shard))
}

// Path returns the file in which key is (or would be) stored.
func (s *DirShardStore) Path(key ShardKey) string {
	return filepath.Join(s.st.Path(key.Step), key.rel())
}

// Dir returns the store's directory.
func (s *DirShardStore) Dir() string { return s.st.Dir() }

// SaveShard implements ShardStore, then removes steps beyond the newest
// keep (a failure to remove them is not the save's).
func (s *DirShardStore) SaveShard(ctx context.Context, key ShardKey, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if key.Step < 0 || key.Shards < 1 || key.Shard < 0 || key.Shard >= key.Shards {
		return fmt.Errorf("%w: shard key %+v", mesh.ErrInvalid, key)
	}
	if _, err := s.st.Write(key.Step, key.rel(), data); err != nil {
		return fmt.Errorf("paramserver: shard store: save %s: %w", s.Path(key), err)
	}
	s.st.Prune(key.Step)
	return nil
}

// LoadShard implements ShardStore.
func (s *DirShardStore) LoadShard(ctx context.Context, key ShardKey) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.Path(key))
	if err != nil {
		return nil, fmt.Errorf("paramserver: shard store: %w", err)
	}
	return b, nil
}

// ListShards implements ShardStore.
func (s *DirShardStore) ListShards(ctx context.Context, step int64) ([]ShardKey, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	root := s.st.Path(step)
	layouts, err := os.ReadDir(root)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("paramserver: shard store: %w", err)
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
func (s *DirShardStore) Steps() []int64 {
	steps, _ := s.st.Steps()
	return steps
}

// RemoveAfter removes the shards of every step after step: commits of a
// history that was rolled back or abandoned (a round restored an older
// commit, a whole-job restart an older checkpoint), which must not be
// mistaken for the new history's commits of the same step numbers. Call it
// while no process of the job saves shards.
func (s *DirShardStore) RemoveAfter(ctx context.Context, step int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.st.RemoveAfter(step); err != nil {
		return fmt.Errorf("paramserver: shard store: %w", err)
	}
	return nil
}
