package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
)

// Loader is what the trainer needs of a data loader; *dataloader.Loader
// implements it. The trainer calls it from its loop goroutine only.
type Loader[B any] interface {
	// Reset reshards the loader from a committed cursor for rank of worldSize.
	Reset(c dataloader.Cursor, rank, worldSize int) error
	// Next returns this rank's share of the next global batch.
	Next(ctx context.Context) (dataloader.Batch[B], error)
	// NewCursor returns the cursor of a fresh job (epoch 0, position 0).
	NewCursor() dataloader.Cursor
}

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
	// worker joined after it had).
	Finished bool
}

// Trainer runs the elastic training loop for one worker process. Create it
// with New and call Run once. Run's goroutine owns the parameters' Value and
// Grad buffers while it runs; Preempt may be called from any goroutine.
type Trainer[B any] struct {
	cfg     Config
	params  []Param
	opt     Optimizer
	loader  Loader[B]
	stepFn  StepFunc[B]
	store   elastic.Store
	o       options
	log     *slog.Logger
	tel     *telemetry
	grads   *sync.Buckets
	fp      float64
	ran     atomic.Bool
	preempt chan struct{}
	once    stdsync.Once
	prAt    atomic.Int64 // unix nanos of Preempt

	// Loop state, owned by Run's goroutine.
	latest, prev, spare *snapshot
	step                int64
	trained             int64  // steps applied by this worker since Run began
	countRecovery       bool   // the failure that ended the last round came after a step (see syncState)
	gen                 uint64 // lineage of the live state (see Audit)
	base                int64  // step at which lineage gen began
	restored            bool   // this round's state came from a checkpoint or init
	stateRound          uint64 // round in which the live state was last installed
	cursor              dataloader.Cursor
	recoveries          []int64
	failures            []string
	lastLoss            float64
	useful              time.Duration
	pendingUseful       time.Duration
	slow                []int
	computes            []float64   // per-rank compute seconds of the last step
	acc                 []float32   // gradient accumulator over micro-batches
	micro               [][]float32 // deterministic mode: each micro-batch's gradients
	fixed               []float64   // deterministic mode: fixed-point gradient sums
	microCount          int         // deterministic mode: micro-batches of this rank's share
	nvalues             int         // values over all parameters
	runStart            time.Time

	// afterReduce, when set (tests only), runs after a successful gradient
	// allreduce; an error makes this rank treat the step as failed there.
	afterReduce func(rank int, step int64) error
}

// New returns a Trainer for the model params (updated in place), optimizer
// opt, data loader, step function and rendezvous store.
//
// Errors: ErrInvalidConfig for a bad Config, nil collaborators, duplicate
// parameter names or parameters whose Value, Grad and Shape disagree.
func New[B any](params []Param, opt Optimizer, loader Loader[B], step StepFunc[B], store elastic.Store, cfg Config, opts ...Option) (*Trainer[B], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case len(params) == 0:
		return nil, fmt.Errorf("%w: no parameters", ErrInvalidConfig)
	case opt == nil || loader == nil || step == nil || store == nil:
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
	t := &Trainer[B]{cfg: cfg, params: params, opt: opt, loader: loader, stepFn: step, store: store,
		preempt: make(chan struct{}), spare: &snapshot{}}
	t.cfg.Elastic.JobID, t.cfg.Sync.JobID = cfg.JobID, cfg.JobID
	t.o.now = time.Now
	for _, o := range opts {
		o(&t.o)
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
	return t, nil
}

// newGen returns a lineage ID for state that starts fresh or from a
// checkpoint: the wall clock in nanoseconds, so a later restore has a larger
// ID (restores are whole-job events, seconds apart).
func newGen() uint64 { return uint64(time.Now().UnixNano()) }

// fingerprint hashes parameter names, shapes and the optimizer name into a
// float64 that holds the hash exactly (52 bits), so ranks can compare models
// with one max-allreduce.
func fingerprint(params []Param, opt Optimizer) float64 {
	h := fnv.New64a()
	var b []byte
	for _, p := range params {
		b = appendString(b[:0], p.Name)
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
)

// errAbortChange is the cause of a round context cancelled because the
// rendezvous moved on while this rank was stuck in a collective.
var errAbortChange = errors.New("trainer: membership changed during a collective")

// Run trains until every epoch is done, the job is finished by others, ctx
// is cancelled, the worker is preempted or evicted, or an unrecoverable
// error occurs. It returns nil when the job finished (Result.Finished),
// or ErrCheckpoint when it finished but its final checkpoint failed.
//
// Errors: ErrPreempted (also wrapping ErrCheckpoint when the preempted
// worker's checkpoint failed), ErrEvicted, ErrDiverged, ErrFailureBudget (*BudgetError),
// ErrModelMismatch, ErrStepFailed, ErrCheckpoint, elastic.ErrStoreUnavailable,
// elastic.ErrJoinTimeout, ctx.Err() wrapped. Run may be called only once.
func (t *Trainer[B]) Run(ctx context.Context) (Result, error) {
	var res Result
	if t.ran.Swap(true) {
		return res, fmt.Errorf("%w: Run called twice", ErrInvalidConfig)
	}
	start := t.o.now()
	t.runStart = start
	ctx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	// After Preempt, everything must be over within the grace period.
	graceDone := make(chan struct{})
	defer close(graceDone)
	go func() {
		select {
		case <-graceDone:
			return
		case <-t.preempt:
		}
		timer := time.NewTimer(t.cfg.GracePeriod)
		defer timer.Stop()
		select {
		case <-graceDone:
		case <-timer.C:
			cancelRun()
		}
	}()

	// The counters of rare events exist from the start, at 0, so a
	// dashboard or an alert sees "no recovery yet" rather than no series
	// (rate() of an absent series is no data, not 0).
	t.tel.recoveries.Add(ctx, 0, t.tel.commonAttrs)
	t.tel.stragglers.Add(ctx, 0, t.tel.commonAttrs)

	tr, err := sync.Listen(ctx, t.cfg.ListenAddr, t.cfg.Sync)
	if err != nil {
		return res, fmt.Errorf("trainer: listen: %w", err)
	}
	defer tr.Close()
	ck := newCheckpointer(t.o.ckpt, t.o.hooks.OnCheckpoint, t.log, t.tel)
	defer ck.close()

	agent, err := elastic.NewAgent(t.store, elastic.NewMember(tr.Addr()), t.cfg.Elastic)
	if err != nil {
		return res, fmt.Errorf("trainer: rendezvous: %w", err)
	}
	defer func() { agent.Close() }()

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
	unformed := 0 // rounds in a row that failed before this worker trained a step
	for {
		if err := ctx.Err(); err != nil {
			leave()
			if t.preempted() {
				return res, fmt.Errorf("%w: grace period of %v exceeded: %w", ErrPreempted, t.cfg.GracePeriod, err)
			}
			return res, fmt.Errorf("trainer: %w", err)
		}
		jctx, span := t.tel.tracer.Start(ctx, SpanJoin)
		world, err := agent.Join(jctx)
		endSpan(span, err)
		switch {
		case errors.Is(err, elastic.ErrFenced):
			// Our member was evicted (e.g. we were paused past our lease):
			// come back as a new member. Our commits stay: state agreement
			// prefers holders from a later round, so they only count if no
			// fresher holder exists (every member was fenced at once).
			// The new member's rounds are numbered above every round
			// this process held, even if the store forgot them (a
			// failover that lost writes), so no round number is reused.
			t.log.Warn("fenced; rejoining as a new member", "err", err)
			last := agent.LastRound()
			agent.Close()
			agent, err = elastic.NewAgent(t.store, elastic.NewMember(tr.Addr()), t.cfg.Elastic)
			if err != nil {
				return res, fmt.Errorf("trainer: rendezvous: %w", err)
			}
			agent.SeeRound(last)
			continue
		case errors.Is(err, elastic.ErrJobFinished):
			res.Finished = true
			return res, nil
		case err != nil:
			if ctx.Err() != nil {
				continue // reported at the top of the loop
			}
			return res, fmt.Errorf("trainer: join: %w", err)
		}
		res.Rounds++
		res.Rank, res.WorldSize = world.Rank, world.Size
		t.tel.rounds.Add(ctx, 1, t.tel.commonAttrs)
		t.tel.worldSize.Record(ctx, int64(world.Size), t.tel.commonAttrs)
		t.log.Info("round formed", "round", world.Round, "rank", world.Rank, "world_size", world.Size)

		trainedBefore := t.trained
		end, rerr := t.round(ctx, tr, agent, world, prevSize, failed, failedAt, ck)
		trainedHere := t.trained != trainedBefore // this worker applied a step in the round
		if trainedHere {
			unformed = 0
		}
		prevSize = world.Size
		res.Step, res.Loss = t.step, t.lastLoss
		res.Recoveries = len(t.recoveries)
		res.Epochs = t.cursor.Epoch
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
			cause := rerr.Error()
			t.failures = append(t.failures, cause)
			if len(t.failures) > 5 {
				t.failures = t.failures[len(t.failures)-5:]
			}
			t.log.Warn("round failed", "round", world.Round, "err", rerr)
			reported := false
			var pe *sync.PeerError
			// A peer that aborted on purpose (its round moved on, it was
			// preempted) is alive; only a lost connection is reported. A
			// worker that never held the job's state does not report: if
			// it cannot authenticate with a peer, the misconfigured one may
			// well be itself (a stale secret), and it must not evict
			// healthy members; those that trained together know better.
			if errors.As(rerr, &pe) && !errors.Is(rerr, sync.ErrAborted) && !errors.Is(rerr, sync.ErrClosed) &&
				pe.Rank >= 0 && pe.Rank < len(world.Members) && pe.Rank != world.Rank && t.latest != nil {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if err := agent.ReportFailure(rctx, world.Round, world.Members[pe.Rank].ID); err != nil {
					t.log.Warn("failure report failed", "err", err)
				} else {
					reported = true
				}
				cancel()
			}
			if !trainedHere && !reported {
				// Rounds that keep failing before a step (a member that
				// never authenticates, an address nobody reaches) must
				// neither spin nor go on for ever. A round whose culprit
				// this worker reported does not count: it was evicted, and
				// strangers that keep coming back must not wear down the
				// members that train.
				unformed++
				if unformed > t.cfg.MaxRecoveries {
					leave()
					return res, &BudgetError{Unformed: unformed, Last: slices.Clone(t.failures)}
				}
				if err := sleepCtx(ctx, unformedBackoff(unformed)); err != nil {
					continue // reported at the top of the loop
				}
			}
		case endPreempted:
			leave()
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

// unformedBackoff is the pause before rejoining after the n-th round in a
// row that failed before a step: none after the first (recovery stays
// fast), then 20 ms doubling up to 1 s.
func unformedBackoff(n int) time.Duration {
	if n < 2 {
		return 0
	}
	return min(20*time.Millisecond<<min(n-2, 10), time.Second)
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
// on (a member was lost, e.g. paused past its lease) while this rank waits
// inside a collective, so a hung peer becomes a new round within the
// detection time rather than after the operation timeout.
type collectiveWatch struct {
	since atomic.Int64 // unix nanos when the current collective began; 0 outside
	stop  chan struct{}
	done  chan struct{}
}

// goodputEvery is how many steps pass between goodput gauge records.
const goodputEvery = 50

// abortGrace is how long a collective may run with a membership change
// pending before the watch aborts it; planned changes are normally taken at
// the next step boundary well within it.
const abortGrace = 250 * time.Millisecond

func watchCollectives(agent *elastic.Agent, cancel context.CancelCauseFunc) *collectiveWatch {
	w := &collectiveWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-agent.Changes():
			case <-tick.C:
			}
			s := w.since.Load()
			if s != 0 && agent.ChangePending() && time.Since(time.Unix(0, s)) > abortGrace {
				cancel(errAbortChange)
				return
			}
		}
	}()
	return w
}

func (w *collectiveWatch) enter() { w.since.Store(time.Now().UnixNano()) }
func (w *collectiveWatch) leave() { w.since.Store(0) }
func (w *collectiveWatch) close() {
	close(w.stop)
	<-w.done
}

// round runs one round: connect, agree on state, train until the round ends.
func (t *Trainer[B]) round(ctx context.Context, tr *sync.Transport, agent *elastic.Agent, world elastic.World,
	prevSize int, recovered bool, failedAt time.Time, ck *checkpointer) (roundEnd, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Watched like a collective: a member lost before it connected (killed,
	// hung) ends the wait as soon as the rendezvous moves on, not after
	// Sync.DialTimeout.
	watch := watchCollectives(agent, cancel)
	defer watch.close()
	watch.enter()
	comm, err := tr.Connect(rctx, sync.World{JobID: t.cfg.JobID, Round: world.Round, Rank: world.Rank, Addrs: world.Addrs()})
	watch.leave()
	if err != nil {
		return t.classify(ctx, rctx, fmt.Errorf("trainer: connect round %d: %w", world.Round, err))
	}
	defer comm.Close()

	info, err := t.syncState(rctx, comm, world, recovered, watch)
	if err != nil {
		if errors.Is(err, ErrModelMismatch) || errors.Is(err, ErrFailureBudget) {
			// Every rank took this decision from the same collective.
			t.goodbye(rctx, comm)
			return endFatal, err
		}
		if errors.Is(err, ErrShapeMismatch) {
			return endFatal, err
		}
		return t.classify(ctx, rctx, err)
	}
	info.PrevWorldSize = prevSize
	if world.Rank == 0 {
		t.catchUpCheckpoint(rctx, ck)
	}
	if t.o.hooks.OnRound != nil {
		t.o.hooks.OnRound(info)
	}
	if prevSize != 0 && prevSize != world.Size && t.o.hooks.OnRescale != nil {
		t.o.hooks.OnRescale(prevSize, world.Size)
	}
	if len(t.slow) != world.Size {
		t.slow = make([]int, world.Size)
	}
	clear(t.slow)
	end, err := t.train(rctx, ctx, comm, world, recovered, failedAt, watch, ck, agent.ChangePending)
	switch {
	case end == endFinished, end == endRejoin, end == endPreempted, end == endEvicted,
		end == endFatal && errors.Is(err, ErrDiverged):
		t.goodbye(rctx, comm)
	}
	return end, err
}

// catchUpCheckpoint writes a checkpoint of the round's starting state when
// the store lacks the one last due (every CheckpointEvery steps): the rank
// 0 that was writing it may have died before it landed, and a whole-job
// crash must not fall back further than one interval.
func (t *Trainer[B]) catchUpCheckpoint(ctx context.Context, ck *checkpointer) {
	every := int64(t.cfg.CheckpointEvery)
	if t.o.ckpt == nil || every <= 0 || t.latest == nil || t.step < every {
		return
	}
	due := t.step - t.step%every
	steps, err := t.o.ckpt.List(ctx)
	if err != nil {
		t.log.Warn("cannot list checkpoints", "err", err)
		return
	}
	for _, s := range steps { // newest first
		if s <= t.step { // later steps are another history's
			if s >= due {
				return
			}
			break
		}
	}
	t.log.Info("writing the checkpoint a lost rank 0 did not", "due", due, "step", t.step)
	ck.submit(t.step, t.latest.encode(nil, t.params))
}

// goodbye ends a round that every rank leaves by the same decision, taken
// after the same collective. A rank that completed that collective may
// close its connections while a slower peer is still receiving the end of
// it, which would abort the collective there and turn the decision into a
// failure. So all ranks first meet in one more barrier: leaving it proves
// that every rank has entered it, hence has completed the deciding
// collective. The barrier itself may be cut short on a slow rank by a fast
// rank's close; that is harmless, its error is ignored.
func (t *Trainer[B]) goodbye(ctx context.Context, comm sync.Synchronizer) {
	ctx, cancel := context.WithTimeout(ctx, goodbyeTimeout)
	defer cancel()
	_ = comm.Barrier(ctx)
}

// goodbyeTimeout bounds the round-end barrier; a peer that died meanwhile
// fails it at once, a hung one costs at most this.
const goodbyeTimeout = 2 * time.Second

// classify turns an error inside a round into how the round ends.
func (t *Trainer[B]) classify(ctx, rctx context.Context, err error) (roundEnd, error) {
	if ctx.Err() != nil {
		return endFatal, fmt.Errorf("trainer: %w", ctx.Err())
	}
	if errors.Is(context.Cause(rctx), errAbortChange) {
		return endFailure, fmt.Errorf("%w: %w", errAbortChange, err)
	}
	return endFailure, err
}

// syncState makes every rank of the round hold the same state: the newest
// commit that every survivor holds, sent by broadcast from the lowest rank
// that has it; or, when no rank has live state (a new job or a whole-job
// restart), rank 0's latest good durable checkpoint or its initial values.
func (t *Trainer[B]) syncState(ctx context.Context, comm sync.Synchronizer, world elastic.World, recovered bool, watch *collectiveWatch) (RoundInfo, error) {
	ctx, span := t.tel.tracer.Start(ctx, SpanStateSync, trace.WithAttributes(
		AttrRound.Int64(int64(world.Round)), AttrRank.Int(world.Rank), AttrWorldSize.Int(world.Size)))
	info, err := t.syncStateInner(ctx, comm, world, recovered, watch)
	span.SetAttributes(AttrStep.Int64(info.Step), AttrSource.String(info.Source))
	endSpan(span, err)
	return info, err
}

func (t *Trainer[B]) syncStateInner(ctx context.Context, comm sync.Synchronizer, world elastic.World, recovered bool, watch *collectiveWatch) (RoundInfo, error) {
	const none = -1e300
	info := RoundInfo{Round: world.Round, Rank: world.Rank, WorldSize: world.Size, Recovery: recovered}
	// Phase 1: same model everywhere? Who holds the freshest state (the
	// highest round in which a rank last installed state)? A member that
	// was fenced keeps its state but, having missed rounds, defers to
	// fresher holders; if every member was fenced at once they all hold the
	// same round and nothing is lost.
	v := []float64{t.fp, -t.fp, none, 0}
	if t.latest != nil {
		v[2] = float64(t.stateRound)
	}
	if recovered {
		v[3] = 1
		if t.countRecovery {
			v[3] = 2
		}
	}
	watch.enter()
	err := comm.AllReduceFloat64(ctx, v, sync.OpMax)
	watch.leave()
	if err != nil {
		return info, fmt.Errorf("trainer: state agreement: %w", err)
	}
	if v[0] != t.fp || -v[1] != t.fp {
		return info, fmt.Errorf("%w: parameter names, shapes or optimizer differ between ranks of round %d", ErrModelMismatch, world.Round)
	}
	recovered = v[3] > 0
	counted := v[3] > 1 // the failed round had trained a step somewhere
	info.Recovery = recovered
	root := 0
	agreed := int64(-1)
	var sn *snapshot
	if v[2] > none { // some rank holds live state
		// Phase 2: among the freshest holders, the newest commit that all
		// of them hold (invariant 2), and the lowest rank holding it.
		fresh := v[2]
		w := []float64{none, -float64(world.Size)}
		if t.latest != nil && float64(t.stateRound) == fresh {
			w[0], w[1] = -float64(t.latest.step), -float64(world.Rank)
		}
		watch.enter()
		err := comm.AllReduceFloat64(ctx, w, sync.OpMax)
		watch.leave()
		if err != nil {
			return info, fmt.Errorf("trainer: state agreement: %w", err)
		}
		root, agreed = int(-w[1]), int64(-w[0])
		info.Source = "commit"
		if world.Rank == root {
			for _, c := range []*snapshot{t.latest, t.prev} {
				if c != nil && c.step == agreed {
					sn = c
				}
			}
			if sn == nil {
				return info, fmt.Errorf("%w: rank %d lacks the agreed commit of step %d", ErrCorruptState, root, agreed)
			}
		}
	} else {
		info.Source = "init"
		if world.Rank == 0 {
			var err error
			sn, info.Source, err = t.initialState(ctx)
			if err != nil {
				return info, err
			}
		}
	}
	if t.latest != nil && agreed >= 0 {
		info.RolledBack = t.step - agreed
	}

	// Broadcast the root's snapshot: its length and where it came from
	// (only rank 0 knows whether a fresh start found a checkpoint), then
	// its bytes.
	var blob []byte
	lenBuf := make([]byte, 9)
	if world.Rank == root {
		if counted {
			sn = sn.clone()
			sn.recoveries = append(sn.recoveries, t.o.now().UnixMilli())
		}
		blob = sn.encode(nil, t.params)
		binary.LittleEndian.PutUint64(lenBuf, uint64(len(blob)))
		lenBuf[8] = byte(slices.Index(stateSources, info.Source))
	}
	watch.enter()
	err = comm.Broadcast(ctx, lenBuf, root)
	watch.leave()
	if err != nil {
		return info, fmt.Errorf("trainer: state broadcast: %w", err)
	}
	if i := int(lenBuf[8]); i < len(stateSources) {
		info.Source = stateSources[i]
	}
	n := binary.LittleEndian.Uint64(lenBuf)
	if n > 1<<40 {
		return info, fmt.Errorf("%w: state of %d bytes announced", ErrCorruptState, n)
	}
	if world.Rank != root {
		blob = make([]byte, n)
	}
	watch.enter()
	err = comm.Broadcast(ctx, blob, root)
	watch.leave()
	if err != nil {
		return info, fmt.Errorf("trainer: state broadcast: %w", err)
	}
	got, err := decodeSnapshot(blob, t.params)
	if err != nil {
		return info, err
	}
	if err := t.install(got, world); err != nil {
		return info, err
	}
	t.countRecovery = false // recorded (when owed) in the state just installed
	t.restored = info.Source != "commit"
	info.Step, info.Epoch = t.step, t.cursor.Epoch
	if t.cursor.GlobalBatch > 0 {
		info.EpochStep = t.cursor.Position / t.cursor.GlobalBatch
	}
	// The failure budget, counted per job from the committed state.
	if counted {
		t.tel.recoveries.Add(ctx, 1, t.tel.commonAttrs)
	}
	cutoff := t.o.now().Add(-t.cfg.RecoveryWindow).UnixMilli()
	within := 0
	for _, r := range t.recoveries {
		if r >= cutoff {
			within++
		}
	}
	if within > t.cfg.MaxRecoveries {
		return info, &BudgetError{Recoveries: within, Last: slices.Clone(t.failures)}
	}
	return info, nil
}

// stateSources are the values of RoundInfo.Source, by their code in the
// state broadcast.
var stateSources = []string{"commit", "init", "checkpoint"}

// initialState returns rank 0's state for a round in which nobody holds
// live state: the newest durable checkpoint that loads, else the current
// parameter values with a fresh optimizer and cursor.
func (t *Trainer[B]) initialState(ctx context.Context) (*snapshot, string, error) {
	if st := t.o.ckpt; st != nil {
		steps, err := st.List(ctx)
		if err != nil {
			t.log.Warn("cannot list checkpoints", "err", err)
		}
		for _, s := range steps {
			data, err := st.Load(ctx, s)
			if err == nil {
				var sn *snapshot
				sn, err = decodeSnapshot(data, t.params)
				if err == nil {
					t.log.Info("restoring durable checkpoint", "step", s)
					sn.gen, sn.base = newGen(), sn.step
					return sn, "checkpoint", nil
				}
			}
			t.log.Warn("skipping unreadable checkpoint", "step", s, "err", err)
		}
	}
	cur, err := t.loader.NewCursor().MarshalBinary()
	if err != nil {
		return nil, "", fmt.Errorf("trainer: cursor: %w", err)
	}
	var user []byte
	if t.o.state != nil {
		user = t.o.state.AppendState(nil)
	}
	sn := &snapshot{}
	sn.take(0, newGen(), 0, t.params, t.opt, cur, nil, user)
	return sn, "init", nil
}

// install makes sn the live state and the latest commit, and reshards the loader.
func (t *Trainer[B]) install(sn *snapshot, world elastic.World) error {
	var cur dataloader.Cursor
	if err := cur.UnmarshalBinary(sn.cursor); err != nil {
		return fmt.Errorf("%w: cursor: %w", ErrCorruptState, err)
	}
	if err := sn.restoreInto(t.params, t.opt); err != nil {
		return err
	}
	if t.o.state != nil {
		if err := t.o.state.LoadState(sn.user); err != nil {
			return fmt.Errorf("trainer: user state: %w", err)
		}
	}
	if err := t.loader.Reset(cur, world.Rank, world.Size); err != nil {
		return fmt.Errorf("trainer: reshard loader: %w", err)
	}
	t.step, t.gen, t.base, t.cursor = sn.step, sn.gen, sn.base, cur
	t.stateRound = world.Round
	t.recoveries = slices.Clone(sn.recoveries)
	t.latest, t.prev = sn, nil
	t.pendingUseful = 0
	return nil
}

// commit snapshots the live state as the latest commit, keeping the previous
// one (a rank may be one commit ahead of another when a round fails).
func (t *Trainer[B]) commit(ctx context.Context) error {
	cur, err := t.cursor.MarshalBinary()
	if err != nil {
		return fmt.Errorf("trainer: cursor: %w", err)
	}
	var user []byte
	if t.o.state != nil {
		user = t.o.state.AppendState(nil)
	}
	sn := t.spare
	if sn == nil || sn == t.latest {
		sn = &snapshot{}
	}
	sn.take(t.step, t.gen, t.base, t.params, t.opt, cur, t.recoveries, user)
	t.spare, t.prev, t.latest = t.prev, t.latest, sn
	t.useful += t.pendingUseful
	t.pendingUseful = 0
	if t.o.hooks.OnCommit != nil {
		t.o.hooks.OnCommit(t.step)
	}
	return nil
}

// Control slots carried in each step's first allreduce, reduced by max, so
// every rank takes the same decision after the same step. Flags are 0 or 1;
// per-rank values sit in their rank's slots (the others send 0), so the max
// hands every rank every rank's value.
const (
	ctlChange  = iota // a membership change is pending somewhere
	ctlStepErr        // a StepFunc failed somewhere
	ctlGradMax        // largest |gradient| of any micro-batch (deterministic mode)
	ctlFixed          // then ctlPerRank slots for each rank:
)

const (
	ctlLoss    = iota // loss sum (fixed point in deterministic mode)
	ctlSamples        // samples in this rank's share
	ctlCompute        // StepFunc seconds
	ctlStop           // preempted
	ctlPerRank
)

// lossScale is the fixed-point scale of loss sums in deterministic mode.
const lossScale = 1 << 24

// train runs steps until the round ends.
func (t *Trainer[B]) train(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	recovered bool, failedAt time.Time, watch *collectiveWatch, ck *checkpointer, pending func() bool) (roundEnd, error) {
	W, rank := world.Size, world.Rank
	ctl := make([]float64, ctlFixed+ctlPerRank*W)
	if len(t.computes) < W {
		t.computes = make([]float64, W)
	}
	var agreement *AuditEntry
	if t.o.audit != nil && rank == 0 {
		agreement = &AuditEntry{Gen: t.gen, Base: t.base, Round: world.Round, Rank: rank, Step: t.step, Restored: t.restored}
	}
	roundAttrs := []attribute.KeyValue{AttrRound.Int64(int64(world.Round)), AttrRank.Int(rank), AttrWorldSize.Int(W)}
	for {
		b, err := t.loader.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return t.classify(runCtx, ctx, err)
			}
			return endFatal, fmt.Errorf("trainer: data: %w", err)
		}
		if b.Epoch >= t.cfg.Epochs {
			return t.finish(ctx, comm, world, ck)
		}
		stepStart := time.Now()
		var span trace.Span
		sctx := ctx
		if t.cfg.StepSpanEvery > 0 && (t.step+1)%int64(t.cfg.StepSpanEvery) == 0 {
			sctx, span = t.tel.tracer.Start(ctx, SpanStep, trace.WithAttributes(append(roundAttrs,
				AttrStep.Int64(t.step+1), AttrEpoch.Int(b.Epoch))...))
		}
		if a := t.o.audit; a != nil {
			if err := a.RecordStep(AuditEntry{Gen: t.gen, Round: world.Round, Rank: rank, Step: t.step + 1, Epoch: b.Epoch, Indices: b.Indices}); err != nil {
				return endFatal, err
			}
		}
		loss, gmax, stepErr := t.compute(sctx, b)
		t.microCount = len(b.Micro)
		compute := time.Since(stepStart)

		clear(ctl)
		if pending() {
			ctl[ctlChange] = 1
		}
		if stepErr != nil {
			ctl[ctlStepErr] = 1
		}
		ctl[ctlGradMax] = gmax
		mine := ctl[ctlFixed+ctlPerRank*rank:]
		mine[ctlLoss], mine[ctlSamples], mine[ctlCompute] = loss, float64(len(b.Indices)), compute.Seconds()
		if t.preempted() {
			mine[ctlStop] = 1
		}
		syncStart := time.Now()
		actx, aspan := sctx, trace.Span(nil)
		if span != nil {
			actx, aspan = t.tel.tracer.Start(sctx, SpanAllReduce)
		}
		watch.enter()
		err = comm.AllReduceFloat64(actx, ctl, sync.OpMax)
		if err == nil && ctl[ctlStepErr] == 0 {
			err = t.reduceGrads(actx, comm, ctl[ctlGradMax], b.GlobalSize)
			if err == nil && t.afterReduce != nil {
				err = t.afterReduce(rank, t.step+1)
			}
		}
		watch.leave()
		if aspan != nil {
			endSpan(aspan, err)
		}
		if err != nil {
			if span != nil {
				endSpan(span, err)
			}
			if errors.Is(err, ErrDiverged) {
				// Every rank saw the same largest gradient in the control
				// allreduce: all stop here, together.
				return endFatal, fmt.Errorf("trainer: step %d: %w", t.step+1, err)
			}
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: step %d: %w", t.step+1, err))
		}
		if agreement != nil {
			// Every rank has installed the round's state (it took part in
			// this allreduce), so the agreement is final: record it once.
			if err := t.o.audit.RecordAgreed(*agreement); err != nil {
				return endFatal, err
			}
			agreement = nil
		}
		if ctl[ctlStepErr] > 0 {
			if span != nil {
				endSpan(span, stepErr)
			}
			if stepErr != nil {
				return endFatal, fmt.Errorf("%w: step %d: %w", ErrStepFailed, t.step+1, stepErr)
			}
			return endRejoin, nil // another rank's step failed; it leaves, we go on without it
		}
		syncDur := time.Since(syncStart)
		var lossSum, n float64
		stop := false
		for r := range W {
			v := ctl[ctlFixed+ctlPerRank*r:]
			lossSum += v[ctlLoss] // in rank order, so every rank gets the same bits
			n += v[ctlSamples]
			stop = stop || v[ctlStop] > 0
			t.computes[r] = v[ctlCompute]
		}
		if t.cfg.Deterministic {
			lossSum /= lossScale
		}
		if n > 0 && !t.cfg.Deterministic {
			inv := float32(1 / n)
			for _, p := range t.params {
				for i := range p.Grad {
					p.Grad[i] *= inv
				}
			}
		}
		if err := t.opt.Step(t.params); err != nil {
			return endFatal, err
		}
		t.step++
		t.trained++
		t.cursor = b.Next
		t.lastLoss = 0
		if n > 0 {
			t.lastLoss = lossSum / n
		}
		stepDur := time.Since(stepStart)
		t.pendingUseful += stepDur

		evict := t.stragglers(ctx, world, t.computes[:W])
		leaving := stop || evict >= 0 || ctl[ctlChange] > 0
		if leaving || t.step%int64(t.cfg.CommitEvery) == 0 {
			var cspan trace.Span
			if span != nil || leaving {
				_, cspan = t.tel.tracer.Start(sctx, SpanCommit, trace.WithAttributes(AttrStep.Int64(t.step)))
			}
			err := t.commit(ctx)
			if cspan != nil {
				endSpan(cspan, err)
			}
			if err != nil {
				return endFatal, err
			}
		}
		if rank == 0 && t.cfg.CheckpointEvery > 0 && t.step%int64(t.cfg.CheckpointEvery) == 0 && !stop {
			ck.submit(t.step, t.latest.encode(nil, t.params))
		}
		t.tel.stepDur.Record(ctx, stepDur.Seconds(), t.tel.commonAttrs)
		if t.step%goodputEvery == 0 {
			t.tel.goodput.Record(ctx, t.goodput(t.runStart), t.tel.commonAttrs)
		}
		if rank == 0 {
			t.tel.samples.Add(ctx, int64(n), t.tel.commonAttrs)
		}
		if span != nil {
			span.End()
		}
		si := StepInfo{Round: world.Round, Rank: rank, WorldSize: W, Step: t.step, Epoch: b.Epoch, EpochStep: b.Step,
			Loss: t.lastLoss, Samples: int(n), ComputeSeconds: compute.Seconds(), SyncSeconds: syncDur.Seconds(), StepSeconds: stepDur.Seconds()}
		if recovered {
			rec := t.o.now().Sub(failedAt).Seconds()
			si.RecoverySeconds = rec
			t.tel.recoveryDur.Record(ctx, rec, t.tel.commonAttrs)
			_, rs := t.tel.tracer.Start(ctx, SpanRecovery, trace.WithTimestamp(failedAt), trace.WithAttributes(roundAttrs...))
			rs.End()
			recovered = false
		}
		if t.o.hooks.OnStep != nil {
			t.o.hooks.OnStep(si)
		}
		switch {
		case stop:
			if t.preempted() {
				// The lowest preempted rank writes the checkpoint.
				first := -1
				for r := range W {
					if ctl[ctlFixed+ctlPerRank*r+ctlStop] > 0 {
						first = r
						break
					}
				}
				if first == rank {
					return endPreempted, ck.saveNow(ctx, t.step, t.latest.encode(nil, t.params))
				}
				return endPreempted, nil
			}
			return endRejoin, nil
		case evict == rank:
			return endEvicted, nil
		case leaving:
			return endRejoin, nil
		}
	}
}

// stragglers updates the per-rank slow-step counters from this step's
// compute times (identical on every rank) and returns the rank to evict, or
// -1. Every rank takes the same decision.
func (t *Trainer[B]) stragglers(ctx context.Context, world elastic.World, compute []float64) int {
	if len(compute) < 3 {
		return -1 // a median needs at least three ranks to mean anything
	}
	sorted := slices.Clone(compute)
	slices.Sort(sorted)
	med := sorted[len(sorted)/2]
	evict := -1
	for r, c := range compute {
		if med > 0 && c > t.cfg.StragglerFactor*med {
			t.slow[r]++
		} else {
			t.slow[r] = 0
		}
		if t.slow[r] == t.cfg.StragglerSteps {
			info := StragglerInfo{Round: world.Round, Rank: r, Step: t.step, Ratio: c / med, Evict: t.cfg.EvictStragglers}
			t.log.Warn("straggler", "rank", r, "ratio", math.Round(info.Ratio*100)/100, "steps", t.cfg.StragglerSteps)
			t.tel.stragglers.Add(ctx, 1, t.tel.commonAttrs)
			if t.o.hooks.OnStraggler != nil {
				t.o.hooks.OnStraggler(info)
			}
			if t.cfg.EvictStragglers && evict < 0 {
				evict = r
			}
		}
	}
	return evict
}

// finish ends the job at the end of the last epoch: commit and a final
// checkpoint by rank 0 (round then says goodbye).
func (t *Trainer[B]) finish(ctx context.Context, comm sync.Synchronizer, world elastic.World, ck *checkpointer) (roundEnd, error) {
	if err := t.commit(ctx); err != nil {
		return endFatal, err
	}
	if world.Rank == 0 {
		return endFinished, ck.saveNow(ctx, t.step, t.latest.encode(nil, t.params))
	}
	return endFinished, nil
}
