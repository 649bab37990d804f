package trainer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/internal/enc"
)

// round runs one round: connect, agree on state, train until the round ends.
func (t *Trainer[B]) round(ctx context.Context, agent *elastic.Agent, world elastic.World,
	prevSize int, recovered bool, failedAt time.Time, ck *checkpointer) (roundEnd, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rctx = t.live.enterRound(rctx, agent)
	defer t.live.leaveRound(agent)
	// Watched like a collective: a member lost before it connected (killed,
	// hung) ends the wait as soon as the rendezvous moves on, not after
	// the Backend's own timeout.
	watch := watchCollectives(agent, cancel)
	defer watch.close()
	watch.enter()
	comm, err := t.backend.Connect(rctx, sync.World{JobID: t.cfg.JobID, Round: world.Round, Rank: world.Rank, Addrs: world.Endpoints(EndpointSync)})
	watch.leave()
	if err != nil {
		var le *sync.LayoutError
		if errors.As(err, &le) && le.Round == world.Round && le.Size == world.Size && ctx.Err() == nil {
			// Members whose transport layout differs (layout.go).
			return t.judgeLayout(ctx, agent, world, le, rctx.Err() != nil)
		}
		return t.classify(ctx, rctx, fmt.Errorf("trainer: connect round %d: %w", world.Round, err))
	}
	defer comm.Close()
	t.live.connected(comm)

	if err := t.agreeSettings(rctx, comm, world, watch); err != nil {
		var se *SettingsError
		if errors.As(err, &se) {
			// Every rank took this decision from the same collective.
			t.goodbye(rctx, comm)
			if len(se.Refused) > 0 && !slices.Contains(se.Refused, world.Members[world.Rank].ID) {
				t.refuse(ctx, agent, world, se)
				return endRefused, nil
			}
			return endFatal, err
		}
		return t.classify(ctx, rctx, err)
	}
	// A checkpoint load, a broadcast, the loader's restore: for the
	// progress watch only, since the peers are in it too (a mark for them
	// would hold their collectives up on a peer stuck in one); the
	// checkpoint load, which they wait for, is marked for them below.
	transfer := t.live.waiting("state transfer")
	info, err := t.syncState(rctx, comm, world, recovered, watch, ck)
	transfer()
	if err != nil {
		if errors.Is(err, ErrModelMismatch) || errors.Is(err, ErrFailureBudget) || errors.Is(err, ErrForeignCheckpoint) ||
			errors.Is(err, ErrFinishedCheckpoint) {
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
	if world.Rank == 0 && len(t.parts) == 0 {
		t.catchUpCheckpoint(rctx, ck)
	}
	if t.cfg.ShareCores > 0 {
		runtime.GOMAXPROCS(coresShare(t.cfg.ShareCores, world))
	}
	if t.o.hooks.OnRound != nil {
		t.o.hooks.OnRound(info)
	}
	if prevSize != 0 && prevSize != world.Size && t.o.hooks.OnRescale != nil {
		t.o.hooks.OnRescale(prevSize, world.Size)
	}
	t.strag.factor, t.strag.steps = t.cfg.StragglerFactor, t.cfg.StragglerSteps
	t.strag.reset(world.Size)
	t.bal.Reset(world.Size)
	end, err := t.train(rctx, ctx, comm, world, recovered, failedAt, watch, ck, agent.ChangePending)
	switch {
	case end == endFinished, end == endRejoin, end == endPreempted, end == endEvicted,
		end == endFatal && (errors.Is(err, ErrDiverged) || errors.Is(err, ErrStepFailed)):
		// Every rank ends the round by the same decision.
		if perr := t.endRound(rctx, watch); perr != nil {
			t.log.Warn("a partition failed to end its round", "round", world.Round, "err", perr)
			if end == endRejoin {
				end, err = t.classify(ctx, rctx, perr)
			}
		}
		t.goodbye(rctx, comm)
	}
	return end, err
}

// endRound tells every partition that the round ends by a decision every
// rank took.
func (t *Trainer[B]) endRound(ctx context.Context, watch *collectiveWatch) error {
	for _, p := range t.parts {
		watch.enter()
		err := p.EndRound(ctx)
		watch.leave()
		if err != nil {
			return fmt.Errorf("trainer: partition %q: end of round: %w", p.Name(), err)
		}
	}
	return nil
}

// catchUpDue reports whether the store lacks the checkpoint last due
// (every CheckpointEvery steps) before the live state's step: the rank 0
// that was writing it may have died before it landed, and a whole-job
// crash must not fall back further than one interval. Rank 0 only.
func (t *Trainer[B]) catchUpDue(ctx context.Context) bool {
	every := int64(t.cfg.CheckpointEvery)
	if t.o.ckpt == nil || every <= 0 || t.latest == nil || t.step < every {
		return false
	}
	due := t.step - t.step%every
	lctx, cancel := t.ckptCall(ctx)
	steps, err := t.o.ckpt.List(lctx)
	cancel()
	if err != nil {
		t.log.Warn("cannot list checkpoints", "err", err)
		return false
	}
	for _, s := range steps { // newest first
		if s <= t.step { // later steps are another history's
			if s >= due {
				return false
			}
			break
		}
	}
	t.log.Info("writing the checkpoint a lost rank 0 did not", "due", due, "step", t.step)
	return true
}

// catchUpCheckpoint writes a checkpoint of the round's starting state when
// catchUpDue says so (jobs without partitions; rank 0, asynchronously).
func (t *Trainer[B]) catchUpCheckpoint(ctx context.Context, ck *checkpointer) {
	if t.catchUpDue(ctx) {
		ck.submit(t.step, t.latest.encode(nil, t.params))
	}
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

// classify turns an error inside a round into how the round ends: the end
// of Run when ctx (Run's) is done, when the loader can never go on
// (loaderFatal) or a partition's state is lost (ErrPartitionLost); a
// failure of the round otherwise.
func (t *Trainer[B]) classify(ctx, rctx context.Context, err error) (roundEnd, error) {
	if ctx.Err() != nil {
		return endFatal, fmt.Errorf("trainer: %w", ctx.Err())
	}
	if errors.Is(err, ErrPartitionLost) || loaderFatal(err) {
		return endFatal, err
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
// Then it restores the partitions and the loader from it (restoreData).
func (t *Trainer[B]) syncState(ctx context.Context, comm sync.Synchronizer, world elastic.World, recovered bool,
	watch *collectiveWatch, ck *checkpointer) (RoundInfo, error) {
	ctx, span := t.tel.tracer.Start(ctx, SpanStateSync, trace.WithAttributes(
		AttrRound.Int64(int64(world.Round)), AttrRank.Int(world.Rank), AttrWorldSize.Int(world.Size)))
	info, err := t.syncStateInner(ctx, comm, world, recovered, watch)
	if err == nil {
		err = t.restoreData(ctx, comm, world, info.Source, watch, ck)
	}
	info.Step, info.Epoch, info.EpochStep = t.step, t.epoch, t.epochStep
	span.SetAttributes(AttrStep.Int64(info.Step), AttrSource.String(info.Source))
	endSpan(span, err)
	return info, err
}

func (t *Trainer[B]) syncStateInner(ctx context.Context, comm sync.Synchronizer, world elastic.World, recovered bool, watch *collectiveWatch) (RoundInfo, error) {
	info := RoundInfo{Round: world.Round, Rank: world.Rank, WorldSize: world.Size, Recovery: recovered}
	// Phase 1: same model everywhere? Who holds the freshest state (the
	// highest round in which a rank last installed state)? A member that
	// was fenced keeps its state but, having missed rounds, defers to
	// fresher holders; if every member was fenced at once they all hold the
	// same round and nothing is lost.
	claim := stateClaim{fingerprint: t.fp, holds: t.latest != nil, stateRound: t.stateRound,
		recovered: recovered, owed: t.countRecovery}
	if t.latest != nil {
		claim.latestSeq = t.latest.seq
	}
	v := agreementPhase1(claim)
	watch.enter()
	err := comm.AllReduceFloat64(ctx, v, sync.OpMax)
	watch.leave()
	if err != nil {
		return info, fmt.Errorf("trainer: state agreement: %w", err)
	}
	p1 := decidePhase1(v, t.fp)
	if p1.mismatch {
		return info, fmt.Errorf("%w: parameter names, shapes or optimizer differ between ranks of round %d", ErrModelMismatch, world.Round)
	}
	counted := p1.counted
	info.Recovery = p1.recovered
	root := 0
	var sn *snapshot
	if p1.held {
		// Phase 2: among the freshest holders, the newest commit that all
		// of them hold (invariant 2), and the lowest rank holding it.
		w := agreementPhase2(claim, p1, world.Rank, world.Size)
		watch.enter()
		err := comm.AllReduceFloat64(ctx, w, sync.OpMax)
		watch.leave()
		if err != nil {
			return info, fmt.Errorf("trainer: state agreement: %w", err)
		}
		var agreed uint64
		root, agreed = decidePhase2(w)
		info.Source = "commit"
		if world.Rank == root {
			if sn = pickCommit(agreed, t.latest, t.prev); sn == nil {
				return info, fmt.Errorf("%w: rank %d lacks the agreed commit number %d", ErrCorruptState, root, agreed)
			}
		}
	} else {
		info.Source = "init"
		if world.Rank == 0 {
			var err error
			load := t.live.busy("checkpoint load") // the others wait in the broadcast
			sn, info.Source, err = t.initialState(ctx)
			load()
			if errors.Is(err, ErrForeignCheckpoint) || errors.Is(err, ErrFinishedCheckpoint) {
				// Every rank refuses with it, not only this one.
				return info, t.broadcastRefusal(ctx, comm, watch, err)
			}
			if err != nil {
				return info, err
			}
		}
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
	if lenBuf[8] == refusedSource || lenBuf[8] == refusedFinished {
		return info, refusal(lenBuf[8], blob)
	}
	got, err := decodeSnapshot(blob, t.params)
	if err != nil {
		return info, err
	}
	if t.latest != nil && p1.held {
		info.RolledBack = t.step - got.step
	}
	if err := t.install(got, world); err != nil {
		return info, err
	}
	t.countRecovery = false // recorded (when owed) in the state just installed
	t.restored = info.Source != "commit"
	// The failure budget, counted per job from the committed state.
	if counted {
		t.tel.recoveries.Add(ctx, 1, t.tel.commonAttrs)
	}
	if within := recoveriesWithin(t.recoveries, t.o.now(), t.cfg.RecoveryWindow); within > t.cfg.MaxRecoveries {
		return info, &BudgetError{Recoveries: within, Last: slices.Clone(t.failures)}
	}
	return info, nil
}

// stateSources are the values of RoundInfo.Source, by their code in the
// state broadcast.
var stateSources = []string{"commit", "init", "checkpoint"}

// initialState returns rank 0's state for a round in which nobody holds
// live state: the newest durable checkpoint that loads, else the current
// parameter values with a fresh optimizer and loader state.
func (t *Trainer[B]) initialState(ctx context.Context) (*snapshot, string, error) {
	if st := t.o.ckpt; st != nil {
		lctx, cancel := t.ckptCall(ctx)
		steps, err := st.List(lctx)
		cancel()
		if err := t.ckptTimedOut(ctx, lctx, err, "listing the checkpoints"); err != nil {
			// Not "no checkpoint": starting over would hide the history.
			return nil, "", err
		}
		if err != nil {
			t.log.Warn("cannot list checkpoints", "err", err)
		}
		for _, s := range steps {
			lctx, cancel := t.ckptCall(ctx)
			data, err := st.Load(lctx, s)
			cancel()
			if err := t.ckptTimedOut(ctx, lctx, err, fmt.Sprintf("loading the checkpoint of step %d", s)); err != nil {
				// Not unreadable: falling back to an older one would
				// roll the job back for a slow store.
				return nil, "", err
			}
			if err == nil {
				var sn *snapshot
				sn, err = decodeSnapshot(data, t.params)
				if err == nil && sn.optName != t.opt.Name() {
					err = fmt.Errorf("%w: optimizer %q in the checkpoint, %q configured", ErrShapeMismatch, sn.optName, t.opt.Name())
				}
				if errors.Is(err, ErrShapeMismatch) {
					return nil, "", t.foreignCheckpoint(s, err)
				}
				if err == nil && int(sn.epoch) > t.cfg.Epochs {
					// A job of Epochs epochs never commits a position past
					// its end: the history is another job's, with more
					// epochs. Restoring it would end this job at once,
					// having trained nothing.
					return nil, "", t.foreignCheckpoint(s, fmt.Errorf("%w: the checkpoint is at epoch %d, past this job's %d epochs (a job with more epochs wrote it)",
						ErrSettingsMismatch, sn.epoch, t.cfg.Epochs))
				}
				if err == nil && int(sn.epoch) == t.cfg.Epochs {
					// The history completes this job's epochs: a finished
					// job, restored under a new job ID (the store forgot
					// the old one, or never knew it). Restoring it would
					// train nothing and report success.
					return nil, "", t.finishedCheckpoint(s, sn.epoch)
				}
				if err == nil {
					// Checksums that hold say nothing of whether the
					// optimizer's state loads: one that does not is as
					// unreadable as a damaged file (installing it would
					// fail every round until the failure budget ran out,
					// never trying an older checkpoint). LoadState leaves
					// the optimizer as it was when it fails; install loads
					// the state again on every rank.
					if lerr := t.opt.LoadState(sn.optState(), t.params); lerr != nil {
						err = fmt.Errorf("optimizer state: %w", lerr)
					}
				}
				if err == nil {
					t.cleanLeftovers(ctx)
					t.log.Info("restoring durable checkpoint", "step", s)
					sn.gen, sn.base = newGen(), sn.step
					return sn, "checkpoint", nil
				}
			}
			t.log.Warn("skipping unreadable checkpoint", "step", s, "err", err)
		}
		t.cleanLeftovers(ctx)
	}
	var state []byte
	if c, ok := t.loader.(interface{ freshState() ([]byte, error) }); ok {
		// A Loader's fresh cursor, so that every rank starts from rank 0's
		// (a rank whose loader was set up differently fails its Reset).
		var err error
		if state, err = c.freshState(); err != nil {
			return nil, "", err
		}
	}
	var user []byte
	if t.o.state != nil {
		user = t.o.state.AppendState(nil)
	}
	sn := &snapshot{}
	sn.take(0, newGen(), 0, t.params, t.opt, state, nil, user)
	return sn, "init", nil
}

// install makes sn the live replicated state and the latest commit; the
// partitions and the loader follow in restoreData.
func (t *Trainer[B]) install(sn *snapshot, world elastic.World) error {
	if err := sn.restoreInto(t.params, t.opt); err != nil {
		return err
	}
	if t.o.state != nil {
		if err := t.o.state.LoadState(sn.user); err != nil {
			return fmt.Errorf("trainer: user state: %w", err)
		}
	}
	t.step, t.gen, t.base = sn.step, sn.gen, sn.base
	t.epoch, t.epochStep = int(sn.epoch), int(sn.epochStep)
	t.stateRound = world.Round
	t.recoveries = slices.Clone(sn.recoveries)
	t.installScaling(sn.autoscale)
	t.detExp = decodeDetExp(sn.detExp)
	// One replaced commit stays as the spare whose buffers the next commit
	// reuses, whatever the previous round did (a round that failed after
	// one commit had none), so every round starts holding the same memory.
	if t.spare == nil || t.spare == sn {
		t.spare = nil
		for _, old := range []*snapshot{t.prev, t.latest} {
			if old != nil && old != sn {
				t.spare = old
				break
			}
		}
	}
	t.latest, t.prev = sn, nil
	t.pendingUseful = 0
	t.uncommitted = false
	return nil
}

// restoreData brings the partitions, then the loader, to the installed
// state (t.latest), on every rank. With partitions and a CheckpointStore,
// rank 0 first tells everyone the newest published checkpoint (which the
// partitions keep) and whether the one last due is missing; it is then
// written (collectively) once the round's state is restored.
func (t *Trainer[B]) restoreData(ctx context.Context, comm sync.Synchronizer, world elastic.World, source string,
	watch *collectiveWatch, ck *checkpointer) error {
	sn := t.latest
	catchUp := false
	t.published = -1
	if len(t.parts) > 0 {
		published := int64(-1)
		if t.o.ckpt != nil {
			buf := make([]byte, 9)
			if world.Rank == 0 {
				binary.LittleEndian.PutUint64(buf, uint64(t.newestCheckpoint(ctx)))
				if t.catchUpDue(ctx) {
					buf[8] = 1
				}
			}
			watch.enter()
			err := comm.Broadcast(ctx, buf, 0)
			watch.leave()
			if err != nil {
				return fmt.Errorf("trainer: checkpoint agreement: %w", err)
			}
			published, catchUp = int64(binary.LittleEndian.Uint64(buf)), buf[8] == 1
		}
		t.published = published
		pr := PartitionRound{Step: t.step, Source: source, Published: published, Comm: comm}
		for _, p := range t.parts {
			pr.World = sync.World{JobID: t.cfg.JobID, Round: world.Round, Rank: world.Rank, Addrs: world.Endpoints(p.Name())}
			pr.Manifests = nil
			if source == "checkpoint" {
				pr.Manifests = sn.manifests(p.Name())
			}
			watch.enter()
			err := p.Restore(ctx, pr)
			watch.leave()
			if err != nil && source == "commit" && published >= 0 && errors.Is(err, ErrPartitionLost) {
				return t.fallBack(p.Name(), published, err)
			}
			if err != nil {
				return fmt.Errorf("trainer: partition %q: restore of step %d: %w", p.Name(), t.step, err)
			}
		}
	}
	state := sn.cursor
	if len(state) == 0 {
		state = nil // a fresh start
	}
	if l, ok := t.loader.(LineageSetter); ok {
		l.SetLineage(t.gen) // the installed state's, the same on every rank
	}
	watch.enter()
	err := t.loader.Restore(ctx, state, world.Rank, world.Size)
	watch.leave()
	if err != nil {
		return fmt.Errorf("trainer: loader: restore: %w", err)
	}
	if p, ok := t.loader.(positioner); ok {
		t.epoch, t.epochStep = p.position()
	}
	if t.userLoader {
		// Nobody reads before every rank's Restore did the work that
		// must precede reads (revoking leases taken after the commit).
		watch.enter()
		err := comm.Barrier(ctx)
		watch.leave()
		if err != nil {
			return fmt.Errorf("trainer: waiting for every rank's loader restore: %w", err)
		}
	}
	if catchUp {
		published, err := t.checkpointParts(ctx, comm, world, watch, ck, false)
		if err != nil {
			return err
		}
		if !published {
			return fmt.Errorf("%w: the catch-up checkpoint of step %d was not published", ErrCheckpoint, t.step)
		}
	}
	return nil
}

// fallBack handles a partition whose state at the agreed commit is on no
// live rank (its host and every replica of some part died at once): when
// a durable checkpoint exists, this rank forgets its live state and the
// round fails, so that the next round finds no rank holding live state
// and restores the newest durable checkpoint, as a whole-job restart does
// (syncState, initialState): the replicated state, every partition and
// the loader roll back to it together, in a new lineage, so exactly-once
// holds. Every rank of the round gets the partition's error from the same
// agreement (the parameter server's plan), so they all fall back; a rank
// that failed otherwise still holds its commit, whose restore fails the
// same way in the next round. published is the newest checkpoint's step,
// the same on every rank.
func (t *Trainer[B]) fallBack(part string, published int64, cause error) error {
	t.log.Warn("partition state lost in every live copy: rolling every rank back to the last durable checkpoint",
		"partition", part, "step", t.step, "checkpoint", published, "cause", cause.Error())
	t.latest, t.prev, t.spare = nil, nil, nil
	// Not ErrPartitionLost, which would end Run: the round fails instead.
	return fmt.Errorf("trainer: partition %q: the state of step %d is lost (%v); falling back to the durable checkpoint of step %d",
		part, t.step, cause, published)
}

// newestCheckpoint returns the step of the newest checkpoint in the store,
// or -1 (none, or the store cannot be listed).
func (t *Trainer[B]) newestCheckpoint(ctx context.Context) int64 {
	lctx, cancel := t.ckptCall(ctx)
	steps, err := t.o.ckpt.List(lctx)
	cancel()
	if err != nil {
		t.log.Warn("cannot list checkpoints", "err", err)
		return -1
	}
	if len(steps) == 0 {
		return -1
	}
	return steps[0]
}

// commit snapshots the live state as the latest commit, keeping the previous
// one (a rank may be one commit ahead of another when a round fails). The
// loader's state comes first (gathered from every rank and merged with a
// StateMerger), then every partition commits, then the trainer takes its
// snapshot; with a CommitListener, every rank passes a barrier and the
// loader is told the commit is held everywhere.
func (t *Trainer[B]) commit(ctx context.Context, comm sync.Synchronizer, watch *collectiveWatch) error {
	state, err := t.loader.State(ctx)
	if err != nil {
		return fmt.Errorf("trainer: loader: state: %w", err)
	}
	if t.merger != nil {
		watch.enter()
		parts, err := gatherBytes(ctx, comm, state)
		watch.leave()
		if err != nil {
			return fmt.Errorf("trainer: gathering the loader states: %w", err)
		}
		if state, err = t.merger.MergeStates(parts); err != nil {
			return fmt.Errorf("trainer: loader: merging the ranks' states: %w", err)
		}
	}
	for _, p := range t.parts {
		watch.enter()
		err := p.Commit(ctx, t.step)
		watch.leave()
		if err != nil {
			return fmt.Errorf("trainer: partition %q: commit of step %d: %w", p.Name(), t.step, err)
		}
	}
	var user []byte
	if t.o.state != nil {
		user = t.o.state.AppendState(nil)
	}
	seq := t.latest.seq + 1
	sn := t.spare
	if sn == nil || sn == t.latest {
		sn = &snapshot{}
	}
	sn.take(t.step, t.gen, t.base, t.params, t.opt, state, t.recoveries, user)
	sn.seq, sn.epoch, sn.epochStep, sn.parts = seq, int64(t.epoch), int64(t.epochStep), nil
	sn.autoscale = t.scalingState(sn.autoscale)
	sn.detExp = sn.detExp[:0]
	if t.det {
		sn.detExp = encodeDetExp(sn.detExp, t.detExp)
	}
	t.spare, t.prev, t.latest = t.prev, t.latest, sn
	t.uncommitted = false
	t.useful += t.pendingUseful
	t.pendingUseful = 0
	if t.o.hooks.OnCommit != nil {
		t.o.hooks.OnCommit(t.step)
	}
	if t.listener != nil {
		watch.enter()
		err := comm.Barrier(ctx)
		watch.leave()
		if err != nil {
			return fmt.Errorf("trainer: waiting for every rank's commit: %w", err)
		}
		if err := t.listener.Committed(ctx); err != nil {
			return fmt.Errorf("trainer: loader: committed: %w", err)
		}
	}
	return nil
}

// checkpointParts writes the durable checkpoint of the latest commit in a
// job with partitions (collective: every rank calls it at the same step
// boundary): every rank makes its part of every partition durable and
// returns its manifests (Partition.Checkpoint), the manifests travel to
// every rank (gatherBytes), rank 0 publishes one checkpoint holding the
// replicated state and all manifests, and tells every rank whether it did.
// So nothing is published before every rank's Checkpoint returned, and a
// crash at any point leaves the previous checkpoint whole.
//
// The write is synchronous (one atomic write of the CheckpointStore)
// unless background is set and every partition's manifests hold its data
// (inlineParts): rank 0 then encodes the checkpoint and hands it to its
// checkpoint goroutine (ck.submit), which publishes it while training goes
// on, and every rank returns at once (published true, t.published
// unchanged: the write may still fail, which that goroutine logs and
// reports to Hooks.OnCheckpoint).
//
// published is false when rank 0's write failed (it was logged and
// reported to Hooks.OnCheckpoint there); err reports a failed Checkpoint
// or collective, which fails the round.
func (t *Trainer[B]) checkpointParts(ctx context.Context, comm sync.Synchronizer, world elastic.World,
	watch *collectiveWatch, ck *checkpointer, background bool) (published bool, err error) {
	step := t.latest.step
	mine := binary.LittleEndian.AppendUint32(nil, uint32(len(t.parts)))
	for _, p := range t.parts {
		watch.enter()
		pctx, cancel := t.ckptCall(ctx)
		m, err := p.Checkpoint(pctx, step)
		cancel()
		watch.leave()
		if terr := t.ckptTimedOut(ctx, pctx, err, fmt.Sprintf("partition %q: checkpoint of step %d", p.Name(), step)); terr != nil {
			return false, terr
		}
		if err != nil {
			return false, fmt.Errorf("trainer: partition %q: checkpoint of step %d: %w", p.Name(), step, err)
		}
		mine = enc.AppendBytes(mine, m)
	}
	watch.enter()
	all, err := gatherBytes(ctx, comm, mine)
	watch.leave()
	if err != nil {
		return false, fmt.Errorf("trainer: gathering the partitions' checkpoint manifests: %w", err)
	}
	const (
		failed, written, submitted = 0, 1, 2
	)
	outcome := []byte{failed}
	var sn snapshot
	if world.Rank == 0 {
		sn = *t.latest // shallow: encoded, never changed
		sn.parts, err = t.decodeManifests(all)
		switch {
		case err != nil:
			t.log.Error("checkpoint not published", "step", step, "err", err)
		case background && t.inlineParts():
			outcome[0] = submitted // encoded and queued below, once the others went on
		case ck.saveNow(ctx, step, sn.encode(nil, t.params)) == nil:
			outcome[0] = written
		}
	}
	watch.enter()
	err = comm.Broadcast(ctx, outcome, 0)
	watch.leave()
	if err != nil {
		return false, fmt.Errorf("trainer: checkpoint of step %d: %w", step, err)
	}
	switch outcome[0] {
	case submitted:
		if world.Rank == 0 {
			ck.submit(step, sn.encode(nil, t.params))
		}
		return true, nil
	case written:
		t.published = step
		return true, nil
	}
	return false, nil
}

// inlineParts reports whether every partition's checkpoint manifests hold
// its data (driver.InlineCheckpointer), so that a checkpoint may be
// written in the background.
func (t *Trainer[B]) inlineParts() bool {
	for _, p := range t.parts {
		if ic, ok := p.(driver.InlineCheckpointer); !ok || !ic.InlineCheckpoint() {
			return false
		}
	}
	return true
}

// decodeManifests turns every rank's gathered manifests (a count, then one
// length-prefixed manifest per partition) into the snapshot's form.
func (t *Trainer[B]) decodeManifests(all [][]byte) ([]partManifests, error) {
	out := make([]partManifests, len(t.parts))
	for i, p := range t.parts {
		out[i] = partManifests{name: p.Name(), manifests: make([][]byte, len(all))}
	}
	for r, b := range all {
		rd := enc.Reader{B: b}
		if n := int(rd.U32()); rd.Err == nil && n != len(t.parts) {
			return nil, fmt.Errorf("%w: rank %d sent %d partition manifests, want %d", ErrCorruptState, r, n, len(t.parts))
		}
		for i := range t.parts {
			out[i].manifests[r] = rd.Bytes()
		}
		if err := rd.Done(); err != nil {
			return nil, fmt.Errorf("%w: rank %d's partition manifests: %v", ErrCorruptState, r, err)
		}
	}
	return out, nil
}

// manifests returns the manifests of the partition name in a checkpoint,
// or nil when it holds none (it was written without that partition).
func (s *snapshot) manifests(name string) [][]byte {
	for _, p := range s.parts {
		if p.name == name {
			return p.manifests
		}
	}
	return nil
}

// coresShare is this member's share of its host's cores (Config.ShareCores)
// among the members of world on its host (same elastic.Member.Host): cores
// divided by their number, at least 1.
func coresShare(cores int, world elastic.World) int {
	self := world.Members[world.Rank].Host
	n := 0
	for _, m := range world.Members {
		if m.Host == self {
			n++
		}
	}
	return max(1, cores/max(1, n))
}
