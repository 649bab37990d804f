package trainer_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// The final checkpoint of a job loads by parameter name with no job,
// store or trainer, for serving or evaluation; damaged bytes are an error,
// never a panic.
func TestLoadingACheckpointsParametersWithoutAJob(t *testing.T) {
	dir := t.TempDir()
	ck, err := NewLocalDir(dir, 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	j.opts = func(int) []Option { return []Option{WithCheckpointStore(ck)} }
	w := j.start()
	j.wait()
	require.NoError(t, w.err)

	c, err := LoadCheckpoint(context.Background(), ck, -1)
	require.NoError(t, err)
	require.Equal(t, w.res.Step, c.Step)
	require.Equal(t, "sgd", c.Optimizer)
	wp, ok := c.Param("w")
	require.True(t, ok)
	require.Equal(t, []int{4}, wp.Shape)
	require.Equal(t, w.model.W, wp.Value, "the trained values")

	fresh := trainertest.NewModel(4)
	require.NoError(t, c.CopyInto(fresh.Params()))
	require.Equal(t, w.model.W, fresh.W)
	require.Equal(t, w.model.B, fresh.B)
	require.ErrorIs(t, c.CopyInto(trainertest.NewModel(5).Params()), ErrShapeMismatch)

	data, err := ck.Load(context.Background(), c.Step)
	require.NoError(t, err)
	for n := range len(data) {
		_, err := ReadCheckpoint(data[:n])
		require.ErrorIs(t, err, ErrCorruptState, "a payload cut to %d bytes", n)
	}
	bad := append([]byte(nil), data...)
	bad[len(bad)/2] ^= 1
	_, err = ReadCheckpoint(bad)
	require.ErrorIs(t, err, ErrCorruptState)

	_, err = LoadCheckpoint(context.Background(), ck, c.Step+1)
	require.ErrorIs(t, err, ErrNoCheckpoint)
}

// ReadCheckpoint never panics on bytes from disk.
func FuzzReadCheckpoint(f *testing.F) {
	f.Add([]byte("ETSNAP03"))
	f.Add([]byte("ETSNAP03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := ReadCheckpoint(b); err == nil {
			for _, p := range c.Params {
				n := 1
				for _, d := range p.Shape {
					n *= d
				}
				require.Len(t, p.Value, n)
			}
		}
	})
}
