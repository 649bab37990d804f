package dataloader_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	gosync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// The tests below drive N in-process ranks of LeasedLoader through the
// trainer's contract (driver.StatefulLoader, StateMerger,
// CommitListener, LineageSetter), exactly in its order: SetLineage and
// Restore on every rank, a barrier, then per step Next, the agreed
// outcome, Stepped, and at a commit State, MergeStates (on every rank:
// the results must be the same bytes), every rank holding the commit, a
// barrier, Committed. The driver plays the trainer: each round restores
// the newest commit every member holding state holds, or, when nobody
// holds state, a durable checkpoint (with a new lineage, as the trainer
// does) or a fresh start; the steps after the restored commit leave the
// history. Faults are injected at named points, deterministically. The
// assertion is exactly once over the final history: every sample of
// every epoch in exactly one step, labelled with its epoch, and every rank
// serving the same epoch at every step.

// newQueue makes the shared shard queue of one simulated job.
type newQueue func(t *testing.T, sc dataloader.ShardConfig) dataloader.LeaseQueue

var leaseQueues = []struct {
	name string
	make newQueue
}{
	{"Memory", func(t *testing.T, sc dataloader.ShardConfig) dataloader.LeaseQueue {
		q, err := dataloader.NewMemoryQueue(sc)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}},
	{"Redis", func(t *testing.T, sc dataloader.ShardConfig) dataloader.LeaseQueue {
		cfg := redisqueue.DefaultConfig()
		cfg.Shards, cfg.JobID, cfg.KeyTTL = sc, testredis.JobID(t), 5*time.Minute
		q, err := redisqueue.New(testredis.Client(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}},
}

var errKilled = errors.New("process killed")

// procQueue is one process's view of the shared queue: once the process
// is dead every call fails, and it can be set to die right after its
// k-th ack.
type procQueue struct {
	dataloader.LeaseQueue
	mu             gosync.Mutex
	dead           bool
	dieAfterAcks   int // > 0: die right after this many acks
	acks           int
	leasesSinceSet int // leases granted since the driver last reset it
}

func (q *procQueue) alive() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return errKilled
	}
	return nil
}

func (q *procQueue) Lease(ctx context.Context, epoch int, worker string) (dataloader.Shard, error) {
	if err := q.alive(); err != nil {
		return dataloader.Shard{}, err
	}
	s, err := q.LeaseQueue.Lease(ctx, epoch, worker)
	if err == nil {
		q.mu.Lock()
		q.leasesSinceSet++
		q.mu.Unlock()
	}
	return s, err
}

func (q *procQueue) Renew(ctx context.Context, s dataloader.Shard) (dataloader.Shard, error) {
	if err := q.alive(); err != nil {
		return dataloader.Shard{}, err
	}
	return q.LeaseQueue.Renew(ctx, s)
}

func (q *procQueue) Ack(ctx context.Context, s dataloader.Shard) error {
	if err := q.alive(); err != nil {
		return err
	}
	if err := q.LeaseQueue.Ack(ctx, s); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.acks++
	if q.dieAfterAcks > 0 && q.acks == q.dieAfterAcks {
		q.dead = true
		return errKilled
	}
	return nil
}

func (q *procQueue) Reclaim(ctx context.Context, epoch int, keep []dataloader.Shard) (int, error) {
	if err := q.alive(); err != nil {
		return 0, err
	}
	return q.LeaseQueue.Reclaim(ctx, epoch, keep)
}

func (q *procQueue) Progress(ctx context.Context, epoch int) (dataloader.ShardProgress, error) {
	if err := q.alive(); err != nil {
		return dataloader.ShardProgress{}, err
	}
	return q.LeaseQueue.Progress(ctx, epoch)
}

type simCommit struct {
	step    int64
	lineage uint64
	state   []byte
}

type simProc struct {
	id           int
	l            *dataloader.LeasedLoader[int, []int]
	q            *procQueue
	latest, prev *simCommit
	dead         bool
	slow         float64 // compute seconds per sample, relative
}

// simPoint is where a fault may strike.
type simPoint struct {
	at      string // "took" (a rank's batch served, before the step), "hold" (a rank about to hold a commit), "boundary" (after a step and its commit)
	step    int64  // the global step count (for "took", before the step)
	epoch   int    // the epoch of the step's batches
	round   int
	rank    int // "took" and "hold"
	p       *simProc
	empty   bool // the global batch trained nothing ("hold", "boundary")
	allDone bool // every rank reported EpochDone: the epoch moved on ("hold", "boundary")
}

// What a fault does at a "took" or "hold" point.
const (
	goOn         = ""
	die          = "die"            // the process dies (at "hold": without holding the commit)
	fail         = "fail"           // at "hold": the commit fails on this rank, which lives on
	holdThenDie  = "hold-then-die"  // at "hold": holds the commit, then dies
	dieAfterAcks = "die-after-acks" // at "hold": holds the commit, acks one shard in Committed, dies
)

type simStep struct {
	epoch   int
	indices [][]int // by rank
}

type simJob struct {
	t                   *testing.T
	sc                  dataloader.ShardConfig
	q                   dataloader.LeaseQueue
	epochs, batch, each int
	leaseAhead          int
	balance             bool
	noLineage           bool // never call SetLineage (a user's own loop)
	lostFails           bool // ErrLeaseLost fails the round (and is expected)
	lost                int  // calls that failed with it
	procs               []*simProc
	fault               func(j *simJob, p simPoint) string

	hist        []simStep
	checkpoints []*simCommit // every commit every rank held, as a durable store would keep them
	restoreFrom *simCommit   // a whole-job restart restores this checkpoint
	sameLineage bool         // ... without a new lineage
	changed     bool         // membership changed at this boundary
	rounds      int
	empty       int // global batches that trained nothing while the epoch was not done
	steps       int
}

// sampleOf is the value of sample i of the test dataset.
func sampleOf(i int) int { return 100000 + i }

func samples(n int) dataloader.Dataset[int] {
	return dataloader.FromFunc(n, func(_ context.Context, i int) (int, error) { return sampleOf(i), nil })
}

func collateSamples(_ context.Context, s []int, _ []int) ([]int, error) {
	return append([]int(nil), s...), nil
}

// newSimJob makes a job of workers processes over 2000 samples in shards
// of 50 (leases of a minute: waiting for one to expire shows), 2 epochs,
// global batches of 60 (20 per rank of 3), a commit every 4 steps; opts
// may change the job before the processes start.
func newSimJob(t *testing.T, mk newQueue, workers int, opts ...func(j *simJob)) *simJob {
	sc := dataloader.ShardConfig{DatasetLen: 2000, ShardSize: 50, LeaseTTL: time.Minute}
	j := &simJob{t: t, sc: sc, q: mk(t, sc), epochs: 2, batch: 60, each: 4, leaseAhead: 4, fault: noFault}
	for _, o := range opts {
		o(j)
	}
	for range workers {
		j.spawn()
	}
	return j
}

// spawn starts a new process (a worker joining the job).
func (j *simJob) spawn() *simProc {
	id := len(j.procs)
	q := &procQueue{LeaseQueue: j.q}
	cfg := dataloader.DefaultLeasedConfig()
	cfg.Shards, cfg.GlobalBatch, cfg.Seed, cfg.Epochs = j.sc, j.batch, 7, j.epochs
	cfg.WorkerID, cfg.LeaseAhead, cfg.Balance = fmt.Sprintf("w%d", id), j.leaseAhead, j.balance
	cfg.BusyWait, cfg.Poll = 5*time.Millisecond, time.Millisecond
	l, err := dataloader.NewLeased(q, samples(j.sc.DatasetLen), collateSamples, cfg)
	if err != nil {
		j.t.Fatal(err)
	}
	p := &simProc{id: id, l: l, q: q, slow: 1}
	j.procs = append(j.procs, p)
	return p
}

func (j *simJob) kill(p *simProc) {
	p.dead = true
	p.q.mu.Lock()
	p.q.dead = true
	p.q.mu.Unlock()
	j.changed = true
}

// restartAll kills every process and starts n new ones that restore c.
func (j *simJob) restartAll(n int, c *simCommit, sameLineage bool) {
	for _, p := range j.procs {
		if !p.dead {
			j.kill(p)
		}
	}
	for range n {
		j.spawn()
	}
	j.restoreFrom, j.sameLineage = c, sameLineage
}

// parallel runs f for every member at once, as the ranks of a round do.
func parallel(members []*simProc, f func(rank int, p *simProc) error) []error {
	errs := make([]error, len(members))
	var wg gosync.WaitGroup
	for r, p := range members {
		wg.Go(func() { errs[r] = f(r, p) })
	}
	wg.Wait()
	return errs
}

// run takes part in rounds until the job is finished; an error is
// returned only from a Restore, for tests that expect one.
func (j *simJob) run(ctx context.Context) error {
	t := j.t
	for round := 1; ; round++ {
		if round > 20 || ctx.Err() != nil {
			t.Fatalf("round %d (%v): the job does not finish", round, ctx.Err())
		}
		j.rounds++
		j.changed = false
		var members []*simProc
		for _, p := range j.procs {
			if !p.dead {
				members = append(members, p)
			}
		}
		// The trainer's agreement: the newest commit every holder holds;
		// without holders a checkpoint (new lineage) or a fresh start.
		var agreed *simCommit
		for _, p := range members {
			if p.latest != nil && (agreed == nil || p.latest.step < agreed.step) {
				agreed = p.latest
			}
		}
		switch {
		case agreed != nil:
			// The trainer's choice: the lowest rank whose latest commit has
			// the agreed step is the root, and it sends its commit of that
			// step (its previous one when both have it: global batches that
			// train nothing commit without moving the step, so commits of
			// one step differ in their loader state, and any of them must
			// do).
			step := agreed.step
			agreed = nil
			for _, p := range members {
				if p.latest == nil || p.latest.step != step {
					continue
				}
				for _, c := range []*simCommit{p.latest, p.prev} {
					if c != nil && c.step == step {
						agreed = c
					}
				}
				break
			}
			for _, p := range members {
				if p.latest != nil && p.latest.step != step && (p.prev == nil || p.prev.step != step) {
					t.Fatalf("round %d: process %d lacks the commit of step %d", round, p.id, step)
				}
			}
		case j.restoreFrom != nil:
			agreed = &simCommit{step: j.restoreFrom.step, lineage: rand.Uint64(), state: j.restoreFrom.state}
			if j.sameLineage {
				agreed.lineage = j.restoreFrom.lineage
			}
			j.restoreFrom = nil
		default:
			agreed = &simCommit{lineage: rand.Uint64()}
		}
		j.hist = j.hist[:agreed.step]
		for _, p := range members {
			p.latest, p.prev = agreed, nil
		}
		W := len(members)
		errs := parallel(members, func(rank int, p *simProc) error {
			if !j.noLineage {
				p.l.SetLineage(agreed.lineage)
			}
			return p.l.Restore(ctx, agreed.state, rank, W)
		})
		for rank, err := range errs {
			if err != nil {
				return fmt.Errorf("round %d rank %d: restore: %w", round, rank, err)
			}
		}
		// (the barrier: every Restore returned)
		if j.train(ctx, round, members, agreed.lineage) {
			return nil
		}
	}
}

// train runs the steps of one round; it reports whether the job is done.
func (j *simJob) train(ctx context.Context, round int, members []*simProc, lineage uint64) bool {
	t := j.t
	W := len(members)
	step := int64(len(j.hist))
	for {
		j.steps++
		if j.steps > 2000 {
			t.Fatalf("%d steps: the job does not finish", j.steps)
		}
		batches := make([]dataloader.Batch[[]int], W)
		errs := parallel(members, func(rank int, p *simProc) error {
			var err error
			batches[rank], err = p.l.Next(ctx)
			return err
		})
		if j.roundFailed(members, errs, "next") {
			return false
		}
		epoch := batches[0].Epoch
		for r, b := range batches {
			if b.Epoch != epoch {
				t.Fatalf("step %d: rank %d serves epoch %d, rank 0 epoch %d", step+1, r, b.Epoch, epoch)
			}
			for i, x := range b.Data {
				if x != sampleOf(b.Indices[i]) {
					t.Fatalf("rank %d: sample %d is %d, want %d", r, b.Indices[i], x, sampleOf(b.Indices[i]))
				}
			}
		}
		if epoch >= j.epochs {
			return true
		}
		died := false
		for r, p := range members {
			if j.fault(j, simPoint{at: "took", step: step, epoch: epoch, round: round, rank: r, p: p}) == die {
				j.kill(p)
				died = true
			}
		}
		if died {
			return false // the step's allreduce fails: nobody applies it
		}
		o := dataloader.StepOutcome{Samples: make([]int, W), ComputeSeconds: make([]float64, W), EpochDone: make([]bool, W)}
		total, allDone := 0, true
		for r, b := range batches {
			o.Samples[r], o.EpochDone[r] = len(b.Indices), b.EpochDone
			o.ComputeSeconds[r] = 1e-6 * float64(len(b.Indices)) * members[r].slow
			total += len(b.Indices)
			allDone = allDone && b.EpochDone
		}
		if total > 0 {
			step++
			s := simStep{epoch: epoch}
			for _, b := range batches {
				s.indices = append(s.indices, b.Indices)
			}
			j.hist = append(j.hist, s)
		} else if !allDone {
			j.empty++
		}
		o.Step = step
		commits := make([]bool, W)
		errs = parallel(members, func(rank int, p *simProc) error {
			var err error
			commits[rank], err = p.l.Stepped(ctx, o)
			return err
		})
		if j.roundFailed(members, errs, "stepped") {
			return false
		}
		for r := range commits {
			if commits[r] != commits[0] {
				t.Fatalf("step %d: Stepped asks for a commit on rank 0 (%v) but not on rank %d", step, commits[0], r)
			}
		}
		if commits[0] || (total > 0 && step%int64(j.each) == 0) {
			if !j.commit(ctx, simPoint{step: step, epoch: epoch, round: round, empty: total == 0, allDone: allDone}, members, lineage) {
				return false
			}
		}
		j.fault(j, simPoint{at: "boundary", step: step, epoch: epoch, round: round, empty: total == 0, allDone: allDone})
		if j.changed {
			return false
		}
	}
}

// commit is the trainer's commit at this step boundary; it reports whether
// the round goes on.
func (j *simJob) commit(ctx context.Context, at simPoint, members []*simProc, lineage uint64) bool {
	t := j.t
	step := at.step
	W := len(members)
	parts := make([][]byte, W)
	errs := parallel(members, func(rank int, p *simProc) error {
		var err error
		parts[rank], err = p.l.State(ctx)
		p.q.mu.Lock()
		p.q.leasesSinceSet = 0
		p.q.mu.Unlock()
		return err
	})
	if j.roundFailed(members, errs, "state") {
		return false
	}
	merged := make([][]byte, W)
	errs = parallel(members, func(rank int, p *simProc) error {
		var err error
		merged[rank], err = p.l.MergeStates(parts)
		return err
	})
	if j.roundFailed(members, errs, "merge") {
		return false
	}
	for r := range merged {
		if !bytes.Equal(merged[r], merged[0]) {
			t.Fatalf("step %d: rank %d merged other bytes than rank 0", step, r)
		}
	}
	c := &simCommit{step: step, lineage: lineage, state: merged[0]}
	everyone := true
	for r, p := range members {
		at.at, at.rank, at.p = "hold", r, p
		a := j.fault(j, at)
		switch a {
		case goOn, holdThenDie, dieAfterAcks:
			p.prev, p.latest = p.latest, c
		default:
			everyone = false
		}
		switch a {
		case die, holdThenDie:
			j.kill(p)
			everyone = false
		case dieAfterAcks:
			p.q.mu.Lock()
			p.q.dieAfterAcks = p.q.acks + 1
			p.q.mu.Unlock()
		}
	}
	if !everyone {
		return false // the barrier after the commit fails: no Committed
	}
	j.checkpoints = append(j.checkpoints, c)
	errs = parallel(members, func(rank int, p *simProc) error { return p.l.Committed(ctx) })
	return !j.roundFailed(members, errs, "committed")
}

// roundFailed reports whether any call failed; a process whose queue died
// is dead, any other error fails the test.
func (j *simJob) roundFailed(members []*simProc, errs []error, what string) bool {
	failed := false
	for r, err := range errs {
		if err == nil {
			continue
		}
		failed = true
		if j.lostFails && errors.Is(err, dataloader.ErrLeaseLost) {
			j.lost++
			continue // the round fails; the rank lives on
		}
		if !errors.Is(err, errKilled) {
			j.t.Fatalf("rank %d (process %d): %s: %v", r, members[r].id, what, err)
		}
		members[r].dead = true
	}
	return failed
}

// check asserts exactly once over the final history.
func (j *simJob) check() {
	t := j.t
	n := j.sc.DatasetLen
	count := make([][]int, j.epochs)
	for e := range count {
		count[e] = make([]int, n)
	}
	last := 0
	for i, s := range j.hist {
		if s.epoch < last || s.epoch >= j.epochs {
			t.Fatalf("step %d of the history is in epoch %d after epoch %d", i+1, s.epoch, last)
		}
		last = s.epoch
		for _, idx := range s.indices {
			for _, x := range idx {
				count[s.epoch][x]++
			}
		}
	}
	missing, dups := 0, 0
	for e := range count {
		for _, c := range count[e] {
			switch {
			case c == 0:
				missing++
			case c > 1:
				dups += c - 1
			}
		}
	}
	t.Logf("%d rounds, %d steps in the history, %d empty global batches; %d missing, %d duplicates",
		j.rounds, len(j.hist), j.empty, missing, dups)
	if missing != 0 || dups != 0 {
		t.Fatalf("not exactly once: %d samples missing, %d duplicates over %d epochs of %d", missing, dups, j.epochs, n)
	}
	// At the end of an epoch one global batch trains nothing while the
	// last consumed shards are acked; a few more may follow a restore
	// there. Many more mean that the survivors waited for a dead
	// worker's lease (of a minute) to expire.
	if limit := 2*j.epochs + 2*j.rounds; j.empty > limit {
		t.Errorf("%d global batches trained nothing (limit %d): a lease was waited for instead of revoked", j.empty, limit)
	}
}

func noFault(*simJob, simPoint) string { return goOn }

// splitCommit is a kill inside a commit: at the first commit where at
// holds, ranks 0 and 1 hold it and rank 2 does not (its commit failed,
// it lives on); rank 0 dies right after holding it. The survivors hold
// different newest commits, and the next round restores the older.
func splitCommit(at func(p simPoint) bool) func(*simJob, simPoint) string {
	fired := int64(-1)
	return func(j *simJob, p simPoint) string {
		if p.at != "hold" || (fired >= 0 && p.step != fired) || (fired < 0 && !at(p)) || p.round != 1 {
			return goOn
		}
		fired = p.step
		switch p.rank {
		case 0:
			return holdThenDie
		case 2:
			return fail
		}
		return goOn
	}
}

func TestLeasedExactlyOnce(t *testing.T) {
	cases := []struct {
		name   string
		rounds int // 0: not checked
		setup  func(j *simJob)
		fault  func() func(*simJob, simPoint) string
	}{
		{"NoFault", 1, nil, func() func(*simJob, simPoint) string { return noFault }},
		// The commit of step 8 lands on ranks 0 and 1 only; rank 0 dies;
		// the next round restores step 4 (the '11679 missing' case of
		// acking after one's own commit).
		{"KillInsideCommit", 2, nil, func() func(*simJob, simPoint) string {
			return splitCommit(func(p simPoint) bool { return p.step == 8 })
		}},
		// The same at the commit of the first global batch of epoch 0
		// that trained nothing (the last shards consumed, not yet acked).
		{"KillInsideCommitOnEmptyStep", 2, nil, func() func(*simJob, simPoint) string {
			return splitCommit(func(p simPoint) bool { return p.epoch == 0 && p.empty && !p.allDone })
		}},
		// The same at the commit where epoch 0 ended everywhere: the next
		// round restores the last commit of epoch 0 while the ranks hold
		// leases of epoch 1.
		{"KillInsideCommitAtEpochEnd", 2, nil, func() func(*simJob, simPoint) string {
			return splitCommit(func(p simPoint) bool { return p.epoch == 0 && p.allDone })
		}},
		// Rank 1 holds the commit of step 12, acks one shard in Committed
		// and dies; the survivors hold step 12 and restore it.
		{"KillAfterAck", 2, nil, func() func(*simJob, simPoint) string {
			return func(j *simJob, p simPoint) string {
				if p.at == "hold" && p.step == 12 && p.rank == 1 && p.round == 1 {
					return dieAfterAcks
				}
				return goOn
			}
		}},
		// Rank 0 runs out of its committed leases, leases more (leases no
		// commit records) and dies before the next commit: the survivors
		// revoke its leases at once instead of waiting a minute for them.
		{"ReclaimDeadRanksLeases", 2, func(j *simJob) { j.leaseAhead = 1 }, func() func(*simJob, simPoint) string {
			return func(j *simJob, p simPoint) string {
				if p.at == "took" && p.rank == 0 && p.round == 1 && p.step > 16 {
					p.p.q.mu.Lock()
					n := p.p.q.leasesSinceSet
					p.p.q.mu.Unlock()
					if n > 0 {
						return die
					}
				}
				return goOn
			}
		}},
		// 3 -> 2 -> 3: rank 2 dies after step 10, a new worker joins after
		// step 30 (in epoch 0) and another process dies at the start of epoch 1
		// only to be replaced after step 50.
		{"Rescale3to2to3", 0, nil, func() func(*simJob, simPoint) string {
			return func(j *simJob, p simPoint) string {
				if p.at != "boundary" {
					return goOn
				}
				switch p.step {
				case 10, 40:
					if live(j) == 3 {
						j.kill(lastLive(j))
					}
				case 30, 50:
					if live(j) == 2 {
						j.spawn()
						j.changed = true
					}
				}
				return goOn
			}
		}},
		// Every process dies after step 26; three new ones restore the
		// newest commit (step 24, every rank amid a shard), in a new
		// lineage.
		{"WholeRestartFromNewestCommit", 2, nil, func() func(*simJob, simPoint) string {
			return restartAt(26, 3, func(j *simJob) *simCommit { return j.checkpoints[len(j.checkpoints)-1] }, false)
		}},
		// Every process dies after step 26, two new ones restore an older
		// checkpoint (step 12) in a new lineage: the commits after it had
		// acked shards, which the fork must not lose.
		{"WholeRestartFromOlderCheckpoint", 2, nil, func() func(*simJob, simPoint) string {
			return restartAt(26, 2, func(j *simJob) *simCommit { return commitAt(j, 12) }, false)
		}},
		// The same, without any lineage (a loop that never calls
		// SetLineage) from the newest commit: the same generation goes on.
		{"WholeRestartNoLineage", 2, func(j *simJob) { j.noLineage = true }, func() func(*simJob, simPoint) string {
			return restartAt(26, 3, func(j *simJob) *simCommit { return j.checkpoints[len(j.checkpoints)-1] }, true)
		}},
		// Every lease of the epoch is lost while the next round forms
		// (as when a recovery outlasts the lease TTL: the leases expire and
		// other workers take them): the commit every survivor holds (step
		// 16, whose consumed leases Committed never acked, since rank 0
		// died first) has only stale tokens. Restore must still serve each
		// sample once: consumed shards are not served when leased again,
		// partly trained ones resume where they stopped.
		{"LeasesLostBeforeRestore", 2, nil, func() func(*simJob, simPoint) string {
			return func(j *simJob, p simPoint) string {
				if p.at == "hold" && p.step == 16 && p.round == 1 && p.rank == 0 {
					steal(j, p.p.l.QueueEpoch(p.epoch))
					return holdThenDie
				}
				return goOn
			}
		}},
		// The same in the middle of a round (after step 18): the ranks
		// find out at the next commit, whose acks fail with ErrLeaseLost;
		// the round fails and the next one restores that commit.
		{"LeasesLostMidRound", 2, func(j *simJob) { j.lostFails = true }, func() func(*simJob, simPoint) string {
			return func(j *simJob, p simPoint) string {
				if p.at == "boundary" && p.step == 18 && p.round == 1 {
					steal(j, j.procs[0].l.QueueEpoch(p.epoch))
				}
				return goOn
			}
		}},
		// Speed-weighted shares with rank 1 three times slower.
		{"BalancedSlowRank", 1, func(j *simJob) { j.balance = true }, func() func(*simJob, simPoint) string { return noFault }},
	}
	for _, qc := range leaseQueues {
		t.Run(qc.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
					defer cancel()
					var opts []func(*simJob)
					if c.setup != nil {
						opts = append(opts, c.setup)
					}
					j := newSimJob(t, qc.make, 3, opts...)
					if j.balance {
						j.procs[1].slow = 3
					}
					j.fault = c.fault()
					if err := j.run(ctx); err != nil {
						t.Fatal(err)
					}
					j.check()
					if j.lostFails && j.lost == 0 {
						t.Error("no call failed with ErrLeaseLost")
					}
					if c.rounds > 0 && j.rounds != c.rounds {
						t.Errorf("%d rounds, want %d", j.rounds, c.rounds)
					}
					if j.balance {
						// The last epoch's: the Balancer measures a few
						// steps before its first move and keeps each move
						// on trial for 10 steps, so the split settles
						// within about 30 of the first epoch's 34 steps
						// (at 3/7, 1/7, 3/7 of each global batch).
						per := make([]int, 3)
						for _, s := range j.hist {
							for r, idx := range s.indices {
								if s.epoch == j.epochs-1 {
									per[r] += len(idx)
								}
							}
						}
						t.Logf("samples by rank in the last epoch: %v", per)
						if per[1]*2 > per[0] || per[1]*2 > per[2] {
							t.Errorf("the slow rank trained %d samples, the others %d and %d: want under half", per[1], per[0], per[2])
						}
					}
				})
			}
		})
	}
}

// steal revokes every lease of queue epoch qe and leases every shard it
// can as another worker: what leases that expire during a long recovery
// come to.
func steal(j *simJob, qe int) {
	ctx := context.Background()
	if _, err := j.q.Reclaim(ctx, qe, nil); err != nil {
		j.t.Fatal(err)
	}
	for {
		_, err := j.q.Lease(ctx, qe, "thief")
		if errors.Is(err, dataloader.ErrNoShardFree) || errors.Is(err, dataloader.ErrEpochDone) {
			return
		}
		if err != nil {
			j.t.Fatal(err)
		}
	}
}

func live(j *simJob) int {
	n := 0
	for _, p := range j.procs {
		if !p.dead {
			n++
		}
	}
	return n
}

func lastLive(j *simJob) *simProc {
	for i := len(j.procs) - 1; i >= 0; i-- {
		if !j.procs[i].dead {
			return j.procs[i]
		}
	}
	return nil
}

func commitAt(j *simJob, step int64) *simCommit {
	for _, c := range j.checkpoints {
		if c.step == step {
			return c
		}
	}
	j.t.Fatalf("no checkpoint of step %d", step)
	return nil
}

func restartAt(step int64, n int, from func(j *simJob) *simCommit, sameLineage bool) func(*simJob, simPoint) string {
	done := false
	return func(j *simJob, p simPoint) string {
		if p.at == "boundary" && p.step == step && !done {
			done = true
			j.restartAll(n, from(j), sameLineage)
		}
		return goOn
	}
}

// TestLeasedRestoreFromOlderCheckpointWithoutLineage: a whole-job restart
// from a checkpoint older than acks in the queue, in the same lineage, is
// refused with ErrHistoryDiverged instead of losing the shards acked after
// it.
func TestLeasedRestoreFromOlderCheckpointWithoutLineage(t *testing.T) {
	for _, qc := range leaseQueues {
		t.Run(qc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			j := newSimJob(t, qc.make, 3)
			j.noLineage = true
			j.fault = restartAt(26, 3, func(j *simJob) *simCommit { return commitAt(j, 12) }, true)
			err := j.run(ctx)
			if !errors.Is(err, dataloader.ErrHistoryDiverged) {
				t.Fatalf("restore of an older checkpoint in the same lineage: %v, want ErrHistoryDiverged", err)
			}
		})
	}
}
