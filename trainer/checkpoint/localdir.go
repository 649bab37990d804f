// Package checkpoint holds the trainer's durable checkpoint store in a
// local directory (LocalDir), a driver.CheckpointStore that
// trainer.WithCheckpointStore takes. Its files are written through the
// module's one keep-N atomic directory store (internal/stepdir), which the
// parameter server's shard store shares.
package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/elastictrain/elastictrain/internal/stepdir"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/worker"
)

// LocalDir is a driver.CheckpointStore in a local directory. Each checkpoint is one
// file "ckpt-<step>.etc": a magic string, a JSON manifest (step, payload
// size, SHA-256 of the payload, creation time), then the payload. It is
// written to a temporary file, fsynced, renamed into place, and the
// directory is fsynced (the module's one keep-N atomic directory store,
// internal/stepdir, shared with the parameter server's
// paramserver.DirShardStore), so a crash never leaves a partial file under
// a checkpoint name (invariant 5). A file that Load finds
// damaged is renamed to "<name>.corrupt" (kept for inspection, never
// listed again), so it
// neither hides newer checkpoints nor counts towards keep. A directory holds
// one job's history: the trainer restores the newest checkpoint in it that
// loads, whichever job wrote it, so two jobs must not share one. Safe for
// concurrent use.
type LocalDir struct {
	dir string
	st  *stepdir.Store // the files, one per step; keeps the newest keep
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
// keeps the newest keep checkpoints (keep <= 0 keeps all). It fails when a
// file cannot be created in dir, so a read-only or pseudo directory is
// found before the first checkpoint is due.
func NewLocalDir(dir string, keep int) (*LocalDir, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: empty checkpoint directory", worker.ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("trainer: checkpoint directory: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-probe-*")
	if err != nil {
		return nil, fmt.Errorf("trainer: checkpoint directory %s is not writable: %w", dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	st, err := stepdir.New(dir, ckptPrefix, ckptSuffix, stepdir.File, keep)
	if err != nil {
		return nil, fmt.Errorf("trainer: checkpoint directory: %w", err)
	}
	return &LocalDir{dir: dir, st: st}, nil
}

// Dir returns the directory.
func (d *LocalDir) Dir() string { return d.dir }

func (d *LocalDir) path(step int64) string { return d.st.Path(step) }

// Save implements driver.CheckpointStore, then deletes checkpoints beyond the newest
// keep.
func (d *LocalDir) Save(ctx context.Context, step int64, data []byte) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	if step < 0 {
		return fmt.Errorf("%w: negative checkpoint step %d", worker.ErrInvalidConfig, step)
	}
	sum := sha256.Sum256(data)
	man, err := json.Marshal(ckptManifest{Step: step, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Created: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	head := binary.LittleEndian.AppendUint32([]byte(ckptMagic), uint32(len(man)))
	if _, err := d.st.Write(step, "", head, man, data); err != nil {
		return fmt.Errorf("trainer: save checkpoint: %w", err)
	}
	return d.prune(ctx, step)
}

// prune keeps the checkpoint just saved and the keep-1 newest older ones,
// and deletes the other older ones (stepdir.Store.Prune). Checkpoints of
// later steps are another history's (a job restored from an older
// checkpoint, or another model in the same directory): they are left alone
// and do not count, so they can never cause the new checkpoints to be
// deleted.
func (d *LocalDir) prune(_ context.Context, just int64) error {
	if err := d.st.Prune(just); err != nil {
		return fmt.Errorf("trainer: prune checkpoints: %w", err)
	}
	return nil
}

// List implements CheckpointStore. It lists only regular files under the
// name Save writes (an unpadded "ckpt-2800.etc" would count step 2800
// twice and cost a good checkpoint its place in the retention; a
// directory, link or FIFO named like a checkpoint is not one of ours).
func (d *LocalDir) List(ctx context.Context) ([]int64, error) {
	steps, err := d.st.Steps()
	if err != nil {
		return nil, fmt.Errorf("trainer: list checkpoints: %w", err)
	}
	slices.Reverse(steps)
	return steps, nil
}

// Load implements CheckpointStore.
func (d *LocalDir) Load(ctx context.Context, step int64) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("trainer: load checkpoint: %w", err)
	}
	p := d.path(step)
	cf, err := readCheckpointFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: step %d", driver.ErrNoCheckpoint, step)
	}
	if err == nil {
		err = cf.man.verify(cf.payload, step)
	}
	if errors.Is(err, driver.ErrCorruptCheckpoint) && cf.info != nil {
		// Set aside the file that was read, not one that replaced it
		// meanwhile.
		if now, serr := os.Lstat(p); serr == nil && os.SameFile(now, cf.info) {
			if rerr := os.Rename(p, p+".corrupt"); rerr == nil {
				err = fmt.Errorf("%w (set aside as %s.corrupt)", err, filepath.Base(p))
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("trainer: load checkpoint %s: %w", p, err)
	}
	return cf.payload, nil
}

// ckptHeadLen is the size of a checkpoint file's fixed header: the magic
// and the manifest's length.
const ckptHeadLen = len(ckptMagic) + 4

// manifestLen checks the fixed header head of a checkpoint of size bytes and
// returns the manifest's length, bounded by maxManifestBytes and the size.
func manifestLen(head []byte, size int64) (int, error) {
	if len(head) < ckptHeadLen || string(head[:len(ckptMagic)]) != ckptMagic {
		return 0, fmt.Errorf("%w: bad header", driver.ErrCorruptCheckpoint)
	}
	n := int64(binary.LittleEndian.Uint32(head[len(ckptMagic):]))
	if n > maxManifestBytes || int64(ckptHeadLen)+n > size {
		return 0, fmt.Errorf("%w: manifest length %d in a checkpoint of %d bytes", driver.ErrCorruptCheckpoint, n, size)
	}
	return int(n), nil
}

// decodeManifest parses a manifest and checks that it gives the payload's
// length, payloadLen bytes.
func decodeManifest(b []byte, payloadLen int64) (ckptManifest, error) {
	var m ckptManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: manifest: %v", driver.ErrCorruptCheckpoint, err)
	}
	if m.Size != payloadLen {
		return m, fmt.Errorf("%w: payload is %d bytes, manifest says %d (truncated?)", driver.ErrCorruptCheckpoint, payloadLen, m.Size)
	}
	return m, nil
}

// verify checks that data is the payload the manifest describes, for step.
func (m ckptManifest) verify(data []byte, step int64) error {
	if m.Step != step {
		return fmt.Errorf("%w: manifest says step %d, file name %d", driver.ErrCorruptCheckpoint, m.Step, step)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != m.SHA256 {
		return fmt.Errorf("%w: SHA-256 mismatch", driver.ErrCorruptCheckpoint)
	}
	return nil
}

// checkpointFile is what readCheckpointFile read: the manifest, the
// payload, and the file they came from (nil when it was not a regular file).
type checkpointFile struct {
	man     ckptManifest
	payload []byte
	info    fs.FileInfo
}

// readCheckpointFile reads a checkpoint file after checking that it is a
// regular file (opening a FIFO would block for ever) and, from its header
// and manifest alone, that its size is what the manifest says; so a damaged
// or foreign file of any size (even a sparse terabyte) costs a few bytes of
// reading, not an allocation of its size. The caller verifies the payload.
// Errors wrap driver.ErrCorruptCheckpoint only for what is wrong with the file's
// content or kind; a failing read is an I/O error.
func readCheckpointFile(p string) (checkpointFile, error) {
	var cf checkpointFile
	pre, err := os.Stat(p)
	if err != nil {
		return cf, err
	}
	if !pre.Mode().IsRegular() {
		return cf, fmt.Errorf("%w: not a regular file (%v)", driver.ErrCorruptCheckpoint, pre.Mode().Type())
	}
	f, err := os.Open(p)
	if err != nil {
		return cf, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return cf, err
	}
	if !st.Mode().IsRegular() { // replaced since the Stat
		return cf, fmt.Errorf("%w: not a regular file (%v)", driver.ErrCorruptCheckpoint, st.Mode().Type())
	}
	cf.info = st
	if st.Size() < int64(ckptHeadLen) {
		return cf, fmt.Errorf("%w: %d bytes is shorter than the header", driver.ErrCorruptCheckpoint, st.Size())
	}
	head := make([]byte, ckptHeadLen)
	if _, err := io.ReadFull(f, head); err != nil {
		return cf, fmt.Errorf("trainer: read checkpoint header: %w", err)
	}
	n, err := manifestLen(head, st.Size())
	if err != nil {
		return cf, err
	}
	man := make([]byte, n)
	if _, err := io.ReadFull(f, man); err != nil {
		return cf, fmt.Errorf("trainer: read checkpoint manifest: %w", err)
	}
	payloadLen := st.Size() - int64(ckptHeadLen+n)
	if cf.man, err = decodeManifest(man, payloadLen); err != nil {
		return cf, err
	}
	cf.payload = make([]byte, payloadLen)
	if _, err := io.ReadFull(f, cf.payload); err != nil {
		return cf, fmt.Errorf("trainer: read checkpoint payload: %w", err)
	}
	return cf, nil
}

// parseCheckpoint checks a whole checkpoint file's bytes, header, manifest
// and checksum, and returns its payload.
func parseCheckpoint(b []byte, step int64) ([]byte, error) {
	n, err := manifestLen(b, int64(len(b)))
	if err != nil {
		return nil, err
	}
	data := b[ckptHeadLen+n:]
	m, err := decodeManifest(b[ckptHeadLen:ckptHeadLen+n], int64(len(data)))
	if err != nil {
		return nil, err
	}
	if err := m.verify(data, step); err != nil {
		return nil, err
	}
	return data, nil
}

// CleanTemp implements driver.TempCleaner: it removes the temporary files that an
// interrupted Save left in the directory (".tmp-ckpt-*"), never a
// checkpoint or a file of another name (stepdir.Store.CleanTemp).
func (d *LocalDir) CleanTemp(ctx context.Context) ([]string, error) {
	removed, err := d.st.CleanTemp(ctx)
	if err != nil {
		return removed, fmt.Errorf("trainer: clean checkpoint directory: %w", err)
	}
	return removed, nil
}
