package sync

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// seqSum is the reference of the ordered allreduce: +0, then every part
// added in order, one float32 rounding after the other.
func seqSum(parts [][]float32, n int) []float32 {
	acc := make([]float32, n)
	for _, p := range parts {
		for i := range acc {
			acc[i] += p[i]
		}
	}
	return acc
}

// orderedValue draws a summand: mostly random magnitudes over 2^-10 ..
// 2^30, often values whose float32 sum depends on the order (1e8 and 1
// and -1e8), signed zeros.
func orderedValue(rng *rand.Rand) float32 {
	switch rng.IntN(8) {
	case 0:
		return 1e8
	case 1:
		return -1e8
	case 2:
		return 1
	case 3:
		return float32(math.Copysign(0, -1))
	}
	return float32((rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(40)-10))
}

func orderedParts(rng *rand.Rand, k, length int) [][]float32 {
	parts := make([][]float32, k)
	for j := range parts {
		parts[j] = make([]float32, length)
		for i := range parts[j] {
			parts[j][i] = orderedValue(rng)
		}
	}
	return parts
}

// splits returns ways to cut k parts into n contiguous runs in rank order,
// as run boundaries (bounds[r], bounds[r+1]): everything on rank 0,
// everything on the last rank, round robin sized runs, and `random` random
// cuts (ranks with no parts included).
func splits(rng *rand.Rand, k, n, random int) [][]int {
	var out [][]int
	edge := func(at int) []int {
		b := make([]int, n+1)
		for r := range b {
			if r > at {
				b[r] = k
			}
		}
		return b
	}
	out = append(out, edge(0), edge(n-1))
	even := make([]int, n+1)
	for r := range even {
		even[r] = k * r / n
	}
	out = append(out, even)
	for range random {
		b := make([]int, n+1)
		for r := 1; r < n; r++ {
			b[r] = rng.IntN(k + 1)
		}
		b[n] = k
		slices.Sort(b[1:n])
		out = append(out, b)
	}
	return out
}

// checkOrdered runs one ordered allreduce of parts, split by bounds, on w
// and checks every rank's out against the sequential sum, bit for bit.
func checkOrdered(t *testing.T, w *testWorld, parts [][]float32, length int, bounds []int) {
	t.Helper()
	n := len(w.rings)
	want := seqSum(parts, length)
	outs := make([][]float32, n)
	for r := range outs {
		outs[r] = make([]float32, length)
		for i := range outs[r] {
			outs[r][i] = float32(r + 7) // garbage the operation must overwrite
		}
	}
	what := fmt.Sprintf("n=%d len %d, %d parts split %v", n, length, len(parts), bounds)
	w.must(t, what, func(rank int, r *Ring) error {
		return r.AllReduceOrderedFloat32(context.Background(), parts[bounds[rank]:bounds[rank+1]], outs[rank])
	})
	checkBits(t, what, outs, want)
	// AllReduceOrderedTensors, on every rank that has a part, then on
	// every other one of them (mixed with AllReduceOrderedFloat32 in one
	// operation): the last part cut into tensors (some empty), which
	// receive the same bits.
	rng := rand.New(rand.NewPCG(uint64(length), uint64(len(parts))))
	for _, every := range []int{1, 2} {
		tensors := make([][][]float32, n)
		for r := range n {
			lo, hi := bounds[r], bounds[r+1]
			if hi == lo || r%every != 0 {
				continue
			}
			tensors[r] = cutTensors(rng, parts[hi-1])
		}
		what := fmt.Sprintf("%s, tensors on every %d", what, every)
		w.must(t, what, func(rank int, r *Ring) error {
			own := parts[bounds[rank]:bounds[rank+1]]
			if tensors[rank] == nil {
				return r.AllReduceOrderedFloat32(context.Background(), own, outs[rank])
			}
			return r.AllReduceOrderedTensors(context.Background(), own[:len(own)-1], tensors[rank])
		})
		for r := range n {
			if tensors[r] != nil {
				outs[r] = slices.Concat(tensors[r]...)
			}
		}
		checkBits(t, what, outs, want)
	}
}

// cutTensors copies p into tensors of random lengths, empty ones among
// them, whose concatenation is p.
func cutTensors(rng *rand.Rand, p []float32) [][]float32 {
	var ts [][]float32
	for rest := p; ; {
		m := 0
		if len(rest) > 0 && rng.IntN(5) > 0 {
			m = 1 + rng.IntN(len(rest))
		}
		ts = append(ts, slices.Clone(rest[:m]))
		rest = rest[m:]
		if len(rest) == 0 {
			return ts
		}
	}
}

// checkBits checks that every rank's out is want, bit for bit.
func checkBits(t *testing.T, what string, outs [][]float32, want []float32) {
	t.Helper()
	for r, out := range outs {
		for i := range want {
			if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: rank %d [%d] = %v (%#x), the sequential sum is %v (%#x)",
					what, r, i, out[i], math.Float32bits(out[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}

// TestOrderedAllReduceBits: for world sizes 1 to 5, over shared memory,
// Unix sockets and TCP, on the mesh path and on the lanes (many chunks,
// two lanes), every rank's out equals the sequential float32 sum of the
// global sequence of parts, bit for bit, however the parts are split
// among the ranks (ranks without parts included).
func TestOrderedAllReduceBits(t *testing.T) {
	for _, tp := range transports {
		for n := 1; n <= 5; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tp.name, n), func(t *testing.T) {
				cfg := smallConfig(t)
				cfg.LocalSockets, cfg.SharedMemory = tp.local, tp.shmem
				w := newTestWorld(t, n, cfg)
				if n > 1 && w.rings[0].lanesFor(4*40001) != 2 {
					t.Fatalf("40001 values on %d lanes, want 2", w.rings[0].lanesFor(4*40001))
				}
				rng := rand.New(rand.NewPCG(uint64(n), 32))
				// 0, 1, odd, around the mesh/lane switch (DirectBytes 1024),
				// at most shmSlots chunks of 4096 bytes (AllReduceOrderedTensors
				// over the slots on both ranks of two), more, two lanes.
				for _, length := range []int{0, 1, 7, 256, 257, 3001, 5003, 40001} {
					for _, k := range []int{0, 1, 2, 5, 9} {
						if length == 40001 && k > 5 {
							continue
						}
						parts := orderedParts(rng, k, length)
						for _, b := range splits(rng, k, n, 2) {
							checkOrdered(t, w, parts, length, b)
						}
					}
				}
			})
		}
	}
}

// TestOrderedAllReduceOrderMatters: the parts (1, 1e8, -1e8) and three
// -0 add to +0 in that order from +0; pre-summed per rank and reduced
// with AllReduceFloat32 (what an unordered allreduce of the ranks' sums
// computes) they give 1 and -0, so the test above can tell the orders
// apart. On the mesh path and on the lanes.
func TestOrderedAllReduceOrderMatters(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, tp := range transports {
		t.Run(tp.name, func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.LocalSockets, cfg.SharedMemory = tp.local, tp.shmem
			w := newTestWorld(t, 2, cfg)
			for _, length := range []int{2, 40002} {
				parts := make([][]float32, 3)
				for j, v := range []float32{1, 1e8, -1e8} {
					parts[j] = make([]float32, length)
					for i := range parts[j] {
						parts[j][i] = v
						if i%2 == 1 {
							parts[j][i] = negZero
						}
					}
				}
				bounds := []int{0, 1, 3} // rank 0: 1; rank 1: 1e8, -1e8
				checkOrdered(t, w, parts, length, bounds)
				want := seqSum(parts, length)
				if math.Float32bits(want[0]) != 0 || math.Float32bits(want[1]) != 0 {
					t.Fatalf("sequential sums %v %v, want +0 +0", want[0], want[1])
				}
				// Each rank's own sum, then the ring's allreduce.
				sums := make([][]float32, 2)
				for r := range sums {
					sums[r] = seqOwn(parts[bounds[r]:bounds[r+1]], length)
				}
				w.must(t, "allreduce of the ranks' sums", func(rank int, r *Ring) error {
					return r.AllReduceFloat32(context.Background(), sums[rank], OpSum)
				})
				if sums[0][0] != 1 || math.Float32bits(sums[0][1]) != math.Float32bits(negZero) {
					t.Fatalf("len %d: the allreduce of the ranks' sums gives %v %v, want 1 and -0", length, sums[0][0], sums[0][1])
				}
			}
		})
	}
}

// seqOwn is a rank's own sum of its parts, starting from its first part
// (not from an incoming running sum).
func seqOwn(parts [][]float32, n int) []float32 {
	acc := slices.Clone(parts[0])
	for _, p := range parts[1:] {
		for i := range acc {
			acc[i] += p[i]
		}
	}
	return acc
}

// TestOrderedAllReduceHierarchicalRound: a round laid out over two hosts
// (hierarchical for AllReduceFloat32) runs the flat chain: the same bits.
func TestOrderedAllReduceHierarchicalRound(t *testing.T) {
	w := hostWorld(t, []int{0, 0, 1, 1, 0}, smallConfig(t))
	if !w.rings[0].Hierarchical() {
		t.Fatal("the round is not hierarchical")
	}
	rng := rand.New(rand.NewPCG(5, 32))
	for _, length := range []int{7, 40001} {
		parts := orderedParts(rng, 6, length)
		for _, b := range splits(rng, 6, 5, 3) {
			checkOrdered(t, w, parts, length, b)
		}
	}
}

func TestOrderedAllReduceLocal(t *testing.T) {
	s := NewLocal()
	o, ok := s.(OrderedReducer)
	if !ok {
		t.Fatal("NewLocal is not an OrderedReducer")
	}
	rng := rand.New(rand.NewPCG(1, 32))
	ctx := context.Background()
	for _, k := range []int{0, 1, 4} {
		parts := orderedParts(rng, k, 1000)
		out := make([]float32, 1000)
		if err := o.AllReduceOrderedFloat32(ctx, parts, out); err != nil {
			t.Fatal(err)
		}
		want := seqSum(parts, 1000)
		for i := range out {
			if math.Float32bits(out[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%d parts: [%d] = %v, want %v", k, i, out[i], want[i])
			}
		}
	}
	out := make([]float32, 4)
	if err := o.AllReduceOrderedFloat32(ctx, [][]float32{make([]float32, 3)}, out); !errors.Is(err, ErrInvalid) {
		t.Fatalf("short part: %v, want ErrInvalid", err)
	}
	if err := o.AllReduceOrderedFloat32(ctx, [][]float32{out[:4:4]}, out); !errors.Is(err, ErrInvalid) {
		t.Fatalf("out as a part: %v, want ErrInvalid", err)
	}
	// The tensor form: the last part as tensors, the sum written into them.
	ot := s.(interface {
		AllReduceOrderedTensors(context.Context, [][]float32, [][]float32) error
	})
	for _, k := range []int{1, 2, 4} {
		parts := orderedParts(rng, k, 1000)
		want := seqSum(parts, 1000)
		last := cutTensors(rng, parts[k-1])
		if err := ot.AllReduceOrderedTensors(ctx, parts[:k-1], last); err != nil {
			t.Fatal(err)
		}
		checkBits(t, fmt.Sprintf("tensors, %d parts", k), [][]float32{slices.Concat(last...)}, want)
	}
	if err := ot.AllReduceOrderedTensors(ctx, [][]float32{make([]float32, 3)}, [][]float32{out}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("tensors longer than the parts: %v, want ErrInvalid", err)
	}
	if err := ot.AllReduceOrderedTensors(ctx, nil, [][]float32{out[:3], out[2:]}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("overlapping tensors: %v, want ErrInvalid", err)
	}
	s.Close()
	if err := ot.AllReduceOrderedTensors(ctx, nil, [][]float32{out}); !errors.Is(err, ErrClosed) {
		t.Fatalf("tensors after Close: %v, want ErrClosed", err)
	}
	if err := o.AllReduceOrderedFloat32(ctx, nil, out); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestOrderedAllReduceMismatch: ranks that disagree (lengths of out, on
// one path or across the mesh and lane paths; a part of the wrong length;
// another collective under the same sequence number) all get an error,
// promptly: ErrInvalid on the rank with the bad part, ErrMismatch (or a
// PeerError from the abort) elsewhere.
func TestOrderedAllReduceMismatch(t *testing.T) {
	ordered := func(r *Ring, length int, parts int) error {
		ps := make([][]float32, parts)
		for j := range ps {
			ps[j] = make([]float32, length)
		}
		return r.AllReduceOrderedFloat32(context.Background(), ps, make([]float32, length))
	}
	cases := []struct {
		name    string
		invalid int // the rank that must get ErrInvalid, or -1
		f       func(rank int, r *Ring) error
	}{
		{"length mesh", -1, func(rank int, r *Ring) error { return ordered(r, 10+min(rank, 1), rank) }},
		{"length lanes", -1, func(rank int, r *Ring) error { return ordered(r, 5000+min(rank, 1), 1) }},
		{"mesh and lanes", -1, func(rank int, r *Ring) error {
			if rank == 2 {
				return ordered(r, 5000, 1)
			}
			return ordered(r, 10, 1)
		}},
		{"part length", 1, func(rank int, r *Ring) error {
			if rank == 1 {
				return r.AllReduceOrderedFloat32(context.Background(), [][]float32{make([]float32, 4999)}, make([]float32, 5000))
			}
			return ordered(r, 5000, 1)
		}},
		{"tensors length", 1, func(rank int, r *Ring) error {
			if rank == 1 {
				return r.AllReduceOrderedTensors(context.Background(), [][]float32{make([]float32, 5000)},
					[][]float32{make([]float32, 2000), make([]float32, 2999)})
			}
			return ordered(r, 5000, 1)
		}},
		{"tensor in a part", 1, func(rank int, r *Ring) error {
			if rank == 1 {
				p := make([]float32, 5000)
				return r.AllReduceOrderedTensors(context.Background(), [][]float32{p}, [][]float32{p[:10], make([]float32, 4990)})
			}
			return ordered(r, 5000, 1)
		}},
		{"allreduce", -1, func(rank int, r *Ring) error {
			if rank == 0 {
				return r.AllReduceFloat32(context.Background(), make([]float32, 5000), OpSum)
			}
			return ordered(r, 5000, 1)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newTestWorld(t, 3, smallConfig(t))
			w.must(t, "barrier", func(_ int, r *Ring) error { return r.Barrier(context.Background()) })
			start := time.Now()
			for rank, err := range w.each(c.f) {
				switch {
				case err == nil:
					t.Errorf("rank %d: no error", rank)
				case rank == c.invalid && !errors.Is(err, ErrInvalid):
					t.Errorf("rank %d: %v, want ErrInvalid", rank, err)
				case rank != c.invalid && !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrPeerLost):
					t.Errorf("rank %d: %v, want ErrMismatch", rank, err)
				}
			}
			// Bounded by the announcement (100 ms) and the abort notices,
			// not by OpTimeout (30 s).
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("took %v", el)
			}
		})
	}
}

// TestOrderedAllReduceClosedPeer: a rank closed in the middle of an
// ordered allreduce makes every other rank's fail with a *PeerError
// naming it, on the lanes and on the mesh path.
func TestOrderedAllReduceClosedPeer(t *testing.T) {
	for _, length := range []int{10, 20000} {
		t.Run(fmt.Sprint("len ", length), func(t *testing.T) {
			const n, victim = 4, 2
			w := newTestWorld(t, n, smallConfig(t))
			parts := orderedParts(rand.New(rand.NewPCG(2, 32)), 2, length)
			start := time.Now()
			errs := w.each(func(rank int, r *Ring) error {
				out := make([]float32, length)
				for i := 0; ; i++ {
					if rank == victim && i == 3 {
						// Closed while the operation is in flight here
						// (Close aborts it on every rank).
						go func() {
							for dl := time.Now().Add(5 * time.Second); !r.inOp.Load() && time.Now().Before(dl); {
								time.Sleep(time.Millisecond) // polling a condition with a deadline
							}
							r.Close()
						}()
					}
					if err := r.AllReduceOrderedFloat32(context.Background(), parts, out); err != nil {
						return err
					}
				}
			})
			if el := time.Since(start); el > 10*time.Second {
				t.Fatalf("took %v", el)
			}
			for r, err := range errs {
				var pe *PeerError
				switch {
				case r == victim:
					if err == nil {
						t.Errorf("closed rank: no error")
					}
				case !errors.As(err, &pe) || pe.Rank != victim:
					t.Errorf("rank %d: %v, want a PeerError naming rank %d", r, err, victim)
				}
			}
		})
	}
}

// TestOrderedAllReduceTimesOut: a rank alone in an ordered allreduce
// (its peer never joins) fails with ErrTimeout after OpTimeout, on the
// mesh path and on the lanes.
func TestOrderedAllReduceTimesOut(t *testing.T) {
	for _, length := range []int{10, 100000} {
		t.Run(fmt.Sprint("len ", length), func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.OpTimeout = 300 * time.Millisecond
			w := newTestWorld(t, 2, cfg)
			for _, rank := range []int{0, 1} {
				start := time.Now()
				parts := [][]float32{make([]float32, length)}
				err := w.rings[rank].AllReduceOrderedFloat32(context.Background(), parts, make([]float32, length))
				if !errors.Is(err, ErrTimeout) {
					t.Fatalf("rank %d: %v, want ErrTimeout", rank, err)
				}
				if el := time.Since(start); el > cfg.OpTimeout+time.Second {
					t.Fatalf("rank %d: took %v", rank, el)
				}
				// The Ring is broken now: form another round for rank 1.
				w = newTestWorld(t, 2, cfg)
			}
		})
	}
}

// TestPeerKilledMidOrderedAllReduce: a rank SIGKILLed while the world runs
// ordered allreduces back to back (of four ranks; of two in the tensor
// form, AllReduceOrderedTensors) makes every survivor fail with a
// *PeerError naming it within 2 s (child processes, as
// TestPeerKilledMidAllReduce).
func TestPeerKilledMidOrderedAllReduce(t *testing.T) {
	t.Run("shm", func(t *testing.T) { testPeerKilledOp(t, false, "ordered") })
	t.Run("tcp", func(t *testing.T) { testPeerKilledOp(t, true, "ordered") })
	// Two ranks, the tensor form: the exchange over the slots (shm).
	t.Run("tensors shm", func(t *testing.T) { testPeerKilledOpOf(t, false, "ordered-tensors", 2, 1) })
	t.Run("tensors tcp", func(t *testing.T) { testPeerKilledOpOf(t, true, "ordered-tensors", 2, 1) })
}

// TestOrderedAllReduceNoAllocs: once the Ring's buffers exist, the ordered
// allreduce does not allocate, on the mesh path or the lanes.
func TestOrderedAllReduceNoAllocs(t *testing.T) {
	p := newPair(t, smallConfig(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rng := rand.New(rand.NewPCG(3, 32))
	for _, length := range []int{100, 50000} {
		parts := [2][][]float32{orderedParts(rng, 2, length), orderedParts(rng, 1, length)}
		outs := [2][]float32{make([]float32, length), make([]float32, length)}
		f := func(r *Ring) error { return r.AllReduceOrderedFloat32(ctx, parts[r.Rank()], outs[r.Rank()]) }
		// The tensor form: over the slots, and (rank 0 holding two parts
		// before its tensors, rank 1 with another part) through the Ring's buffers.
		last := [2][][]float32{cutTensors(rng, outs[0]), cutTensors(rng, outs[1])}
		ft := func(r *Ring) error { return r.AllReduceOrderedTensors(ctx, parts[r.Rank()][:1], last[r.Rank()]) }
		fv := func(r *Ring) error { return r.AllReduceOrderedTensors(ctx, nil, last[r.Rank()]) }
		for name, f := range map[string]func(*Ring) error{"parts": f, "tensors": ft, "tensors only": fv} {
			if err := p.run(f); err != nil {
				t.Fatal(err)
			}
			var err error
			allocs := testing.AllocsPerRun(20, func() {
				if e := p.run(f); e != nil && err == nil {
					err = e
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs > 0 {
				t.Errorf("%s, len %d: %v allocations per operation (both ranks), want 0", name, length, allocs)
			}
		}
	}
}
