package launch

import (
	"os/exec"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// With NoStore the launcher starts no store and checks none: the workers
// get an empty EnvStore (and WorkerEnv refuses it, so these fake workers
// exit 2), and the job reports no store.
func TestNoStoreStartsAndChecksNoStore(t *testing.T) {
	cfg := testConfig(1)
	cfg.NoStore, cfg.Redis = true, "127.0.0.1:1"
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig)
	cfg.Redis, cfg.StoreListen, cfg.MaxRestarts = "", "", 0
	var env []string
	res, err := Run(t.Context(), fakeSpec(t, "exit 0"), cfg, WithHooks(Hooks{Prepare: func(_ Process, cmd *exec.Cmd) error {
		env = slices.Clone(cmd.Env)
		return nil
	}}))
	require.Error(t, err) // WorkerEnv refused the empty store
	require.Empty(t, res.Store)
	require.Contains(t, env, EnvStore+"=")
}
