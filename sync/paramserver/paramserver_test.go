package paramserver_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	elsync "github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"math"
	mrand "math/rand/v2"
	"strings"
	gosync "sync"
	"testing"
	"time"
)

// psNode is one simulated process of a parameter-server test: its own
// Transport and ParamServer.
type psNode struct {
	tr *elsync.Transport
	ps *paramserver.Server
}

func psTestConfig(t testing.TB) elsync.Config {
	cfg := elsync.DefaultConfig()
	var b [8]byte
	rand.Read(b[:])
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	if len(name) > 200 {
		name = name[:200]
	}
	cfg.JobID = fmt.Sprintf("%s-%x", name, b)
	cfg.Secret = make([]byte, 32)
	rand.Read(cfg.Secret)
	cfg.DialTimeout = 10 * time.Second
	cfg.OpTimeout = 20 * time.Second
	return cfg
}

// newPSNodes starts n nodes sharing cfg, tables and pcfg.
func newPSNodes(t testing.TB, n int, cfg elsync.Config, tables []paramserver.TableSpec, pcfg paramserver.Config) []*psNode {
	t.Helper()
	nodes := make([]*psNode, n)
	for i := range nodes {
		tr, err := elsync.Listen(context.Background(), "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		ps, err := paramserver.New(tr, tables, pcfg)
		if err != nil {
			t.Fatalf("NewParamServer: %v", err)
		}
		nodes[i] = &psNode{tr: tr, ps: ps}
		t.Cleanup(func() {
			ps.Close()
			tr.Close()
		})
	}
	return nodes
}

// psRounds forms round `round` over nodes (in rank order) with layout w
// (World filled in here) restoring step restore; it returns the rounds and
// each rank's error.
func psRounds(nodes []*psNode, round uint64, w paramserver.World, restore int64) ([]*paramserver.Round, []error) {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.tr.Addr()
	}
	rs := make([]*paramserver.Round, len(nodes))
	errs := make([]error, len(nodes))
	var wg gosync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pw := w
			pw.World = elsync.World{Round: round, Rank: i, Addrs: addrs}
			rs[i], errs[i] = n.ps.Round(context.Background(), pw, restore)
		}()
	}
	wg.Wait()
	return rs, errs
}

func mustPSRounds(t testing.TB, nodes []*psNode, round uint64, w paramserver.World, restore int64) []*paramserver.Round {
	t.Helper()
	rs, errs := psRounds(nodes, round, w, restore)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Round %d rank %d: %v", round, i, err)
		}
	}
	t.Cleanup(func() {
		for _, r := range rs {
			r.Close()
		}
	})
	return rs
}

// eachRank runs f on every rank concurrently and fails on any error.
func eachRank(t testing.TB, what string, rs []*paramserver.Round, f func(rank int, r *paramserver.Round) error) {
	t.Helper()
	errs := make([]error, len(rs))
	var wg gosync.WaitGroup
	for i, r := range rs {
		if r == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, r)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, i, err)
		}
	}
}

// psRef is the single-process reference: dense tables updated by the same
// rule the shards document (per step, gradients summed per row in worker
// order then push order, one optimizer step per touched row).
type psRef struct {
	specs []paramserver.TableSpec
	val   [][]float32
	st    [][]float32
}

func newPSRef(specs []paramserver.TableSpec) *psRef {
	ref := &psRef{specs: specs}
	for i := range specs {
		sp := &specs[i]
		sd := sp.Optimizer.StateDim(sp.Dim)
		v := make([]float32, sp.Rows*int64(sp.Dim))
		s := make([]float32, sp.Rows*int64(sd))
		h := paramserver.NameHash(sp.Name)
		for r := int64(0); r < sp.Rows; r++ {
			paramserver.InitRow(sp, h, r, v[r*int64(sp.Dim):(r+1)*int64(sp.Dim)], s[r*int64(sd):(r+1)*int64(sd)])
		}
		ref.val, ref.st = append(ref.val, v), append(ref.st, s)
	}
	return ref
}

func (ref *psRef) row(t int, r int64) []float32 {
	d := int64(ref.specs[t].Dim)
	return ref.val[t][r*d : (r+1)*d]
}

// step applies one sync step: pushes[w] are worker w's batches.
func (ref *psRef) step(pushes [][]paramserver.Rows) {
	for t := range ref.specs {
		sp := &ref.specs[t]
		d := sp.Dim
		sum := map[int64][]float32{}
		var order []int64
		for _, bs := range pushes {
			for _, b := range bs {
				if b.Table != t {
					continue
				}
				for i, id := range b.IDs {
					g := b.Values[i*d : (i+1)*d]
					acc, ok := sum[id]
					if !ok {
						sum[id] = append([]float32(nil), g...)
						order = append(order, id)
						continue
					}
					for k := range acc {
						acc[k] += g[k]
					}
				}
			}
		}
		sd := int64(sp.Optimizer.StateDim(d))
		for _, id := range order {
			paramserver.Apply(&sp.Optimizer, ref.row(t, id), ref.st[t][id*sd:(id+1)*sd], sum[id])
		}
	}
}

// randomBatch draws n rows (with repeats) of table t and random values.
func randomBatch(rng *mrand.Rand, specs []paramserver.TableSpec, t, n int) paramserver.Rows {
	sp := &specs[t]
	b := paramserver.Rows{Table: t, IDs: make([]int64, n), Values: make([]float32, n*sp.Dim)}
	for i := range b.IDs {
		if i > 0 && rng.IntN(5) == 0 {
			b.IDs[i] = b.IDs[rng.IntN(i)] // a repeat
		} else {
			b.IDs[i] = rng.Int64N(sp.Rows)
		}
	}
	for i := range b.Values {
		b.Values[i] = float32(rng.NormFloat64())
	}
	return b
}

// TestPSPullPushMatchesReference: for 1 to 8 shards (colocated on as many
// ranks, and some layouts with more shards than hosts), every pull returns
// exactly the reference's rows and every push leaves the tables exactly as
// the single-process reference, in sync mode.
func TestPSPullPushMatchesReference(t *testing.T) {
	type layout struct{ ranks, shards int }
	var cases []layout
	for n := 1; n <= 8; n++ {
		cases = append(cases, layout{n, n})
	}
	cases = append(cases, layout{2, 5}, layout{3, 8})
	for _, c := range cases {
		t.Run(fmt.Sprintf("ranks=%d/shards=%d", c.ranks, c.shards), func(t *testing.T) {
			t.Parallel()
			specs := paramserver.PSTables()
			pcfg := paramserver.DefaultConfig()
			pcfg.FrameRows = 7 // several frames per shard: exercises the pipelining
			nodes := newPSNodes(t, c.ranks, psTestConfig(t), specs, pcfg)
			rs := mustPSRounds(t, nodes, 1, paramserver.World{Shards: c.shards}, 0)
			ref := newPSRef(specs)
			rng := mrand.New(mrand.NewPCG(uint64(c.ranks), uint64(c.shards)))
			for step := 0; step < 4; step++ {
				pulls := make([][]paramserver.Rows, c.ranks)
				pushes := make([][]paramserver.Rows, c.ranks)
				for w := range pulls {
					for tb := range specs {
						n := rng.IntN(40)
						if w == 0 && tb == 0 && step == 1 {
							n = 0 // an empty batch
						}
						pulls[w] = append(pulls[w], randomBatch(rng, specs, tb, n))
						pushes[w] = append(pushes[w], randomBatch(rng, specs, tb, rng.IntN(40)))
					}
				}
				if step == 2 {
					pushes[c.ranks-1] = nil // a worker with no gradient at all
				}
				eachRank(t, "pull", rs, func(w int, r *paramserver.Round) error {
					if err := r.Pull(context.Background(), pulls[w]...); err != nil {
						return err
					}
					for _, b := range pulls[w] {
						d := specs[b.Table].Dim
						for i, id := range b.IDs {
							got, want := b.Values[i*d:(i+1)*d], ref.row(b.Table, id)
							for k := range got {
								if got[k] != want[k] {
									return fmt.Errorf("step %d table %d row %d: got %v, want %v", step, b.Table, id, got, want)
								}
							}
						}
					}
					return nil
				})
				eachRank(t, "push", rs, func(w int, r *paramserver.Round) error {
					return r.Push(context.Background(), pushes[w]...)
				})
				ref.step(pushes)
			}
			// Every row, through one rank.
			var all []paramserver.Rows
			for tb := range specs {
				b := paramserver.Rows{Table: tb, Values: make([]float32, specs[tb].Rows*int64(specs[tb].Dim))}
				for id := range specs[tb].Rows {
					b.IDs = append(b.IDs, id)
				}
				all = append(all, b)
			}
			eachRank(t, "final pull", rs, func(w int, r *paramserver.Round) error {
				mine := make([]paramserver.Rows, len(all))
				for i, b := range all {
					mine[i] = paramserver.Rows{Table: b.Table, IDs: b.IDs, Values: make([]float32, len(b.Values))}
				}
				if err := r.Pull(context.Background(), mine...); err != nil {
					return err
				}
				for _, b := range mine {
					for i, v := range b.Values {
						if v != ref.val[b.Table][i] {
							return fmt.Errorf("table %d value %d: got %v, want %v", b.Table, i, v, ref.val[b.Table][i])
						}
					}
				}
				return nil
			})
			for _, r := range rs {
				if r.Step() != 4 {
					t.Fatalf("Step() = %d, want 4", r.Step())
				}
			}
		})
	}
}

// denseAdagrad and denseAdam are textbook dense optimizers over a whole
// table (every row gets a gradient, zero when it had none), written
// independently of the shards' code.
func denseAdagrad(lr, eps float64, w, acc, g []float64) {
	for i := range w {
		acc[i] += g[i] * g[i]
		w[i] -= lr * g[i] / (math.Sqrt(acc[i]) + eps)
	}
}

func denseAdam(lr, b1, b2, eps float64, t int, w, m, v, g []float64) {
	for i := range w {
		m[i] = b1*m[i] + (1-b1)*g[i]
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		mh := m[i] / (1 - math.Pow(b1, float64(t)))
		vh := v[i] / (1 - math.Pow(b2, float64(t)))
		w[i] -= lr * mh / (math.Sqrt(vh) + eps)
	}
}

// pullAll pulls every row of table tb through r.
func pullAll(t testing.TB, r *paramserver.Round, spec paramserver.TableSpec, tb int) []float32 {
	t.Helper()
	b := paramserver.Rows{Table: tb, Values: make([]float32, spec.Rows*int64(spec.Dim))}
	for id := range spec.Rows {
		b.IDs = append(b.IDs, id)
	}
	if err := r.Pull(context.Background(), b); err != nil {
		t.Fatalf("pull: %v", err)
	}
	return b.Values
}

// TestPSSparseOptimizersMatchDense trains through a 3-shard, 2-worker
// parameter server and compares with dense float64 optimizers: sparse
// Adagrad with few rows touched per step against dense Adagrad fed zero
// gradients elsewhere; sparse (lazy) Adam with every row touched every
// step against dense Adam; and lazy Adam leaving untouched rows, moments
// and step counts alone.
func TestPSSparseOptimizersMatchDense(t *testing.T) {
	const rows, dim, steps = 40, 4, 6
	for _, kind := range []paramserver.SparseKind{paramserver.SparseAdagrad, paramserver.SparseAdam} {
		t.Run(kind.String(), func(t *testing.T) {
			t.Parallel()
			opt := paramserver.NewSparseAdagrad(0.3)
			if kind == paramserver.SparseAdam {
				opt = paramserver.NewSparseAdam(0.05)
			}
			spec := paramserver.TableSpec{Name: "emb", Rows: rows, Dim: dim, Optimizer: opt, InitScale: 1, Seed: 9}
			nodes := newPSNodes(t, 3, psTestConfig(t), []paramserver.TableSpec{spec}, paramserver.DefaultConfig())
			rs := mustPSRounds(t, nodes, 1, paramserver.World{Workers: []int{1, 2}}, 0)
			w := make([]float64, rows*dim)
			for i, v := range pullAll(t, rs[0], spec, 0) {
				w[i] = float64(v)
			}
			acc := make([]float64, rows*dim)
			for i := range acc {
				acc[i] = opt.InitialAccumulator
			}
			m, v := make([]float64, rows*dim), make([]float64, rows*dim)
			rng := mrand.New(mrand.NewPCG(7, uint64(kind)))
			untouched := int64(rows - 1) // never pushed in the lazy check
			for step := 1; step <= steps; step++ {
				pushes := [][]paramserver.Rows{nil, nil, nil}
				g := make([]float64, rows*dim)
				for wk := 1; wk <= 2; wk++ {
					b := paramserver.Rows{Table: 0}
					for id := int64(0); id < rows; id++ {
						touch := rng.IntN(4) == 0
						if kind == paramserver.SparseAdam {
							touch = id != untouched
						}
						if !touch {
							continue
						}
						b.IDs = append(b.IDs, id)
						for k := 0; k < dim; k++ {
							x := float32(rng.NormFloat64())
							b.Values = append(b.Values, x)
							g[id*dim+int64(k)] += float64(x)
						}
					}
					pushes[wk] = []paramserver.Rows{b}
				}
				if kind == paramserver.SparseAdagrad {
					denseAdagrad(opt.LR, opt.Eps, w, acc, g)
				} else {
					// The dense reference updates every row but the untouched one.
					n := (rows - 1) * dim
					denseAdam(opt.LR, opt.Beta1, opt.Beta2, opt.Eps, step, w[:n], m[:n], v[:n], g[:n])
				}
				eachRank(t, "push", rs[1:], func(i int, r *paramserver.Round) error {
					return r.Push(context.Background(), pushes[i+1]...)
				})
			}
			got := pullAll(t, rs[1], spec, 0)
			for i, x := range got {
				if d := math.Abs(float64(x) - w[i]); d > 1e-5*math.Max(1, math.Abs(w[i])) {
					t.Fatalf("value %d (row %d): sparse %v, dense %v (diff %g)", i, i/dim, x, w[i], d)
				}
			}
			if kind == paramserver.SparseAdam {
				// Lazy: the untouched row kept its initial value and zero state.
				var state []float32
				paramserver.EachHeldRow(rs[HostOfRow(untouched, rs[0])], func(tb int, row int64, _ int, _, st []float32) {
					if tb == 0 && row == untouched {
						state = append([]float32(nil), st...)
					}
				})
				if state == nil {
					t.Fatalf("row %d is not held by its host", untouched)
				}
				for k, s := range state {
					if s != 0 {
						t.Fatalf("untouched row state[%d] = %v, want 0", k, s)
					}
				}
			}
		})
	}
}

// HostOfRow returns the rank hosting row in r's layout (test helper).
func HostOfRow(row int64, r *paramserver.Round) int { return r.HostOf(int(row % int64(r.Shards()))) }

// TestPSAsyncStalenessBound: in async mode a push computed on a pull more
// than MaxStaleness updates old is refused with ErrStale and changes
// nothing; one within the bound is applied; the round stays usable.
func TestPSAsyncStalenessBound(t *testing.T) {
	spec := paramserver.TableSpec{Name: "emb", Rows: 10, Dim: 2, Optimizer: paramserver.NewSparseSGD(1)}
	pcfg := paramserver.DefaultConfig()
	pcfg.Mode, pcfg.MaxStaleness = paramserver.Async, 2
	nodes := newPSNodes(t, 2, psTestConfig(t), []paramserver.TableSpec{spec}, pcfg)
	rs := mustPSRounds(t, nodes, 1, paramserver.World{Shards: 1, Hosts: []int{0}}, 0)
	ctx := context.Background()
	row := func(r *paramserver.Round) []float32 {
		b := paramserver.Rows{Table: 0, IDs: []int64{3}, Values: make([]float32, 2)}
		if err := r.Pull(ctx, b); err != nil {
			t.Fatal(err)
		}
		return b.Values
	}
	one := func(v float32) paramserver.Rows {
		return paramserver.Rows{Table: 0, IDs: []int64{3}, Values: []float32{v, v}}
	}
	row(rs[1]) // rank 1 pulls version 0
	for i := 0; i < 3; i++ {
		row(rs[0])
		if err := rs[0].Push(ctx, one(1)); err != nil { // version i -> i+1
			t.Fatalf("fresh push %d: %v", i, err)
		}
	}
	before := row(rs[0])
	err := rs[1].Push(ctx, one(100)) // computed at version 0, shard at 3 > 0+2
	if !errors.Is(err, paramserver.ErrStale) {
		t.Fatalf("stale push: got %v, want ErrStale", err)
	}
	if after := row(rs[0]); after[0] != before[0] {
		t.Fatalf("stale push was applied: %v -> %v", before, after)
	}
	if rs[1].Stats().StalePushes != 1 {
		t.Fatalf("StalePushes = %d, want 1", rs[1].Stats().StalePushes)
	}
	// Within the bound: rank 1 pulls (version 3), rank 0 pushes twice
	// (version 5), rank 1's push is 2 updates stale: applied.
	row(rs[1])
	for i := 0; i < 2; i++ {
		row(rs[0])
		if err := rs[0].Push(ctx, one(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rs[1].Push(ctx, one(1)); err != nil {
		t.Fatalf("push within the bound: %v", err)
	}
	if got, want := row(rs[0])[0], before[0]-3; got != want {
		t.Fatalf("value %v, want %v", got, want)
	}
	if rs[1].Err() != nil || rs[0].Err() != nil {
		t.Fatalf("round broken: %v %v", rs[0].Err(), rs[1].Err())
	}
}
