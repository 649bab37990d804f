package launch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic/standalone"
)

// Result is what the launcher saw of a job.
type Result struct {
	// JobID is the job's ID (Config.JobID, or the one drawn).
	JobID string
	// Store is the host:port the workers were given (EnvStore).
	Store string
	// Outcome is the job's outcome by the exit status rule (package doc).
	Outcome Outcome
	// Exits holds every worker process's exit, in the order the launcher
	// saw them (restarted workers have several).
	Exits []Exit
	// Restarts counts the restarts of crashed workers (at most
	// Config.MaxRestarts).
	Restarts int
	// Stopped is true when the launcher forwarded a stop signal (Job.Stop,
	// Job.Kill or the Start context done).
	Stopped bool
	// Wall is the time from Start to the last exit.
	Wall time.Duration
}

// ExitStatus is the job's exit status: StatusFinished, StatusPreempted,
// StatusFailed or StatusUsage, by the rule in the package doc.
func (r Result) ExitStatus() int { return jobStatus(r.Outcome, r.Exits, r.Stopped) }

// Last returns the last exit of each worker index, by index.
func (r Result) Last() []Exit { return lastExits(r.Exits) }

// Job is a running job: its worker processes and, unless Config.Redis is
// set, its embedded store. Start one with Start, end it with Wait. Its
// methods are safe for concurrent use.
type Job struct {
	spec       Spec
	cfg        Config
	hooks      Hooks
	log        *slog.Logger
	jobID      string
	store      string
	secret     []byte
	srv        *standalone.Server
	mark       *marker  // the launcher's mark on the job in Config.Redis; nil with the embedded store
	env        []string // every worker's environment before its launch variables
	gomaxprocs string   // "GOMAXPROCS=n", or "" to leave it unset
	shareCores int      // EnvShareCores for the workers, or 0
	stdout     io.Writer
	stderr     io.Writer
	start      time.Time

	// The supervisor goroutine's state (Start's before it runs).
	next      int              // the next new worker index
	running   map[*proc]bool   // processes whose exit is not handled yet
	restarts  int              //
	finished  bool             // a worker exited 0, or with StatusJobFinished
	trained   bool             // a worker exited 0: this launch finished the job
	stopping  bool             // a stop signal was forwarded (or Kill)
	stopCause error            // the Start context's error, when that was the stop
	exits     []Exit           //
	exitc     chan procExit    // from the waiter goroutines
	addc      chan addRequest  // from Add
	stopc     chan os.Signal   // from Stop (one pending at most)
	killc     chan struct{}    // from Kill (one pending at most)
	waiters   sync.WaitGroup   // one per process
	done      chan struct{}    // closed when the job is over and res, err are set
	res       Result           //
	err       error            //
	mu        sync.Mutex       // guards procs and every proc's gone
	procs     map[int]*proc    // the newest process of each worker index
	graceTime <-chan time.Time // set while a grace period runs
	// Set once the job finished while workers still run: what runs one
	// grace period later is killed (Exit.AfterFinish).
	finishTime <-chan time.Time

	// Scaling (the supervisor's).
	ctl      *controlServer   // nil without Autoscale and CapacityFile
	ctlc     chan ctlCall     // from the control socket
	capw     *capacityWatcher // nil without CapacityFile
	capc     chan int         // from capw
	capacity int              // workers the capacity file allows; 0: no bound
	goal     int              // workers the job aims for: Workers, then Resize, Release and Add move it
	free     map[int]bool     // indices whose last process left by release or a capacity drop
	// With Autoscale, a capacity drop waits ReleaseWait for the workers'
	// own releases before the launcher shrinks what is left.
	shrinkTimer *time.Timer
	shrinkTime  <-chan time.Time

	eventMu sync.Mutex // serialises Hooks.OnEvent
}

// proc is one worker process.
type proc struct {
	Process
	cmd     *exec.Cmd
	started time.Time
	gone    bool // exited: it and its group get no more signals (Job.mu)
	atStop  bool // running when the stop signal was forwarded (supervisor)
	killed  bool // the launcher SIGKILLed it (supervisor)
	// afterFinish: killed because it outstayed the finished job (supervisor)
	afterFinish bool
	released    bool       // it called Release (supervisor)
	shrunk      bool       // the launcher told it to leave: the capacity dropped (supervisor)
	events      *eventPipe // its events, with Hooks.OnEvent; nil otherwise
}

type procExit struct {
	p   *proc
	err error // cmd.Wait's
}

type addRequest struct {
	n     int
	reply chan addReply
}

type addReply struct {
	workers []int
	err     error
}

// Run starts a job (Start) and waits for it (Wait). When ctx is done the
// launcher forwards SIGTERM to every worker and SIGKILLs what is left
// after Config.GracePeriod; Run then returns within about that time.
func Run(ctx context.Context, spec Spec, cfg Config, opts ...Option) (Result, error) {
	j, err := Start(ctx, spec, cfg, opts...)
	if err != nil {
		return Result{}, err
	}
	return j.Wait()
}

// Start checks spec and cfg, opens the store (checks that Config.Redis
// answers PING within 3 s and holds no other launcher's mark on the job
// ID, or starts the embedded one), starts
// Config.Workers worker processes and returns the running job. ctx is the
// job's life: when it is done the launcher stops the job as Stop(SIGTERM)
// does. While the job runs the launcher keeps a mark on it in Config.Redis
// (a key beside the rendezvous' keys of the job, holding a hash of the job
// secret, refreshed every 3.3 s, expiring 10 s after the launcher stops), so
// that a second launcher of the job ID with another secret is refused with
// ErrJobInUse instead of sending the running job strangers. Errors:
// ErrInvalidConfig wrapped, ErrJobInUse, the store's error, a worker that
// cannot start (then every worker started is killed and reaped, and the
// embedded store closed, before Start returns), or ctx's error.
func Start(ctx context.Context, spec Spec, cfg Config, opts ...Option) (*Job, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	j := &Job{
		spec: spec, cfg: cfg, hooks: o.hooks, log: o.log, jobID: cfg.JobID, start: time.Now(),
		running: map[*proc]bool{}, procs: map[int]*proc{},
		exitc: make(chan procExit), addc: make(chan addRequest), stopc: make(chan os.Signal, 1),
		killc: make(chan struct{}, 1), done: make(chan struct{}),
		goal: cfg.Workers, free: map[int]bool{},
	}
	if j.log == nil {
		j.log = slog.New(slog.DiscardHandler)
	}
	if j.jobID == "" {
		j.jobID = "job-" + randomHex(6)
	}
	j.secret = append([]byte(nil), cfg.Secret...)
	if cfg.Secret == nil {
		j.secret = make([]byte, 32)
		rand.Read(j.secret)
	}
	j.stdout, j.stderr = outputs(spec.Stdout, spec.Stderr)
	j.env = append(os.Environ(), spec.Env...)
	// The control variables are this launcher's alone: a worker never
	// inherits an outer launcher's (etrun under etrun).
	j.env = slices.DeleteFunc(j.env, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == EnvControl || k == EnvAutoscale || k == EnvShareCores || k == EnvEvents
	})
	if n := cfg.GOMAXPROCS; n != -1 && !hasVar(j.env, "GOMAXPROCS") {
		if n == 0 {
			n = max(1, runtime.NumCPU()/cfg.Workers)
			if cfg.Autoscale || cfg.CapacityFile != "" {
				// The job's size changes: each worker's trainer divides
				// the cores by the round's members on its host instead.
				j.shareCores = runtime.NumCPU()
			}
		}
		j.gomaxprocs = "GOMAXPROCS=" + strconv.Itoa(n)
	}

	if cfg.CapacityFile != "" {
		n, err := readCapacity(cfg.CapacityFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		j.capacity, j.capc = n, make(chan int)
	}
	if cfg.Autoscale || cfg.CapacityFile != "" {
		j.ctlc = make(chan ctlCall)
		ctl, err := startControl(j.ctlc, j.log)
		if err != nil {
			return nil, err
		}
		j.ctl = ctl
	}
	if err := j.openStore(ctx); err != nil {
		if j.ctl != nil {
			j.ctl.close()
		}
		return nil, err
	}
	first := cfg.Workers
	if j.capacity > 0 {
		first = min(first, j.capacity)
	}
	attrs := []any{"job", j.jobID, "workers", first, "store", j.describeStore(),
		"max_restarts", cfg.MaxRestarts, "grace_period", cfg.GracePeriod}
	if cfg.CapacityFile != "" {
		attrs = append(attrs, "capacity", j.capacity, "capacity_file", cfg.CapacityFile)
	}
	if cfg.Autoscale {
		attrs = append(attrs, "autoscale", true)
	}
	j.log.Info("job starting", attrs...)
	for range first {
		if err := j.spawn(j.next, 0); err != nil {
			j.abort()
			return nil, err
		}
		j.next++
	}
	if cfg.CapacityFile != "" {
		j.capw = startCapacity(cfg.CapacityFile, cfg.CapacityPoll, j.capacity, j.capc, j.log)
	}
	go j.supervise(ctx)
	return j, nil
}

// openStore pings Config.Redis and marks the job there, or starts the
// embedded store.
func (j *Job) openStore(ctx context.Context) error {
	if j.cfg.NoStore {
		return nil
	}
	if j.cfg.Redis != "" {
		if err := ping(ctx, j.cfg.Redis); err != nil {
			return err
		}
		// A Redis others share may run this job ID under another
		// launcher: refuse, rather than start strangers to that job.
		m, err := claimMark(ctx, j.cfg.Redis, j.jobID, j.secret, j.log)
		if err != nil {
			return err
		}
		j.store, j.mark = j.cfg.Redis, m
		return nil
	}
	srv, err := standalone.Start(ctx, j.cfg.StoreListen)
	if err != nil {
		return fmt.Errorf("launch: embedded store: %w", err)
	}
	j.srv, j.store = srv, srv.Addr()
	return nil
}

// JobID returns the job's ID.
func (j *Job) JobID() string { return j.jobID }

// Store returns the host:port of the job's store, as given to the workers.
func (j *Job) Store() string { return j.store }

// Done is closed when the job is over (Wait then returns at once).
func (j *Job) Done() <-chan struct{} { return j.done }

// Wait waits until every worker process has exited and been reaped and the
// embedded store is closed, and returns the Result. Its error is nil when
// the job finished, wraps ErrPreempted when it was preempted and ErrFailed
// when it failed (naming the worker processes that decided it), and also
// wraps the Start context's error when that stopped it. Wait returns at
// most about Config.GracePeriod after a stop; a job that is not stopped
// runs as long as its workers do. Safe to call several times and from
// several goroutines; every call returns the same.
func (j *Job) Wait() (Result, error) {
	<-j.done
	return j.res, j.err
}

// Add starts n more workers (the next indices, returned) and returns once
// they started. Errors: ErrJobOver once every worker exited; a stop in
// progress; more than Config.MaxWorkers workers over the job (nothing
// starts); a worker that cannot start (the ones before it run); ctx's
// error. Must not be called from a hook.
func (j *Job) Add(ctx context.Context, n int) ([]int, error) {
	if n < 1 {
		return nil, fmt.Errorf("launch: Add(%d): want at least 1", n)
	}
	r := addRequest{n: n, reply: make(chan addReply, 1)}
	select {
	case j.addc <- r:
	case <-j.done:
		return nil, ErrJobOver
	case <-ctx.Done():
		return nil, fmt.Errorf("launch: add: %w", ctx.Err())
	}
	rep := <-r.reply // the supervisor answers at once
	return rep.workers, rep.err
}

// Signal sends sig to worker's process group (the worker and whatever it
// started): a fault to inject, or a signal of the caller's own. The
// launcher does not treat the exit that follows differently from any
// other (a SIGKILLed worker is restarted when restarts are left). Errors:
// ErrNoWorker when the index has no running process. Safe in hooks.
func (j *Job) Signal(worker int, sig syscall.Signal) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	p := j.procs[worker]
	if p == nil || p.gone {
		return fmt.Errorf("%w: worker %d", ErrNoWorker, worker)
	}
	if err := signalGroup(p.PID, sig); err != nil {
		return fmt.Errorf("launch: signal worker %d (pid %d): %w", worker, p.PID, err)
	}
	return nil
}

// Stop stops the job gracefully: the launcher forwards sig (SIGTERM when
// nil or not a syscall.Signal) to every worker's process group, restarts
// nothing more, and SIGKILLs what is left after Config.GracePeriod. Only
// the first Stop counts. It does not wait: Wait does. Safe in hooks.
func (j *Job) Stop(sig os.Signal) {
	if sig == nil {
		sig = syscall.SIGTERM
	}
	select {
	case j.stopc <- sig:
	default: // a stop is pending already
	}
}

// Kill SIGKILLs every worker's process group now and restarts nothing
// more (a second Ctrl-C). It does not wait: Wait does. Safe in hooks.
func (j *Job) Kill() {
	select {
	case j.killc <- struct{}{}:
	default:
	}
}

// supervise is the job's goroutine: it handles exits, restarts, Add, the
// stop and the grace period until no process is left, then closes the
// store and publishes the result.
func (j *Job) supervise(ctx context.Context) {
	ctxDone := ctx.Done()
	var grace, finished *time.Timer
	for len(j.running) > 0 {
		if j.finished && finished == nil && !j.stopping {
			finished = j.armFinish()
		}
		select {
		case e := <-j.exitc:
			if j.handleExit(e) && len(j.running) > 0 {
				grace = j.stop(syscall.SIGTERM, nil, grace)
			}
		case r := <-j.addc:
			ws, err := j.add(r.n)
			r.reply <- addReply{ws, err}
		case n := <-j.capc:
			j.setCapacity(n)
		case c := <-j.ctlc:
			c.reply <- j.control(c.req)
		case <-j.shrinkTime:
			j.shrinkTime = nil
			if j.stopping || j.finished {
				break
			}
			if live := j.live(); j.capacity > 0 && live <= j.capacity {
				j.log.Info("the workers' own releases brought the job within the capacity; stopping none",
					"running", live, "capacity", j.capacity)
				break
			}
			j.reconcile("capacity")
		case sig := <-j.stopc:
			grace = j.stop(sig, nil, grace)
		case <-ctxDone:
			ctxDone = nil
			cause := ctx.Err()
			if c := context.Cause(ctx); c != nil && c != cause {
				cause = fmt.Errorf("%w (%v)", cause, c) // e.g. signal.NotifyContext's signal
			}
			grace = j.stop(syscall.SIGTERM, cause, grace)
		case <-j.killc:
			// A stop without a grace period: every worker counts as
			// running at the stop, and none leaves gracefully.
			j.stopping = true
			for p := range j.running {
				p.atStop = true
			}
			j.killAll("kill requested")
		case <-j.graceTime:
			j.graceTime = nil
			j.killAll(fmt.Sprintf("grace period of %v over", j.cfg.GracePeriod))
		case <-j.finishTime:
			j.finishTime = nil
			for p := range j.running {
				p.afterFinish = true
			}
			j.killAll(fmt.Sprintf("still running %v after the job finished: hung or stopped", j.cfg.GracePeriod))
		}
	}
	for _, t := range []*time.Timer{grace, finished} {
		if t != nil {
			t.Stop()
		}
	}
	j.finish()
}

// armFinish starts the grace period of the workers still running after the
// job finished: a worker exited 0, so the others have nothing left to
// train; they normally exit at the same step boundary, and one that does
// not within the grace period is hung (or stopped) and is killed, so that
// the launcher never waits for it forever.
func (j *Job) armFinish() *time.Timer {
	msg := "the job finished; waiting for the other workers to exit"
	if !j.trained {
		// Only StatusJobFinished so far: the job ID's job was over before
		// this launch (see jobOutcome, which calls that a failure).
		msg = "a worker found the job already finished (a new job ID trains again); waiting for the other workers to exit"
	}
	j.log.Info(msg, "workers", len(j.running), "kill_after", j.cfg.GracePeriod)
	t := time.NewTimer(j.cfg.GracePeriod)
	j.finishTime = t.C
	return t
}

// finish reaps, closes the store and publishes the result.
func (j *Job) finish() {
	j.waiters.Wait()
	j.closeScaling()
	if j.mark != nil {
		j.mark.release()
	}
	if j.srv != nil {
		j.srv.Close()
	}
	o := jobOutcome(j.exits, j.stopping)
	j.res = Result{JobID: j.jobID, Store: j.store, Outcome: o, Exits: j.exits, Restarts: j.restarts,
		Stopped: j.stopping, Wall: time.Since(j.start)}
	j.err = jobError(o, j.exits, j.stopping, j.stopCause)
	level := slog.LevelInfo
	if o == Failed {
		level = slog.LevelError
	}
	attrs := []any{"job", j.jobID, "outcome", o.String(), "exit_status", j.res.ExitStatus(), "restarts", j.restarts,
		"wall", j.res.Wall.Round(time.Millisecond)}
	if n := countAfterFinish(j.exits); n > 0 {
		attrs = append(attrs, "killed_after_finish", n)
		level = max(level, slog.LevelWarn)
	}
	if j.err != nil && o == Failed {
		attrs = append(attrs, "err", j.err)
	}
	j.log.Log(context.Background(), level, "job over", attrs...)
	close(j.done)
}

// abort ends a Start that failed part way: it kills and reaps the workers
// started so far and closes the store.
func (j *Job) abort() {
	j.stopping = true
	j.killAll("start failed")
	for len(j.running) > 0 {
		e := <-j.exitc
		delete(j.running, e.p)
	}
	j.waiters.Wait()
	j.closeScaling()
	if j.mark != nil {
		j.mark.release()
	}
	if j.srv != nil {
		j.srv.Close()
	}
}

// spawn starts the restart-th process of worker index i.
func (j *Job) spawn(i, restart int) error {
	p := &proc{Process: Process{Worker: i, Restart: restart}}
	w := Worker{Store: j.store, JobID: j.jobID, Secret: j.secret, Index: i, Workers: j.cfg.Workers,
		Restart: restart, GracePeriod: j.cfg.GracePeriod, Autoscale: j.cfg.Autoscale,
		ShareCores: j.shareCores}
	if j.ctl != nil {
		w.Control = j.ctl.path
	}
	var argv []string
	if j.spec.Wrap != nil {
		argv = append(argv, j.spec.Wrap(i)...)
	}
	argv = append(argv, j.spec.Command...)
	cmd := exec.Command(argv[0], argv[1:]...)
	if cmd.Err != nil {
		return fmt.Errorf("launch: worker %d: %w", i, cmd.Err)
	}
	cmd.Env = append([]string(nil), j.env...)
	if j.gomaxprocs != "" {
		cmd.Env = append(cmd.Env, j.gomaxprocs)
	}
	cmd.Env = append(cmd.Env, w.environ()...)
	cmd.Dir = j.spec.Dir
	cmd.Stdout, cmd.Stderr = j.stdout, j.stderr
	// Output a worker's children still write after it exited is cut off
	// after this long rather than holding up the exit (they are killed
	// with its process group anyway).
	cmd.WaitDelay = 2 * time.Second
	if err := j.openEvents(p, cmd); err != nil {
		return err
	}
	if j.hooks.Prepare != nil {
		if err := j.hooks.Prepare(p.Process, cmd); err != nil {
			p.events.abandon()
			return fmt.Errorf("launch: worker %d: prepare: %w", i, err)
		}
	}
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		p.events.abandon()
		return fmt.Errorf("launch: start worker %d: %w", i, err)
	}
	p.cmd, p.PID, p.started = cmd, cmd.Process.Pid, time.Now()
	j.mu.Lock()
	j.procs[i] = p
	j.mu.Unlock()
	j.running[p] = true
	j.waiters.Add(1)
	go j.wait(p)
	j.log.Info("worker started", "worker", i, "restart", restart, "pid", p.PID)
	if j.hooks.OnStart != nil {
		j.hooks.OnStart(p.Process)
	}
	j.startEvents(p)
	return nil
}

// wait is a process's waiter goroutine, owned by the Job (waiters): it
// waits for the exit, kills what the worker left in its process group,
// reaps it and hands the exit to the supervisor.
func (j *Job) wait(p *proc) {
	defer j.waiters.Done()
	zombie := waitExited(p.PID)
	j.mu.Lock()
	p.gone = true
	j.mu.Unlock()
	if zombie {
		// The group's ID stays reserved while its leader is a zombie:
		// nothing else can be hit. ESRCH (nothing left) is the usual case.
		_ = signalGroup(p.PID, syscall.SIGKILL)
	}
	err := p.cmd.Wait()
	p.events.drain()
	j.exitc <- procExit{p: p, err: err}
}

// handleExit records an exit and restarts its worker when the policy says
// so. It reports whether the job must stop: the worker exited with
// StatusPermanent (an error a restart cannot fix) while the job was
// neither stopping nor finished.
func (j *Job) handleExit(e procExit) (stop bool) {
	p := e.p
	delete(j.running, p)
	st := p.cmd.ProcessState
	x := Exit{Process: p.Process, Code: st.ExitCode(), Killed: p.killed, AtStop: p.atStop, AfterFinish: p.afterFinish,
		At: time.Now(), Err: e.err}
	x.Ran = x.At.Sub(p.started)
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x.Signal = ws.Signal()
	}
	if errors.Is(e.err, exec.ErrWaitDelay) {
		x.Err = nil // the status is known; only the output of a child was cut
		if x.Code != 0 {
			x.Err = &exec.ExitError{ProcessState: st}
		}
	}
	x.Outcome = classify(x.Code, x.Signal)
	x.JobFinished = x.Signal == 0 && x.Code == StatusJobFinished
	if x.Outcome == Finished || x.JobFinished {
		j.finished = true // a new member would find the job over
		j.trained = j.trained || x.Outcome == Finished
	}
	x.Permanent = x.Signal == 0 && x.Code == StatusPermanent
	var doomed string
	x.AtStart, x.Usage, doomed = startFailure(x, j.exits, j.cfg.StartupWindow)
	x.Refused = x.Signal == 0 && x.Code == StatusRefused
	switch {
	case x.Permanent:
		doomed = "it stopped on an error that a restart cannot fix (status 78, launch.StatusPermanent)"
	case x.Refused:
		doomed = "the job's running members refused it for settings that differ from theirs (status 79, launch.StatusRefused)"
	}
	stop = x.Permanent && !j.stopping && !j.finished
	x.Released = p.released || p.shrunk
	x.Restarting = restartPolicy(x.Outcome, j.stopping, j.finished, doomed != "", j.restarts, j.cfg.MaxRestarts) && !x.Released
	if x.Released {
		j.free[x.Worker] = true
	}
	j.exits = append(j.exits, x)
	attrs := exitAttrs(x)
	killedBy := x.Signal == syscall.SIGTERM || x.Signal == syscall.SIGINT
	switch {
	case x.Outcome == Finished:
		j.log.Info("worker finished", attrs...)
	case x.Released && x.Outcome == Preempted:
		j.log.Info("worker left gracefully as told: "+leaveReason(p)+"; not restarting it", attrs...)
	case x.Released:
		j.log.Warn("worker told to leave did not leave gracefully ("+leaveReason(p)+"); not restarting it", attrs...)
	case x.Outcome == Preempted:
		j.log.Info("worker left as preempted", attrs...)
	case x.AfterFinish:
		j.log.Warn("worker killed: it was still running a grace period after the job finished (hung or stopped)",
			append(attrs, "grace_period", j.cfg.GracePeriod)...)
	case killedBy && !x.Killed:
		// Not Preempted: the signal's default action ended it, so it
		// committed and checkpointed nothing (a trainer that handles the
		// signal with Preempt exits with StatusPreempted instead).
		j.log.Warn(fmt.Sprintf("worker killed by %s: it does not handle preemption, nothing was committed "+
			"(call trainer.Preempt on the signal and exit with launch.ExitStatus)", sigName(x.Signal)), attrs...)
		if x.Restarting {
			j.log.Warn("restarting the worker as a new member", "worker", x.Worker,
				"job_restarts", j.restarts+1, "max_restarts", j.cfg.MaxRestarts)
		}
	case x.Restarting:
		j.log.Warn("worker crashed; restarting it as a new member",
			append(attrs, "job_restarts", j.restarts+1, "max_restarts", j.cfg.MaxRestarts)...)
	case j.stopping || j.finished:
		j.log.Warn("worker failed", attrs...)
	case x.Permanent:
		j.log.Error("worker failed; not restarting it, and stopping the job: "+doomed+"; its own message above says which", attrs...)
	case x.Refused:
		j.log.Error("worker refused; not restarting it, the job goes on without it: "+doomed+"; its own message above says which", attrs...)
	case doomed != "":
		j.log.Error("worker failed at start; not restarting it: "+doomed, attrs...)
	default:
		j.log.Error("worker crashed; not restarting it: the job's restarts are used up",
			append(attrs, "job_restarts", j.restarts, "max_restarts", j.cfg.MaxRestarts)...)
	}
	if j.hooks.OnExit != nil {
		j.hooks.OnExit(x)
	}
	if x.Released && !stop && !j.stopping && !j.finished && j.live() < j.want() {
		// A leaver's share of the capacity is free: start what waited
		// for it (reconcile).
		j.reconcile("capacity")
	}
	if !x.Restarting {
		return stop
	}
	j.restarts++
	if err := j.spawn(x.Worker, x.Restart+1); err != nil {
		j.log.Error("worker restart failed", "worker", x.Worker, "err", err)
		j.exits = append(j.exits, Exit{Process: Process{Worker: x.Worker, Restart: x.Restart + 1}, Code: -1,
			Outcome: Failed, At: time.Now(), Err: err})
	}
	return false
}

// add starts n more workers for Add.
func (j *Job) add(n int) ([]int, error) {
	if j.stopping {
		return nil, errors.New("launch: add: the job is stopping")
	}
	if n > j.cfg.MaxWorkers-j.next {
		return nil, fmt.Errorf("launch: add %d: %d workers started already, and Config.MaxWorkers is %d", n, j.next, j.cfg.MaxWorkers)
	}
	live := j.live()
	if j.capacity > 0 && len(j.running)+n > j.capacity {
		// Workers still leaving hold their share until they exit.
		return nil, fmt.Errorf("%w: add %d to the %d workers running (%d of them leaving): the capacity file allows %d",
			ErrCapacity, n, len(j.running), len(j.running)-live, j.capacity)
	}
	j.goal = max(j.goal, live+n)
	var ws []int
	for range n {
		if err := j.spawn(j.next, 0); err != nil {
			j.scaled(Scale{From: live, To: live + len(ws), Reason: "add", Started: ws})
			return ws, err
		}
		ws = append(ws, j.next)
		j.next++
	}
	j.scaled(Scale{From: live, To: live + n, Reason: "add", Started: ws})
	return ws, nil
}

// stop forwards sig to every running worker and arms the grace timer; a
// second stop does nothing.
func (j *Job) stop(sig os.Signal, cause error, grace *time.Timer) *time.Timer {
	if j.stopping {
		return grace
	}
	s, ok := sig.(syscall.Signal)
	if !ok {
		s = syscall.SIGTERM
	}
	j.stopping, j.stopCause = true, cause
	j.log.Info("stopping the job: forwarding the signal to every worker", "signal", sigName(s),
		"workers", len(j.running), "grace_period", j.cfg.GracePeriod)
	for p := range j.running {
		p.atStop = true
		j.signal(p, s)
	}
	grace = time.NewTimer(j.cfg.GracePeriod)
	j.graceTime = grace.C
	return grace
}

// killAll SIGKILLs every running worker's process group.
func (j *Job) killAll(why string) {
	for p := range j.running {
		if j.signal(p, syscall.SIGKILL) {
			p.killed = true
			j.log.Warn("killing worker", "worker", p.Worker, "pid", p.PID, "why", why)
		}
	}
}

// signal sends sig to p's process group unless p exited; it reports
// whether it sent it.
func (j *Job) signal(p *proc, sig syscall.Signal) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if p.gone {
		return false
	}
	if err := signalGroup(p.PID, sig); err != nil {
		j.log.Warn("signal failed", "worker", p.Worker, "pid", p.PID, "signal", sigName(sig), "err", err)
		return false
	}
	return true
}

func (j *Job) describeStore() string {
	if j.srv != nil {
		return "embedded " + j.store
	}
	return j.store
}

// ping checks that the Redis at addr answers within 3 s.
func ping(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("launch: the store at %s does not answer: %w", addr, err)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// hasVar reports whether env sets name.
func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && k == name {
			return true
		}
	}
	return false
}

// sigName is a signal's name ("SIGTERM"); syscall.Signal's String is its
// description ("terminated").
func sigName(s syscall.Signal) string {
	if n, ok := sigNames[s]; ok {
		return n
	}
	return s.String()
}

var sigNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGSEGV: "SIGSEGV", syscall.SIGPIPE: "SIGPIPE", syscall.SIGTERM: "SIGTERM", syscall.SIGUSR1: "SIGUSR1",
	syscall.SIGUSR2: "SIGUSR2", syscall.SIGSTOP: "SIGSTOP", syscall.SIGCONT: "SIGCONT",
}

// countAfterFinish counts the processes killed because they outstayed the
// finished job.
func countAfterFinish(exits []Exit) int {
	n := 0
	for _, e := range exits {
		if e.AfterFinish {
			n++
		}
	}
	return n
}

// exitAttrs are the log attributes of an exit.
func exitAttrs(x Exit) []any {
	a := []any{"worker", x.Worker, "pid", x.PID}
	if x.Restart > 0 {
		a = append(a, "restart", x.Restart)
	}
	if x.Signal != 0 {
		a = append(a, "signal", sigName(x.Signal))
	} else {
		a = append(a, "status", x.Code)
	}
	if x.Killed {
		a = append(a, "killed", true)
	}
	a = append(a, "ran", x.Ran.Round(time.Millisecond))
	return a
}

// outputs returns the writers the workers get: *os.File and nil as they
// are, anything else behind one lock shared by both.
func outputs(o, e io.Writer) (io.Writer, io.Writer) {
	mu := new(sync.Mutex)
	wrap := func(w io.Writer) io.Writer {
		switch w.(type) {
		case nil, *os.File:
			return w
		}
		return &lockedWriter{mu: mu, w: w}
	}
	return wrap(o), wrap(e)
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
