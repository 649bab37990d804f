package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/s3server"
	"github.com/elastictrain/elastictrain/trainer"
)

func payload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// Save, List and Load against the real server: payloads of no part, one
// part and several, a missing step, and keep-N pruning that removes every
// object of the pruned checkpoints.
func TestSaveListLoad(t *testing.T) {
	srv := s3server.Start(t)
	ctx := testCtx(t)
	st := newTestStore(t, testConfig(srv, "p"))
	data := map[int64][]byte{5: {}, 10: payload(1000, 1), 15: payload(5000, 2)}
	for _, s := range []int64{5, 10} {
		require.NoError(t, st.Save(ctx, s, data[s]))
	}
	steps, err := st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{10, 5}, steps)
	for _, s := range steps {
		got, err := st.Load(ctx, s)
		require.NoError(t, err)
		require.Equal(t, len(data[s]), len(got))
		require.True(t, bytes.Equal(data[s], got))
	}
	_, err = st.Load(ctx, 7)
	require.ErrorIs(t, err, trainer.ErrNoCheckpoint)

	// Keep 2: the third Save prunes step 5, manifest and parts.
	require.NoError(t, st.Save(ctx, 15, data[15]))
	steps, err = st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{15, 10}, steps)
	m, err := st.readManifest(ctx, 15)
	require.NoError(t, err)
	require.Len(t, m.Parts, 5, "5000 bytes in parts of 1 KiB")
	for _, n := range objects(t, srv, "p") {
		s, _, isPart := parsePartName(n)
		ms, isMan := parseManifestName(n)
		require.True(t, (isPart && s >= 10) || (isMan && ms >= 10), "object %s is left", n)
	}
	// A later checkpoint of another history is left alone by pruning.
	require.NoError(t, st.Save(ctx, 3, payload(10, 3)))
	steps, err = st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{15, 10, 3}, steps)
}

// Load verifies every part: a damaged byte, a missing part, a truncated
// manifest are ErrCorruptCheckpoint, and the damaged checkpoint's manifest
// is set aside so that List no longer returns it.
func TestLoadVerifiesEveryPart(t *testing.T) {
	srv := s3server.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "v/")
	cfg.Keep = 0
	st := newTestStore(t, cfg)
	for s := int64(1); s <= 4; s++ {
		require.NoError(t, st.Save(ctx, s, payload(3000, uint64(s))))
	}
	file := func(name string) string { return filepath.Join(srv.Root, testBucket, "v", filepath.FromSlash(name)) }

	// Step 4: one byte of its second part flipped on the server's disk.
	m, err := st.readManifest(ctx, 4)
	require.NoError(t, err)
	b, err := os.ReadFile(file(m.Parts[1].Name))
	require.NoError(t, err)
	b[100] ^= 1
	require.NoError(t, os.WriteFile(file(m.Parts[1].Name), b, 0o644))
	// Step 3: its last part deleted.
	m, err = st.readManifest(ctx, 3)
	require.NoError(t, err)
	require.NoError(t, os.Remove(file(m.Parts[len(m.Parts)-1].Name)))
	// Step 2: its manifest cut short (as written through the API).
	mb, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, st.put(ctx, manifestName(2), mb[:len(mb)/2]))

	// Step 1's manifest copied as step 5's, claiming its first part holds
	// an exabyte more: refused without reading or allocating it.
	m, err = st.readManifest(ctx, 1)
	require.NoError(t, err)
	m.Step, m.Size = 5, m.Size+1<<60
	m.Parts = append([]part(nil), m.Parts...)
	m.Parts[0].Size += 1 << 60
	for i := range m.Parts {
		m.Parts[i].Name = strings.Replace(m.Parts[i].Name, partsDir(1), partsDir(5), 1)
		b, err := os.ReadFile(file(strings.Replace(m.Parts[i].Name, partsDir(5), partsDir(1), 1)))
		require.NoError(t, err)
		require.NoError(t, st.put(ctx, m.Parts[i].Name, b))
	}
	mb, err = json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, st.put(ctx, manifestName(5), mb))

	for _, s := range []int64{5, 4, 3, 2} {
		_, err := st.Load(ctx, s)
		require.ErrorIs(t, err, trainer.ErrCorruptCheckpoint, "step %d", s)
		require.Contains(t, err.Error(), "set aside", "step %d", s)
		t.Logf("step %d: %v", s, err)
	}
	steps, err := st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{1}, steps, "the damaged checkpoints are no longer listed")
	got, err := st.Load(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, payload(3000, 1), got)
	aside, err := st.names(ctx, corruptDir, true)
	require.NoError(t, err)
	require.Len(t, aside, 4)
}

// A Save of a step that is already published, cut short by the server's
// death after some of its parts, leaves the published checkpoint of that
// step whole; CleanTemp then removes the orphaned parts, and only those.
func TestServerDeathMidResaveKeepsThePublishedOne(t *testing.T) {
	srv := s3server.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "r")
	cfg.Parallel = 1
	st := newTestStore(t, cfg)
	old := payload(4000, 9)
	require.NoError(t, st.Save(ctx, 20, old))
	st.afterPart = func(_ int64, i int) {
		if i == 1 {
			srv.Kill()
		}
	}
	err := st.Save(ctx, 20, payload(4000, 10))
	require.Error(t, err)
	require.Contains(t, err.Error(), "nothing published")
	st.afterPart = nil
	srv.Restart()

	got, err := st.Load(ctx, 20)
	require.NoError(t, err)
	require.Equal(t, old, got)
	before := objects(t, srv, "r")
	removed, err := st.CleanTemp(ctx)
	require.NoError(t, err)
	require.Len(t, removed, 2, "the two parts written before the server died")
	after := objects(t, srv, "r")
	require.Len(t, after, len(before)-2)
	for _, n := range removed {
		require.NotContains(t, after, n)
	}
	got, err = st.Load(ctx, 20)
	require.NoError(t, err)
	require.Equal(t, old, got)
}

// A manifest is trusted only when it is complete and consistent.
func TestDecodeManifest(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	good := manifest{Format: manifestFormat, Step: 7, Size: 3, SHA256: sum, Parts: []part{
		{Name: partName(7, "t", 0), Size: 2, SHA256: sum}, {Name: partName(7, "t", 1), Size: 1, SHA256: sum}}}
	enc := func(m manifest) []byte {
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return b
	}
	_, err := decodeManifest(enc(good), 7)
	require.NoError(t, err)
	for name, mut := range map[string]func(m *manifest) []byte{
		"other step":       func(m *manifest) []byte { return enc(*m) }, // decoded as step 8 below
		"other format":     func(m *manifest) []byte { m.Format = "x"; return enc(*m) },
		"parts too short":  func(m *manifest) []byte { m.Size = 4; return enc(*m) },
		"part too large":   func(m *manifest) []byte { m.Parts[0].Size = 9; return enc(*m) },
		"empty part":       func(m *manifest) []byte { m.Parts[1].Size = 0; m.Size = 2; return enc(*m) },
		"foreign part":     func(m *manifest) []byte { m.Parts[0].Name = partName(6, "t", 0); return enc(*m) },
		"escaping part":    func(m *manifest) []byte { m.Parts[0].Name = partsDir(7) + "../../x"; return enc(*m) },
		"bad checksum":     func(m *manifest) []byte { m.Parts[1].SHA256 = "zz"; return enc(*m) },
		"truncated":        func(m *manifest) []byte { b := enc(*m); return b[:len(b)-1] },
		"trailing data":    func(m *manifest) []byte { return append(enc(*m), '{', '}') },
		"unknown field":    func(m *manifest) []byte { b := enc(*m); return append([]byte(`{"x":1,`), b[1:]...) },
		"negative size":    func(m *manifest) []byte { m.Size = -1; m.Parts = nil; return enc(*m) },
		"payload checksum": func(m *manifest) []byte { m.SHA256 = ""; return enc(*m) },
	} {
		m := good
		m.Parts = append([]part(nil), good.Parts...)
		step := int64(7)
		if name == "other step" {
			step = 8
		}
		_, err := decodeManifest(mut(&m), step)
		require.ErrorIs(t, err, trainer.ErrCorruptCheckpoint, name)
	}
}

func TestNames(t *testing.T) {
	s, ok := parseManifestName(manifestName(1234))
	require.True(t, ok)
	require.Equal(t, int64(1234), s)
	for _, bad := range []string{"ckpt-1234.manifest", "ckpt-0000000000000000001x.manifest", "ckpt-99999999999999999999.manifest", "x" + manifestName(1)} {
		_, ok := parseManifestName(bad)
		require.False(t, ok, bad)
	}
	s, tok, ok := parsePartName(partName(42, "abc", 3))
	require.True(t, ok)
	require.Equal(t, int64(42), s)
	require.Equal(t, "abc", tok)
	_, _, ok = parsePartName(manifestName(42))
	require.False(t, ok)
}

// Bad settings are refused with ErrInvalidConfig before any request; a
// missing bucket and wrong credentials are found by New.
func TestConfig(t *testing.T) {
	base := DefaultConfig()
	base.Endpoint, base.Bucket, base.AccessKey, base.SecretKey = "127.0.0.1:1", "b", "a", "s"
	require.NoError(t, base.Validate())
	for name, mut := range map[string]func(c *Config){
		"scheme":       func(c *Config) { c.Endpoint = "http://x:1" },
		"no endpoint":  func(c *Config) { c.Endpoint = "" },
		"no bucket":    func(c *Config) { c.Bucket = "" },
		"no secret":    func(c *Config) { c.SecretKey = "" },
		"abs prefix":   func(c *Config) { c.Prefix = "/a" },
		"keep":         func(c *Config) { c.Keep = -1 },
		"small part":   func(c *Config) { c.PartSize = 10 },
		"huge part":    func(c *Config) { c.PartSize = 6 << 30 },
		"parallel":     func(c *Config) { c.Parallel = 0 },
		"zero retries": func(c *Config) { c.MaxRetries = 0 },
	} {
		c := base
		mut(&c)
		require.ErrorIs(t, c.Validate(), trainer.ErrInvalidConfig, name)
		_, err := New(context.Background(), c)
		require.ErrorIs(t, err, trainer.ErrInvalidConfig, name)
	}

	srv := s3server.Start(t)
	ctx := testCtx(t)
	cfg := testConfig(srv, "")
	cfg.CreateBucket = false
	cfg.Bucket = "missing"
	_, err := New(ctx, cfg)
	require.ErrorContains(t, err, "does not exist")
	cfg = testConfig(srv, "")
	cfg.SecretKey = "wrong-secret-key-0123456789"
	_, err = New(ctx, cfg)
	require.Error(t, err)
	t.Logf("wrong secret: %v", err)
}

// Pruning deletes a checkpoint's manifest before its parts: a server that
// dies between the two leaves the pruned checkpoint unlisted (never listed
// with parts missing), the kept ones whole, and parts that CleanTemp
// removes.
func TestServerDeathMidPrune(t *testing.T) {
	srv := s3server.Start(t)
	ctx := testCtx(t)
	st := newTestStore(t, testConfig(srv, "q")) // Keep 2
	for s := int64(1); s <= 2; s++ {
		require.NoError(t, st.Save(ctx, s, payload(3000, uint64(s))))
	}
	st.afterUnpublish = func(int64) { srv.Kill() }
	err := st.Save(ctx, 3, payload(3000, 3))
	require.ErrorContains(t, err, "published, but cleaning up failed")
	st.afterUnpublish = nil
	srv.Restart()

	steps, err := st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{3, 2}, steps)
	for _, s := range steps {
		got, err := st.Load(ctx, s)
		require.NoError(t, err)
		require.Equal(t, payload(3000, uint64(s)), got)
	}
	removed, err := st.CleanTemp(ctx)
	require.NoError(t, err)
	require.Len(t, removed, 3, "step 1's three parts")
	for _, n := range removed {
		s, _, ok := parsePartName(n)
		require.True(t, ok && s == 1, n)
	}
}
