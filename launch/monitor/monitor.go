// Package monitor runs a local elastic job through launch and follows it
// by its workers' events (launch.Event): it prints progress lines and
// membership changes, injects step-triggered faults (launch/faults) and
// returns a Summary of the rounds, steps and recoveries it saw. The
// examples and benchmarks present their jobs with it; a supervisor of your
// own that needs only the events uses launch.Hooks.OnEvent directly.
//
// Run re-executes the calling program's own binary as N workers through
// launch.Start; each worker reports with launch.NewEmitter. Starting,
// signalling, stopping (a SIGTERM or Ctrl-C to the program is forwarded to
// every worker with a grace period), placing (launch.Netns) and reaping the
// workers is launch's.
package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/faults"
)

// EvStarted is the event Run queues itself when a worker process started
// (launch's OnStart), before any event of that process: Worker, PID and
// Restart. Workers never send it.
const EvStarted = "started"

// ErrJobAlreadyFinished is Run's error when the job was over before its
// workers joined: no worker trained or reported launch.EvDone, and one of
// them reported launch.EvFinished.
var ErrJobAlreadyFinished = errors.New("monitor: the job had already finished when its workers joined")

// ErrFinishedWithError is Run's error when the job finished (Summary.Done
// is set and complete) but the worker that reported it exited with a
// status other than 0, as a worker does whose trainer's Run returned
// trainer.ErrCheckpoint (the final checkpoint was not written), or when any
// worker reported a lost checkpoint (an EvError marked Checkpoint: a
// preempted worker whose checkpoint failed, say) while the others finished.
// The message names the worker, its status and its last EvError.
var ErrFinishedWithError = errors.New("monitor: the job finished, but not cleanly")

// Spec says what to launch.
type Spec struct {
	// Workers is how many workers to start at once.
	Workers int
	// Args are the workers' command-line arguments (the binary is this one).
	Args []string
	// Env is added to the workers' environment.
	Env []string
	// Store is the host:port of the store the workers rendezvous through,
	// given to launch.Config.Redis; "" lets launch start an embedded one
	// (the workers then find it through launch.WorkerEnv).
	Store string
	// JobID is the job's ID, given to launch.Config.JobID ("" draws one).
	JobID string
	// GracePeriod is how long the workers may take to leave after the
	// launcher forwarded a SIGTERM (ctx done) before they are SIGKILLed;
	// 0 means launch's default, 30 s.
	GracePeriod time.Duration
	// Faults to inject, by job step.
	Faults []faults.Fault
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
	// Wrap, when set, is launch.Spec.Wrap: worker i's command prefix.
	Wrap func(worker int) []string
	// Netns, when set and Wrap is not, places the workers in these
	// network namespaces (launch.Netns: worker i < len in the i-th, a
	// later one in the listed namespace with the fewest live workers, the
	// first such in list order). When neither is set, Run places them by
	// launch.EnvNetns in its own environment, if that names namespaces.
	// Each placement is logged ("worker I runs in network namespace NS").
	Netns []string
	// OnEvent, when set, sees every event before Run acts on it, from
	// Run's goroutine; it must not block.
	OnEvent func(launch.Event)
	// Autoscale and CapacityFile are launch.Config's: the workers size
	// the job themselves, and the file bounds the workers Run runs.
	Autoscale    bool
	CapacityFile string
	// StopWhenRecovered makes Run return as soon as every kill and stop
	// fault has been applied and its recovery measured, killing the
	// workers (a benchmark needs no more of the job). Summary.Done is
	// then nil and Exits incomplete.
	StopWhenRecovered bool
}

// EnvHold names a file, set in the workers' environment when the Spec has
// a Join fault: while the file exists, a worker that calls HoldAtStep
// holds there. Run creates it when a Join fault fires and removes it once
// every newcomer of the fault waits in the store (launch.EvPending), was
// taken into a round, or exited, or after HoldBound: a join at step S is
// then admitted at the job's next step boundary, however long the
// newcomer's process takes to start (on a loaded machine, longer than the
// steps the job had left).
const EnvHold = "ELASTICTRAIN_MONITOR_HOLD"

// HoldBound bounds a hold (EnvHold), on the launcher's side and in
// HoldAtStep: well below elastic.DefaultProgressTimeout (15 s), so a held
// worker is never judged hung.
const HoldBound = 10 * time.Second

// holdPoll is how often HoldAtStep looks at the hold file.
const holdPoll = 5 * time.Millisecond

// HoldAtStep returns at once unless the file EnvHold names exists; then it
// returns once the file is gone, or after HoldBound. The examples' workers
// call it in their trainer.Hooks.OnStep on every rank.
func HoldAtStep() {
	path := os.Getenv(EnvHold)
	if path == "" {
		return
	}
	if _, err := os.Stat(path); err != nil {
		return
	}
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	for end := time.Now().Add(HoldBound); time.Now().Before(end); <-tick.C {
		if _, err := os.Stat(path); err != nil {
			return
		}
	}
}

// DefaultMaxWorkers is Spec.MaxWorkers when it is 0: elastic.Config's
// default MaxWorkers, the largest world size a job accepts by default.
const DefaultMaxWorkers = launch.DefaultMaxWorkers

// Summary is what the launcher saw of the job.
type Summary struct {
	// Done is the final rank 0's "done" event (nil if none arrived).
	Done *launch.Event
	// Rounds lists the rounds in order with their world sizes.
	Rounds []RoundSeen
	// Recoveries holds, per injected kill/stop, seconds from the fault until
	// the first step of a later round that trained samples (Event.Samples
	// > 0).
	Recoveries []float64
	// Exits maps worker index to exit code (-1 when killed by a signal).
	Exits map[int]int
	// JobID and Store are the job's ID and the store's host:port, as the
	// workers got them.
	JobID, Store string
	// Wall is the launcher's wall time.
	Wall time.Duration
	// MaxStep is the highest global step seen.
	MaxStep int64
	// Steps holds rank 0's step reports in arrival order.
	Steps []StepSeen
	// AlreadyFinished is true when some worker reported EvFinished: the
	// job had finished before it joined.
	AlreadyFinished bool
	// Scaling lists every change of the job's size in arrival order: rank
	// 0's decisions (EvScaling, probes and their undoing included) and the
	// launcher's own changes when the capacity file changed (reason
	// "capacity").
	Scaling []ScalingSeen
}

// ScalingSeen is one change of the job's size.
type ScalingSeen struct {
	// Step is the job's step when it was decided (rank 0's), or the
	// highest step seen when the launcher made it.
	Step int64 `json:"step"`
	// From and To are the world size (a decision) or the workers the
	// launcher runs (a capacity change) before and after.
	From int `json:"from"`
	To   int `json:"to"`
	// Reason is the policy's reason, or "capacity".
	Reason string `json:"reason"`
}

// StepSeen is one step as rank 0 reported it.
type StepSeen struct {
	Step      int64
	Epoch     int
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
	restart int
	pid     int
	rank    int
	round   uint64
	exited  bool
	stopped bool
	lastErr string // the message of its last "error" event
}

type exit struct {
	idx     int
	restart int
	code    int
	err     error
}

// Run launches the job and returns when every worker has exited. When ctx
// is done the workers get a SIGTERM (launch forwards it with
// Spec.GracePeriod), and Run returns once they left, with an error
// wrapping launch.ErrPreempted when all of them left gracefully (and
// ctx.Err()). When the worker that reported "done" then exits with a
// status other than 0, Run returns the summary with an error wrapping
// ErrFinishedWithError. No child is left behind, stopped ones included.
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
		// The workers' output is copied into it by launch, and the
		// launcher writes its own lines too.
		logw = &lockedWriter{w: l}
	}
	limit := spec.MaxWorkers
	if limit <= 0 {
		limit = DefaultMaxWorkers
	}
	if err := faults.CheckCount(spec.Faults, spec.Workers, limit); err != nil {
		return sum, fmt.Errorf("monitor: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return sum, fmt.Errorf("monitor: %w", err)
	}

	// launch hands every worker's events on, in order, between its start
	// and its exit; the hooks queue them (and the exits and the capacity's
	// changes) for this goroutine without ever blocking.
	wrap := spec.Wrap
	var place *launch.Netns
	if wrap == nil {
		if len(spec.Netns) > 0 {
			place, err = launch.NewNetns(spec.Netns)
		} else {
			place, err = launch.NetnsFromEnv()
		}
		if err != nil {
			return sum, fmt.Errorf("monitor: %w", err)
		}
	}
	var nsMu sync.Mutex
	nsOf := map[int]string{} // by worker index: its network namespace (KillHost)
	if place != nil {
		wrap = func(worker int) []string {
			ns := place.Place(worker)
			nsMu.Lock()
			nsOf[worker] = ns
			nsMu.Unlock()
			fmt.Fprintf(logw, "[launcher] worker %d runs in network namespace %s\n", worker, ns)
			return []string{"ip", "netns", "exec", ns}
		}
	}
	q := &queue{ready: make(chan struct{}, 1)}
	hooks := launch.Hooks{
		OnStart: func(p launch.Process) {
			q.put(item{ev: &launch.Event{Ev: EvStarted, Worker: p.Worker, Restart: p.Restart, PID: p.PID}})
		},
		OnEvent: func(ev launch.Event) { q.put(item{ev: &ev}) },
		OnScale: func(sc launch.Scale) {
			if sc.Reason != "capacity" {
				return // decisions arrive from rank 0 (EvScaling); Join faults are faults
			}
			q.put(item{ev: &launch.Event{Ev: launch.EvScaling, From: sc.From, To: sc.To, Reason: sc.Reason, Rank: -1}})
		},
		OnExit: func(x launch.Exit) {
			if place != nil {
				place.Exited(x)
			}
			q.put(item{exit: &exit{idx: x.Worker, restart: x.Restart, code: x.Code, err: x.Err}})
		},
	}
	cfg := launch.DefaultConfig()
	cfg.Workers, cfg.MaxWorkers, cfg.MaxRestarts = spec.Workers, limit, 0 // a fault's victim stays down
	cfg.Redis, cfg.JobID = spec.Store, spec.JobID
	cfg.Autoscale, cfg.CapacityFile = spec.Autoscale, spec.CapacityFile
	if spec.GracePeriod > 0 {
		cfg.GracePeriod = spec.GracePeriod
	}
	env, holdFile := spec.Env, ""
	for _, f := range spec.Faults {
		if f.Kind == faults.Join && holdFile == "" {
			dir, err := os.MkdirTemp("", "elastictrain-monitor-")
			if err != nil {
				return sum, fmt.Errorf("monitor: %w", err)
			}
			defer os.RemoveAll(dir)
			holdFile = filepath.Join(dir, "hold")
			env = append(slices.Clip(env), EnvHold+"="+holdFile)
		}
	}
	job, err := launch.Start(ctx, launch.Spec{Command: append([]string{self}, spec.Args...), Env: env,
		Stdout: logw, Stderr: logw, Wrap: wrap}, cfg, launch.WithHooks(hooks))
	if err != nil {
		return sum, fmt.Errorf("monitor: %w", err) // launch reaped whatever it started
	}
	sum.JobID, sum.Store = job.JobID(), job.Store()
	// Every process registers with its EvStarted event (queued before any
	// of its own), whoever started it: Start (as many as the capacity
	// allows), Add, or launch itself when the capacity rose.
	workers := map[int]*worker{}
	begun := false
	lostCheckpoint := map[int]string{} // worker index -> its EvError marked Checkpoint (kept across restarts)
	defer func() {
		// Every path out has seen every worker exit, but a panic and
		// StopWhenRecovered; end them.
		job.Kill()
		<-job.Done()
	}()

	pending := append([]faults.Fault(nil), spec.Faults...)
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
	running := 0
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
	joining := map[int]bool{} // worker index -> a Join fault's newcomer the job holds for
	var holdTimeout <-chan time.Time
	// unhold notes that newcomer idx (-1: none) no longer needs the hold,
	// and ends the hold when no newcomer does.
	unhold := func(idx int) {
		delete(joining, idx)
		if len(joining) > 0 || holdTimeout == nil {
			return
		}
		holdTimeout = nil
		if err := os.Remove(holdFile); err != nil {
			fmt.Fprintf(logw, "[launcher] %v\n", err)
		}
	}
	apply := func(f faults.Fault) {
		if f.Kind == faults.Join {
			fmt.Fprintf(logw, "[launcher] step %d: starting %d more worker(s)\n", sum.MaxStep, f.Rank)
			if holdFile != "" && len(joining) == 0 {
				if err := os.WriteFile(holdFile, nil, 0o644); err != nil {
					fmt.Fprintf(logw, "[launcher] %v\n", err)
				} else {
					holdTimeout = time.After(HoldBound)
				}
			}
			ids, err := job.Add(ctx, f.Rank)
			for _, i := range ids {
				workers[i] = &worker{idx: i, rank: -1}
				joining[i] = true
				running++
			}
			if len(ids) > 0 && holdTimeout != nil {
				fmt.Fprintf(logw, "[launcher] holding the workers at their next step until the newcomer(s) wait in the store (at most %v)\n", HoldBound)
			}
			unhold(-1) // nothing started: nothing to wait for
			if err != nil {
				fmt.Fprintf(logw, "[launcher] %v\n", err)
			}
			return
		}
		w := holder(f.Rank)
		if w == nil {
			fmt.Fprintf(logw, "[launcher] step %d: no live worker holds rank %d; %s skipped\n", sum.MaxStep, f.Rank, f.Kind)
			return
		}
		if f.Kind == faults.KillHost {
			nsMu.Lock()
			defer nsMu.Unlock()
			ns, ok := nsOf[w.idx]
			if !ok {
				fmt.Fprintf(logw, "[launcher] step %d: the workers are not placed on hosts; %s skipped\n", sum.MaxStep, f.Kind)
				return
			}
			var victims []*worker
			for _, v := range workers {
				if !v.exited && nsOf[v.idx] == ns {
					victims = append(victims, v)
				}
			}
			for _, v := range victims { // no event is read between the signals
				fmt.Fprintf(logw, "[launcher] step %d: SIGKILL host %s: rank %d (worker %d, pid %d)\n", sum.MaxStep, ns, v.rank, v.idx, v.pid)
				if err := job.Signal(v.idx, syscall.SIGKILL); err != nil {
					fmt.Fprintf(logw, "[launcher] %v\n", err)
				}
			}
			awaiting = append(awaiting, faultAt{at: time.Now(), round: lastRound})
			return
		}
		sig := map[faults.Kind]syscall.Signal{faults.Kill: syscall.SIGKILL, faults.Stop: syscall.SIGSTOP, faults.Term: syscall.SIGTERM}[f.Kind]
		fmt.Fprintf(logw, "[launcher] step %d: %s rank %d (worker %d, pid %d)\n", sum.MaxStep, sig, f.Rank, w.idx, w.pid)
		if err := job.Signal(w.idx, sig); err != nil {
			fmt.Fprintf(logw, "[launcher] %v\n", err)
			return
		}
		w.stopped = f.Kind == faults.Stop
		if f.Kind != faults.Term {
			awaiting = append(awaiting, faultAt{at: time.Now(), round: lastRound})
		}
	}
	handle := func(ev launch.Event) {
		if spec.OnEvent != nil {
			spec.OnEvent(ev)
		}
		w := workers[ev.Worker]
		switch ev.Ev {
		case EvStarted:
			// A process launch started by itself (the capacity rose, a
			// worker's Resize) or for Add or Start, which registered it
			// already.
			begun = true
			if w == nil || w.restart != ev.Restart || w.exited {
				workers[ev.Worker] = &worker{idx: ev.Worker, restart: ev.Restart, rank: -1, pid: ev.PID}
				running++
			}
		case launch.EvScaling:
			sc := ScalingSeen{Step: ev.Step, From: ev.From, To: ev.To, Reason: ev.Reason}
			if ev.Rank < 0 { // the launcher's own
				sc.Step = sum.MaxStep
			}
			sum.Scaling = append(sum.Scaling, sc)
			why := ""
			if ev.Message != "" {
				why = ": " + ev.Message // the decision's figures (autoscale.Decision.Detail)
			}
			fmt.Fprintf(logw, "[launcher] step %d: scaling %d -> %d (%s)%s\n", sc.Step, sc.From, sc.To, sc.Reason, why)
		case launch.EvPending:
			if joining[ev.Worker] {
				fmt.Fprintf(logw, "[launcher] worker %d waits in the store; the job goes on\n", ev.Worker)
				unhold(ev.Worker)
			}
		case launch.EvRound:
			unhold(ev.Worker)
			if w != nil {
				w.rank, w.round, w.pid = ev.Rank, ev.Round, ev.PID
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
		case launch.EvStep:
			if ev.Step > sum.MaxStep {
				sum.MaxStep = ev.Step
			}
			lastLoss, lastEpoch = ev.Loss, ev.Epoch
			sum.Steps = append(sum.Steps, StepSeen{Step: ev.Step, Epoch: ev.Epoch, Round: ev.Round, WorldSize: ev.WorldSize, Loss: ev.Loss, Samples: ev.Samples, At: ev.At})
			samples += int64(ev.Samples)
			// Training again means training samples: a step that trained
			// nothing (a dynamic-shard job waiting for data) is no recovery.
			for len(awaiting) > 0 && ev.Round > awaiting[0].round && ev.Samples > 0 {
				d := time.Since(awaiting[0].at).Seconds()
				sum.Recoveries = append(sum.Recoveries, d)
				fmt.Fprintf(logw, "[launcher] training again in round %d at step %d, %.3f s after the fault\n", ev.Round, ev.Step, d)
				awaiting = awaiting[1:]
			}
			for len(pending) > 0 && sum.MaxStep >= pending[0].Step && pending[0].Ready() {
				f := pending[0]
				pending = pending[1:]
				apply(f)
			}
		case launch.EvDone:
			e := ev
			sum.Done = &e
			// A stopped worker never exits by itself; the job no longer needs it.
			for _, w := range workers {
				if w.stopped && !w.exited {
					job.Signal(w.idx, syscall.SIGKILL)
				}
			}
			doneTimeout = time.After(time.Minute)
		case launch.EvError:
			if w != nil {
				w.lastErr = ev.Message
			}
			if ev.Checkpoint {
				lostCheckpoint[ev.Worker] = ev.Message
			}
			fmt.Fprintf(logw, "[launcher] worker %d: %s\n", ev.Worker, ev.Message)
		case launch.EvFinished:
			unhold(ev.Worker)
			sum.AlreadyFinished = true
			fmt.Fprintf(logw, "[launcher] worker %d: the job had already finished when it joined\n", ev.Worker)
		}
	}

	measured := func() bool {
		if !spec.StopWhenRecovered || len(awaiting) > 0 {
			return false
		}
		for _, f := range pending {
			if f.Kind == faults.Kill || f.Kind == faults.Stop || f.Kind == faults.KillHost {
				return false
			}
		}
		return len(sum.Recoveries) > 0
	}
	summarise := func() {
		sum.Rounds = sum.Rounds[:0]
		for _, r := range rounds {
			sum.Rounds = append(sum.Rounds, *r)
		}
		sort.Slice(sum.Rounds, func(i, j int) bool { return sum.Rounds[i].Round < sum.Rounds[j].Round })
		sum.Wall = time.Since(start)
	}
	ctxDone := ctx.Done()
	for running > 0 || !begun {
		if measured() {
			summarise()
			return sum, nil // the deferred clean-up kills the workers
		}
		select {
		case <-ctxDone:
			// launch forwards the SIGTERM to every worker; they leave
			// (a stopped one stays stopped and is killed after the grace
			// period), and this loop sees them go.
			ctxDone = nil
			fmt.Fprintf(logw, "[launcher] %v: stopping every worker (SIGTERM, then SIGKILL after the grace period)\n", context.Cause(ctx))
		case <-q.ready:
			for _, it := range q.take() {
				if it.ev != nil {
					handle(*it.ev)
					continue
				}
				// Every event of the worker came before its exit.
				ex := it.exit
				w := workers[ex.idx]
				if w == nil || w.restart != ex.restart {
					w = &worker{idx: ex.idx, rank: -1} // an older process of the index
				}
				w.exited = true
				unhold(ex.idx)
				running--
				sum.Exits[ex.idx] = ex.code
				if ex.code != 0 {
					rank := "no rank"
					if w.rank >= 0 {
						rank = fmt.Sprintf("rank %d", w.rank)
					}
					fmt.Fprintf(logw, "[launcher] worker %d (%s) exited: %v\n", ex.idx, rank, ex.err)
				}
			}
		case <-holdTimeout:
			fmt.Fprintf(logw, "[launcher] no newcomer waits in the store after %v; the job goes on\n", HoldBound)
			clear(joining)
			unhold(-1)
		case <-doneTimeout:
			fmt.Fprintf(logw, "[launcher] workers still running a minute after the job finished; killing them\n")
			job.Kill()
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
	_, jobErr := job.Wait()
	summarise()
	switch {
	case ctx.Err() != nil && jobErr != nil:
		// Stopped from outside: preempted (every worker left gracefully)
		// or failed, by launch's rule.
		return sum, fmt.Errorf("monitor: %w", jobErr)
	case ctx.Err() != nil && sum.Done == nil:
		return sum, fmt.Errorf("monitor: stopped before the job finished: %w", ctx.Err())
	case sum.Done == nil && sum.AlreadyFinished:
		return sum, ErrJobAlreadyFinished
	case sum.Done == nil:
		var why []string // the workers that failed, with their last error
		idx := make([]int, 0, len(workers))
		for i := range workers {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			if w := workers[i]; sum.Exits[i] > 0 && w.lastErr != "" {
				why = append(why, fmt.Sprintf("worker %d exited with status %d: %s", i, sum.Exits[i], w.lastErr))
			}
		}
		if len(why) > 0 {
			return sum, fmt.Errorf("monitor: every worker exited and none reported the job done; %s", strings.Join(why, "; "))
		}
		return sum, errors.New("monitor: every worker exited and none reported the job done")
	}
	if w := workers[sum.Done.Worker]; w != nil && sum.Exits[w.idx] != 0 {
		// The worker that reported the job done failed after all (its
		// final checkpoint was not written, say): the job's result is
		// there, but the job did not end cleanly.
		why := w.lastErr
		if why == "" {
			why = "it reported no error"
		}
		return sum, fmt.Errorf("%w: worker %d (rank %d) reported the job done, then exited with status %d: %s",
			ErrFinishedWithError, w.idx, sum.Done.Rank, sum.Exits[w.idx], why)
	}
	if len(lostCheckpoint) > 0 {
		// Another worker lost a checkpoint it had to write: the job's
		// result stands, its durability does not.
		idx := make([]int, 0, len(lostCheckpoint))
		for i := range lostCheckpoint {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		why := make([]string, len(idx))
		for j, i := range idx {
			why[j] = fmt.Sprintf("worker %d (status %d): %s", i, sum.Exits[i], lostCheckpoint[i])
		}
		return sum, fmt.Errorf("%w: a worker's checkpoint was not written: %s", ErrFinishedWithError, strings.Join(why, "; "))
	}
	return sum, nil
}

// item is one thing the hooks queue for Run: an event or an exit.
type item struct {
	ev   *launch.Event
	exit *exit
}

// queue holds what the hooks hand Run, in the order launch calls them;
// put never blocks, so a hook never waits for Run (which calls Job.Add
// and Job.Signal). Safe for concurrent use.
type queue struct {
	mu    sync.Mutex
	items []item
	ready chan struct{} // capacity 1: something was queued since the last take
}

func (q *queue) put(it item) {
	q.mu.Lock()
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *queue) take() []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
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

// RecoveriesFromFailures returns how many failures the job recovered from:
// the recovery rounds (RoundSeen.Recovery), where one that follows another
// recovery round with no step that trained samples in between (Steps) is
// the same recovery taking one more round, not another one. A paused
// worker, for one, often costs two rounds: the survivors' first round
// fails too while the store still lists it.
func (s Summary) RecoveriesFromFailures() int {
	n := 0
	var prev uint64 // the last recovery round counted or merged; 0: none yet
	for _, r := range s.Rounds {
		if !r.Recovery {
			continue
		}
		if prev == 0 || s.trainedIn(prev, r.Round) {
			n++
		}
		prev = r.Round
	}
	return n
}

// trainedIn reports whether a step of a round in [from, to) trained
// samples.
func (s Summary) trainedIn(from, to uint64) bool {
	for _, st := range s.Steps {
		if st.Round >= from && st.Round < to && st.Samples > 0 {
			return true
		}
	}
	return false
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

// EpochStepsPerSecond returns one figure per epoch seen in Steps, in epoch
// order: the steps of that epoch after its first, over the time from its
// first to its last step (rank 0's clock); 0 for an epoch of one step.
// A step repeated after a rollback counts again: it was trained again.
func (s Summary) EpochStepsPerSecond() []float64 {
	type span struct {
		n           int
		first, last float64
	}
	var order []int
	spans := map[int]*span{}
	for _, st := range s.Steps {
		sp := spans[st.Epoch]
		if sp == nil {
			sp = &span{first: st.At}
			spans[st.Epoch] = sp
			order = append(order, st.Epoch)
		}
		sp.n++
		sp.last = st.At
	}
	sort.Ints(order)
	out := make([]float64, 0, len(order))
	for _, e := range order {
		sp := spans[e]
		v := 0.0
		if dt := sp.last - sp.first; sp.n > 1 && dt > 0 {
			v = float64(sp.n-1) / dt
		}
		out = append(out, v)
	}
	return out
}

// MeanWorldSize returns the world size averaged over training time: each
// step's world size weighted by the time from the step before it to it
// (rank 0's clock); 0 with fewer than two steps.
func (s Summary) MeanWorldSize() float64 {
	var sum, total float64
	for i := 1; i < len(s.Steps); i++ {
		dt := s.Steps[i].At - s.Steps[i-1].At
		if dt <= 0 {
			continue
		}
		sum += float64(s.Steps[i].WorldSize) * dt
		total += dt
	}
	if total == 0 {
		return 0
	}
	return sum / total
}
