package faultinject

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
)

// Bounds are the time limits a run must keep; exceeding one is a violation
// (something stayed blocked).
type Bounds struct {
	// Start bounds the first step of the job. Default 30 s.
	Start time.Duration
	// Recover bounds the time from the end of each fault to the next
	// applied step. Default 30 s.
	Recover time.Duration
	// Exit bounds the time from the last fault to the exit of every worker
	// process. Default 120 s.
	Exit time.Duration
}

func (b Bounds) withDefaults() Bounds {
	if b.Start <= 0 {
		b.Start = 30 * time.Second
	}
	if b.Recover <= 0 {
		b.Recover = 30 * time.Second
	}
	if b.Exit <= 0 {
		b.Exit = 120 * time.Second
	}
	return b
}

// RunResult is the outcome of one run: the faults as applied and every
// invariant violation found.
type RunResult struct {
	Injections []Injection
	// Violations lists every broken invariant, one sentence each; empty
	// when the run upheld them all.
	Violations []string
	// Finished counts workers that ended with the job finished; SHA is
	// their parameter hash (when they agree).
	Finished int
	SHA      string
	// Audit is the exactly-once check of the job's audit log.
	Audit audit.Report
	// Checkpoints counts the durable checkpoints that loaded.
	Checkpoints int
	// Wall is the run's duration.
	Wall time.Duration
}

// Run starts a harness with cfg, applies faults in order (each once the job
// made Fault.After steps since the previous one healed, and only while the
// job has not finished), lets the job finish, checks every invariant and
// closes the harness. Errors are reported as violations, not returned: a
// run always yields a result.
func Run(ctx context.Context, cfg Config, faults []Fault, b Bounds) RunResult {
	b = b.withDefaults()
	start := time.Now()
	var res RunResult
	violate := func(f string, a ...any) { res.Violations = append(res.Violations, fmt.Sprintf(f, a...)) }
	h, err := Start(ctx, cfg)
	if err != nil {
		violate("start: %v", err)
		return res
	}
	defer h.Close()
	res = h.drive(ctx, faults, b)
	res.Wall = time.Since(start)
	return res
}

func (h *Harness) drive(ctx context.Context, faults []Fault, b Bounds) RunResult {
	var res RunResult
	violate := func(f string, a ...any) { res.Violations = append(res.Violations, fmt.Sprintf(f, a...)) }
	bounded := func(d time.Duration) (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, d) }

	c, cancel := bounded(b.Start)
	err := h.WaitStep(c, 1)
	cancel()
	if err != nil {
		violate("the job did not start within %v: %v", b.Start, err)
	}
	blocked := err != nil
	progressAt := h.Status().MaxStep
	for i, f := range faults {
		if blocked {
			res.Injections = append(res.Injections, Injection{Fault: f, Worker: -1, Skipped: "an earlier fault left the job blocked"})
			continue
		}
		c, cancel := bounded(b.Recover)
		st, err := h.WaitFor(c, func(s Status) bool { return s.MaxStep >= progressAt+f.After || s.Finished > 0 })
		cancel()
		if err != nil {
			violate("fault %d (%v): the job made no progress for %v before it", i, f, b.Recover)
			blocked = true
			res.Injections = append(res.Injections, Injection{Fault: f, Worker: -1, Skipped: "job blocked"})
			continue
		}
		if st.Finished > 0 {
			res.Injections = append(res.Injections, Injection{Fault: f, Worker: -1, Skipped: "job finished"})
			continue
		}
		in, err := h.Inject(ctx, f)
		if err != nil {
			violate("fault %d: %v", i, err)
		}
		if in.Skipped == "" {
			c, cancel := bounded(b.Recover)
			in.Progressed = h.waitProgress(c, in.Healed)
			cancel()
			if !in.Progressed {
				violate("fault %d (%v): no step applied within %v after it ended (blocked)", i, f, b.Recover)
				blocked = true
			}
			progressAt = h.Status().MaxStep
		}
		res.Injections = append(res.Injections, in)
	}
	fin := h.Finish(ctx, b)
	fin.Injections = res.Injections
	fin.Violations = append(res.Violations, fin.Violations...)
	h.measure(fin.Injections)
	return fin
}

// Finish ends a run: it starts workers up to MinWorkers if the job has not
// finished, waits (within b.Exit) for every worker process to exit, and
// checks every invariant: every process exited (one left is killed and is a
// violation) with the status its faults explain, no panic, race or secret
// in any log, identical parameters on every rank that finished, every
// sample of every epoch exactly once in the audit, every durable
// checkpoint loads, and the newest restores the final state.
func (h *Harness) Finish(ctx context.Context, b Bounds) RunResult {
	b = b.withDefaults()
	var res RunResult
	violate := func(f string, a ...any) { res.Violations = append(res.Violations, fmt.Sprintf(f, a...)) }
	if st := h.Status(); st.Finished == 0 {
		for n := h.staying(); n < h.cfg.MinWorkers; n++ {
			if _, err := h.AddWorker(ctx); err != nil {
				violate("add a worker to finish: %v", err)
			}
		}
	}
	c, cancel := context.WithTimeout(ctx, b.Exit)
	left := h.WaitExit(c)
	cancel()
	if len(left) > 0 {
		violate("workers %v did not exit within %v of the last fault (killed)", left, b.Exit)
	}
	h.check(ctx, &res, b)
	return res
}

// staying counts the workers that run and will stay: not exited, not
// stopped, not killed or preempted by the harness.
func (h *Harness) staying() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, w := range h.workers {
		if w.job != nil && !w.isExited() && !w.stopped && !w.killed && !w.termed {
			n++
		}
	}
	return n
}

// waitProgress waits for a step report after t (or a finished job).
func (h *Harness) waitProgress(ctx context.Context, t time.Time) bool {
	for {
		h.mu.Lock()
		ch := h.notify
		done := len(h.steps) > 0 && h.steps[len(h.steps)-1].at.After(t)
		for _, w := range h.workers {
			done = done || w.final != nil
		}
		h.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// measure fills the recovery fields of the injections from the step reports.
func (h *Harness) measure(ins []Injection) {
	for i := range ins {
		in := &ins[i]
		if in.Skipped != "" {
			continue
		}
		next := time.Time{}
		for _, o := range ins[i+1:] {
			if o.Skipped == "" {
				next = o.At
				break
			}
		}
		at, _ := h.firstStepAfter(in.At, in.Round, true)
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			in.Disrupted = true
			in.Recovery = at.Sub(in.At)
			in.RecoveryAfterHeal = max(at.Sub(in.Healed), 0)
			continue
		}
		if at, _ := h.firstStepAfter(in.Healed, 0, false); !at.IsZero() {
			in.Recovery = at.Sub(in.Healed)
		}
	}
}

// check verifies the invariants of a run whose workers have all exited.
func (h *Harness) check(ctx context.Context, res *RunResult, b Bounds) {
	violate := func(f string, a ...any) { res.Violations = append(res.Violations, fmt.Sprintf(f, a...)) }
	total := h.cfg.TotalSteps()
	secretHex := []byte(hex.EncodeToString(h.cfg.Secret))

	// Every process exited, and how.
	var finalRound uint64
	h.mu.Lock()
	for _, m := range h.steps {
		if m.step == total {
			finalRound = max(finalRound, m.round)
		}
	}
	workers := append([]*Worker(nil), h.workers...)
	h.mu.Unlock()
	var shas = map[string][]int{}
	for _, w := range workers {
		if w.job == nil {
			continue
		}
		if !w.isExited() {
			violate("worker %d (pid %d) is still running", w.Index, w.PID)
			continue
		}
		if err := syscall.Kill(w.PID, 0); err == nil {
			violate("worker %d (pid %d) was reaped but its PID answers", w.Index, w.PID)
		}
		h.mu.Lock()
		final, lastErr, code, sig, killed, termed, round := w.final, w.lastErr, w.exitCode, w.signal, w.killed, w.termed, w.round
		h.mu.Unlock()
		// The log dies with the run's directory: a violation quotes what
		// it needs of it.
		logb, err := os.ReadFile(w.LogPath)
		if err != nil {
			violate("worker %d: read log: %v", w.Index, err)
		}
		switch {
		case killed && sig == syscall.SIGKILL:
		case code == ExitFinished && final != nil:
			if final.Step == total {
				shas[final.SHA] = append(shas[final.SHA], w.Index)
			} else if round == finalRound {
				violate("worker %d took part in the final round %d but ended at step %d of %d", w.Index, round, final.Step, total)
			}
		case termed && code == ExitPreempted:
		case code == ExitJobFinished && finalRound > 0 && round < finalRound:
			// Left behind by a fault (hung, cut off, paused) while the
			// others finished the job: the SDK's error says its
			// parameters are not the final model, which is the truth,
			// and nothing it trained is lost (the audit below checks).
			// A worker of the final round that says so is a violation.
		default:
			violate("worker %d (pid %d) ended with status %d (signal %v, killed %v, termed %v): %s\n%s", w.Index, w.PID, code, sig, killed, termed, lastErr,
				logExcerpt(logb, ""))
		}
		for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
			if bytes.Contains(logb, []byte(bad)) {
				violate("worker %d's log contains %q:\n%s", w.Index, bad, logExcerpt(logb, bad))
			}
		}
		if bytes.Contains(logb, h.cfg.Secret) || bytes.Contains(logb, secretHex) {
			violate("worker %d's log contains the job secret", w.Index)
		}
	}
	// Identical parameters on every rank that finished the job.
	switch len(shas) {
	case 0:
		violate("no worker finished the job (%d steps)", total)
	case 1:
		for sha, ws := range shas {
			res.SHA, res.Finished = sha, len(ws)
		}
	default:
		violate("finishing ranks disagree on the parameters: %v", shas)
	}
	// Exactly once.
	if rep, err := VerifyAuditFile(h.audit, h.cfg); err != nil {
		violate("audit: %v", err)
	} else {
		res.Audit = rep
		if rep.Missing != 0 || rep.Duplicates != 0 || int64(rep.Steps) != total {
			violate("audit: %d samples missing, %d duplicated, %d steps of %d", rep.Missing, rep.Duplicates, rep.Steps, total)
		}
	}
	// Durable checkpoints load, and the newest restores the final state.
	n, err := LoadCheckpoints(ctx, h.ckpt)
	res.Checkpoints = n
	if err != nil {
		violate("checkpoints: %v", err)
	}
	if res.SHA != "" {
		if got, src, err := h.restoreCheck(ctx, b); err != nil {
			violate("restore from the final checkpoint: %v", err)
		} else if got != res.SHA || src != "checkpoint" {
			violate("restore from the final checkpoint gave state %q from %q, want %q from a checkpoint", got, src, res.SHA)
		}
	}
}

// VerifyAuditFile reads a job's audit log and checks that every sample of
// every epoch is part of exactly one surviving step.
func VerifyAuditFile(path string, cfg Config) (audit.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return audit.Report{}, err
	}
	defer f.Close()
	entries, err := audit.ReadLog(f)
	if err != nil {
		return audit.Report{}, err
	}
	steps := cfg.StepsPerEpoch()
	return audit.Verify(entries, cfg.Epochs, func(e int) []int {
		return dataloader.Order(cfg.Seed, e, cfg.Samples)[:steps*cfg.GlobalBatch]
	}), nil
}

// LoadCheckpoints loads (and so checksums) every durable checkpoint in dir
// and returns how many there are; the error names the ones that fail.
func LoadCheckpoints(ctx context.Context, dir string) (int, error) {
	st, err := checkpoint.NewLocalDir(dir, 0)
	if err != nil {
		return 0, err
	}
	steps, err := st.List(ctx)
	if err != nil {
		return 0, err
	}
	var bad []string
	for _, s := range steps {
		if _, err := st.Load(ctx, s); err != nil {
			bad = append(bad, fmt.Sprintf("step %d: %v", s, err))
		}
	}
	if len(bad) > 0 {
		return len(steps), fmt.Errorf("%d of %d do not load: %v", len(bad), len(steps), bad)
	}
	return len(steps), nil
}

// restoreCheck starts one worker of a new job on the checkpoint directory,
// told to train one epoch more than the job did: its first round must
// restore the newest checkpoint (the job's final state), and it must then
// train the extra epoch to the end. (With the job's own epochs, a new job
// on a finished checkpoint is refused, trainer.ErrFinishedCheckpoint.) It
// returns the hash of the state that first round agreed on and its source.
func (h *Harness) restoreCheck(ctx context.Context, b Bounds) (sha, source string, err error) {
	w, err := h.startWorker(ctx, h.cfg.JobID+"-restore", filepath.Join(h.cfg.Dir, "restore-audit.jsonl"), 1, h.cfg.Epochs+1, true)
	if err != nil {
		return "", "", err
	}
	c, cancel := context.WithTimeout(ctx, b.Recover)
	defer cancel()
	select {
	case <-w.exited:
	case <-c.Done():
		_ = h.Signal(w, syscall.SIGKILL)
		<-w.exited
		return "", "", fmt.Errorf("the restoring worker did not finish within %v", b.Recover)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.final == nil {
		return "", "", fmt.Errorf("the restoring worker ended with status %d: %s", w.exitCode, w.lastErr)
	}
	return w.restored, w.source, nil
}

// What a violation quotes of a worker's log (the soak deletes the logs
// with its runs' directories).
const (
	logTailLines  = 40  // an unexpected exit status: the log's last lines
	logPanicLines = 300 // a panic, a fatal error, a race: from its first line on
)

// logExcerpt returns the part of a worker's log that a violation needs,
// each line indented: with marker "", the last logTailLines lines; else
// from the first line that contains marker on ("panic:" and the goroutine
// stacks the runtime prints after it), at most logPanicLines lines.
func logExcerpt(log []byte, marker string) string {
	lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
	if marker == "" {
		lines = lines[max(0, len(lines)-logTailLines):]
	} else {
		from := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, marker) })
		if from < 0 {
			return ""
		}
		lines = lines[from:min(len(lines), from+logPanicLines)]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("    | ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return strings.TrimRight(b.String(), "\n")
}
