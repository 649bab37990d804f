package launch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	gosync "sync"
	"syscall"
	"time"
)

// EnvEvents holds the file descriptor on which a worker writes its events
// to the launcher (see Event and Emitter): set when the launcher reads
// them (Hooks.OnEvent), unset otherwise.
const EnvEvents = "ELASTICTRAIN_EVENTS_FD"

// The kinds of Event (Event.Ev) the examples' workers send and
// launch/monitor reads. Other kinds pass through launch unchanged.
const (
	// EvRound: the worker's trainer entered a round (every rank): Round,
	// Rank, WorldSize, Step, Epoch, Source, Recovery, RolledBack.
	EvRound = "round"
	// EvStep: rank 0 finished a step: Round, WorldSize, Step, Epoch,
	// Loss, Samples (trained over every rank), RecoverySeconds.
	EvStep = "step"
	// EvDone: rank 0's trainer finished the job: Step, Epoch, Loss,
	// Extra (the program's own results).
	EvDone = "done"
	// EvError: the worker failed or is about to exit on an error: Message,
	// and Checkpoint when a checkpoint it had to write was not written.
	EvError = "error"
	// EvFinished: the job had already finished before this worker joined
	// (its store remembers the job ID as finished).
	EvFinished = "finished"
	// EvScaling: rank 0's scaling decision changed the job's target size:
	// Step, From, To, Reason, and Message with the decision's figures.
	EvScaling = "scaling"
	// EvPending: the worker waits in the store to be taken into the
	// job's next round (it joined while a round ran). Sent once per
	// process, by the examples' workers; launch/monitor's Join faults
	// hold the job until it arrives.
	EvPending = "pending"
)

// Event is one line a worker writes to the launcher, as JSON: what its
// trainer did (a round, a step, the job done, an error). The launcher
// does not interpret it: Hooks.OnEvent hands it on, with Worker set to the
// process's index. Loss and RecoverySeconds may be NaN or ±Inf (a diverged
// run): they travel as the strings "NaN", "+Inf" and "-Inf", which plain
// JSON numbers cannot hold.
type Event struct {
	// Ev is the event's kind: EvRound, EvStep, ... or one of the
	// program's own.
	Ev string `json:"ev"`
	// Worker is the launch index of the process that sent it (set by the
	// launcher on arrival, whatever the worker wrote), and PID its pid.
	Worker int `json:"worker"`
	PID    int `json:"pid"`
	// Round, Rank and WorldSize place it in the job's membership.
	Round     uint64 `json:"round,omitempty"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size,omitempty"`
	// Step is the job's global step; Epoch the epoch it belongs to.
	Step  int64 `json:"step,omitempty"`
	Epoch int   `json:"epoch,omitempty"`
	// Loss is the step's (or the job's final) loss.
	Loss float64 `json:"loss,omitempty"`
	// Samples is how many samples the step trained over every rank.
	Samples int `json:"samples,omitempty"`
	// Source is where a round's state came from ("init", "checkpoint",
	// "commit", ...); Recovery marks a round formed after a failure, and
	// RolledBack the steps it lost.
	Source     string `json:"source,omitempty"`
	Recovery   bool   `json:"recovery,omitempty"`
	RolledBack int64  `json:"rolled_back,omitempty"`
	// RecoverySeconds is the worker's own time from seeing a failure to
	// the first step after it.
	RecoverySeconds float64 `json:"recovery_seconds,omitempty"`
	// Digest is a digest of the worker's state (hex), when the program
	// reports one: the state a round agreed on, or the trained state.
	Digest string `json:"digest,omitempty"`
	// Message is an error's text, or an event's detail.
	Message string `json:"message,omitempty"`
	// From, To and Reason describe a scaling decision (EvScaling): the
	// world size before and after, and the policy's reason.
	From   int    `json:"from,omitempty"`
	To     int    `json:"to,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Restart is the worker process's restart number, when the program
	// reports it.
	Restart int `json:"restart,omitempty"`
	// Checkpoint marks an EvError of a worker whose durable checkpoint was
	// not written: the job's result may stand, its durability does not.
	Checkpoint bool `json:"checkpoint,omitempty"`
	// Extra carries the program's own results (in EvDone, say). Its
	// numbers must be finite: an event JSON cannot encode arrives as an
	// EvError instead (see Emitter.Emit).
	Extra map[string]any `json:"extra,omitempty"`
	// At is the worker's wall clock when it sent the event (unix seconds).
	At float64 `json:"at"`
}

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
		return fmt.Errorf("launch: %q is not a number", s)
	}
	var x float64
	if err := json.Unmarshal(b, &x); err != nil {
		return err
	}
	*f = wireFloat(x)
	return nil
}

// Emitter is a worker's side of the event protocol: it writes Events to
// the launcher. Safe for concurrent use.
type Emitter struct {
	mu     gosync.Mutex
	w      io.Writer
	worker int
}

// NewEmitter returns this worker's emitter: writing to the descriptor
// named by EnvEvents, or discarding when the process was not started by a
// launcher that reads events.
func NewEmitter() *Emitter {
	e := &Emitter{w: io.Discard}
	var fd, idx int
	if _, err := fmt.Sscan(os.Getenv(EnvEvents), &fd); err == nil && fd > 2 {
		// The worker's own children do not inherit it: the launcher
		// reads until the last holder of the pipe is gone.
		syscall.CloseOnExec(fd)
		e.w = os.NewFile(uintptr(fd), "events")
	}
	if _, err := fmt.Sscan(os.Getenv(EnvWorker), &idx); err == nil {
		e.worker = idx
	}
	return e
}

// NewEmitterTo returns an emitter writing to w as worker index worker (a
// test's buffer, or a transport of the caller's own).
func NewEmitterTo(w io.Writer, worker int) *Emitter { return &Emitter{w: w, worker: worker} }

// Emit sends one event, stamping Worker, PID and At. An event that cannot
// be encoded (Extra holding a NaN, or a value JSON has no form for) is not
// dropped: an EvError saying so takes its place, so the launcher shows why
// the event it waited for never came. A failed write is ignored: a worker
// trains on when nobody reads its events.
func (e *Emitter) Emit(ev Event) {
	ev.Worker, ev.PID = e.worker, os.Getpid()
	ev.At = float64(time.Now().UnixNano()) / 1e9
	b, err := json.Marshal(ev)
	if err != nil {
		b, _ = json.Marshal(Event{Ev: EvError, Worker: ev.Worker, PID: ev.PID, Rank: ev.Rank, Step: ev.Step, At: ev.At,
			Message: fmt.Sprintf("launch: cannot encode this worker's %q event (step %d): %v", ev.Ev, ev.Step, err)})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
}

// eventPipe is the launcher's end of one worker process's events.
type eventPipe struct {
	r, w *os.File
	done chan struct{} // closed when the reader returned
}

// readEvents reads p's events until the worker closes its end, handing
// each to deliver with Worker set to worker. A line that is not an Event
// arrives as an EvError naming it, and so does a read error (after which
// the rest is discarded, so the worker never blocks on a full pipe).
func readEvents(p *eventPipe, worker, pid int, deliver func(Event)) {
	defer close(p.done)
	defer p.r.Close()
	sc := bufio.NewScanner(p.r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			ev = Event{Ev: EvError, PID: pid, Message: fmt.Sprintf("undecodable event %.200q: %v", sc.Bytes(), err)}
		}
		ev.Worker = worker
		deliver(ev)
	}
	if err := sc.Err(); err != nil {
		deliver(Event{Ev: EvError, Worker: worker, PID: pid, Message: fmt.Sprintf("reading events: %v (later events are lost)", err)})
		_, _ = io.Copy(io.Discard, p.r)
	}
}

// openEvents gives p's command its events pipe when Hooks.OnEvent is set.
func (j *Job) openEvents(p *proc, cmd *exec.Cmd) error {
	if j.hooks.OnEvent == nil {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("launch: worker %d: events pipe: %w", p.Worker, err)
	}
	cmd.ExtraFiles = append([]*os.File{w}, cmd.ExtraFiles...)
	cmd.Env = append(cmd.Env, EnvEvents+"=3")
	p.events = &eventPipe{r: r, w: w, done: make(chan struct{})}
	return nil
}

// startEvents starts reading p's events (p started; OnStart returned).
// The reader is owned by p's waiter (drain).
func (j *Job) startEvents(p *proc) {
	if p.events == nil {
		return
	}
	p.events.w.Close() // the worker holds the write end now
	go readEvents(p.events, p.Worker, p.PID, func(ev Event) {
		j.eventMu.Lock()
		defer j.eventMu.Unlock()
		j.hooks.OnEvent(ev)
	})
}

// abandon closes the pipe of a process that did not start.
func (p *eventPipe) abandon() {
	if p != nil {
		p.r.Close()
		p.w.Close()
	}
}

// drain waits, once the worker exited, until its events were handed on:
// the pipe closes when the last process holding its write end is gone
// (the worker's group is killed at its exit). After 2 s the launcher stops
// reading.
func (p *eventPipe) drain() {
	if p == nil {
		return
	}
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.r.Close() // the reader's Read returns; what is left is lost
		<-p.done
	}
}
