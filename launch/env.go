package launch

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/worker"
)

// The environment variables the launcher sets in every worker. Read them
// with WorkerEnv rather than by hand.
const (
	// EnvStore holds the host:port of the Redis-protocol store the job
	// rendezvous through.
	EnvStore = "ELASTICTRAIN_STORE"
	// EnvJobID holds the job ID (a valid elastic.Config.JobID).
	EnvJobID = "ELASTICTRAIN_JOB_ID"
	// EnvSecret holds the job secret, hex-encoded (at least 16 bytes). The
	// command etrun also reads it from its own environment, so launchers
	// on several hosts can share one job's secret.
	EnvSecret = "ELASTICTRAIN_SECRET"
	// EnvWorker holds the worker's index: 0..Workers-1 for the workers
	// started at once, then upward for those Job.Add starts. A restarted
	// worker keeps the index of the one it replaces. It is not the rank:
	// ranks come from the rendezvous and change from round to round.
	EnvWorker = "ELASTICTRAIN_WORKER"
	// EnvWorkers holds Config.Workers, the workers started at once.
	EnvWorkers = "ELASTICTRAIN_WORKERS"
	// EnvRestart holds how many times this worker's index was restarted
	// before this process: 0 for its first start.
	EnvRestart = "ELASTICTRAIN_RESTART"
	// EnvGracePeriod holds the launcher's Config.GracePeriod as a Go
	// duration ("30s"): how long after a stop signal the launcher waits
	// before it SIGKILLs the worker.
	EnvGracePeriod = "ELASTICTRAIN_GRACE_PERIOD"
	// EnvControl holds the path of the launcher's control socket (see
	// Worker.Platform); unset when the launcher opened none (neither
	// Config.Autoscale nor Config.CapacityFile).
	EnvControl = "ELASTICTRAIN_CONTROL"
	// EnvAutoscale is "1" when the launcher's Config.Autoscale is set: the
	// workers size the job themselves; unset otherwise.
	EnvAutoscale = "ELASTICTRAIN_AUTOSCALE"
	// EnvShareCores holds the host's cores that the job's workers on it
	// share, when the launcher chose their GOMAXPROCS itself (Config.
	// GOMAXPROCS 0) and the job's size can change (Config.Autoscale or
	// CapacityFile): Worker.Configure sets trainer.Config.ShareCores from
	// it, so a worker's GOMAXPROCS follows the round's members on its host
	// rather than the workers started at once.
	EnvShareCores = "ELASTICTRAIN_SHARE_CORES"
)

// Exit statuses of a job (the launcher's) and of a worker (see ExitStatus).
const (
	// StatusFinished: the job finished.
	StatusFinished = 0
	// StatusFailed: the job, or the worker, failed.
	StatusFailed = 1
	// StatusPreempted is 128+SIGTERM, what a shell reports for a process
	// that a SIGTERM ended, and what batch systems read as "stopped from
	// outside, restart me": the job, or the worker, left gracefully after
	// a stop signal, its state committed and checkpointed.
	StatusPreempted = 143
	// StatusJobFinished: the worker found its job already finished (the
	// store remembers the job ID as finished: an earlier run of it) and
	// trained nothing; its trainer's Run returned elastic.ErrJobFinished.
	// The launcher restarts no worker after it, and the job fails with an
	// error that wraps elastic.ErrJobFinished (unless another worker
	// finished the job).
	StatusJobFinished = 4
	// StatusPermanent: the worker stopped on an error that a restart
	// cannot fix, because the same command, configuration and checkpoint
	// directory fail the same way again (see ExitStatus for the errors).
	// It is 78, EX_CONFIG of BSD's sysexits.h ("a configuration error"),
	// and not 2: a Go panic exits 2 too, and a panic may be transient.
	// The launcher restarts no worker after it, whenever it comes, and
	// stops the whole job at once: the job fails with an error that wraps
	// ErrPermanent, and its exit status is StatusUsage, as for a bad
	// command line.
	StatusPermanent = 78
	// StatusRefused: the worker was refused by the job's running members
	// (its settings or model differ from those of the members that hold
	// the job's trained state; its trainer's Run returned a
	// *trainer.SettingsError whose Refused names it), who train on without
	// it. A restart repeats it, so the launcher does not restart it; unlike
	// StatusPermanent it does not stop the job, whose healthy workers go
	// on (Exit.Refused). 79, next to StatusPermanent.
	StatusRefused = 79
)

// ErrNotLaunched is WorkerEnv's error when the process was not started by
// a launcher (EnvJobID is unset).
var ErrNotLaunched = errors.New("launch: not started by a launcher (" + EnvJobID + " is not set)")

// Worker is what the launcher tells a worker process through its
// environment. A plain value, safe to copy.
type Worker struct {
	// Store is the host:port of the job's Redis-protocol store: pass it to
	// redis.Options.Addr.
	Store string
	// JobID is the job's ID.
	JobID string
	// Secret is the job secret (at least 16 bytes).
	Secret []byte
	// Index is the worker's index (EnvWorker): not its rank.
	Index int
	// Workers is how many workers the launcher started at once.
	Workers int
	// Restart is how many times this index was restarted before this
	// process (0: its first start).
	Restart int
	// GracePeriod is the launcher's grace period after a stop signal.
	GracePeriod time.Duration
	// Control is the path of the launcher's control socket (EnvControl);
	// "" when it opened none. Use it through Platform.
	Control string
	// Autoscale is true when the launcher asks the workers to size the
	// job themselves (EnvAutoscale, Config.Autoscale).
	Autoscale bool
	// ShareCores is the host's cores the job's workers on it share
	// (EnvShareCores); 0 when the launcher does not ask for it.
	ShareCores int
}

// Launched reports whether this process was started by a launcher (the
// job ID variable is set), without checking the other variables.
func Launched() bool { return os.Getenv(EnvJobID) != "" }

// WorkerEnv returns what the launcher told this worker. Errors:
// ErrNotLaunched when EnvJobID is unset; otherwise an error naming the
// first variable that is missing or malformed.
func WorkerEnv() (Worker, error) {
	return workerFrom(os.Getenv)
}

func workerFrom(getenv func(string) string) (Worker, error) {
	var w Worker
	w.JobID = getenv(EnvJobID)
	if w.JobID == "" {
		return Worker{}, ErrNotLaunched
	}
	bad := func(name, why string) error {
		return fmt.Errorf("launch: %s=%q: %s", name, getenv(name), why)
	}
	if w.Store = getenv(EnvStore); w.Store == "" {
		return Worker{}, bad(EnvStore, "want the store's host:port")
	}
	secret, err := hex.DecodeString(getenv(EnvSecret))
	if err != nil || len(secret) < 16 {
		return Worker{}, fmt.Errorf("launch: %s must hold the job secret (hex, at least 16 bytes)", EnvSecret) // never echo a secret
	}
	w.Secret = secret
	num := func(name string, min int) (int, error) {
		n, err := strconv.Atoi(getenv(name))
		if err != nil || n < min {
			return 0, bad(name, fmt.Sprintf("want a whole number >= %d", min))
		}
		return n, nil
	}
	if w.Index, err = num(EnvWorker, 0); err != nil {
		return Worker{}, err
	}
	if w.Workers, err = num(EnvWorkers, 1); err != nil {
		return Worker{}, err
	}
	if w.Restart, err = num(EnvRestart, 0); err != nil {
		return Worker{}, err
	}
	if w.GracePeriod, err = time.ParseDuration(getenv(EnvGracePeriod)); err != nil || w.GracePeriod <= 0 {
		return Worker{}, bad(EnvGracePeriod, "want a duration above 0, e.g. 30s")
	}
	w.Control = getenv(EnvControl)
	if v := getenv(EnvAutoscale); v != "" {
		if w.Autoscale, err = strconv.ParseBool(v); err != nil {
			return Worker{}, bad(EnvAutoscale, "want 1 or 0")
		}
	}
	if getenv(EnvShareCores) != "" {
		if w.ShareCores, err = num(EnvShareCores, 1); err != nil {
			return Worker{}, err
		}
	}
	return w, nil
}

// environ returns the launch variables of worker index's restart-th start.
func (w Worker) environ() []string {
	env := []string{
		EnvStore + "=" + w.Store,
		EnvJobID + "=" + w.JobID,
		EnvSecret + "=" + hex.EncodeToString(w.Secret),
		EnvWorker + "=" + strconv.Itoa(w.Index),
		EnvWorkers + "=" + strconv.Itoa(w.Workers),
		EnvRestart + "=" + strconv.Itoa(w.Restart),
		EnvGracePeriod + "=" + w.GracePeriod.String(),
	}
	if w.Control != "" {
		env = append(env, EnvControl+"="+w.Control)
	}
	if w.Autoscale {
		env = append(env, EnvAutoscale+"=1")
	}
	if w.ShareCores > 0 {
		env = append(env, EnvShareCores+"="+strconv.Itoa(w.ShareCores))
	}
	return env
}

// TrainerGracePeriod is the part of the launcher's grace period g that
// Configure leaves to the trainer: g minus a fifth of it, at most 5 s, so
// that a worker whose trainer used all of its grace still has time to exit
// by itself (flush logs and telemetry) before the launcher SIGKILLs it.
func TrainerGracePeriod(g time.Duration) time.Duration {
	return g - min(g/5, 5*time.Second)
}

// Settings returns the job's part of a worker's configuration, as the
// launcher set it in the environment: JobID, Secret (a copy), GracePeriod
// TrainerGracePeriod(w.GracePeriod), Platform (Worker.Platform, when the
// launcher opened a control socket), Autoscale (EnvAutoscale) and
// ShareCores.
func (w Worker) Settings() worker.Settings {
	s := worker.Settings{
		JobID:       w.JobID,
		Secret:      append([]byte(nil), w.Secret...),
		GracePeriod: TrainerGracePeriod(w.GracePeriod),
		Autoscale:   w.Autoscale,
		ShareCores:  w.ShareCores,
	}
	// The launcher's control socket enacts the trainer's scaling
	// decisions (Platform); with its Autoscale the trainer decides them.
	if p := w.Platform(); p != nil {
		s.Platform = p
	}
	return s
}

// Configure sets the job's part of a worker's configuration, such as a
// *trainer.Config (which implements worker.Configurable), from
// w.Settings(): JobID, Sync.Secret (a copy), and GracePeriod lowered to
// TrainerGracePeriod(w.GracePeriod) when it is longer (a shorter one is
// kept); Autoscale.Platform to the launcher's control socket when it
// opened one (Worker.Platform), and Autoscale.Enabled when the launcher
// asks the workers to size the job (EnvAutoscale; the policy's knobs stay
// the caller's); ShareCores when the caller's is 0. Everything else (world
// size bounds, epochs, checkpoints) stays the caller's. See
// trainer.Config.ConfigureJob.
func (w Worker) Configure(cfg worker.Configurable) {
	cfg.ConfigureJob(w.Settings())
}

// ExitStatus is the process exit status for an error: StatusFinished for
// nil, StatusPreempted when err wraps trainer.ErrPreempted (a worker that
// left on SIGTERM) or ErrPreempted (a job the launcher stopped and whose
// workers all left gracefully), StatusFailed otherwise, and also when err
// wraps trainer.ErrCheckpoint (a preempted worker whose checkpoint was not
// written did not leave cleanly), and StatusJobFinished when err wraps
// elastic.ErrJobFinished (the job ID had finished before: nothing was
// trained, which is not success).
//
// StatusPermanent when err is one that a restart cannot fix (Permanent):
// trainer.ErrInvalidConfig, elastic.ErrInvalidConfig,
// trainer.ErrForeignCheckpoint, trainer.ErrFinishedCheckpoint,
// trainer.ErrSettingsMismatch (a worker the job's running members refused
// for its settings exits StatusRefused instead), trainer.ErrModelMismatch and
// trainer.ErrShapeMismatch (each of these trainer errors is the one of
// package worker of the same name, which launch tests for, so launch does
// not import the trainer). A worker that exits with it is never
// restarted, and the launcher stops the job. trainer.ErrStranger is not
// among them: the workers of one launcher share its secret, so there a
// stranger verdict points at a transient fault rather than a wrong secret. A Go panic exits 2 (the runtime's status), not
// StatusPermanent: a panic is a bug that may not recur, so a panicking
// worker is restarted like any crash, unless it panicked within
// Config.StartupWindow of its index's first start, where status 2 reads
// as a refused command line (Exit.Usage).
//
// A worker ends with os.Exit(launch.ExitStatus(err)) on the error of its
// trainer's Run (and of trainer.New), and the launcher reads that status:
// a worker's status 0 means the job finished, so a worker must not exit 0
// unless Run returned nil. For a launcher's error it is StatusUsage when
// err wraps ErrUsage (a job whose workers' command line was refused),
// ErrPermanent (a job stopped by a worker's permanent error) or
// ErrInvalidConfig (the launcher's own Config or Spec), so a command like
// etrun exits 2 as for a bad flag of its own.
func ExitStatus(err error) int {
	switch {
	case err == nil:
		return StatusFinished
	case errors.Is(err, ErrUsage), errors.Is(err, ErrPermanent), errors.Is(err, ErrInvalidConfig):
		return StatusUsage
	case errors.Is(err, worker.ErrCheckpoint):
		return StatusFailed
	case errors.Is(err, worker.ErrPreempted), errors.Is(err, ErrPreempted), errors.Is(err, worker.ErrReleased):
		return StatusPreempted // a graceful leave: on SIGTERM, or by a scaling decision
	case errors.Is(err, ErrFailed):
		return StatusFailed // a job's error, also when it wraps elastic.ErrJobFinished
	case Refused(err):
		return StatusRefused
	case Permanent(err):
		return StatusPermanent
	case errors.Is(err, elastic.ErrJobFinished):
		return StatusJobFinished
	}
	return StatusFailed
}

// Permanent reports whether err is an error that a restart of the worker
// cannot fix: the same command, configuration and checkpoint directory
// fail the same way again (see ExitStatus for the list).
func Permanent(err error) bool {
	for _, p := range permanentErrors {
		if errors.Is(err, p) {
			return true
		}
	}
	return false
}

// Refused reports whether err says that this worker was refused by the
// job's running members for settings (or a model) that differ from theirs:
// a *trainer.SettingsError whose Refused is not empty, which matches
// worker.ErrRefused. The members that refused it train on; see
// StatusRefused.
func Refused(err error) bool {
	return errors.Is(err, worker.ErrRefused)
}

// permanentErrors are the errors Permanent matches.
var permanentErrors = []error{
	worker.ErrInvalidConfig, elastic.ErrInvalidConfig,
	worker.ErrForeignCheckpoint, worker.ErrFinishedCheckpoint,
	worker.ErrSettingsMismatch, worker.ErrModelMismatch, worker.ErrShapeMismatch,
}
