package trainer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/worker"
)

// The errors a platform branches on are package worker's, so launch tells
// them apart without importing the trainer, and users' errors.Is on the
// trainer's names keeps working.
func TestTheTrainersExitErrorsAreThoseOfPackageWorker(t *testing.T) {
	for mine, theirs := range map[error]error{
		trainer.ErrInvalidConfig: worker.ErrInvalidConfig, trainer.ErrShapeMismatch: worker.ErrShapeMismatch,
		trainer.ErrModelMismatch: worker.ErrModelMismatch, trainer.ErrSettingsMismatch: worker.ErrSettingsMismatch,
		trainer.ErrForeignCheckpoint: worker.ErrForeignCheckpoint, trainer.ErrFinishedCheckpoint: worker.ErrFinishedCheckpoint,
		trainer.ErrCheckpoint: worker.ErrCheckpoint, trainer.ErrPreempted: worker.ErrPreempted, trainer.ErrReleased: worker.ErrReleased,
	} {
		require.ErrorIs(t, fmt.Errorf("run: %w", mine), theirs)
	}
	require.NotErrorIs(t, trainer.ErrReleased, worker.ErrPreempted)

	// ErrRefused matches a settings error only when the job refused this
	// worker (Refused names it), not when every member stopped.
	stopped := &trainer.SettingsError{Round: 2, Diffs: []trainer.SettingDiff{{Setting: "epochs"}}}
	refused := &trainer.SettingsError{Round: 2, Refused: []string{"m1"}, Diffs: []trainer.SettingDiff{{Setting: "epochs"}}}
	require.False(t, errors.Is(fmt.Errorf("run: %w", stopped), worker.ErrRefused))
	require.ErrorIs(t, fmt.Errorf("run: %w", refused), worker.ErrRefused)
	require.ErrorIs(t, refused, trainer.ErrSettingsMismatch)
	require.False(t, errors.Is(refused, trainer.ErrModelMismatch), "epochs differ, not the model")
}

func TestConfigureJobTakesTheJobsPartOnly(t *testing.T) {
	cfg := trainer.DefaultConfig()
	before := cfg
	cfg.ConfigureJob(worker.Settings{})
	require.Equal(t, before.JobID, cfg.JobID, "an empty Settings changes nothing")
	require.Equal(t, before.GracePeriod, cfg.GracePeriod)
	require.Nil(t, cfg.Autoscale.Platform)

	secret := []byte("a secret of 16 b")
	cfg.GracePeriod = time.Minute
	cfg.ConfigureJob(worker.Settings{JobID: "job-9", Secret: secret, GracePeriod: 8 * time.Second, Autoscale: true, ShareCores: 3})
	require.Equal(t, "job-9", cfg.JobID)
	require.Equal(t, secret, cfg.Sync.Secret)
	secret[0] = 'X'
	require.Equal(t, byte('a'), cfg.Sync.Secret[0], "the secret is copied")
	require.Equal(t, 8*time.Second, cfg.GracePeriod, "a longer grace period is lowered")
	require.True(t, cfg.Autoscale.Enabled)
	require.Equal(t, 3, cfg.ShareCores)

	cfg.GracePeriod, cfg.ShareCores = 2*time.Second, 1
	cfg.ConfigureJob(worker.Settings{GracePeriod: 8 * time.Second, ShareCores: 3})
	require.Equal(t, 2*time.Second, cfg.GracePeriod, "a shorter grace period is kept")
	require.Equal(t, 1, cfg.ShareCores, "a worker's own ShareCores is kept")
}
