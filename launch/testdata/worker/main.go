// Command worker is a user's own elastic worker, written against the public
// API only, for the tests of package launch and of etrun: the trainertest
// linear regression trained by package trainer, configured from
// launch.WorkerEnv. It writes one JSON object a line to stdout (a start,
// every round, every step of rank 0, its end) and exits with
// launch.ExitStatus of its trainer's Run.
//
// The tests build it with go build; it lives under testdata so that
// ./... neither builds nor vets it as part of the module.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Event is one line of the worker's output.
type Event struct {
	Ev        string `json:"ev"` // "start", "round", "step", "exit"
	Worker    int    `json:"worker"`
	Restart   int    `json:"restart"`
	PID       int    `json:"pid"`
	Round     uint64 `json:"round,omitempty"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size,omitempty"`
	Step      int64  `json:"step,omitempty"`
	Status    int    `json:"status"`
	Preempted bool   `json:"preempted,omitempty"` // Run's error wraps trainer.ErrPreempted
	Finished  bool   `json:"finished,omitempty"`
	Err       string `json:"err,omitempty"`
}

func main() { os.Exit(run()) }

func run() int {
	epochs := flag.Int("epochs", 1, "epochs to train")
	samples := flag.Int("samples", 800, "samples in the data set")
	batch := flag.Int("batch", 16, "global batch")
	delay := flag.Duration("delay", 2*time.Millisecond, "least time per step")
	minW := flag.Int("min", 1, "Elastic.MinWorkers")
	crashWorker := flag.Int("crash-worker", -1, "the worker index whose first process crashes")
	crashStep := flag.Int64("crash-step", 0, "the step after which it crashes (exit status 3)")
	ckpt := flag.String("checkpoint", "", "checkpoint directory")
	lr := flag.Float64("lr", 0.02, "the optimizer's learning rate")
	features := flag.Int("features", 4, "features of the model (another count is another model)")
	flag.Parse()

	w, err := launch.WorkerEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return launch.StatusFailed
	}
	var out = json.NewEncoder(os.Stdout) // one Write per line
	emit := func(e Event) {
		e.Worker, e.Restart, e.PID = w.Index, w.Restart, os.Getpid()
		out.Encode(e)
	}
	emit(Event{Ev: "start", Rank: -1})

	prob := trainertest.NewProblem(*samples, *features, 0.05, 7)
	model := trainertest.NewModel(*features)
	model.StepDelay = *delay
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = *batch, 7
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return launch.StatusFailed
	}
	defer loader.Close()

	client := redis.NewClient(&redis.Options{Addr: w.Store})
	defer client.Close()
	cfg := trainer.DefaultConfig()
	w.Configure(&cfg)
	cfg.Epochs = *epochs
	cfg.Elastic.MinWorkers = *minW
	cfg.Elastic.LastCall = 300 * time.Millisecond
	cfg.Elastic.LeaseTTL = 2 * time.Second
	cfg.Elastic.HeartbeatInterval = 300 * time.Millisecond
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("worker", w.Index, "restart", w.Restart)
	opts := []trainer.Option{trainer.WithLogger(logger), trainer.WithHooks(trainer.Hooks{
		OnRound: func(r trainer.RoundInfo) {
			emit(Event{Ev: "round", Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step})
		},
		OnStep: func(s trainer.StepInfo) {
			if s.Rank == 0 {
				emit(Event{Ev: "step", Round: s.Round, Rank: s.Rank, WorldSize: s.WorldSize, Step: s.Step})
			}
			if w.Index == *crashWorker && w.Restart == 0 && s.Step >= *crashStep {
				emit(Event{Ev: "exit", Rank: s.Rank, Step: s.Step, Status: 3, Err: "crashing on purpose"})
				os.Exit(3)
			}
		},
	})}
	if *ckpt != "" {
		st, err := checkpoint.NewLocalDir(*ckpt, 3)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return launch.StatusFailed
		}
		opts = append(opts, trainer.WithCheckpointStore(st))
	}
	tr, err := trainer.New(model.Params(), optim.NewMomentum(*lr, 0.9), loader, model.Step,
		store.NewRedis(client), cfg, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return launch.ExitStatus(err) // StatusPermanent for an invalid configuration
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
			tr.Preempt()
		case <-ctx.Done():
		}
	}()
	res, err := tr.Run(ctx)
	e := Event{Ev: "exit", Rank: res.Rank, Step: res.Step, Status: launch.ExitStatus(err),
		Preempted: errors.Is(err, trainer.ErrPreempted), Finished: res.Finished}
	if err != nil {
		e.Err = err.Error()
		fmt.Fprintln(os.Stderr, "worker:", err)
	}
	emit(e)
	return e.Status
}
