package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Entries that only look like checkpoints are not checkpoints: a directory
// under a checkpoint's name (with a user's file in it) was listed, then
// removed with everything in it by the retention; an unpadded
// "ckpt-2800.etc" counted step 2800 twice and cost a good checkpoint its
// place. Now List names only regular files of the name Save writes, so the
// retention keeps the newest keep checkpoints and touches nothing else.
func TestLocalDirListsOnlyItsOwnCheckpoints(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	d, err := NewLocalDir(dir, 2)
	require.NoError(t, err)
	require.NoError(t, d.Save(ctx, 100, []byte("a")))
	require.NoError(t, d.Save(ctx, 200, []byte("b")))

	lookalike := d.path(150)
	require.NoError(t, os.Mkdir(lookalike, 0o755))
	precious := filepath.Join(lookalike, "userdata")
	require.NoError(t, os.WriteFile(precious, []byte("precious"), 0o644))
	unpadded := filepath.Join(dir, ckptPrefix+"200"+ckptSuffix)
	require.NoError(t, os.WriteFile(unpadded, []byte("junk"), 0o644))

	steps, err := d.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{200, 100}, steps, "only the checkpoints Save wrote")

	require.NoError(t, d.Save(ctx, 300, []byte("c")))
	steps, err = d.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{300, 200}, steps, "keep 2: the newest two")
	b, err := os.ReadFile(precious)
	require.NoError(t, err, "the directory named like a checkpoint is left alone")
	require.Equal(t, "precious", string(b))
	_, err = os.Stat(unpadded)
	require.NoError(t, err, "a file of another name is left alone")
}
