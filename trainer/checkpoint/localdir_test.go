package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer/driver"
)

func TestLocalDirSaveLoadKeep(t *testing.T) {
	ctx := context.Background()
	d, err := NewLocalDir(t.TempDir(), 2)
	require.NoError(t, err)
	_, err = d.Load(ctx, 1)
	require.ErrorIs(t, err, driver.ErrNoCheckpoint)
	for s := int64(1); s <= 4; s++ {
		require.NoError(t, d.Save(ctx, s*10, []byte{byte(s), 1, 2, 3}))
	}
	steps, err := d.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{40, 30}, steps, "newest first, only keep=2")
	b, err := d.Load(ctx, 40)
	require.NoError(t, err)
	require.Equal(t, []byte{4, 1, 2, 3}, b)
	// No temporary files left behind.
	entries, _ := os.ReadDir(d.Dir())
	require.Len(t, entries, 2)
}

func TestLocalDirDetectsTruncationAndBitFlips(t *testing.T) {
	ctx := context.Background()
	d, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	payload := make([]byte, 1000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	require.NoError(t, d.Save(ctx, 5, payload))
	path := d.path(5)
	good, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, n := range []int{0, 3, len(ckptMagic) + 2, len(good) / 2, len(good) - 1} {
		require.NoError(t, os.WriteFile(path, good[:n], 0o644))
		_, err := d.Load(ctx, 5)
		require.ErrorIs(t, err, driver.ErrCorruptCheckpoint, "truncated to %d", n)
	}
	for _, at := range []int{0, len(ckptMagic) + 6, len(good) - 500, len(good) - 1} {
		c := slices.Clone(good)
		c[at] ^= 0x10
		require.NoError(t, os.WriteFile(path, c, 0o644))
		_, err := d.Load(ctx, 5)
		require.True(t, errors.Is(err, driver.ErrCorruptCheckpoint), "flip at %d: %v", at, err)
	}
	// A file renamed to another step is refused too.
	require.NoError(t, os.WriteFile(filepath.Join(d.Dir(), "ckpt-00000000000000000006.etc"), good, 0o644))
	_, err = d.Load(ctx, 6)
	require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)
}

// Damaged files are set aside on Load (named *.corrupt, never listed
// again), and neither they nor checkpoints of later steps from another
// history make Save delete the checkpoints it writes (once every new
// checkpoint was pruned at once behind three garbage files of higher steps).
func TestLocalDirSetsDamageAsideAndPrunesOnlyOlderSteps(t *testing.T) {
	ctx := context.Background()
	d, err := NewLocalDir(t.TempDir(), 2)
	require.NoError(t, err)
	for _, s := range []int64{5000, 5200} {
		require.NoError(t, os.WriteFile(d.path(s), []byte("garbage under a checkpoint name"), 0o644))
	}
	// A valid checkpoint of a later step, from another history.
	other, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	require.NoError(t, other.Save(ctx, 9000, []byte("another history's newest")))
	b, err := os.ReadFile(other.path(9000))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(d.path(9000), b, 0o644))

	require.NoError(t, d.Save(ctx, 200, []byte("a")))
	require.NoError(t, d.Save(ctx, 400, []byte("b")))
	require.NoError(t, d.Save(ctx, 600, []byte("c")))
	steps, err := d.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{9000, 5200, 5000, 600, 400}, steps, "the newest 2 of this history are kept, later steps untouched")

	for _, s := range []int64{5200, 5000} {
		_, err := d.Load(ctx, s)
		require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)
		require.Contains(t, err.Error(), "set aside")
		_, err = os.Stat(d.path(s) + ".corrupt")
		require.NoError(t, err, "kept for inspection")
	}
	steps, err = d.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{9000, 600, 400}, steps)
	b, err = d.Load(ctx, 600)
	require.NoError(t, err)
	require.Equal(t, []byte("c"), b)
}

// A file of any size under a checkpoint name is judged by its header and
// manifest before anything of its size is read (a sparse terabyte once
// killed every rank 0 in turn with an out-of-memory error).
func TestLocalDirRefusesFilesWhoseSizeTheManifestDoesNotGive(t *testing.T) {
	ctx := context.Background()
	d, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	require.NoError(t, d.Save(ctx, 7, []byte("payload")))
	good, err := os.ReadFile(d.path(7))
	require.NoError(t, err)

	huge := d.path(9999)
	f, err := os.Create(huge)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<40)) // sparse: no disk used
	require.NoError(t, f.Close())
	_, err = d.Load(ctx, 9999)
	require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)

	padded := append(slices.Clone(good), make([]byte, 1<<20)...)
	require.NoError(t, os.WriteFile(d.path(8), padded, 0o644))
	_, err = d.Load(ctx, 8)
	require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)

	f, err = os.Create(d.path(10))
	require.NoError(t, err)
	_, err = f.Write(good[:len(good)-len("payload")]) // a real header and manifest...
	require.NoError(t, err)
	require.NoError(t, f.Truncate(1<<40)) // ...in front of a terabyte
	require.NoError(t, f.Close())
	_, err = d.Load(ctx, 10)
	require.ErrorIs(t, err, driver.ErrCorruptCheckpoint)
}

func FuzzParseCheckpoint(f *testing.F) {
	d, _ := NewLocalDir(f.TempDir(), 0)
	_ = d.Save(context.Background(), 1, []byte("payload"))
	good, _ := os.ReadFile(d.path(1))
	f.Add(good)
	f.Add([]byte(ckptMagic + "\xff\xff\xff\xff"))
	dir := f.TempDir()
	ld, err := NewLocalDir(dir, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseCheckpoint(b, 1)
		// The same bytes as a file, through Load: the size checks before
		// the payload is read, then the parse; and a file set aside when
		// damaged.
		d := ld
		if err := os.WriteFile(d.path(1), b, 0o644); err != nil {
			t.Fatal(err)
		}
		data, err := d.Load(context.Background(), 1)
		if err == nil {
			if want, perr := parseCheckpoint(b, 1); perr != nil || !bytes.Equal(want, data) {
				t.Fatalf("Load accepted what parseCheckpoint refuses (%v)", perr)
			}
		} else if !errors.Is(err, driver.ErrCorruptCheckpoint) {
			t.Fatalf("Load: %v, want driver.ErrCorruptCheckpoint", err)
		}
	})
}
