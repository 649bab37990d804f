package faultinject

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/elastictrain/elastictrain/internal/freeport"
	"github.com/elastictrain/elastictrain/internal/netns"
	"github.com/elastictrain/elastictrain/launch"
)

// RedisServer controls the Redis a harness runs against, for the faults
// "Redis restarted empty" and "Redis stopped for a while".
// *testredis.Server implements it.
type RedisServer interface {
	Addr() string
	Stop()
	Restart() error
}

// Config describes a harness: the job, the problem its workers train, the
// timings they use, where they meet, and which links go through proxies.
// Start from DefaultConfig; Start calls Validate.
type Config struct {
	// Dir is the working directory: the audit log, checkpoints and one log
	// file per worker. Required.
	Dir string
	// JobID names the job. Required.
	JobID string
	// Secret is the job secret (at least 16 bytes). Required.
	Secret []byte
	// RedisAddr is the Redis the workers use (host:port). Required.
	RedisAddr string
	// RedisUser and RedisPassword authenticate with an ACL user (optional).
	RedisUser, RedisPassword string
	// RedisCAFile, when set, makes the workers talk TLS to Redis, trusting
	// the PEM certificates in this file. Default "" (plain TCP).
	RedisCAFile string
	// RedisSentinels, when set, are the addresses of Redis Sentinels that
	// monitor RedisMaster: the workers then reach Redis through go-redis'
	// failover client (redis.NewFailoverClient), which asks the Sentinels
	// for the current master and follows a failover; RedisAddr is then
	// only a label. Default nil (a plain client of RedisAddr).
	RedisSentinels []string
	// RedisMaster is the master name the Sentinels monitor (required with
	// RedisSentinels).
	RedisMaster string
	// Redis, when set, lets the harness stop and restart Redis; its Addr
	// should equal RedisAddr. Default nil (no Redis faults).
	Redis RedisServer
	// Workers is how many workers Start launches. Default 3.
	Workers int
	// MinWorkers and MaxWorkers bound the world size. Defaults 2 and 5.
	MinWorkers, MaxWorkers int
	// Epochs, Samples, Dim, GlobalBatch and Seed define the
	// linear-regression job (trainertest). Defaults 3, 1600, 8, 16, 11.
	Epochs, Samples, Dim, GlobalBatch int
	Seed                              uint64
	// StepDelay is each step's simulated compute time. Default 3 ms.
	StepDelay time.Duration
	// LeaseTTL (default 1 s), HeartbeatInterval (150 ms), LastCall (200 ms)
	// and OutageBudget (10 s) configure the rendezvous.
	LeaseTTL, HeartbeatInterval, LastCall, OutageBudget time.Duration
	// OpTimeout (default 3 s), DialTimeout (5 s) and HoldTimeout (3 s)
	// configure the collective transport.
	OpTimeout, DialTimeout, HoldTimeout time.Duration
	// GracePeriod bounds a preempted worker's exit. Default 10 s.
	GracePeriod time.Duration
	// RedisTimeout is the workers' go-redis dial/read/write timeout.
	// Default 1 s.
	RedisTimeout time.Duration
	// MaxRecoveries is the workers' failure budget. Default 1000.
	MaxRecoveries int
	// CheckpointEvery is the steps between durable checkpoints. Default 20.
	CheckpointEvery int
	// ProgressTimeout is the workers' elastic.Config.ProgressTimeout.
	// Default 0: the trainer's default (15 s).
	ProgressTimeout time.Duration
	// PhaseTimeout is the workers' elastic.Config.PhaseTimeout. Default 0:
	// the trainer's default (10 min).
	PhaseTimeout time.Duration
	// Hangs lets the test hang a worker's step function (Harness.Hang).
	// Default false.
	Hangs bool
	// Phases are long phases that are not hangs, each run once by the
	// workers it names (issue 14). Default none.
	Phases []Phase
	// ProxyRedis puts a Proxy between each worker and Redis; ProxyPeers
	// puts one in front of each worker's collective port (peers dial the
	// proxy). Both default false.
	ProxyRedis, ProxyPeers bool
	// Hosts, when set, places worker i on Hosts[i % len(Hosts)]: a host of
	// its own (a network namespace of internal/netns, with its own address
	// and a link the HostCut fault cuts), where the worker listens on the
	// host's address. RedisAddr must be reachable from the hosts (a
	// redis-server on another host, or on the Net's gateway). It does not
	// combine with ProxyPeers. Default nil (every worker on this host).
	Hosts []*netns.Host
	// Command is the worker executable and its arguments. Default: this
	// binary with "-test.run=^$" (a test binary whose TestMain calls
	// WorkerMain when IsWorker).
	Command []string
	// Log receives one line per harness action (faults, starts, exits).
	// Default: discard.
	Log io.Writer
}

// DefaultConfig returns the defaults listed on each Config field; Dir,
// JobID, Secret and RedisAddr must still be set.
func DefaultConfig() Config {
	return Config{
		Workers: 3, MinWorkers: 2, MaxWorkers: 5,
		Epochs: 3, Samples: 1600, Dim: 8, GlobalBatch: 16, Seed: 11,
		StepDelay: 3 * time.Millisecond,
		LeaseTTL:  time.Second, HeartbeatInterval: 150 * time.Millisecond,
		LastCall: 200 * time.Millisecond, OutageBudget: 10 * time.Second,
		OpTimeout: 3 * time.Second, DialTimeout: 5 * time.Second, HoldTimeout: 3 * time.Second,
		GracePeriod: 10 * time.Second, RedisTimeout: time.Second,
		MaxRecoveries: 1000, CheckpointEvery: 20,
	}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("faultinject: invalid config")

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalidConfig}, a...)...) }
	switch {
	case c.Dir == "":
		return bad("Dir is empty")
	case c.JobID == "":
		return bad("JobID is empty")
	case len(c.Secret) < 16:
		return bad("Secret is %d bytes, want at least 16", len(c.Secret))
	case c.RedisAddr == "":
		return bad("RedisAddr is empty")
	case len(c.RedisSentinels) > 0 && c.RedisMaster == "":
		return bad("RedisSentinels without RedisMaster")
	case len(c.RedisSentinels) > 0 && c.ProxyRedis:
		return bad("ProxyRedis with RedisSentinels: a proxy has one upstream, a failover client many")
	case c.Workers < 0 || c.MinWorkers < 1 || c.MaxWorkers < c.MinWorkers:
		return bad("Workers %d, MinWorkers %d, MaxWorkers %d", c.Workers, c.MinWorkers, c.MaxWorkers)
	case c.Epochs < 1 || c.Samples < 1 || c.Dim < 1 || c.GlobalBatch < 1 || c.GlobalBatch > c.Samples:
		return bad("problem: Epochs %d, Samples %d, Dim %d, GlobalBatch %d", c.Epochs, c.Samples, c.Dim, c.GlobalBatch)
	case len(c.Hosts) > 0 && c.ProxyPeers:
		return bad("Hosts and ProxyPeers do not combine")
	case c.LeaseTTL <= 0 || c.HeartbeatInterval <= 0 || c.OutageBudget <= 0 || c.OpTimeout <= 0 ||
		c.DialTimeout <= 0 || c.HoldTimeout <= 0 || c.GracePeriod <= 0 || c.RedisTimeout <= 0 || c.LastCall < 0:
		return bad("every timing must be positive")
	}
	return nil
}

// StepsPerEpoch is the number of global steps in one epoch (DropLast).
func (c Config) StepsPerEpoch() int { return c.Samples / c.GlobalBatch }

// TotalSteps is the global step count of a finished job.
func (c Config) TotalSteps() int64 { return int64(c.Epochs * c.StepsPerEpoch()) }

// Worker is one worker process as the harness sees it. Its fields are
// read through Harness methods (under the harness's lock).
type Worker struct {
	// Index is the launch index (0, 1, ... in order of Start/AddWorker).
	Index int
	// PID is the process ID.
	PID int
	// ListenAddr is the worker's own collective port; Addr is what peers
	// dial (its peer Proxy when Config.ProxyPeers).
	ListenAddr, Addr string
	// LogPath is the file holding the worker's standard error.
	LogPath string
	// Host is the host the worker runs on (Config.Hosts), or nil.
	Host *netns.Host
	// RedisProxy and PeerProxy are the worker's proxies (nil when off).
	RedisProxy, PeerProxy *Proxy

	job      *launch.Job // its process's supervisor; nil until it started
	exited   chan struct{}
	stopped  bool      // SIGSTOPped and not yet continued
	killed   bool      // SIGKILLed by the harness
	termed   bool      // SIGTERMed by the harness
	round    uint64    // newest round it reported
	source   string    // state source of its first round ("init", "checkpoint", "commit")
	restored string    // the SHA of the state its first round agreed on
	check    bool      // a worker of the restore check's own job: its rounds and steps are not the job's
	rank     int       // its rank in that round
	lastStep time.Time // when it last reported a step
	final    *Report
	lastErr  string
	exitCode int // valid once exited; -1 when killed by a signal
	signal   syscall.Signal
	reports  int
}

// Harness runs the worker processes of one job and injects faults into
// them. Its methods are safe for concurrent use. Close kills every worker
// still running, closes every proxy and waits for every goroutine.
// Each worker process is a launch.Job of its own (see the package doc).
type Harness struct {
	cfg     Config
	command []string
	audit   string
	ckpt    string

	mu       sync.Mutex
	workers  []*Worker
	maxStep  int64
	maxRound uint64
	steps    []stepMark // (time, round) of each step report, for recovery times
	notify   chan struct{}
	closed   bool
}

type stepMark struct {
	at     time.Time
	round  uint64
	step   int64
	size   int
	worker int
}

// StepMark is one step report as the harness read it: when, from which
// worker, and the round, its world size and the step.
type StepMark struct {
	At     time.Time
	Worker int
	Round  uint64
	Size   int
	Step   int64
}

// Steps returns every step report read so far, in order of arrival.
func (h *Harness) Steps() []StepMark {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]StepMark, len(h.steps))
	for i, m := range h.steps {
		out[i] = StepMark{At: m.at, Worker: m.worker, Round: m.round, Size: m.size, Step: m.step}
	}
	return out
}

// Start validates cfg, creates the working directory and launches
// cfg.Workers workers.
func Start(ctx context.Context, cfg Config) (*Harness, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("faultinject: %w", err)
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	h := &Harness{cfg: cfg, command: cfg.Command, audit: filepath.Join(cfg.Dir, "audit.jsonl"),
		ckpt: filepath.Join(cfg.Dir, "ckpt"), notify: make(chan struct{})}
	if len(h.command) == 0 {
		h.command = []string{os.Args[0], "-test.run=^$"}
	}
	for range cfg.Workers {
		if _, err := h.AddWorker(ctx); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// Config returns the harness's configuration.
func (h *Harness) Config() Config { return h.cfg }

// AuditPath returns the path of the job's audit log.
func (h *Harness) AuditPath() string { return h.audit }

// CheckpointDir returns the job's checkpoint directory.
func (h *Harness) CheckpointDir() string { return h.ckpt }

func (h *Harness) logf(format string, a ...any) {
	fmt.Fprintf(h.cfg.Log, "%s faultinject: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

// freePort returns a loopback address with a port that was free a moment
// ago and that no outgoing connection will take before the worker binds it.
func freePort() (string, error) { return freeport.Addr() }

// AddWorker launches one more worker of the job (a newcomer joins at the
// next step boundary).
func (h *Harness) AddWorker(ctx context.Context) (*Worker, error) {
	return h.startWorker(ctx, h.cfg.JobID, h.audit, h.cfg.MinWorkers, h.cfg.Epochs, false)
}

// startWorker starts a worker of job jobID; check marks the restore
// check's worker, whose rounds and steps are not the harness's job's.
func (h *Harness) startWorker(ctx context.Context, jobID, audit string, minWorkers, epochs int, check bool) (*Worker, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, errors.New("faultinject: harness closed")
	}
	w := &Worker{Index: len(h.workers), exited: make(chan struct{}), rank: -1, check: check}
	h.workers = append(h.workers, w)
	h.mu.Unlock()
	fail := func(err error) (*Worker, error) {
		close(w.exited)
		w.exitCode = -2
		return nil, fmt.Errorf("faultinject: start worker %d: %w", w.Index, err)
	}
	var listen string
	var err error
	if len(h.cfg.Hosts) > 0 {
		w.Host = h.cfg.Hosts[w.Index%len(h.cfg.Hosts)]
		listen = w.Host.Addr(0) // the port is the worker's to pick
	} else if listen, err = freePort(); err != nil {
		return fail(err)
	}
	w.ListenAddr, w.Addr = listen, ""
	redisAddr := h.cfg.RedisAddr
	if h.cfg.ProxyRedis {
		if w.RedisProxy, err = NewProxy("127.0.0.1:0", h.cfg.RedisAddr); err != nil {
			return fail(err)
		}
		redisAddr = w.RedisProxy.Addr()
	}
	if h.cfg.ProxyPeers {
		if w.PeerProxy, err = NewProxy("127.0.0.1:0", listen); err != nil {
			return fail(err)
		}
		w.Addr = w.PeerProxy.Addr()
	}
	wc := WorkerConfig{
		JobID: jobID, Index: w.Index, RedisAddr: redisAddr, RedisUser: h.cfg.RedisUser, RedisCAFile: h.cfg.RedisCAFile,
		RedisSentinels: h.cfg.RedisSentinels, RedisMaster: h.cfg.RedisMaster,
		ListenAddr: listen, AdvertiseAddr: w.Addr, AuditPath: audit, CheckpointDir: h.ckpt,
		CheckpointEvery: h.cfg.CheckpointEvery, Samples: h.cfg.Samples, Dim: h.cfg.Dim,
		GlobalBatch: h.cfg.GlobalBatch, Seed: h.cfg.Seed, Epochs: epochs, StepDelay: h.cfg.StepDelay,
		MinWorkers: minWorkers, MaxWorkers: h.cfg.MaxWorkers, LastCall: h.cfg.LastCall,
		LeaseTTL: h.cfg.LeaseTTL, HeartbeatInterval: h.cfg.HeartbeatInterval, OutageBudget: h.cfg.OutageBudget,
		OpTimeout: h.cfg.OpTimeout, DialTimeout: h.cfg.DialTimeout, HoldTimeout: h.cfg.HoldTimeout,
		MaxRecoveries: h.cfg.MaxRecoveries, GracePeriod: h.cfg.GracePeriod, RedisTimeout: h.cfg.RedisTimeout,
		ProgressTimeout: h.cfg.ProgressTimeout, PhaseTimeout: h.cfg.PhaseTimeout,
	}
	if h.cfg.Hangs {
		wc.HangFile = h.hangFile(w)
	}
	for _, ph := range h.cfg.Phases {
		if ph.Worker < 0 || ph.Worker == w.Index {
			wc.Phases = append(wc.Phases, ph)
		}
	}
	if w.Addr == "" {
		w.Addr = listen
	}
	js, _ := json.Marshal(wc)
	w.LogPath = filepath.Join(h.cfg.Dir, fmt.Sprintf("worker-%02d.log", w.Index))
	logf, err := os.Create(w.LogPath)
	if err != nil {
		return fail(err)
	}
	defer logf.Close() // the worker holds its own descriptor
	// The worker is a launch.Job of its own: launch starts it (in its
	// host's namespace), reads its events, signals it and reaps it; the
	// harness decides everything else, so launch restarts nothing, starts
	// no store (the worker has its Redis settings in WorkerConfig), and
	// never ends a worker by itself (the grace period only runs after a
	// stop, which only Close asks for).
	lcfg := launch.DefaultConfig()
	lcfg.NoStore, lcfg.StoreListen, lcfg.MaxRestarts, lcfg.GOMAXPROCS = true, "", 0, -1
	lcfg.Secret, lcfg.GracePeriod = h.cfg.Secret, time.Hour
	spec := launch.Spec{Command: h.command, Stderr: logf,
		Env: []string{EnvWorker + "=" + string(js), EnvSecret + "=" + hex.EncodeToString(h.cfg.Secret),
			EnvRedisPassword + "=" + h.cfg.RedisPassword}}
	if w.Host != nil {
		ns := w.Host.Namespace()
		spec.Wrap = func(int) []string { return []string{"ip", "netns", "exec", ns} }
	}
	hooks := launch.Hooks{
		OnStart: func(p launch.Process) {
			h.mu.Lock()
			w.PID = p.PID
			h.mu.Unlock()
		},
		OnEvent: func(ev launch.Event) { h.record(w, reportOf(ev, w.Index, time.Now())) },
		OnExit:  func(x launch.Exit) { h.exit(w, x) },
	}
	job, err := launch.Start(context.WithoutCancel(ctx), spec, lcfg, launch.WithHooks(hooks))
	if err != nil {
		return fail(err)
	}
	h.mu.Lock()
	w.job = job
	h.mu.Unlock()
	h.logf("started worker %d (pid %d, peer address %s)", w.Index, w.PID, w.Addr)
	return w, nil
}

// exit records how worker w's process ended (launch's OnExit: every event
// it sent was recorded before).
func (h *Harness) exit(w *Worker, x launch.Exit) {
	h.mu.Lock()
	w.exitCode, w.signal = x.Code, x.Signal
	w.stopped = false
	h.mu.Unlock()
	h.logf("worker %d (pid %d) exited: %v", w.Index, x.PID, x.Err)
	close(w.exited)
	h.wake()
}

func (h *Harness) wake() {
	h.mu.Lock()
	close(h.notify)
	h.notify = make(chan struct{})
	h.mu.Unlock()
}

func (h *Harness) record(w *Worker, r Report) {
	h.mu.Lock()
	w.reports++
	switch r.Kind {
	case "round":
		w.round, w.rank = r.Round, r.Rank
		if w.source == "" {
			w.source, w.restored = r.Source, r.SHA
		}
		if !w.check {
			h.maxRound = max(h.maxRound, r.Round)
		}
	case "step":
		w.round, w.rank, w.lastStep = r.Round, r.Rank, r.At
		if w.check {
			break
		}
		h.maxStep = max(h.maxStep, r.Step)
		h.maxRound = max(h.maxRound, r.Round)
		h.steps = append(h.steps, stepMark{at: r.At, round: r.Round, step: r.Step, size: r.Size, worker: w.Index})
	case "final":
		rr := r
		w.final = &rr
	case "error":
		w.lastErr = r.Err
	}
	close(h.notify)
	h.notify = make(chan struct{})
	h.mu.Unlock()
}

// Status is a snapshot of the job as the harness sees it.
type Status struct {
	// MaxStep is the highest global step any worker reported.
	MaxStep int64
	// MaxRound is the newest round any worker reported.
	MaxRound uint64
	// Live counts worker processes that have not exited; Stopped those of
	// them that are SIGSTOPped.
	Live, Stopped int
	// Ranked counts live workers whose newest report is from MaxRound.
	Ranked int
	// Finished counts workers that reported a "final".
	Finished int
}

// Status returns the current status.
func (h *Harness) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.statusLocked()
}

func (h *Harness) statusLocked() Status {
	s := Status{MaxStep: h.maxStep, MaxRound: h.maxRound}
	for _, w := range h.workers {
		if w.final != nil {
			s.Finished++
		}
		if !w.isExited() {
			s.Live++
			if w.stopped {
				s.Stopped++
			}
			if w.round == h.maxRound && w.round > 0 {
				s.Ranked++
			}
		}
	}
	return s
}

func (w *Worker) isExited() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// WaitFor waits until cond holds for the status (checked after every
// report and exit) or ctx ends; it returns the last status and ctx's error.
func (h *Harness) WaitFor(ctx context.Context, cond func(Status) bool) (Status, error) {
	for {
		h.mu.Lock()
		s, ch := h.statusLocked(), h.notify
		h.mu.Unlock()
		if cond(s) {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return s, ctx.Err()
		}
	}
}

// WaitStep waits until some worker reports global step >= step.
func (h *Harness) WaitStep(ctx context.Context, step int64) error {
	_, err := h.WaitFor(ctx, func(s Status) bool { return s.MaxStep >= step || s.Finished > 0 })
	if err != nil {
		return fmt.Errorf("faultinject: no worker reached step %d: %w", step, err)
	}
	return nil
}

// firstStepAfter returns the time of the first step report after t
// (newRound: only from a round newer than round), or the zero time.
func (h *Harness) firstStepAfter(t time.Time, round uint64, newRound bool) (time.Time, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.steps {
		if m.at.After(t) && (!newRound || m.round > round) {
			return m.at, m.round
		}
	}
	return time.Time{}, 0
}

// targets returns the live, running workers, those holding a rank in the
// newest round first, each group by index.
func (h *Harness) targets() []*Worker {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ranked, other []*Worker
	for _, w := range h.workers {
		if w.isExited() || w.stopped || w.killed || w.termed || w.job == nil {
			continue
		}
		if w.round == h.maxRound && w.round > 0 {
			ranked = append(ranked, w)
		} else {
			other = append(other, w)
		}
	}
	sort.Slice(ranked, func(i, j int) bool { return ranked[i].Index < ranked[j].Index })
	return append(ranked, other...)
}

// Signal sends sig to worker w and records it (SIGKILL, SIGTERM, SIGSTOP,
// SIGCONT).
func (h *Harness) Signal(w *Worker, sig syscall.Signal) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.isExited() {
		return fmt.Errorf("faultinject: worker %d already exited", w.Index)
	}
	if w.job == nil {
		return fmt.Errorf("faultinject: worker %d never started", w.Index)
	}
	if err := w.job.Signal(0, sig); err != nil {
		return fmt.Errorf("faultinject: signal worker %d: %w", w.Index, err)
	}
	switch sig {
	case syscall.SIGKILL:
		w.killed = true
	case syscall.SIGTERM:
		w.termed = true
	case syscall.SIGSTOP:
		w.stopped = true
	case syscall.SIGCONT:
		w.stopped = false
	}
	return nil
}

// WorkerResult is how a worker ended (see Harness.Result).
type WorkerResult struct {
	// Exited is true once the process has exited; ExitCode is its status
	// (-1 when a signal ended it).
	Exited   bool
	ExitCode int
	// Final is its "final" report, nil if it did not finish the job.
	Final *Report
	// Err is the text of its last "error" report.
	Err string
	// Source is the state source of its first round.
	Source string
}

// Result returns how worker w ended so far.
func (h *Harness) Result(w *Worker) WorkerResult {
	exited := w.isExited()
	h.mu.Lock()
	defer h.mu.Unlock()
	r := WorkerResult{Exited: exited, Final: w.final, Err: w.lastErr, Source: w.source}
	if exited {
		r.ExitCode = w.exitCode
	}
	return r
}

// Workers returns the workers launched so far, in launch order.
func (h *Harness) Workers() []*Worker {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*Worker(nil), h.workers...)
}

// WaitExit waits until every worker process has exited or ctx ends; on
// ctx's end it SIGCONTs and SIGKILLs the ones left and returns their
// indices (a violation: they did not finish within the bound).
func (h *Harness) WaitExit(ctx context.Context) []int {
	var left []int
	for _, w := range h.Workers() {
		select {
		case <-w.exited:
		case <-ctx.Done():
			left = append(left, w.Index)
		}
	}
	for _, i := range left {
		w := h.Workers()[i]
		_ = h.Signal(w, syscall.SIGCONT)
		_ = h.Signal(w, syscall.SIGKILL)
		<-w.exited
	}
	return left
}

// Close kills every worker still running (continuing stopped ones first),
// waits for them, closes every proxy and waits for every goroutine.
func (h *Harness) Close() error {
	h.mu.Lock()
	h.closed = true
	ws := append([]*Worker(nil), h.workers...)
	h.mu.Unlock()
	for _, w := range ws {
		if w.job != nil {
			_ = w.job.Signal(0, syscall.SIGCONT) // a stopped worker dies of the SIGKILL only once continued
			w.job.Kill()
			_, _ = w.job.Wait() // reaped, and every hook returned
		}
	}
	for _, w := range ws {
		if w.RedisProxy != nil {
			w.RedisProxy.Close()
		}
		if w.PeerProxy != nil {
			w.PeerProxy.Close()
		}
	}
	return nil
}

func (h *Harness) hangFile(w *Worker) string {
	return filepath.Join(h.cfg.Dir, fmt.Sprintf("hang-%02d", w.Index))
}

// Hang makes worker w's step function block (on) from its next step,
// ignoring its context as a true hang does, while the process and its
// heartbeats live on; Hang(w, false) wakes it. Needs Config.Hangs.
func (h *Harness) Hang(w *Worker, on bool) error {
	if !h.cfg.Hangs {
		return errors.New("faultinject: Hang without Config.Hangs")
	}
	if on {
		h.logf("hang worker %d's step function", w.Index)
		return os.WriteFile(h.hangFile(w), nil, 0o600)
	}
	h.logf("wake worker %d's step function", w.Index)
	if err := os.Remove(h.hangFile(w)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
