package elastictrain_test

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Issue #31, must show 6: a worker written against the last release's
// README (testdata/release-2026-12-04: trainer, dataloader, launch,
// elastic, sync's parameter-server table specs and sparse optimizers,
// trainer/ps and dataloader/redisqueue, by the names that README used)
// builds unchanged against this checkout: the names that moved since are
// deprecated aliases and wrappers in their old places.
func TestLastReleasesWorkerBuildsUnchanged(t *testing.T) {
	gobin, err := exec.LookPath("go") // go test puts its own toolchain first in PATH
	require.NoError(t, err)
	build := exec.CommandContext(t.Context(), gobin, "build", "-o", filepath.Join(t.TempDir(), "worker"), "./testdata/release-2026-12-04")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building the last release's worker:\n%s", out)
}
