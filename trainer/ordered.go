package trainer

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/internal/fixk"
)

// Deterministic mode's ordered sum: when the round's Synchronizer
// implements sync.OrderedReducer (a *sync.Ring, sync.NewLocal, the ranks
// of package synctest), a step's gradients are summed in float32, one
// micro-batch after the other in the global batch's order, in one
// AllReduceOrderedFloat32: each micro-batch's gradients are one part, in
// order. The dataloader hands each rank a contiguous run of micro-batches,
// the runs in rank order (dataloader.MicroShareOf, and its weighted shares
// when balancing), so the global sequence of parts is the global batch's
// micro-batches, m_0 ... m_{K-1}, whatever the world size and the shares,
// and the sum (((0 + m_0) + m_1) + ... + m_{K-1}) is the same bits in
// every run of the job. The rank's control values travel in the same
// collective, packed into float32 lanes after its last part's gradients
// (packControl; zeros after its other parts): each lane sums one rank's
// integer below 2^16 with zeros, or flags, exactly. The loss sums are
// fixed point per micro-batch, as in the fixed-point path, so their sum
// does not depend on the shares either. Each rank's run of micro-batches
// travels as a control value too: every rank checks that the runs are
// contiguous in rank order, and all refuse the step together when they
// are not (a loader of its own that cuts the batch otherwise).
//
// Where the Synchronizer lacks the capability (a user's Backend), the
// fixed-point path (reduceFixed) stays. Where it also takes the last part
// as tensors (orderedTensors: *sync.Ring, sync.NewLocal), the last
// micro-batch's gradients stay in the Grad buffers, the control values
// after them in t.ordCtl, and the sum comes back into them: no copy of the
// gradients into one buffer and of the sum back.

// orderedTensors is the Synchronizer's AllReduceOrderedTensors
// (sync.Ring's): the ordered sum with the last part given as tensors, the
// result written into them.
type orderedTensors interface {
	AllReduceOrderedTensors(ctx context.Context, parts [][]float32, last [][]float32) error
}

// orderedLen is the length of one part of the ordered sum in a world of W
// ranks: the gradients, then the control lanes.
func (t *Trainer[B]) orderedLen(W int) int { return t.nvalues + ctlLanes*controlLen(W) }

// startOrdered sizes the ordered sum's buffers for a round of W ranks
// (ordered: the round's Synchronizer has the capability), and the
// micro-batch buffers to its parts' length, or to the gradients' length
// for the fixed-point path.
func (t *Trainer[B]) startOrdered(ordered bool, tensors orderedTensors, W int) {
	n := t.nvalues
	t.ordTensors = nil
	if ordered {
		n = t.orderedLen(W)
		if tensors != nil {
			t.ordTensors = tensors
			if ctl := n - t.nvalues; len(t.ordCtl) != ctl {
				t.ordCtl = make([]float32, ctl)
				t.ordLastList = append(slices.Clip(t.gradList), t.ordCtl)
			}
		} else if len(t.ordLast) != n {
			t.ordLast, t.ordOut = make([]float32, n), make([]float32, n)
		}
	}
	if t.microLen != n {
		// The micro-batch buffers (and microFn's views of them) take the
		// new length; their lanes after the gradients stay 0.
		t.micro, t.microViews, t.microLen = nil, nil, n
	}
}

// computeOrdered is compute in deterministic mode with the ordered sum:
// micro-batch k's gradients go to t.micro[k], the last one's stay in the
// Grad buffers and, unless the Synchronizer takes them there
// (t.ordTensors), go to t.ordLast, each flat, as the ordered allreduce
// takes them. It returns the loss sum, fixed point per micro-batch.
func (t *Trainer[B]) computeOrdered(ctx context.Context, b dataloader.Batch[B]) (loss float64, err error) {
	K := len(b.Micro)
	if t.microFn != nil && K > 0 {
		if loss, err = t.callMicro(ctx, b); err != nil {
			return 0, err
		}
		if t.ordTensors == nil {
			t.flatten(t.ordLast)
		}
		return loss, nil
	}
	t.growMicro(K)
	for k := range b.Micro {
		l, err := t.stepFn(ctx, b.MicroBatch(k))
		if err != nil {
			return 0, err
		}
		loss += math.Round(l * lossScale)
		if k < K-1 {
			t.flatten(t.micro[k])
		} else if t.ordTensors == nil {
			t.flatten(t.ordLast)
		}
	}
	return loss, nil
}

// growMicro makes t.micro hold buffers for K-1 micro-batches' gradients
// (the last one's stay in the Grad buffers).
func (t *Trainer[B]) growMicro(K int) {
	for len(t.micro) < K-1 {
		t.micro = append(t.micro, make([]float32, t.microLen))
	}
}

// callMicro runs the MicroStepFunc on b's K > 0 micro-batches: the first
// K-1 micro-batches' gradients go to t.micro (through t.microViews), the
// last one's to the Grad buffers. It returns the loss sum, fixed point per
// micro-batch (so the sum is exact in any order).
func (t *Trainer[B]) callMicro(ctx context.Context, b dataloader.Batch[B]) (loss float64, err error) {
	K := len(b.Micro)
	t.growMicro(K)
	for len(t.microViews) < K-1 {
		k := len(t.microViews)
		v, off := make([][]float32, len(t.params)), 0
		for i, p := range t.params {
			v[i] = t.micro[k][off : off+len(p.Grad) : off+len(p.Grad)]
			off += len(p.Grad)
		}
		t.microViews = append(t.microViews, v)
	}
	if len(t.microLoss) < K {
		t.microLoss = make([]float64, K)
	}
	losses := t.microLoss[:K]
	if err := t.microFn(ctx, b, t.microViews[:K-1], losses); err != nil {
		return 0, err
	}
	for k := range K {
		loss += math.Round(losses[k] * lossScale)
	}
	return loss, nil
}

// flatten copies the Grad buffers, in model order, to the front of dst.
func (t *Trainer[B]) flatten(dst []float32) {
	off := 0
	for _, p := range t.params {
		off += copy(dst[off:], p.Grad)
	}
}

// reduceOrdered is deterministic mode's step in one collective when the
// round's Synchronizer implements sync.OrderedReducer: this rank's
// micro-batches' gradients, one part each in order, the last followed by
// the control values ctl (putControl's, packed), summed over the ranks in
// rank order by AllReduceOrderedFloat32. The control values are decoded
// into o; when every rank applies the step, the sums go to the Grad
// buffers and t.ordInv is the factor that makes them the mean (1 over
// globalSize), which the loop applies. It returns whether the collective
// completed (every rank's control values arrived), ErrDiverged when the
// loss sum or some gradient sum is not finite, and ErrInvalidConfig when
// the ranks' micro-batches are not contiguous runs in rank order: the
// same outcome on every rank, read from the same bits.
func (t *Trainer[B]) reduceOrdered(ctx context.Context, r sync.OrderedReducer, ctl []float64, globalSize, W int, o *stepOutcome) (bool, error) {
	n := t.nvalues
	K := t.microCount
	parts := t.ordParts[:0]
	for k := range K - 1 {
		parts = append(parts, t.micro[k][:t.orderedLen(W)])
	}
	var sum []float32 // nil: in the Grad buffers
	if t.ordTensors != nil {
		if K == 0 {
			for _, g := range t.gradList {
				clear(g) // no micro-batch: the control values after zeros, which leave the sum as it is
			}
		}
		packControl(t.ordCtl, ctl)
		t.ordParts = parts
		if err := t.ordTensors.AllReduceOrderedTensors(ctx, parts, t.ordLastList); err != nil {
			return false, err
		}
		unpackControl(ctl, t.ordCtl)
	} else {
		last := t.ordLast
		if K == 0 {
			clear(last[:n])
		}
		packControl(last[n:], ctl)
		parts = append(parts, last)
		t.ordParts = parts
		out := t.ordOut
		if err := r.AllReduceOrderedFloat32(ctx, parts, out); err != nil {
			return false, err
		}
		unpackControl(ctl, out[n:])
		sum = out[:n]
	}
	readControl(ctl, W, true, o)
	if o.stepFailed || o.samples == 0 {
		return true, nil // nobody applies this step
	}
	if err := checkMicroRuns(ctl, W); err != nil {
		return true, err
	}
	m := 0.0
	if sum != nil {
		m = largest(sum)
	} else {
		for _, g := range t.gradList {
			if x := largest(g); x > m || math.IsNaN(x) {
				m = x
				if math.IsNaN(x) {
					break
				}
			}
		}
	}
	if math.IsNaN(m) || math.IsInf(m, 0) {
		o.diverged, o.gradMax = true, m
		return true, fmt.Errorf("%w: non-finite gradient sum over the global batch (max |sum| = %v)", ErrDiverged, m)
	}
	if math.IsNaN(o.lossSum) || math.IsInf(o.lossSum, 0) {
		return true, fmt.Errorf("%w: the loss over the global batch is %v", ErrDiverged, o.lossSum)
	}
	// The sums go to the Grad buffers (unless they are there already);
	// the loop divides them by globalSize, in the optimizer's own pass
	// when it can scale (t.ordInv, as the default mode scales its sums).
	off := 0
	for _, p := range t.params {
		if sum == nil {
			break
		}
		off += copy(p.Grad, sum[off:])
	}
	t.ordInv = float32(1 / float64(max(globalSize, 1)))
	return true, nil
}

// largest is the largest magnitude in s, +Inf when one is infinite, NaN
// when one is NaN: one pass (fixk.MaxAbs, AVX2 where the CPU has it).
func largest(s []float32) float64 {
	mb := fixk.MaxAbs(s)
	if mb > 0x7f800000 {
		return math.NaN()
	}
	return float64(math.Float32frombits(mb))
}

// orderedRun is this rank's run of micro-batches for the control values:
// the global index of the first and how many, or -1 for how many when
// they are not consecutive.
func orderedRun[B any](micro []dataloader.Micro[B]) (first, count int) {
	if len(micro) == 0 {
		return 0, 0
	}
	first = micro[0].Index
	for k, m := range micro {
		if m.Index != first+k {
			return first, -1
		}
	}
	return first, len(micro)
}

// checkMicroRuns checks, from the reduced control values of W ranks, that
// the ranks' micro-batches are contiguous runs in rank order, as the
// ordered sum needs to be the same at every world size.
func checkMicroRuns(ctl []float64, W int) error {
	next := -1
	for r := range W {
		v := ctl[ctlFixed+ctlPerRank*r:]
		first, count := int(v[ctlMicroFirst]), int(v[ctlMicros])
		switch {
		case count < 0:
			return fmt.Errorf("%w: deterministic mode: rank %d's micro-batches are not consecutive "+
				"(the ordered sum needs each rank's micro-batches in one run, the runs in rank order)", ErrInvalidConfig, r)
		case count == 0:
		case next >= 0 && first != next:
			return fmt.Errorf("%w: deterministic mode: rank %d's micro-batches begin at %d, after the earlier ranks' ended at %d "+
				"(the ordered sum needs each rank's micro-batches in one run, the runs in rank order)", ErrInvalidConfig, r, first, next)
		default:
			next = first + count
		}
	}
	return nil
}
