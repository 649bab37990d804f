package trainer

import (
	"context"
	"fmt"
	"math"
	"math/bits"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/internal/fixk"
)

// compute runs the StepFunc on this rank's share of a global batch and
// leaves the gradient SUM over the share in the parameters' Grad buffers
// (default mode) or each micro-batch's gradients in t.micro (deterministic
// mode). It returns the loss sum (fixed point in deterministic mode) and, in
// deterministic mode, the largest |gradient| of any micro-batch.
//
// With the loader's micro-batches (dataloader.Config.MicroBatch), the
// StepFunc runs once per micro-batch (gradient accumulation) so memory
// stays bounded whatever the share.
func (t *Trainer[B]) compute(ctx context.Context, b dataloader.Batch[B]) (loss, gmax float64, err error) {
	if b.Micro == nil {
		if t.det {
			return 0, 0, fmt.Errorf("%w: Deterministic needs the loader's MicroBatch set", ErrInvalidConfig)
		}
		if len(b.Indices) == 0 {
			// No sample in this rank's share (a leased loader waiting for a
			// shard may not even collate one): zero gradients, no loss.
			for _, p := range t.params {
				clear(p.Grad)
			}
			if len(t.parts) == 0 {
				return 0, 0, nil
			}
			// A partition's step needs every rank's part (the parameter
			// server's shards wait for every rank's push): the StepFunc
			// runs, with no sample.
		}
		loss, err = t.stepFn(ctx, b)
		return loss, 0, err
	}
	if t.ordered {
		loss, err = t.computeOrdered(ctx, b)
		return loss, 0, err
	}
	if t.det {
		return t.computeDet(ctx, b)
	}
	if len(b.Micro) == 0 {
		for _, p := range t.params {
			clear(p.Grad)
		}
		if len(t.parts) > 0 { // as above: every rank takes part in a partition's step
			loss, err = t.stepFn(ctx, b)
			return loss, 0, err
		}
		return 0, 0, nil
	}
	if len(b.Micro) == 1 {
		loss, err = t.stepFn(ctx, b.MicroBatch(0))
		return loss, 0, err
	}
	if len(t.acc) != t.nvalues {
		t.acc = make([]float32, t.nvalues)
	}
	clear(t.acc)
	for k := range b.Micro {
		l, err := t.stepFn(ctx, b.MicroBatch(k))
		if err != nil {
			return 0, 0, err
		}
		loss += l
		off := 0
		for _, p := range t.params {
			acc := t.acc[off : off+len(p.Grad)]
			for i, g := range p.Grad {
				acc[i] += g
			}
			off += len(p.Grad)
		}
	}
	off := 0
	for _, p := range t.params {
		copy(p.Grad, t.acc[off:])
		off += len(p.Grad)
	}
	return loss, 0, nil
}

// computeDet is compute in deterministic mode: each micro-batch's
// gradients stay apart (t.micro, the last one in the Grad buffers), and
// when reduceFixed's scale is known before the step (t.detFuse) they are
// converted to fixed point and summed into t.detBuf in the same pass that
// finds their largest |gradient|. With a MicroStepFunc the step runs in one
// call, which writes straight into t.micro; otherwise the StepFunc runs
// once per micro-batch and each one's gradients are copied in that pass.
func (t *Trainer[B]) computeDet(ctx context.Context, b dataloader.Batch[B]) (loss, gmax float64, err error) {
	K := len(b.Micro)
	t.growMicro(K) // the last one is not copied (microGrads)
	// In the one-collective step (reduceFixed) the scale is known
	// before the StepFunc runs: each micro-batch's gradients are
	// converted and summed while they are scanned, in one pass.
	var fixed []float64
	scale := 0.0
	if t.detFuse {
		fixed = t.detBuf[:t.nvalues] // cleared or overwritten below
		scale = math.Ldexp(1, t.detS)
	}
	if t.microFn != nil && K > 0 {
		if loss, err = t.callMicro(ctx, b); err != nil {
			return 0, 0, err
		}
		// One pass over each parameter's values, all micro-batches at
		// once: each value's fixed-point sum is written once, not added
		// to per micro-batch.
		gs := t.microRuns[:0]
		var mb uint32
		off := 0
		for i, p := range t.params {
			gs = gs[:0]
			for k := range K - 1 {
				gs = append(gs, t.microViews[k][i])
			}
			gs = append(gs, p.Grad)
			var f []float64
			if fixed != nil {
				f = fixed[off : off+len(p.Grad)]
			}
			mb = fixSum(f, gs, scale, mb)
			off += len(p.Grad)
		}
		t.microRuns = gs
		if mb > 0x7f800000 {
			return 0, math.NaN(), nil // NaN: reported as such
		}
		return loss, float64(math.Float32frombits(mb)), nil
	}
	if fixed != nil {
		clear(fixed)
	}
	for k := range b.Micro {
		l, err := t.stepFn(ctx, b.MicroBatch(k))
		if err != nil {
			return 0, 0, err
		}
		loss += math.Round(l * lossScale)
		// The last micro-batch's gradients stay in the Grad buffers
		// until the sum replaces them (microGrads): no copy.
		var dst []float32
		if k < K-1 {
			dst = t.micro[k]
		}
		off := 0
		m := float32(0)
		for _, p := range t.params {
			var d []float32
			if dst != nil {
				d = dst[off : off+len(p.Grad)]
			}
			m = convertMax(fixed, off, p.Grad, d, scale, m)
			off += len(p.Grad)
		}
		if m != m {
			return 0, math.NaN(), nil
		}
		gmax = max(gmax, float64(m))
	}
	return loss, gmax, nil
}

// fixSum is deterministic mode's one pass over a run of values of K
// micro-batches' gradients (gs[k], each as long as f when f is non-nil):
// it sets f[i] to the sum over k of gs[k][i] rounded to an integer at the
// given scale (the rounding of fixedPointSum, exact in any order; a value
// past reduceFixed's bound is summed again at another scale there), and
// returns the larger of mb and every |gs[k][i]|, both as float32 bit
// patterns without the sign (which order as the magnitudes do; any bits
// above 0x7f800000, +Inf, are a NaN).
func fixSum(f []float64, gs [][]float32, scale float64, mb uint32) uint32 {
	return max(mb, fixk.Sum(f, gs, scale))
}

// convertMax is deterministic mode's one pass over a run of gradients g
// at offset off of the model's values: it copies g to dst (when non-nil),
// adds each value rounded to an integer at the given scale to fixed[off:]
// (when fixed is non-nil; the rounding of fixedPointSum, a value past
// reduceFixed's bound is summed again at another scale there), and
// returns the largest of m and every |g|, or NaN when some g is NaN.
func convertMax(fixed []float64, off int, g, dst []float32, scale float64, m float32) float32 {
	if dst != nil {
		copy(dst, g)
	}
	if len(g) == 0 {
		return m
	}
	var mb uint32 // the largest |g| as a float32 bit pattern, ordered as the magnitudes
	if fixed != nil {
		mb = fixk.Add(fixed[off:off+len(g)], g, scale)
	} else {
		mb = fixk.MaxAbs(g)
	}
	if mb > 0x7f800000 {
		return float32(math.NaN())
	}
	if a := math.Float32frombits(mb); a > m {
		m = a
	}
	return m
}

// localGrads leaves this rank's own gradients for a LocalStepper's local
// step: in default mode nothing is to be done (the loop scales the share's
// sum by W/N); in deterministic mode the micro-batches' gradients are
// summed exactly in fixed point as in reduceGrads, without the allreduce,
// and scaled by w/globalSize.
func (t *Trainer[B]) localGrads(ctx context.Context, gmax float64, globalSize, w int) error {
	if !t.det {
		return nil
	}
	return t.fixedPointSum(ctx, nil, gmax, globalSize, w)
}

// reduceGrads sums the gradients over every rank.
//
// Default mode: the round's GradientReducer when its Synchronizer has one,
// else a float32 allreduce of the fused gradient buckets; the sum's
// rounding depends on the ring's order, so results may differ in the last
// bits between world sizes.
//
// Deterministic mode: every micro-batch's gradients are converted to fixed
// point with one scale for the whole job step, 2^s with
// s = 52 - e - bits(globalSize) where gmax < 2^e is the largest |gradient| of
// any micro-batch on any rank (from the control allreduce). Each value is
// then an integer of magnitude below 2^(52-bits(globalSize)), so any sum of
// at most globalSize of them stays below 2^52 and float64 adds them exactly:
// the sum over micro-batches, and the allreduce over ranks, give the same
// bits in any order and for any world size. The result is scaled back and
// divided by globalSize once. Precision: about 2^-(52-bits) of gmax, far finer
// than float32's own rounding. (This is exact integer accumulation, the
// simplest of the reproducible-summation schemes; compare the binned sums of
// Demmel & Nguyen, "Fast Reproducible Floating-Point Summation", ARITH 2013.)
func (t *Trainer[B]) reduceGrads(ctx context.Context, comm sync.Synchronizer, gmax float64, globalSize int) error {
	if !t.det {
		if gr, ok := comm.(GradientReducer); ok {
			return gr.SumGradients(ctx, t.gradList)
		}
		return t.grads.AllReduce(ctx, comm, sync.OpSum)
	}
	return t.fixedPointSum(ctx, comm, gmax, globalSize, 1)
}

// microGrads calls f with the gradients of this rank's micro-batch k of
// count (t.microCount once compute returned) as flat runs starting at offset off of the model's
// values: t.micro[k], or, for the last one, which compute does not copy,
// the parameters' Grad buffers (until the sum replaces them).
func (t *Trainer[B]) microGrads(k, count int, f func(off int, g []float32)) {
	if k < count-1 {
		f(0, t.micro[k][:t.nvalues])
		return
	}
	off := 0
	for _, p := range t.params {
		f(off, p.Grad)
		off += len(p.Grad)
	}
}

// addMicro adds every micro-batch's gradients, rounded to integers at the
// given scale, to fixed.
func (t *Trainer[B]) addMicro(fixed []float64, scale float64) {
	for k := range t.microCount {
		t.microGrads(k, t.microCount, func(off int, g []float32) {
			fixk.Add(fixed[off:off+len(g)], g, scale)
		})
	}
}

// fixedPointSum is the deterministic mode of reduceGrads (comm non-nil) and
// localGrads (comm nil: this rank's micro-batches only): the exact sum,
// divided by globalSize and multiplied by w.
func (t *Trainer[B]) fixedPointSum(ctx context.Context, comm sync.Synchronizer, gmax float64, globalSize, w int) error {
	if math.IsInf(gmax, 0) || math.IsNaN(gmax) {
		return fmt.Errorf("%w: non-finite gradient (max |g| = %v), which fixed point cannot sum", ErrDiverged, gmax)
	}
	s := 0
	if gmax > 0 {
		_, e := math.Frexp(gmax) // gmax < 2^e
		s = 52 - e - bits.Len(uint(globalSize))
	}
	if len(t.fixed) != t.nvalues {
		t.fixed = make([]float64, t.nvalues)
	}
	fixed := t.fixed
	clear(fixed)
	// Multiplying by a power of two is exact (no overflow: |g| < 2^e), and
	// rounding to an integer is a pure function of the value: adding and
	// subtracting 1.5*2^52 rounds any |x| < 2^51 to the nearest integer
	// (ties to even) in IEEE 754 double arithmetic, which Go never
	// reassociates.
	scale := math.Ldexp(1, s)
	t.addMicro(fixed, scale)
	if comm != nil {
		if err := comm.AllReduceFloat64(ctx, fixed, sync.OpSum); err != nil {
			return err
		}
	}
	t.unfix(fixed, s, globalSize, w)
	return nil
}

// unfix writes the exact fixed-point sums at scale 2^s back into the
// parameters' Grad buffers, divided by globalSize and multiplied by w.
func (t *Trainer[B]) unfix(fixed []float64, s, globalSize, w int) {
	unscale, inv := math.Ldexp(1, -s), float64(w)/float64(max(globalSize, 1))
	off := 0
	for _, p := range t.params {
		fixk.Unfix(p.Grad, fixed[off:off+len(p.Grad)], unscale, inv)
		off += len(p.Grad)
	}
}

// reduceFixed is deterministic mode's step in one collective: this rank's
// micro-batches' gradients (gmax their largest |gradient|) are converted
// to integers at the scale the previous step's agreed exponent gives
// (detScaleExp) and summed, the control values ctl (putControl's) are
// appended, and one float64 SUM-allreduce sums both over the ranks; the
// control values are decoded into o (sumControl, readControl), and the
// exact sums, scaled back and divided by globalSize, go to the Grad
// buffers. When some rank's gradients did not fit the scale (the agreed
// largest |gradient| is at or above the bound), every rank sees it in o
// and sums the step again at the scale of that gradient (fixedPointSum, a
// second collective): the same decision on every rank, taken from the
// same numbers in any world, so the bits stay those of any other run of
// the job. It returns whether the collective completed (every rank's
// control values arrived) and ErrDiverged when a gradient is not finite.
// The agreed exponent of an applied step becomes the next one's (t.detExp).
func (t *Trainer[B]) reduceFixed(ctx context.Context, comm sync.Synchronizer, ctl []float64, gmax float64, globalSize, W int, o *stepOutcome) (bool, error) {
	n := t.nvalues
	if len(t.detBuf) != n+len(ctl) {
		t.detBuf = make([]float64, n+len(ctl))
	}
	buf := t.detBuf
	fixed := buf[:n]
	s, bound := detScaleExp(t.detExp, globalSize)
	if !t.detFuse || s != t.detS || t.microCount == 0 {
		// Not summed by compute (or with no micro-batch: cleared here).
		clear(fixed)
		if gmax < bound { // false for NaN: then the step is not summed at this scale anyway
			t.addMicro(fixed, math.Ldexp(1, s))
		}
	}
	t.detFuse = false
	copy(buf[n:], ctl)
	if err := comm.AllReduceFloat64(ctx, buf, sync.OpSum); err != nil {
		return false, err
	}
	copy(ctl, buf[n:])
	sumControl(ctl)
	readControl(ctl, W, true, o)
	switch {
	case o.diverged:
		// Every rank saw the same largest gradient: all stop here, together.
		return true, fmt.Errorf("%w: non-finite gradient (max |g| = %v), which fixed point cannot sum", ErrDiverged, o.gradMax)
	case o.stepFailed || o.samples == 0:
		return true, nil // nobody applies this step: nothing to scale back
	case !(o.gradMax < bound):
		t.detRedone++
		if err := t.fixedPointSum(ctx, comm, o.gradMax, globalSize, 1); err != nil {
			return true, err
		}
	default:
		t.unfix(fixed, s, globalSize, 1)
	}
	t.detExp = gradExp(o.gradMax, t.detExp)
	return true, nil
}
