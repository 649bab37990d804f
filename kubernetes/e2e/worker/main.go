// Command worker is the training worker of the Kubernetes integration
// tests: one per Pod of an Indexed Job, the trainertest linear regression
// trained by package trainer, sized through the Kubernetes API by package
// jobscale. It is what a user's worker on Kubernetes looks like: the job
// ID and the rendezvous from flags, its Pod, namespace and Job from the
// downward API (jobscale.FromEnv), the API server from $KUBECONFIG (the
// tests' node agent writes one holding the Pod's service account token) or
// from the in-cluster configuration.
//
// It writes one JSON object a line to stdout (a start, every round, every
// step of rank 0, every scaling decision, its end) and exits with
// launch.ExitStatus of its trainer's Run: 0 when the job finished, 143
// when it left gracefully (SIGTERM or a scaling decision), 4 when it found
// the job finished before it joined.
package main

import (
	"context"
	"encoding/hex"
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/kubernetes/jobscale"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Event is one line of the worker's output.
type Event struct {
	Ev         string `json:"ev"` // "start", "round", "step", "scaling", "exit"
	Pod        string `json:"pod"`
	Index      string `json:"index"`
	Round      uint64 `json:"round,omitempty"`
	Rank       int    `json:"rank"`
	WorldSize  int    `json:"world_size,omitempty"`
	Step       int64  `json:"step,omitempty"`
	Recovery   bool   `json:"recovery,omitempty"`
	RolledBack int64  `json:"rolled_back,omitempty"`
	From       int    `json:"from,omitempty"`
	To         int    `json:"to,omitempty"`
	Reason     string `json:"reason,omitempty"`
	Status     int    `json:"status"`
	Preempted  bool   `json:"preempted,omitempty"`
	Released   bool   `json:"released,omitempty"`
	Finished   bool   `json:"finished,omitempty"`
	Recoveries int    `json:"recoveries,omitempty"`
	Err        string `json:"err,omitempty"`
}

func main() { os.Exit(run()) }

func run() int {
	job := flag.String("job", "", "job ID (required)")
	redisAddr := flag.String("redis", "", "Redis host:port (required)")
	listen := flag.String("listen", "127.0.0.1:0", "host:port of the collective transport")
	epochs := flag.Int("epochs", 1, "epochs to train")
	samples := flag.Int("samples", 4000, "samples in the data set")
	batch := flag.Int("batch", 16, "global batch")
	perSample := flag.Duration("per-sample", 0, "compute time per sample of this worker's share (a model whose steps take longer with more samples)")
	delay := flag.Duration("delay", 2*time.Millisecond, "least time per step")
	minW := flag.Int("min", 1, "Elastic.MinWorkers")
	maxW := flag.Int("max", 8, "Elastic.MaxWorkers")
	auditPath := flag.String("audit", "", "append the exactly-once audit log to this file")
	scale := flag.Bool("autoscale", false, "size the job by measured goodput through the Job's parallelism")
	interval := flag.Int("decision-interval", 0, "autoscale.Config.DecisionInterval (0: its default)")
	measure := flag.Int("measure-steps", 0, "autoscale.Config.MeasureSteps (0: its default)")
	warmup := flag.Int("warmup-steps", 0, "autoscale.Config.WarmupSteps (0: its default)")
	minChange := flag.Int("min-change", 0, "autoscale.Config.MinChangeInterval (0: its default)")
	grace := flag.Duration("grace", 20*time.Second, "trainer.Config.GracePeriod")
	flag.Parse()

	pod := jobscale.FromEnv()
	out := json.NewEncoder(os.Stdout) // one Write per line
	emit := func(e Event) {
		e.Pod, e.Index = pod.Pod, os.Getenv("JOB_COMPLETION_INDEX")
		_ = out.Encode(e)
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "worker:", err)
		s := launch.ExitStatus(err)
		emit(Event{Ev: "exit", Rank: -1, Status: s, Err: err.Error()})
		return s
	}
	if *job == "" || *redisAddr == "" {
		return fail(fmt.Errorf("%w: -job and -redis are required", launch.ErrUsage))
	}
	emit(Event{Ev: "start", Rank: -1})

	prob := trainertest.NewProblem(*samples, 4, 0.05, 7)
	model := trainertest.NewModel(4)
	model.StepDelay = *delay
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = *batch, 7
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	if err != nil {
		return fail(err)
	}
	defer loader.Close()

	client := redis.NewClient(&redis.Options{Addr: *redisAddr})
	defer client.Close()
	cfg := trainer.DefaultConfig()
	cfg.JobID, cfg.Epochs = *job, *epochs
	// The job secret (hex) from the Secret the Pod template names.
	secret, err := hex.DecodeString(os.Getenv("ELASTICTRAIN_SECRET"))
	if err != nil {
		return fail(fmt.Errorf("%w: $ELASTICTRAIN_SECRET is not hex: %v", launch.ErrUsage, err))
	}
	cfg.Sync.Secret = secret
	cfg.ListenAddr = *listen
	cfg.GracePeriod = *grace
	cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = *minW, *maxW
	cfg.Elastic.LastCall = 300 * time.Millisecond
	cfg.Elastic.LeaseTTL = 2 * time.Second
	cfg.Elastic.HeartbeatInterval = 300 * time.Millisecond
	if *scale {
		kc, err := kubeClient()
		if err != nil {
			return fail(err)
		}
		sc, err := jobscale.New(kc, pod)
		if err != nil {
			return fail(err)
		}
		cfg.Autoscale.Enabled, cfg.Autoscale.Platform = true, sc
		cfg.Autoscale.DecisionInterval = *interval
		cfg.Autoscale.MeasureSteps = *measure
		cfg.Autoscale.WarmupSteps = *warmup
		cfg.Autoscale.MinChangeInterval = *minChange
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("pod", pod.Pod)
	step := model.Step
	if *perSample > 0 {
		step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			t := time.NewTimer(time.Duration(len(b.Indices)) * *perSample)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return 0, ctx.Err()
			}
			return model.Step(ctx, b)
		}
	}
	opts := []trainer.Option{trainer.WithLogger(logger), trainer.WithHooks(trainer.Hooks{
		OnRound: func(r trainer.RoundInfo) {
			emit(Event{Ev: "round", Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step,
				Recovery: r.Recovery, RolledBack: r.RolledBack})
		},
		OnStep: func(s trainer.StepInfo) {
			if s.Rank != 0 {
				return
			}
			emit(Event{Ev: "step", Round: s.Round, Rank: s.Rank, WorldSize: s.WorldSize, Step: s.Step})
			if d := s.Scaling; d != nil {
				emit(Event{Ev: "scaling", Rank: s.Rank, Step: d.Step, From: d.From, To: d.To, Reason: d.Reason})
			}
		},
	})}
	if *auditPath != "" {
		a, err := audit.OpenFile(*auditPath)
		if err != nil {
			return fail(err)
		}
		defer a.Close()
		opts = append(opts, trainer.WithAudit(a))
	}
	tr, err := trainer.New(model.Params(), optim.NewMomentum(0.02, 0.9), loader, step,
		store.NewRedis(client), cfg, opts...)
	if err != nil {
		return fail(err)
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
		Preempted: errors.Is(err, trainer.ErrPreempted), Released: errors.Is(err, trainer.ErrReleased),
		Finished: res.Finished, Recoveries: res.Recoveries}
	if err != nil {
		e.Err = err.Error()
		fmt.Fprintln(os.Stderr, "worker:", err)
	}
	emit(e)
	return e.Status
}

// kubeClient returns a client of the API server of $KUBECONFIG, or of the
// cluster the Pod runs in.
func kubeClient() (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if p := os.Getenv("KUBECONFIG"); p != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", p)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("the API server's address: %w", err)
	}
	return kubernetes.NewForConfig(rc)
}
