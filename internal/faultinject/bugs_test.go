package faultinject_test

import (
	"encoding/binary"
	"testing"

	"github.com/elastictrain/elastictrain/trainer"
)

// Bugs found in other packages by this suite and its fuzz targets. Each
// test fails until the bug is fixed in its package (this package may not
// change their code).

// Bug in trainer.Adam: LoadState accepts a state that holds first moments
// (m) but no second moments (v: tensor count 0), and the next Step then
// indexes the nil v and panics (index out of range). Such state comes from
// a durable checkpoint or a peer's snapshot (its checksum does not protect
// against a crafted file or a faulty peer), so a worker crashes on input
// from disk or the network. Fix: LoadState must refuse m and v of
// different presence (ErrCorruptState), or Step must create the missing one.
func TestAdamStateWithMomentsHalfMissingIsRefused(t *testing.T) {
	params := []trainer.Param{{Name: "w", Shape: []int{3}, Value: []float32{1, 2, 3}, Grad: []float32{.1, .2, .3}}}
	a := trainer.NewAdam(0.01)
	if err := a.Step(params); err != nil {
		t.Fatal(err)
	}
	state := a.AppendState(nil)
	// Layout: hyper-parameters and t, then the m tensor list, then the v
	// tensor list of the same size; a fresh Adam has two empty lists
	// (a uint32 count of 0 each).
	head := len(trainer.NewAdam(0.01).AppendState(nil)) - 8
	half := (len(state) - head) / 2
	bad := binary.LittleEndian.AppendUint32(append([]byte(nil), state[:head+half]...), 0)

	b := trainer.NewAdam(0.01)
	if err := b.LoadState(bad, params); err != nil {
		return // refused: fixed that way
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Adam.Step panicked after LoadState accepted state with first but without second moments: %v", r)
		}
	}()
	_ = b.Step(params) // an error or a valid step, never a panic
}
