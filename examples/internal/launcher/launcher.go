// Package launcher runs the worker processes of a local elastic job for the
// examples: it re-executes the example's own binary as N workers, injects
// faults (kill, stop, term, join) when the job reaches given steps, reads
// the workers' events, prints progress and membership changes, and leaves no
// child process behind.
package launcher

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EnvEventsFD names the environment variable that tells a worker which file
// descriptor carries its events to the launcher.
const EnvEventsFD = "ELASTICTRAIN_EVENTS_FD"

// EnvWorker is set to the worker's launch index in every worker's environment.
const EnvWorker = "ELASTICTRAIN_WORKER"

// EnvNetns, in the launcher's environment, places the workers on hosts
// made of Linux network namespaces (tests of jobs spanning hosts, see
// internal/netns): a comma-separated list of namespace names; worker i < len
// starts in the i-th (through `ip netns exec`), and every later worker (a
// join) in the listed namespace with the fewest live workers, the first
// such in list order. Unset or empty: workers run in the launcher's own
// namespace. The workers must then listen on their host's address (the
// examples' -listen 0.0.0.0:0).
const EnvNetns = "ELASTICTRAIN_LAUNCHER_NETNS"

// Event is one line a worker sends to the launcher, as JSON. Loss and
// RecoverySeconds may be NaN or ±Inf (a diverged run): they travel as the
// strings "NaN", "+Inf" and "-Inf", which plain JSON numbers cannot hold.
type Event struct {
	Ev              string  `json:"ev"` // "round", "step", "done", "error", "finished" (see EvFinished)
	Worker          int     `json:"worker"`
	PID             int     `json:"pid"`
	Round           uint64  `json:"round,omitempty"`
	Rank            int     `json:"rank"`
	WorldSize       int     `json:"world_size,omitempty"`
	Step            int64   `json:"step,omitempty"`
	Epoch           int     `json:"epoch,omitempty"`
	Loss            float64 `json:"loss,omitempty"`
	Samples         int     `json:"samples,omitempty"`
	Source          string  `json:"source,omitempty"`
	Recovery        bool    `json:"recovery,omitempty"`
	RolledBack      int64   `json:"rolled_back,omitempty"`
	RecoverySeconds float64 `json:"recovery_seconds,omitempty"`
	Message         string  `json:"message,omitempty"`
	// Extra carries example-specific results in "done" events. Its
	// numbers must be finite: an event JSON cannot encode arrives as an
	// "error" event instead (see Emitter.Emit).
	Extra map[string]any `json:"extra,omitempty"`
	// At is the worker's wall clock (unix seconds).
	At float64 `json:"at"`
}

// EvFinished is the event a worker sends when the job had already
// finished before it joined (an earlier run of the same job ID finished,
// and its state in the store says so until it expires). When no worker
// reports "done" and one reports this, Run returns ErrJobAlreadyFinished.
const EvFinished = "finished"

// ErrJobAlreadyFinished is Run's error when the job was over before its
// workers joined: no worker trained or reported "done", and one of them
// reported EvFinished.
var ErrJobAlreadyFinished = errors.New("launcher: the job had already finished when its workers joined")

// eventJSON is Event without its methods, so MarshalJSON and UnmarshalJSON
// can use the default encoding for every other field.
type eventJSON Event

// eventWire is the wire form of an Event: the float fields that may be
// non-finite shadow the embedded ones.
type eventWire struct {
	eventJSON
	Loss            wireFloat `json:"loss,omitempty"`
	RecoverySeconds wireFloat `json:"recovery_seconds,omitempty"`
}

// MarshalJSON encodes ev with a non-finite Loss or RecoverySeconds as a
// string ("NaN", "+Inf", "-Inf").
func (ev Event) MarshalJSON() ([]byte, error) {
	return json.Marshal(eventWire{eventJSON: eventJSON(ev), Loss: wireFloat(ev.Loss), RecoverySeconds: wireFloat(ev.RecoverySeconds)})
}

// UnmarshalJSON decodes what MarshalJSON encodes.
func (ev *Event) UnmarshalJSON(b []byte) error {
	var w eventWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*ev = Event(w.eventJSON)
	ev.Loss, ev.RecoverySeconds = float64(w.Loss), float64(w.RecoverySeconds)
	return nil
}

// wireFloat is a float64 whose JSON form is a number when finite and the
// string "NaN", "+Inf" or "-Inf" otherwise.
type wireFloat float64

func (f wireFloat) MarshalJSON() ([]byte, error) {
	x := float64(f)
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return strconv.AppendQuote(nil, strconv.FormatFloat(x, 'g', -1, 64)), nil
	}
	return json.Marshal(x)
}

func (f *wireFloat) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		switch s {
		case "NaN", "+Inf", "-Inf":
			x, _ := strconv.ParseFloat(s, 64)
			*f = wireFloat(x)
			return nil
		}
		return fmt.Errorf("launcher: %q is not a number", s)
	}
	var x float64
	if err := json.Unmarshal(b, &x); err != nil {
		return err
	}
	*f = wireFloat(x)
	return nil
}

// Emitter writes a worker's events; safe for concurrent use.
type Emitter struct {
	mu     sync.Mutex
	w      io.Writer
	worker int
}

// NewEmitter returns the emitter of this worker: the descriptor named by
// EnvEventsFD, or a discarding one when run without a launcher.
func NewEmitter() *Emitter {
	e := &Emitter{w: io.Discard}
	var fd, idx int
	if _, err := fmt.Sscan(os.Getenv(EnvEventsFD), &fd); err == nil && fd > 2 {
		e.w = os.NewFile(uintptr(fd), "events")
	}
	if _, err := fmt.Sscan(os.Getenv(EnvWorker), &idx); err == nil {
		e.worker = idx
	}
	return e
}

// Emit sends one event, stamping worker, pid and time. An event that
// cannot be encoded (Extra holding a NaN or a value JSON has no form for)
// is not dropped: an "error" event saying so takes its place, so the
// launcher shows why the event it waited for never came.
func (e *Emitter) Emit(ev Event) {
	ev.Worker, ev.PID = e.worker, os.Getpid()
	ev.At = float64(time.Now().UnixNano()) / 1e9
	b, err := json.Marshal(ev)
	if err != nil {
		b, _ = json.Marshal(Event{Ev: "error", Worker: ev.Worker, PID: ev.PID, Rank: ev.Rank, Step: ev.Step, At: ev.At,
			Message: fmt.Sprintf("launcher: cannot encode this worker's %q event (step %d): %v", ev.Ev, ev.Step, err)})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.w.Write(append(b, '\n'))
}

// Spec says what to launch.
type Spec struct {
	// Workers is how many workers to start at once.
	Workers int
	// Args are the workers' command-line arguments (the binary is this one).
	Args []string
	// Env is added to the workers' environment.
	Env []string
	// Faults to inject, by job step.
	Faults []Fault
	// Log receives progress lines and the workers' own stdout and stderr;
	// nil = discard. Run serialises its writes to it (other than an
	// *os.File, which the workers write to directly).
	Log io.Writer
	// Progress is the interval between progress lines; 0 = 3 s.
	Progress time.Duration
	// Quiet suppresses the progress lines (membership changes still print).
	Quiet bool
	// MaxWorkers bounds the worker processes Run starts over the whole
	// job: Workers plus every Join fault's count. Run refuses a Spec above
	// it before starting anything (the examples pass their -max). 0 means
	// DefaultMaxWorkers.
	MaxWorkers int
}

// DefaultMaxWorkers is Spec.MaxWorkers when it is 0: elastic.Config's
// default MaxWorkers, the largest world size a job accepts by default.
const DefaultMaxWorkers = 1024

// Summary is what the launcher saw of the job.
type Summary struct {
	// Done is the final rank 0's "done" event (nil if none arrived).
	Done *Event
	// Rounds lists the rounds in order with their world sizes.
	Rounds []RoundSeen
	// Recoveries holds, per injected kill/stop, seconds from the fault until
	// the first step of a later round that trained samples (Event.Samples
	// > 0).
	Recoveries []float64
	// Exits maps worker index to exit code (-1 when killed by a signal).
	Exits map[int]int
	// Wall is the launcher's wall time.
	Wall time.Duration
	// MaxStep is the highest global step seen.
	MaxStep int64
	// Steps holds rank 0's step reports in arrival order.
	Steps []StepSeen
	// AlreadyFinished is true when some worker reported EvFinished: the
	// job had finished before it joined.
	AlreadyFinished bool
}

// StepSeen is one step as rank 0 reported it.
type StepSeen struct {
	Step      int64
	Round     uint64
	WorldSize int
	Loss      float64
	Samples   int // samples the step trained (all ranks)
	At        float64
}

// RoundSeen is one round as reported by its workers.
type RoundSeen struct {
	Round     uint64
	WorldSize int
	Step      int64
	Source    string
	Recovery  bool
}

type worker struct {
	idx     int
	netns   string
	cmd     *exec.Cmd
	events  *os.File
	rank    int
	round   uint64
	exited  bool
	stopped bool
}

type exit struct {
	idx  int
	code int
	err  error
}

// Run launches the job and returns when every worker has exited, ctx is
// done, or the job cannot go on. It kills every child before returning,
// including stopped ones.
func Run(ctx context.Context, spec Spec) (Summary, error) {
	start := time.Now()
	sum := Summary{Exits: map[int]int{}}
	var logw io.Writer
	switch l := spec.Log.(type) {
	case nil:
		logw = io.Discard
	case *os.File:
		logw = l // the workers write to it directly, and the kernel orders the writes
	default:
		// The workers' output is copied into it by one goroutine per
		// stream, and the launcher writes its own lines too.
		logw = &lockedWriter{w: l}
	}
	limit := spec.MaxWorkers
	if limit <= 0 {
		limit = DefaultMaxWorkers
	}
	if err := checkCount(spec.Faults, spec.Workers, limit); err != nil {
		return sum, fmt.Errorf("launcher: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return sum, fmt.Errorf("launcher: %w", err)
	}
	events := make(chan Event, 1024)
	exits := make(chan exit, 64)
	var readers sync.WaitGroup
	workers := map[int]*worker{}
	defer func() {
		for _, w := range workers {
			if !w.exited {
				w.cmd.Process.Kill() // SIGKILL also ends a stopped process
			}
		}
		left := 0
		for _, w := range workers {
			if !w.exited {
				left++
			}
		}
		// Discard late events so no reader blocks while the exits drain.
		for left > 0 {
			select {
			case ex := <-exits:
				workers[ex.idx].exited = true
				left--
			case <-events:
			}
		}
		readers.Wait()
	}()

	var spaces []string
	for _, ns := range strings.Split(os.Getenv(EnvNetns), ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			spaces = append(spaces, ns)
		}
	}
	// placeWorker is the namespace of worker idx ("" for this one).
	placeWorker := func(idx int) string {
		if len(spaces) == 0 {
			return ""
		}
		if idx < len(spaces) {
			return spaces[idx]
		}
		live := map[string]int{}
		for _, w := range workers {
			if !w.exited {
				live[w.netns]++
			}
		}
		best := spaces[0]
		for _, ns := range spaces {
			if live[ns] < live[best] {
				best = ns
			}
		}
		return best
	}
	next := 0
	startWorker := func() error {
		if next >= limit { // checkCount makes this unreachable; a bound never to pass
			return fmt.Errorf("launcher: not starting worker %d: %d started, the most this job may have", next, limit)
		}
		idx := next
		next++
		r, wr, err := os.Pipe()
		if err != nil {
			return err
		}
		ns := placeWorker(idx)
		cmd := exec.Command(self, spec.Args...)
		if ns != "" {
			cmd = exec.Command("ip", append([]string{"netns", "exec", ns, self}, spec.Args...)...)
			fmt.Fprintf(logw, "[launcher] worker %d runs in network namespace %s\n", idx, ns)
		}
		cmd.Env = append(append(os.Environ(), spec.Env...),
			fmt.Sprintf("%s=3", EnvEventsFD), fmt.Sprintf("%s=%d", EnvWorker, idx))
		if os.Getenv("GOMAXPROCS") == "" {
			// Several ranks share this host's cores: one Go scheduler
			// thread set per rank's share avoids oversubscription (the
			// usual setting, like torchrun's OMP_NUM_THREADS=1).
			cmd.Env = append(cmd.Env, fmt.Sprintf("GOMAXPROCS=%d", max(1, runtime.NumCPU()/max(1, spec.Workers))))
		}
		cmd.Stdout, cmd.Stderr = logw, logw
		cmd.ExtraFiles = []*os.File{wr}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			r.Close()
			wr.Close()
			return fmt.Errorf("launcher: start worker %d: %w", idx, err)
		}
		wr.Close()
		w := &worker{idx: idx, netns: ns, cmd: cmd, events: r, rank: -1}
		workers[idx] = w
		readers.Add(1)
		readDone := make(chan struct{})
		go func() {
			defer readers.Done()
			defer close(readDone)
			defer r.Close()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				var ev Event
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					ev = Event{Ev: "error", Message: fmt.Sprintf("undecodable event %.200q: %v", sc.Bytes(), err)}
				}
				ev.Worker = idx
				events <- ev
			}
			if err := sc.Err(); err != nil {
				events <- Event{Ev: "error", Worker: idx, Message: fmt.Sprintf("reading events: %v (later events are lost)", err)}
				io.Copy(io.Discard, r) // so the worker never blocks on a full pipe
			}
		}()
		go func() {
			err := cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			// Every event the worker wrote is queued before its exit is.
			<-readDone
			exits <- exit{idx: idx, code: code, err: err}
		}()
		return nil
	}
	for range spec.Workers {
		if err := startWorker(); err != nil {
			return sum, err
		}
	}

	pending := append([]Fault(nil), spec.Faults...)
	sort.SliceStable(pending, func(i, j int) bool { return pending[i].Step < pending[j].Step })
	type faultAt struct {
		at    time.Time
		round uint64
	}
	var awaiting []faultAt // kills/stops waiting for the next round's first step
	rounds := map[uint64]*RoundSeen{}
	var lastRound uint64
	var lastLoss float64
	var lastEpoch, lastWS int
	samples, lastSamples := int64(0), int64(0)
	lastProgress := time.Now()
	progressEvery := spec.Progress
	if progressEvery <= 0 {
		progressEvery = 3 * time.Second
	}
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	running := spec.Workers
	var doneTimeout <-chan time.Time

	holder := func(rank int) *worker {
		var best *worker
		for _, w := range workers {
			if !w.exited && w.rank == rank && (best == nil || w.round > best.round) {
				best = w
			}
		}
		return best
	}
	apply := func(f Fault) {
		if f.Kind == Join {
			fmt.Fprintf(logw, "[launcher] step %d: starting %d more worker(s)\n", sum.MaxStep, f.Rank)
			for range f.Rank {
				if err := startWorker(); err != nil {
					fmt.Fprintf(logw, "[launcher] %v\n", err)
					continue
				}
				running++
			}
			return
		}
		w := holder(f.Rank)
		if w == nil {
			fmt.Fprintf(logw, "[launcher] step %d: no live worker holds rank %d; %s skipped\n", sum.MaxStep, f.Rank, f.Kind)
			return
		}
		sig := map[FaultKind]syscall.Signal{Kill: syscall.SIGKILL, Stop: syscall.SIGSTOP, Term: syscall.SIGTERM}[f.Kind]
		fmt.Fprintf(logw, "[launcher] step %d: %s rank %d (worker %d, pid %d)\n", sum.MaxStep, sig, f.Rank, w.idx, w.cmd.Process.Pid)
		w.cmd.Process.Signal(sig)
		w.stopped = f.Kind == Stop
		if f.Kind != Term {
			awaiting = append(awaiting, faultAt{at: time.Now(), round: lastRound})
		}
	}

	handle := func(ev Event) {
		w := workers[ev.Worker]
		switch ev.Ev {
		case "round":
			if w != nil {
				w.rank, w.round = ev.Rank, ev.Round
			}
			if rounds[ev.Round] == nil {
				rs := &RoundSeen{Round: ev.Round, WorldSize: ev.WorldSize, Step: ev.Step, Source: ev.Source, Recovery: ev.Recovery}
				rounds[ev.Round] = rs
				if ev.Round > lastRound {
					if lastRound != 0 {
						what := "membership change"
						if ev.Recovery {
							what = "recovery after a failure"
						}
						fmt.Fprintf(logw, "[launcher] round %d: world size %d -> %d (%s), continuing from step %d\n",
							ev.Round, lastWS, ev.WorldSize, what, ev.Step)
					}
					lastRound, lastWS = ev.Round, ev.WorldSize
				}
			}
		case "step":
			if ev.Step > sum.MaxStep {
				sum.MaxStep = ev.Step
			}
			lastLoss, lastEpoch = ev.Loss, ev.Epoch
			sum.Steps = append(sum.Steps, StepSeen{Step: ev.Step, Round: ev.Round, WorldSize: ev.WorldSize, Loss: ev.Loss, Samples: ev.Samples, At: ev.At})
			samples += int64(ev.Samples)
			// Training again means training samples: a step that trained
			// nothing (a dynamic-shard job waiting for data) is no recovery.
			for len(awaiting) > 0 && ev.Round > awaiting[0].round && ev.Samples > 0 {
				d := time.Since(awaiting[0].at).Seconds()
				sum.Recoveries = append(sum.Recoveries, d)
				fmt.Fprintf(logw, "[launcher] training again in round %d at step %d, %.3f s after the fault\n", ev.Round, ev.Step, d)
				awaiting = awaiting[1:]
			}
			for len(pending) > 0 && sum.MaxStep >= pending[0].Step {
				f := pending[0]
				pending = pending[1:]
				apply(f)
			}
		case "done":
			e := ev
			sum.Done = &e
			// A stopped worker never exits by itself; the job no longer needs it.
			for _, w := range workers {
				if w.stopped && !w.exited {
					w.cmd.Process.Kill()
				}
			}
			doneTimeout = time.After(time.Minute)
		case "error":
			fmt.Fprintf(logw, "[launcher] worker %d: %s\n", ev.Worker, ev.Message)
		case EvFinished:
			sum.AlreadyFinished = true
			fmt.Fprintf(logw, "[launcher] worker %d: the job had already finished when it joined\n", ev.Worker)
		}
	}

	for running > 0 {
		select {
		case <-ctx.Done():
			return sum, fmt.Errorf("launcher: %w", ctx.Err())
		case ex := <-exits:
			// Handle what the worker said before it exited first.
			for drained := false; !drained; {
				select {
				case ev := <-events:
					handle(ev)
				default:
					drained = true
				}
			}
			w := workers[ex.idx]
			w.exited = true
			running--
			sum.Exits[ex.idx] = ex.code
			if ex.code != 0 {
				fmt.Fprintf(logw, "[launcher] worker %d (rank %d) exited: %v\n", ex.idx, w.rank, ex.err)
			}
		case ev := <-events:
			handle(ev)
		case <-doneTimeout:
			fmt.Fprintf(logw, "[launcher] workers still running a minute after the job finished; killing them\n")
			for _, w := range workers {
				if !w.exited {
					w.cmd.Process.Kill()
				}
			}
		case <-tick.C:
			if spec.Quiet {
				continue
			}
			el := time.Since(lastProgress).Seconds()
			fmt.Fprintf(logw, "[launcher] epoch %d step %d loss %.4f samples/s %.0f world %d round %d\n",
				lastEpoch, sum.MaxStep, lastLoss, float64(samples-lastSamples)/el, lastWS, lastRound)
			lastSamples, lastProgress = samples, time.Now()
		}
	}
	for _, r := range rounds {
		sum.Rounds = append(sum.Rounds, *r)
	}
	sort.Slice(sum.Rounds, func(i, j int) bool { return sum.Rounds[i].Round < sum.Rounds[j].Round })
	sum.Wall = time.Since(start)
	switch {
	case sum.Done == nil && sum.AlreadyFinished:
		return sum, ErrJobAlreadyFinished
	case sum.Done == nil:
		return sum, errors.New("launcher: every worker exited and none reported the job done")
	}
	return sum, nil
}

// lockedWriter serialises the writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// WorldSizes returns the world sizes of the rounds in order, with
// consecutive equal sizes merged.
func (s Summary) WorldSizes() []int {
	var out []int
	for _, r := range s.Rounds {
		if len(out) == 0 || out[len(out)-1] != r.WorldSize {
			out = append(out, r.WorldSize)
		}
	}
	return out
}

// RecoveryRounds returns how many of the rounds were formed to recover from
// a lost member (RoundSeen.Recovery).
func (s Summary) RecoveryRounds() int {
	n := 0
	for _, r := range s.Rounds {
		if r.Recovery {
			n++
		}
	}
	return n
}
