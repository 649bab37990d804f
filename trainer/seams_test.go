package trainer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
	. "github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// violations collects breaches of a seam's contract seen from inside the
// test doubles (which run on the trainers' goroutines).
type violations struct {
	mu   stdsync.Mutex
	list []string
}

func (v *violations) add(format string, a ...any) {
	v.mu.Lock()
	v.list = append(v.list, fmt.Sprintf(format, a...))
	v.mu.Unlock()
}

func (v *violations) check(t *testing.T) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	require.Empty(t, v.list)
}

// splitLoader is a StatefulLoader whose ranks hold different state. It
// serves a *dataloader.Loader's batches and, before the batch at every
// position p of an epoch with p%5 == 2, one global batch without samples
// (rank 0 reports EpochDone in it, the others do not), after which it asks
// for a commit. Its state is the cursor and whether that empty batch was
// served (the same on every rank), then its rank and how many batches it
// served since its Restore (its own); MergeStates keeps the common part
// after checking that the parts come in rank order.
type splitLoader struct {
	l          *dataloader.Loader[trainertest.Sample, trainertest.Batch]
	bad        *violations
	rank, size int
	cur, next  dataloader.Cursor
	emptyDone  bool
	lastEmpty  bool
	served     int
	lastStep   int64 // -1 after Restore: not known yet
	states     int   // State calls
	committed  int   // Committed calls
	empties    int   // Stepped calls for empty global batches
}

const splitCommon = dataloader.CursorSize + 1

func (s *splitLoader) Restore(_ context.Context, state []byte, rank, size int) error {
	cur := s.l.NewCursor()
	done := false
	if state != nil {
		if len(state) != splitCommon {
			return fmt.Errorf("restore: %d bytes of state, want the merged %d", len(state), splitCommon)
		}
		if err := cur.UnmarshalBinary(state[:dataloader.CursorSize]); err != nil {
			return err
		}
		done = state[dataloader.CursorSize] == 1
	}
	s.rank, s.size, s.cur, s.next, s.emptyDone, s.served, s.lastStep = rank, size, cur, cur, done, 0, -1
	return s.l.Reset(cur, rank, size)
}

func (s *splitLoader) Next(ctx context.Context) (dataloader.Batch[trainertest.Batch], error) {
	if s.cur.Step()%5 == 2 && !s.emptyDone {
		s.emptyDone, s.lastEmpty = true, true
		return dataloader.Batch[trainertest.Batch]{Epoch: s.cur.Epoch, Step: s.cur.Step(), Next: s.cur, EpochDone: s.rank == 0}, nil
	}
	b, err := s.l.Next(ctx)
	if err != nil {
		return b, err
	}
	s.lastEmpty, s.next = false, b.Next
	s.served++
	return b, nil
}

func (s *splitLoader) Stepped(_ context.Context, st LoaderStep) (bool, error) {
	if len(st.Samples) != s.size || len(st.EpochDone) != s.size || len(st.ComputeSeconds) != s.size {
		s.bad.add("rank %d: LoaderStep for %d ranks in a world of %d", s.rank, len(st.Samples), s.size)
	}
	total := 0
	for _, n := range st.Samples {
		total += n
	}
	if s.lastEmpty {
		s.empties++
		if s.lastStep >= 0 && st.Step != s.lastStep {
			s.bad.add("rank %d: an empty global batch moved the step from %d to %d", s.rank, s.lastStep, st.Step)
		}
		if total != 0 {
			s.bad.add("rank %d: an empty global batch with %d samples", s.rank, total)
		}
		for r, d := range st.EpochDone {
			if d != (r == 0) {
				s.bad.add("rank %d: EpochDone %v, want each rank's own", s.rank, st.EpochDone)
			}
		}
		s.lastStep = st.Step
		return true, nil
	}
	if s.lastStep >= 0 && st.Step != s.lastStep+1 {
		s.bad.add("rank %d: step %d after %d", s.rank, st.Step, s.lastStep)
	}
	if total == 0 || slices.Contains(st.EpochDone, true) {
		s.bad.add("rank %d: a step of %d samples with EpochDone %v", s.rank, total, st.EpochDone)
	}
	s.cur, s.emptyDone, s.lastStep = s.next, false, st.Step
	return false, nil
}

func (s *splitLoader) State(context.Context) ([]byte, error) {
	s.states++
	b, err := s.cur.MarshalBinary()
	if err != nil {
		return nil, err
	}
	done := byte(0)
	if s.emptyDone {
		done = 1
	}
	b = append(b, done)
	b = binary.LittleEndian.AppendUint16(b, uint16(s.rank))
	return binary.LittleEndian.AppendUint32(b, uint32(s.served)), nil
}

func (s *splitLoader) MergeStates(parts [][]byte) ([]byte, error) {
	for r, p := range parts {
		if len(p) != splitCommon+6 {
			return nil, fmt.Errorf("part %d of %d bytes", r, len(p))
		}
		if got := int(binary.LittleEndian.Uint16(p[splitCommon:])); got != r {
			s.bad.add("rank %d: part %d comes from rank %d", s.rank, r, got)
		}
		if !bytes.Equal(p[:splitCommon], parts[0][:splitCommon]) {
			s.bad.add("rank %d: ranks %d and 0 committed different positions", s.rank, r)
		}
	}
	return bytes.Clone(parts[0][:splitCommon]), nil
}

func (s *splitLoader) Committed(context.Context) error {
	s.committed++
	return nil
}

// noAllGather is a Backend whose rounds' Synchronizers lack sync.AllGatherer.
type noAllGather struct{ *trainertest.Backend }

func (b noAllGather) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	s, err := b.Backend.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	return struct{ sync.Synchronizer }{s}, nil
}

var (
	_ StatefulLoader[trainertest.Batch] = (*splitLoader)(nil)
	_ StateMerger                       = (*splitLoader)(nil)
	_ CommitListener                    = (*splitLoader)(nil)
)

// A StatefulLoader with per-rank state, a StateMerger and a
// CommitListener, which also serves global batches without samples: those
// are no steps (the step count and the audit do not move, the model still
// reaches the optimum), Stepped sees every rank's EpochDone, the merged
// state is what every rank restores, Committed follows every commit once
// every rank holds it; with a rank killed mid-epoch, exactly once still
// holds.
func TestStatefulLoaderProtocol(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kill    bool
		backend func(w *trainertest.Worker) []Option
	}{
		{name: "steady"},
		{name: "kill", kill: true},
		// The ring over TCP (the default Backend): allgather on a real ring.
		{name: "ring", backend: func(*trainertest.Worker) []Option { return nil }},
		// A Synchronizer without AllGather: the states travel by broadcasts.
		{name: "broadcasts", backend: func(w *trainertest.Worker) []Option {
			return []Option{WithBackend(noAllGather{w.Backend})}
		}},
	} {
		kill := tc.kill
		t.Run(tc.name, func(t *testing.T) {
			j := newMemJob(t, 480, 4, 2)
			j.backend = tc.backend
			j.cfg.Elastic.MinWorkers = 3
			if kill {
				j.cfg.Elastic.MinWorkers = 2 // the survivors go on
			}
			bad := &violations{}
			loaders := map[*trainertest.Worker]*splitLoader{}
			var mu stdsync.Mutex
			j.wrap = func(w *trainertest.Worker, l *dataloader.Loader[trainertest.Sample, trainertest.Batch]) Source[trainertest.Batch] {
				s := &splitLoader{l: l, bad: bad}
				mu.Lock()
				loaders[w] = s
				mu.Unlock()
				return s
			}
			ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
			finishers := ws
			if kill {
				j.waitStep(25)
				j.c.Kill(ws[1])
				finishers = []*trainertest.Worker{ws[0], ws[2]}
			}
			j.c.Wait()
			j.check(finishers)
			bad.check(t)
			for _, w := range finishers {
				s := loaders[w]
				require.Positive(t, s.empties, "%v", w)
				if !kill {
					require.Equal(t, 6*j.cfg.Epochs, s.empties, "every empty global batch reached Stepped once")
					require.Equal(t, s.states, s.committed, "Committed after every commit")
				}
			}
		})
	}
}

// recPart is a Partition that checks the order of the trainer's calls and
// remembers them. Its Checkpoint manifest names its rank, world size and
// step.
type recPart struct {
	name, addr  string
	bad         *violations
	rank, size  int
	listens     int
	closes      int
	endRounds   int
	commits     []int64 // since its last Restore, the restored step first
	held        []int64 // every step committed, for the restore check
	checkpoints []int64
	rounds      []PartitionRound
}

func (p *recPart) Name() string { return p.name }

func (p *recPart) Listen(context.Context) (string, error) {
	p.listens++
	return p.addr, nil
}

func (p *recPart) Restore(ctx context.Context, r PartitionRound) error {
	if p.listens != 1 {
		p.bad.add("%s: Restore after %d Listen calls", p.addr, p.listens)
	}
	if got := r.World.Addrs[r.World.Rank]; got != p.addr {
		p.bad.add("%s: restored as rank %d whose address is %q", p.addr, r.World.Rank, got)
	}
	// Every rank gets the same step (checked on the round's Synchronizer).
	v := []float64{float64(r.Step), -float64(r.Step)}
	if err := r.Comm.AllReduceFloat64(ctx, v, sync.OpMax); err != nil {
		return err
	}
	if v[0] != -v[1] {
		p.bad.add("%s: ranks restore steps from %v to %v", p.addr, -v[1], v[0])
	}
	if r.Source == "commit" && len(p.held) > 0 && !slices.Contains(p.held[max(0, len(p.held)-2):], r.Step) && r.Step > p.held[len(p.held)-1] {
		p.bad.add("%s: restores step %d, it committed %v", p.addr, r.Step, p.held)
	}
	r.Comm = nil
	p.rounds = append(p.rounds, r)
	p.rank, p.size = r.World.Rank, r.World.Size()
	p.commits = []int64{r.Step}
	return nil
}

func (p *recPart) Commit(_ context.Context, step int64) error {
	if len(p.commits) == 0 {
		p.bad.add("%s: Commit before Restore", p.addr)
	} else if last := p.commits[len(p.commits)-1]; step < last {
		p.bad.add("%s: commit of step %d after %d", p.addr, step, last)
	}
	p.commits = append(p.commits, step)
	p.held = append(p.held, step)
	return nil
}

func (p *recPart) Checkpoint(_ context.Context, step int64) ([]byte, error) {
	if len(p.commits) == 0 || p.commits[len(p.commits)-1] != step {
		p.bad.add("%s: checkpoint of step %d, its last commit is %v", p.addr, step, p.commits)
	}
	p.checkpoints = append(p.checkpoints, step)
	return fmt.Appendf(nil, "rank %d of %d at step %d", p.rank, p.size, step), nil
}

func (p *recPart) EndRound(context.Context) error {
	p.endRounds++
	return nil
}

func (p *recPart) Close() error {
	p.closes++
	return nil
}

var _ Partition = (*recPart)(nil)

// A Partition is listened on once and advertised under its name, restored
// at every round with the same step on every rank, committed at every
// commit, checkpointed with every rank at every durable checkpoint (rank
// 0 publishing every rank's manifest), told when a round ends by a
// decision, and closed once. A whole-job restart at another world size
// gives every rank the checkpoint's manifests in the writers' rank order.
func TestPartitionProtocol(t *testing.T) {
	ckpt, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	bad := &violations{}
	var nextAddr atomic.Int64
	run := func(j *memJob) map[*trainertest.Worker]*recPart {
		parts := map[*trainertest.Worker]*recPart{}
		var mu stdsync.Mutex
		j.cfg.CheckpointEvery = 10
		j.opts = func(w *trainertest.Worker) []Option {
			p := &recPart{name: "table", addr: fmt.Sprintf("table-%d", nextAddr.Add(1)), bad: bad}
			mu.Lock()
			parts[w] = p
			mu.Unlock()
			return []Option{WithPartition(p), WithCheckpointStore(ckpt)}
		}
		return parts
	}

	j := newMemJob(t, 480, 4, 1)
	j.cfg.Elastic.MinWorkers = 2
	parts := run(j)
	first := []*trainertest.Worker{j.start(), j.start()}
	j.c.Wait()
	for _, w := range first {
		res, err := w.Result()
		require.NoError(t, err)
		require.EqualValues(t, 30, res.Step)
		p := parts[w]
		require.Equal(t, 1, p.listens)
		require.Equal(t, 1, p.closes)
		require.Equal(t, 1, p.endRounds, "the end of the job is a decided end")
		require.Equal(t, []int64{10, 20, 30}, p.checkpoints, "every rank took part in every checkpoint")
		require.Equal(t, "init", p.rounds[0].Source)
		require.EqualValues(t, -1, p.rounds[0].Published)
	}
	steps, err := ckpt.List(context.Background())
	require.NoError(t, err)
	require.Equal(t, []int64{30, 20, 10}, steps)

	// A whole-job restart with three workers resumes from the final checkpoint.
	j2 := newMemJob(t, 480, 4, 2)
	j2.audit = j.audit
	j2.cfg.Elastic.MinWorkers = 3
	parts2 := run(j2)
	second := []*trainertest.Worker{j2.start(), j2.start(), j2.start()}
	j2.c.Wait()
	j2.check(second)
	for _, w := range second {
		r := parts2[w].rounds[0]
		require.Equal(t, "checkpoint", r.Source)
		require.EqualValues(t, 30, r.Step)
		require.EqualValues(t, 30, r.Published)
		require.Equal(t, [][]byte{[]byte("rank 0 of 2 at step 30"), []byte("rank 1 of 2 at step 30")}, r.Manifests)
		require.Equal(t, []int64{40, 50, 60}, parts2[w].checkpoints)
	}
	bad.check(t)
}

// With partitions, a checkpoint that rank 0 fails to publish fails the
// round on every rank (a partition takes its next Checkpoint call to mean
// the last one was published), the next round tells the partitions the
// newest checkpoint that was (PartitionRound.Published), and the one that
// failed is written at once (the catch-up of a missing due checkpoint).
func TestPartitionCheckpointPublicationFailure(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	var failed atomic.Bool
	store := &flakyStore{CheckpointStore: dir, fail: func(step int64) bool { return step == 20 && failed.CompareAndSwap(false, true) }}
	bad := &violations{}
	j := newMemJob(t, 480, 4, 2)
	j.opt = func() Optimizer { return NewSGD(0.3) }
	j.cfg.Elastic.MinWorkers = 2
	j.cfg.CheckpointEvery = 10
	parts := map[*trainertest.Worker]*recPart{}
	var mu stdsync.Mutex
	j.opts = func(w *trainertest.Worker) []Option {
		p := &recPart{name: "table", addr: fmt.Sprintf("table-%d", w.Index), bad: bad}
		mu.Lock()
		parts[w] = p
		mu.Unlock()
		return []Option{WithPartition(p), WithCheckpointStore(store)}
	}
	ws := []*trainertest.Worker{j.start(), j.start()}
	j.c.Wait()
	j.check(ws)
	bad.check(t)
	require.True(t, failed.Load())
	for _, w := range ws {
		p := parts[w]
		require.Equal(t, []int64{10, 20, 20, 30, 40, 50, 60}, p.checkpoints, "the failed one, then its catch-up")
		require.GreaterOrEqual(t, len(p.rounds), 2)
		r := p.rounds[1]
		require.Equal(t, "commit", r.Source)
		require.EqualValues(t, 20, r.Step)
		require.EqualValues(t, 10, r.Published, "the newest checkpoint that was published")
	}
	steps, err := dir.List(context.Background())
	require.NoError(t, err)
	require.Equal(t, []int64{60, 50, 40, 30, 20, 10}, steps)
}

// A preempted worker in a job with partitions: every rank takes part in
// its checkpoint, rank 0 publishes it, the preempted worker leaves with
// ErrPreempted and the others finish.
func TestPartitionCheckpointOnPreemption(t *testing.T) {
	dir, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	bad := &violations{}
	j := newMemJob(t, 480, 4, 2)
	j.opt = func() Optimizer { return NewSGD(0.3) }
	j.cfg.Elastic.MinWorkers = 2
	parts := map[*trainertest.Worker]*recPart{}
	trainers := map[int]func(){}
	var mu stdsync.Mutex
	var once stdsync.Once
	j.opts = func(w *trainertest.Worker) []Option {
		p := &recPart{name: "table", addr: fmt.Sprintf("table-%d", w.Index), bad: bad}
		mu.Lock()
		parts[w] = p
		mu.Unlock()
		return []Option{WithPartition(p), WithCheckpointStore(dir), WithHooks(Hooks{OnStep: func(s StepInfo) {
			if s.Step == 12 && s.Rank == 1 {
				once.Do(func() {
					mu.Lock()
					preempt := trainers[w.Index]
					mu.Unlock()
					preempt()
				})
			}
		}})}
	}
	ws := make([]*trainertest.Worker, 3)
	for i := range ws {
		ws[i] = j.c.Start(func(w *trainertest.Worker) (trainertest.Runner, error) {
			m := trainertest.NewModel(j.prob.Dim)
			j.models[w] = m
			dcfg := dataloader.DefaultConfig()
			dcfg.GlobalBatch, dcfg.Seed = j.batch, j.seed
			loader, err := dataloader.New(j.prob.Dataset(), j.prob.Collate, dcfg)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { loader.Close() })
			tr, err := New(m.Params(), j.opt(), loader, m.Step, w.Store, j.cfg, append(w.Options(), append(j.opts(w), WithAudit(j.audit))...)...)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			trainers[w.Index] = tr.Preempt
			mu.Unlock()
			return tr, nil
		})
	}
	j.c.Wait()
	var preempted *trainertest.Worker
	var finishers []*trainertest.Worker
	for _, w := range ws {
		if _, err := w.Result(); errors.Is(err, ErrPreempted) {
			preempted = w
		} else {
			finishers = append(finishers, w)
		}
	}
	require.NotNil(t, preempted, "one worker was preempted")
	_, err = preempted.Result()
	require.NotErrorIs(t, err, ErrCheckpoint, "its checkpoint was published")
	j.check(finishers)
	bad.check(t)
	// The preemption's checkpoint: every rank of that round took part.
	var at int64 = -1
	for _, s := range parts[preempted].checkpoints {
		at = s
	}
	require.GreaterOrEqual(t, at, int64(12))
	for _, w := range ws {
		require.Contains(t, parts[w].checkpoints, at, "%v took part in the preemption's checkpoint", w)
	}
	steps, err := dir.List(context.Background())
	require.NoError(t, err)
	require.Contains(t, steps, at)
}

// package dataloader's LeasedLoader (DLRover's dynamic sharding over a
// shard queue), driven by the trainer: three workers over one in-memory
// queue, one killed mid-epoch; every sample of every epoch is trained
// exactly once, the finishers hold the same parameters, and the model
// reaches the optimum.
func TestLeasedLoaderThroughTheTrainer(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "steady", true: "kill"}[kill], func(t *testing.T) {
			j := newMemJob(t, 480, 4, 3)
			j.opt = func() Optimizer { return NewSGD(0.3) }
			j.cfg.Elastic.MinWorkers = 3
			if kill {
				j.cfg.Elastic.MinWorkers = 2
			}
			sc := dataloader.ShardConfig{DatasetLen: len(j.prob.Samples), ShardSize: 32, LeaseTTL: 10 * time.Second}
			q, err := dataloader.NewMemoryQueue(sc)
			require.NoError(t, err)
			j.wrap = func(w *trainertest.Worker, _ *dataloader.Loader[trainertest.Sample, trainertest.Batch]) Source[trainertest.Batch] {
				lcfg := dataloader.DefaultLeasedConfig()
				lcfg.Shards, lcfg.GlobalBatch, lcfg.Seed, lcfg.Epochs = sc, j.batch, j.seed, j.cfg.Epochs
				lcfg.WorkerID = w.String()
				l, err := dataloader.NewLeased(q, j.prob.Dataset(), j.prob.Collate, lcfg)
				require.NoError(t, err)
				return l
			}
			ws := []*trainertest.Worker{j.start(), j.start(), j.start()}
			finishers := ws
			if kill {
				j.waitStep(40)
				j.c.Kill(ws[2])
				finishers = ws[:2]
			}
			j.c.Wait()
			var ref *trainertest.Model
			for _, w := range finishers {
				res, err := w.Result()
				require.NoError(t, err, "%v", w)
				require.True(t, res.Finished)
				if ref == nil {
					ref = j.models[w]
				} else {
					require.Equal(t, ref.W, j.models[w].W, "identical parameters on every rank")
				}
			}
			n := len(j.prob.Samples)
			rep := VerifyAudit(j.audit.Entries(), j.cfg.Epochs, func(e int) []int { return dataloader.Order(j.seed, e, n) })
			require.Zero(t, rep.Missing, "audit missing")
			require.Zero(t, rep.Duplicates, "audit duplicates")
			require.InDelta(t, j.prob.OptimumLoss(), ref.Loss(j.prob), 0.01)
		})
	}
}
