package trainer

import (
	"context"
	"errors"
	"fmt"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// Loader is a data loader whose state is a dataloader.Cursor, the same on
// every rank; *dataloader.Loader implements it. The trainer calls it from
// its loop goroutine only. New adapts it to the StatefulLoader protocol
// (the state is the cursor's MarshalBinary, CursorSize bytes), so
// checkpoints hold the same bytes whichever kind of loader wrote them.
//
// Deprecated: use driver.Loader, the same type.
type Loader[B any] = driver.Loader[B]

// cursorLoader runs a Loader under the StatefulLoader protocol: Restore
// resets it from the committed cursor, Stepped moves the committed cursor
// to the last batch's Next, State encodes it. Its state is the same on
// every rank, so it needs neither a StateMerger nor a barrier after
// Restore.
type cursorLoader[B any] struct {
	l    Loader[B]
	cur  dataloader.Cursor // after the last batch Stepped reported
	next dataloader.Cursor // after the last batch Next returned
}

// errLoaderFatal marks an error of a Loader's Next: the trainer has always
// ended Run on those (a dataset that cannot be read), rather than forming
// round after round.
var errLoaderFatal = errors.New("trainer: data loader failed")

// freshState is the state of a fresh job: the Loader's NewCursor.
func (c *cursorLoader[B]) freshState() ([]byte, error) {
	b, err := c.l.NewCursor().MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("trainer: cursor: %w", err)
	}
	return b, nil
}

func (c *cursorLoader[B]) Restore(_ context.Context, state []byte, rank, size int) error {
	cur := c.l.NewCursor()
	if state != nil {
		if err := cur.UnmarshalBinary(state); err != nil {
			return fmt.Errorf("%w: cursor: %w", ErrCorruptState, err)
		}
	}
	if err := c.l.Reset(cur, rank, size); err != nil {
		return fmt.Errorf("trainer: reshard loader: %w", err)
	}
	c.cur, c.next = cur, cur
	return nil
}

func (c *cursorLoader[B]) Next(ctx context.Context) (dataloader.Batch[B], error) {
	b, err := c.l.Next(ctx)
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", errLoaderFatal, err)
		}
		return b, err
	}
	c.next = b.Next
	return b, nil
}

func (c *cursorLoader[B]) Stepped(context.Context, LoaderStep) (bool, error) {
	c.cur = c.next
	return false, nil
}

func (c *cursorLoader[B]) State(context.Context) ([]byte, error) {
	b, err := c.cur.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("trainer: cursor: %w", err)
	}
	return b, nil
}

// position is where the data continues: the committed cursor's epoch and
// step within it.
func (c *cursorLoader[B]) position() (epoch, epochStep int) {
	return c.cur.Epoch, c.cur.Step()
}

// positioner is implemented by loaders that know their own position (the
// cursor adapter); for the others, the trainer tracks it from the batches.
type positioner interface {
	position() (epoch, epochStep int)
}

// loaderFatal reports a loader error that no new round can cure: the
// dataloader sentinels of bad configuration, cursors and data, and errors
// of a Loader's Next. Others (a queue that is unreachable for a while, a
// lease lost) end the round as a failure.
func loaderFatal(err error) bool {
	for _, s := range []error{errLoaderFatal, dataloader.ErrInvalidConfig, dataloader.ErrInvalidWorld,
		dataloader.ErrInvalidCursor, dataloader.ErrCorruptCursor, dataloader.ErrCursorMismatch,
		dataloader.ErrClosed, dataloader.ErrIndexOutOfRange, dataloader.ErrBadRecords, dataloader.ErrShardMismatch} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
