package trainer

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CheckpointStore keeps durable checkpoints: opaque byte blobs named by the
// global step they were taken after. The trainer writes at most one
// checkpoint at a time, from a goroutine it owns, and reads them only when a
// round starts with no live state (a whole-job restart). Implementations
// must be safe for use by several processes of one job sharing the store
// (each writes whole files under unique names) and must never expose a
// partially written checkpoint as complete.
//
// Implement it to keep checkpoints in an object store; LocalDir is the
// local-directory implementation.
type CheckpointStore interface {
	// Save stores data durably as the checkpoint of step; when it returns
	// nil, a crash at any later instant leaves the checkpoint readable.
	Save(ctx context.Context, step int64, data []byte) error
	// List returns the steps of the stored checkpoints, newest first.
	List(ctx context.Context) ([]int64, error)
	// Load returns the checkpoint of step after verifying its checksum;
	// ErrCorruptCheckpoint when it is truncated or damaged, ErrNoCheckpoint
	// when there is none.
	Load(ctx context.Context, step int64) ([]byte, error)
}

// LocalDir is a CheckpointStore in a local directory. Each checkpoint is one
// file "ckpt-<step>.etc": a magic string, a JSON manifest (step, payload
// size, SHA-256 of the payload, creation time), then the payload. It is
// written to a temporary file, fsynced, renamed into place, and the
// directory is fsynced, so a crash never leaves a partial file under a
// checkpoint name (invariant 5). Safe for concurrent use.
type LocalDir struct {
	dir  string
	keep int
}

const (
	ckptMagic  = "ETCKPT01"
	ckptPrefix = "ckpt-"
	ckptSuffix = ".etc"
	// maxManifestBytes bounds the manifest read from disk.
	maxManifestBytes = 64 << 10
)

type ckptManifest struct {
	Step    int64     `json:"step"`
	Size    int64     `json:"size"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
}

// NewLocalDir returns a LocalDir in dir, creating it when missing, that
// keeps the newest keep checkpoints (keep <= 0 keeps all).
func NewLocalDir(dir string, keep int) (*LocalDir, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: empty checkpoint directory", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: checkpoint directory: %w", err)
	}
	return &LocalDir{dir: dir, keep: keep}, nil
}

// Dir returns the directory.
func (d *LocalDir) Dir() string { return d.dir }

func (d *LocalDir) path(step int64) string {
	return filepath.Join(d.dir, fmt.Sprintf("%s%020d%s", ckptPrefix, step, ckptSuffix))
}

// Save implements CheckpointStore, then deletes checkpoints beyond the newest
// keep.
func (d *LocalDir) Save(ctx context.Context, step int64, data []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	if step < 0 {
		return fmt.Errorf("%w: negative checkpoint step %d", ErrInvalidConfig, step)
	}
	sum := sha256.Sum256(data)
	man, err := json.Marshal(ckptManifest{Step: step, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Created: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	f, err := os.CreateTemp(d.dir, ".tmp-ckpt-*")
	if err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	head := binary.LittleEndian.AppendUint32([]byte(ckptMagic), uint32(len(man)))
	for _, part := range [][]byte{head, man, data} {
		if _, err := f.Write(part); err != nil {
			f.Close()
			return fmt.Errorf("trainer: save checkpoint: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("trainer: save checkpoint: fsync: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	if err := os.Rename(tmp, d.path(step)); err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	if err := syncDir(d.dir); err != nil {
		return fmt.Errorf("trainer: save checkpoint: fsync directory: %w", err)
	}
	return d.prune()
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func (d *LocalDir) prune() error {
	if d.keep <= 0 {
		return nil
	}
	steps, err := d.List(context.Background())
	if err != nil {
		return err
	}
	for _, s := range steps[min(d.keep, len(steps)):] {
		if err := os.Remove(d.path(s)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("trainer: prune checkpoints: %w", err)
		}
	}
	return nil
}

// List implements CheckpointStore.
func (d *LocalDir) List(ctx context.Context) ([]int64, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("trainer: list checkpoints: %w", err)
	}
	var steps []int64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, ckptPrefix) || !strings.HasSuffix(name, ckptSuffix) {
			continue
		}
		s, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(name, ckptPrefix), ckptSuffix), 10, 64)
		if err != nil || s < 0 {
			continue
		}
		steps = append(steps, s)
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// Load implements CheckpointStore.
func (d *LocalDir) Load(ctx context.Context, step int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("trainer: load checkpoint: %w", err)
	}
	p := d.path(step)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: step %d", ErrNoCheckpoint, step)
	}
	if err != nil {
		return nil, fmt.Errorf("trainer: load checkpoint %s: %w", p, err)
	}
	data, err := parseCheckpoint(b, step)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return data, nil
}

// parseCheckpoint checks a checkpoint file's magic, manifest and checksum
// and returns its payload.
func parseCheckpoint(b []byte, step int64) ([]byte, error) {
	if len(b) < len(ckptMagic)+4 || string(b[:len(ckptMagic)]) != ckptMagic {
		return nil, fmt.Errorf("%w: bad header", ErrCorruptCheckpoint)
	}
	n := binary.LittleEndian.Uint32(b[len(ckptMagic):])
	rest := b[len(ckptMagic)+4:]
	if n > maxManifestBytes || int(n) > len(rest) {
		return nil, fmt.Errorf("%w: manifest length %d of %d bytes", ErrCorruptCheckpoint, n, len(rest))
	}
	var man ckptManifest
	if err := json.Unmarshal(rest[:n], &man); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrCorruptCheckpoint, err)
	}
	data := rest[n:]
	if man.Step != step {
		return nil, fmt.Errorf("%w: manifest says step %d, file name %d", ErrCorruptCheckpoint, man.Step, step)
	}
	if man.Size != int64(len(data)) {
		return nil, fmt.Errorf("%w: payload is %d bytes, manifest says %d (truncated?)", ErrCorruptCheckpoint, len(data), man.Size)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != man.SHA256 {
		return nil, fmt.Errorf("%w: SHA-256 mismatch", ErrCorruptCheckpoint)
	}
	return data, nil
}
