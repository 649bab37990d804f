package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/elastictrain/elastictrain/trainer/driver"
)

// TempCleaner is an optional capability of a CheckpointStore: removing the
// temporary files of writes that never completed (a rank 0 killed while
// writing). Rank 0 calls it when a round starts with no live state (a new
// job or a whole-job restart, when no write of the job can be in flight),
// after the newest checkpoint matched the model (or none exists), never
// before. LocalDir implements it.
//
// Deprecated: use driver.TempCleaner, the same type.
type TempCleaner = driver.TempCleaner

// foreignCheckpoint is rank 0's error for a checkpoint of step that loads
// (its checksum holds) but belongs to another model (err, ErrShapeMismatch).
func (t *Trainer[B]) foreignCheckpoint(step int64, err error) error {
	return fmt.Errorf("%w: checkpoint of step %d%s: %w; refusing to start so that nothing in it is changed (use an empty directory for this model)",
		ErrForeignCheckpoint, step, t.checkpointWhere(), err)
}

// cleanLeftovers removes the store's leftover temporary files when it can
// (TempCleaner), logging what it removed. Called once the model matched.
func (t *Trainer[B]) cleanLeftovers(ctx context.Context) {
	c, ok := t.o.ckpt.(TempCleaner)
	if !ok {
		return
	}
	removed, err := c.CleanTemp(ctx)
	if len(removed) > 0 {
		t.log.Info("removed leftover temporary checkpoint files", "files", removed)
	}
	if err != nil {
		t.log.Warn("cannot remove leftover temporary checkpoint files", "err", err)
	}
}

// refusedSource is the source code in the state broadcast by which rank 0
// tells every rank that it refused to start for a foreign checkpoint, and
// refusedFinished for a finished one (ErrFinishedCheckpoint); the blob is
// its error text.
const (
	refusedSource   = 0xfe
	refusedFinished = 0xfd
)

// refusal is a non-root rank's error for rank 0's refusal to start (code
// refusedSource or refusedFinished), carrying rank 0's error text.
func refusal(code byte, text []byte) error {
	sentinel := ErrForeignCheckpoint
	if code == refusedFinished {
		sentinel = ErrFinishedCheckpoint
	}
	// Rank 0's text begins with the sentinel's own: said once.
	msg := strings.TrimPrefix(string(text), sentinel.Error()+": ")
	return fmt.Errorf("%w: rank 0 refused to start: %s", sentinel, msg)
}

// broadcastRefusal is rank 0's side of the state broadcast when it refuses
// to start: the refused source code and its error text, so that every rank
// returns the refusal. It returns err.
func (t *Trainer[B]) broadcastRefusal(ctx context.Context, comm interface {
	Broadcast(ctx context.Context, buf []byte, root int) error
}, watch *collectiveWatch, err error) error {
	text := []byte(err.Error())
	head := make([]byte, 9)
	binary.LittleEndian.PutUint64(head, uint64(len(text)))
	head[8] = refusedSource
	if errors.Is(err, ErrFinishedCheckpoint) {
		head[8] = refusedFinished
	}
	watch.enter()
	berr := comm.Broadcast(ctx, head, 0)
	if berr == nil {
		berr = comm.Broadcast(ctx, text, 0)
	}
	watch.leave()
	if berr != nil {
		t.log.Warn("cannot tell the other ranks why this rank refuses to start", "err", berr)
	}
	return err
}
