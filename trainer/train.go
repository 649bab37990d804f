package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/autoscale"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

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
	ctlLoss      = iota // loss sum (fixed point in deterministic mode)
	ctlSamples          // samples in this rank's share
	ctlCompute          // StepFunc seconds
	ctlStop             // preempted
	ctlEpochDone        // the loader found no sample of the epoch left (Batch.EpochDone)
	ctlWork             // the share's cost: Batch.Cost, or its samples (balancing)
	// Resource adjustment (Config.Autoscale; 0 when off, see autoscale.go):
	ctlInterval    // seconds since this rank began its previous step
	ctlSyncPrev    // seconds in the gradient allreduce of its previous step in this round
	ctlGradSq      // squared norm of its mean gradient, of its previous step
	ctlNormSamples // its samples in that step
	ctlBigSq       // squared norm of the mean gradient over that step's global batch
	ctlCapacity    // the workers its Platform allows (0: no bound stated)
	ctlKeep        // it holds state no other rank holds
	ctlGradMaxR    // its largest |gradient| (deterministic mode; the one-collective step's, see reduceFixed)
	ctlMicroFirst  // the global index of its first micro-batch (deterministic mode's ordered sum, see reduceOrdered)
	ctlMicros      // its micro-batches, or -1 when they are not one contiguous run (the same)
	ctlPerRank
)

// lossScale is the fixed-point scale of loss sums in deterministic mode.
const lossScale = 1 << 24

// train runs steps until the round ends: the I/O around the core's
// decisions (putControl, readControl, decideBoundary, stragglers).
func (t *Trainer[B]) train(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	recovered bool, failedAt time.Time, watch *collectiveWatch, ck *checkpointer, pending func() bool) (roundEnd, error) {
	W, rank := world.Size, world.Rank
	ctl := make([]float64, controlLen(W))
	o := &t.outcome
	pos, tracked := t.loader.(positioner)
	var agreement *AuditEntry
	if t.o.audit != nil { // every rank: see the record below
		agreement = &AuditEntry{Gen: t.gen, Base: t.base, Round: world.Round, Rank: rank, Step: t.step, Restored: t.restored}
	}
	roundAttrs := []attribute.KeyValue{AttrRound.Int64(int64(world.Round)), AttrRank.Int(rank), AttrWorldSize.Int(W)}
	if err := t.startBalance(); err != nil {
		return t.classify(runCtx, ctx, err)
	}
	t.startScaling(ctx)
	// In the default mode the control values travel with the gradients, in
	// one sum-allreduce (packControl), instead of in a max-allreduce of
	// their own before it: every rank then reduces its gradients even at a
	// step some rank failed or that has no sample anywhere, and nobody
	// applies those. A GradientReducer sums the gradients its own way: it
	// keeps the control allreduce (outside deterministic mode, which does
	// not use it).
	_, reducer := comm.(GradientReducer)
	// A LocalStepper's ranks step on their own gradients and commit only
	// where their parameters agree (see LocalStepper).
	local, _ := comm.(LocalStepper)
	unsynced := false // the state installed at the round's start is a commit
	merged := !t.det && !reducer && local == nil
	// Deterministic mode's step takes one collective too (reduceFixed):
	// the fixed-point sums, then the control values, in one float64
	// SUM-allreduce. A LocalStepper's ranks sum their own gradients only,
	// after the control allreduce.
	fixedOne := t.det && local == nil
	// Where the round's Synchronizer can sum in order, deterministic mode
	// does so instead (reduceOrdered): float32 sums in the global batch's
	// order, and the control values, in one collective.
	var ordered sync.OrderedReducer
	if fixedOne {
		ordered, _ = comm.(sync.OrderedReducer)
	}
	t.ordered = ordered != nil
	fixedOne = fixedOne && !t.ordered
	tensors, _ := ordered.(orderedTensors)
	t.startOrdered(t.ordered, tensors, W)
	if merged && t.gradsW != W {
		t.ctlPacked = make([]float32, ctlLanes*len(ctl))
		t.grads = sync.NewBuckets(append(slices.Clip(t.gradList), t.ctlPacked), t.cfg.BucketBytes)
		t.gradsW = W
	}
	clk := &t.clock
	for {
		clk.begin(time.Now())
		fetched := t.live.busy("data fetch")
		b, err := t.loader.Next(ctx)
		fetched()
		if err != nil {
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: data: %w", err))
		}
		if b.Epoch >= t.cfg.Epochs {
			if !tracked {
				t.epoch, t.epochStep = b.Epoch, 0
			}
			return t.finish(ctx, runCtx, comm, world, watch, ck)
		}
		stepStart := time.Now()
		interval := t.scalingBefore(stepStart)
		var span trace.Span
		sctx := ctx
		if t.cfg.StepSpanEvery > 0 && (t.step+1)%int64(t.cfg.StepSpanEvery) == 0 {
			sctx, span = t.tel.tracer.Start(ctx, SpanStep, trace.WithAttributes(append(roundAttrs,
				AttrStep.Int64(t.step+1), AttrEpoch.Int(b.Epoch))...))
		}
		if a := t.o.audit; a != nil && len(b.Indices) > 0 {
			if err := a.RecordStep(AuditEntry{Gen: t.gen, Round: world.Round, Rank: rank, Step: t.step + 1, Epoch: b.Epoch, Indices: b.Indices}); err != nil {
				return endFatal, err
			}
		}
		redone := t.detRedone
		if fixedOne {
			if len(t.detBuf) != t.nvalues+len(ctl) {
				t.detBuf = make([]float64, t.nvalues+len(ctl))
			}
			t.detS, _ = detScaleExp(t.detExp, b.GlobalSize)
			t.detFuse = b.Micro != nil
		}
		clk.lap(&clk.cur.Loader)
		loss, gmax, stepErr := t.compute(sctx, b)
		t.microCount = len(b.Micro)
		clk.lap(&clk.cur.Compute)
		compute := time.Since(stepStart)
		if t.computeTime != nil {
			compute = t.computeTime(b, compute)
		}
		if stepErr != nil && (ctx.Err() != nil || roundBroken(stepErr)) {
			// The StepFunc's own communication failed (a partition's pull
			// or push: a peer lost, a timeout, the round aborted): the
			// round is broken, as by a failed collective, not the step
			// function. The others' control allreduce fails once this
			// rank closes its end.
			if span != nil {
				endSpan(span, stepErr)
			}
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: step %d: %w", t.step+1, stepErr))
		}

		if stepErr == nil {
			t.noteLocalGradients(len(b.Indices))
		}
		c := control{change: pending(), stepErr: stepErr != nil, gradMax: gmax, loss: loss,
			samples: len(b.Indices), compute: compute.Seconds(), work: shareWork(b), stop: t.preempted(), epochDone: b.EpochDone,
			scaling: t.scalingControl(interval)}
		if t.ordered {
			c.microFirst, c.micros = orderedRun(b.Micro)
		}
		putControl(ctl, rank, c)
		syncStart := clk.lap(&clk.cur.Other)
		actx, aspan := sctx, trace.Span(nil)
		if span != nil {
			actx, aspan = t.tel.tracer.Start(sctx, SpanAllReduce)
		}
		watch.enter()
		exchanged := false // every rank's control values arrived: every rank took part in this step
		if merged {
			// One collective: the gradients, then the control values.
			packControl(t.ctlPacked, ctl)
			err = t.grads.AllReduce(actx, comm, sync.OpSum)
			if err == nil {
				exchanged = true
				unpackControl(ctl, t.ctlPacked)
				readControl(ctl, W, false, o)
				if !o.stepFailed && o.samples > 0 && t.afterReduce != nil {
					err = t.afterReduce(rank, t.step+1)
				}
			}
		} else if t.ordered {
			exchanged, err = t.reduceOrdered(actx, ordered, ctl, b.GlobalSize, W, o)
			if err == nil && !o.stepFailed && o.samples > 0 && t.afterReduce != nil {
				err = t.afterReduce(rank, t.step+1)
			}
		} else if fixedOne {
			exchanged, err = t.reduceFixed(actx, comm, ctl, gmax, b.GlobalSize, W, o)
			if err == nil && !o.stepFailed && o.samples > 0 && t.afterReduce != nil {
				err = t.afterReduce(rank, t.step+1)
			}
		} else {
			err = comm.AllReduceFloat64(actx, ctl, sync.OpMax)
			if err == nil {
				exchanged = true
				readControl(ctl, W, t.det, o)
				switch {
				case o.diverged:
					// Every rank saw the same largest gradient: all stop here, together.
					err = fmt.Errorf("%w: non-finite gradient (max |g| = %v), which fixed point cannot sum", ErrDiverged, o.gradMax)
				case !o.stepFailed && o.samples > 0: // a global batch without samples is no step: nothing to reduce
					if local != nil {
						err = t.localGrads(actx, o.gradMax, b.GlobalSize, W)
					} else {
						err = t.reduceGrads(actx, comm, o.gradMax, b.GlobalSize)
					}
					if err == nil && t.afterReduce != nil {
						err = t.afterReduce(rank, t.step+1)
					}
				}
			}
		}
		watch.leave()
		if aspan != nil {
			endSpan(aspan, err)
		}
		if exchanged && agreement != nil {
			// Every rank has installed the round's state (it took part in
			// this step's control exchange), so the agreement is final:
			// record it once, also when the step goes no further. Every
			// rank records it, before it applies the step: a step that
			// any rank applied in this round then has the agreement in the
			// log even when rank 0 died right after the exchange.
			if err := t.o.audit.RecordAgreed(*agreement); err != nil {
				return endFatal, err
			}
			agreement = nil
		}
		if err != nil {
			if span != nil {
				endSpan(span, err)
			}
			if errors.Is(err, ErrDiverged) || errors.Is(err, ErrInvalidConfig) {
				return endFatal, t.withAuditEnded(world, fmt.Errorf("trainer: step %d: %w", t.step+1, err))
			}
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: step %d: %w", t.step+1, err))
		}
		if o.stepFailed {
			if span != nil {
				endSpan(span, stepErr)
			}
			if err := t.auditEnded(world); err != nil {
				return endFatal, err
			}
			t.shareStepFailure(ctx, comm, world, watch, stepErr)
			if stepErr != nil {
				return endFatal, fmt.Errorf("%w: step %d: %w", ErrStepFailed, t.step+1, stepErr)
			}
			return endRejoin, nil // another rank's step failed; it leaves, we go on without it
		}
		syncDur := clk.lap(&clk.cur.Reduce).Sub(syncStart)
		empty := o.samples == 0
		var stepDur time.Duration
		if !empty {
			t.noteGlobalGradients(o.samples, syncDur)
			// The sum over the global batch becomes its mean: in the
			// optimizer's own pass when it can scale (the same bits).
			scaler, fused := t.opt.(optim.ScaledStepper)
			inv := float32(1)
			switch {
			case !t.det:
				inv = float32(1 / o.samples)
				if local != nil {
					inv = float32(float64(W) / o.samples) // this share's sum times W/N (see LocalStepper)
				}
			case t.ordered:
				inv = t.ordInv // the ordered sum over the global batch, divided by its size
			}
			if inv != 1 && !fused {
				for _, p := range t.params {
					for i := range p.Grad {
						p.Grad[i] *= inv
					}
				}
			}
			if !t.det && (math.IsNaN(o.lossSum) || math.IsInf(o.lossSum, 0)) {
				// Every rank sees the same sum: all stop here.
				return endFatal, t.withAuditEnded(world, fmt.Errorf("%w: step %d: the loss over the global batch is %v", ErrDiverged, t.step+1, o.lossSum))
			}
			if t.o.sched != nil {
				t.opt.SetLearningRate(t.o.sched.LR(t.step))
			}
			t.stepLR = t.opt.LearningRate()
			var err error
			if fused && inv != 1 {
				err = scaler.StepScaled(t.params, inv)
			} else {
				err = t.opt.Step(t.params)
			}
			if err != nil {
				return endFatal, err
			}
			clk.lap(&clk.cur.Optimizer)
			t.step++
			t.trained++
			if local != nil {
				watch.enter()
				synced, err := local.OuterStep(sctx, t.step, false)
				watch.leave()
				if err != nil {
					if span != nil {
						endSpan(span, err)
					}
					return t.classify(runCtx, ctx, fmt.Errorf("trainer: step %d: outer step: %w", t.step, err))
				}
				unsynced = !synced
				clk.lap(&clk.cur.Reduce)
			}
			t.lastLoss = o.lossSum / o.samples
			if !tracked {
				t.epoch, t.epochStep = b.Epoch, b.Step+1
			}
			stepDur = time.Since(stepStart)
			t.pendingUseful += stepDur
		}
		ls := LoaderStep{Step: t.step, Samples: o.perSamples, ComputeSeconds: o.perCompute, EpochDone: o.epochDone}
		t.uncommitted = true
		clk.lap(&clk.cur.Other)
		commitAsked, err := t.loader.Stepped(ctx, ls)
		clk.lap(&clk.cur.Loader)
		if err != nil {
			if span != nil {
				endSpan(span, err)
			}
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: loader: stepped: %w", err))
		}
		if tracked {
			t.epoch, t.epochStep = pos.position()
		}
		evict := -1
		var decision *autoscale.Decision
		var figures autoscale.Figures
		if !empty {
			decision, figures = t.observeScaling(ctx, world, o)
			evict = t.observeStragglers(ctx, world, o)
			if local == nil { // a LocalStepper's shares stay even (see LocalStepper)
				if err := t.rebalance(ctx, world, o); err != nil {
					if span != nil {
						endSpan(span, err)
					}
					return t.classify(runCtx, ctx, err)
				}
			}
		}
		if !empty {
			// OnStep runs before this step's commit and checkpoint, so what
			// it changes (WithState's state, the learning rate) is part of
			// them: a round that restores this step restores it too.
			si := StepInfo{Round: world.Round, Rank: rank, WorldSize: W, Step: t.step, Epoch: b.Epoch, EpochStep: b.Step,
				Loss: t.lastLoss, LearningRate: t.stepLR, Samples: int(o.samples), ComputeSeconds: compute.Seconds(), SyncSeconds: syncDur.Seconds(), StepSeconds: stepDur.Seconds(),
				Scaling: decision, Goodput: figures.Goodput, Throughput: figures.Throughput, Efficiency: figures.Efficiency, RecommendedWorldSize: figures.Recommended,
				Resummed: t.detRedone != redone}
			if recovered {
				rec := t.o.now().Sub(failedAt).Seconds()
				si.RecoverySeconds = rec
				t.tel.recoveryDur.Record(ctx, rec, t.tel.commonAttrs)
				_, rs := t.tel.tracer.Start(ctx, SpanRecovery, trace.WithTimestamp(failedAt), trace.WithAttributes(roundAttrs...))
				rs.End()
				recovered = false
			}
			if t.o.hooks.OnStep != nil {
				// Copies the hook may keep; without a hook the step
				// allocates nothing for them.
				si.Shares, si.Speeds = slices.Clone(o.perSamples), t.bal.Speeds()
				t.o.hooks.OnStep(si)
			}
		}
		bd := decideBoundary(o, boundaryIn{step: t.step, commitEvery: t.cfg.CommitEvery, checkpointEvery: t.cfg.CheckpointEvery,
			commitAsked: commitAsked, evict: evict, rank: rank, preempted: t.preempted(), unsynced: unsynced})
		clk.lap(&clk.cur.Other)
		if bd.commit {
			var cspan trace.Span
			if span != nil || bd.end != endNone {
				_, cspan = t.tel.tracer.Start(sctx, SpanCommit, trace.WithAttributes(AttrStep.Int64(t.step)))
			}
			err := t.commit(ctx, comm, watch)
			if cspan != nil {
				endSpan(cspan, err)
			}
			if err != nil {
				if span != nil {
					endSpan(span, err)
				}
				return t.classify(runCtx, ctx, err)
			}
		}
		if bd.checkpoint {
			blockedFrom := time.Now()
			if len(t.parts) == 0 {
				if rank == 0 && t.o.ckpt != nil {
					ck.submit(t.step, t.latest.encode(nil, t.params))
					t.checkpointBlocked(ctx, time.Since(blockedFrom))
				}
			} else if t.o.ckpt != nil {
				published, err := t.checkpointParts(ctx, comm, world, watch, ck, true)
				t.checkpointBlocked(ctx, time.Since(blockedFrom))
				if err == nil && !published {
					// A partition takes its next Checkpoint call to mean this
					// one was published; a new round tells it the truth
					// (PartitionRound.Published).
					err = fmt.Errorf("%w: step %d was not published", ErrCheckpoint, t.step)
				}
				if err != nil {
					if span != nil {
						endSpan(span, err)
					}
					return t.classify(runCtx, ctx, err)
				}
			}
		}
		clk.lap(&clk.cur.Commit)
		if empty {
			if span != nil {
				span.End()
			}
		} else {
			t.tel.stepDur.Record(ctx, stepDur.Seconds(), t.tel.commonAttrs)
			if t.step%goodputEvery == 0 {
				t.tel.goodput.Record(ctx, t.goodput(t.runStart), t.tel.commonAttrs)
			}
			if rank == 0 {
				t.tel.samples.Add(ctx, int64(o.samples), t.tel.commonAttrs)
			}
			if span != nil {
				span.End()
			}
			clk.end(&t.stepTimes)
		}
		switch bd.end {
		case endPreempted, endRejoin:
			if o.stop {
				// The preempted ranks leave by agreement: their peers log
				// their departure as such (INFO), not as a loss.
				var leavers []string
				for r, stop := range o.perStop {
					if stop && r != world.Rank && r < len(world.Members) {
						leavers = append(leavers, world.Members[r].ID)
					}
				}
				watch.agent.ExpectLeave(leavers...)
				return t.leavePreempted(ctx, runCtx, comm, world, o.firstStop, watch, ck)
			}
			return endRejoin, nil
		case endEvicted:
			return endEvicted, nil
		}
	}
}

// auditEnded records, on every rank with an Audit, that round world.Round
// applies no step after t.step: every rank decided from the same agreed
// values not to apply the step it recorded (ErrDiverged, a failed
// StepFunc), and the round ends there. No later agreement drops that step
// when the run ends with this round (a diverged job), so without this the
// audit would count the samples of a step the model never took.
func (t *Trainer[B]) auditEnded(world elastic.World) error {
	if t.o.audit == nil {
		return nil
	}
	return t.o.audit.RecordAgreed(AuditEntry{Gen: t.gen, Base: t.base, Round: world.Round, Rank: world.Rank, Step: t.step, Ended: true})
}

// withAuditEnded is err, the reason every rank ends the round without
// applying its step, after auditEnded (joined with its error, if any).
func (t *Trainer[B]) withAuditEnded(world elastic.World, err error) error {
	if aerr := t.auditEnded(world); aerr != nil {
		return errors.Join(err, aerr)
	}
	return err
}

// leavePreempted ends the round after a step at which some rank was
// preempted (every rank committed): the lowest preempted rank writes a
// durable checkpoint (with partitions: every rank takes part, rank 0
// publishes), the preempted ranks leave, the others rejoin.
func (t *Trainer[B]) leavePreempted(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	first int, watch *collectiveWatch, ck *checkpointer) (roundEnd, error) {
	var saveErr error
	if len(t.parts) == 0 {
		if first == world.Rank && t.preempted() {
			// Written once this rank said goodbye and left (Run): its
			// peers would otherwise wait in the round-end barrier and
			// for its leave while it writes.
			// The latest commit's step: t.step itself unless a
			// LocalStepper's ranks stopped between outer steps.
			step, data := t.latest.step, t.latest.encode(nil, t.params)
			t.preemptSave = func(ctx context.Context) error { return ck.saveNow(ctx, step, data) }
		}
	} else if t.o.ckpt != nil {
		published, err := t.checkpointParts(ctx, comm, world, watch, ck, false)
		switch {
		case err != nil && !t.preempted():
			return t.classify(runCtx, ctx, err)
		case err != nil:
			saveErr = fmt.Errorf("%w: step %d: %w", ErrCheckpoint, t.step, err)
		case !published:
			saveErr = fmt.Errorf("%w: step %d was not published", ErrCheckpoint, t.step)
		}
	}
	if !t.preempted() {
		return endRejoin, nil
	}
	if first != world.Rank {
		saveErr = nil // the lowest preempted rank reports the checkpoint
	}
	return endPreempted, saveErr
}

// straggler reports rank r, found slow by the core's stragglers tracker
// at this step with compute time (per unit of work, when balancing) ratio
// times the median: log, metric, Hooks.OnStraggler. absorbed: balancing
// evens its slowness out; pending: balancing may still (see
// StragglerInfo).
func (t *Trainer[B]) straggler(ctx context.Context, world elastic.World, r int, ratio float64, absorbed, pending bool) {
	info := StragglerInfo{Round: world.Round, Rank: r, Step: t.step, Ratio: ratio, Evict: t.cfg.EvictStragglers && !absorbed && !pending,
		Balanced: t.cfg.Balance, Absorbed: absorbed, Pending: pending}
	t.log.Warn("straggler", "rank", r, "ratio", math.Round(ratio*100)/100, "steps", t.cfg.StragglerSteps,
		"balanced", t.cfg.Balance, "absorbed", absorbed, "pending", pending, "evict", info.Evict)
	t.tel.stragglers.Add(ctx, 1, t.tel.commonAttrs)
	if t.o.hooks.OnStraggler != nil {
		t.o.hooks.OnStraggler(info)
	}
}

// finish ends the job at the end of the last epoch: a commit (unless the
// last step boundary took one) and a final checkpoint by rank 0 (with partitions: by every rank, published by rank
// 0); round then says goodbye. A failed collective fails the round (the
// next one finds the end at once and tries again); a failed write or
// publication is ErrCheckpoint on every rank (rank 0 tells the others).
func (t *Trainer[B]) finish(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	watch *collectiveWatch, ck *checkpointer) (roundEnd, error) {
	// The batch that ended the job was never Stepped: when the last step
	// boundary committed (every step with CommitEvery 1, an epoch end of a
	// leased loader), that commit is the final one, and the loader is not
	// asked for its state with a batch outstanding.
	if t.uncommitted {
		if local, ok := comm.(LocalStepper); ok {
			// The local steps since the last outer step become part of
			// the final model in one last outer step.
			watch.enter()
			synced, err := local.OuterStep(ctx, t.step, true)
			watch.leave()
			if err != nil {
				return t.classify(runCtx, ctx, fmt.Errorf("trainer: the final outer step: %w", err))
			}
			if !synced {
				return endFatal, fmt.Errorf("%w: %T: the final OuterStep left the ranks' parameters apart", ErrInvalidConfig, comm)
			}
		}
		if err := t.commit(ctx, comm, watch); err != nil {
			return t.classify(runCtx, ctx, err)
		}
	}
	if len(t.parts) == 0 {
		var saveErr error
		if world.Rank == 0 {
			saveErr = ck.saveNow(ctx, t.step, t.latest.encode(nil, t.params))
		}
		if world.Size == 1 {
			return endFinished, saveErr
		}
		// Every rank returns the outcome of the final checkpoint: rank 0
		// tells the others with one small max-allreduce.
		failed := []float64{0}
		if saveErr != nil {
			failed[0] = 1
		}
		watch.enter()
		err := comm.AllReduceFloat64(ctx, failed, sync.OpMax)
		watch.leave()
		switch {
		case err != nil:
			return t.classify(runCtx, ctx, fmt.Errorf("trainer: the final checkpoint's outcome: %w", err))
		case saveErr != nil:
			return endFinished, saveErr
		case failed[0] != 0:
			return endFinished, fmt.Errorf("%w: rank 0 could not write the final checkpoint of step %d", ErrCheckpoint, t.step)
		}
		return endFinished, nil
	}
	if t.o.ckpt == nil || t.published == t.step {
		return endFinished, nil // no store, or the last step's checkpoint is published
	}
	published, err := t.checkpointParts(ctx, comm, world, watch, ck, false)
	if err != nil {
		return t.classify(runCtx, ctx, err)
	}
	if !published { // every rank learned it from checkpointParts
		return endFinished, fmt.Errorf("%w: the final checkpoint of step %d was not published", ErrCheckpoint, t.step)
	}
	return endFinished, nil
}

// roundBroken reports whether err, from a StepFunc, is a failure of the
// round's communication (package sync's errors that break a round), which
// ends the round as a failure rather than ending Run with ErrStepFailed.
func roundBroken(err error) bool {
	var pe *sync.PeerError
	return errors.As(err, &pe) || errors.Is(err, sync.ErrPeerLost) || errors.Is(err, sync.ErrTimeout) ||
		errors.Is(err, sync.ErrAborted) || errors.Is(err, sync.ErrClosed) || errors.Is(err, sync.ErrBadFrame)
}
