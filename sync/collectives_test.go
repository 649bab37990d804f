package sync

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// Tolerance for float32: the result may differ from the exact sum (computed
// in float64) by at most n * 2^-23 * sum_i |x_i| (n-1 roundings of partial
// sums bounded by sum |x_i|, plus the rounding of the average). float64
// results must equal, bit for bit, the sum taken in the order the algorithm
// documents (see refStart). All ranks must hold bit-identical results.
func tol32(n int, absSum float64) float64 { return float64(n) * math.Ldexp(1, -23) * absSum }

// refStart gives, for element i of an allreduce of `count` elements of
// `elem` bytes on r's world, the rank where its reduction starts: -1 for the
// direct path and the two-rank exchange (rank order 0..n-1), else the
// segment index s of the ring (order s, s+1, ..., s-1). Lanes split
// [0,count) into `used` balanced parts floor(count*l/used); each part
// splits into n segments the same way.
func refStart(r *Ring, count, elem, i int) int {
	n := r.Size()
	if n > 1 && count*elem <= r.cfg.DirectBytes && n > directMaxWorld {
		return -2 // recursive doubling
	}
	if n <= 2 || count*elem <= r.cfg.DirectBytes {
		return -1
	}
	used := r.allReduceLanes(count * elem)
	for l := 0; l < used; l++ {
		lo, hi := count*l/used, count*(l+1)/used
		if i < lo || i >= hi {
			continue
		}
		m := hi - lo
		for s := 0; s < n; s++ {
			if i >= lo+m*s/n && i < lo+m*(s+1)/n {
				return s
			}
		}
	}
	panic("unreachable")
}

func combine64(op Op, a, b float64) float64 {
	switch op {
	case OpMax:
		return max(a, b)
	case OpMin:
		return min(a, b)
	}
	return a + b
}

// rdRef64 reduces xs in the order of recursive doubling: fold rank q+p into
// q, then combine v[q] with v[q^mask] for mask = 1, 2, ... p/2.
func rdRef64(op Op, xs []float64) float64 {
	n, p := len(xs), 1
	for p*2 <= n {
		p *= 2
	}
	v := append([]float64(nil), xs[:p]...)
	for q := 0; q < n-p; q++ {
		v[q] = combine64(op, v[q], xs[q+p])
	}
	for mask := 1; mask < p; mask <<= 1 {
		next := make([]float64, p)
		for q := range v {
			next[q] = combine64(op, v[q], v[q^mask])
		}
		v = next
	}
	if op == OpAvg {
		return v[0] / float64(n)
	}
	return v[0]
}

func reduceRef64(op Op, xs []float64, start int) float64 {
	if start == -2 {
		return rdRef64(op, xs)
	}
	n := len(xs)
	order := make([]int, n)
	for k := range order {
		order[k] = k
		if start >= 0 {
			order[k] = (start + k) % n
		}
	}
	acc := xs[order[0]]
	for _, k := range order[1:] {
		switch op {
		case OpSum, OpAvg:
			acc += xs[k]
		case OpMax:
			acc = max(acc, xs[k])
		case OpMin:
			acc = min(acc, xs[k])
		}
	}
	if op == OpAvg {
		acc /= float64(n)
	}
	return acc
}

func randBufs(rng *rand.Rand, n, length int) [][]float64 {
	b := make([][]float64, n)
	for r := range b {
		b[r] = make([]float64, length)
		for i := range b[r] {
			b[r][i] = (rng.Float64()*2 - 1) * math.Ldexp(1, rng.IntN(20)-10)
		}
	}
	return b
}

// checkAllReduce runs one allreduce of each type on w and checks it.
func checkAllReduce(t *testing.T, w *testWorld, rng *rand.Rand, length int, op Op) {
	t.Helper()
	n := len(w.rings)
	in := randBufs(rng, n, length)
	// float64: exact in the documented order.
	got64 := make([][]float64, n)
	for r := range got64 {
		got64[r] = append([]float64(nil), in[r]...)
	}
	w.must(t, fmt.Sprintf("float64 %v len %d", op, length), func(rank int, r *Ring) error {
		return r.AllReduceFloat64(context.Background(), got64[rank], op)
	})
	xs := make([]float64, n)
	for i := 0; i < length; i++ {
		for r := range xs {
			xs[r] = in[r][i]
		}
		want := reduceRef64(op, xs, refStart(w.rings[0], length, 8, i))
		for r := range got64 {
			if math.Float64bits(got64[r][i]) != math.Float64bits(want) {
				t.Fatalf("n=%d float64 %v len %d: rank %d [%d] = %v, want %v", n, op, length, r, i, got64[r][i], want)
			}
		}
	}
	// float32: within tolerance of the exact value, identical on all ranks.
	got32 := make([][]float32, n)
	for r := range got32 {
		got32[r] = make([]float32, length)
		for i, v := range in[r] {
			got32[r][i] = float32(v)
		}
	}
	w.must(t, fmt.Sprintf("float32 %v len %d", op, length), func(rank int, r *Ring) error {
		return r.AllReduceFloat32(context.Background(), got32[rank], op)
	})
	for i := 0; i < length; i++ {
		var exact, abs float64
		for r := range xs {
			xs[r] = float64(float32(in[r][i]))
			abs += math.Abs(xs[r])
		}
		switch op {
		case OpSum:
			exact = reduceRef64(OpSum, xs, -1)
		case OpAvg:
			exact = reduceRef64(OpAvg, xs, -1)
			abs /= float64(n)
		default:
			exact, abs = reduceRef64(op, xs, -1), 0 // max/min are exact
		}
		for r := range got32 {
			if d := math.Abs(float64(got32[r][i]) - exact); d > tol32(n, abs) {
				t.Fatalf("n=%d float32 %v len %d: rank %d [%d] = %v, want %v (diff %g > tol %g)", n, op, length, r, i, got32[r][i], exact, d, tol32(n, abs))
			}
			if math.Float32bits(got32[r][i]) != math.Float32bits(got32[0][i]) {
				t.Fatalf("n=%d float32 %v len %d: [%d] differs between rank 0 (%v) and rank %d (%v)", n, op, length, i, got32[0][i], r, got32[r][i])
			}
		}
	}
}

// smallConfig makes the ring path and chunking kick in at small sizes.
func smallConfig(t testing.TB) Config {
	cfg := testConfig(t)
	cfg.ChunkBytes = 4096
	cfg.DirectBytes = 1024
	cfg.Streams = 2
	return cfg
}

// transports names the payload paths: shared memory between same-host
// ranks (the default), Unix sockets without shared memory, and TCP.
var transports = []struct {
	name         string
	local, shmem bool
	sizes        []int
}{
	{"shm", true, true, []int{1, 2, 3, 4, 5, 6, 7, 8}},
	{"unix", true, false, []int{2, 3, 5}},
	{"tcp", false, false, []int{2, 3, 5}},
}

func TestCollectivesWorldSizes(t *testing.T) {
	for _, tp := range transports {
		for _, n := range tp.sizes {
			t.Run(fmt.Sprintf("%s/n=%d", tp.name, n), func(t *testing.T) {
				cfg := smallConfig(t)
				cfg.LocalSockets, cfg.SharedMemory = tp.local, tp.shmem
				testCollectives(t, n, cfg)
			})
		}
	}
}

func testCollectives(t *testing.T, n int, cfg Config) {
	{
		{
			w := newTestWorld(t, n, cfg)
			if n > 1 {
				l := w.rings[0].lanes[0]
				if got := l.tx != nil && l.rx != nil; got != (cfg.LocalSockets && cfg.SharedMemory) {
					t.Fatalf("lane 0 shared memory = %v with LocalSockets %v SharedMemory %v", got, cfg.LocalSockets, cfg.SharedMemory)
				}
			}
			rng := rand.New(rand.NewPCG(uint64(n), 1))
			// 0, 1, odd, not divisible by n, around the direct/ring switch,
			// many chunks and two lanes.
			for _, length := range []int{0, 1, 7, 3*n + 1, 127, 129, 255, 257, 5003, 40001} {
				for _, op := range []Op{OpSum, OpAvg, OpMax, OpMin} {
					checkAllReduce(t, w, rng, length, op)
				}
			}
			for _, length := range []int{0, 1, 1023, 1025, 40001} {
				for root := 0; root < n; root++ {
					checkBroadcast(t, w, rng, length, root)
				}
				checkAllGather(t, w, rng, length)
			}
			checkBarrier(t, w)
		}
	}
}

func checkBroadcast(t *testing.T, w *testWorld, rng *rand.Rand, length, root int) {
	t.Helper()
	n := len(w.rings)
	bufs := make([][]byte, n)
	for r := range bufs {
		bufs[r] = make([]byte, length)
		for i := range bufs[r] {
			bufs[r][i] = byte(rng.Uint32())
		}
	}
	want := append([]byte(nil), bufs[root]...)
	w.must(t, fmt.Sprintf("broadcast len %d root %d", length, root), func(rank int, r *Ring) error {
		return r.Broadcast(context.Background(), bufs[rank], root)
	})
	for r := range bufs {
		if !bytes.Equal(bufs[r], want) {
			t.Fatalf("n=%d broadcast len %d root %d: rank %d differs", n, length, root, r)
		}
	}
}

func checkAllGather(t *testing.T, w *testWorld, rng *rand.Rand, length int) {
	t.Helper()
	n := len(w.rings)
	send := make([][]byte, n)
	recv := make([][]byte, n)
	var want []byte
	for r := range send {
		send[r] = make([]byte, length)
		for i := range send[r] {
			send[r][i] = byte(rng.Uint32())
		}
		want = append(want, send[r]...)
		recv[r] = make([]byte, n*length)
	}
	w.must(t, fmt.Sprintf("allgather len %d", length), func(rank int, r *Ring) error {
		return r.AllGather(context.Background(), send[rank], recv[rank])
	})
	for r := range recv {
		if !bytes.Equal(recv[r], want) {
			t.Fatalf("n=%d allgather len %d: rank %d differs", n, length, r)
		}
	}
}

func checkBarrier(t *testing.T, w *testWorld) {
	t.Helper()
	n := int64(len(w.rings))
	var entered atomic.Int64
	w.must(t, "barrier", func(rank int, r *Ring) error {
		entered.Add(1)
		if err := r.Barrier(context.Background()); err != nil {
			return err
		}
		if got := entered.Load(); got != n {
			return fmt.Errorf("left the barrier with %d of %d ranks entered", got, n)
		}
		return nil
	})
}

// TestPairAllReduceSameBits: the two-rank exchange gives both ranks the
// same bits for every op, NaNs (with different payloads on the two ranks)
// and signed zeros included, over shared memory, Unix sockets and TCP, on
// one lane and on two (a buffer of at least two lanes' worth of chunks).
func TestPairAllReduceSameBits(t *testing.T) {
	for _, tp := range transports {
		t.Run(tp.name, func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.LocalSockets, cfg.SharedMemory = tp.local, tp.shmem
			w := newTestWorld(t, 2, cfg)
			chunk := cfg.ChunkBytes / 4
			for _, length := range []int{cfg.DirectBytes/4 + 1, 3*chunk + 5, 2*shmSlots*chunk + 7} {
				if got, want := w.rings[0].allReduceLanes(4*length), min(2, length/(shmSlots*chunk)); got != max(1, want) {
					t.Fatalf("len %d: %d lanes, want %d", length, got, max(1, want))
				}
				for _, op := range []Op{OpSum, OpAvg, OpMax, OpMin} {
					bufs := [2][]float32{make([]float32, length), make([]float32, length)}
					for i := range length {
						for r := range bufs {
							switch i % 5 {
							case 0: // two NaNs with different payloads
								bufs[r][i] = math.Float32frombits(0x7fc00001 + uint32(r))
							case 1: // one NaN
								bufs[r][i] = 1.5
								if r == 1 {
									bufs[r][i] = float32(math.NaN())
								}
							case 2: // signed zeros
								bufs[r][i] = float32(math.Copysign(0, float64(r)-0.5))
							default:
								bufs[r][i] = float32(i*(r+1)) / 7
							}
						}
					}
					w.must(t, fmt.Sprintf("%v len %d", op, length), func(rank int, r *Ring) error {
						return r.AllReduceFloat32(context.Background(), bufs[rank], op)
					})
					for i := range length {
						if a, b := math.Float32bits(bufs[0][i]), math.Float32bits(bufs[1][i]); a != b {
							t.Fatalf("%v len %d: [%d] is %#x on rank 0, %#x on rank 1", op, length, i, a, b)
						}
					}
				}
			}
		})
	}
}

// TestAllReduce16Mi runs one allreduce of 16 Mi float32 elements (64 MiB per
// rank) with the default configuration.
func TestAllReduce16Mi(t *testing.T) {
	const n, length = 2, 16 << 20
	w := newTestWorld(t, n, testConfig(t))
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, length)
		for i := range bufs[r] {
			bufs[r][i] = float32(i%1000 + r) // integers: exact in any order
		}
	}
	w.must(t, "allreduce 16Mi", func(rank int, r *Ring) error {
		return r.AllReduceFloat32(context.Background(), bufs[rank], OpSum)
	})
	for r := range bufs {
		for i, v := range bufs[r] {
			if want := float32(2*(i%1000) + 1); v != want {
				t.Fatalf("rank %d [%d] = %v, want %v", r, i, v, want)
			}
		}
	}
}

func TestLocal(t *testing.T) {
	s := NewLocal()
	ctx := context.Background()
	buf := []float32{1, 2, 3}
	if err := s.AllReduceFloat32(ctx, buf, OpAvg); err != nil || buf[2] != 3 {
		t.Fatalf("AllReduceFloat32: %v %v", err, buf)
	}
	if err := s.AllReduceFloat64(ctx, []float64{1}, Op(9)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad op: %v", err)
	}
	if err := s.Broadcast(ctx, []byte{1}, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad root: %v", err)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Barrier(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	s.Close()
	if err := s.Barrier(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if s.Rank() != 0 || s.Size() != 1 {
		t.Fatal("rank/size")
	}
}

// TestMismatchFailsEveryRank: ranks that disagree on the operation all get
// an error (ErrMismatch where they saw the frame), and no rank hangs.
func TestMismatchFailsEveryRank(t *testing.T) {
	cases := []struct {
		name string
		f    func(rank int, r *Ring) error
	}{
		{"length direct", func(rank int, r *Ring) error {
			return r.AllReduceFloat32(context.Background(), make([]float32, 10+min(rank, 1)), OpSum)
		}},
		{"length ring", func(rank int, r *Ring) error {
			return r.AllReduceFloat32(context.Background(), make([]float32, 5000+min(rank, 1)), OpSum)
		}},
		{"op", func(rank int, r *Ring) error {
			op := OpSum
			if rank == 1 {
				op = OpMax
			}
			return r.AllReduceFloat64(context.Background(), make([]float64, 3000), op)
		}},
		{"type", func(rank int, r *Ring) error {
			if rank == 2 {
				return r.AllReduceFloat64(context.Background(), make([]float64, 8), OpSum)
			}
			return r.AllReduceFloat32(context.Background(), make([]float32, 16), OpSum)
		}},
		{"sequence", func(rank int, r *Ring) error {
			if rank == 1 {
				r.seq++ // as if rank 1 had run one more operation
			}
			return r.AllReduceFloat32(context.Background(), make([]float32, 5000), OpSum)
		}},
		{"kind", func(rank int, r *Ring) error {
			if rank == 0 {
				return r.Barrier(context.Background())
			}
			return r.AllReduceFloat32(context.Background(), nil, OpSum)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newTestWorld(t, 3, smallConfig(t))
			// Reach the same sequence number first, then disagree.
			w.must(t, "barrier", func(_ int, r *Ring) error { return r.Barrier(context.Background()) })
			start := time.Now()
			errs := w.each(c.f)
			for rank, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: no error", rank)
				}
				if !errors.Is(err, ErrMismatch) && !errors.Is(err, ErrPeerLost) {
					t.Fatalf("rank %d: %v, want ErrMismatch", rank, err)
				}
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Fatalf("took %v", el)
			}
			// The Ring stays broken with the same error.
			if err := w.rings[0].Barrier(context.Background()); !errors.Is(err, errs[0]) && err.Error() != errs[0].Error() {
				t.Fatalf("after failure: %v, want %v", err, errs[0])
			}
		})
	}
}

func nil2rng() *rand.Rand { return rand.New(rand.NewPCG(7, 7)) }

// TestRecursiveDoubling: small allreduces of worlds larger than
// directMaxWorld use recursive doubling; here forced for small worlds too
// (powers of two and not), and natural for a world of 12.
func TestRecursiveDoubling(t *testing.T) {
	saved := directMaxWorld
	defer func() { directMaxWorld = saved }()
	for _, n := range []int{2, 3, 5, 6, 8, 12} {
		directMaxWorld = 1
		if n == 12 {
			directMaxWorld = saved
		}
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			w := newTestWorld(t, n, smallConfig(t))
			rng := rand.New(rand.NewPCG(uint64(n), 9))
			for _, length := range []int{0, 1, 7, 3*n + 1, 100} {
				for _, op := range []Op{OpSum, OpAvg, OpMax, OpMin} {
					checkAllReduce(t, w, rng, length, op)
				}
			}
		})
	}
}

// TestBucketsTwoRanksReduceInPlace: on two ranks over shared memory,
// Buckets reduce fused tensors where they lie (the bucket's buffer stays
// untouched) with the bits of AllReduceFloat32 on their concatenation,
// for every op, tensors crossing chunk and lane boundaries; over Unix
// sockets they are fused as before, with the same bits.
func TestBucketsTwoRanksReduceInPlace(t *testing.T) {
	for _, tp := range transports[:2] { // shm, unix
		t.Run(tp.name, func(t *testing.T) {
			cfg := smallConfig(t)
			cfg.LocalSockets, cfg.SharedMemory = tp.local, tp.shmem
			w := newTestWorld(t, 2, cfg)
			rng := rand.New(rand.NewPCG(7, 7))
			lengths := []int{1000, 3, 0, 2049, 17, 5000, 1, 4093, 9000}
			for _, op := range []Op{OpSum, OpAvg, OpMax, OpMin} {
				var tensors [2][][]float32
				var flat [2][]float32
				for r := range 2 {
					for _, n := range lengths {
						x := make([]float32, n)
						for i := range x {
							x[i] = float32(rng.NormFloat64())
						}
						tensors[r] = append(tensors[r], x)
						flat[r] = append(flat[r], x...)
					}
				}
				var bk [2]*Buckets
				for r := range 2 {
					bk[r] = NewBuckets(tensors[r], 1<<20)
				}
				w.must(t, fmt.Sprintf("buckets %v", op), func(rank int, r *Ring) error {
					return bk[rank].AllReduce(context.Background(), r, op)
				})
				w.must(t, fmt.Sprintf("flat %v", op), func(rank int, r *Ring) error {
					return r.AllReduceFloat32(context.Background(), flat[rank], op)
				})
				for r := range 2 {
					off := 0
					for ti, x := range tensors[r] {
						for i, v := range x {
							if math.Float32bits(v) != math.Float32bits(flat[r][off+i]) {
								t.Fatalf("%v: rank %d tensor %d [%d] = %v, the concatenation's reduction gives %v", op, r, ti, i, v, flat[r][off+i])
							}
						}
						off += len(x)
					}
					untouched := !slices.ContainsFunc(bk[r].buckets[0].buf, func(v float32) bool { return v != 0 })
					if untouched != tp.shmem {
						t.Fatalf("%v: rank %d: bucket buffer untouched = %v with shared memory %v", op, r, untouched, tp.shmem)
					}
				}
			}
		})
	}
}
