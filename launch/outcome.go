package launch

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
)

// Outcome is how a worker process, or a whole job, ended.
type Outcome int

// The outcomes. The zero Outcome is none (still running).
const (
	// Finished: a worker exited with status 0; for a job, the job
	// finished (see the exit status rule in the package doc).
	Finished Outcome = iota + 1
	// Preempted: a worker left gracefully on a stop signal: it exited by
	// itself with status 143 (StatusPreempted, what launch.ExitStatus gives
	// for trainer.ErrPreempted) or 130. A worker that the signal itself
	// killed (no handler) did not leave gracefully: that is Failed. For a
	// job: every worker running when the launcher forwarded its stop
	// signal left so within the grace period.
	Preempted
	// Failed: anything else.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Finished:
		return "finished"
	case Preempted:
		return "preempted"
	case Failed:
		return "failed"
	}
	return "running"
}

// ExitStatus is the process exit status of the outcome: StatusFinished,
// StatusPreempted or StatusFailed (also for the zero Outcome).
func (o Outcome) ExitStatus() int {
	switch o {
	case Finished:
		return StatusFinished
	case Preempted:
		return StatusPreempted
	}
	return StatusFailed
}

// Process names one worker process: one start of a worker index.
type Process struct {
	// Worker is the worker's index (EnvWorker).
	Worker int
	// Restart is how many times the index was restarted before this
	// process (EnvRestart).
	Restart int
	// PID is the process ID; 0 in Hooks.Prepare, before the start.
	PID int
}

// Exit is how one worker process ended.
type Exit struct {
	Process
	// Code is the exit status, or -1 when a signal ended the process or
	// it never started.
	Code int
	// Signal is the signal that ended the process; 0 when it exited by
	// itself.
	Signal syscall.Signal
	// Outcome is Finished (status 0), Preempted (status 143 or 130) or
	// Failed (anything else: another status, death by any signal, SIGTERM
	// and SIGINT included, a failed start).
	Outcome Outcome
	// Ran is how long the process ran, from its start to the launcher
	// seeing its exit; 0 when it never started.
	Ran time.Duration
	// AtStart is true when the process failed (Outcome Failed, not killed
	// by the launcher) within Config.StartupWindow of its start.
	AtStart bool
	// Usage is true when the process was the first of its worker index and
	// exited with status 2 (StatusUsage) at start (AtStart): its command
	// line was refused (Go's flag package exits 2; so does a Go panic).
	// Such a worker is not restarted: the same command fails again.
	Usage bool
	// AfterFinish is true when the launcher killed the process because it
	// was still running Config.GracePeriod after the job finished (another
	// worker exited 0): a hung or stopped worker.
	AfterFinish bool
	// Killed is true when the launcher SIGKILLed the process: after the
	// grace period of a stop, or on Job.Kill.
	Killed bool
	// AtStop is true when the process was running when the launcher
	// forwarded its stop signal.
	AtStop bool
	// Restarting is true when the launcher starts the worker's index
	// again (Failed, no stop, the job not finished, restarts left).
	Restarting bool
	// Released is true when the launcher had told the worker to leave: the
	// capacity dropped (it sent the worker a SIGTERM) or a scaling
	// decision named it (it called Platform.Release). It is not restarted,
	// and its index may be started again when the job grows.
	Released bool
	// Permanent is true when the worker exited with StatusPermanent: it
	// stopped on an error that a restart cannot fix (an invalid
	// configuration, a foreign or finished checkpoint directory, settings
	// that differ from the job's; see ExitStatus). It is never restarted,
	// whenever it comes, and the launcher stops the job (Outcome is
	// Failed).
	Permanent bool
	// Refused is true when the worker exited with StatusRefused: the
	// job's running members refused it for settings that differ from
	// theirs and train on without it. It is not restarted, and the job
	// goes on.
	Refused bool
	// JobFinished is true when the worker exited with StatusJobFinished:
	// it found the job already finished and trained nothing (Outcome is
	// Failed, and it is not restarted).
	JobFinished bool
	// At is when the launcher saw the exit.
	At time.Time
	// Err is the error of waiting for the process (an *exec.ExitError for
	// a status other than 0), or of starting it; nil for status 0.
	Err error
}

func (e Exit) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "worker %d", e.Worker)
	switch {
	case e.PID == 0 && e.Restart > 0:
		fmt.Fprintf(&b, " (restart %d)", e.Restart)
	case e.PID == 0:
	case e.Restart > 0:
		fmt.Fprintf(&b, " (restart %d, pid %d)", e.Restart, e.PID)
	default:
		fmt.Fprintf(&b, " (pid %d)", e.PID)
	}
	switch {
	case e.PID == 0:
		fmt.Fprintf(&b, " did not start: %v", e.Err)
	case e.Killed && e.AfterFinish:
		b.WriteString(" was killed by the launcher: it was still running a grace period after the job finished")
	case e.Killed:
		b.WriteString(" was killed by the launcher")
	case e.Signal == syscall.SIGTERM || e.Signal == syscall.SIGINT:
		fmt.Fprintf(&b, " was killed by %v: it does not handle preemption, nothing was committed", sigName(e.Signal))
	case e.Permanent:
		fmt.Fprintf(&b, " exited with status %d: a permanent error (its own message says which: an invalid configuration, "+
			"a checkpoint directory of another model or of a finished job, settings that differ from the job's), "+
			"which a restart repeats", e.Code)
	case e.Refused:
		fmt.Fprintf(&b, " exited with status %d: the job's running members refused it, its settings differ from theirs "+
			"(its own message says which); they train on without it", e.Code)
	case e.Usage:
		fmt.Fprintf(&b, " exited with status %d %v after its first start: its command line was refused (a usage error; a Go panic also exits 2)",
			e.Code, e.Ran.Round(time.Millisecond))
	case e.Signal != 0:
		fmt.Fprintf(&b, " was ended by signal %v", e.Signal)
	default:
		fmt.Fprintf(&b, " exited with status %d", e.Code)
		if e.JobFinished {
			b.WriteString(" (the job had already finished; it trained nothing)")
		}
	}
	return b.String()
}

// classify is the Outcome of a process that exited with status code, or
// that signal sig ended (sig != 0).
//
// A process that a signal ended, SIGTERM and SIGINT included, failed: it
// had no handler (or its handler re-raised the signal), so it committed and
// checkpointed nothing on the way out. Only a process that exited by itself
// with the preempted status left gracefully.
func classify(code int, sig syscall.Signal) Outcome {
	switch {
	case sig != 0:
		return Failed
	case code == StatusFinished:
		return Finished
	case code == StatusPreempted || code == 128+int(syscall.SIGINT):
		return Preempted
	}
	return Failed
}

// restartPolicy says whether a worker whose process ended with outcome o
// starts again: it crashed, the launcher is not stopping, no worker has
// finished the job (a new member would find it over), the job's restarts
// are not used up, and the crash is not one that a restart repeats
// (doomed, see startFailure).
func restartPolicy(o Outcome, stopping, finished, doomed bool, restarts, maxRestarts int) bool {
	return o == Failed && !stopping && !finished && !doomed && restarts < maxRestarts
}

// startFailure decides what a failed exit x says about a restart, given
// every exit of the job before it (seen) and the start-up window (0: no
// such rule): whether it failed at start (AtStart), whether that was a
// refused command line (Usage), and why restarting it would only repeat
// the failure ("" when a restart may help):
//
//   - status 2 within the window of the first start of its index: a usage
//     error (Go's flag package, and most command-line tools, exit 2 on a
//     bad command line; so does a Go panic), which the same command line
//     repeats;
//   - a failure within the window like the previous process of the same
//     worker index had (also within the window of its start, with the
//     same status or signal): the start fails the same way every time.
func startFailure(x Exit, seen []Exit, window time.Duration) (atStart, usage bool, why string) {
	if x.Outcome != Failed || x.Killed || x.PID == 0 || window <= 0 || x.Ran >= window {
		return false, false, ""
	}
	if x.Code == StatusUsage && x.Signal == 0 && x.Restart == 0 {
		return true, true, fmt.Sprintf("it exited with status %d %v after its first start, so its command line was refused "+
			"(a usage error; a Go panic also exits 2), and the same command fails again", x.Code, x.Ran.Round(time.Millisecond))
	}
	for k := len(seen) - 1; k >= 0; k-- {
		e := seen[k]
		if e.Worker != x.Worker {
			continue
		}
		if e.AtStart && e.Code == x.Code && e.Signal == x.Signal {
			return true, false, fmt.Sprintf("it failed %v after its start the same way as %s, so a restart fails again",
				x.Ran.Round(time.Millisecond), e.String())
		}
		break // only the worker's previous process counts
	}
	return true, false, ""
}

// jobOutcome applies the exit status rule to every process exit of a job
// (in order) and whether the launcher forwarded a stop signal:
//
//  1. Finished when any worker exited with status 0: a worker exits 0
//     only when its trainer's Run returned nil, that is, the job finished.
//     Crashes the job survived on the way (restarted or not) do not change
//     that; they are in Result.Exits and the launcher's log.
//  2. Otherwise Failed when a worker exited with StatusPermanent (the
//     launcher stopped the job for it).
//  3. Otherwise, after a stop: Preempted when every process running at the
//     stop left as preempted by itself (not killed after the grace
//     period); otherwise Failed.
//  4. Otherwise (no stop): Preempted when the last process of every
//     worker index left as preempted (each was stopped from outside, e.g.
//     a SIGTERM of its own); otherwise Failed.
func jobOutcome(exits []Exit, stopped bool) Outcome {
	for _, e := range exits {
		if e.Outcome == Finished {
			return Finished
		}
	}
	if len(exits) == 0 || firstPermanent(exits) >= 0 {
		return Failed
	}
	if stopped {
		for _, e := range exits {
			if e.AtStop && (e.Outcome != Preempted || e.Killed) {
				return Failed
			}
		}
		return Preempted
	}
	for _, e := range lastExits(exits) {
		if e.Outcome != Preempted || e.Killed {
			return Failed
		}
	}
	return Preempted
}

// lastExits returns the last exit of each worker index, by index.
func lastExits(exits []Exit) []Exit {
	last := map[int]Exit{}
	hi := -1
	for _, e := range exits {
		last[e.Worker] = e
		hi = max(hi, e.Worker)
	}
	out := make([]Exit, 0, len(last))
	for i := 0; i <= hi; i++ {
		if e, ok := last[i]; ok {
			out = append(out, e)
		}
	}
	return out
}

// ErrPreempted is wrapped by Job.Wait's (and Run's) error when the job
// was preempted: the launcher forwarded a stop signal and every worker left
// gracefully within the grace period. ExitStatus maps it to
// StatusPreempted.
var ErrPreempted = errors.New("launch: job preempted")

// ErrFailed is wrapped by Job.Wait's (and Run's) error when the job
// failed; the message names the worker processes that decided it.
var ErrFailed = errors.New("launch: job failed")

// ErrJobOver is Add's error once every worker has exited.
var ErrJobOver = errors.New("launch: the job is over")

// ErrNoWorker is Signal's error for a worker index that has no running
// process.
var ErrNoWorker = errors.New("launch: no such worker running")

// StatusUsage: a bad command line. The command etrun exits with it for its
// own flags, and a job has it when its workers' command line was refused
// (ErrUsage: every worker that decided the failure exited 2 at its first
// start, see Exit.Usage).
const StatusUsage = 2

// ErrUsage is wrapped, next to ErrFailed, by Job.Wait's (and Run's) error
// when the job failed because its workers' command line was refused: every
// worker process that decided the failure exited with status 2 at its
// first start (Exit.Usage). ExitStatus maps it to StatusUsage, the status of
// a bad command line.
var ErrUsage = errors.New("launch: the workers' command line was refused")

// ErrPermanent is wrapped, next to ErrFailed, by Job.Wait's (and Run's)
// error when a worker exited with StatusPermanent: an error that a restart
// cannot fix (an invalid configuration, a checkpoint directory of another
// model or of a finished job, settings that differ from the job's). The
// launcher restarted nothing after it and stopped the job at once; the
// error names that worker (the first one, when several). ExitStatus maps
// it to StatusUsage, as for a bad command line.
var ErrPermanent = errors.New("launch: a worker stopped on an error that a restart cannot fix")

// firstPermanent returns the index in exits of the first exit with
// StatusPermanent, or -1.
func firstPermanent(exits []Exit) int {
	for i, e := range exits {
		if e.Permanent {
			return i
		}
	}
	return -1
}

// decisive returns the exits that decided a failed job (those jobError
// names): the first permanent error when a worker exited with one; after
// a stop, the processes running then that did not leave gracefully;
// otherwise the last process of every worker index that did not.
func decisive(exits []Exit, stopped bool) []Exit {
	if i := firstPermanent(exits); i >= 0 {
		return []Exit{exits[i]}
	}
	cands := exits
	if !stopped {
		cands = lastExits(exits)
	}
	var bad []Exit
	for _, e := range cands {
		if (!stopped || e.AtStop) && (e.Outcome != Preempted || e.Killed) {
			bad = append(bad, e)
		}
	}
	return bad
}

// usageFailure reports whether a failed job failed because its workers'
// command line was refused: every decisive exit is a Usage one.
func usageFailure(exits []Exit, stopped bool) bool {
	bad := decisive(exits, stopped)
	for _, e := range bad {
		if !e.Usage {
			return false
		}
	}
	return len(bad) > 0
}

// jobStatus is the exit status of a job with outcome o: o's, except
// StatusUsage for a failure of refused command lines or of a permanent
// error.
func jobStatus(o Outcome, exits []Exit, stopped bool) int {
	if o == Failed && (usageFailure(exits, stopped) || firstPermanent(exits) >= 0) {
		return StatusUsage
	}
	return o.ExitStatus()
}

// jobError is the error of a job that did not finish: ErrPreempted or
// ErrFailed with the exits that decided it (and ErrUsage when those were
// refused command lines), and the Start context's error when that was the
// stop.
func jobError(o Outcome, exits []Exit, stopped bool, cause error) error {
	var err error
	switch o {
	case Finished:
		return nil
	case Preempted:
		err = ErrPreempted
	default:
		var bad []string
		for _, e := range decisive(exits, stopped) {
			bad = append(bad, e.String())
		}
		if len(bad) == 0 {
			bad = append(bad, "no worker ran")
		}
		err = fmt.Errorf("%w: %s", ErrFailed, strings.Join(bad, "; "))
		cands := exits
		if !stopped {
			cands = lastExits(exits)
		}
		for _, e := range cands {
			if e.JobFinished {
				err = fmt.Errorf("%w (%w: the store remembers the job ID as finished; run again under a new job ID)", err, elastic.ErrJobFinished)
				break
			}
		}
	}

	if o == Failed && firstPermanent(exits) >= 0 {
		err = &multiError{msg: err.Error() + "; the launcher restarted nothing and stopped the job", errs: []error{err, ErrPermanent}}
	}
	if o == Failed && usageFailure(exits, stopped) {
		err = &multiError{msg: err.Error(), errs: []error{err, ErrUsage}}
	}
	if cause != nil {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// multiError is an error with its own message that wraps several
// sentinels.
type multiError struct {
	msg  string
	errs []error
}

func (e *multiError) Error() string   { return e.msg }
func (e *multiError) Unwrap() []error { return e.errs }
