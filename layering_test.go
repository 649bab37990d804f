package elastictrain_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/elastictrain/elastictrain/"

// nonTestImports returns, for each package directory under root, the
// import paths of its non-test files (as go list's Imports, for this
// GOOS), skipping testdata.
func nonTestImports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		p, err := build.Default.ImportDir(path, 0)
		if _, none := err.(*build.NoGoError); none {
			return nil
		}
		if err != nil {
			return err
		}
		out[filepath.ToSlash(path)] = p.Imports
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out)
	return out
}

// under reports whether imp is pkg or a package below it.
func under(imp, pkg string) bool {
	return imp == module+pkg || strings.HasPrefix(imp, module+pkg+"/")
}

// Issue #31: production plumbing under internal/ does not run back up into
// the public packages, and launch knows nothing of the trainer (the
// errors and interfaces the two share live in package worker, below
// both). Test files may import anything.
func TestImportsRunOneWay(t *testing.T) {
	for dir, imps := range nonTestImports(t, "internal") {
		for _, imp := range imps {
			for _, pkg := range []string{"trainer", "elastic", "sync", "dataloader", "launch"} {
				require.False(t, under(imp, pkg), "%s (non-test files) imports %s", dir, imp)
			}
		}
	}
	for dir, imps := range nonTestImports(t, "launch") {
		for _, imp := range imps {
			require.False(t, under(imp, "trainer"), "%s (non-test files) imports %s", dir, imp)
		}
	}
	// The Store SPI and the stores sit beneath elastic, as
	// database/sql/driver beneath database/sql.
	for _, imp := range nonTestImports(t, "elastic/store")["elastic/store"] {
		require.False(t, strings.HasPrefix(imp, module), "package elastic/store imports nothing of the module, not %s", imp)
	}
	for _, imp := range nonTestImports(t, "worker")["worker"] {
		require.False(t, strings.Contains(imp, "."), "package worker has the standard library only beneath it, not %s", imp)
	}
}
