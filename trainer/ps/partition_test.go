package ps

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/internal/atomicfile"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The partition is driven here through its contract, as the trainer's loop
// drives it: N ranks in one test process, each with a real parameter-server
// Transport and a real Ring (the round's Comm) over loopback TCP.
//
// Gradients are multiples of 1/4 and the tables start at zero, so every
// sum of pushes is exact in float32 whatever the order: the tables after a
// global step are bit for bit the same at any world size and any split of
// the step over the ranks (also under Adagrad, which updates a row from
// its summed gradient alone). So a disturbed run is compared with an
// undisturbed one at another world size, bit for bit.

// tables: one SGD and one Adagrad table.
func tables() []paramserver.TableSpec {
	return []paramserver.TableSpec{
		{Name: "users", Rows: 37, Dim: 4, Optimizer: paramserver.NewSparseSGD(0.25)},
		{Name: "items", Rows: 23, Dim: 3, Optimizer: paramserver.NewSparseAdagrad(0.5)},
	}
}

// contribution is one sparse gradient row of a global step.
type contribution struct {
	table int
	row   int64
	grad  []float32
}

// contributions returns the rows global step g pushes, a pure function of g.
func contributions(g int64) []contribution {
	rng := mrand.New(mrand.NewPCG(uint64(g), 0x5053))
	specs := tables()
	out := make([]contribution, 24)
	for i := range out {
		t := rng.IntN(len(specs))
		c := contribution{table: t, row: rng.Int64N(specs[t].Rows), grad: make([]float32, specs[t].Dim)}
		for k := range c.grad {
			c.grad[k] = float32(rng.IntN(9)-4) / 4
		}
		out[i] = c
	}
	return out
}

type rank struct {
	part *Partition
	comm *sync.Transport // the trainer's own transport: the round's Comm
}

type job struct {
	t     *testing.T
	dir   string
	scfg  sync.Config
	ckpts driver.CheckpointStore
	round uint64
	async bool // PSAsync mode
}

func newJob(t *testing.T) *job {
	scfg := sync.DefaultConfig()
	var b [6]byte
	rand.Read(b[:])
	scfg.JobID = fmt.Sprintf("ps-%s-%x", strings.ReplaceAll(t.Name(), "/", "_"), b)
	scfg.Secret = []byte("partition test secret, 32 bytes.")
	scfg.DialTimeout, scfg.OpTimeout = 10*time.Second, 20*time.Second
	return &job{t: t, dir: t.TempDir(), scfg: scfg}
}

// newRank starts a worker: a Partition on the job's directory, listening.
func (j *job) newRank() *rank {
	j.t.Helper()
	cfg := DefaultConfig()
	cfg.Tables, cfg.Dir, cfg.Sync, cfg.KeepSteps, cfg.Checkpoints = tables(), j.dir, j.scfg, 3, j.ckpts
	if j.async {
		cfg.PS.Mode = paramserver.Async
	}
	p, err := New(cfg)
	if err != nil {
		j.t.Fatal(err)
	}
	if _, err := p.Listen(context.Background()); err != nil {
		j.t.Fatal(err)
	}
	comm, err := sync.Listen(context.Background(), "127.0.0.1:0", j.scfg)
	if err != nil {
		j.t.Fatal(err)
	}
	r := &rank{part: p, comm: comm}
	j.t.Cleanup(r.kill)
	return r
}

// kill ends a worker's process: its memory is gone, Dir stays.
func (r *rank) kill() {
	r.part.Close()
	r.comm.Close()
}

func (j *job) newRanks(n int) []*rank {
	rs := make([]*rank, n)
	for i := range rs {
		rs[i] = j.newRank()
	}
	return rs
}

// restore runs a round's Restore on every rank (in rank order) and returns
// each rank's error.
func (j *job) restore(rs []*rank, step int64, source string, manifests [][]byte) []error {
	j.round++
	psAddrs, commAddrs := make([]string, len(rs)), make([]string, len(rs))
	for i, r := range rs {
		psAddrs[i], commAddrs[i] = r.part.tr.Addr(), r.comm.Addr()
	}
	published := int64(-1) // as the trainer tells it: the newest checkpoint its store lists
	if j.ckpts != nil {
		if steps, err := j.ckpts.List(context.Background()); err == nil && len(steps) > 0 {
			published = steps[0]
		}
	}
	errs := make([]error, len(rs))
	rings := make([]*sync.Ring, len(rs))
	var wg stdsync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			ctx := context.Background()
			ring, err := r.comm.Connect(ctx, sync.World{Round: j.round, Rank: i, Addrs: commAddrs})
			if err != nil {
				errs[i] = err
				return
			}
			rings[i] = ring
			errs[i] = r.part.Restore(ctx, driver.PartitionRound{
				World: sync.World{Round: j.round, Rank: i, Addrs: psAddrs}, Step: step,
				Source: source, Manifests: manifests, Published: published, Comm: ring})
		})
	}
	wg.Wait()
	for _, ring := range rings {
		if ring != nil {
			ring.Close()
		}
	}
	return errs
}

func (j *job) mustRestore(rs []*rank, step int64, source string, manifests [][]byte) {
	j.t.Helper()
	for i, err := range j.restore(rs, step, source, manifests) {
		if err != nil {
			j.t.Fatalf("rank %d restoring step %d (%s): %v", i, step, source, err)
		}
	}
}

// train runs global steps from+1..to: each rank pulls the rows of its
// share of the step's contributions and pushes them.
func (j *job) train(rs []*rank, from, to int64) {
	j.t.Helper()
	specs := tables()
	ctx := context.Background()
	for g := from + 1; g <= to; g++ {
		cs := contributions(g)
		for ri, r := range rs {
			batches := make([]paramserver.Rows, len(specs))
			for t := range batches {
				batches[t].Table = t
			}
			for i, c := range cs {
				if i%len(rs) == ri {
					b := &batches[c.table]
					b.IDs = append(b.IDs, c.row)
					b.Values = append(b.Values, c.grad...)
				}
			}
			pulled := make([]paramserver.Rows, len(batches))
			for t, b := range batches {
				pulled[t] = paramserver.Rows{Table: t, IDs: b.IDs, Values: make([]float32, len(b.Values))}
			}
			if err := r.part.Pull(ctx, pulled...); err != nil {
				j.t.Fatalf("step %d rank %d: pull: %v", g, ri, err)
			}
			if err := r.part.Push(ctx, batches...); err != nil {
				j.t.Fatalf("step %d rank %d: push: %v", g, ri, err)
			}
		}
	}
}

func (j *job) commit(rs []*rank, step int64) {
	j.t.Helper()
	eachRank(j.t, rs, func(_ int, r *rank) error { return r.part.Commit(context.Background(), step) })
}

func (j *job) checkpoint(rs []*rank, step int64) [][]byte {
	j.t.Helper()
	out := make([][]byte, len(rs))
	eachRank(j.t, rs, func(i int, r *rank) error {
		var err error
		out[i], err = r.part.Checkpoint(context.Background(), step)
		return err
	})
	return out
}

func (j *job) endRound(rs []*rank) {
	j.t.Helper()
	eachRank(j.t, rs, func(_ int, r *rank) error { return r.part.EndRound(context.Background()) })
}

func eachRank(t *testing.T, rs []*rank, f func(int, *rank) error) {
	t.Helper()
	errs := make([]error, len(rs))
	var wg stdsync.WaitGroup
	for i, r := range rs {
		wg.Go(func() { errs[i] = f(i, r) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
}

// pullAll returns every row of every table as rank r sees it now.
func pullAll(t *testing.T, r *rank) [][]float32 {
	t.Helper()
	var batches []paramserver.Rows
	for ti, sp := range tables() {
		b := paramserver.Rows{Table: ti, IDs: make([]int64, sp.Rows), Values: make([]float32, sp.Rows*int64(sp.Dim))}
		for i := range b.IDs {
			b.IDs[i] = int64(i)
		}
		batches = append(batches, b)
	}
	if err := r.part.Pull(context.Background(), batches...); err != nil {
		t.Fatalf("pull of every row: %v", err)
	}
	out := make([][]float32, len(batches))
	for i, b := range batches {
		out[i] = b.Values
	}
	return out
}

func sameTables(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	for ti := range want {
		if fmt.Sprint(got[ti]) != fmt.Sprint(want[ti]) {
			t.Fatalf("%s: table %d differs:\n got %v\nwant %v", what, ti, got[ti], want[ti])
		}
	}
}

// reference returns the tables after global steps 1..n of an undisturbed
// job of one rank.
func reference(t *testing.T, n int64) [][]float32 {
	t.Helper()
	j := newJob(t)
	rs := j.newRanks(1)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, n)
	return pullAll(t, rs[0])
}

// A failure rolls back to the last commit: the pushes after it are
// discarded on every shard, and training the same steps again gives the
// undisturbed job's tables bit for bit.
func TestCommitRestore(t *testing.T) {
	j := newJob(t)
	rs := j.newRanks(3)
	if err := rs[0].part.Pull(context.Background()); !errors.Is(err, ErrNoRound) {
		t.Fatalf("pull before the first round: %v", err)
	}
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 4)
	j.commit(rs, 4)
	j.train(rs, 4, 6) // applied, never committed
	// The round fails: no EndRound; the next round restores commit 4.
	j.mustRestore(rs, 4, "commit", nil)
	sameTables(t, "restored commit 4", pullAll(t, rs[1]), reference(t, 4))
	j.train(rs, 4, 9)
	j.commit(rs, 9)
	sameTables(t, "after the rollback", pullAll(t, rs[2]), reference(t, 9))
	got, err := rs[0].part.Tables(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sameTables(t, "Tables of the last commit", got, reference(t, 9))
}

// A rank is lost (its process and memory gone): the survivors restore the
// commit onto fewer shards, the dead rank's rows from Dir.
func TestRankLost(t *testing.T) {
	j := newJob(t)
	rs := j.newRanks(3)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 5)
	j.commit(rs, 5)
	j.train(rs, 5, 6)
	rs[1].kill()
	survivors := []*rank{rs[0], rs[2]}
	j.mustRestore(survivors, 5, "commit", nil)
	sameTables(t, "after the loss of rank 1", pullAll(t, survivors[0]), reference(t, 5))
	j.train(survivors, 5, 8)
	j.commit(survivors, 8)
	sameTables(t, "trained on", pullAll(t, survivors[1]), reference(t, 8))
}

// Rescale 3 -> 2 -> 3: a rank leaves gracefully (EndRound everywhere), then
// a new worker joins; rows move between live owners, and the result is
// the undisturbed job's.
func TestRescale323(t *testing.T) {
	j := newJob(t)
	rs := j.newRanks(3)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 4)
	j.commit(rs, 4)
	j.endRound(rs)
	rs[2].kill() // left
	two := rs[:2]
	j.mustRestore(two, 4, "commit", nil)
	j.train(two, 4, 7)
	j.commit(two, 7)
	j.endRound(two)
	three := append(two, j.newRank()) // a joiner knows nothing of step 7
	j.mustRestore(three, 7, "commit", nil)
	sameTables(t, "3 -> 2 -> 3", pullAll(t, three[2]), reference(t, 7))
	j.train(three, 7, 10)
	j.commit(three, 10)
	sameTables(t, "trained on at 3", pullAll(t, three[0]), reference(t, 10))
}

// publish is the trainer's part of a checkpoint, as rank 0 does it once
// every rank's Checkpoint returned: one atomic write of a blob naming every
// rank's manifest.
func publish(t *testing.T, st driver.CheckpointStore, step int64, manifests [][]byte) error {
	t.Helper()
	b, err := json.Marshal(manifests)
	if err != nil {
		t.Fatal(err)
	}
	return st.Save(context.Background(), step, b)
}

// A whole-job restart from a checkpoint at another world size (3 -> 2 and
// 3 -> 4): every process is new, the commits of the checkpoint's step are
// pruned from Dir long since, rows come from the checkpoint's files alone;
// then a rank is lost before the first commit and its rows are still found.
func TestWholeRestartFromCheckpoint(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			j := newJob(t)
			rs := j.newRanks(3)
			j.mustRestore(rs, 0, "init", nil)
			j.train(rs, 0, 4)
			j.commit(rs, 4)
			man := j.checkpoint(rs, 4)
			for s := int64(4); s < 16; s += 3 { // commits 7, 10, 13, 16 prune step 4's files
				j.train(rs, s, s+3)
				j.commit(rs, s+3)
			}
			for _, r := range rs {
				r.kill() // SIGKILL, every worker
			}
			ents, _ := filepath.Glob(filepath.Join(j.dir, "step-*"))
			if len(ents) != 3 {
				t.Fatalf("Dir holds %d commit steps, want KeepSteps=3: %v", len(ents), ents)
			}

			again := j.newRanks(n)
			j.mustRestore(again, 4, "checkpoint", man)
			sameTables(t, "restored checkpoint", pullAll(t, again[n-1]), reference(t, 4))
			// The steps after the checkpoint belonged to the abandoned
			// history: gone from Dir.
			if ents, _ := filepath.Glob(filepath.Join(j.dir, "step-*")); len(ents) != 1 {
				t.Fatalf("after the restore Dir holds %v, want only the restored step", ents)
			}
			again[0].kill()
			rest := again[1:]
			j.mustRestore(rest, 4, "commit", nil)
			sameTables(t, "rank lost after the restart", pullAll(t, rest[0]), reference(t, 4))
			j.train(rest, 4, 8)
			j.commit(rest, 8)
			sameTables(t, "trained on", pullAll(t, rest[0]), reference(t, 8))
		})
	}
}

// Without Dir a checkpoint's manifests hold the shards, encoded from the
// commit in the hosts' memory: a whole-job restart onto 2 or 4 ranks
// restores the tables of the checkpoint's step bit for bit from them alone
// (the commits after it are gone with the processes), and a manifest
// damaged in a shard's bytes, truncated, or missing a rank's part is
// refused (ErrPartitionLost) rather than restored.
func TestWholeRestartFromInlineCheckpoint(t *testing.T) {
	j := newJob(t)
	j.dir = "" // no shared directory
	rs := j.newRanks(3)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 4)
	j.commit(rs, 4)
	man := j.checkpoint(rs, 4)
	j.train(rs, 4, 7)
	j.commit(rs, 7)
	for _, r := range rs {
		if !r.part.InlineCheckpoint() {
			t.Fatal("a partition without Dir does not say its manifests hold its shards")
		}
		r.kill()
	}
	for _, n := range []int{2, 4} {
		again := j.newRanks(n)
		j.mustRestore(again, 4, "checkpoint", man)
		sameTables(t, fmt.Sprintf("restored onto %d ranks", n), pullAll(t, again[n-1]), reference(t, 4))
		peers, stored := int64(0), int64(0)
		for _, r := range again {
			p, s := r.part.Restored()
			peers, stored = peers+p, stored+s
		}
		if stored == 0 {
			t.Fatalf("%d ranks restored %d rows from peers and none from the checkpoint", n, peers)
		}
		for _, r := range again {
			r.kill()
		}
	}
	damaged := slices.Clone(man[0])
	damaged[len(inlineMagic)+40] ^= 0xff // inside the first shard's rows
	for name, bad := range map[string][][]byte{
		"damaged":   {damaged, man[1], man[2]},
		"truncated": {man[0][:len(man[0])-9], man[1], man[2]},
		"rank gone": {man[0], man[2]},
	} {
		t.Run(name, func(t *testing.T) {
			errs := j.restore(j.newRanks(1), 4, "checkpoint", bad)
			if !errors.Is(errs[0], trainer.ErrPartitionLost) {
				t.Fatalf("%v, want ErrPartitionLost", errs[0])
			}
			if name == "damaged" && !errors.Is(errs[0], paramserver.ErrCorruptShard) {
				t.Fatalf("%v, want ErrCorruptShard", errs[0])
			}
		})
	}
}

// A manifest that does not describe this partition's checkpoint, or files
// that do not match it, end Run (ErrPartitionLost) rather than restoring
// something else.
func TestBadCheckpoint(t *testing.T) {
	j := newJob(t)
	rs := j.newRanks(2)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 3)
	j.commit(rs, 3)
	man := j.checkpoint(rs, 3)
	var m manifest
	if err := json.Unmarshal(man[0], &m); err != nil || len(m.Files) != 1 {
		t.Fatalf("rank 0's manifest %s: %v", man[0], err)
	}
	edit := func(f func(*manifest)) [][]byte {
		var c manifest
		json.Unmarshal(man[0], &c)
		f(&c)
		b, _ := json.Marshal(c)
		return [][]byte{b, man[1]}
	}
	for name, bad := range map[string][][]byte{
		"none":         nil,
		"garbage":      {[]byte("{not json"), man[1]},
		"other step":   edit(func(c *manifest) { c.Step = 4 }),
		"other tables": edit(func(c *manifest) { c.Tables = "0" }),
		"other name":   edit(func(c *manifest) { c.Name = "embeddings" }),
		"shard twice":  {man[1], man[1]},
		"shard gone":   {man[1]},
		"escape":       edit(func(c *manifest) { c.Files[0].Path = "../" + c.Files[0].Path }),
		"wrong size":   edit(func(c *manifest) { c.Files[0].Size++ }),
	} {
		t.Run(name, func(t *testing.T) {
			for i, err := range j.restore(j.newRanks(2), 3, "checkpoint", bad) {
				if !errors.Is(err, trainer.ErrPartitionLost) {
					t.Fatalf("rank %d: %v, want ErrPartitionLost", i, err)
				}
			}
		})
	}
	// A file damaged in place (same size): the rank loading it refuses it.
	p := filepath.Join(j.dir, filepath.FromSlash(m.Files[0].Path))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil { // in place: the same inode as the commit's file
		t.Fatal(err)
	}
	errs := j.restore(j.newRanks(1), 3, "checkpoint", man)
	if !errors.Is(errs[0], trainer.ErrPartitionLost) || !errors.Is(errs[0], paramserver.ErrCorruptShard) {
		t.Fatalf("damaged file: %v", errs[0])
	}
}

// pushOnly runs global step g on the ranks of rs listed in who: the others'
// StepFunc failed before they pushed.
func (j *job) pushOnly(rs []*rank, g int64, who ...int) {
	j.t.Helper()
	cs := contributions(g)
	for _, ri := range who {
		var b paramserver.Rows
		for i, c := range cs {
			if i%len(rs) == ri && c.table == 0 {
				b.IDs = append(b.IDs, c.row)
				b.Values = append(b.Values, c.grad...)
			}
		}
		if err := rs[ri].part.Push(context.Background(), b); err != nil {
			j.t.Fatalf("rank %d: push: %v", ri, err)
		}
	}
}

// A rank's StepFunc fails after the others pushed (PSSync: the shards wait
// for its push). Whatever the others do next is an error within the
// transport's OpTimeout, never a hang: their next Pull and their Commit
// fail with sync.ErrTimeout; when the failed rank leaves, their EndRound
// fails at once naming it; when it stays and every rank ends the round
// together (the trainer's decision after the failed step), EndRound
// succeeds. The next round restores the last commit and the job's tables
// are the undisturbed job's.
func TestStepFailedAfterOthersPushed(t *testing.T) {
	guard := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Minute) // a hang would end here instead of in ErrTimeout
	}
	t.Run("next pull and commit", func(t *testing.T) {
		j := newJob(t)
		j.scfg.OpTimeout = time.Second
		rs := j.newRanks(3)
		j.mustRestore(rs, 0, "init", nil)
		j.train(rs, 0, 2)
		j.commit(rs, 2)
		j.pushOnly(rs, 3, 0, 2)
		ctx, cancel := guard()
		defer cancel()
		if err := rs[0].part.Pull(ctx, paramserver.Rows{Table: 0, IDs: []int64{1}, Values: make([]float32, 4)}); !errors.Is(err, sync.ErrTimeout) {
			t.Fatalf("rank 0's next pull: %v, want sync.ErrTimeout", err)
		}
		// The round is broken on every rank: rank 0 failed it.
		for i, r := range rs[1:] {
			if err := r.part.Commit(ctx, 3); err == nil {
				t.Fatalf("rank %d committed a step rank 1 never pushed", i+1)
			}
		}
		j.mustRestore(rs, 2, "commit", nil)
		j.train(rs, 2, 5)
		sameTables(t, "after the failed step", pullAll(t, rs[1]), reference(t, 5))
	})
	t.Run("commit", func(t *testing.T) {
		j := newJob(t)
		j.scfg.OpTimeout = time.Second
		rs := j.newRanks(3)
		j.mustRestore(rs, 0, "init", nil)
		j.train(rs, 0, 2)
		j.commit(rs, 2)
		j.pushOnly(rs, 3, 0, 2)
		ctx, cancel := guard()
		defer cancel()
		if err := rs[2].part.Commit(ctx, 3); !errors.Is(err, sync.ErrTimeout) {
			t.Fatalf("rank 2's commit: %v, want sync.ErrTimeout", err)
		}
	})
	t.Run("failed rank leaves", func(t *testing.T) {
		j := newJob(t)
		j.scfg.OpTimeout = 20 * time.Second // the peer's exit is noticed, not timed out
		rs := j.newRanks(3)
		j.mustRestore(rs, 0, "init", nil)
		j.train(rs, 0, 2)
		j.commit(rs, 2)
		j.pushOnly(rs, 3, 0, 2)
		rs[1].kill() // its Run returned ErrStepFailed
		ctx, cancel := guard()
		defer cancel()
		for _, i := range []int{0, 2} {
			err := rs[i].part.EndRound(ctx)
			var pe *sync.PeerError
			if !errors.As(err, &pe) || pe.Rank != 1 {
				t.Fatalf("rank %d's EndRound: %v, want a *sync.PeerError naming rank 1", i, err)
			}
		}
		two := []*rank{rs[0], rs[2]}
		j.mustRestore(two, 2, "commit", nil)
		j.train(two, 2, 5)
		sameTables(t, "without the failed rank", pullAll(t, two[1]), reference(t, 5))
	})
	t.Run("every rank ends the round", func(t *testing.T) {
		j := newJob(t)
		rs := j.newRanks(3)
		j.mustRestore(rs, 0, "init", nil)
		j.train(rs, 0, 2)
		j.commit(rs, 2)
		j.pushOnly(rs, 3, 0, 2)
		j.endRound(rs)
		j.mustRestore(rs, 2, "commit", nil)
		j.train(rs, 2, 5)
		sameTables(t, "after the failed step", pullAll(t, rs[0]), reference(t, 5))
	})
}

var errCrash = errors.New("simulated crash")

// restoresTo checks that a whole-job restart from the checkpoint of step
// (its manifests man) onto n new workers gives the undisturbed tables.
func (j *job) restoresTo(n int, step int64, man [][]byte, want [][]float32) {
	j.t.Helper()
	rs := j.newRanks(n)
	j.mustRestore(rs, step, "checkpoint", man)
	sameTables(j.t, fmt.Sprintf("restart from checkpoint %d", step), pullAll(j.t, rs[0]), want)
	for _, r := range rs {
		r.kill()
	}
}

// A crash at every point of a checkpoint's save (every rank's Checkpoint,
// the pruning of an older checkpoint's shards, the trainer's publication
// and its pruning) leaves every checkpoint the trainer lists loadable: a
// whole-job restart at another world size from the newest one that loads,
// and from the previous one while it is listed, gives the undisturbed
// tables of its step.
func TestCheckpointCrashAtEveryPoint(t *testing.T) {
	want := map[int64][][]float32{}
	for _, s := range []int64{2, 4, 6} {
		want[s] = reference(t, s)
	}
	for k := 0; ; k++ {
		j := newJob(t)
		st, err := checkpoint.NewLocalDir(t.TempDir(), 1)
		if err != nil {
			t.Fatal(err)
		}
		j.ckpts = st
		rs := j.newRanks(3)
		j.mustRestore(rs, 0, "init", nil)
		for s := int64(2); s <= 4; s += 2 {
			j.train(rs, s-2, s)
			j.commit(rs, s)
			if err := publish(t, st, s, j.checkpoint(rs, s)); err != nil {
				t.Fatal(err)
			}
		}
		j.train(rs, 4, 6)
		j.commit(rs, 6)

		// The save of checkpoint 6, the job dying after k points. Rank 0's
		// Checkpoint removes checkpoint 2's shards (the store lists only 4).
		seen := 0
		restore := atomicfile.SetFaultHook(func(atomicfile.Op, string) error {
			if seen++; seen > k {
				return errCrash
			}
			return nil
		})
		var cerr error
		man := make([][]byte, len(rs))
		for i, r := range rs {
			if man[i], cerr = r.part.Checkpoint(context.Background(), 6); cerr != nil {
				break
			}
		}
		if cerr == nil {
			cerr = publish(t, st, 6, man)
		}
		restore()
		for _, r := range rs {
			r.kill()
		}
		if cerr != nil && !errors.Is(cerr, errCrash) {
			t.Fatalf("point %d: the save failed without a crash: %v", k, cerr)
		}

		steps, err := st.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if cerr == nil && (len(steps) != 1 || steps[0] != 6) {
			t.Fatalf("the save passed every point but the store lists %v", steps)
		}
		for i, s := range steps {
			b, err := st.Load(context.Background(), s)
			if err != nil {
				t.Fatalf("crash after %d points: listed checkpoint %d does not load: %v", k, s, err)
			}
			var m [][]byte
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			j.restoresTo(2+2*i, s, m, want[s])
		}
		if cerr == nil {
			t.Logf("a checkpoint's save has %d crash points", k)
			return
		}
	}
}

// The checkpoint directories of the newest published checkpoint stay
// until a later one is published, however many later checkpoints fail to
// be published (each failure fails its round, and the next round is told
// the older one is the newest published) and however many commits prune
// Dir; once a later one is published, the older ones go, except those the
// trainer's store still lists when Config.Checkpoints is set.
func TestCheckpointKeptUntilALaterOneIsPublished(t *testing.T) {
	for _, withStore := range []bool{false, true} {
		t.Run(fmt.Sprintf("Checkpoints=%v", withStore), func(t *testing.T) {
			j := newJob(t)
			st, err := checkpoint.NewLocalDir(t.TempDir(), 2)
			if err != nil {
				t.Fatal(err)
			}
			j.ckpts = st
			if !withStore {
				j.ckpts = nil // the partitions do not list the store; the test publishes to it
			}
			published := func() int64 { s, _ := st.List(context.Background()); return append(s, -1)[0] }
			rs := j.newRanks(2)
			j.mustRestore(rs, 0, "init", nil)
			j.train(rs, 0, 3)
			j.commit(rs, 3)
			man3 := j.checkpoint(rs, 3)
			if err := publish(t, st, 3, man3); err != nil {
				t.Fatal(err)
			}
			for s := int64(3); s < 12; s += 3 { // checkpoints 6, 9, 12 are never published
				j.train(rs, s, s+3)
				j.commit(rs, s+3)
				j.checkpoint(rs, s+3)
				j.ckpts = st
				if published() != 3 {
					t.Fatal("the store lists a checkpoint the test never published")
				}
				j.mustRestore(rs, s+3, "commit", nil) // the failed publication failed the round
				if !withStore {
					j.ckpts = nil
				}
			}
			dirs := func() map[int64]int {
				out := map[int64]int{}
				m, err := rs[0].part.listCkptDirs()
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range m {
					out[s]++
				}
				return out
			}
			if d := dirs(); d[3] != 2 || len(d) != 4 {
				t.Fatalf("checkpoint directories by step %v, want two of each of 3, 6, 9, 12", d)
			}
			j.restoresTo(3, 3, man3, reference(t, 3))

			// Checkpoints 15 and 18 are published in one round; the store
			// (keep 2) lists both.
			for s := int64(12); s < 18; s += 3 {
				j.train(rs, s, s+3)
				j.commit(rs, s+3)
				if err := publish(t, st, s+3, j.checkpoint(rs, s+3)); err != nil {
					t.Fatal(err)
				}
			}
			j.train(rs, 18, 21)
			j.commit(rs, 21)
			j.checkpoint(rs, 21)
			want := "map[18:2 21:2]" // the newest published and later ones
			if withStore {
				want = "map[15:2 18:2 21:2]" // and every one the store lists
			}
			if d := dirs(); fmt.Sprint(d) != want {
				t.Fatalf("checkpoint directories by step %v, want %s", d, want)
			}
			j.restoresTo(1, 18, man18(t, st), reference(t, 18))
		})
	}
}

// man18 reads the manifests of the checkpoint of step 18 from st.
func man18(t *testing.T, st driver.CheckpointStore) [][]byte {
	t.Helper()
	b, err := st.Load(context.Background(), 18)
	if err != nil {
		t.Fatal(err)
	}
	var m [][]byte
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// In PSAsync mode a shard applies each push at once; the trainer commits
// after every rank's pushes of the step arrived, so a commit holds the
// rows of its step, and a restore onto fewer ranks gives them back exactly.
// (Only the SGD table then equals the undisturbed job: Adagrad applied per
// push depends on how the step was split over the ranks.)
func TestAsyncCommitRestoreRescale(t *testing.T) {
	j := newJob(t)
	j.async = true
	rs := j.newRanks(3)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 4)
	j.commit(rs, 4)
	at4 := pullAll(t, rs[1])
	j.train(rs, 4, 6)
	rs[2].kill()
	two := rs[:2]
	j.mustRestore(two, 4, "commit", nil)
	sameTables(t, "restored onto 2", pullAll(t, two[0]), at4)
	j.train(two, 4, 8)
	j.commit(two, 8)
	sameTables(t, "trained on (SGD table)", pullAll(t, two[1])[:1], reference(t, 8)[:1])
}

// emptyStep is a global batch in which no rank got a sample: every rank
// pushes nothing, the shards count it, the trainer does not.
func (j *job) emptyStep(rs []*rank) {
	j.t.Helper()
	for i, r := range rs {
		if err := r.part.Push(context.Background()); err != nil {
			j.t.Fatalf("rank %d: empty push: %v", i, err)
		}
	}
}

// A member that missed rounds (fenced, then back) may hold a record of
// the trainer's commit of the same step from a history since rolled back,
// with another shards' step: the newest round's record wins, and the
// stale member's in-memory commits of that history are dropped.
func TestStaleRecordOfAFencedRank(t *testing.T) {
	j := newJob(t)
	rs := j.newRanks(3)
	j.mustRestore(rs, 0, "init", nil)
	j.train(rs, 0, 2)
	j.commit(rs, 2)
	j.emptyStep(rs) // history A: trainer step 4 is the shards' step 5
	j.train(rs, 2, 4)
	j.commit(rs, 4)
	// Rank 2 is fenced; ranks 0 and 1 go on from commit 2 (say rank 1
	// lacked commit 4), in history B, where step 4 is the shards' step 4.
	two := rs[:2]
	j.mustRestore(two, 2, "commit", nil)
	j.train(two, 2, 4)
	j.commit(two, 4)
	// Rank 2 is back.
	j.mustRestore(rs, 4, "commit", nil)
	sameTables(t, "history B's commit 4", pullAll(t, rs[2]), reference(t, 4))
	if c := rs[2].part.ps.Commits(); slices.Contains(c, 5) {
		t.Fatalf("the fenced rank still holds history A's commit of shards' step 5: %v", c)
	}
	j.train(rs, 4, 6)
	j.commit(rs, 6)
	sameTables(t, "trained on", pullAll(t, rs[0]), reference(t, 6))
}

// TestConfigTakesSyncNames: a Config written with sync's deprecated
// parameter-server names (as before they moved to sync/paramserver) is
// the same Config and validates.
func TestConfigTakesSyncNames(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tables = []sync.TableSpec{{Name: "emb", Rows: 8, Dim: 2, Optimizer: sync.NewSparseAdam(0.01)}}
	cfg.PS = sync.DefaultPSConfig()
	cfg.PS.Mode = sync.PSSync
	cfg.Dir = t.TempDir()
	cfg.Sync.JobID, cfg.Sync.Secret = "sync-names", []byte("a secret of at least 16 bytes")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var _ paramserver.TableSpec = cfg.Tables[0]
}
