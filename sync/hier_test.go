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

// Hosts in one process: ranks that listen on 127.0.0.h+1 are on "host h"
// for the layout (the host part of their addresses), though every byte
// still goes over this machine's loopback and Unix sockets.

// hostWorld connects a world whose rank r listens on 127.0.0.(hostOf[r]+1).
func hostWorld(t testing.TB, hostOf []int, cfg Config) *testWorld {
	t.Helper()
	ts := make([]*Transport, len(hostOf))
	addrs := make([]string, len(hostOf))
	for r, h := range hostOf {
		tr, err := Listen(context.Background(), fmt.Sprintf("127.0.0.%d:0", h+1), cfg)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		t.Cleanup(func() { tr.Close() })
		ts[r], addrs[r] = tr, tr.Addr()
	}
	return &testWorld{cfg: cfg, ts: ts, rings: connectAll(t, ts, addrs, 1)}
}

func TestLayoutGroupsRanksByHost(t *testing.T) {
	addrs := func(hosts ...string) []string {
		out := make([]string, len(hosts))
		for i, h := range hosts {
			out[i] = h + ":" + fmt.Sprint(1000+i)
		}
		return out
	}
	cases := []struct {
		name  string
		addrs []string
		want  Hierarchy
		mode  Hierarchy
		hosts [][]int
		// groups by rank: host ring, ring between hosts
		host, cross [][]int
	}{
		{"one host", addrs("a", "a", "a"), HierarchyAuto, HierarchyOff, [][]int{{0, 1, 2}}, nil, nil},
		{"one rank per host", addrs("a", "b", "c"), HierarchyAuto, HierarchyOff, [][]int{{0}, {1}, {2}}, nil, nil},
		{"2x2 leaders", addrs("a", "a", "b", "b"), HierarchyLeaders, HierarchyLeaders, [][]int{{0, 1}, {2, 3}},
			[][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}, [][]int{{0, 2}, nil, {0, 2}, nil}},
		{"2x2 auto is striped", addrs("a", "a", "b", "b"), HierarchyAuto, HierarchyStriped, [][]int{{0, 1}, {2, 3}},
			[][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}, [][]int{{0, 2}, {1, 3}, {0, 2}, {1, 3}}},
		{"uneven auto is leaders", addrs("a", "b", "b"), HierarchyAuto, HierarchyLeaders, [][]int{{0}, {1, 2}},
			[][]int{{0}, {1, 2}, {1, 2}}, [][]int{{0, 1}, {0, 1}, nil}},
		{"2x2 interleaved striped", addrs("a", "b", "a", "b"), HierarchyStriped, HierarchyStriped, [][]int{{0, 2}, {1, 3}},
			[][]int{{0, 2}, {1, 3}, {0, 2}, {1, 3}}, [][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}},
		{"uneven striped falls back to leaders", addrs("a", "a", "a", "b"), HierarchyStriped, HierarchyLeaders, [][]int{{0, 1, 2}, {3}},
			[][]int{{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {3}}, [][]int{{0, 3}, nil, nil, {0, 3}}},
		{"off", addrs("a", "a", "b", "b"), HierarchyOff, HierarchyOff, [][]int{{0, 1}, {2, 3}}, nil, nil},
		{"IPv4-mapped and plain IPv6 compare as addresses", []string{"10.0.0.1:1", "[::ffff:10.0.0.1]:2", "[fd00::1]:3", "[FD00::1]:4"},
			HierarchyLeaders, HierarchyLeaders, [][]int{{0, 1}, {2, 3}}, [][]int{{0, 1}, {0, 1}, {2, 3}, {2, 3}}, [][]int{{0, 2}, nil, {0, 2}, nil}},
		{"names compare without case", []string{"Worker-0.job:1", "worker-0.JOB:2", "worker-1.job:3"}, HierarchyAuto, HierarchyLeaders,
			[][]int{{0, 1}, {2}}, [][]int{{0, 1}, {0, 1}, {2}}, [][]int{{0, 2}, nil, {0, 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayout(tc.addrs, tc.want)
			if l.mode != tc.mode {
				t.Fatalf("mode %v, want %v", l.mode, tc.mode)
			}
			if fmt.Sprint(l.hosts) != fmt.Sprint(tc.hosts) {
				t.Fatalf("hosts %v, want %v", l.hosts, tc.hosts)
			}
			for r := range tc.addrs {
				g := l.groups(r)
				if len(g[groupFlat]) != len(tc.addrs) {
					t.Fatalf("rank %d flat ring %v", r, g[groupFlat])
				}
				var host, cross []int
				if tc.host != nil {
					host, cross = tc.host[r], tc.cross[r]
				}
				if !slices.Equal(g[groupHost], host) || !slices.Equal(g[groupCross], cross) {
					t.Fatalf("rank %d: host ring %v, ring between hosts %v; want %v, %v", r, g[groupHost], g[groupCross], host, cross)
				}
			}
		})
	}
}

// hierLayouts are worlds of ranks on hosts (host of each rank): even,
// uneven, interleaved, and the flat ones for comparison.
var hierLayouts = []struct {
	name   string
	hostOf []int
}{
	{"2x2", []int{0, 0, 1, 1}},
	{"2x2 interleaved", []int{0, 1, 0, 1}},
	{"3+1", []int{0, 0, 0, 1}},
	{"1+2+3", []int{0, 1, 1, 2, 2, 2}},
	{"2x3", []int{0, 0, 0, 1, 1, 1}},
	{"4x1", []int{0, 1, 2, 3}},
	{"1x4", []int{0, 0, 0, 0}},
}

// Every layout and mode allreduces correctly: integer-valued inputs (exact
// in any order) give exactly the sum, max, min or mean; random ones agree
// with the exact value within float32's tolerance and are bit-identical on
// every rank; sizes cover one and several pieces, uneven splits and both
// lanes. (HierarchyOff is the flat ring of the other tests.)
func TestHierarchicalAllReduceIsCorrectOnEveryLayout(t *testing.T) {
	defer setPieces(8<<10, 8)()
	for _, lay := range hierLayouts {
		for _, mode := range []Hierarchy{HierarchyLeaders, HierarchyStriped} {
			t.Run(fmt.Sprintf("%s/%v", lay.name, mode), func(t *testing.T) {
				cfg := smallConfig(t)
				cfg.Hierarchy = mode
				w := hostWorld(t, lay.hostOf, cfg)
				rng := rand.New(rand.NewPCG(uint64(len(lay.hostOf)), uint64(mode)))
				// One piece and two lanes; eight pieces of uneven length.
				for _, length := range []int{5003, 40001} {
					for _, op := range []Op{OpSum, OpAvg, OpMax, OpMin} {
						checkExactInts(t, w, rng, length, op)
					}
					checkAllReduceTolerance(t, w, rng, length)
				}
			})
		}
	}
}

// One, two or three streams per ring give the same exact results.
func TestHierarchicalAllReduceWithOtherStreamCounts(t *testing.T) {
	defer setPieces(8<<10, 8)()
	for _, streams := range []int{1, 3} {
		for _, lay := range []struct {
			name   string
			hostOf []int
		}{{"2x2", []int{0, 0, 1, 1}}, {"1+2+3", []int{0, 1, 1, 2, 2, 2}}} {
			t.Run(fmt.Sprintf("%s/streams=%d", lay.name, streams), func(t *testing.T) {
				cfg := smallConfig(t)
				cfg.Streams = streams
				w := hostWorld(t, lay.hostOf, cfg)
				rng := rand.New(rand.NewPCG(uint64(streams), 5))
				for _, op := range []Op{OpSum, OpAvg} {
					checkExactInts(t, w, rng, 40001, op)
				}
			})
		}
	}
}

func setPieces(bytes, most int) func() {
	b, m := hierPieceBytes, hierMaxPieces
	hierPieceBytes, hierMaxPieces = bytes, most
	return func() { hierPieceBytes, hierMaxPieces = b, m }
}

// checkExactInts allreduces integer-valued float64 and float32 buffers
// with op and checks every element on every rank against the exact result.
func checkExactInts(t *testing.T, w *testWorld, rng *rand.Rand, length int, op Op) {
	t.Helper()
	n := len(w.rings)
	in := make([][]float64, n)
	for r := range in {
		in[r] = make([]float64, length)
		for i := range in[r] {
			in[r][i] = float64(rng.IntN(1<<20) - 1<<19)
		}
	}
	want := make([]float64, length)
	for i := range want {
		acc := in[0][i]
		for r := 1; r < n; r++ {
			acc = combine64(op, acc, in[r][i])
		}
		if op == OpAvg {
			acc /= float64(n)
		}
		want[i] = acc
	}
	got64 := make([][]float64, n)
	got32 := make([][]float32, n)
	for r := range in {
		got64[r] = slices.Clone(in[r])
		got32[r] = make([]float32, length)
		for i, v := range in[r] {
			got32[r][i] = float32(v)
		}
	}
	w.must(t, fmt.Sprintf("float64 %v len %d", op, length), func(rank int, r *Ring) error {
		return r.AllReduceFloat64(context.Background(), got64[rank], op)
	})
	w.must(t, fmt.Sprintf("float32 %v len %d", op, length), func(rank int, r *Ring) error {
		return r.AllReduceFloat32(context.Background(), got32[rank], op)
	})
	for r := range got64 {
		for i := range want {
			if got64[r][i] != want[i] {
				t.Fatalf("float64 %v len %d: rank %d [%d] = %v, want %v", op, length, r, i, got64[r][i], want[i])
			}
			// Sums of 2^20-sized integers over a few ranks fit float32's
			// 24 bits, so float32 is exact too, except OpAvg's division.
			if w32 := float32(want[i]); op != OpAvg && got32[r][i] != w32 {
				t.Fatalf("float32 %v len %d: rank %d [%d] = %v, want %v", op, length, r, i, got32[r][i], w32)
			}
			if got32[r][i] != got32[0][i] {
				t.Fatalf("float32 %v len %d: [%d] differs between rank 0 and rank %d", op, length, i, r)
			}
		}
	}
}

// checkAllReduceTolerance allreduces random float32 values: within
// tolerance of the exact sum, bit-identical on all ranks, and the same bits
// when run again.
func checkAllReduceTolerance(t *testing.T, w *testWorld, rng *rand.Rand, length int) {
	t.Helper()
	n := len(w.rings)
	in := randBufs(rng, n, length)
	run := func() [][]float32 {
		got := make([][]float32, n)
		for r := range got {
			got[r] = make([]float32, length)
			for i, v := range in[r] {
				got[r][i] = float32(v)
			}
		}
		w.must(t, "float32 sum", func(rank int, r *Ring) error {
			return r.AllReduceFloat32(context.Background(), got[rank], OpSum)
		})
		return got
	}
	got, again := run(), run()
	for i := 0; i < length; i++ {
		var exact, abs float64
		for r := range in {
			v := float64(float32(in[r][i]))
			exact += v
			abs += math.Abs(v)
		}
		for r := range got {
			if d := math.Abs(float64(got[r][i]) - exact); d > tol32(n, abs) {
				t.Fatalf("len %d: rank %d [%d] = %v, want %v (diff %g)", length, r, i, got[r][i], exact, d)
			}
			if math.Float32bits(got[r][i]) != math.Float32bits(got[0][i]) || math.Float32bits(again[r][i]) != math.Float32bits(got[0][i]) {
				t.Fatalf("len %d: [%d] not bit-identical across ranks and runs", length, i)
			}
		}
	}
}

// The trainer's deterministic mode sums integer-valued float64 (fixed
// point): any order of the additions gives the same exact sum, so the
// result is bit-identical whatever the layout of the round (flat ring,
// one host, hierarchical on even or uneven hosts, striped or not), as long
// as the partial sums stay within 2^53. Values here span up to 2^48, the
// way fixed-point gradients do.
func TestDeterministicSumsAreBitIdenticalAcrossLayouts(t *testing.T) {
	defer setPieces(16<<10, 8)()
	const length = 70001
	rng := rand.New(rand.NewPCG(7, 7))
	// One global set of contributions, indexed by rank: every layout below
	// has 4 or 6 ranks; contributions of ranks 4 and 5 are zero in 4-rank
	// worlds, so every world sums the same numbers.
	contrib := make([][]float64, 6)
	for r := range contrib {
		contrib[r] = make([]float64, length)
		if r >= 4 {
			continue
		}
		for i := range contrib[r] {
			contrib[r][i] = float64(rng.Int64N(1<<49) - 1<<48)
		}
	}
	var ref []float64
	refName := ""
	for _, lay := range hierLayouts {
		for _, mode := range []Hierarchy{HierarchyAuto, HierarchyStriped, HierarchyOff} {
			cfg := smallConfig(t)
			cfg.Hierarchy = mode
			w := hostWorld(t, lay.hostOf, cfg)
			n := len(lay.hostOf)
			got := make([][]float64, n)
			for r := range got {
				got[r] = slices.Clone(contrib[r])
			}
			w.must(t, "sum", func(rank int, r *Ring) error {
				return r.AllReduceFloat64(context.Background(), got[rank], OpSum)
			})
			name := fmt.Sprintf("%s/%v (runs %v)", lay.name, mode, w.rings[0].layout.mode)
			for r := range got {
				if ref == nil {
					ref, refName = got[r], name
				}
				for i := range ref {
					if math.Float64bits(got[r][i]) != math.Float64bits(ref[i]) {
						t.Fatalf("%s rank %d [%d] = %v, %s gave %v", name, r, i, got[r][i], refName, ref[i])
					}
				}
			}
			for _, r := range w.rings {
				r.Close()
			}
		}
	}
}

// A hierarchical round forms the rings it needs and reports them; its
// large allreduces do not allocate.
func TestHierarchicalRoundsAreFormedAndDoNotAllocate(t *testing.T) {
	for _, mode := range []Hierarchy{HierarchyLeaders, HierarchyStriped} {
		t.Run(mode.String(), func(t *testing.T) { testHierarchicalRound(t, mode) })
	}
	flat := hostWorld(t, []int{0, 0, 0}, testConfig(t))
	if flat.rings[0].Hierarchical() {
		t.Fatal("one host: hierarchical")
	}
}

func testHierarchicalRound(t *testing.T, mode Hierarchy) {
	cfg := testConfig(t)
	cfg.Hierarchy = mode
	w := hostWorld(t, []int{0, 0, 1, 1}, cfg)
	for r, ring := range w.rings {
		if ring.Hierarchy() != mode {
			t.Fatalf("rank %d: %v", r, ring.Hierarchy())
		}
		// Every rank is in its host's ring; in the ring between hosts only
		// the leaders (ranks 0 and 2), or with stripes every rank.
		if ring.groups[groupHost] == nil || (ring.groups[groupCross] != nil) != (r%2 == 0 || mode == HierarchyStriped) {
			t.Fatalf("rank %d: host ring %v, ring between hosts %v", r, ring.groups[groupHost] != nil, ring.groups[groupCross] != nil)
		}
	}
	// Ranks 1..3 run from persistent goroutines, so that starting an
	// operation on them allocates nothing; AllocsPerRun counts every
	// goroutine of the process.
	bufs := make([][]float32, 4)
	for r := range bufs {
		bufs[r] = make([]float32, 3<<20/4)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := make([]chan struct{}, 4)
	done := make(chan error, 4)
	stop := make(chan struct{})
	finished := make(chan struct{}, 4)
	op := func(rank int) error { return w.rings[rank].AllReduceFloat32(ctx, bufs[rank], OpSum) }
	for rank := 1; rank < 4; rank++ {
		start[rank] = make(chan struct{})
		go func() {
			defer func() { finished <- struct{}{} }()
			for {
				select {
				case <-start[rank]:
					done <- op(rank)
				case <-stop:
					return
				}
			}
		}()
	}
	defer func() {
		close(stop)
		for range 3 {
			<-finished
		}
	}()
	var err error
	allocs := testing.AllocsPerRun(5, func() {
		for rank := 1; rank < 4; rank++ {
			start[rank] <- struct{}{}
		}
		if e := op(0); e != nil && err == nil {
			err = e
		}
		for range 3 {
			if e := <-done; e != nil && err == nil {
				err = e
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs > 0 {
		t.Errorf("%v allocations per hierarchical allreduce over the 4 ranks", allocs)
	}
}

// Ranks that disagree on Config.Hierarchy cannot form a round (they expect
// different connections), rather than hang or mix protocols: every rank's
// Connect names the setting, with each rank's value, in a *LayoutError.
func TestRanksThatDisagreeOnHierarchyDoNotConnect(t *testing.T) {
	cfg := testConfig(t)
	cfg.DialTimeout = 20 * time.Second // a layout mismatch never waits it out
	off := cfg
	off.Hierarchy = HierarchyOff
	var ts []*Transport
	var addrs []string
	for r, c := range []Config{cfg, cfg, off, off} {
		tr, err := Listen(context.Background(), fmt.Sprintf("127.0.0.%d:0", r/2+1), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		ts, addrs = append(ts, tr), append(addrs, tr.Addr())
	}
	rings, errs := tryConnectAll(ts, addrs, 1)
	for _, r := range rings {
		if r != nil {
			r.Close()
			t.Fatal("a round formed from ranks with different Hierarchy settings")
		}
	}
	for r, err := range errs {
		checkLayoutError(t, r, err, "sync hierarchy", []string{"auto", "auto", "off", "off"})
	}
}

// A rank that goes while the others are in a hierarchical allreduce makes
// every other rank fail with a PeerError naming it, at once, whichever ring
// (within its host or between hosts) it was on.
func TestHierarchicalAllReduceFailsFastWhenARankGoes(t *testing.T) {
	for _, victim := range []int{0, 1, 3} { // a leader, a non-leader, the other host's non-leader
		t.Run(fmt.Sprint("rank ", victim), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.OpTimeout = 20 * time.Second
			w := hostWorld(t, []int{0, 0, 1, 1}, cfg)
			bufs := make([][]float32, 4)
			for r := range bufs {
				bufs[r] = make([]float32, 4<<20/4)
			}
			start := time.Now()
			errs := w.each(func(rank int, r *Ring) error {
				if rank != victim {
					return r.AllReduceFloat32(context.Background(), bufs[rank], OpSum)
				}
				// The victim never joins the collective: once every other
				// rank is in it, it closes its transport.
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
					in := 0
					for q, o := range w.rings {
						if q != victim && o.inOp.Load() {
							in++
						}
					}
					if in == 3 {
						break
					}
					time.Sleep(time.Millisecond) // polling a condition with a deadline
				}
				return w.ts[rank].Close()
			})
			if el := time.Since(start); el > 10*time.Second {
				t.Fatalf("took %v", el)
			}
			for r, err := range errs {
				if r == victim {
					continue
				}
				var pe *PeerError
				if !errors.As(err, &pe) || pe.Rank != victim {
					t.Errorf("rank %d: %v, want a PeerError naming rank %d", r, err, victim)
				}
			}
		})
	}
}
