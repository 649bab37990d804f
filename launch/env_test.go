package launch

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer"
)

func envMap(kvs []string) func(string) string {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

func TestWorkerEnvRoundTrip(t *testing.T) {
	w := Worker{Store: "127.0.0.1:6379", JobID: "my-job", Secret: []byte("0123456789abcdef0123"), Index: 3, Workers: 4,
		Restart: 2, GracePeriod: 1500 * time.Millisecond}
	got, err := workerFrom(envMap(w.environ()))
	require.NoError(t, err)
	require.Equal(t, w, got)
	w.ShareCores = 8
	got, err = workerFrom(envMap(w.environ()))
	require.NoError(t, err)
	require.Equal(t, w, got)
}

func TestWorkerEnvNamesTheBadVariable(t *testing.T) {
	good := Worker{Store: "h:1", JobID: "j", Secret: make([]byte, 16), Index: 0, Workers: 1, GracePeriod: time.Second}.environ()
	with := func(name, value string) []string {
		out := []string{}
		for _, kv := range good {
			if !strings.HasPrefix(kv, name+"=") {
				out = append(out, kv)
			}
		}
		return append(out, name+"="+value)
	}
	cases := []struct {
		env  []string
		want string
	}{
		{with(EnvStore, ""), EnvStore},
		{with(EnvSecret, "zz"), EnvSecret + " must hold the job secret"},
		{with(EnvSecret, "00ff"), EnvSecret + " must hold the job secret"},
		{with(EnvWorker, "-1"), EnvWorker + `="-1": want a whole number >= 0`},
		{with(EnvWorker, "x"), EnvWorker},
		{with(EnvWorkers, "0"), EnvWorkers + `="0": want a whole number >= 1`},
		{with(EnvRestart, ""), EnvRestart},
		{with(EnvGracePeriod, "30"), EnvGracePeriod},
		{with(EnvGracePeriod, "-1s"), EnvGracePeriod},
	}
	for _, c := range cases {
		_, err := workerFrom(envMap(c.env))
		require.ErrorContains(t, err, c.want)
		require.False(t, errors.Is(err, ErrNotLaunched))
	}
	// The secret itself never shows in an error.
	_, err := workerFrom(envMap(with(EnvSecret, "0011223344556677889900112233445566778899zz")))
	require.NotContains(t, err.Error(), "0011223344")

	_, err = workerFrom(envMap(with(EnvJobID, "")))
	require.ErrorIs(t, err, ErrNotLaunched)
}

func TestWorkerEnvOutsideALauncher(t *testing.T) {
	t.Setenv(EnvJobID, "")
	require.False(t, Launched())
	_, err := WorkerEnv()
	require.ErrorIs(t, err, ErrNotLaunched)
}

func TestConfigureSetsTheJobsPartOfATrainerConfig(t *testing.T) {
	w := Worker{Store: "h:1", JobID: "job-7", Secret: []byte("a secret of 16 b"), GracePeriod: 30 * time.Second}
	cfg := trainer.DefaultConfig()
	cfg.Epochs = 5
	w.Configure(&cfg)
	require.Equal(t, "job-7", cfg.JobID)
	require.Equal(t, w.Secret, cfg.Sync.Secret)
	cfg.Sync.Secret[0] = 'X' // a copy
	require.Equal(t, byte('a'), w.Secret[0])
	require.Equal(t, 25*time.Second, cfg.GracePeriod, "the trainer gets the grace period minus 5 s")
	require.Equal(t, 5, cfg.Epochs, "the rest stays the caller's")
	require.NoError(t, cfg.Validate())

	cfg.GracePeriod = 3 * time.Second
	w.Configure(&cfg)
	require.Equal(t, 3*time.Second, cfg.GracePeriod, "a shorter grace period is kept")
	require.False(t, cfg.Autoscale.Enabled, "no -autoscale: the trainer does not size the job")
	require.Nil(t, cfg.Autoscale.Platform, "no control socket: no platform")

	// With the launcher's control socket and -autoscale, the trainer
	// decides and the socket enacts; the policy's knobs stay the caller's.
	w.Control, w.Autoscale = filepath.Join(t.TempDir(), "control.sock"), true
	cfg.Autoscale.DecisionInterval = 7
	w.Configure(&cfg)
	require.True(t, cfg.Autoscale.Enabled)
	require.NotNil(t, cfg.Autoscale.Platform)
	require.Equal(t, 7, cfg.Autoscale.DecisionInterval)
	require.NoError(t, cfg.Validate())
	require.Zero(t, cfg.ShareCores, "no EnvShareCores: GOMAXPROCS is left alone")
	w.ShareCores = 2
	w.Configure(&cfg)
	require.Equal(t, 2, cfg.ShareCores, "the trainer divides the host's cores by the round's members on it")
}

func TestTrainerGracePeriodLeavesTimeToExit(t *testing.T) {
	for g, want := range map[time.Duration]time.Duration{
		30 * time.Second:       25 * time.Second,
		10 * time.Second:       8 * time.Second,
		time.Second:            800 * time.Millisecond,
		2 * time.Minute:        115 * time.Second,
		100 * time.Millisecond: 80 * time.Millisecond,
	} {
		require.Equal(t, want, TrainerGracePeriod(g), "grace %v", g)
	}
}

func TestExitStatusOfErrors(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{nil, 0},
		{trainer.ErrPreempted, 143},
		{fmt.Errorf("run: %w", trainer.ErrPreempted), 143},
		{fmt.Errorf("%w, but its checkpoint was not written: %w", trainer.ErrPreempted, trainer.ErrCheckpoint), 1},
		{trainer.ErrFailureBudget, 1},
		{ErrPreempted, 143},
		{trainer.ErrReleased, 143}, // a graceful leave by a scaling decision: not restarted
		{fmt.Errorf("run: %w", trainer.ErrReleased), 143},
		{fmt.Errorf("%w: worker 1 exited with status 2", ErrFailed), 1},
		{errors.New("anything"), 1},
	}
	for _, c := range cases {
		require.Equal(t, c.want, ExitStatus(c.err), "%v", c.err)
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	cases := []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Workers = 0 }, "Workers 0: want at least 1"},
		{func(c *Config) { c.Workers, c.MaxWorkers = 3, 2 }, "MaxWorkers 2 is below Workers 3"},
		{func(c *Config) { c.MaxRestarts = -1 }, "MaxRestarts -1"},
		{func(c *Config) { c.GracePeriod = 0 }, "GracePeriod 0s"},
		{func(c *Config) { c.StoreListen = "" }, "StoreListen is empty"},
		{func(c *Config) { c.Secret = []byte("short") }, "Secret of 5 bytes"},
		{func(c *Config) { c.JobID = "has space" }, "JobID: "},
		{func(c *Config) { c.JobID = "a{b}" }, "JobID: "},
		{func(c *Config) { c.GOMAXPROCS = -2 }, "GOMAXPROCS -2"},
	}
	for _, c := range cases {
		cfg := DefaultConfig()
		c.edit(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, c.want)
	}
	cfg := DefaultConfig()
	cfg.Redis, cfg.StoreListen = "127.0.0.1:6379", ""
	require.NoError(t, cfg.Validate(), "no embedded store, no listen address needed")
}

func TestSpecValidate(t *testing.T) {
	require.ErrorIs(t, Spec{}.Validate(), ErrInvalidConfig)
	require.ErrorContains(t, Spec{Command: []string{""}}.Validate(), "Spec.Command is empty")
	err := Spec{Command: []string{"no-such-program-of-elastictrain"}}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "no-such-program-of-elastictrain")
	require.NoError(t, Spec{Command: []string{"sh", "-c", "true"}}.Validate())
}
