package faultinject

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Environment of a worker process.
const (
	// EnvWorker holds a worker's WorkerConfig as JSON; a process that has it
	// is a worker (see IsWorker and WorkerMain).
	EnvWorker = "ELASTICTRAIN_FAULTINJECT_WORKER"
	// EnvSecret holds the job secret, hex-encoded. It travels in the
	// environment, never on a command line or in a log.
	EnvSecret = "ELASTICTRAIN_FAULTINJECT_SECRET"
	// EnvRedisPassword holds the Redis password (ACL), if any.
	EnvRedisPassword = "ELASTICTRAIN_FAULTINJECT_REDIS_PASSWORD"
)

// WorkerConfig is what a worker process is told (JSON in EnvWorker): the
// job, where Redis and its peers are, and the training problem. The trainer
// settings not listed keep trainer.DefaultConfig's values.
type WorkerConfig struct {
	JobID string `json:"job_id"`
	// Index is the worker's launch index within the harness (0, 1, ...).
	Index int `json:"index"`
	// RedisAddr is where the worker reaches Redis (a proxy or the server).
	RedisAddr string `json:"redis_addr"`
	// RedisUser is the Redis ACL user name ("" = default user).
	RedisUser string `json:"redis_user,omitempty"`
	// RedisCAFile, when set, makes the worker talk TLS to Redis, trusting
	// the PEM certificates in this file.
	RedisCAFile string `json:"redis_ca_file,omitempty"`
	// RedisSentinels and RedisMaster, when set, make the worker use
	// go-redis' failover client: the Sentinels name the current master of
	// RedisMaster, and the client follows a failover.
	RedisSentinels []string `json:"redis_sentinels,omitempty"`
	RedisMaster    string   `json:"redis_master,omitempty"`
	// ListenAddr is where the worker's collective transport listens.
	ListenAddr string `json:"listen_addr"`
	// AdvertiseAddr, when set, is the address peers dial (a proxy in front
	// of ListenAddr); Unix sockets and shared memory are then off, so every
	// byte between ranks crosses the proxy.
	AdvertiseAddr string `json:"advertise_addr,omitempty"`
	// AuditPath is the shared audit log (audit.File).
	AuditPath string `json:"audit_path"`
	// CheckpointDir is the shared checkpoint directory ("" = none).
	CheckpointDir string `json:"checkpoint_dir,omitempty"`
	// CheckpointEvery: steps between durable checkpoints.
	CheckpointEvery int `json:"checkpoint_every"`
	// Problem: samples, features, global batch, seed, epochs.
	Samples     int    `json:"samples"`
	Dim         int    `json:"dim"`
	GlobalBatch int    `json:"global_batch"`
	Seed        uint64 `json:"seed"`
	Epochs      int    `json:"epochs"`
	// StepDelay is the simulated compute time of a step.
	StepDelay time.Duration `json:"step_delay"`
	// Rendezvous and transport timings.
	MinWorkers        int           `json:"min_workers"`
	MaxWorkers        int           `json:"max_workers"`
	LastCall          time.Duration `json:"last_call"`
	LeaseTTL          time.Duration `json:"lease_ttl"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval"`
	OutageBudget      time.Duration `json:"outage_budget"`
	OpTimeout         time.Duration `json:"op_timeout"`
	DialTimeout       time.Duration `json:"dial_timeout"`
	HoldTimeout       time.Duration `json:"hold_timeout"`
	MaxRecoveries     int           `json:"max_recoveries"`
	GracePeriod       time.Duration `json:"grace_period"`
	// RedisTimeout is the go-redis dial, read and write timeout.
	RedisTimeout time.Duration `json:"redis_timeout"`
	// ProgressTimeout is elastic.Config.ProgressTimeout (0: the default).
	ProgressTimeout time.Duration `json:"progress_timeout,omitempty"`
	// PhaseTimeout is elastic.Config.PhaseTimeout (0: the default).
	PhaseTimeout time.Duration `json:"phase_timeout,omitempty"`
	// HangFile, when set, makes the step function block, ignoring its
	// context (a true hang), while this file exists (Harness.Hang).
	HangFile string `json:"hang_file,omitempty"`
	// Phases are the long phases this worker runs (Config.Phases).
	Phases []Phase `json:"phases,omitempty"`
}

// Kinds of Phase.
const (
	// PhaseGet: the worker's first dataset Get takes For (a fetch from
	// remote storage before the first step). The SDK marks it.
	PhaseGet = "get"
	// PhaseSave: the worker's first CheckpointStore.Save takes For (only
	// rank 0 writes; with CheckpointEvery 0 the first Save is the final
	// checkpoint, which the others wait for). The SDK marks it.
	PhaseSave = "save"
	// PhaseBusy: at its AtStep-th step function call the worker runs a
	// phase of its own of For (an evaluation), marked with trainer.Busy.
	PhaseBusy = "busy"
	// PhaseStuckGet: from the worker's AtStep-th step function call on,
	// its next dataset Get blocks for For, ignoring its context (a data
	// source that never answers, for as long as the test needs): a hang
	// inside a phase the SDK marks, which elastic.Config.PhaseTimeout
	// bounds.
	PhaseStuckGet = "stuck-get"
)

// Phase is a long phase that is not a hang, run once by a worker (issue
// 14: peers must wait for it, and no round may change).
type Phase struct {
	// Worker is the launch index of the worker that runs it; -1: every
	// worker.
	Worker int `json:"worker"`
	// Kind is PhaseGet, PhaseSave or PhaseBusy.
	Kind string `json:"kind"`
	// For is how long the phase lasts.
	For time.Duration `json:"for"`
	// AtStep is the step function call (from 1) that runs a PhaseBusy.
	AtStep int `json:"at_step,omitempty"`
}

// phase returns this worker's phase of kind, if any.
func (wc *WorkerConfig) phase(kind string) (Phase, bool) {
	for _, p := range wc.Phases {
		if p.Kind == kind {
			return p, true
		}
	}
	return Phase{}, false
}

// slowGet is a Dataset whose first Get takes a PhaseGet's time.
type slowGet struct {
	dataloader.Dataset[trainertest.Sample]
	d    time.Duration
	log  *slog.Logger
	once sync.Once
}

func (s *slowGet) Get(ctx context.Context, i int) (trainertest.Sample, error) {
	var err error
	s.once.Do(func() {
		s.log.Info("slow dataset fetch (faultinject)", "for", s.d)
		err = sleep(ctx, s.d) // the slow fetch itself
	})
	if err != nil {
		return trainertest.Sample{}, err
	}
	return s.Dataset.Get(ctx, i)
}

// stuckGet is a Dataset whose next Get, once armed, blocks for d ignoring
// its context (PhaseStuckGet).
type stuckGet struct {
	dataloader.Dataset[trainertest.Sample]
	d     time.Duration
	log   *slog.Logger
	armed atomic.Bool
	once  sync.Once
}

func (s *stuckGet) Get(ctx context.Context, i int) (trainertest.Sample, error) {
	if s.armed.Load() {
		s.once.Do(func() {
			s.log.Info("dataset fetch stuck, ignoring its context (faultinject)", "for", s.d.String())
			time.Sleep(s.d) // the fetch that does not return, deaf to ctx
			s.log.Info("stuck dataset fetch returns (faultinject)")
		})
	}
	return s.Dataset.Get(ctx, i)
}

// slowSave is a CheckpointStore whose first Save takes a PhaseSave's time.
type slowSave struct {
	driver.CheckpointStore
	d    time.Duration
	log  *slog.Logger
	once sync.Once
}

func (s *slowSave) Save(ctx context.Context, step int64, data []byte) error {
	var err error
	s.once.Do(func() {
		s.log.Info("slow checkpoint save (faultinject)", "for", s.d, "step", step)
		err = sleep(ctx, s.d) // the slow write itself
	})
	if err != nil {
		return err
	}
	return s.CheckpointStore.Save(ctx, step, data)
}

// Report is one report of a worker as the harness reads it: a
// launch.Event its worker sent (see Report.event for the mapping), with
// the time the harness read it.
type Report struct {
	// Kind is "start", "round", "step", "final" or "error".
	Kind  string `json:"kind"`
	Index int    `json:"index"`
	PID   int    `json:"pid"`
	// Addr is the worker's advertised peer address ("start").
	Addr   string `json:"addr,omitempty"`
	Round  uint64 `json:"round,omitempty"`
	Rank   int    `json:"rank"`
	Size   int    `json:"size,omitempty"`
	Step   int64  `json:"step,omitempty"`
	Source string `json:"source,omitempty"`
	// Recovery: the round followed a failure ("round").
	Recovery bool `json:"recovery,omitempty"`
	// RecoverySeconds: the worker's own time from seeing the failure to this
	// step ("step", first step after a failure).
	RecoverySeconds float64 `json:"recovery_seconds,omitempty"`
	// SHA is the SHA-256 of the parameters and optimizer state ("final":
	// the trained state; "round": the state the round agreed on).
	SHA  string  `json:"sha,omitempty"`
	Loss float64 `json:"loss,omitempty"`
	Err  string  `json:"err,omitempty"`
	// At is when the harness read the line (set by the harness, not sent).
	At time.Time `json:"-"`
}

// event is r as the launch.Event the worker sends: Kind is Ev, Size
// WorldSize, SHA Digest, Err Message, Addr Message of a "start" (the
// launcher stamps Worker and PID).
func (r Report) event() launch.Event {
	msg := r.Err
	if r.Kind == "start" {
		msg = r.Addr
	}
	return launch.Event{Ev: r.Kind, Round: r.Round, Rank: r.Rank, WorldSize: r.Size, Step: r.Step, Source: r.Source,
		Recovery: r.Recovery, RecoverySeconds: r.RecoverySeconds, Digest: r.SHA, Loss: r.Loss, Message: msg}
}

// reportOf is the Report of an event that worker index sent, read at at.
func reportOf(ev launch.Event, index int, at time.Time) Report {
	r := Report{Kind: ev.Ev, Index: index, PID: ev.PID, Round: ev.Round, Rank: ev.Rank, Size: ev.WorldSize, Step: ev.Step,
		Source: ev.Source, Recovery: ev.Recovery, RecoverySeconds: ev.RecoverySeconds, SHA: ev.Digest, Loss: ev.Loss,
		Err: ev.Message, At: at}
	if ev.Ev == "start" {
		r.Addr, r.Err = ev.Message, ""
	}
	return r
}

// Exit statuses of a worker process.
const (
	ExitFinished = 0 // the job finished; a "final" report was written
	ExitError    = 1 // Run returned an error; an "error" report was written
	// ExitJobFinished (launch.StatusJobFinished): Run's error wraps
	// elastic.ErrJobFinished; the job finished without this worker (it was
	// left behind, and its parameters are not the final model), or had
	// finished before it joined. An "error" report was written.
	ExitJobFinished = 4
	ExitPreempted   = 143 // SIGTERM: left gracefully (trainer.ErrPreempted)
)

// IsWorker reports whether this process was started as a worker by a
// harness (EnvWorker is set).
func IsWorker() bool { return os.Getenv(EnvWorker) != "" }

// ParamsHash returns the hex SHA-256 of every parameter value (float32 bits,
// little-endian, in order) followed by the optimizer state: equal hashes
// mean identical parameters and optimizer state.
func ParamsHash(ps []trainer.Param, opt optim.Optimizer) string {
	h := sha256.New()
	var b [4]byte
	for _, p := range ps {
		for _, v := range p.Value {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
			h.Write(b[:])
		}
	}
	h.Write(opt.AppendState(nil))
	return hex.EncodeToString(h.Sum(nil))
}

// WorkerMain runs one worker of the linear-regression job described by
// EnvWorker and returns the process exit status (ExitFinished, ExitError,
// ExitJobFinished, ExitPreempted). Call it from TestMain when IsWorker():
//
//	func TestMain(m *testing.M) {
//		if faultinject.IsWorker() {
//			os.Exit(faultinject.WorkerMain())
//		}
//		...
//	}
//
// SIGTERM preempts the trainer (graceful leave). Logs (JSON, level Info and
// above) go to standard error; reports go to the launcher as launch.Events (launch.NewEmitter).
func WorkerMain() int {
	ev := launch.NewEmitter() // the harness's launch.Job reads them (Hooks.OnEvent)
	var wc WorkerConfig
	emit := func(r Report) { ev.Emit(r.event()) }
	fail := func(err error) int {
		emit(Report{Kind: "error", Err: err.Error()})
		return ExitError
	}
	if err := json.Unmarshal([]byte(os.Getenv(EnvWorker)), &wc); err != nil {
		return fail(fmt.Errorf("faultinject: worker config: %w", err))
	}
	secret, err := hex.DecodeString(os.Getenv(EnvSecret))
	if err != nil {
		return fail(fmt.Errorf("faultinject: worker secret: %w", err))
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo, ReplaceAttr: launch.ReplaceDurations})).With("pid", os.Getpid(), "worker", wc.Index)

	prob := trainertest.NewProblem(wc.Samples, wc.Dim, 0.05, wc.Seed)
	m := trainertest.NewModel(wc.Dim)
	m.StepDelay = wc.StepDelay
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = wc.GlobalBatch, wc.Seed
	ds := prob.Dataset()
	if ph, ok := wc.phase(PhaseGet); ok {
		ds = &slowGet{Dataset: ds, d: ph.For, log: logger}
	}
	var stuck *stuckGet
	if ph, ok := wc.phase(PhaseStuckGet); ok {
		stuck = &stuckGet{Dataset: ds, d: ph.For, log: logger}
		ds = stuck
	}
	loader, err := dataloader.New(ds, prob.Collate, dcfg)
	if err != nil {
		return fail(err)
	}
	defer loader.Close()
	ropts := &redis.Options{
		Addr: wc.RedisAddr, Username: wc.RedisUser, Password: os.Getenv(EnvRedisPassword),
		DialTimeout: wc.RedisTimeout, ReadTimeout: wc.RedisTimeout, WriteTimeout: wc.RedisTimeout,
		MaxRetries: 1,
	}
	if wc.RedisCAFile != "" {
		pem, err := os.ReadFile(wc.RedisCAFile)
		if err != nil {
			return fail(fmt.Errorf("faultinject: Redis CA: %w", err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fail(fmt.Errorf("faultinject: Redis CA: no certificate in %s", wc.RedisCAFile))
		}
		host, _, _ := net.SplitHostPort(wc.RedisAddr)
		ropts.TLSConfig = &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	}
	var client redis.UniversalClient
	if len(wc.RedisSentinels) > 0 {
		client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: wc.RedisMaster, SentinelAddrs: wc.RedisSentinels,
			Username: ropts.Username, Password: ropts.Password, TLSConfig: ropts.TLSConfig,
			DialTimeout: ropts.DialTimeout, ReadTimeout: ropts.ReadTimeout, WriteTimeout: ropts.WriteTimeout,
			MaxRetries: ropts.MaxRetries,
		})
	} else {
		client = redis.NewClient(ropts)
	}
	defer client.Close()

	cfg := trainer.DefaultConfig()
	cfg.JobID, cfg.Epochs = wc.JobID, wc.Epochs
	cfg.ListenAddr = wc.ListenAddr
	cfg.CheckpointEvery = wc.CheckpointEvery
	cfg.MaxRecoveries = wc.MaxRecoveries
	cfg.GracePeriod = wc.GracePeriod
	cfg.Elastic.MinWorkers, cfg.Elastic.MaxWorkers = wc.MinWorkers, wc.MaxWorkers
	cfg.Elastic.LastCall = wc.LastCall
	cfg.Elastic.LeaseTTL, cfg.Elastic.HeartbeatInterval = wc.LeaseTTL, wc.HeartbeatInterval
	cfg.Elastic.OutageBudget = wc.OutageBudget
	if wc.ProgressTimeout > 0 {
		cfg.Elastic.ProgressTimeout = wc.ProgressTimeout
	}
	if wc.PhaseTimeout > 0 {
		cfg.Elastic.PhaseTimeout = wc.PhaseTimeout
	}
	cfg.Elastic.Logger = logger
	cfg.Sync.Secret = secret
	cfg.Sync.OpTimeout, cfg.Sync.DialTimeout, cfg.Sync.HoldTimeout = wc.OpTimeout, wc.DialTimeout, wc.HoldTimeout
	cfg.Sync.Logger = logger
	if wc.AdvertiseAddr != "" {
		cfg.Sync.AdvertiseAddr = wc.AdvertiseAddr
		cfg.Sync.LocalSockets, cfg.Sync.SharedMemory = false, false
	}
	audit, err := audit.OpenFile(wc.AuditPath)
	if err != nil {
		return fail(err)
	}
	defer audit.Close()
	opt := optim.NewMomentum(0.02, 0.9)
	opts := []trainer.Option{trainer.WithAudit(audit), trainer.WithLogger(logger), trainer.WithHooks(trainer.Hooks{
		OnRound: func(r trainer.RoundInfo) {
			emit(Report{Kind: "round", Round: r.Round, Rank: r.Rank, Size: r.WorldSize, Step: r.Step, Source: r.Source, Recovery: r.Recovery,
				SHA: ParamsHash(m.Params(), opt)})
		},
		OnStep: func(s trainer.StepInfo) {
			emit(Report{Kind: "step", Round: s.Round, Rank: s.Rank, Size: s.WorldSize, Step: s.Step, Loss: s.Loss, RecoverySeconds: s.RecoverySeconds})
		},
	})}
	if wc.CheckpointDir != "" {
		dir, err := checkpoint.NewLocalDir(wc.CheckpointDir, 3)
		if err != nil {
			return fail(err)
		}
		var st driver.CheckpointStore = dir
		if ph, ok := wc.phase(PhaseSave); ok {
			st = &slowSave{CheckpointStore: dir, d: ph.For, log: logger}
		}
		opts = append(opts, trainer.WithCheckpointStore(st))
	}
	step := m.Step
	if wc.HangFile != "" {
		step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			for hung := false; ; hung = true {
				if _, err := os.Stat(wc.HangFile); err != nil {
					if hung {
						logger.Info("step function woke from its hang")
					}
					return m.Step(ctx, b)
				}
				if !hung {
					logger.Info("step function hangs (faultinject)")
				}
				time.Sleep(10 * time.Millisecond) // a hang that ignores ctx, polling for its end
			}
		}
	}
	if ph, ok := wc.phase(PhaseStuckGet); ok {
		inner, calls := step, 0
		step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			if calls++; calls == ph.AtStep {
				stuck.armed.Store(true)
			}
			return inner(ctx, b)
		}
	}
	if ph, ok := wc.phase(PhaseBusy); ok {
		inner, calls := step, 0
		step = func(ctx context.Context, b dataloader.Batch[trainertest.Batch]) (float64, error) {
			if calls++; calls == ph.AtStep {
				logger.Info("a phase of the user's own, marked busy (faultinject)", "for", ph.For)
				done := trainer.Busy(ctx, "evaluation")
				err := sleep(ctx, ph.For) // the user's long phase
				done()
				if err != nil {
					return 0, err
				}
			}
			return inner(ctx, b)
		}
	}
	tr, err := trainer.New(m.Params(), opt, loader, step, store.NewRedis(client), cfg, opts...)
	if err != nil {
		return fail(err)
	}
	emit(Report{Kind: "start", Addr: wc.AdvertiseAddr})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	defer signal.Stop(sigs)
	stopSig := make(chan struct{})
	sigDone := make(chan struct{})
	go func() {
		defer close(sigDone)
		select {
		case <-sigs:
			tr.Preempt()
		case <-stopSig:
		}
	}()
	defer func() { close(stopSig); <-sigDone }()
	res, err := tr.Run(context.Background())
	switch {
	case err == nil:
		emit(Report{Kind: "final", Step: res.Step, SHA: ParamsHash(m.Params(), opt), Loss: m.Loss(prob)})
		return ExitFinished
	case errors.Is(err, trainer.ErrPreempted):
		emit(Report{Kind: "error", Step: res.Step, Err: err.Error()})
		return ExitPreempted
	case errors.Is(err, elastic.ErrJobFinished):
		emit(Report{Kind: "error", Step: res.Step, Err: err.Error()})
		return ExitJobFinished
	default:
		emit(Report{Kind: "error", Step: res.Step, Err: err.Error()})
		return ExitError
	}
}
