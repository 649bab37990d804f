package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

// Result summarises a Run from this worker's view.
type Result struct {
	// Step is the global step count when Run returned.
	Step int64
	// Epochs is how many epochs the job completed.
	Epochs int
	// Rounds is how many rounds this worker took part in.
	Rounds int
	// Recoveries is the job-wide count of failure recoveries (from the
	// committed state, so every rank agrees).
	Recoveries int
	// Rank and WorldSize are those of this worker's last round.
	Rank, WorldSize int
	// Loss is the mean loss of the last applied step.
	Loss float64
	// Finished is true when the job completed all epochs (also when this
	// worker joined after it had: then Run's error wraps
	// elastic.ErrJobFinished).
	Finished bool
	// StepTimes is where this worker's applied steps spent their time, by
	// part (loader, compute, reduce, optimizer, commit, other), summed
	// over them.
	StepTimes StepTimes
	// Checkpoints is how many periodic durable checkpoints
	// (Config.CheckpointEvery) this worker took part in (without
	// partitions: wrote, as rank 0), and CheckpointBlockedSeconds the
	// training time they blocked on it, in seconds, summed: encoding the
	// committed state and, with partitions, their Checkpoint calls and the
	// gathering of the manifests (and, for a partition that is no
	// driver.InlineCheckpointer, the write itself). It is also the metric
	// elastictrain.checkpoint.blocked.
	Checkpoints              int
	CheckpointBlockedSeconds float64
	// CheckpointWrites is how many checkpoints this worker's checkpoint
	// goroutine wrote (rank 0's; synchronous ones too), and
	// CheckpointWriteSeconds the time their CheckpointStore.Save calls
	// took, in seconds, summed: what the periodic ones would have blocked
	// had they been written on the training path.
	CheckpointWrites       int
	CheckpointWriteSeconds float64
	// Deterministic tells whether the job ran in deterministic mode:
	// Config.Deterministic (the default) with a loader that keeps it
	// (see Config.Deterministic). When it is false the parameters' last
	// bits depend on the world size and the balancer's shares.
	Deterministic bool
}

// Trainer runs the elastic training loop for one worker process. Create it
// with New and call Run once. Run's goroutine owns the parameters' Value and
// Grad buffers while it runs; Preempt may be called from any goroutine.
type Trainer[B any] struct {
	cfg        Config
	params     []Param
	opt        optim.Optimizer
	loader     StatefulLoader[B] // the user's, or the cursor adapter of a Loader
	merger     StateMerger       // nil: the loader state is the same on every rank
	listener   CommitListener    // nil: no work after every rank holds a commit
	userLoader bool              // loader is the user's StatefulLoader (barrier after Restore)
	stepFn     StepFunc[B]
	microFn    MicroStepFunc[B] // nil: the StepFunc runs once per micro-batch
	store      store.Store
	backend    Backend
	parts      []Partition
	o          options
	log        *slog.Logger
	tel        *telemetry
	grads      *sync.Buckets
	gradList   [][]float32 // every Param.Grad, in model order (GradientReducer)
	// ctlPacked: the control values' lanes (packControl) that grads
	// carries after the gradients, for a world of gradsW ranks (0: grads
	// carries the gradients only).
	ctlPacked []float32
	gradsW    int
	fp        float64
	baseLR    float64 // the optimizer's learning rate at New: the configured base rate
	eval      *evaluator
	ran       atomic.Bool
	preempt   chan struct{}
	once      stdsync.Once
	prAt      atomic.Int64 // unix nanos of Preempt

	// Loop state, owned by Run's goroutine.
	latest, prev, spare *snapshot
	step                int64
	trained             int64  // steps applied by this worker since Run began
	countRecovery       bool   // the failure that ended the last round came after a step (see syncState)
	gen                 uint64 // lineage of the live state (see Audit)
	base                int64  // step at which lineage gen began
	restored            bool   // this round's state came from a checkpoint or init
	stateRound          uint64 // round in which the live state was last installed
	epoch, epochStep    int    // where the data continues: RoundInfo.Epoch, EpochStep
	published           int64  // with partitions: step of the newest published checkpoint, as this round knows it
	uncommitted         bool   // a step or an empty global batch was Stepped since the latest commit
	recoveries          []int64
	failures            []string
	lastLoss            float64
	stepLR              float64 // the learning rate of the last applied step
	useful              time.Duration
	pendingUseful       time.Duration
	strag               stragglers    // slow-step counters of the round's ranks
	outcome             stepOutcome   // the last step's agreed control values
	acc                 []float32     // gradient accumulator over micro-batches
	micro               [][]float32   // deterministic mode: each micro-batch's gradients
	microViews          [][][]float32 // deterministic mode: micro[k] cut per parameter (microFn's grads)
	microLoss           []float64     // deterministic mode: microFn's losses
	microRuns           [][]float32   // deterministic mode: one parameter's runs of every micro-batch (fixSum)
	fixed               []float64     // deterministic mode: fixed-point gradient sums
	microCount          int           // deterministic mode: micro-batches of this rank's share
	det                 bool          // deterministic mode (Config.Deterministic, where the loader allows: deterministicMode)
	detOff              string        // why Config.Deterministic could not hold, logged once by Run
	detExp              int           // deterministic mode: the last applied step's agreed gradient exponent (gradExp)
	detBuf              []float64     // deterministic mode: the one collective's buffer, fixed-point sums then control values
	detRedone           int64         // deterministic mode: steps summed again at a wider scale (reduceFixed)
	detFuse             bool          // compute sums this step's micro-batches into detBuf at scale 2^detS (reduceFixed)
	detS                int
	ordered             bool           // deterministic mode: the round sums in order (reduceOrdered)
	microLen            int            // deterministic mode: the length of micro's buffers
	ordTensors          orderedTensors // deterministic mode, ordered: the Synchronizer takes the last part as tensors (else nil)
	ordCtl              []float32      // deterministic mode, ordTensors: the control lanes, after the Grad buffers
	ordLastList         [][]float32    // deterministic mode, ordTensors: the Grad buffers and ordCtl, the last part
	ordLast             []float32      // deterministic mode, ordered: the last micro-batch's gradients, then the control lanes
	ordOut              []float32      // deterministic mode, ordered: the sum
	ordParts            [][]float32    // deterministic mode, ordered: the parts of the sum
	ordInv              float32        // deterministic mode, ordered: 1/globalSize of the step, which makes the sums in Grad the mean
	clock               stepClock      // the step being trained, by part
	stepTimes           StepTimes      // the applied steps', by part (Result.StepTimes)
	ckptBlocked         ckptTally      // the periodic checkpoints' (Result.CheckpointBlockedSeconds)
	nvalues             int            // values over all parameters
	runStart            time.Time

	// Balancing (balance.go), owned by Run's goroutine.
	bal      dataloader.Balancer      // speed-weighted shares of the round's ranks (Config.Balance)
	weighter Weighter                 // the loader's, or nil: it cannot split by weight
	scratch  []float64                // straggler and balancing arithmetic
	balAttrs metric.MeasurementOption // the share and speed gauges' attributes, for rank balRank
	balRank  int
	// balLogged is the split rank 0 last logged at INFO (sharesMoved).
	balLogged []float64

	// afterReduce, when set (tests only), runs after a successful gradient
	// allreduce; an error makes this rank treat the step as failed there.
	afterReduce func(rank int, step int64) error
	// computeTime, when set (tests only), replaces a step's measured
	// compute time (seconds of the StepFunc) with what it returns: the
	// balancing and straggler tests give each worker an exact speed that
	// a loaded machine's scheduling cannot blur.
	computeTime func(b dataloader.Batch[B], measured time.Duration) time.Duration

	// live is the current round's Agent, for marked phases (progress.go).
	live liveness
	// reports counts failure reports in flight (report.go).
	reports stdsync.WaitGroup
	// preemptSave, when set, writes the preempted worker's checkpoint once
	// it said goodbye to its round and left (leavePreempted).
	preemptSave func(ctx context.Context) error
	// sc is resource adjustment (scaling.go), owned by Run's goroutine;
	// released is set when a scaling decision removed this worker (it
	// leaves by the preemption path and Run returns ErrReleased).
	sc       scaling
	released atomic.Bool
}

// New returns a Trainer for the model params (updated in place), optimizer
// opt, data loader, step function and rendezvous store st
// (store.NewRedis; store.NewMemory for tests in one process).
//
// loader is a Loader[B] (a *dataloader.Loader: static shards, the state is
// its cursor) or a StatefulLoader[B] (opaque state, possibly different on
// every rank: leased shards); see loader.go for the contract.
//
// Errors: ErrInvalidConfig for a bad Config, nil collaborators, duplicate
// parameter names or parameters whose Value, Grad and Shape disagree, a
// loader that is neither a Loader nor a StatefulLoader, partitions
// without or with duplicate names. Config.Deterministic with a loader that
// cannot keep it (no fixed micro-batches, or a StateMerger) is no error:
// the job runs in the float32 mode (Deterministic false), Run says so
// once at its start, and Result.Deterministic is false.
func New[B any](params []Param, opt optim.Optimizer, loader Source[B], step StepFunc[B], st store.Store, cfg Config, opts ...Option) (*Trainer[B], error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if err := cfg.validate(o.backend == nil); err != nil {
		return nil, err
	}
	if cfg.CheckpointTimeout == 0 {
		cfg.CheckpointTimeout = DefaultConfig().CheckpointTimeout
	}
	var microFn MicroStepFunc[B]
	if o.micro != nil {
		f, ok := o.micro.(MicroStepFunc[B])
		if !ok {
			return nil, fmt.Errorf("%w: WithMicroStep's function is a %T, not a MicroStepFunc of this Trainer's batch type", ErrInvalidConfig, o.micro)
		}
		microFn = f
	}
	switch {
	case len(params) == 0:
		return nil, fmt.Errorf("%w: no parameters", ErrInvalidConfig)
	case opt == nil || loader == nil || step == nil || st == nil:
		return nil, fmt.Errorf("%w: nil optimizer, loader, step function or store", ErrInvalidConfig)
	}
	names := map[string]bool{}
	grads := make([][]float32, len(params))
	for i, p := range params {
		n := 1
		for _, d := range p.Shape {
			if d < 0 {
				return nil, fmt.Errorf("%w: parameter %q has negative dimension in %v", ErrInvalidConfig, p.Name, p.Shape)
			}
			n *= d
		}
		if names[p.Name] {
			return nil, fmt.Errorf("%w: duplicate parameter name %q", ErrInvalidConfig, p.Name)
		}
		names[p.Name] = true
		if len(p.Value) != n || len(p.Grad) != n {
			return nil, fmt.Errorf("%w: parameter %q: shape %v holds %d values, Value has %d, Grad %d",
				ErrInvalidConfig, p.Name, p.Shape, n, len(p.Value), len(p.Grad))
		}
		grads[i] = p.Grad
	}
	t := &Trainer[B]{cfg: cfg, params: params, opt: opt, stepFn: step, microFn: microFn, store: st, o: o, gradList: grads,
		preempt: make(chan struct{}), spare: &snapshot{}}
	switch l := loader.(type) {
	case StatefulLoader[B]:
		t.loader, t.userLoader = l, true
		t.merger, _ = loader.(StateMerger)
		t.listener, _ = loader.(CommitListener)
	case Loader[B]:
		t.loader = &cursorLoader[B]{l: l}
	default:
		return nil, fmt.Errorf("%w: the loader %T implements neither trainer.Loader nor trainer.StatefulLoader", ErrInvalidConfig, loader)
	}
	t.det, t.detOff = deterministicMode(cfg, loader)
	t.detExp = detExpStart
	if cfg.Balance {
		t.weighter, _ = loader.(Weighter)
	}
	t.sc = newScaling(cfg.Autoscale)
	t.cfg.Elastic.JobID, t.cfg.Sync.JobID = cfg.JobID, cfg.JobID
	// WithLogger reaches the rendezvous and the transport too, unless
	// they were given loggers of their own: their waits and outages are
	// what a user most needs to see.
	if t.o.logger != nil && t.cfg.Elastic.Logger == nil {
		t.cfg.Elastic.Logger = t.o.logger.With("part", "rendezvous")
	}
	if t.o.logger != nil && t.cfg.Sync.Logger == nil {
		t.cfg.Sync.Logger = t.o.logger.With("part", "transport")
	}
	if t.o.now == nil {
		t.o.now = time.Now
	}
	t.backend = t.o.backend
	if t.backend == nil {
		t.backend = NewRingBackend(t.cfg.ListenAddr, t.cfg.Sync)
	}
	pnames := map[string]bool{EndpointSync: true}
	for _, p := range t.o.parts {
		if p == nil {
			return nil, fmt.Errorf("%w: nil Partition", ErrInvalidConfig)
		}
		n := p.Name()
		switch {
		case n == "" || len(n) > elastic.MaxMemberFieldLen:
			return nil, fmt.Errorf("%w: partition name %q is empty or longer than %d bytes", ErrInvalidConfig, n, elastic.MaxMemberFieldLen)
		case pnames[n]:
			return nil, fmt.Errorf("%w: partition name %q is taken (names are distinct, and %q is the Backend's)", ErrInvalidConfig, n, EndpointSync)
		}
		pnames[n] = true
		t.parts = append(t.parts, p)
	}
	if len(t.parts)+1 > elastic.MaxEndpoints {
		return nil, fmt.Errorf("%w: %d partitions, at most %d", ErrInvalidConfig, len(t.parts), elastic.MaxEndpoints-1)
	}
	t.log = t.o.logger
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	tel, err := newTelemetry(t.o.tp, t.o.mp, cfg.JobID)
	if err != nil {
		return nil, fmt.Errorf("trainer: telemetry: %w", err)
	}
	t.tel = tel
	t.grads = sync.NewBuckets(grads, cfg.BucketBytes)
	for _, g := range grads {
		t.nvalues += len(g)
	}
	t.fp = fingerprint(params, opt)
	if e := t.o.eval; e != nil {
		if t.eval, err = newEvaluator(*e, params); err != nil {
			return nil, err
		}
		// Composed with the user's hooks: the evaluator learns the rank
		// at every round and sees every commit.
		h := &t.o.hooks
		userRound, userCommit := h.OnRound, h.OnCommit
		h.OnRound = func(r RoundInfo) {
			t.eval.rank.Store(int64(r.Rank))
			if userRound != nil {
				userRound(r)
			}
		}
		h.OnCommit = func(step int64) {
			if userCommit != nil {
				userCommit(step)
			}
			t.eval.committed(step, t.params)
		}
	}
	t.baseLR = opt.LearningRate()
	if s := t.o.sched; s != nil {
		if err := checkSchedule(s); err != nil {
			return nil, err
		}
		t.baseLR = scheduleProbe(s)
	} else if err := checkBaseLR(t.baseLR); err != nil {
		return nil, err
	}
	return t, nil
}

// newGen returns a lineage ID for state that starts fresh or from a
// checkpoint: the wall clock in nanoseconds, so a later restore has a larger
// ID (restores are whole-job events, seconds apart).
func newGen() uint64 { return uint64(time.Now().UnixNano()) }

// fingerprint hashes parameter names, shapes and the optimizer name into a
// float64 that holds the hash exactly (52 bits), so ranks can compare models
// with one max-allreduce.
func fingerprint(params []Param, opt optim.Optimizer) float64 {
	h := fnv.New64a()
	var b []byte
	for _, p := range params {
		b = enc.AppendString(b[:0], p.Name)
		for _, d := range p.Shape {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
		b = append(b, 0xff)
		h.Write(b)
	}
	h.Write([]byte(opt.Name()))
	return float64(h.Sum64() & (1<<52 - 1))
}

// Preempt asks the worker to leave gracefully: at the next step boundary
// every rank commits, this worker writes a durable checkpoint (when a
// CheckpointStore is set) and leaves, and Run returns ErrPreempted within
// Config.GracePeriod. Call it on SIGTERM. Safe from any goroutine; calls
// after the first do nothing.
func (t *Trainer[B]) Preempt() {
	t.once.Do(func() {
		t.prAt.Store(time.Now().UnixNano())
		close(t.preempt)
	})
}

func (t *Trainer[B]) preempted() bool {
	select {
	case <-t.preempt:
		return true
	default:
		return false
	}
}

// roundEnd says why a round ended.
type roundEnd int

const (
	endFinished  roundEnd = iota // all epochs done
	endRejoin                    // planned: membership change agreed at a step boundary
	endFailure                   // a peer failed, a collective timed out or was aborted
	endPreempted                 // this worker was preempted and has committed
	endEvicted                   // this worker was evicted as a straggler
	endRefused                   // members whose settings differ were refused before any state moved (settings.go)
)

// errAbortChange is the cause of a round context cancelled because the
// rendezvous moved on while this rank was stuck in a collective.
var errAbortChange = errors.New("trainer: membership changed during a collective")

// Run trains until every epoch is done, the job is finished by others, ctx
// is cancelled, the worker is preempted or evicted, or an unrecoverable
// error occurs. It returns nil when the job finished (Result.Finished),
// or ErrCheckpoint when it finished but its final checkpoint failed (on
// every rank of the last round, not only on the rank that wrote it).
// A job ID that the store remembers as finished (an earlier run of it, or
// the others finished it before this worker trained a step) is an error
// wrapping elastic.ErrJobFinished, never success: this Run trained nothing.
//
// Errors: ErrPreempted (also wrapping ErrCheckpoint when the preempted
// worker's checkpoint failed), ErrReleased (a scaling decision removed
// this worker; Config.Autoscale), ErrEvicted, ErrDiverged, ErrFailureBudget (*BudgetError;
// also ErrStranger when the job shut this worker out for a wrong secret),
// ErrModelMismatch, ErrSettingsMismatch (also on a worker the job
// refused: see there), ErrForeignCheckpoint, ErrFinishedCheckpoint,
// ErrStepFailed, ErrCheckpoint,
// elastic.ErrJobFinished, elastic.ErrStoreUnavailable,
// elastic.ErrJoinTimeout, ctx.Err() wrapped. Run may be called only once.
//
// Run's end waits for a checkpoint write still in flight (an asynchronous
// one, every CheckpointEvery steps), also when ctx was cancelled, within
// Config.CheckpointTimeout (on a preempted worker, within what is left of
// GracePeriod); a write not done by then is cancelled, and the error Run
// returns also wraps ErrCheckpoint, naming the step and the wait.
func (t *Trainer[B]) Run(ctx context.Context) (out Result, runErr error) {
	var res Result
	if t.ran.Swap(true) {
		return res, fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	start := t.o.now()
	t.runStart = start
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// waitCtx ends with ctx, and at once on Preempt: it bounds the waits
	// outside a round (Join: a round forming below MinWorkers, the store
	// down, a fenced member's rejoin; the pause between unformed rounds),
	// which hold nothing to commit, so a preempted worker leaves them at
	// once instead of after the grace period (issue 29, item 3).
	waitCtx, cancelWait := context.WithCancelCause(ctx)
	defer cancelWait(nil)
	// After Preempt, everything must be over within the grace period.
	graceDone := make(chan struct{})
	defer close(graceDone)
	// endCtx ends only when a preempted worker's grace period does: it
	// bounds Run's wait for a checkpoint write still in flight (ck.close),
	// which Run's own ctx ending does not cut short.
	endCtx, endCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer endCancel(nil)
	go func() {
		select {
		case <-graceDone:
			return
		case <-t.preempt:
		}
		cancelWait(ErrPreempted)
		timer := time.NewTimer(t.cfg.GracePeriod)
		defer timer.Stop()
		select {
		case <-graceDone:
		case <-timer.C:
			endCancel(fmt.Errorf("trainer: grace period of %v exceeded", t.cfg.GracePeriod))
			cancelRun()
		}
	}()

	// The counters of rare events exist from the start, at 0, so a
	// dashboard or an alert sees "no recovery yet" rather than no series
	// (rate() of an absent series is no data, not 0).
	t.tel.recoveries.Add(ctx, 0, t.tel.commonAttrs)
	t.tel.stragglers.Add(ctx, 0, t.tel.commonAttrs)

	if t.eval != nil {
		defer t.eval.close(t.log)
	}
	// The Backend and every partition are closed once when Run returns,
	// whatever happened (the contracts' last call).
	defer t.closeParts()
	defer func() {
		if err := t.backend.Close(); err != nil {
			t.log.Warn("closing the backend failed", "err", err)
		}
	}()
	addr, err := t.backend.Listen(ctx)
	if err != nil {
		return res, fmt.Errorf("trainer: listen: %w", err)
	}
	endpoints := map[string]string{EndpointSync: addr}
	for _, p := range t.parts {
		paddr, err := p.Listen(ctx)
		if err != nil {
			return res, fmt.Errorf("trainer: partition %q: listen: %w", p.Name(), err)
		}
		if paddr != "" {
			endpoints[p.Name()] = paddr
		}
	}
	member := func() elastic.Member {
		m := elastic.NewMember(addr)
		m.Endpoints = endpoints
		return m
	}
	ck := newCheckpointer(ctx, t.o.ckpt, t.o.hooks.OnCheckpoint, t.log, t.tel, t.cfg.CheckpointTimeout)
	ck.mark, ck.markPeers = t.live.busyLocal, t.live.busy
	defer func() {
		// A write in flight is waited for within its bound (issue 29);
		// one that was not written is Run's error too.
		if err := ck.close(endCtx); err != nil {
			if runErr == nil {
				runErr = err
			} else {
				runErr = fmt.Errorf("%w; and %w", runErr, err)
			}
		}
		out.Checkpoints, out.CheckpointBlockedSeconds = t.ckptBlocked.n, t.ckptBlocked.seconds
		out.CheckpointWrites, out.CheckpointWriteSeconds = ck.writeStats()
		out.Deterministic = t.det
	}()
	if t.detOff != "" {
		// Said once: the default promise of the same bits does not hold.
		t.log.Info("not bit-reproducible: training in float32 whose last bits depend on the world size and the balancer's shares; "+
			"Config.Deterministic needs a loader with fixed micro-batches", "reason", t.detOff)
	}

	agent, err := elastic.NewAgent(t.store, member(), t.cfg.Elastic)
	if err != nil {
		return res, fmt.Errorf("trainer: rendezvous: %w", err)
	}
	defer func() { agent.Close() }()
	defer t.reports.Wait() // failure reports in flight (report.go), before the Agent closes

	leave := func() {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := agent.Leave(lctx); err != nil {
			t.log.Warn("leave failed", "err", err)
		}
	}

	prevSize := 0
	var failedAt time.Time // when this worker saw the failure that ended its last round
	failed := false
	uf := unformed{max: t.cfg.MaxRecoveries} // rounds in a row that failed before this worker trained a step
	shutOut := false                         // the last round failed and nobody in it authenticated this worker (see strangers.go)
	undurable := false                       // preempted, this worker holds a commit no checkpoint has: it joins on, within the grace period
	doubted := false                         // a round of this run of unformed rounds failed authentication with nobody on this worker's side (abandoned)
	var layoutOut *SettingsError             // the last round failed on a layout mismatch, cut short, this worker not the job (layout.go)
	for {
		if t.preempted() && ctx.Err() == nil && !undurable {
			if undurable = t.holdsUndurable(ctx); !undurable {
				// Outside a round with nothing to commit: leave now,
				// unless a round that ranks this worker has just closed.
				ranked, err := t.leaveWaiting(ctx, agent)
				if !ranked {
					return res, err
				}
				undurable = true
				t.log.Info("preempted just as a round that ranks this worker closed: joining it to leave at its " +
					"first step boundary (a leave now would fail it for the others), within the grace period")
			} else {
				t.log.Info("preempted outside a round while holding a commit newer than the last checkpoint: " +
					"joining on to checkpoint it in a round, within the grace period")
			}
		}
		if err := ctx.Err(); err != nil {
			leave()
			if t.released.Load() {
				return res, fmt.Errorf("%w: grace period of %v exceeded: %w", ErrReleased, t.cfg.GracePeriod, err)
			}
			if t.preempted() {
				return res, fmt.Errorf("%w: grace period of %v exceeded: %w", ErrPreempted, t.cfg.GracePeriod, err)
			}
			return res, fmt.Errorf("trainer: %w", err)
		}
		joinCtx := waitCtx
		if undurable {
			joinCtx = ctx // waitCtx ended with the preemption
		}
		jctx, span := t.tel.tracer.Start(joinCtx, SpanJoin)
		world, err := agent.Join(jctx)
		endSpan(span, err)
		switch {
		case errors.Is(err, elastic.ErrFenced):
			// Our member was evicted (e.g. we were paused past our lease):
			// come back as a new member. Our commits stay: state agreement
			// prefers holders from a later round, so they only count if no
			// fresher holder exists (every member was fenced at once).
			if layoutOut != nil {
				return res, layoutRefused(layoutOut, agent.Member().ID)
			}
			if shutOut {
				return res, t.strangerError(uf.n)
			}
			// The new member's rounds are numbered above every round
			// this process held, even if the store forgot them (a
			// failover that lost writes), so no round number is reused.
			t.log.Warn("fenced; rejoining as a new member", "err", err)
			last := agent.LastRound()
			agent.Close()
			agent, err = elastic.NewAgent(t.store, member(), t.cfg.Elastic)
			if err != nil {
				return res, fmt.Errorf("trainer: rendezvous: %w", err)
			}
			agent.SeeRound(last)
			continue
		case errors.Is(err, elastic.ErrJobFinished):
			res.Finished = true
			if t.trained == 0 {
				// Success would be a lie: this Run trained nothing, and
				// its parameters are whatever they were before it.
				return res, t.finishedBeforeJoin(err)
			}
			if t.epoch < t.cfg.Epochs {
				// The others finished the job while this worker was out
				// of it (paused, fenced, cut off): its parameters are
				// those of an older step, not the final model.
				return res, t.finishedWithout(err)
			}
			return res, nil
		case err != nil:
			if joinCtx.Err() != nil {
				continue // reported at the top of the loop
			}
			return res, fmt.Errorf("trainer: join: %w", err)
		}
		res.Rounds++
		res.Rank, res.WorldSize = world.Rank, world.Size
		t.tel.rounds.Add(ctx, 1, t.tel.commonAttrs)
		t.tel.worldSize.Record(ctx, int64(world.Size), t.tel.commonAttrs)
		t.log.Info("round formed", "round", world.Round, "rank", world.Rank, "world_size", world.Size)

		trainedBefore, sizeBefore := t.trained, prevSize
		end, rerr := t.round(ctx, agent, world, prevSize, failed, failedAt, ck)
		shutOut, layoutOut = false, nil
		trainedHere := t.trained != trainedBefore // this worker applied a step in the round
		if trainedHere {
			uf.trained()
			doubted = false
		}
		prevSize = world.Size
		res.Step, res.Loss = t.step, t.lastLoss
		res.StepTimes = t.stepTimes
		res.Recoveries = len(t.recoveries)
		res.Epochs = t.epoch
		t.tel.goodput.Record(ctx, t.goodput(start), t.tel.commonAttrs)
		switch end {
		case endFinished:
			res.Finished = true
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if world.Rank == 0 {
				if err := agent.Finish(fctx); err != nil {
					t.log.Warn("finish failed", "err", err)
				}
			} else if err := agent.Leave(fctx); err != nil && !errors.Is(err, elastic.ErrJobFinished) {
				t.log.Warn("leave failed", "err", err)
			}
			cancel()
			return res, rerr // the final checkpoint's error, if it failed
		case endRejoin:
			failed = false
		case endRefused:
			// Nothing moved: the next round follows the one before this
			// (its size for OnRescale, a recovery still owed).
			prevSize = sizeBefore
		case endFailure:
			failed, failedAt = true, t.o.now()
			// Only a round that had trained spends the job's failure
			// budget: one that failed while forming (a peer that never
			// authenticated, a member lost while connecting) is bounded by
			// the rounds-in-a-row budget below instead, so a stranger that
			// keeps rejoining cannot exhaust a healthy job's budget. It
			// stays owed until a recovery round records it, so a crash
			// followed by a failure while re-forming still counts once.
			t.countRecovery = t.countRecovery || trainedHere
			t.failures = lastFailures(t.failures, rerr.Error())
			t.log.Warn("round failed", "round", world.Round, "err", rerr)
			t.noteSilent(world, rerr)
			// A failed authentication is judged by majority (judgeAuth,
			// strangers.go); other failures by reportTarget.
			av := t.judgeAuth(ctx, agent, world, rerr)
			reported := av.reported
			shutOut = av.shutOut
			if se := (*SettingsError)(nil); errors.As(rerr, &se) {
				layoutOut = se
			}
			if r := reportTarget(rerr, world.Rank, len(world.Members), t.latest != nil); r >= 0 && !av.auth {
				// Sent beside the rejoin (report.go): a slow store must
				// not hold the recovery back.
				delivered := t.reportAsync(ctx, agent, world.Round, world.Members[r].ID)
				if !trainedHere {
					reported = delivered() // the unformed-rounds budget needs the answer
				} else {
					reported = true
				}
			}
			if !trainedHere {
				giveUp, pause := uf.failed(reported)
				if abandoned(doubted, rerr, world.Size) {
					giveUp = true
					t.failures = lastFailures(t.failures, "trainer: the only peer left while they connected, after a round that failed authentication: nobody is left to authenticate this worker")
				}
				doubted = doubted || (av.auth && !av.reported)
				if giveUp {
					leave()
					return res, &BudgetError{Unformed: uf.n, Last: slices.Clone(t.failures)}
				}
				if err := pauseUnformed(joinCtx, agent, pause, shutOut); err != nil {
					continue // reported at the top of the loop
				}
			}
		case endPreempted:
			leave()
			if t.o.ckpt == nil && !t.released.Load() {
				t.log.Warn("preempted without a checkpoint store (WithCheckpointStore): nothing durable was written; " +
					"the job's progress lives on only in the workers still running, and a rerun of a job that all left starts over")
			}
			if save := t.preemptSave; save != nil {
				// Written after the goodbye and the leave (train.go,
				// leavePreempted): the others re-form meanwhile.
				t.preemptSave = nil
				rerr = save(ctx)
			}
			if t.released.Load() {
				return res, releasedError(rerr) // left by a scaling decision (scaling.go)
			}
			if rerr != nil {
				return res, fmt.Errorf("%w, but its checkpoint was not written: %w", ErrPreempted, rerr)
			}
			return res, ErrPreempted
		case endEvicted:
			leave()
			return res, ErrEvicted
		default:
			leave()
			return res, rerr
		}
	}
}

// holdsUndurable reports whether this worker, preempted outside a round,
// holds a commit that no durable checkpoint has yet: a CheckpointStore is
// set, the worker holds live state, and the store's newest checkpoint is
// older than its latest commit (or cannot be listed within a second).
// Such a worker joins on and leaves at the next round's first step
// boundary, which writes the checkpoint (leavePreempted), within the grace
// period: if every holder of the commit was preempted at once, leaving
// would lose it. Loop goroutine only.
func (t *Trainer[B]) holdsUndurable(ctx context.Context) bool {
	if t.o.ckpt == nil || t.latest == nil {
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	steps, err := t.o.ckpt.List(lctx)
	if err != nil {
		return true
	}
	return len(steps) == 0 || steps[0] < t.latest.step
}

// leaveWaiting ends Run on a worker preempted outside a round (waiting
// for one to form, between rounds, or in a round that failed) with
// nothing to commit (holdsUndurable): it leaves at once, in store calls
// bounded by half a lease (Config.Elastic.LeaseTTL; when the store does
// not answer, the lease lapses instead), and returns ErrPreempted. When
// the store has just ranked this worker in a round that closed while its
// Join was being cancelled (elastic.Agent.LeaveUnlessRanked), it does not
// leave and returns ranked true: the caller joins that round and leaves it
// at its first step boundary, so the others see a graceful leave, not a
// member lost while the round formed.
func (t *Trainer[B]) leaveWaiting(ctx context.Context, agent *elastic.Agent) (ranked bool, err error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(t.cfg.Elastic.LeaseTTL/2, 100*time.Millisecond))
	defer cancel()
	ranked, lerr := agent.LeaveUnlessRanked(lctx)
	if ranked {
		return true, nil
	}
	if lerr != nil && !errors.Is(lerr, elastic.ErrClosed) {
		t.log.Warn("preempted while waiting; leave failed (the lease lapses instead)", "err", lerr)
	}
	t.log.Info("preempted outside a round: nothing to commit, leaving at once",
		"after", time.Since(time.Unix(0, t.prAt.Load())).Round(time.Millisecond).String())
	return false, fmt.Errorf("%w: while waiting outside a round (nothing to commit)", ErrPreempted)
}

// closeParts closes every partition, the last registered first, logging
// errors.
func (t *Trainer[B]) closeParts() {
	for i := len(t.parts) - 1; i >= 0; i-- {
		if err := t.parts[i].Close(); err != nil {
			t.log.Warn("closing a partition failed", "partition", t.parts[i].Name(), "err", err)
		}
	}
}

// sleepCtx waits d or until ctx ends (then it returns ctx's error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fatal marks an error that ends Run on this worker.
const endFatal roundEnd = -1

func (t *Trainer[B]) goodput(start time.Time) float64 {
	wall := t.o.now().Sub(start)
	if wall <= 0 {
		return 0
	}
	return float64(t.useful) / float64(wall)
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// collectiveWatch aborts a round's collectives when the rendezvous has moved
// on (a member was lost, e.g. paused past its lease: elastic's
// Agent.RoundSuperseded) while this rank waits inside a collective, so a
// hung peer becomes a new round within the detection time rather than
// after the operation timeout. A waiting joiner does not abort anything.
type collectiveWatch struct {
	since atomic.Int64 // unix nanos when the current collective began; 0 outside
	agent *elastic.Agent
	busy  func() // ends the Agent's "collective" phase (loop goroutine only)
	stop  chan struct{}
	done  chan struct{}
}

// goodputEvery is how many steps pass between goodput gauge records.
const goodputEvery = 50

// abortGrace is how long a collective may run in a superseded round before
// the watch aborts it (its peers normally fail it themselves within it),
// from the later of the collective's start and the first time the watch
// saw the round superseded: a peer that gave up on a hung rank after
// OpTimeout supersedes the round by re-forming, and its TimeoutError
// (which names the silent rank on every peer, noteSilent) must reach the
// others before the watch cancels their collectives, however long those
// had waited already.
const abortGrace = 250 * time.Millisecond

func watchCollectives(agent *elastic.Agent, cancel context.CancelCauseFunc) *collectiveWatch {
	w := &collectiveWatch{agent: agent, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var superseded time.Time // when the watch first saw the round superseded
		for {
			select {
			case <-w.stop:
				return
			case <-agent.Changes():
			case <-tick.C:
			}
			// Only a superseded round: a joiner waiting, or this
			// member's own renewals running late on a loaded machine,
			// is for the next step boundary, and aborting a healthy
			// round's Connect for it had the peers report this rank.
			if !agent.RoundSuperseded() {
				superseded = time.Time{}
				continue
			}
			if superseded.IsZero() {
				superseded = time.Now()
			}
			s := w.since.Load()
			if s != 0 && time.Since(time.Unix(0, s)) > abortGrace && time.Since(superseded) > abortGrace {
				cancel(errAbortChange)
				return
			}
		}
	}()
	return w
}

// enter and leave bracket a collective (or a connect): waiting for peers is
// a marked phase for the progress watch (elastic.Agent.Waiting: bounded by
// the collectives' own timeouts, not elastic.Config.PhaseTimeout), not a
// hang, and its end is progress.
func (w *collectiveWatch) enter() {
	w.since.Store(time.Now().UnixNano())
	w.busy = w.agent.Waiting("collective")
}
func (w *collectiveWatch) leave() {
	w.since.Store(0)
	if w.busy != nil {
		w.busy()
		w.busy = nil
	}
}
func (w *collectiveWatch) close() {
	close(w.stop)
	<-w.done
}
