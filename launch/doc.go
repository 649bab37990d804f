// Package launch runs the worker processes of an elastic job on one host,
// like torchrun, horovodrun or dlrover-run: N processes of any command (your
// own worker binary), a Redis-protocol store for their rendezvous (an
// embedded one by default), the job ID and secret handed to them in their
// environment, crashed workers restarted up to a limit, SIGTERM and SIGINT
// forwarded with a grace period, and the job's exit status. The command
// github.com/elastictrain/elastictrain/cmd/etrun is a thin layer over it.
//
// # The launcher side
//
//	cfg := launch.DefaultConfig() // 1 worker, 3 restarts, 30 s grace, embedded store
//	cfg.Workers = 4
//	res, err := launch.Run(ctx, launch.Spec{
//		Command: []string{"./worker", "-epochs", "3"},
//		Stdout:  os.Stdout, Stderr: os.Stderr,
//	}, cfg, launch.WithLogger(slog.Default()))
//	os.Exit(launch.ExitStatus(err))
//
// Run is Start followed by Job.Wait; a Job also adds workers (Add), sends
// a worker a signal (Signal), stops (Stop) or kills (Kill) the job, and
// calls Hooks as its processes start and exit.
//
// # The worker side
//
// A worker reads what the launcher told it with WorkerEnv, never by parsing
// the variables itself, and ends with the exit status of its trainer's Run:
//
//	w, err := launch.WorkerEnv()  // Store, JobID, Secret, Index, Restart, ...
//	cfg := trainer.DefaultConfig()
//	w.Configure(&cfg)             // JobID, Sync.Secret, GracePeriod
//	st := store.NewRedis(redis.NewClient(&redis.Options{Addr: w.Store}))
//	t, err := trainer.New(params, opt, loader, step, st, cfg)
//	// on SIGTERM or SIGINT: t.Preempt()
//	_, err = t.Run(ctx)
//	os.Exit(launch.ExitStatus(err)) // 0 finished, 143 preempted, 4 job already finished, 78 permanent, 79 refused, 1 failed
//
// The variables are EnvStore (ELASTICTRAIN_STORE, host:port), EnvJobID
// (ELASTICTRAIN_JOB_ID), EnvSecret (ELASTICTRAIN_SECRET, hex), EnvWorker
// (ELASTICTRAIN_WORKER, the worker's index, not its rank), EnvWorkers
// (ELASTICTRAIN_WORKERS), EnvRestart (ELASTICTRAIN_RESTART) and
// EnvGracePeriod (ELASTICTRAIN_GRACE_PERIOD, e.g. "30s").
//
// # Restarts
//
// A worker process that crashes (exits with a status other than 0, 143 or
// 130, or dies of any signal) is started again under the same index, with
// EnvRestart one higher, as long as the job has restarts left
// (Config.MaxRestarts, 3 by default, counted over the whole job), the
// launcher is not stopping, no worker has finished the job, and the crash
// is not one that a restart repeats. Within Config.StartupWindow (3 s) of
// its start, these are not restarted: status 2 on the first start of an
// index (its command line was refused: Go's flag package exits 2 on a bad
// flag, and so does a Go panic), and a failure with the same status or
// signal as the index's previous process had at its start.
//
// A worker that exits with StatusPermanent (78) is never restarted,
// whenever it comes: launch.ExitStatus gives it for the errors a restart
// cannot fix (an invalid configuration, a checkpoint directory of another
// model or of a finished job, settings or a model that differ from the
// job's; see ExitStatus and Permanent). The launcher then stops the whole
// job at once, as Job.Stop(SIGTERM) does, and the job fails with an error
// that names that worker and wraps ErrPermanent (status 2). A Go panic
// exits 2, not 78: a panic is a bug that may not recur, so a panicking
// worker is restarted like a crash, except at the first start of its
// index within the start-up window (where status 2 reads as a refused
// command line).
// The new process is a new member of the job: its trainer joins at the
// next step boundary and receives the current state from a peer, while the
// others train on without it in between (given Elastic.MinWorkers allows).
// A worker that left as preempted, or finished, is not restarted.
//
// # Signals and the grace period
//
// Every worker runs in a process group of its own, so a terminal's Ctrl-C
// reaches the launcher only. Job.Stop (etrun on SIGTERM or SIGINT, and
// Start's context when it is done, as SIGTERM) forwards the signal to
// every worker's process group, restarts nothing more, and SIGKILLs the
// groups still running Config.GracePeriod later; a trainer that calls
// Preempt on that signal commits, checkpoints and leaves within the part of
// the grace period Worker.Configure gives it, and exits with
// StatusPreempted (launch.ExitStatus of trainer.ErrPreempted): that is
// leaving as preempted. A worker that the signal itself kills (it has no
// handler) committed nothing: its exit is Failed, and it is reported as
// "killed by SIGTERM: it does not handle preemption". Job.Kill (etrun on a
// second signal) SIGKILLs every group at once.
//
// Once the job finished (a worker exited 0), the other workers get
// Config.GracePeriod to exit; one still running then is hung or stopped
// (a SIGSTOPped process does not even see a SIGTERM) and is SIGKILLed
// (Exit.AfterFinish), so Wait never waits for it forever. The job still
// finished.
//
// # No child left behind
//
// When a worker exits, what is left of its process group is SIGKILLed (on
// Linux, while the worker is still a zombie, so its group ID cannot have
// been reused). On Linux every worker also has the kernel's parent-death
// signal set to SIGKILL, so even a SIGKILLed launcher takes its workers
// with it; processes that a worker moved to a group or session of their own
// are outside the launcher's reach. Wait returns only after every worker
// was reaped.
//
// # One launcher per job ID
//
// With Config.Redis, the launcher keeps a mark on its job ID in that Redis
// while the job runs: a hash of the job secret, its pid and host, under
// the job's key prefix (et:{JOB}:launcher), refreshed every 3.3 s, deleted
// when the job is over and expiring 10 s after a launcher that was killed.
// Start refuses a job ID whose mark holds another secret's hash with
// ErrJobInUse, before any worker starts: its workers would be strangers to
// the running job. Launchers that are given the same secret (EnvSecret on
// several hosts) share the job and its mark. The embedded store is the
// launcher's own, so it needs no mark.
//
// # Scaling a running job
//
// Job.Add starts more workers. Config.CapacityFile bounds the workers by
// a file holding a whole number, read every Config.CapacityPoll (250 ms;
// an empty or unparsable read is ignored and logged once): when it drops,
// the newest workers get a SIGTERM and leave gracefully (Exit.Released:
// not restarted, neither failing nor preempting the job); when it rises,
// workers start again up to Config.Workers (or the last Resize or Add),
// on the indices of those that left, one Restart higher.
//
// With Config.Autoscale or Config.CapacityFile the launcher opens a
// control socket: a Unix socket in a directory of mode 0700, named to the
// workers in EnvControl (Unix sockets are found by path, so workers in
// network namespaces of their own reach it). Worker.Platform is its
// client, the trainer's worker.Platform: Capacity answers the capacity
// file (at most Config.MaxWorkers), Resize starts the missing workers
// (within the capacity and MaxWorkers; a lower target is left to the
// workers a decision names), Release marks the caller as leaving by
// decision (not restarted). The protocol is one JSON line each way per
// connection; a request the launcher cannot read gets an error line and a
// closed connection. Config.Autoscale reaches the workers as EnvAutoscale
// (Worker.Autoscale). Hooks.OnScale sees every such change.
//
// # Events, faults and placement
//
// With Hooks.OnEvent set, every worker gets a pipe of its own (EnvEvents,
// file descriptor 3) on which it writes Events with NewEmitter: its rounds,
// steps, the job done, an error. The launcher hands each one on, marked
// with the worker's index, after that process's OnStart and before its
// OnExit, one at a time; OnEvent may call Add and Signal, so a supervisor
// can act on a step. Netns places workers in Linux network namespaces
// (Spec.Wrap). Package launch/monitor runs a job watched by its events
// (progress, membership changes, recovery times, a Summary), injecting the
// step-triggered faults of launch/faults; the examples run through it.
//
// # Exit status
//
// Result.Outcome, Result.ExitStatus and Wait's error follow one rule, over
// the exits of every worker process:
//
//   - 0 (Finished, nil error) when any worker exited with status 0. A
//     worker exits 0 only when its trainer's Run returned nil, that is, the
//     job finished (launch.ExitStatus gives that). Crashes the job survived
//     do not change it; they are logged and in Result.Exits.
//   - 143 (Preempted, ErrPreempted) when the launcher forwarded a stop and
//     every worker running then left as preempted (exited by itself with
//     status 143 or 130; not killed by the signal) within the grace period;
//     or, without a stop, when the last process of every worker left so.
//   - 2 (Failed, ErrFailed and ErrUsage; StatusUsage) when every worker
//     process that decided the failure exited 2 at its first start: the
//     workers' command line was refused. Also 2 (Failed, ErrFailed and
//     ErrPermanent) when a worker exited with StatusPermanent: the error
//     names the first such worker, whose own message says what to fix.
//   - 1 (Failed, ErrFailed naming the workers) otherwise: a worker that
//     crashed with no restarts left while no other finished, one killed
//     after the grace period, a Kill. When a worker exited with
//     StatusJobFinished (its Run found the job ID already finished and
//     trained nothing: an earlier run of it), the error also wraps
//     elastic.ErrJobFinished, and no worker is restarted after it.
//
// # Concurrency
//
// A Job owns one goroutine that handles exits, restarts, Add and stops,
// and one per worker process that waits for it; Wait returns after all of
// them ended. Every method of Job is safe for concurrent use.
//
// Unix only; the parent-death signal and the safe kill of a dead worker's
// leftovers need Linux.
package launch
