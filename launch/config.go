package launch

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

// Spec says what to run: the worker's command, its environment and where
// its output goes. The same command runs in every worker process; a worker
// tells itself apart from the others with WorkerEnv.
type Spec struct {
	// Command is the worker's program and its arguments. Command[0] is
	// looked up in PATH (exec.LookPath) unless it holds a slash. Required.
	Command []string
	// Env is added to every worker's environment, after the launcher's own
	// environment and before the launch variables (EnvJobID and the
	// others), which always win.
	Env []string
	// Dir is the workers' working directory; "" means the launcher's.
	Dir string
	// Wrap, when set, returns worker i's command prefix: worker i runs
	// Wrap(i) followed by Command, e.g. {"ip", "netns", "exec", "host-1"}
	// to start it in a network namespace of its own. An empty prefix runs
	// Command as it is. Called once per process start (restarts too), from
	// the goroutine that starts it; it must not block.
	Wrap func(worker int) []string
	// Stdout and Stderr receive the workers' standard output and error; nil
	// discards it (the null device). An *os.File is handed to the workers
	// as it is, so the kernel orders their writes; any other writer gets
	// every worker's output through one lock, a write at a time. That lock
	// is launch's own: a caller that also writes to such a writer (a
	// logger on the same buffer) passes one that serialises its writes.
	Stdout, Stderr io.Writer
}

// Config holds the launcher's settings. Start from DefaultConfig; every
// field states its unit and default. A Config is a plain value, safe to
// copy.
type Config struct {
	// Workers is how many worker processes start at once. Default 1; at
	// least 1.
	Workers int
	// MaxWorkers bounds the worker processes the job may have over its
	// life: Workers plus every Job.Add (a restart takes its worker's place
	// and does not count, and so does a worker started when the capacity
	// rose or a Resize asked for more, which takes the index of one that
	// left by the capacity or a Release when there is one). Default 1024
	// (elastic.Config's default MaxWorkers); at least Workers.
	MaxWorkers int
	// MaxRestarts is how many times, in all, the launcher restarts a
	// worker that crashed (exited with a status other than 0 or the
	// preempted one, or was killed by a signal other than SIGTERM or
	// SIGINT). A restarted worker keeps its index and joins the job as a
	// new member. Counted per job, like torchrun's --max-restarts.
	// Default 3; 0 turns restarts off; not negative. A crash that a
	// restart would only repeat is not restarted (see StartupWindow).
	MaxRestarts int
	// StartupWindow is how soon after its start a worker process that
	// fails counts as failing at start (Exit.AtStart). Such a failure is
	// not restarted when a restart would repeat it: status 2 (a usage
	// error: the command line was refused) on the first start of a worker
	// index, or a failure at start with the same status or signal as the
	// previous process of the same index had, also at its start. When every worker's failure was such a status 2,
	// the job's exit status is StatusUsage. Default 3 s; 0 turns the rule
	// off (every crash is restarted while restarts are left); not negative.
	StartupWindow time.Duration
	// GracePeriod is how long the workers may take to leave after the
	// launcher forwarded a stop signal (Job.Stop, or the Start context
	// done) before it SIGKILLs what is left. Workers see it as
	// EnvGracePeriod; Worker.Configure leaves them part of it to exit.
	// It also bounds how long the workers may run on after the job
	// finished (a worker exited 0): what is still running one grace period
	// later is hung or stopped, and is SIGKILLed (Exit.AfterFinish).
	// Default 30 s (trainer.Config's default GracePeriod); above 0.
	GracePeriod time.Duration
	// Redis is the host:port of the Redis the workers rendezvous through.
	// Start checks that it answers PING before any worker starts. ""
	// (the default) starts an embedded Redis-protocol server
	// (elastic/standalone) in the launcher for the job's life.
	Redis string
	// NoStore says the workers reach their store by a configuration of
	// their own (a TLS, ACL or Sentinel Redis, say, which the launcher's
	// plain client cannot check): Start then neither starts the embedded
	// store nor pings Redis, keeps no mark on the job ID, and gives the
	// workers an empty EnvStore (WorkerEnv refuses it: such workers read
	// their own configuration). Redis must be "". Default false.
	NoStore bool
	// StoreListen is where the embedded store listens when Redis is "";
	// the workers are told the address it got. Default "127.0.0.1:0" (a
	// free loopback port). Workers in other network namespaces (Spec.Wrap)
	// need an address they can reach, or a Redis of their own.
	StoreListen string
	// JobID is the job's ID, passed to the workers as EnvJobID. "" (the
	// default) draws "job-" plus 12 random hex digits. Otherwise it must
	// be a valid elastic.Config.JobID (elastic.ValidateJobID).
	JobID string
	// Secret is the job secret, passed to the workers hex-encoded as
	// EnvSecret (never on a command line). nil (the default) draws 32
	// random bytes; otherwise at least 16 bytes.
	Secret []byte
	// GOMAXPROCS is the GOMAXPROCS given to each worker when neither the
	// launcher's environment nor Spec.Env sets it: 0 (the default) means
	// the host's cores divided by Workers, at least 1, so the workers of a
	// host do not oversubscribe its cores (the usual setting, like
	// torchrun's OMP_NUM_THREADS=1); -1 leaves it unset.
	GOMAXPROCS int
	// Autoscale tells the workers (EnvAutoscale) to size the job
	// themselves: Worker.Configure turns the trainer's autoscaling on, and
	// its decisions reach the launcher through the control socket
	// (Worker.Platform): Resize starts workers, within the capacity and
	// MaxWorkers; a worker a decision removes calls Release and is not
	// restarted. Default false.
	Autoscale bool
	// CapacityFile, when set, names a file holding how many workers the
	// platform allows now: a whole number >= 1, blanks around it ignored.
	// The launcher reads it at Start (a file it cannot read or parse then
	// fails Start with ErrInvalidConfig) and every CapacityPoll after, and
	// never runs more workers than it says: when it drops, the newest
	// workers get a SIGTERM and leave gracefully (they commit and go; they
	// are not restarted, and neither fail nor preempt the job: Exit.Released);
	// when it rises, workers start again (reusing the indices of those that
	// left), up to Workers, or the target of the last Resize or Add. A read
	// that is empty or does not parse (a file rewritten in place is empty
	// for an instant) is ignored and logged once; the last good value
	// stays. It also answers the workers' Platform.Capacity. Works with or
	// without Autoscale. Default "" (no bound but MaxWorkers).
	CapacityFile string
	// CapacityPoll is how often CapacityFile is read. Default 250 ms; at
	// least 10 ms when CapacityFile is set.
	CapacityPoll time.Duration
}

// DefaultMaxWorkers is Config.MaxWorkers' default: elastic.Config's
// default MaxWorkers, the largest world size a job accepts by default.
const DefaultMaxWorkers = 1024

// DefaultStartupWindow is Config.StartupWindow's default.
const DefaultStartupWindow = 3 * time.Second

// DefaultConfig returns the defaults: 1 worker, at most 1024 over the job,
// 3 restarts, a 3 s start-up window, a 30 s grace period, an embedded store on a loopback port, a
// random job ID and secret.
func DefaultConfig() Config {
	return Config{
		Workers:       1,
		MaxWorkers:    DefaultMaxWorkers,
		MaxRestarts:   3,
		StartupWindow: DefaultStartupWindow,
		GracePeriod:   30 * time.Second,
		StoreListen:   "127.0.0.1:0",
		CapacityPoll:  DefaultCapacityPoll,
	}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate and
// Spec.Validate.
var ErrInvalidConfig = errors.New("launch: invalid config")

// Validate reports the first setting out of range, wrapping
// ErrInvalidConfig. Zero values are errors here (start from DefaultConfig).
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Workers < 1:
		return bad("Workers %d: want at least 1", c.Workers)
	case c.MaxWorkers < c.Workers:
		return bad("MaxWorkers %d is below Workers %d", c.MaxWorkers, c.Workers)
	case c.MaxRestarts < 0:
		return bad("MaxRestarts %d: want 0 or more", c.MaxRestarts)
	case c.StartupWindow < 0:
		return bad("StartupWindow %v: want 0 (off) or more", c.StartupWindow)
	case c.GracePeriod <= 0:
		return bad("GracePeriod %v: want more than 0", c.GracePeriod)
	case c.NoStore && c.Redis != "":
		return bad("NoStore with Redis %q: want one of them", c.Redis)
	case c.Redis == "" && c.StoreListen == "" && !c.NoStore:
		return bad("StoreListen is empty: the embedded store needs an address (default 127.0.0.1:0)")
	case c.Secret != nil && len(c.Secret) < 16:
		return bad("Secret of %d bytes: want at least 16", len(c.Secret))
	case c.GOMAXPROCS < -1:
		return bad("GOMAXPROCS %d: want -1 (unset), 0 (cores / Workers) or a count", c.GOMAXPROCS)
	case c.CapacityFile != "" && c.CapacityPoll < 10*time.Millisecond:
		return bad("CapacityPoll %v: want at least 10ms (default 250ms)", c.CapacityPoll)
	}
	if c.JobID != "" {
		if err := elastic.ValidateJobID(c.JobID); err != nil {
			return bad("JobID: %v", err)
		}
	}
	return nil
}

// Validate reports a Spec that cannot start a worker: an empty Command, or
// a program that is not found (exec.LookPath), wrapping ErrInvalidConfig.
// Programs named by Wrap are looked up when each worker starts.
func (s Spec) Validate() error {
	if len(s.Command) == 0 || s.Command[0] == "" {
		return fmt.Errorf("%w: Spec.Command is empty: want the worker's program and its arguments", ErrInvalidConfig)
	}
	if _, err := exec.LookPath(s.Command[0]); err != nil {
		return fmt.Errorf("%w: worker command: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Hooks are callbacks on the life of the worker processes, for programs
// that present a job (progress lines, fault injection) or hand each worker
// something more than its environment. Every field may be nil. The hooks
// of a Job are called one at a time, never concurrently: from Start for the
// first workers, then from the job's own goroutine. They must not block for
// long and must not call Add, Signal or Wait (which wait for that
// goroutine); Stop and Kill are safe in them. OnEvent is the exception:
// see its comment.
type Hooks struct {
	// Prepare is called before each worker process starts (restarts too)
	// with the command about to start: Path, Args, Env, Dir, Stdout and
	// Stderr are set. It may add ExtraFiles, set Stdin, replace Stdout or
	// Stderr, or append to Args (arguments of this worker's own) or Env;
	// it must not start the command or set SysProcAttr (the
	// launcher's process group and parent-death signal replace it). An
	// error counts as a failed start of that worker: the worker does not
	// start, and Start (or Add) returns the error.
	Prepare func(w Process, cmd *exec.Cmd) error
	// OnStart is called after a worker process started.
	OnStart func(Process)
	// OnExit is called after a worker process exited and was reaped,
	// before the launcher restarts its worker (Exit.Restart says whether
	// it will).
	OnExit func(Exit)
	// OnScale is called after the launcher changed the number of workers
	// it runs for a reason other than a crash: the capacity file changed,
	// a worker's Resize or Release, or Job.Add.
	OnScale func(Scale)
	// OnEvent, when set, turns the event protocol on: every worker
	// process gets a pipe of its own, named to it in EnvEvents (file
	// descriptor 3, before any ExtraFiles Prepare adds), on which its
	// Emitter writes Events, and the launcher hands each one to OnEvent
	// with Event.Worker set to the process's index. For one process, OnStart
	// returns before its first OnEvent, and every event it wrote has been
	// handed on before its OnExit (the launcher waits up to 2 s after the
	// exit for the pipe to close; a child that keeps it open loses what it
	// writes later). OnEvent is called from the reading goroutine of each
	// process, one call at a time over the whole job, but concurrently
	// with the other hooks; while it blocks, that worker's writes wait once
	// its pipe is full. It may call every method of Job but Wait.
	OnEvent func(Event)
}

// Scale is one change of the number of workers the launcher runs (see
// Hooks.OnScale).
type Scale struct {
	// From and To are the workers running and not told to leave, before
	// and after the change.
	From, To int
	// Reason is "capacity" (the capacity file changed), "resize" (a
	// worker's Platform.Resize), "release" (a worker's Platform.Release)
	// or "add" (Job.Add).
	Reason string
	// Capacity is the capacity now; 0 without a capacity file.
	Capacity int
	// Started are the worker indices started; Leaving those told to leave
	// (SIGTERM) or released.
	Started, Leaving []int
}

// Option configures a Job beyond its Config: a logger or hooks.
type Option func(*options)

type options struct {
	log   *slog.Logger
	hooks Hooks
}

// WithLogger sends the launcher's own lines (workers started, exited,
// restarted; signals forwarded; workers killed after the grace period) to
// l. Default: discard.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithHooks sets the Hooks of the job; a second WithHooks replaces the
// first.
func WithHooks(h Hooks) Option { return func(o *options) { o.hooks = h } }
