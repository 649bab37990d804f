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
	// Preempted: a worker left on a stop signal (status 143 or 130, or a
	// SIGTERM or SIGINT ended it); for a job, every worker running when the
	// launcher forwarded its stop signal left so within the grace period.
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
	// Outcome is Finished (status 0), Preempted (status 143 or 130, or
	// ended by SIGTERM or SIGINT) or Failed (anything else, including a
	// failed start).
	Outcome Outcome
	// Killed is true when the launcher SIGKILLed the process: after the
	// grace period of a stop, or on Job.Kill.
	Killed bool
	// AtStop is true when the process was running when the launcher
	// forwarded its stop signal.
	AtStop bool
	// Restarting is true when the launcher starts the worker's index
	// again (Failed, no stop, the job not finished, restarts left).
	Restarting bool
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
	case e.Killed:
		b.WriteString(" was killed by the launcher")
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
func classify(code int, sig syscall.Signal) Outcome {
	switch {
	case sig == syscall.SIGTERM || sig == syscall.SIGINT:
		return Preempted
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
// finished the job (a new member would find it over), and the job's
// restarts are not used up.
func restartPolicy(o Outcome, stopping, finished bool, restarts, maxRestarts int) bool {
	return o == Failed && !stopping && !finished && restarts < maxRestarts
}

// jobOutcome applies the exit status rule to every process exit of a job
// (in order) and whether the launcher forwarded a stop signal:
//
//  1. Finished when any worker exited with status 0: a worker exits 0
//     only when its trainer's Run returned nil, that is, the job finished.
//     Crashes the job survived on the way (restarted or not) do not change
//     that; they are in Result.Exits and the launcher's log.
//  2. Otherwise, after a stop: Preempted when every process running at the
//     stop left as preempted by itself (not killed after the grace
//     period); otherwise Failed.
//  3. Otherwise (no stop): Preempted when the last process of every
//     worker index left as preempted (each was stopped from outside, e.g.
//     a SIGTERM of its own); otherwise Failed.
func jobOutcome(exits []Exit, stopped bool) Outcome {
	for _, e := range exits {
		if e.Outcome == Finished {
			return Finished
		}
	}
	if len(exits) == 0 {
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

// jobError is the error of a job that did not finish: ErrPreempted or
// ErrFailed with the exits that decided it, and the Start context's error
// when that was the stop.
func jobError(o Outcome, exits []Exit, stopped bool, cause error) error {
	var err error
	switch o {
	case Finished:
		return nil
	case Preempted:
		err = ErrPreempted
	default:
		cands := exits
		if !stopped {
			cands = lastExits(exits)
		}
		var bad []string
		for _, e := range cands {
			if (!stopped || e.AtStop) && (e.Outcome != Preempted || e.Killed) {
				bad = append(bad, e.String())
			}
		}
		if len(bad) == 0 {
			bad = append(bad, "no worker ran")
		}
		err = fmt.Errorf("%w: %s", ErrFailed, strings.Join(bad, "; "))
		for _, e := range cands {
			if e.JobFinished {
				err = fmt.Errorf("%w (%w: the store remembers the job ID as finished; run again under a new job ID)", err, elastic.ErrJobFinished)
				break
			}
		}
	}
	if cause != nil {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
