package ps_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/audit"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/ps"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// The partition through the trainer's own loop: in-process workers, each
// with a trainer, a Partition and real TCP transports, training a tiny
// embedding regression (y = a[user] + b, the embeddings on the parameter
// server, b dense) while workers are killed, join and the whole job
// restarts from a checkpoint at another world size.

const (
	users   = 40
	samples = 960
)

type sample struct {
	user int64
	y    float32
}

func dataset() []sample {
	out := make([]sample, samples)
	for i := range out {
		u := int64(i*7) % users
		out[i] = sample{user: u, y: float32(u)/users - 0.5 + 0.25}
	}
	return out
}

var errStepFunc = errors.New("the step function failed")

// collate copies: the loader reuses its slice of samples.
func collate(_ context.Context, s []sample, _ []int) ([]sample, error) { return slices.Clone(s), nil }

// worker is one in-process worker of the job.
type worker struct {
	part   *ps.Partition
	tr     *trainer.Trainer[[]sample]
	bias   []float32
	cancel context.CancelFunc
	res    trainer.Result
	err    error
	done   chan struct{}
	rounds chan trainer.RoundInfo
	steps  chan int64
}

type tjob struct {
	t      *testing.T
	id     string
	store  store.Store
	dir    string
	ckpt   driver.CheckpointStore
	audit  *audit.Memory
	epochs int
	batch  int
	// failAt, when set, makes the StepFunc of worker i fail, before its
	// push, at the global step it returns (0: never).
	failAt func(i int) int64
	n      int // workers started
	// inMemory: no Dir and no checkpoint store; commits live in the
	// workers' memory only (rank 0 keeps the tables at round ends).
	inMemory bool
	// noDir: no Dir, but the checkpoint store: checkpoints hold the
	// shards, encoded from memory, written in the background.
	noDir bool
	// ckpts receives the step of every checkpoint written (any worker's).
	ckpts chan int64
	wg    stdsync.WaitGroup
	// hold, when set, runs in worker i's OnStep after the step is sent
	// on its steps channel (on its loop goroutine: it holds the job).
	hold func(i int, step int64)
	// pending, when set, is called whenever worker pendingIdx's Join
	// answer says it waits to be taken in.
	pending    func()
	pendingIdx int
}

func newTJob(t *testing.T) *tjob {
	ck, err := checkpoint.NewLocalDir(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	return &tjob{t: t, id: fmt.Sprintf("psjob-%d", time.Now().UnixNano()), store: store.NewMemory(),
		dir: t.TempDir(), ckpt: ck, audit: &audit.Memory{}, epochs: 3, batch: 32, ckpts: make(chan int64, 1024)}
}

func logger() *slog.Logger {
	if os.Getenv("ELASTICTRAIN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (j *tjob) start() *worker {
	j.t.Helper()
	idx := j.n
	j.n++
	secret := []byte("trainer partition test, 32 bytes")
	pcfg := ps.DefaultConfig()
	pcfg.Tables = []paramserver.TableSpec{{Name: "a", Rows: users, Dim: 1, Optimizer: paramserver.NewSparseSGD(0.3)}}
	pcfg.Dir, pcfg.Checkpoints, pcfg.Logger = j.dir, j.ckpt, logger()
	opts := []trainer.Option{trainer.WithCheckpointStore(j.ckpt)}
	if j.inMemory {
		pcfg.Dir, pcfg.Checkpoints, pcfg.KeepTables, opts = "", nil, true, nil
	}
	if j.noDir {
		pcfg.Dir, pcfg.Checkpoints, pcfg.KeepTables = "", nil, true
	}
	pcfg.Sync.JobID, pcfg.Sync.Secret, pcfg.Sync.OpTimeout = j.id, secret, 5*time.Second
	part, err := ps.New(pcfg)
	if err != nil {
		j.t.Fatal(err)
	}
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = j.batch, 5
	loader, err := dataloader.New(dataloader.FromSlice(dataset()), collate, dcfg)
	if err != nil {
		j.t.Fatal(err)
	}
	w := &worker{part: part, bias: make([]float32, 1), done: make(chan struct{}),
		rounds: make(chan trainer.RoundInfo, 64), steps: make(chan int64, 4096)}
	grad := make([]float32, 1)
	params := []trainer.Param{{Name: "b", Shape: []int{1}, Value: w.bias, Grad: grad}}
	var steps int64
	step := func(ctx context.Context, b dataloader.Batch[[]sample]) (float64, error) {
		steps++
		if j.failAt != nil && j.failAt(idx) == steps {
			return 0, errStepFunc // after the others pushed (or while they push): their shards wait for this rank
		}
		rows := paramserver.Rows{Table: 0, IDs: make([]int64, len(b.Data)), Values: make([]float32, len(b.Data))}
		for i, s := range b.Data {
			rows.IDs[i] = s.user
		}
		if err := part.Pull(ctx, rows); err != nil {
			return 0, err
		}
		loss, g := 0.0, paramserver.Rows{Table: 0, IDs: rows.IDs, Values: make([]float32, len(b.Data))}
		grad[0] = 0
		for i, s := range b.Data {
			d := rows.Values[i] + w.bias[0] - s.y
			loss += 0.5 * float64(d) * float64(d)
			g.Values[i] = d // per-row sums: each user has a few samples per step
			grad[0] += d
		}
		return loss, part.Push(ctx, g)
	}
	tcfg := trainer.DefaultConfig()
	tcfg.JobID, tcfg.Epochs, tcfg.CommitEvery, tcfg.CheckpointEvery = j.id, j.epochs, 5, 20
	if j.inMemory {
		tcfg.CheckpointEvery = 0
	}
	tcfg.Elastic.LeaseTTL, tcfg.Elastic.HeartbeatInterval, tcfg.Elastic.LastCall = time.Second, 100*time.Millisecond, 300*time.Millisecond
	tcfg.Elastic.MaxWorkers = 8
	tcfg.Sync.OpTimeout, tcfg.Sync.Secret = 5*time.Second, secret
	st := j.store
	if j.pending != nil && idx == j.pendingIdx {
		st = trainertest.NotifyPending(j.store, j.pending)
	}
	tr, err := trainer.New(params, optim.NewSGD(0.5), loader, step, st, tcfg, append(opts,
		trainer.WithPartition(part), trainer.WithAudit(j.audit), trainer.WithLogger(logger()),
		trainer.WithHooks(trainer.Hooks{
			OnRound: func(r trainer.RoundInfo) { w.rounds <- r },
			OnCheckpoint: func(step int64, err error) {
				if err == nil {
					select {
					case j.ckpts <- step:
					default:
					}
				}
			},
			OnStep: func(s trainer.StepInfo) {
				select {
				case w.steps <- s.Step:
				default:
				}
				if j.hold != nil {
					j.hold(idx, s.Step)
				}
			},
		}))...)
	if err != nil {
		j.t.Fatal(err)
	}
	w.tr = tr
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		defer close(w.done)
		defer loader.Close()
		w.res, w.err = tr.Run(ctx)
	}()
	return w
}

func (w *worker) waitStep(t *testing.T, s int64) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case got := <-w.steps:
			if got >= s {
				return
			}
		case <-w.done:
			t.Fatalf("worker ended before step %d: %v", s, w.err)
		case <-deadline:
			t.Fatalf("no step %d within 60 s", s)
		}
	}
}

func (j *tjob) wait(ws []*worker) {
	j.t.Helper()
	done := make(chan struct{})
	go func() { j.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(120 * time.Second):
		for _, w := range ws {
			w.cancel()
		}
		<-done
		j.t.Fatal("the job did not end within 120 s")
	}
}

func (j *tjob) expected(epoch int) []int {
	return dataloader.Order(5, epoch, samples)[:samples/j.batch*j.batch]
}

// checkFinished: every finisher holds the same dense parameter, the audit
// shows every sample of every epoch exactly once, and the embeddings fit.
func (j *tjob) checkFinished(ws []*worker) {
	t := j.t
	var fin []*worker
	for _, w := range ws {
		if w.err == nil && w.res.Finished {
			fin = append(fin, w)
		}
	}
	if len(fin) == 0 {
		t.Fatal("no worker finished")
	}
	for _, w := range fin[1:] {
		if w.bias[0] != fin[0].bias[0] {
			t.Fatalf("dense parameter %v on one rank, %v on another", fin[0].bias[0], w.bias[0])
		}
	}
	rep := audit.Verify(j.audit.Entries(), j.epochs, j.expected)
	if rep.Missing != 0 || rep.Duplicates != 0 || rep.Steps != j.epochs*samples/j.batch {
		t.Fatalf("audit: %+v", rep)
	}
	r0 := fin[0]
	for _, w := range fin {
		if w.res.Rank == 0 {
			r0 = w // with KeepTables, the rank that gathered the tables
		}
	}
	tabs, err := r0.part.Tables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for u := range int64(users) {
		want := float32(u)/users - 0.5 + 0.25
		if got := tabs[0][u] + r0.bias[0]; math.Abs(float64(got-want)) > 0.05 {
			t.Fatalf("user %d: prediction %v, want %v", u, got, want)
		}
	}
}

// A worker is killed and another joins while the job trains; the rows of
// the killed one come from its replica (or Dir), the joiner's from their
// live owners.
func TestTrainerKillAndJoin(t *testing.T) {
	j := newTJob(t)
	killAndJoin(t, j)
}

// TestTrainerKillAndJoinInMemory: the same with no Dir and no checkpoint
// store: the killed worker's rows come back from its replica's memory,
// nothing from storage, and the job finishes exactly once.
func TestTrainerKillAndJoinInMemory(t *testing.T) {
	j := newTJob(t)
	j.inMemory = true
	ws := killAndJoin(t, j)
	for _, w := range ws {
		if w.res.Rank == 0 && w.err == nil {
			if peers, stored := w.part.Restored(); peers == 0 || stored != 0 {
				t.Fatalf("restored %d rows from peers and %d from storage; want some and none", peers, stored)
			}
			if ents, err := os.ReadDir(j.dir); err != nil || len(ents) != 0 {
				t.Fatalf("the job wrote %d entries to a directory it was not given (%v)", len(ents), err)
			}
			return
		}
	}
	t.Fatal("no finisher holds rank 0")
}

// holdForJoiner makes the workers other than joiner hold at step from
// and later until worker joiner waits in the store, so that the job
// cannot end before it is taken in (under a CPU hog the job's last 50
// steps took less time than the joiner's start: world sizes [3 2]).
// Bounded at 10 s, well below any progress bound, so the hold never looks
// like a hang.
func (j *tjob) holdForJoiner(joiner int, from int64) {
	waiting := make(chan struct{})
	var once stdsync.Once
	j.pending, j.pendingIdx = func() { once.Do(func() { close(waiting) }) }, joiner
	j.hold = func(i int, step int64) {
		if i != joiner && step >= from {
			select {
			case <-waiting:
			case <-time.After(10 * time.Second):
			}
		}
	}
}

// waitCheckpoint waits up to 60 s for a checkpoint of step from or later
// to be written (j.ckpts, any worker's OnCheckpoint).
func (j *tjob) waitCheckpoint(t *testing.T, from int64) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case s := <-j.ckpts:
			if s >= from {
				return
			}
		case <-deadline:
			t.Fatalf("no checkpoint of step %d or later written within 60 s", from)
		}
	}
}

func killAndJoin(t *testing.T, j *tjob) []*worker {
	j.holdForJoiner(3, 40)
	ws := []*worker{j.start(), j.start(), j.start()}
	ws[0].waitStep(t, 20)
	ws[1].cancel() // killed: its Run ends, its memory is gone
	ws[0].waitStep(t, 40)
	ws = append(ws, j.start())
	j.wait(ws)
	if !errors.Is(ws[1].err, context.Canceled) {
		t.Fatalf("the killed worker: %v", ws[1].err)
	}
	var sizes []int
	for len(ws[0].rounds) > 0 {
		sizes = append(sizes, (<-ws[0].rounds).WorldSize)
	}
	if len(sizes) < 3 || sizes[0] != 3 || !slices.Contains(sizes, 2) || sizes[len(sizes)-1] != 3 {
		t.Fatalf("world sizes %v, want 3, then 2, then 3", sizes)
	}
	fin := []*worker{ws[0], ws[2], ws[3]}
	j.checkFinished(fin)
	return fin
}

// A whole-job restart from the checkpoint at another world size: the
// second run resumes from a checkpoint (not step 0), re-partitions the
// table over its ranks, and the audit across both runs is exactly once.
func TestTrainerWholeRestart(t *testing.T) {
	j := newTJob(t)
	first := []*worker{j.start(), j.start(), j.start()}
	// Rank 0 writes checkpoints in the background, one at a time: wait
	// for one of step 40 or later to be written, so that a slow disk
	// (fsyncs of seconds under load) cannot leave the restart with an
	// older one.
	j.waitCheckpoint(t, 40)
	first[0].waitStep(t, 50)
	for _, w := range first {
		w.cancel()
	}
	j.wait(first)
	second := []*worker{j.start(), j.start()}
	r := <-second[0].rounds
	if r.Source != "checkpoint" || r.Step < 40 {
		t.Fatalf("the second run starts from %s at step %d, want a checkpoint of step 40 or later", r.Source, r.Step)
	}
	j.wait(second)
	j.checkFinished(second)
}

// TestTrainerWholeRestartNoDir: the same with no Dir: the checkpoints hold
// the shards (encoded from the commits in memory, written by rank 0's
// checkpoint goroutine into the CheckpointStore), so the second run,
// another world size, restores every row from the checkpoint, verified
// part by part; nothing is written anywhere else.
func TestTrainerWholeRestartNoDir(t *testing.T) {
	j := newTJob(t)
	j.noDir, j.epochs = true, 10 // 300 steps: the kill at step 50 comes long before the end
	first := []*worker{j.start(), j.start(), j.start()}
	j.waitCheckpoint(t, 40) // written in the background (see TestTrainerWholeRestart)
	first[0].waitStep(t, 50)
	for _, w := range first {
		w.cancel()
	}
	j.wait(first)
	for _, w := range first {
		if w.res.Rank == 0 && (w.res.Checkpoints == 0 || w.res.CheckpointWrites == 0) {
			t.Fatalf("rank 0 took part in %d checkpoints and wrote %d; want some", w.res.Checkpoints, w.res.CheckpointWrites)
		}
	}
	second := []*worker{j.start(), j.start()}
	r := <-second[0].rounds
	if r.Source != "checkpoint" || r.Step < 40 {
		t.Fatalf("the second run starts from %s at step %d, want a checkpoint of step 40 or later", r.Source, r.Step)
	}
	j.wait(second)
	j.checkFinished(second)
	if _, stored := second[0].part.Restored(); stored != users {
		t.Fatalf("the second run restored %d rows from storage, want every row (%d)", stored, users)
	}
	if ents, err := os.ReadDir(j.dir); err != nil || len(ents) != 0 {
		t.Fatalf("the job wrote %d entries to a directory it was not given (%v)", len(ents), err)
	}
}

// TestTrainerFallsBackToCheckpoint: two of three workers die at once, so
// some shard lost its host and its one replica; instead of ending Run with
// ErrPartitionLost, the survivor rolls back to the last durable checkpoint
// (the replicated state, the tables and the loader together), a new worker
// joins, and the job finishes with every sample applied exactly once.
func TestTrainerFallsBackToCheckpoint(t *testing.T) {
	j := newTJob(t)
	j.noDir, j.epochs = true, 10 // 300 steps: the kills at step 50 come long before the end
	j.holdForJoiner(3, 60)
	ws := []*worker{j.start(), j.start(), j.start()}
	// A checkpoint is written in the background: wait for one (of step 20
	// or later) to be published, and for step 50.
	j.waitCheckpoint(t, 20)
	ws[0].waitStep(t, 50)
	ws[1].cancel() // both within microseconds: no round forms between them
	ws[2].cancel()
	ws[0].waitStep(t, 60)
	ws = append(ws, j.start())
	j.wait(ws)
	var rounds []trainer.RoundInfo
	for len(ws[0].rounds) > 0 {
		rounds = append(rounds, <-ws[0].rounds)
	}
	fell := slices.IndexFunc(rounds, func(r trainer.RoundInfo) bool { return r.Source == "checkpoint" })
	// The checkpoint restored is one that was published (every 20 steps)
	// before the two workers died (they may have trained past step 50).
	if fell < 1 || rounds[fell].Step < 20 || rounds[fell].Step%20 != 0 {
		t.Fatalf("rounds %+v (the survivor ended with %v): want one, after the first, that restores a checkpoint (of step 20 or later)", rounds, ws[0].err)
	}
	j.checkFinished([]*worker{ws[0], ws[3]})
}

// A global batch smaller than the world leaves a rank without samples at
// every step; its StepFunc still runs (and pushes nothing), so the shards,
// which wait for every rank's push in PSSync mode, go on.
func TestTrainerEmptyShares(t *testing.T) {
	j := newTJob(t)
	j.batch, j.epochs = 2, 1
	ws := []*worker{j.start(), j.start(), j.start()}
	j.wait(ws)
	for i, w := range ws {
		if w.err != nil || !w.res.Finished {
			t.Fatalf("worker %d: %+v, %v", i, w.res, w.err)
		}
	}
	rep := audit.Verify(j.audit.Entries(), j.epochs, j.expected)
	if rep.Missing != 0 || rep.Duplicates != 0 {
		t.Fatalf("audit: %+v", rep)
	}
}

// A rank's StepFunc fails after the others pushed their part of the step
// (PSSync: the shards wait for its push). Every rank ends the round on the
// step's control values (EndRound), the failed rank's Run returns
// ErrStepFailed, the others restore the last commit without it and finish:
// no hang, no sample lost or trained twice.
func TestTrainerStepFuncFailsAfterOthersPushed(t *testing.T) {
	j := newTJob(t)
	j.failAt = func(i int) int64 {
		if i == 1 {
			return 12 // CommitEvery is 5: the others roll back to commit 10
		}
		return 0
	}
	ws := []*worker{j.start(), j.start(), j.start()}
	j.wait(ws)
	if !errors.Is(ws[1].err, trainer.ErrStepFailed) || !errors.Is(ws[1].err, errStepFunc) {
		t.Fatalf("the failed rank's Run: %v, want ErrStepFailed", ws[1].err)
	}
	j.checkFinished([]*worker{ws[0], ws[2]})
}
