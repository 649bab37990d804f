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
// machine, and more when the machine is busy; torchrun_recovery.py beside
// this file measures it the same way.
//
// With -idle-conns N it then repeats the trials while a flood of N silent
// TCP connections from -idle-from (another loopback address by default)
// is held open on the peer port of the worker holding rank 0, reopening
// each one the worker closes, and prints both medians:
//
//	go run ./examples/recovery-bench -trials 5 -idle-conns 10000
//	go run ./examples/recovery-bench -trials 5 -idle-conns 10000 -idle-from 127.0.0.1 -local-sockets=false
//
// The second form makes the flood share 127.0.0.1 with the job's own peers
// (which then talk over loopback TCP, not Unix sockets), so the worker
// cannot tell them apart by address. The bench needs N+1024 open files
// (ulimit -n); it raises its soft limit up to the hard one.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/faults"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

type config struct {
	workers, trials int
	killAt          int64
	redis, job      string
	lease           time.Duration
	stepDelay       time.Duration
	json            bool
	idleConns       int
	idleFrom        string
	idleSettle      time.Duration
	localSockets    bool
	extraSteps      int64
	floodTo         string
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
	fs.IntVar(&c.idleConns, "idle-conns", 0, "also measure with this many silent connections held open on rank 0's peer port")
	fs.StringVar(&c.idleFrom, "idle-from", "127.0.0.2", "local address the silent connections come from")
	fs.DurationVar(&c.idleSettle, "idle-settle", time.Second, "how long the flood stands, all connections open, before the kill")
	fs.BoolVar(&c.localSockets, "local-sockets", true, "peers on this host talk over Unix sockets (false: loopback TCP)")
	fs.Int64Var(&c.extraSteps, "extra-steps", 0, "steps the job has beyond kill-at+200 (set by the bench for workers)")
	fs.StringVar(&c.floodTo, "flood-to", "", "run as the bench's flood process against this address (set by the bench)")
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
	case c.idleConns < 0:
		return nil, fmt.Errorf("-idle-conns %d: want >= 0", c.idleConns)
	case net.ParseIP(c.idleFrom) == nil:
		return nil, fmt.Errorf("-idle-from %q: want an IP address", c.idleFrom)
	case c.idleSettle < 0:
		return nil, fmt.Errorf("-idle-settle %v: want >= 0", c.idleSettle)
	case c.extraSteps < 0:
		return nil, fmt.Errorf("-extra-steps %d: want >= 0", c.extraSteps)
	}
	return c, nil
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stderr)
	if err == nil && c.floodTo != "" {
		return floodMain(c, stdout, stderr)
	}
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
	// With a flood: its size and source, how many of its connections were
	// open when the kill was let through, and how many it had opened by
	// then (reopening those the worker closed) and failed to open.
	IdleConns   int    `json:"idle_conns,omitempty"`
	IdleFrom    string `json:"idle_from,omitempty"`
	IdleOpen    int64  `json:"idle_open_at_kill,omitempty"`
	IdleOpened  int64  `json:"idle_opened_before_kill,omitempty"`
	IdleFailed  int64  `json:"idle_dials_failed_before_kill,omitempty"`
	LocalSocket bool   `json:"local_sockets"`
}

func bench(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	if c.idleConns > 0 {
		if err := checkFiles(c.idleConns); err != nil {
			return err
		}
	}
	srv, err := jobenv.OpenStore(ctx, c.redis)
	if err != nil {
		return err
	}
	defer srv.Close()
	c.redis = srv.Addr
	phases := []int{0}
	if c.idleConns > 0 {
		phases = append(phases, c.idleConns)
	}
	// Trials alternate between the phases, so that a change in the load of
	// the machine weighs on both alike.
	all := map[int][]float64{}
	for i := range c.trials {
		for _, idle := range phases {
			tr, err := trial(ctx, c, idle)
			if err != nil {
				return fmt.Errorf("trial %d: %w", i, err)
			}
			all[idle] = append(all[idle], tr.RecoverySeconds)
			if c.json {
				b, _ := json.Marshal(tr)
				fmt.Fprintln(stdout, string(b))
			} else if idle == 0 {
				fmt.Fprintf(stdout, "trial %d: %d workers, SIGKILL at step %d -> training again after %.3f s\n", i, c.workers, tr.KilledAtStep, tr.RecoverySeconds)
			} else {
				fmt.Fprintf(stdout, "trial %d: %d workers, %d silent connections from %s on rank 0 (%d open at the kill, %d opened by then), SIGKILL at step >= %d -> training again after %.3f s\n",
					i, c.workers, idle, c.idleFrom, tr.IdleOpen, tr.IdleOpened, tr.KilledAtStep, tr.RecoverySeconds)
			}
		}
	}
	medians := map[int]float64{}
	for _, idle := range phases {
		rs := all[idle]
		slices.Sort(rs)
		med := rs[len(rs)/2]
		medians[idle] = med
		if c.json {
			b, _ := json.Marshal(map[string]any{"summary": true, "workers": c.workers, "trials": len(rs), "idle_conns": idle,
				"median_recovery_seconds": med, "max_recovery_seconds": rs[len(rs)-1], "store": srv.Desc})
			fmt.Fprintln(stdout, string(b))
		} else {
			what := "undisturbed"
			if idle > 0 {
				what = fmt.Sprintf("with %d silent connections from %s", idle, c.idleFrom)
			}
			fmt.Fprintf(stdout, "%s: median %.3f s, max %.3f s over %d trials (%d workers, store %s)\n", what, med, rs[len(rs)-1], len(rs), c.workers, srv.Desc)
		}
	}
	if c.idleConns > 0 {
		ratio := medians[c.idleConns] / medians[0]
		if c.json {
			b, _ := json.Marshal(map[string]any{"comparison": true, "idle_conns": c.idleConns, "idle_from": c.idleFrom,
				"undisturbed_median_seconds": medians[0], "flooded_median_seconds": medians[c.idleConns], "ratio": ratio})
			fmt.Fprintln(stdout, string(b))
		} else {
			fmt.Fprintf(stdout, "flooded / undisturbed median recovery: %.3f s / %.3f s = %.2fx\n", medians[c.idleConns], medians[0], ratio)
		}
	}
	return nil
}

// trial runs one job and measures the recovery from its kill, with idle
// silent connections held on rank 0's peer port (none when idle is 0).
func trial(ctx context.Context, c *config, idle int) (Trial, error) {
	job := jobenv.NewJobID("recovery-bench")
	extra := int64(0)
	if idle > 0 {
		// The job outlasts setting up the flood (the trial ends at the
		// recovery): 5000 steps and one per ms of -idle-settle.
		extra = 5000 + c.idleSettle.Milliseconds()
	}
	args := []string{"-redis", c.redis, "-job", job, "-lease", c.lease.String(), "-step", c.stepDelay.String(),
		"-kill-at", fmt.Sprint(c.killAt), "-workers", fmt.Sprint(c.workers), "-extra-steps", fmt.Sprint(extra),
		fmt.Sprintf("-local-sockets=%v", c.localSockets)}
	kill := faults.Fault{Kind: faults.Kill, Rank: 1, Step: c.killAt}
	tr := Trial{Workers: c.workers, KilledAtStep: c.killAt, LocalSocket: c.localSockets}
	var fl *floodProc
	var onEvent func(launch.Event)
	var openAtKill, openedAtKill, failedAtKill atomic.Int64
	var gated gosync.WaitGroup
	fctx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	var floodErr error
	if idle > 0 {
		tr.IdleConns, tr.IdleFrom = idle, c.idleFrom
		gate := make(chan struct{})
		kill.After = gate // the kill waits until the flood stands
		onEvent = func(ev launch.Event) {
			if fl != nil || floodErr != nil || ev.Ev != "round" || ev.Rank != 0 || ev.Message == "" {
				return
			}
			fl, floodErr = startFloodProc(idle, c.idleFrom, ev.Message)
			if floodErr != nil {
				return
			}
			gated.Add(1)
			go func() {
				defer gated.Done()
				select {
				case <-fl.ready:
				case <-fl.exited:
					return
				case <-fctx.Done():
					return
				}
				t := time.NewTimer(c.idleSettle)
				defer t.Stop()
				select {
				case <-t.C:
					openAtKill.Store(fl.live.Load())
					openedAtKill.Store(fl.opened.Load())
					failedAtKill.Store(fl.failures.Load())
					close(gate)
				case <-fctx.Done():
				}
			}()
		}
	}
	sum, err := monitor.Run(ctx, monitor.Spec{
		Workers: c.workers, Args: args, Quiet: true, Log: io.Discard,
		Store: c.redis, JobID: job,
		Faults: []faults.Fault{kill}, OnEvent: onEvent, StopWhenRecovered: true,
	})
	stopFlood()
	gated.Wait()
	if fl != nil {
		if ferr := fl.stop(); ferr != nil && err == nil {
			err = ferr
		}
		tr.IdleOpen, tr.IdleOpened, tr.IdleFailed = openAtKill.Load(), openedAtKill.Load(), failedAtKill.Load()
	}
	if err == nil {
		err = floodErr
	}
	if err != nil {
		return tr, err
	}
	if len(sum.Recoveries) != 1 {
		if idle > 0 && (fl == nil || tr.IdleOpen == 0) {
			return tr, fmt.Errorf("the job ended before its flood of %d connections stood (raise -kill-at)", idle)
		}
		return tr, fmt.Errorf("%d recoveries measured, want 1", len(sum.Recoveries))
	}
	tr.RecoverySeconds, tr.Rounds = sum.Recoveries[0], len(sum.Rounds)
	return tr, nil
}

// worker trains linear regression until a few hundred steps after the kill.
func worker(c *config) error {
	ev := launch.NewEmitter()
	secret, err := jobenv.Secret()
	if err != nil {
		return err
	}
	const batch = 16
	samples := int(c.killAt+200+c.extraSteps) * batch
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
	// The worker picks its port itself, to tell the bench where it
	// listens (a flood targets it).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	cfg := trainer.DefaultConfig()
	cfg.JobID = c.job
	cfg.ListenAddr = addr
	cfg.Sync.LocalSockets = c.localSockets
	cfg.Sync.Secret = secret
	cfg.Elastic.MinWorkers = c.workers - 1
	cfg.Elastic.LeaseTTL = c.lease
	cfg.Elastic.HeartbeatInterval = c.lease / 6
	cfg.Elastic.LastCall = time.Second
	tr, err := trainer.New(model.Params(), optim.NewSGD(0.1), loader, model.Step, store.NewRedis(client), cfg,
		trainer.WithHooks(trainer.Hooks{
			OnRound: func(r trainer.RoundInfo) {
				ev.Emit(launch.Event{Ev: launch.EvRound, Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step, Recovery: r.Recovery, Message: addr})
			},
			OnStep: func(s trainer.StepInfo) {
				if s.Rank == 0 {
					ev.Emit(launch.Event{Ev: launch.EvStep, Round: s.Round, Rank: 0, WorldSize: s.WorldSize, Step: s.Step, Samples: s.Samples})
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
	ev.Emit(launch.Event{Ev: launch.EvDone, Step: res.Step})
	return nil
}
