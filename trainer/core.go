package trainer

import (
	"errors"
	"math"
	"slices"
	"time"

	"github.com/elastictrain/elastictrain/sync"
)

// The deterministic core of the loop: every decision the trainer takes
// from numbers its ranks agreed on, as plain functions and small state
// machines without I/O, goroutines or clocks of their own (time comes in
// as arguments). Run, round, syncState and train are the I/O around them:
// they fill the collectives' buffers from these functions, run the
// collectives, and act on what these functions decide from the results.
// Every rank runs the same functions on the same reduced values, so every
// rank decides the same. (The split follows etcd raft's RawNode, the
// state machine, and Node, the goroutines around it; compare
// elastic/store/core.go for the rendezvous.) core_test.go drives them through
// the scripts in testdata/core.

// none marks "no value" in max-reduced slots: every real value beats it.
const none = -1e300

// stateClaim is what one rank brings to a round's state agreement.
type stateClaim struct {
	fingerprint float64 // the model's (fingerprint)
	holds       bool    // it holds live state (a commit)
	stateRound  uint64  // the round in which it installed that state
	latestSeq   uint64  // the number of its newest commit
	recovered   bool    // its previous round ended in a failure
	owed        bool    // that failure came after a step somewhere: a recovery to count
}

// agreementPhase1 fills a rank's values of the first max-allreduce of the
// state agreement: the fingerprint twice (as +f and -f, so the max shows
// any difference), the round its state is from, and its recovery flags.
func agreementPhase1(c stateClaim) []float64 {
	v := []float64{c.fingerprint, -c.fingerprint, none, 0}
	if c.holds {
		v[2] = float64(c.stateRound)
	}
	if c.recovered {
		v[3] = 1
		if c.owed {
			v[3] = 2
		}
	}
	return v
}

// phase1 is what every rank learns from the first allreduce.
type phase1 struct {
	mismatch  bool    // the ranks hold different models: every rank stops
	held      bool    // some rank holds live state
	fresh     float64 // the freshest state's round (valid when held)
	recovered bool    // some rank's previous round failed: this round is a recovery
	counted   bool    // and a step had been trained: it spends the job's failure budget
}

// decidePhase1 reads the reduced first allreduce on a rank whose model has
// fingerprint fp.
func decidePhase1(v []float64, fp float64) phase1 {
	return phase1{
		mismatch:  v[0] != fp || -v[1] != fp,
		held:      v[2] > none,
		fresh:     v[2],
		recovered: v[3] > 0,
		counted:   v[3] > 1,
	}
}

// agreementPhase2 fills a rank's values of the second max-allreduce, run
// only when some rank holds state: among the holders of the freshest state,
// the lowest commit number and the lowest rank (both negated for the max).
// Survivors of one round are at most one commit apart, and each keeps its
// last two commits, so the lowest newest commit is held by all of them.
// Commits are told apart by number, not step: a loader may commit twice
// at one step (after a global batch without samples).
func agreementPhase2(c stateClaim, p phase1, rank, size int) []float64 {
	w := []float64{none, -float64(size)}
	if c.holds && float64(c.stateRound) == p.fresh {
		w[0], w[1] = -float64(c.latestSeq), -float64(rank)
	}
	return w
}

// decidePhase2 reads the reduced second allreduce: the rank that sends
// the agreed commit (root) and its number.
func decidePhase2(w []float64) (root int, seq uint64) {
	return int(-w[1]), uint64(-w[0])
}

// pickCommit returns the commit numbered seq among a root's commits, or
// nil when it holds none of that number.
func pickCommit(seq uint64, commits ...*snapshot) *snapshot {
	for _, c := range commits {
		if c != nil && c.seq == seq {
			return c
		}
	}
	return nil
}

// recoveriesWithin counts the recoveries (unix milliseconds, from the
// committed state) within window before now: the job's failure budget.
func recoveriesWithin(recoveries []int64, now time.Time, window time.Duration) int {
	cutoff := now.Add(-window).UnixMilli()
	n := 0
	for _, r := range recoveries {
		if r >= cutoff {
			n++
		}
	}
	return n
}

// control is one rank's contribution to a step's control allreduce.
type control struct {
	change    bool    // its rendezvous agent sees a membership change pending
	stepErr   bool    // its StepFunc failed
	gradMax   float64 // largest |gradient| of its micro-batches (deterministic mode)
	loss      float64 // its loss sum (fixed point in deterministic mode)
	samples   int     // samples in its share
	compute   float64 // its StepFunc seconds
	work      float64 // its share's cost (Batch.Cost, or its samples): what balancing divides by compute
	stop      bool    // it was preempted
	epochDone bool    // its loader found no sample of the epoch left
	scaling   scalingControl
	// Deterministic mode's ordered sum (reduceOrdered): the global index
	// of its first micro-batch and how many it holds (-1: not one
	// contiguous run); 0 and 0 elsewhere.
	microFirst, micros int
}

// scalingControl is one rank's measurements for resource adjustment
// (Config.Autoscale), all 0 when it is off.
type scalingControl struct {
	interval    float64 // seconds since it began its previous step
	syncPrev    float64 // seconds in the allreduce of its previous step in this round
	gradSq      float64 // squared norm of its mean gradient, previous step
	normSamples float64 // its samples in that step
	bigSq       float64 // squared norm of the mean gradient over that step's global batch
	capacity    float64 // workers its Platform allows; 0: no bound
	keep        bool    // it holds state no other rank holds
}

// controlLen is the length of a control buffer for world size W.
func controlLen(W int) int { return ctlFixed + ctlPerRank*W }

// putControl writes rank's control values into ctl (cleared first); the
// other ranks' slots stay 0, so the max-allreduce hands every rank every
// rank's values.
func putControl(ctl []float64, rank int, c control) {
	clear(ctl)
	if c.change {
		ctl[ctlChange] = 1
	}
	if c.stepErr {
		ctl[ctlStepErr] = 1
	}
	ctl[ctlGradMax] = c.gradMax
	mine := ctl[ctlFixed+ctlPerRank*rank:]
	mine[ctlGradMaxR] = c.gradMax
	mine[ctlMicroFirst], mine[ctlMicros] = float64(c.microFirst), float64(c.micros)
	mine[ctlLoss], mine[ctlSamples], mine[ctlCompute], mine[ctlWork] = c.loss, float64(c.samples), c.compute, c.work
	if c.stop {
		mine[ctlStop] = 1
	}
	if c.epochDone {
		mine[ctlEpochDone] = 1
	}
	s := c.scaling
	mine[ctlInterval], mine[ctlSyncPrev], mine[ctlGradSq], mine[ctlNormSamples] = s.interval, s.syncPrev, s.gradSq, s.normSamples
	mine[ctlBigSq], mine[ctlCapacity] = s.bigSq, s.capacity
	if s.keep {
		mine[ctlKeep] = 1
	}
}

// ctlLanes is how many float32 elements carry one control value in the
// gradient allreduce (packControl): one per 16 bits of its float64.
const ctlLanes = 4

// packControl writes ctl (one rank's, as putControl left it) into lanes
// of float32 that a SUM-allreduce reduces to the max-allreduce's result:
// a shared slot (a flag, any rank may set it) becomes 1 or 0 in its first
// lane; a per-rank slot, which only its rank sets, is split into its
// float64 bits, 16 to a lane. Each lane holds an integer below 2^16, so a
// sum of one rank's lanes and the others' zeros is exact in float32 in
// any order: unpackControl gets every bit back (a NaN loss included).
func packControl(lanes []float32, ctl []float64) {
	clear(lanes)
	for i, v := range ctl {
		l := lanes[i*ctlLanes : (i+1)*ctlLanes]
		if i < ctlFixed {
			if v != 0 {
				l[0] = 1
			}
			continue
		}
		b := math.Float64bits(v)
		for k := range l {
			l[k] = float32(b >> (16 * k) & 0xffff)
		}
	}
}

// sumControl turns ctl, the SUM-allreduce of every rank's control values
// (putControl's, as float64: deterministic mode's one collective), into
// what the max-allreduce would leave: shared slots become flags, 0 or 1
// (the shared largest gradient, 0: each rank's travels in its own slot);
// per-rank slots are exact already (one rank's value plus zeros).
func sumControl(ctl []float64) {
	for i := range ctlFixed {
		v := ctl[i]
		ctl[i] = 0
		if v != 0 && i != ctlGradMax {
			ctl[i] = 1
		}
	}
}

// unpackControl is packControl's inverse on the summed lanes: ctl as the
// max-allreduce of every rank's control values would leave it (shared
// slots as flags, 0 or 1; deterministic mode's largest gradient, a shared
// value, does not travel this way).
func unpackControl(ctl []float64, lanes []float32) {
	for i := range ctl {
		l := lanes[i*ctlLanes : (i+1)*ctlLanes]
		if i < ctlFixed {
			ctl[i] = 0
			if l[0] != 0 {
				ctl[i] = 1
			}
			continue
		}
		var b uint64
		for k, x := range l {
			b |= uint64(x) << (16 * k)
		}
		ctl[i] = math.Float64frombits(b)
	}
}

// stepOutcome is what every rank reads from a step's reduced control
// values. Its per-rank slices are reused from step to step.
type stepOutcome struct {
	stepFailed bool    // some rank's StepFunc failed: nobody applies the step
	diverged   bool    // deterministic mode: a gradient is not finite, every rank stops
	change     bool    // a membership change is pending somewhere: leave after this step
	samples    float64 // samples in the global batch; 0: an empty global batch, no step
	lossSum    float64 // over the ranks, in rank order (unscaled in deterministic mode)
	stop       bool    // some rank was preempted
	firstStop  int     // the lowest preempted rank, or -1
	perStop    []bool  // the preempted ranks
	gradMax    float64
	perSamples []int
	perCompute []float64
	perWork    []float64
	epochDone  []bool
	// Resource adjustment's per-rank values (scalingControl), by rank.
	perInterval, perSyncPrev, perGradSq, perNormSamples, perBigSq, perCapacity []float64
	perKeep                                                                    []bool
}

// readControl decodes the reduced control values of a world of W ranks
// into o. The loss sum adds in rank order, so every rank gets the same
// bits.
func readControl(ctl []float64, W int, deterministic bool, o *stepOutcome) {
	if len(o.perSamples) != W {
		o.perSamples, o.perCompute, o.epochDone = make([]int, W), make([]float64, W), make([]bool, W)
		o.perWork, o.perStop = make([]float64, W), make([]bool, W)
		o.perInterval, o.perSyncPrev, o.perGradSq = make([]float64, W), make([]float64, W), make([]float64, W)
		o.perNormSamples, o.perBigSq, o.perCapacity, o.perKeep = make([]float64, W), make([]float64, W), make([]float64, W), make([]bool, W)
	}
	o.stepFailed = ctl[ctlStepErr] > 0
	o.change = ctl[ctlChange] > 0
	o.gradMax = ctl[ctlGradMax]
	o.samples, o.lossSum, o.stop, o.firstStop = 0, 0, false, -1
	for r := range W {
		v := ctl[ctlFixed+ctlPerRank*r:]
		o.samples += v[ctlSamples]
		o.lossSum += v[ctlLoss]
		o.perStop[r] = v[ctlStop] > 0
		if o.perStop[r] && o.firstStop < 0 {
			o.firstStop = r
		}
		o.perSamples[r], o.perCompute[r], o.epochDone[r] = int(v[ctlSamples]), v[ctlCompute], v[ctlEpochDone] > 0
		o.perWork[r] = v[ctlWork]
		o.gradMax = max(o.gradMax, v[ctlGradMaxR]) // NaN stays NaN
		o.perInterval[r], o.perSyncPrev[r], o.perGradSq[r] = v[ctlInterval], v[ctlSyncPrev], v[ctlGradSq]
		o.perNormSamples[r], o.perBigSq[r], o.perCapacity[r], o.perKeep[r] = v[ctlNormSamples], v[ctlBigSq], v[ctlCapacity], v[ctlKeep] > 0
	}
	o.stop = o.firstStop >= 0
	o.diverged = deterministic && !o.stepFailed && (math.IsInf(o.gradMax, 0) || math.IsNaN(o.gradMax))
	if deterministic {
		o.lossSum /= lossScale
	}
}

// boundary is what a rank does at the step boundary after a step (or an
// empty global batch) every rank applied.
type boundary struct {
	commit     bool     // take a commit now
	checkpoint bool     // then write a durable checkpoint (of this step)
	end        roundEnd // how the round ends here; endNone: go on
}

// endNone: the round goes on (see decideBoundary).
const endNone roundEnd = -2

// boundaryIn is what decideBoundary needs besides the step's outcome.
type boundaryIn struct {
	step            int64 // the step count after the step
	commitEvery     int
	checkpointEvery int  // 0: none
	commitAsked     bool // the loader's Stepped asked for a commit
	evict           int  // the straggler to evict, or -1
	rank            int
	preempted       bool // this worker was preempted
	// unsynced: the ranks' parameters differ at this boundary (a
	// LocalStepper between two outer steps), so it can be neither
	// committed nor checkpointed; a round that ends here rolls back to
	// the last commit.
	unsynced bool
}

// decideBoundary decides the step boundary from the agreed outcome: a
// commit when one is due (CommitEvery), the loader asks for one, a
// checkpoint is due, or the round ends (a preemption, an eviction, a
// pending membership change: every rank commits before it leaves); a
// checkpoint every CheckpointEvery steps unless a preemption writes its
// own; neither where the ranks' parameters differ (unsynced); then the
// end: the preempted leave and the others rejoin, the evicted rank leaves
// and the others rejoin, a membership change makes everyone rejoin. An empty global batch is no step: only the loader's
// request, a preemption and a membership change count.
func decideBoundary(o *stepOutcome, in boundaryIn) boundary {
	empty := o.samples == 0
	leaving := o.stop || in.evict >= 0 || o.change
	var b boundary
	b.checkpoint = !empty && !o.stop && in.checkpointEvery > 0 && in.step%int64(in.checkpointEvery) == 0
	b.commit = leaving || in.commitAsked || b.checkpoint || (!empty && in.step%int64(in.commitEvery) == 0)
	if in.unsynced {
		b.commit, b.checkpoint = false, false
	}
	switch {
	case o.stop && in.preempted:
		b.end = endPreempted
	case o.stop:
		b.end = endRejoin
	case in.evict == in.rank:
		b.end = endEvicted
	case leaving:
		b.end = endRejoin
	default:
		b.end = endNone
	}
	return b
}

// stragglers tracks, per rank, how many steps in a row its compute time
// exceeded factor times the median (Config.StragglerFactor), and reports
// a rank when the count reaches steps (Config.StragglerSteps).
type stragglers struct {
	factor float64
	steps  int
	slow   []int
	sorted []float64
}

// reset starts a round of W ranks.
func (s *stragglers) reset(W int) {
	if len(s.slow) != W {
		s.slow = make([]int, W)
	}
	clear(s.slow)
}

// observe takes one step's per-rank compute times (the same on every
// rank) and calls report for each rank found slow at this step; it
// returns the first of them when evict is set, else -1. A median needs at
// least three ranks to mean anything: smaller worlds report nobody.
func (s *stragglers) observe(compute []float64, evict bool, report func(rank int, ratio float64)) int {
	if len(compute) < 3 {
		return -1
	}
	s.sorted = append(s.sorted[:0], compute...)
	slices.Sort(s.sorted)
	med := s.sorted[len(s.sorted)/2]
	out := -1
	for r, c := range compute {
		if med > 0 && c > s.factor*med {
			s.slow[r]++
		} else {
			s.slow[r] = 0
		}
		if s.slow[r] == s.steps {
			report(r, c/med)
			if evict && out < 0 {
				out = r
			}
		}
	}
	return out
}

// reportTarget returns the rank that a failed round's error blames and
// this worker should report to the rendezvous for eviction, or -1. Only a
// lost peer counts: one that aborted on purpose (its round moved on, it
// was preempted) or closed is alive. A worker that never held the job's
// state does not report: if it cannot authenticate with a peer, the
// misconfigured one may well be itself (a stale secret), and it must not
// evict healthy members; those that trained together know better.
func reportTarget(err error, rank, size int, holdsState bool) int {
	var pe *sync.PeerError
	if !holdsState || !errors.As(err, &pe) || errors.Is(err, sync.ErrAborted) || errors.Is(err, sync.ErrClosed) {
		return -1
	}
	if pe.Rank < 0 || pe.Rank >= size || pe.Rank == rank {
		return -1
	}
	return pe.Rank
}

// unformed bounds, on one worker, the rounds in a row that fail before it
// trains a step (a peer that never authenticates, an address nobody
// reaches): they neither spin nor go on for ever.
type unformed struct {
	max int // Config.MaxRecoveries
	n   int // such rounds in a row
}

// trained records a round in which this worker applied a step.
func (u *unformed) trained() { u.n = 0 }

// failed records a round that failed before this worker trained a step in
// it. A round whose culprit this worker reported does not count: the
// culprit was evicted, and strangers that keep coming back must not wear
// down the members that train. It returns whether to give up (more than
// max in a row) and how long to wait before rejoining.
func (u *unformed) failed(reported bool) (giveUp bool, pause time.Duration) {
	if reported {
		return false, 0
	}
	u.n++
	if u.n > u.max {
		return true, 0
	}
	return false, unformedBackoff(u.n)
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

// lastFailures keeps the newest few failure causes for a BudgetError.
func lastFailures(list []string, cause string) []string {
	list = append(list, cause)
	if len(list) > 5 {
		list = list[len(list)-5:]
	}
	return list
}
