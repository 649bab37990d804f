// Command recovery-bench measures how fast an elastictrain job trains again
// after a worker is SIGKILLed: it launches -workers processes of a small
// linear-regression job on loopback, kills the worker holding rank 1 at
// -kill-at, and prints the time from the SIGKILL until the survivors
// complete their first step of the next round. It repeats -trials times.
//
//	go run ./examples/recovery-bench -workers 4 -trials 3 -json
//
// For reference, torchrun (PyTorch 1.13, defaults) takes 4.7 s with 2
// workers and 7.1 s with 4 from a kill until training again on this kind of
// machine.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/examples/internal/launcher"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

type config struct {
	workers, trials int
	killAt          int64
	redis, job      string
	lease           time.Duration
	stepDelay       time.Duration
	json            bool
}

func parse(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("recovery-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.workers, "workers", 4, "worker processes (at least 2)")
	fs.IntVar(&c.trials, "trials", 3, "kills to measure, one job each")
	fs.Int64Var(&c.killAt, "kill-at", 100, "global step at which rank 1 is SIGKILLed")
	fs.StringVar(&c.redis, "redis", "", "Redis address (default: an embedded Redis-protocol server)")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "member lease TTL (failure detection without a report)")
	fs.DurationVar(&c.stepDelay, "step", 5*time.Millisecond, "simulated compute time per step")
	fs.BoolVar(&c.json, "json", false, "print one JSON object per trial and a summary")
	fs.StringVar(&c.job, "job", "", "job ID (set by the launcher for workers)")
	if err := jobenv.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	switch {
	case c.workers < 2:
		return nil, fmt.Errorf("-workers %d: want at least 2", c.workers)
	case c.trials < 1:
		return nil, fmt.Errorf("-trials %d: want at least 1", c.trials)
	case c.killAt < 2:
		return nil, fmt.Errorf("-kill-at %d: want at least 2", c.killAt)
	case c.lease < 100*time.Millisecond:
		return nil, fmt.Errorf("-lease %v: want at least 100ms", c.lease)
	case c.stepDelay < 0:
		return nil, fmt.Errorf("-step %v: want >= 0", c.stepDelay)
	}
	return c, nil
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	return jobenv.Run("recovery-bench", stderr, err,
		func() int {
			if err := worker(c); err != nil {
				fmt.Fprintf(stderr, "recovery-bench worker: %v\n", err)
				return 1
			}
			return 0
		},
		func(ctx context.Context) error { return bench(ctx, c, stdout, stderr) })
}

// Trial is one measured kill.
type Trial struct {
	Workers         int     `json:"workers"`
	RecoverySeconds float64 `json:"recovery_seconds"`
	KilledAtStep    int64   `json:"killed_at_step"`
	Rounds          int     `json:"rounds"`
}

func bench(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	store, err := jobenv.OpenStore(ctx, c.redis)
	if err != nil {
		return err
	}
	defer store.Close()
	c.redis = store.Addr
	var all []float64
	for i := range c.trials {
		job := jobenv.NewJobID("recovery-bench")
		args := []string{"-redis", c.redis, "-job", job, "-lease", c.lease.String(), "-step", c.stepDelay.String(),
			"-kill-at", fmt.Sprint(c.killAt), "-workers", fmt.Sprint(c.workers)}
		sum, err := launcher.Run(ctx, launcher.Spec{
			Workers: c.workers, Args: args, Quiet: true, Log: io.Discard,
			Store: c.redis, JobID: job,
			Faults: []launcher.Fault{{Kind: launcher.Kill, Rank: 1, Step: c.killAt}},
		})
		if err != nil {
			return fmt.Errorf("trial %d: %w", i, err)
		}
		if len(sum.Recoveries) != 1 {
			return fmt.Errorf("trial %d: %d recoveries measured, want 1", i, len(sum.Recoveries))
		}
		tr := Trial{Workers: c.workers, RecoverySeconds: sum.Recoveries[0], KilledAtStep: c.killAt, Rounds: len(sum.Rounds)}
		all = append(all, tr.RecoverySeconds)
		if c.json {
			b, _ := json.Marshal(tr)
			fmt.Fprintln(stdout, string(b))
		} else {
			fmt.Fprintf(stdout, "trial %d: %d workers, SIGKILL at step %d -> training again after %.3f s\n", i, c.workers, c.killAt, tr.RecoverySeconds)
		}
	}
	slices.Sort(all)
	med := all[len(all)/2]
	if c.json {
		b, _ := json.Marshal(map[string]any{"summary": true, "workers": c.workers, "trials": len(all),
			"median_recovery_seconds": med, "max_recovery_seconds": all[len(all)-1], "store": store.Desc})
		fmt.Fprintln(stdout, string(b))
	} else {
		fmt.Fprintf(stdout, "median %.3f s, max %.3f s over %d trials (%d workers, store %s)\n", med, all[len(all)-1], len(all), c.workers, store.Desc)
	}
	return nil
}

// worker trains linear regression until a few hundred steps after the kill.
func worker(c *config) error {
	ev := launcher.NewEmitter()
	secret, err := jobenv.Secret()
	if err != nil {
		return err
	}
	const batch = 16
	samples := int(c.killAt+200) * batch
	prob := trainertest.NewProblem(samples, 8, 0.05, 1)
	model := trainertest.NewModel(8)
	model.StepDelay = c.stepDelay
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch = batch
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	if err != nil {
		return err
	}
	defer loader.Close()
	client := redis.NewClient(&redis.Options{Addr: c.redis})
	defer client.Close()
	cfg := trainer.DefaultConfig()
	cfg.JobID = c.job
	cfg.Sync.Secret = secret
	cfg.Elastic.MinWorkers = c.workers - 1
	cfg.Elastic.LeaseTTL = c.lease
	cfg.Elastic.HeartbeatInterval = c.lease / 6
	cfg.Elastic.LastCall = time.Second
	tr, err := trainer.New(model.Params(), trainer.NewSGD(0.1), loader, model.Step, elastic.NewRedisStore(client), cfg,
		trainer.WithHooks(trainer.Hooks{
			OnRound: func(r trainer.RoundInfo) {
				ev.Emit(launcher.Event{Ev: "round", Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step, Recovery: r.Recovery})
			},
			OnStep: func(s trainer.StepInfo) {
				if s.Rank == 0 {
					ev.Emit(launcher.Event{Ev: "step", Round: s.Round, Rank: 0, WorldSize: s.WorldSize, Step: s.Step, Samples: s.Samples})
				}
			},
		}))
	if err != nil {
		return err
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		return err
	}
	ev.Emit(launcher.Event{Ev: "done", Step: res.Step})
	return nil
}
