//go:build unix

package checkpoint

import (
	"context"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/driver"
)

// A FIFO under a checkpoint name is refused at once (opening one for
// reading blocks until a writer comes, and the job hung in its restore).
func TestLocalDirRefusesAFIFO(t *testing.T) {
	d, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Mkfifo(d.path(500), 0o644))
	_, err = d.Load(context.Background(), 500)
	require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)
	require.ErrorContains(t, err, "not a regular file")
}
