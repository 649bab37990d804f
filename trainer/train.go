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
	ls := &t.lstep
	if len(ls.Samples) != W {
		ls.Samples, ls.ComputeSeconds, ls.EpochDone = make([]int, W), make([]float64, W), make([]bool, W)
	}
	pos, tracked := t.loader.(positioner)
	var agreement *AuditEntry
	if t.o.audit != nil && rank == 0 {
		agreement = &AuditEntry{Gen: t.gen, Base: t.base, Round: world.Round, Rank: rank, Step: t.step, Restored: t.restored}
	}
	roundAttrs := []attribute.KeyValue{AttrRound.Int64(int64(world.Round)), AttrRank.Int(rank), AttrWorldSize.Int(W)}
	for {
		b, err := t.loader.Next(ctx)
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
		if b.EpochDone {
			mine[ctlEpochDone] = 1
		}
		syncStart := time.Now()
		actx, aspan := sctx, trace.Span(nil)
		if span != nil {
			actx, aspan = t.tel.tracer.Start(sctx, SpanAllReduce)
		}
		var n float64 // samples in the global batch
		watch.enter()
		err = comm.AllReduceFloat64(actx, ctl, sync.OpMax)
		if err == nil && ctl[ctlStepErr] == 0 {
			for r := range W {
				n += ctl[ctlFixed+ctlPerRank*r+ctlSamples]
			}
			if n > 0 { // a global batch without samples is no step: nothing to reduce
				err = t.reduceGrads(actx, comm, ctl[ctlGradMax], b.GlobalSize)
				if err == nil && t.afterReduce != nil {
					err = t.afterReduce(rank, t.step+1)
				}
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
		var lossSum float64
		stop := false
		for r := range W {
			v := ctl[ctlFixed+ctlPerRank*r:]
			lossSum += v[ctlLoss] // in rank order, so every rank gets the same bits
			stop = stop || v[ctlStop] > 0
			t.computes[r] = v[ctlCompute]
			ls.Samples[r], ls.ComputeSeconds[r], ls.EpochDone[r] = int(v[ctlSamples]), v[ctlCompute], v[ctlEpochDone] > 0
		}
		empty := n == 0
		var stepDur time.Duration
		if !empty {
			if t.cfg.Deterministic {
				lossSum /= lossScale
			} else {
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
			t.lastLoss = lossSum / n
			if !tracked {
				t.epoch, t.epochStep = b.Epoch, b.Step+1
			}
			stepDur = time.Since(stepStart)
			t.pendingUseful += stepDur
		}
		ls.Step = t.step
		commitAsked, err := t.loader.Stepped(ctx, *ls)
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
		if !empty {
			evict = t.stragglers(ctx, world, t.computes[:W])
		}
		leaving := stop || evict >= 0 || ctl[ctlChange] > 0
		ckptDue := !empty && !stop && t.cfg.CheckpointEvery > 0 && t.step%int64(t.cfg.CheckpointEvery) == 0
		if leaving || commitAsked || ckptDue || (!empty && t.step%int64(t.cfg.CommitEvery) == 0) {
			var cspan trace.Span
			if span != nil || leaving {
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
		if ckptDue {
			if len(t.parts) == 0 {
				if rank == 0 {
					ck.submit(t.step, t.latest.encode(nil, t.params))
				}
			} else if t.o.ckpt != nil {
				published, err := t.checkpointParts(ctx, comm, world, watch, ck)
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
		}
		switch {
		case stop:
			return t.leavePreempted(ctx, runCtx, comm, world, ctl, watch, ck)
		case evict == rank:
			return endEvicted, nil
		case leaving:
			return endRejoin, nil
		}
	}
}

// leavePreempted ends the round after a step at which some rank was
// preempted (every rank committed): the lowest preempted rank writes a
// durable checkpoint (with partitions: every rank takes part, rank 0
// publishes), the preempted ranks leave, the others rejoin.
func (t *Trainer[B]) leavePreempted(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	ctl []float64, watch *collectiveWatch, ck *checkpointer) (roundEnd, error) {
	first := -1
	for r := range world.Size {
		if ctl[ctlFixed+ctlPerRank*r+ctlStop] > 0 {
			first = r
			break
		}
	}
	var saveErr error
	if len(t.parts) == 0 {
		if first == world.Rank && t.preempted() {
			saveErr = ck.saveNow(ctx, t.step, t.latest.encode(nil, t.params))
		}
	} else if t.o.ckpt != nil {
		published, err := t.checkpointParts(ctx, comm, world, watch, ck)
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
// checkpoint by rank 0 (with partitions: by every rank, published by rank
// 0); round then says goodbye. A failed collective fails the round (the
// next one finds the end at once and tries again); a failed publication
// is rank 0's ErrCheckpoint.
func (t *Trainer[B]) finish(ctx, runCtx context.Context, comm sync.Synchronizer, world elastic.World,
	watch *collectiveWatch, ck *checkpointer) (roundEnd, error) {
	if err := t.commit(ctx, comm, watch); err != nil {
		return t.classify(runCtx, ctx, err)
	}
	if len(t.parts) == 0 {
		if world.Rank == 0 {
			return endFinished, ck.saveNow(ctx, t.step, t.latest.encode(nil, t.params))
		}
		return endFinished, nil
	}
	if t.o.ckpt == nil || t.published == t.step {
		return endFinished, nil // no store, or the last step's checkpoint is published
	}
	published, err := t.checkpointParts(ctx, comm, world, watch, ck)
	if err != nil {
		return t.classify(runCtx, ctx, err)
	}
	if !published && world.Rank == 0 {
		return endFinished, fmt.Errorf("%w: the final checkpoint of step %d was not published", ErrCheckpoint, t.step)
	}
	return endFinished, nil
}
