package mnist

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/gorgoniastep/cpuops"
	"github.com/elastictrain/elastictrain/trainer/localsgd"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/ring"
)

// batch is a collated global-batch share: n images of 784 pixels in [0,1]
// and their labels.
type batch struct {
	Pixels []float32
	Labels []int
}

func collate(_ context.Context, samples []Sample, _ []int) (batch, error) {
	b := batch{Pixels: make([]float32, 0, len(samples)*Pixels), Labels: make([]int, 0, len(samples))}
	for _, s := range samples {
		b.Pixels = append(b.Pixels, s.Pixels[:]...)
		b.Labels = append(b.Labels, s.Label)
	}
	return b, nil
}

// detMicroBatch is the micro-batch size of deterministic runs (-micro).
const detMicroBatch = 32

// Exit statuses of a worker.
const (
	exitOK        = 0
	exitError     = 1
	exitPreempted = 143 // 128+SIGTERM: left gracefully after committing and checkpointing
)

func runWorker(c *config, stderr io.Writer) int {
	ev := launch.NewEmitter()
	logger := newLogger(c, stderr)
	fail := func(err error) int {
		ev.Emit(jobenv.ErrorEvent(err))
		if os.Getenv(launch.EnvEvents) == "" { // else the launcher prints the event
			logger.Error("worker failed", "err", err)
		}
		if s := launch.ExitStatus(err); s == launch.StatusPermanent || s == launch.StatusRefused {
			return s // not restarted; a permanent error also stops the job
		}
		return exitError
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jobenv.LogRedisTo(logger)

	dir, err := locateData(c.data)
	if err != nil {
		return fail(err)
	}
	train, err := OpenMNIST(dir, Train)
	if err != nil {
		return fail(err)
	}
	defer train.Close()

	model, err := NewModel(c.model, int64(c.seed))
	if err != nil {
		return fail(err)
	}
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = c.batch, c.seed
	if c.deterministic {
		// Fixed micro-batches: the same shapes, and so the same bits,
		// whatever the world size.
		dcfg.MicroBatch = min(c.micro, c.batch)
	}
	loader, err := dataloader.New[Sample, batch](train, collate, dcfg)
	if err != nil {
		return fail(err)
	}
	defer loader.Close()

	client, err := c.redisOpts.Client()
	if err != nil {
		return fail(err)
	}
	defer client.Close()
	st := jobenv.NewPendingStore(client, ev)

	secret, err := jobenv.Secret()
	if err != nil {
		return fail(err)
	}
	tcfg := trainer.DefaultConfig()
	tcfg.JobID, tcfg.Epochs = c.job, c.epochs
	tcfg.Sync.Secret = secret
	tcfg.Deterministic = c.deterministic
	tcfg.Balance = c.balance
	tcfg.Elastic.MinWorkers, tcfg.Elastic.MaxWorkers = c.min, c.max
	tcfg.Elastic.LeaseTTL = c.detect
	tcfg.Elastic.HeartbeatInterval = c.detect / 6
	tcfg.Elastic.LastCall = time.Second
	tcfg.Elastic.Logger = logger
	tcfg.Sync.Logger = logger
	tcfg.ListenAddr = c.listen
	tcfg.GracePeriod = c.grace
	if w, err := launch.WorkerEnv(); err == nil {
		// The launcher's job ID and secret (those of -job and the
		// environment), and a grace period that ends before the
		// launcher's, so a preempted worker exits by itself.
		w.Configure(&tcfg)
	}
	opts := []trainer.Option{trainer.WithLogger(logger)}
	if c.audit != "" {
		rec, err := audit.OpenFile(c.audit)
		if err != nil {
			return fail(err)
		}
		defer rec.Close()
		opts = append(opts, trainer.WithAudit(rec))
	}
	tel, err := newTelemetry(ctx, c.otlp, c.metrics, workerIndex(), c.job)
	if err != nil {
		return fail(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
		defer cancel()
		if err := tel.shutdown(sctx); err != nil {
			logger.Warn("telemetry shutdown", "err", err)
		}
	}()
	if tel.addr != "" {
		// Said at Warn under the launcher, whose workers log warnings
		// only, so the address (port+i, or a free port) is always shown.
		level := slog.LevelInfo
		if !c.worker {
			level = slog.LevelWarn
		}
		logger.Log(ctx, level, "serving Prometheus metrics and a liveness probe", "metrics_url", "http://"+tel.addr+"/metrics", "healthz_url", "http://"+tel.addr+"/healthz")
	}
	opts = append(opts, tel.options()...)
	if c.ckpt != "" {
		st, err := openCheckpoints(ctx, c.ckpt)
		if err != nil {
			return fail(err)
		}
		opts = append(opts, trainer.WithCheckpointStore(st))
		tcfg.CheckpointEvery = 200
	}
	rank := -1
	opts = append(opts, trainer.WithHooks(trainer.Hooks{
		OnRound: func(r trainer.RoundInfo) {
			rank = r.Rank
			ev.Emit(launch.Event{Ev: launch.EvRound, Round: r.Round, Rank: r.Rank, WorldSize: r.WorldSize, Step: r.Step,
				Epoch: r.Epoch, Source: r.Source, Recovery: r.Recovery, RolledBack: r.RolledBack})
		},
		OnStep: func(s trainer.StepInfo) {
			if s.Rank == 0 {
				ev.Emit(launch.Event{Ev: launch.EvStep, Round: s.Round, Rank: s.Rank, WorldSize: s.WorldSize, Step: s.Step,
					Epoch: s.Epoch, Loss: s.Loss, Samples: s.Samples, RecoverySeconds: s.RecoverySeconds})
				if d := s.Scaling; d != nil {
					ev.Emit(launch.Event{Ev: launch.EvScaling, Round: s.Round, Rank: s.Rank, WorldSize: s.WorldSize, Step: d.Step,
						From: d.From, To: d.To, Reason: d.Reason, Message: d.Detail})
				}
			}
			monitor.HoldAtStep()
		},
	}))
	step := func(ctx context.Context, b dataloader.Batch[batch]) (float64, error) {
		start := time.Now()
		loss, err := model.Step(ctx, b.Data.Pixels, b.Data.Labels)
		if err == nil {
			err = c.slow.slowDown(ctx, rank, time.Since(start))
		}
		return loss, err
	}
	// Deterministic mode's one call per step for all of a rank's
	// micro-batches (their sums kept apart): a micro-batch's bits are
	// those of its own Step.
	var mpix [][]float32
	var mlab [][]int
	opts = append(opts, trainer.WithMicroStep(func(ctx context.Context, b dataloader.Batch[batch], grads [][][]float32, losses []float64) error {
		start := time.Now()
		mpix, mlab = mpix[:0], mlab[:0]
		for _, m := range b.Micro {
			mpix, mlab = append(mpix, m.Data.Pixels), append(mlab, m.Data.Labels)
		}
		err := model.StepMicro(ctx, mpix, mlab, grads, losses)
		if err == nil {
			err = c.slow.slowDown(ctx, rank, time.Since(start))
		}
		return err
	}))
	opt := optim.Optimizer(optim.NewAdam(c.lr))
	if c.sync != "ring" {
		// Low-communication sync (trainer/localsgd) over the default ring.
		scfg := localsgd.DefaultConfig()
		scfg.Every, scfg.LR, scfg.Momentum = c.syncEvery, c.outerLR, c.outerMu
		if c.sync == "localsgd" {
			scfg.Outer = localsgd.Average
		}
		tcfg.Sync.JobID = tcfg.JobID
		s, err := localsgd.New(model.Params(), opt, ring.NewBackend(tcfg.ListenAddr, tcfg.Sync), scfg)
		if err != nil {
			return fail(err)
		}
		opt = s.Optimizer()
		opts = append(opts, trainer.WithBackend(s.Backend()))
		if tcfg.CheckpointEvery > 0 {
			// Checkpoints are taken at outer steps only.
			tcfg.CheckpointEvery = (tcfg.CheckpointEvery + c.syncEvery - 1) / c.syncEvery * c.syncEvery
		}
	}
	sentBefore := netBytesSent()
	tr, err := trainer.New(model.Params(), opt, loader, step, st, tcfg, opts...)
	if err != nil {
		return fail(err)
	}
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

	if p := os.Getenv("CPUPROF"); p != "" {
		f, _ := os.Create(fmt.Sprintf("%s.%d", p, os.Getpid()))
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if c.deterministic && cpuops.Kernel() == "openblas" {
		// Said once, at the start: -deterministic's promise of the same
		// bits holds only among workers with the same libopenblas and
		// CPU kind.
		logger.Info("built with OpenBLAS: the parameters are the same bits only between workers with the same libopenblas on the same kind of CPU")
	}
	res, err := tr.Run(ctx)
	lostCheckpoint := errors.Is(err, trainer.ErrCheckpoint)
	status := exitOK
	switch {
	case errors.Is(err, trainer.ErrReleased):
		// A scaling decision removed this worker: it committed with the
		// others and left; the job goes on without it (its own
		// checkpoint, if it could not write it, was not the job's).
		logger.Info("left the job by a scaling decision", "step", res.Step)
		return exitPreempted
	case errors.Is(err, trainer.ErrPreempted) && lostCheckpoint:
		// Not a graceful leave: a resume would start from an older
		// checkpoint than the step this worker committed.
		return fail(fmt.Errorf("left without its checkpoint: %w", err))
	case errors.Is(err, trainer.ErrPreempted):
		logger.Info("left gracefully after committing", "step", res.Step)
		return exitPreempted
	case lostCheckpoint && res.Finished:
		// The job is done but its final checkpoint is missing: still
		// report the result, and exit with a failure (every rank of the
		// last round has this error; rank 0 tells the launcher why).
		if rank == 0 {
			ev.Emit(jobenv.ErrorEvent(err))
		}
		logger.Error("the job finished without its final checkpoint", "err", err)
		status = exitError
	case errors.Is(err, trainer.ErrDiverged):
		// Every rank stopped at the step whose loss was not finite. Rank 0
		// reports the job's end with that loss, so the launcher says that
		// training diverged (and exits 1); the others have nothing to add.
		logger.Error("training diverged", "err", err, "step", res.Step)
		if rank == 0 {
			ev.Emit(launch.Event{Ev: launch.EvDone, Rank: 0, Step: res.Step, Epoch: res.Epochs, Loss: math.NaN()})
		}
		return exitOK
	case errors.Is(err, elastic.ErrJobFinished) && res.Step > 0:
		// The others finished the job while this worker was out of it
		// (paused, fenced): its parameters are not the final model, and
		// the final rank 0 reports the job.
		logger.Warn("the job finished without this worker", "err", err)
		return exitOK
	case errors.Is(err, elastic.ErrJobFinished):
		// The job was over before this worker trained: an earlier run of
		// this job ID finished it. The launcher says so when nobody trained;
		// the status (4, launch.StatusJobFinished) tells a platform that
		// this worker trained nothing (the Kubernetes manifest's
		// podFailurePolicy fails its index instead of counting a success).
		ev.Emit(launch.Event{Ev: launch.EvFinished})
		logger.Info("the job had finished before this worker joined", "err", err)
		return launch.StatusJobFinished
	case err != nil:
		return fail(err)
	}
	if !res.Finished || rank != 0 || res.Step == 0 {
		return status
	}
	// The final rank 0 evaluates and reports for the job.
	test, err := OpenMNIST(dir, Test)
	if err != nil {
		return fail(err)
	}
	defer test.Close()
	acc, err := evaluate(ctx, model, test)
	if err != nil {
		return fail(err)
	}
	sha := paramsSHA256(model.Params())
	ev.Emit(launch.Event{Ev: launch.EvDone, Rank: 0, Step: res.Step, Epoch: res.Epochs, Loss: res.Loss,
		Extra: map[string]any{"test_accuracy": acc, "params_sha256": sha, "deterministic": res.Deterministic, "bytes_sent": float64(netBytesSent() - sentBefore),
			"step_breakdown_ms": stepBreakdown(res.StepTimes)}})
	logger.Info("job finished", "test_accuracy", acc, "step", res.Step, "epoch", res.Epochs, "loss", res.Loss,
		"rounds", res.Rounds, "recoveries", res.Recoveries, "params_sha256", sha)
	return status
}

// openCheckpoints opens the store -checkpoint names: Options.OpenCheckpoints'
// when set, else a local directory keeping the newest 3 checkpoints.
func openCheckpoints(ctx context.Context, location string) (trainer.CheckpointStore, error) {
	if options.OpenCheckpoints != nil {
		return options.OpenCheckpoints(ctx, location)
	}
	return checkpoint.NewLocalDir(location, 3)
}

// evaluate returns the accuracy of model on every sample of ds.
func evaluate(ctx context.Context, model *Model, ds *MNIST) (float64, error) {
	const chunk = 500
	correct := 0
	n := ds.Len()
	var b batch
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		b.Pixels, b.Labels = b.Pixels[:0], b.Labels[:0]
		for i := lo; i < hi; i++ {
			s, err := ds.Get(ctx, i)
			if err != nil {
				return 0, err
			}
			b.Pixels = append(b.Pixels, s.Pixels[:]...)
			b.Labels = append(b.Labels, s.Label)
		}
		pred, err := model.Predict(b.Pixels, hi-lo)
		if err != nil {
			return 0, err
		}
		for i, p := range pred {
			if p == b.Labels[i] {
				correct++
			}
		}
	}
	return float64(correct) / float64(n), nil
}

// paramsSHA256 hashes every parameter's name, shape and float32 bits.
func paramsSHA256(ps []trainer.Param) string {
	h := sha256.New()
	var buf []byte
	for _, p := range ps {
		buf = append(buf[:0], p.Name...)
		for _, d := range p.Shape {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(d))
		}
		for _, v := range p.Value {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}
