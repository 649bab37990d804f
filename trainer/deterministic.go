package trainer

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/elastictrain/elastictrain/trainer/driver"
)

// MicroBatcher is the optional capability of a loader that cuts global
// batches into fixed micro-batches.
//
// Deprecated: use driver.MicroBatcher, the same type.
type MicroBatcher = driver.MicroBatcher

// deterministicMode decides, at New, whether a job configured with
// Config.Deterministic (the default) runs in deterministic mode: it needs
// a loader that cuts global batches into fixed micro-batches (a
// MicroBatcher reporting a size above 0, as dataloader.Loader does with
// dataloader.Config.MicroBatch set) and that does not merge state across
// ranks (a StateMerger: which samples a rank trains would depend on
// timing). Otherwise the job runs in the float32 mode (Deterministic false), and reason
// says why, for the one log line at the start of Run.
func deterministicMode(cfg Config, loader any) (det bool, reason string) {
	if !cfg.Deterministic {
		return false, ""
	}
	if _, ok := loader.(StateMerger); ok {
		return false, fmt.Sprintf("the loader %T merges its state across ranks (driver.StateMerger), so which samples a rank trains depends on timing", loader)
	}
	m, ok := loader.(MicroBatcher)
	switch {
	case !ok:
		return false, fmt.Sprintf("the loader %T does not cut fixed micro-batches (driver.MicroBatcher)", loader)
	case m.MicroBatchSize() <= 0:
		return false, "the loader cuts no micro-batches: set dataloader.Config.MicroBatch " +
			"(fixed micro-batches are what keeps the sums the same at every world size)"
	}
	return true, ""
}

// The fixed-point scale of deterministic mode's one-collective step
// (reduceFixed). A step's gradients are converted to integers at the scale
// 2^s, s = 52 - E - bits(globalSize), before anything is known of this
// step's largest gradient: E is the previous step's agreed exponent (its
// largest |gradient| over the global batch is below 2^e) plus
// detHeadroom. A value below 2^E becomes an integer below
// 2^(52-bits(globalSize)), so any sum of at most globalSize of them is an
// integer below 2^52, which float64 adds exactly in any order. Each rank's
// largest |gradient| travels in the same allreduce (a control value): when
// the global one is 2^E or more (gradients grew more than 2^detHeadroom
// fold in one step), every rank learns it at once and sums the step again
// at the scale of its own largest gradient (fixedPointSum), with a second
// collective. The exponent after each step is part of every commit and
// checkpoint (the snapshot's "detscale" section), so a resumed run scales
// every step as an uninterrupted one does.
const (
	detHeadroom = 4
	// detExpStart is the previous exponent assumed at a job's first step
	// (and when a restored checkpoint has none): |gradient| < 2^(0+4).
	detExpStart = 0
)

// detScaleExp returns the fixed-point exponent s of a step whose previous
// agreed exponent is prevExp, and the bound 2^E that every |gradient|
// must stay below.
func detScaleExp(prevExp, globalSize int) (s int, bound float64) {
	e := prevExp + detHeadroom
	return 52 - e - bits.Len(uint(max(globalSize, 1))), math.Ldexp(1, e)
}

// gradExp is the exponent e of a step's agreed largest |gradient| gmax
// (gmax < 2^e), or prev when gmax is 0 (no gradient: the scale stays).
func gradExp(gmax float64, prev int) int {
	if !(gmax > 0) || math.IsInf(gmax, 0) {
		return prev
	}
	_, e := math.Frexp(gmax)
	return e
}

// encodeDetExp is the snapshot section of the exponent e.
func encodeDetExp(dst []byte, e int) []byte {
	return binary.LittleEndian.AppendUint64(dst[:0], uint64(int64(e)))
}

// decodeDetExp reads the snapshot section; detExpStart when absent or
// out of range (every rank decodes the same bytes alike).
func decodeDetExp(b []byte) int {
	if len(b) != 8 {
		return detExpStart
	}
	e := int64(binary.LittleEndian.Uint64(b))
	if e < -1100 || e > 1100 {
		return detExpStart
	}
	return int(e)
}
