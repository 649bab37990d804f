package launch

import (
	"context"
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A second launcher started with the job ID of a running job on the same
// Redis drew its own job secret, so its workers were strangers to the
// running job: some 150 WARN lines and 8 re-formed rounds in the healthy
// job, and nothing said why. Now the second launcher is refused before any
// worker starts, with ErrJobInUse naming the job ID and what to do; the
// running job never sees a stranger (it trains on in its one round), and
// its mark is gone once it is over, so the job ID can be launched again
// at once.
func TestASecondLauncherOfARunningJobIDIsRefused(t *testing.T) {
	bin := buildWorker(t, t.TempDir())
	out, lines := outputLines(t)
	cfg := DefaultConfig()
	cfg.Workers = 2
	cfg.Redis, cfg.JobID = testredis.Addr(t), testredis.JobID(t)
	first, err := Start(context.Background(), Spec{Command: []string{bin, "-epochs", "100000", "-min", "2"},
		Stdout: out, Stderr: os.Stderr}, cfg)
	require.NoError(t, err)
	defer first.Kill()
	evs := collect(t, lines, func(e workerEvent) bool { return e.Ev == "step" && e.WorldSize == 2 && e.Step >= 5 })

	second, err := Start(context.Background(), Spec{Command: []string{bin, "-epochs", "1", "-min", "2"},
		Stdout: io.Discard, Stderr: os.Stderr}, cfg) // another secret: drawn, as every launcher's
	require.ErrorIs(t, err, ErrJobInUse)
	require.Nil(t, second, "no worker of the second launcher started")
	require.ErrorContains(t, err, "job "+cfg.JobID+" is running on the store "+cfg.Redis)
	require.ErrorContains(t, err, "another job secret")
	require.ErrorContains(t, err, "pass another job ID, or stop that launcher first")
	require.ErrorContains(t, err, "on host ", "it names the other launcher")

	// The running job trains on in the round it had: nobody joined it.
	var round uint64
	for _, e := range evs {
		if e.Ev == "round" {
			round = max(round, e.Round)
		}
	}
	require.NotZero(t, round)
	at := evs[len(evs)-1].Step
	evs = collect(t, lines, func(e workerEvent) bool { return e.Ev == "step" && e.Step >= at+20 })
	for _, e := range evs {
		if e.Ev == "round" {
			require.Equal(t, round, e.Round, "a round was re-formed after the second launcher: %+v", e)
		}
	}
	first.Stop(syscall.SIGTERM)
	_, err = first.Wait()
	require.ErrorIs(t, err, ErrPreempted)
	out.Close()
	for range lines {
	}

	// Its mark left with it (the key store.Redis.Mark documents).
	c := redis.NewClient(&redis.Options{Addr: cfg.Redis})
	defer c.Close()
	markKey := store.KeyPrefix + "{" + cfg.JobID + "}:launcher"
	require.ErrorIs(t, c.Get(context.Background(), markKey).Err(), redis.Nil, "the mark is deleted when the job is over")
}

// Launchers that share the job secret (EnvSecret given to each, on several
// hosts) share the job's mark; another secret is refused while they hold
// it, and takes the job ID once they released it.
func TestLaunchersOfOneSecretShareTheMark(t *testing.T) {
	addr, job := testredis.Addr(t), testredis.JobID(t)
	ctx := context.Background()
	a, err := claimMark(ctx, addr, job, []byte("the job's secret, 32 bytes long."), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	b, err := claimMark(ctx, addr, job, []byte("the job's secret, 32 bytes long."), slog.New(slog.DiscardHandler))
	require.NoError(t, err, "the same secret shares the job")
	_, err = claimMark(ctx, addr, job, []byte("another secret, also 32 bytes..."), slog.New(slog.DiscardHandler))
	require.ErrorIs(t, err, ErrJobInUse)
	b.release()
	a.release()
	c, err := claimMark(ctx, addr, job, []byte("another secret, also 32 bytes..."), slog.New(slog.DiscardHandler))
	require.NoError(t, err, "free once both released it")
	c.release()
}
