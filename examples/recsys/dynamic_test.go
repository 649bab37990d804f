package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	gosync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/sync"
)

// The tests below drive the data plane of -dynamic (the dyn methods, called
// in the order worker.round calls them) for three in-process ranks over
// real Rings on loopback and the real Redis shard queue, without the model
// or the parameter server: a step takes each rank's share and allreduces
// the control values, a commit is prepareCommit, the model's commit (a
// snapshot of the data state), then committed. The rounds, the agreement
// on the newest commit every member holds and the exactly-once audit are
// the worker's (the same audit records, checked by verifyAudit). Faults are
// injected at named points of a rank's step, deterministically: where the
// outcome depends on what other ranks did first, the fault waits for them.

// simPoint is where in a step a fault is injected.
type simPoint int

const (
	atTook        simPoint = iota // the rank took its share (before the step's allreduce)
	atModelCommit                 // the model's commit of the step: failing here fails it
	atCommitted                   // after the model's commit, before dyn.committed
)

// simAction is what a fault does.
type simAction int

const (
	proceed simAction = iota
	die               // the rank's process dies: it leaves the round for good
	fail              // the operation fails: the round ends, the rank rejoins
)

type simCommit struct {
	step int64
	data dynState
}

type simRank struct {
	id           int
	tr           *sync.Transport
	d            *dyn
	latest, prev *simCommit
	step         int64
	dead         bool
}

type simJob struct {
	t                   *testing.T
	epochs, batch, each int // epochs, global batch, steps between commits
	ranks               []*simRank
	audit               string
	fault               func(r *simRank, step int64, at simPoint) simAction

	mu     gosync.Mutex
	log    *os.File
	empty  int // steps that trained nothing while the epoch was not done
	rounds int
}

func newSimJob(t *testing.T, workers int, scfg dataloader.ShardConfig) *simJob {
	t.Helper()
	q, err := redisqueue.New(testredis.Client(t), redisqueue.Config{Shards: scfg, JobID: testredis.JobID(t), KeyTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	j := &simJob{t: t, epochs: 2, batch: 60, each: 4, audit: filepath.Join(t.TempDir(), "audit.log")}
	if j.log, err = os.Create(j.audit); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.log.Close() })
	secret := make([]byte, 16)
	rand.Read(secret)
	cfg := sync.DefaultConfig()
	cfg.JobID, cfg.Secret, cfg.OpTimeout, cfg.SharedMemory = testredis.JobID(t), secret, 20*time.Second, false
	for i := range workers {
		tr, err := sync.Listen(context.Background(), "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		j.ranks = append(j.ranks, &simRank{id: i, tr: tr,
			d: &dyn{q: q, cfg: scfg, seed: 7, worker: fmt.Sprintf("w%d", i), log: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	}
	return j
}

func (j *simJob) auditf(format string, a ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	fmt.Fprintf(j.log, format, a...)
}

// run takes part in rounds of the live ranks until the job is finished.
func (j *simJob) run(ctx context.Context) {
	j.t.Helper()
	for round := uint64(1); ; round++ {
		var members []*simRank
		for _, r := range j.ranks {
			if !r.dead {
				members = append(members, r)
			}
		}
		if len(members) == 0 || round > 10 {
			j.t.Fatalf("round %d with %d live ranks: the job does not finish", round, len(members))
		}
		// The newest commit every member holds (worker.round's agreement).
		var agreed *simCommit
		for _, r := range members {
			if r.latest != nil && (agreed == nil || r.latest.step < agreed.step) {
				agreed = r.latest
			}
		}
		if agreed == nil { // a fresh start
			var g [4]byte
			rand.Read(g[:])
			agreed = &simCommit{data: dynState{Gen: binary.LittleEndian.Uint32(g[:])}}
			for _, r := range members {
				r.latest = agreed
			}
		}
		var states []*simCommit
		for _, r := range members {
			switch {
			case r.latest != nil && r.latest.step == agreed.step:
				states = append(states, r.latest)
			case r.prev != nil && r.prev.step == agreed.step:
				states = append(states, r.prev)
			default:
				j.t.Fatalf("rank %d holds neither commit of step %d", r.id, agreed.step)
			}
		}
		j.rounds++
		j.auditf("R %d %d\n", round, states[0].step)
		addrs := make([]string, len(members))
		for i, r := range members {
			addrs[i] = r.tr.Addr()
		}
		finished := make([]bool, len(members))
		errs := make([]error, len(members))
		var wg gosync.WaitGroup
		for i, r := range members {
			wg.Go(func() { finished[i], errs[i] = j.member(ctx, round, i, addrs, r, states[i]) })
		}
		wg.Wait()
		done := true
		for i, r := range members {
			if !finished[i] {
				done = false
				j.t.Logf("round %d: rank %d (worker %d) dead=%v: %v", round, i, r.id, r.dead, errs[i])
			}
		}
		if done {
			return
		}
		if ctx.Err() != nil {
			j.t.Fatalf("round %d: %v", round, ctx.Err())
		}
	}
}

var errSimFault = errors.New("injected fault")

// member is one rank's part in a round: worker.round's -dynamic path.
func (j *simJob) member(ctx context.Context, round uint64, rank int, addrs []string, r *simRank, st *simCommit) (finished bool, err error) {
	r.latest, r.prev, r.step = st, nil, st.step
	comm, err := r.tr.Connect(ctx, sync.World{Round: round, Rank: rank, Addrs: addrs})
	if err != nil {
		return false, err
	}
	defer comm.Close()
	d := r.d
	if err := d.startRound(ctx, comm, st.data); err != nil {
		return false, fmt.Errorf("start: %w", err)
	}
	W := len(addrs)
	const cN, cDone, cSamples = 0, 1, 2
	cCompute := cSamples + W
	ctl := make([]float64, cCompute+W)
	act := func(step int64, at simPoint) simAction {
		a := j.fault(r, step, at)
		if a == die {
			r.dead = true
		}
		return a
	}
	for {
		if d.epoch >= j.epochs {
			// worker.finish: nobody leaves before every rank is done.
			return true, comm.Barrier(ctx)
		}
		epoch := d.epoch
		idx, epochDone, err := d.next(ctx, shares(j.batch, d.speed)[rank])
		if err != nil {
			return false, err
		}
		if a := act(r.step+1, atTook); a != proceed {
			return false, errSimFault
		}
		clear(ctl)
		ctl[cN] = float64(len(idx))
		if epochDone {
			ctl[cDone] = 1
		}
		// Every rank equally fast: 1 us per sample.
		ctl[cSamples+rank], ctl[cCompute+rank] = float64(len(idx)), 1e-6*float64(len(idx))
		if err := comm.AllReduceFloat64(ctx, ctl, sync.OpSum); err != nil {
			return false, err
		}
		r.step++
		j.auditf("S %d %d %d %d %s\n", round, r.step, rank, epoch, joinInts(idx))
		n := ctl[cN]
		if rank == 0 && n == 0 && int(ctl[cDone]) < W {
			j.mu.Lock()
			j.empty++
			j.mu.Unlock()
		}
		due := r.step%int64(j.each) == 0
		if d.stepped(n, int(ctl[cDone]), ctl[cSamples:cSamples+W], ctl[cCompute:cCompute+W]) {
			due = true
		}
		if !due {
			continue
		}
		data, err := d.prepareCommit(ctx, comm, j.each*shares(j.batch, d.speed)[rank])
		if err != nil {
			return false, err
		}
		if a := act(r.step, atModelCommit); a != proceed {
			return false, errSimFault
		}
		r.prev, r.latest = r.latest, &simCommit{step: r.step, data: data}
		if a := act(r.step, atCommitted); a != proceed {
			return false, errSimFault
		}
		if err := d.committed(ctx, comm); err != nil {
			return false, err
		}
	}
}

// splitCommit is the fault of the tester's log ("step 320: commit: sync:
// rank 0 of round 1 lost"): the commit of the first step where at(r, step)
// holds succeeds on workers 0 and 1 and fails on worker 2, and worker 0
// dies right after its own commit. The survivors (1 and 2) hold different
// newest commits, so the next round goes on from the older one.
func splitCommit(at func(r *simRank, step int64) bool) func(r *simRank, step int64, p simPoint) simAction {
	var mu gosync.Mutex
	fired := map[int]int64{} // worker -> step the fault fires at
	spent := false           // worker 2 failed: the fault is over
	committed := make(chan struct{}, 2)
	firing := func(r *simRank, step int64) bool {
		mu.Lock()
		defer mu.Unlock()
		if spent {
			return false
		}
		if s, ok := fired[r.id]; ok {
			return s == step
		}
		if at(r, step) {
			fired[r.id] = step
			return true
		}
		return false
	}
	return func(r *simRank, step int64, p simPoint) simAction {
		if p == atTook || r.dead || !firing(r, step) {
			return proceed
		}
		switch {
		case r.id == 2 && p == atModelCommit:
			<-committed // workers 0 and 1 hold the commit of step
			<-committed
			mu.Lock()
			spent = true
			mu.Unlock()
			return fail
		case r.id != 2 && p == atCommitted:
			committed <- struct{}{}
			if r.id == 0 {
				return die
			}
		}
		return proceed
	}
}

func TestDynamicShardsSurviveFaults(t *testing.T) {
	// 2000 samples in 40 shards of 50, a global batch of 60 (20 per rank),
	// a commit every 4 steps: 34 steps per epoch with data, the last one
	// not a commit's.
	// Leases far longer than a recovery: waiting for one to expire shows.
	scfg := dataloader.ShardConfig{DatasetLen: 2000, ShardSize: 50, LeaseTTL: 10 * time.Second}
	for _, c := range []struct {
		name   string
		rounds int
		fault  func(t *testing.T) func(r *simRank, step int64, p simPoint) simAction
	}{
		{"NoFault", 1, func(t *testing.T) func(*simRank, int64, simPoint) simAction {
			return func(*simRank, int64, simPoint) simAction { return proceed }
		}},
		// The commit of step 8 lands on workers 0 and 1 only; worker 0
		// dies; the next round restores step 4.
		{"SplitCommit", 2, func(t *testing.T) func(*simRank, int64, simPoint) simAction {
			return splitCommit(func(_ *simRank, step int64) bool { return step == 8 })
		}},
		// The same at the commit of the step that ended epoch 0: the next
		// round restores the last commit of epoch 0, while every rank
		// already leased shards of epoch 1.
		{"SplitCommitAtEpochEnd", 2, func(t *testing.T) func(*simRank, int64, simPoint) simAction {
			return splitCommit(func(r *simRank, _ int64) bool { return r.d.epoch == 1 })
		}},
		// The same at the commit of the first step of epoch 0 that
		// trained nothing (the last shards are consumed, not yet acked).
		{"SplitCommitOnEmptyStep", 2, func(t *testing.T) func(*simRank, int64, simPoint) simAction {
			return splitCommit(func(r *simRank, _ int64) bool { return r.d.wait && r.d.epoch == 0 })
		}},
		// Worker 0 runs out of data between commits, leases more (a lease
		// no commit records) and dies in step 10.
		{"DieHoldingLeaseTakenAfterCommit", 2, func(t *testing.T) func(*simRank, int64, simPoint) simAction {
			return func(r *simRank, step int64, p simPoint) simAction {
				if r.id == 0 && step == 10 && p == atTook {
					if err := r.d.prefetch(context.Background(), 1000); err != nil {
						t.Error(err)
					}
					return die
				}
				return proceed
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			j := newSimJob(t, 3, scfg)
			j.fault = c.fault(t)
			start := time.Now()
			j.run(ctx)
			rep, err := verifyAudit(j.audit, &config{epochs: j.epochs, dynamic: true}, scfg.DatasetLen)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d rounds, %.2f s; %d empty steps; audit: %d samples, %d missing, %d duplicates",
				j.rounds, time.Since(start).Seconds(), j.empty, rep.Samples, rep.Missing, rep.Duplicates)
			if rep.Missing != 0 || rep.Duplicates != 0 || rep.Samples != j.epochs*scfg.DatasetLen {
				t.Errorf("audit: %d samples (want %d), %d missing, %d duplicates", rep.Samples, j.epochs*scfg.DatasetLen, rep.Missing, rep.Duplicates)
			}
			if j.rounds != c.rounds {
				t.Errorf("%d rounds, want %d", j.rounds, c.rounds)
			}
			// At an epoch's end a step or two train nothing while the
			// last shards are acked; more mean that the survivors waited
			// for a dead worker's lease to expire.
			if j.empty > 2*j.epochs {
				t.Errorf("%d steps trained nothing: the survivors waited for a dead worker's lease to expire", j.empty)
			}
		})
	}
}
