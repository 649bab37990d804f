package paramserver_test

import (
	"context"
	"errors"
	"fmt"
	elsync "github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	mrand "math/rand/v2"
	gosync "sync"
	"sync/atomic"
	"testing"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// countingStore counts the shards loaded from it.
type countingStore struct {
	*paramserver.MemoryShardStore
	loads atomic.Int64
}

func (s *countingStore) LoadShard(ctx context.Context, key paramserver.ShardKey) ([]byte, error) {
	s.loads.Add(1)
	return s.MemoryShardStore.LoadShard(ctx, key)
}

// psRow is one row's values and optimizer state.
type psRow struct{ val, st []float32 }

// dumpShards collects every row of every table held by the live shards of
// rs, failing if a row is held twice or not at all.
func dumpShards(t testing.TB, specs []paramserver.TableSpec, rs []*paramserver.Round) [][]psRow {
	t.Helper()
	out := make([][]psRow, len(specs))
	for tb := range specs {
		out[tb] = make([]psRow, specs[tb].Rows)
	}
	for _, r := range rs {
		var twice string
		paramserver.EachHeldRow(r, func(tb int, row int64, shard int, val, st []float32) {
			if out[tb][row].val != nil && twice == "" {
				twice = fmt.Sprintf("table %d row %d is held twice (again by shard %d on rank %d)", tb, row, shard, r.Rank())
			}
			out[tb][row] = psRow{val: append([]float32(nil), val...), st: append([]float32(nil), st...)}
		})
		if twice != "" {
			t.Fatal(twice)
		}
	}
	for tb := range out {
		for row, x := range out[tb] {
			if x.val == nil {
				t.Fatalf("table %d row %d is held by no shard", tb, row)
			}
		}
	}
	return out
}

func sameRows(t testing.TB, what string, got, want [][]psRow) {
	t.Helper()
	for tb := range want {
		for row := range want[tb] {
			g, w := got[tb][row], want[tb][row]
			if fmt.Sprint(g.val) != fmt.Sprint(w.val) || fmt.Sprint(g.st) != fmt.Sprint(w.st) {
				t.Fatalf("%s: table %d row %d: got %v/%v, want %v/%v", what, tb, row, g.val, g.st, w.val, w.st)
			}
		}
	}
}

// trainSteps runs n sync steps of random pushes on every rank.
func trainSteps(t testing.TB, rs []*paramserver.Round, specs []paramserver.TableSpec, rng *mrand.Rand, n int) {
	t.Helper()
	for range n {
		pushes := make([][]paramserver.Rows, len(rs))
		for w := range rs {
			for tb := range specs {
				pushes[w] = append(pushes[w], randomBatch(rng, specs, tb, 20))
			}
		}
		eachRank(t, "push", rs, func(w int, r *paramserver.Round) error { return r.Push(context.Background(), pushes[w]...) })
	}
}

func commitAll(t testing.TB, rs []*paramserver.Round, step int64) {
	t.Helper()
	eachRank(t, "commit", rs, func(_ int, r *paramserver.Round) error { return r.Commit(context.Background(), step) })
}

// TestPSRepartition4To3To5: 4 shards on 4 ranks train and commit; one rank
// dies and 3 ranks restore the commit onto 3 shards (its rows from the
// store, the others' from their live old owners); they train and commit;
// two ranks join and 5 ranks restore onto 5 shards, every row moving from
// its live owner. After each move every row is held exactly once, with the
// values and optimizer state it had at the commit. Finally a whole-job
// restart (all new processes) restores onto 2 shards from the store alone.
// No replicas (TestPSRestoreFromReplicas has them), so that the dead
// rank's rows can only come from the store.
func TestPSRepartition4To3To5(t *testing.T) {
	specs := paramserver.PSTables()
	store := &countingStore{MemoryShardStore: paramserver.NewMemoryShardStore()}
	pcfg := paramserver.DefaultConfig()
	pcfg.Store, pcfg.Replicas = store, 0
	pcfg.FrameRows = 5
	cfg := psTestConfig(t)
	nodes := newPSNodes(t, 7, cfg, specs, pcfg)
	rng := mrand.New(mrand.NewPCG(4, 3))

	// Round 1: ranks 0..3 = nodes 0..3.
	r1 := mustPSRounds(t, nodes[:4], 1, paramserver.World{}, 0)
	trainSteps(t, r1, specs, rng, 3)
	commitAll(t, r1, 3)
	at3 := dumpShards(t, specs, r1)
	trainSteps(t, r1, specs, rng, 1) // applied but never committed: rolled back
	// Node 1 dies: its process and memory are gone.
	r1[1].Close()
	nodes[1].ps.Close()
	for _, r := range r1 {
		r.Close()
	}

	// Round 2: nodes 0, 2, 3 on 3 shards, from step 3.
	n2 := []*psNode{nodes[0], nodes[2], nodes[3]}
	loads := store.loads.Load()
	r2 := mustPSRounds(t, n2, 2, paramserver.World{}, 3)
	sameRows(t, "4 -> 3 shards", dumpShards(t, specs, r2), at3)
	if got := store.loads.Load() - loads; got == 0 {
		t.Fatalf("the dead rank's shard was not loaded from the store")
	}
	for _, r := range r2 {
		if r.Step() != 3 {
			t.Fatalf("round 2 starts at step %d, want 3", r.Step())
		}
	}
	trainSteps(t, r2, specs, rng, 2)
	commitAll(t, r2, 5)
	at5 := dumpShards(t, specs, r2)
	for _, r := range r2 {
		r.Close()
	}

	// Round 3: the three survivors and two new nodes, on 5 shards.
	n3 := []*psNode{nodes[0], nodes[2], nodes[3], nodes[4], nodes[5]}
	loads = store.loads.Load()
	r3 := mustPSRounds(t, n3, 3, paramserver.World{}, 5)
	sameRows(t, "3 -> 5 shards", dumpShards(t, specs, r3), at5)
	if got := store.loads.Load() - loads; got != 0 {
		t.Fatalf("%d shards loaded from the store although every old owner is alive", got)
	}
	// The new layout trains on.
	trainSteps(t, r3, specs, rng, 1)
	for _, r := range r3 {
		r.Close()
	}

	// Whole-job restart: two fresh processes, step 5 from the store only.
	fresh := newPSNodes(t, 2, cfg, specs, pcfg)
	r4 := mustPSRounds(t, fresh, 4, paramserver.World{}, 5)
	sameRows(t, "store -> 2 shards", dumpShards(t, specs, r4), at5)
}

// TestPSRowsLostWithoutStore: with no store and no replicas, a committed
// shard whose host is gone cannot be restored: every rank of the new round
// gets ErrRowsLost naming it, none starts with rows missing.
func TestPSRowsLostWithoutStore(t *testing.T) {
	specs := paramserver.PSTables()
	pcfg := paramserver.DefaultConfig()
	pcfg.Replicas = 0
	nodes := newPSNodes(t, 3, psTestConfig(t), specs, pcfg)
	r1 := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	trainSteps(t, r1, specs, mrand.New(mrand.NewPCG(1, 1)), 1)
	commitAll(t, r1, 1)
	for _, r := range r1 {
		r.Close()
	}
	nodes[2].ps.Close()
	_, errs := psRounds(nodes[:2], 2, paramserver.World{}, 1)
	for i, err := range errs {
		if !errors.Is(err, paramserver.ErrRowsLost) {
			t.Fatalf("rank %d: got %v, want ErrRowsLost", i, err)
		}
	}
	// The same restore with the dead rank's commit on a live node is fine:
	// step 0 (the initial values) needs nobody.
	rs := mustPSRounds(t, nodes[:2], 3, paramserver.World{}, 0)
	if rs[0].Step() != 0 {
		t.Fatal("bad step")
	}
}

// TestPSOldRoundFenced: a rank left behind in round 1 (a zombie) can no
// longer push: its connections to the ranks that moved on to round 2 are
// gone, so its push fails and round 2's rows do not change; and a frame
// carrying another round's number on a live connection is refused.
func TestPSOldRoundFenced(t *testing.T) {
	specs := paramserver.PSTables()
	pcfg := paramserver.DefaultConfig()
	pcfg.Store = paramserver.NewMemoryShardStore()
	nodes := newPSNodes(t, 3, psTestConfig(t), specs, pcfg)
	r1 := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	commitAll(t, r1, 0)
	// Nodes 1 and 2 move on to round 2 without node 0 (Round closes their
	// round-1 PSRounds).
	r2 := mustPSRounds(t, nodes[1:], 2, paramserver.World{}, 0)
	before := dumpShards(t, specs, r2)
	push := randomBatch(mrand.New(mrand.NewPCG(2, 2)), specs, 0, 30)
	if err := r1[0].Push(context.Background(), push); err == nil {
		t.Fatal("a push of round 1 succeeded after the others moved on to round 2")
	}
	sameRows(t, "after the zombie's push", dumpShards(t, specs, r2), before)

	// A frame of round 1 on a round-2 connection: refused as a bad frame.
	h := wire.PSHeader{Kind: wire.PSPull, Round: 1, ID: 99, Aux: 1}
	var hb [wire.PSHeaderSize]byte
	h.Put(hb[:])
	paramserver.WriteRaw(r2[0], 1, hb[:])
	<-r2[1].Done()
	if err := r2[1].Err(); !errors.Is(err, elsync.ErrBadFrame) {
		t.Fatalf("rank 1 of round 2: got %v, want ErrBadFrame", err)
	}
}

// TestPSDedicatedHost: rank 0 hosts every shard and never trains (a
// dedicated parameter-server process); ranks 1..3 pull and push. Results
// match the reference, and the host's Done closes when the workers close.
func TestPSDedicatedHost(t *testing.T) {
	specs := paramserver.PSTables()
	nodes := newPSNodes(t, 4, psTestConfig(t), specs, paramserver.DefaultConfig())
	rs := mustPSRounds(t, nodes, 1, paramserver.World{Hosts: []int{0}, Workers: []int{1, 2, 3}, Shards: 3}, 0)
	ref := newPSRef(specs)
	rng := mrand.New(mrand.NewPCG(5, 5))
	for step := 0; step < 3; step++ {
		pushes := make([][]paramserver.Rows, 4)
		for w := 1; w < 4; w++ {
			for tb := range specs {
				pushes[w] = append(pushes[w], randomBatch(rng, specs, tb, 15))
			}
		}
		eachRank(t, "push", rs[1:], func(i int, r *paramserver.Round) error { return r.Push(context.Background(), pushes[i+1]...) })
		ref.step(pushes)
	}
	for tb := range specs {
		got := pullAll(t, rs[2], specs[tb], tb)
		for i, v := range got {
			if v != ref.val[tb][i] {
				t.Fatalf("table %d value %d: %v, want %v", tb, i, v, ref.val[tb][i])
			}
		}
	}
	if err := rs[0].Push(context.Background()); !errors.Is(err, elsync.ErrInvalid) {
		t.Fatalf("push from the dedicated host: got %v, want ErrInvalid", err)
	}
	var wg gosync.WaitGroup
	for _, r := range rs[1:] {
		wg.Add(1)
		go func() { defer wg.Done(); r.Close() }()
	}
	wg.Wait()
	<-rs[0].Done()
}

// TestPSCorruptShardInStore: a store holding a corrupt shard fails the
// restore with ErrCorruptShard (the encoding itself is TestPSShardEncoding's).
func TestPSCorruptShardInStore(t *testing.T) {
	specs := paramserver.PSTables()
	// A corrupt shard in the store fails the restore on every rank.
	store := paramserver.NewMemoryShardStore()
	pcfg := paramserver.DefaultConfig()
	pcfg.Store = store
	cfg := psTestConfig(t)
	nodes := newPSNodes(t, 2, cfg, specs, pcfg)
	r1 := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	commitAll(t, r1, 0)
	trainSteps(t, r1, specs, mrand.New(mrand.NewPCG(3, 3)), 1)
	commitAll(t, r1, 1)
	for _, r := range r1 {
		r.Close()
	}
	key := paramserver.ShardKey{Step: 1, Shards: 2, Shard: 1}
	blob, err := store.LoadShard(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	blob[len(blob)/2] ^= 1
	store.SaveShard(context.Background(), key, blob)
	fresh := newPSNodes(t, 2, cfg, specs, pcfg)
	_, errs := psRounds(fresh, 1, paramserver.World{}, 1)
	corrupt := 0
	for _, err := range errs {
		if err == nil {
			t.Fatal("a restore from a corrupt shard succeeded")
		}
		if errors.Is(err, paramserver.ErrCorruptShard) {
			corrupt++
		}
	}
	if corrupt == 0 {
		t.Fatalf("no rank reported ErrCorruptShard: %v", errs)
	}
}

// TestPSBarrierThenClose: after Barrier every rank may close at once:
// no rank fails because another left first, and a barrier waits for the
// slowest rank.
func TestPSBarrierThenClose(t *testing.T) {
	specs := paramserver.PSTables()
	for iter := 0; iter < 5; iter++ {
		nodes := newPSNodes(t, 4, psTestConfig(t), specs, paramserver.DefaultConfig())
		rs, errs := psRounds(nodes, 1, paramserver.World{}, 0)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", i, err)
			}
		}
		var entered atomic.Int32
		eachRank(t, "barrier", rs, func(w int, r *paramserver.Round) error {
			for b := 0; b < 3; b++ {
				entered.Add(1)
				if err := r.Barrier(context.Background()); err != nil {
					return err
				}
				if n := entered.Load(); n < int32(4*(b+1)) {
					return fmt.Errorf("barrier %d returned with only %d entries", b, n)
				}
			}
			r.Close() // at once: the others may still be finishing theirs
			return nil
		})
		for i, r := range rs {
			if err := r.Err(); !errors.Is(err, elsync.ErrClosed) {
				t.Fatalf("rank %d after its close: %v", i, err)
			}
		}
	}
}

// TestPSReadTablesAndForget: ReadTables assembles every row of a committed
// step, from memory while the hosts hold it and from the store alone after
// they closed; ForgetCommitsAfter drops a rolled-back commit so that a
// later round cannot restore it, and DirShardStore.RemoveAfter removes its
// files.
func TestPSReadTablesAndForget(t *testing.T) {
	specs := paramserver.PSTables()
	store, err := paramserver.NewDirShardStore(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	pcfg := paramserver.DefaultConfig()
	pcfg.Store = store
	nodes := newPSNodes(t, 3, psTestConfig(t), specs, pcfg)
	rs := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	trainSteps(t, rs, specs, mrand.New(mrand.NewPCG(5, 5)), 2)
	commitAll(t, rs, 2)
	at2 := dumpShards(t, specs, rs)
	trainSteps(t, rs, specs, mrand.New(mrand.NewPCG(6, 6)), 1)
	commitAll(t, rs, 3)
	check := func(what string, got [][]float32) {
		t.Helper()
		for tb, sp := range specs {
			for row := int64(0); row < sp.Rows; row++ {
				g := got[tb][row*int64(sp.Dim) : (row+1)*int64(sp.Dim)]
				if fmt.Sprint(g) != fmt.Sprint(at2[tb][row].val) {
					t.Fatalf("%s: table %d row %d: %v, want %v", what, tb, row, g, at2[tb][row].val)
				}
			}
		}
	}
	got, err := nodes[1].ps.ReadTables(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	check("from memory and the store", got)
	for _, r := range rs {
		r.Close()
	}
	for _, n := range nodes {
		n.ps.Close()
	}
	got, err = nodes[0].ps.ReadTables(context.Background(), 2)
	if err != nil {
		t.Fatal(err)
	}
	check("from the store after Close", got)
	if _, err := nodes[0].ps.ReadTables(context.Background(), 7); !errors.Is(err, paramserver.ErrRowsLost) {
		t.Fatalf("a step never committed: %v", err)
	}

	// Step 3 is rolled back: forgotten in memory and removed from the store,
	// a round restoring it fails on every rank instead of finding it.
	fresh := newPSNodes(t, 2, psTestConfig(t), specs, pcfg)
	r2 := mustPSRounds(t, fresh, 2, paramserver.World{}, 3)
	commitAll(t, r2, 3)
	for _, r := range r2 {
		r.Close()
	}
	for _, n := range fresh {
		n.ps.ForgetCommitsAfter(2)
		if c := n.ps.Commits(); len(c) != 0 {
			t.Fatalf("commits %v left after ForgetCommitsAfter(2)", c)
		}
	}
	if err := store.RemoveAfter(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if s := store.Steps(); fmt.Sprint(s) != "[2]" {
		t.Fatalf("store steps %v after RemoveAfter(2), want [2]", s)
	}
	_, errs := psRounds(fresh, 3, paramserver.World{}, 3)
	for i, err := range errs {
		if !errors.Is(err, paramserver.ErrRowsLost) {
			t.Fatalf("rank %d restoring a removed step: %v", i, err)
		}
	}
	r4 := mustPSRounds(t, fresh, 4, paramserver.World{}, 2)
	sameRows(t, "restore of step 2 onto 2 shards", dumpShards(t, specs, r4), at2)
}

func (r psRow) String() string { return fmt.Sprint(r.val, r.st) }
