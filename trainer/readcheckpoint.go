package trainer

import (
	"context"
	"fmt"

	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/internal/enc"
)

// Checkpoint is what a durable checkpoint holds that a program serving or
// evaluating the model needs, read without a job (ReadCheckpoint,
// LoadCheckpoint): the parameters by name, and where training stood.
type Checkpoint struct {
	// Step is the global step the checkpoint was taken after.
	Step int64
	// Epoch and EpochStep locate Step in the data (0 for checkpoints
	// written before they were recorded).
	Epoch, EpochStep int
	// Params holds every parameter in model order, with Name, Shape and
	// Value (Grad is nil).
	Params []Param
	// Optimizer is the optimizer's name ("sgd", "momentum", "adam").
	Optimizer string
}

// Param returns the parameter named name and whether there is one.
func (c *Checkpoint) Param(name string) (Param, bool) {
	for _, p := range c.Params {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}

// CopyInto copies the checkpoint's values into params by name: every
// element of params must be in the checkpoint with the same shape (else
// ErrShapeMismatch naming it); the checkpoint may hold more.
func (c *Checkpoint) CopyInto(params []Param) error {
	for _, p := range params {
		q, ok := c.Param(p.Name)
		switch {
		case !ok:
			return fmt.Errorf("%w: parameter %q is not in the checkpoint of step %d", ErrShapeMismatch, p.Name, c.Step)
		case !sameShape(p.Shape, q.Shape) || len(p.Value) != len(q.Value):
			return fmt.Errorf("%w: parameter %q is %v in the checkpoint, %v (%d values) here", ErrShapeMismatch, p.Name, q.Shape, p.Shape, len(p.Value))
		}
		copy(p.Value, q.Value)
	}
	return nil
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ReadCheckpoint decodes the payload of a durable checkpoint (what
// CheckpointStore.Load returns) without a model: the parameter names and
// shapes come from the checkpoint itself. Errors: ErrCorruptState for
// bytes that are not a checkpoint or fail their checksum.
func ReadCheckpoint(data []byte) (*Checkpoint, error) {
	params, err := checkpointParams(data)
	if err != nil {
		return nil, err
	}
	sn, err := decodeSnapshot(data, params)
	if err != nil {
		return nil, err
	}
	for i := range params {
		params[i].Value = sn.values[i]
	}
	return &Checkpoint{Step: sn.step, Epoch: int(sn.epoch), EpochStep: int(sn.epochStep), Params: params, Optimizer: sn.optName}, nil
}

// LoadCheckpoint reads the checkpoint of step from st (step < 0: the
// newest one that loads) with ReadCheckpoint: the final model of a job,
// or any checkpoint of it, for serving or evaluation, with no job, store
// or trainer. Errors: ErrNoCheckpoint when st holds none (or not step),
// the store's errors (ErrCorruptCheckpoint), ErrCorruptState.
func LoadCheckpoint(ctx context.Context, st driver.CheckpointStore, step int64) (*Checkpoint, error) {
	if step >= 0 {
		data, err := st.Load(ctx, step)
		if err != nil {
			return nil, err
		}
		return ReadCheckpoint(data)
	}
	steps, err := st.List(ctx)
	if err != nil {
		return nil, err
	}
	var last error = ErrNoCheckpoint
	for _, s := range steps {
		data, err := st.Load(ctx, s)
		if err == nil {
			var c *Checkpoint
			if c, err = ReadCheckpoint(data); err == nil {
				return c, nil
			}
		}
		last = err
	}
	return nil, fmt.Errorf("trainer: no loadable checkpoint among %d: %w", len(steps), last)
}

// checkpointParams walks the parameter section of an encoded snapshot and
// returns its names and shapes as Params with Value of the right length
// (filled by decodeSnapshot), after checking the checksum.
func checkpointParams(b []byte) ([]Param, error) {
	body, magic, err := snapshotBody(b)
	if err != nil {
		return nil, err
	}
	r := enc.Reader{B: body, Off: len(snapshotMagic)}
	r.U64() // step
	r.U64() // gen
	if magic != snapshotMagicV1 {
		r.U64() // base
	}
	n := int(r.U32())
	if r.Err == nil && n > (len(body)-r.Off)/13 { // a name length, a rank and a value count at least
		r.Fail("tensor count exceeds input")
	}
	var params []Param
	for range n {
		if r.Err != nil {
			break
		}
		p := Param{Name: r.Str()}
		nd := int(r.U8())
		size := 1
		for range nd {
			d := r.U64()
			if d > 1<<40 {
				r.Fail("dimension too large")
				break
			}
			p.Shape = append(p.Shape, int(d))
			size *= int(d)
		}
		vals := r.Length(4)
		if r.Err == nil && vals != size {
			r.Fail(fmt.Sprintf("tensor %q of shape %v has %d values", p.Name, p.Shape, vals))
		}
		r.Take(4 * vals)
		p.Value = make([]float32, vals)
		params = append(params, p)
	}
	if r.Err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptState, r.Err)
	}
	return params, nil
}
