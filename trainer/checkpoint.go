package trainer

import (
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// CheckpointStore keeps durable checkpoints: opaque byte blobs named by the
// global step they were taken after. The trainer writes at most one
// checkpoint at a time, from a goroutine it owns, and reads them only when a
// round starts with no live state (a whole-job restart). Implementations
// must be safe for use by several processes of one job sharing the store
// (each writes whole files under unique names) and must never expose a
// partially written checkpoint as complete.
//
// Deprecated: use driver.CheckpointStore, the same type.
type CheckpointStore = driver.CheckpointStore

// LocalDir is a CheckpointStore in a local directory.
//
// Deprecated: use checkpoint.LocalDir, the same type.
type LocalDir = checkpoint.LocalDir

// NewLocalDir returns a LocalDir in dir that keeps the newest keep
// checkpoints (keep <= 0 keeps all).
//
// Deprecated: use checkpoint.NewLocalDir.
func NewLocalDir(dir string, keep int) (*LocalDir, error) { return checkpoint.NewLocalDir(dir, keep) }
