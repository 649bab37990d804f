package dataloader

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Samples are ids: sample i of the test dataset is idOf(i), so a batch's
// Data proves Get was called for its Indices.
func idOf(i int) int { return 100000 + i }

func idDataset(n int) Dataset[int] {
	s := make([]int, n)
	for i := range s {
		s[i] = idOf(i)
	}
	return FromSlice(s)
}

func collateIDs(_ context.Context, samples []int, _ []int) ([]int, error) {
	return slices.Clone(samples), nil
}

// globalBatch is what the whole world served for one step: the ranks'
// shares concatenated in rank order.
type globalBatch struct {
	Epoch, Step, GlobalSize int
	Next                    Cursor
	Indices                 []int
}

type world struct {
	t       testing.TB
	cfg     Config
	loaders []*Loader[int, []int]
}

func newWorld(t testing.TB, ds Dataset[int], cfg Config, size int, c Cursor) *world {
	t.Helper()
	w := &world{t: t, cfg: cfg}
	for r := range size {
		l, err := New(ds, collateIDs, cfg)
		mustNoError(t, err)
		mustNoError(t, l.Reset(c, r, size))
		w.loaders = append(w.loaders, l)
	}
	return w
}

func (w *world) close() {
	for _, l := range w.loaders {
		mustNoError(w.t, l.Close())
	}
}

// next reads one batch on every rank and checks they agree and fit
// together; it does not commit.
func (w *world) next() (globalBatch, []Batch[[]int]) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	var g globalBatch
	var bs []Batch[[]int]
	for r, l := range w.loaders {
		b, err := l.Next(ctx)
		mustNoError(t, err, "rank %d", r)
		if r == 0 {
			g = globalBatch{Epoch: b.Epoch, Step: b.Step, GlobalSize: b.GlobalSize, Next: b.Next}
		}
		mustEqual(t, g, globalBatch{Epoch: b.Epoch, Step: b.Step, GlobalSize: b.GlobalSize, Next: b.Next, Indices: g.Indices},
			"rank %d disagrees with rank 0", r)
		mustEqual(t, len(g.Indices), b.Offset, "rank %d offset", r)
		ids := make([]int, len(b.Indices))
		if b.Data == nil {
			b.Data = []int{} // slices.Clone of an empty share gives nil
		}
		for k := range b.Micro {
			if b.Micro[k].Data == nil {
				b.Micro[k].Data = []int{}
			}
		}
		for i, x := range b.Indices {
			ids[i] = idOf(x)
		}
		if w.cfg.MicroBatch == 0 {
			mustEqual(t, ids, b.Data, "rank %d data", r)
			mustTrue(t, b.Micro == nil)
		} else {
			m := w.cfg.MicroBatch
			first, cnt := MicroShareOf(b.GlobalSize, m, r, len(w.loaders))
			mustEqual(t, cnt, len(b.Micro), "rank %d micro-batch count", r)
			pos := 0
			for k, mb := range b.Micro {
				mustEqual(t, first+k, mb.Index)
				mustEqual(t, pos, mb.Lo)
				mustEqual(t, min(m, b.GlobalSize-mb.Index*m), mb.Hi-mb.Lo, "micro-batch size")
				mustEqual(t, ids[mb.Lo:mb.Hi], mb.Data)
				sub := b.MicroBatch(k)
				mustEqual(t, b.Indices[mb.Lo:mb.Hi], sub.Indices)
				mustEqual(t, b.Offset+mb.Lo, sub.Offset)
				mustEqual(t, mb.Index*m, sub.Offset, "micro-batch starts at its fixed place in the global batch")
				pos = mb.Hi
			}
			mustEqual(t, len(b.Indices), pos)
		}
		g.Indices = append(g.Indices, b.Indices...)
		bs = append(bs, b)
	}
	mustEqual(t, g.GlobalSize, len(g.Indices), "shares add up to the global batch")
	return g, bs
}

// step reads and commits one global batch on every rank.
func (w *world) step() globalBatch {
	g, bs := w.next()
	for r, l := range w.loaders {
		l.Commit(bs[r])
	}
	return g
}

// cursor returns the committed cursor, checking every rank agrees.
func (w *world) cursor() Cursor {
	c := w.loaders[0].Cursor()
	for r, l := range w.loaders {
		mustEqual(w.t, c, l.Cursor(), "rank %d committed cursor", r)
	}
	return c
}

// ledger counts, per epoch, how often each sample index was part of a
// committed step.
type ledger map[int][]int

func (lg ledger) add(n int, g globalBatch) {
	if lg[g.Epoch] == nil {
		lg[g.Epoch] = make([]int, n)
	}
	for _, i := range g.Indices {
		lg[g.Epoch][i]++
	}
}

// check asserts every index of each of the epochs appears exactly once,
// except the tail dropped by DropLast which appears zero times.
func (lg ledger) check(t testing.TB, cfg Config, n, epochs int) {
	t.Helper()
	end := n
	if cfg.DropLast {
		end = n / cfg.GlobalBatch * cfg.GlobalBatch
	}
	for e := range epochs {
		var o []int
		if cfg.Shuffle {
			o = Order(cfg.Seed, e, n)
		} else {
			o = identityOrder(n)
		}
		counts := lg[e]
		mustTrue(t, counts != nil, "epoch %d never served", e)
		for pos, i := range o {
			want := 1
			if pos >= end {
				want = 0
			}
			if counts[i] != want {
				t.Fatalf("epoch %d: sample %d (position %d) applied %d times, want %d", e, i, pos, counts[i], want)
			}
		}
	}
}

type loaderCase struct {
	name string
	n    int
	cfg  Config
}

func loaderCases() []loaderCase {
	base := Config{GlobalBatch: 8, Seed: 11, Shuffle: true, Workers: 1}
	with := func(f func(*Config)) Config { c := base; f(&c); return c }
	return []loaderCase{
		{"sync/droplast", 53, with(func(c *Config) { c.DropLast = true })},
		{"sync/keep", 53, with(func(c *Config) {})},
		{"prefetch3x2/keep", 53, with(func(c *Config) { c.Prefetch, c.Workers = 3, 2 })},
		{"prefetch1/droplast", 53, with(func(c *Config) { c.Prefetch, c.DropLast = 1, true })},
		{"micro3/prefetch2/keep", 53, with(func(c *Config) { c.Prefetch, c.MicroBatch = 2, 3 })},
		{"micro4/sync/droplast", 53, with(func(c *Config) { c.MicroBatch, c.DropLast = 4, true })},
		{"noshuffle/prefetch2/keep", 50, with(func(c *Config) { c.Shuffle, c.Prefetch = false, 2 })},
		{"exact/prefetch2", 48, with(func(c *Config) { c.Prefetch = 2 })},
	}
}

// reference runs steps global batches uninterrupted on one rank.
func reference(t testing.TB, ds Dataset[int], cfg Config, steps int) []globalBatch {
	l, err := New(ds, collateIDs, cfg)
	mustNoError(t, err)
	w := &world{t: t, cfg: cfg, loaders: []*Loader[int, []int]{l}}
	defer w.close()
	ref := make([]globalBatch, steps)
	for i := range ref {
		ref[i] = w.step()
	}
	return ref
}

// TestReferenceMatchesOrder checks the uninterrupted run against the
// definition: step s of epoch e covers positions [s*B, s*B+G) of Order.
func TestReferenceMatchesOrder(t *testing.T) {
	for _, tc := range loaderCases() {
		t.Run(tc.name, func(t *testing.T) {
			ds := idDataset(tc.n)
			l, err := New(ds, collateIDs, tc.cfg)
			mustNoError(t, err)
			spe := l.StepsPerEpoch()
			ref := reference(t, ds, tc.cfg, 3*spe)
			for k, g := range ref {
				e, s := k/spe, k%spe
				mustEqual(t, e, g.Epoch)
				mustEqual(t, s, g.Step)
				o := identityOrder(tc.n)
				if tc.cfg.Shuffle {
					o = Order(tc.cfg.Seed, e, tc.n)
				}
				lo := s * tc.cfg.GlobalBatch
				hi := min(lo+tc.cfg.GlobalBatch, tc.n)
				mustEqual(t, o[lo:hi], g.Indices, "epoch %d step %d", e, s)
				want := Cursor{Seed: tc.cfg.Seed, DatasetLen: tc.n, GlobalBatch: tc.cfg.GlobalBatch, Shuffle: tc.cfg.Shuffle, Epoch: e, Position: hi}
				if s == spe-1 {
					want.Epoch, want.Position = e+1, 0
				}
				mustEqual(t, want, g.Next)
			}
			mustNoError(t, l.Close())
		})
	}
}

// TestExactlyOnceStopResumeEverywhere stops the job after every step of
// three epochs (including before the first step, after the last batch of an
// epoch, i.e. exactly at an epoch boundary, and after the last step), with
// uncommitted batches read and prefetched at the stop; saves the committed
// cursor as bytes; resumes in fresh loaders with another world size; and
// checks the resumed batches equal the uninterrupted run's and every sample
// of every epoch is applied exactly once.
func TestExactlyOnceStopResumeEverywhere(t *testing.T) {
	sizes := [][2]int{{4, 3}, {3, 5}, {5, 1}, {1, 4}, {2, 2}}
	for _, tc := range loaderCases() {
		t.Run(tc.name, func(t *testing.T) {
			ds := idDataset(tc.n)
			probe, err := New(ds, collateIDs, tc.cfg)
			mustNoError(t, err)
			spe := probe.StepsPerEpoch()
			start := probe.NewCursor()
			mustNoError(t, probe.Close())
			total := 3 * spe
			ref := reference(t, ds, tc.cfg, total)
			for k := 0; k <= total; k++ {
				sz := sizes[k%len(sizes)]
				lg := ledger{}
				a := newWorld(t, ds, tc.cfg, sz[0], start)
				for i := range k {
					g := a.step()
					mustEqual(t, ref[i], g, "before stop, step %d", i)
					lg.add(tc.n, g)
				}
				// Read (and so prefetch past) batches that are never committed:
				// a step that failed on some rank.
				for range 2 {
					a.next()
				}
				saved, err := a.cursor().MarshalBinary()
				mustNoError(t, err)
				a.close()

				var c Cursor
				mustNoError(t, c.UnmarshalBinary(saved))
				b := newWorld(t, ds, tc.cfg, sz[1], c)
				for i := k; i < total; i++ {
					g := b.step()
					mustEqual(t, ref[i], g, "stop after %d steps, resumed on %d ranks: step %d", k, sz[1], i)
					lg.add(tc.n, g)
				}
				b.close()
				lg.check(t, tc.cfg, tc.n, 3)
			}
		})
	}
}

// TestExactlyOnceWorldSizeChanges changes the world size 4 -> 3 -> 5 -> 1
// in the middle of epochs, each time after reading uncommitted batches, and
// reuses the same loaders (Reset) rather than new ones.
func TestExactlyOnceWorldSizeChanges(t *testing.T) {
	for _, tc := range loaderCases() {
		t.Run(tc.name, func(t *testing.T) {
			ds := idDataset(tc.n)
			probe, err := New(ds, collateIDs, tc.cfg)
			mustNoError(t, err)
			spe := probe.StepsPerEpoch()
			c := probe.NewCursor()
			mustNoError(t, probe.Close())
			total := 3 * spe
			ref := reference(t, ds, tc.cfg, total)
			// Change points in the middle of epochs 0, 1 and 2.
			changes := []int{spe / 2, spe + spe/2 + 1, 2*spe + 1}
			sizes := []int{4, 3, 5, 1}
			pool := newWorld(t, ds, tc.cfg, 5, c)
			defer pool.close()
			lg := ledger{}
			step := 0
			for seg, size := range sizes {
				w := &world{t: t, cfg: tc.cfg, loaders: pool.loaders[:size]}
				for r, l := range w.loaders {
					mustNoError(t, l.Reset(c, r, size))
				}
				stop := total
				if seg < len(changes) {
					stop = changes[seg]
				}
				for ; step < stop; step++ {
					g := w.step()
					mustEqual(t, ref[step], g, "world size %d, step %d", size, step)
					lg.add(tc.n, g)
				}
				w.next() // read but never committed
				c = w.cursor()
			}
			lg.check(t, tc.cfg, tc.n, 3)
		})
	}
}

// TestFewerSamplesThanRanks keeps a last global batch of 2 samples on 5
// ranks: three ranks get an empty share, which is valid.
func TestFewerSamplesThanRanks(t *testing.T) {
	cfg := Config{GlobalBatch: 4, Seed: 3, Shuffle: true, Prefetch: 2, Workers: 2}
	ds := idDataset(10)
	probe, err := New(ds, collateIDs, cfg)
	mustNoError(t, err)
	c := probe.NewCursor()
	mustNoError(t, probe.Close())
	w := newWorld(t, ds, cfg, 5, c)
	defer w.close()
	lg := ledger{}
	var sizes []int
	for range 3 {
		_, bs := w.next()
		var shares []int
		for r, b := range bs {
			shares = append(shares, len(b.Indices))
			w.loaders[r].Commit(b)
		}
		g := globalBatch{Epoch: bs[0].Epoch, GlobalSize: bs[0].GlobalSize}
		for _, b := range bs {
			g.Indices = append(g.Indices, b.Indices...)
		}
		lg.add(10, g)
		sizes = append(sizes, bs[0].GlobalSize)
		if bs[0].GlobalSize == 2 {
			mustEqual(t, []int{1, 1, 0, 0, 0}, shares)
			mustEqual(t, Cursor{Seed: 3, DatasetLen: 10, GlobalBatch: 4, Shuffle: true, Epoch: 1}, bs[0].Next)
		}
	}
	mustEqual(t, []int{4, 4, 2}, sizes)
	lg.check(t, cfg, 10, 1)
}

func TestResetRejectsMismatchedCursor(t *testing.T) {
	cfg := DefaultConfig()
	cfg.GlobalBatch, cfg.Seed = 4, 9
	l, err := New(idDataset(20), collateIDs, cfg)
	mustNoError(t, err)
	defer l.Close()
	good := l.NewCursor()
	bad := func(f func(*Cursor)) Cursor { c := good; f(&c); return c }
	mustErrorIs(t, l.Reset(bad(func(c *Cursor) { c.DatasetLen = 21 }), 0, 1), ErrCursorMismatch)
	mustErrorIs(t, l.Reset(bad(func(c *Cursor) { c.Seed = 10 }), 0, 1), ErrCursorMismatch)
	mustErrorIs(t, l.Reset(bad(func(c *Cursor) { c.GlobalBatch = 2 }), 0, 1), ErrCursorMismatch)
	mustErrorIs(t, l.Reset(bad(func(c *Cursor) { c.Shuffle = false }), 0, 1), ErrCursorMismatch)
	mustErrorIs(t, l.Reset(bad(func(c *Cursor) { c.Position = 2 }), 0, 1), ErrInvalidCursor)
	mustErrorIs(t, l.Reset(Cursor{}, 0, 1), ErrInvalidCursor)
	mustErrorIs(t, l.Reset(good, 2, 2), ErrInvalidWorld)
	mustErrorIs(t, l.Reset(good, 0, 0), ErrInvalidWorld)
	mustErrorIs(t, l.Reset(good, -1, 3), ErrInvalidWorld)
	mustNoError(t, l.Reset(good, 1, 2))
	err = l.Reset(bad(func(c *Cursor) { c.Seed = 10 }), 0, 1)
	mustTrue(t, err != nil && err.Error() == "dataloader: cursor does not match loader: cursor seed 10, loader seed 9", "message: %v", err)
}

// TestDropLastChangedSinceSave restores a cursor that points into the tail
// DropLast drops: it moves to the next epoch.
func TestDropLastChangedSinceSave(t *testing.T) {
	cfg := Config{GlobalBatch: 4, Shuffle: true, DropLast: true, Workers: 1}
	l, err := New(idDataset(10), collateIDs, cfg)
	mustNoError(t, err)
	defer l.Close()
	c := l.NewCursor()
	c.Epoch, c.Position = 2, 8
	mustNoError(t, l.Reset(c, 0, 1))
	mustEqual(t, 3, l.Cursor().Epoch)
	mustEqual(t, 0, l.Cursor().Position)
	b, err := l.Next(context.Background())
	mustNoError(t, err)
	mustEqual(t, [2]int{3, 0}, [2]int{b.Epoch, b.Step})
}

func TestNewRejectsBadConfig(t *testing.T) {
	ds := idDataset(10)
	for _, cfg := range []Config{
		{GlobalBatch: 0, Workers: 1},
		{GlobalBatch: 4, Workers: 0},
		{GlobalBatch: 4, Workers: 1, Prefetch: -1},
		{GlobalBatch: 4, Workers: 1, MicroBatch: -1},
		{GlobalBatch: 11, Workers: 1, DropLast: true},
	} {
		_, err := New(ds, collateIDs, cfg)
		mustErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	_, err := New(idDataset(0), collateIDs, DefaultConfig())
	mustErrorIs(t, err, ErrInvalidConfig)
	_, err = New[int, []int](nil, collateIDs, DefaultConfig())
	mustErrorIs(t, err, ErrInvalidConfig)
	mustNoError(t, DefaultConfig().Validate())
	d := DefaultConfig()
	mustEqual(t, Config{GlobalBatch: 64, Shuffle: true, DropLast: true, Prefetch: 2, Workers: 1}, d)
}

// flakyDataset fails Get for one index while failing is set.
type flakyDataset struct {
	Dataset[int]
	bad     int
	failing atomic.Bool
}

var errFlaky = errors.New("flaky read")

func (f *flakyDataset) Get(ctx context.Context, i int) (int, error) {
	if i == f.bad && f.failing.Load() {
		return 0, errFlaky
	}
	return f.Dataset.Get(ctx, i)
}

// TestNextErrorRetriesSameBatch: a Get error surfaces from Next with the
// epoch and step, and the next call serves the same batch again. The read
// fails until Next has returned its error: a build that Next started
// ahead of its own batch and abandoned when that batch was ready drops its
// outcome, a failed read included (its batch is built again later), so a
// read that failed only once there would never surface, rightly.
func TestNextErrorRetriesSameBatch(t *testing.T) {
	for _, prefetch := range []int{0, 3} {
		t.Run(fmt.Sprint("prefetch", prefetch), func(t *testing.T) {
			cfg := Config{GlobalBatch: 4, Seed: 1, Shuffle: true, Prefetch: prefetch, Workers: 2}
			o := Order(1, 0, 20)
			ds := &flakyDataset{Dataset: idDataset(20), bad: o[9]} // in step 2
			ds.failing.Store(true)
			l, err := New[int, []int](ds, collateIDs, cfg)
			mustNoError(t, err)
			defer l.Close()
			ctx := context.Background()
			var steps []int
			for len(steps) < 5 {
				b, err := l.Next(ctx)
				if err != nil {
					mustErrorIs(t, err, errFlaky)
					mustTrue(t, len(steps) == 2, "error at step %d", len(steps))
					steps = append(steps, -1)
					ds.failing.Store(false)
					continue
				}
				l.Commit(b)
				steps = append(steps, b.Step)
			}
			mustEqual(t, []int{0, 1, -1, 2, 3}, steps)
		})
	}
}

// blockingDataset blocks Get on release (or ctx) for indices >= from.
type blockingDataset struct {
	Dataset[int]
	from    int
	release chan struct{}
	entered chan struct{}
}

func (d *blockingDataset) Get(ctx context.Context, i int) (int, error) {
	if i >= d.from {
		select {
		case d.entered <- struct{}{}:
		default:
		}
		select {
		case <-d.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return d.Dataset.Get(ctx, i)
}

func newBlocking(n, from int) *blockingDataset {
	return &blockingDataset{Dataset: idDataset(n), from: from, release: make(chan struct{}), entered: make(chan struct{}, 1)}
}

// TestNextContextCancelKeepsBatch: Next gives up when its ctx ends and the
// batch it waited for is served by the next call.
func TestNextContextCancelKeepsBatch(t *testing.T) {
	ds := newBlocking(16, 0)
	cfg := Config{GlobalBatch: 4, Prefetch: 2, Workers: 1}
	l, err := New[int, []int](ds, collateIDs, cfg)
	mustNoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-ds.entered; cancel() }()
	_, err = l.Next(ctx)
	mustErrorIs(t, err, context.Canceled)
	close(ds.release)
	b, err := l.Next(context.Background())
	mustNoError(t, err)
	mustEqual(t, []int{0, 1, 2, 3}, b.Indices)
}

// TestResetAndCloseStopBlockedWorkers: Reset and Close cancel workers stuck
// in Get (through ctx) and wait for them; Close unblocks a waiting Next.
func TestResetAndCloseStopBlockedWorkers(t *testing.T) {
	ds := newBlocking(16, 4)
	cfg := Config{GlobalBatch: 4, Prefetch: 3, Workers: 3}
	l, err := New[int, []int](ds, collateIDs, cfg)
	mustNoError(t, err)
	ctx := context.Background()
	b, err := l.Next(ctx)
	mustNoError(t, err)
	<-ds.entered // a worker is blocked on step 1
	mustNoError(t, l.Reset(b.Next, 0, 1))
	mustEqual(t, b.Next, l.Cursor())

	done := make(chan error, 1)
	go func() {
		_, err := l.Next(ctx)
		done <- err
	}()
	<-ds.entered
	mustNoError(t, l.Close())
	select {
	case err := <-done:
		mustErrorIs(t, err, ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("Next still blocked 10 s after Close")
	}
	_, err = l.Next(ctx)
	mustErrorIs(t, err, ErrClosed)
	mustErrorIs(t, l.Reset(b.Next, 0, 1), ErrClosed)
	mustNoError(t, l.Close())
}

// TestCursorFromAnotherGoroutine reads Cursor concurrently with the loop
// (run with -race).
func TestCursorFromAnotherGoroutine(t *testing.T) {
	cfg := Config{GlobalBatch: 4, Prefetch: 2, Workers: 2, Shuffle: true}
	l, err := New(idDataset(40), collateIDs, cfg)
	mustNoError(t, err)
	defer l.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = l.Cursor()
			}
		}
	}()
	for range 50 {
		b, err := l.Next(context.Background())
		mustNoError(t, err)
		l.Commit(b)
	}
	close(stop)
	wg.Wait()
	// 10 steps per epoch: after 50 commits, epoch 5 position 0.
	mustEqual(t, [2]int{5, 0}, [2]int{l.Cursor().Epoch, l.Cursor().Position})
}

// jitterDataset yields the goroutine in Get now and then, so workers and
// Next interleave in every way while claiming slots.
type jitterDataset struct {
	Dataset[int]
	rng atomic.Uint64
}

func (d *jitterDataset) Get(ctx context.Context, i int) (int, error) {
	if x := d.rng.Add(0x9e3779b97f4a7c15); x>>60 == 0 {
		runtime.Gosched()
	}
	return d.Dataset.Get(ctx, i)
}

// TestPrefetchRacesServeTheReferenceOrder: with Next and the workers
// racing for slots (a consumer sometimes faster, sometimes slower than the
// workers, contexts that end mid-call, Resets to the committed cursor), the
// batches delivered are those of a synchronous loader, each step once.
func TestPrefetchRacesServeTheReferenceOrder(t *testing.T) {
	const n, steps = 61, 150
	ds := &jitterDataset{Dataset: idDataset(n)}
	for _, pw := range [][2]int{{1, 1}, {2, 1}, {3, 3}, {4, 2}} {
		t.Run(fmt.Sprintf("prefetch%d/workers%d", pw[0], pw[1]), func(t *testing.T) {
			cfg := Config{GlobalBatch: 4, Seed: 5, Shuffle: true, Prefetch: pw[0], Workers: pw[1]}
			ref := reference(t, idDataset(n), Config{GlobalBatch: 4, Seed: 5, Shuffle: true, Workers: 1}, steps)
			l, err := New[int, []int](ds, collateIDs, cfg)
			mustNoError(t, err)
			defer l.Close()
			rng := rand.New(rand.NewPCG(uint64(pw[0]), uint64(pw[1])))
			for i := 0; i < steps; {
				if rng.IntN(10) == 0 { // a context that is already over
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					if _, err := l.Next(ctx); err != nil {
						mustErrorIs(t, err, context.Canceled)
					} else {
						mustNoError(t, l.Reset(l.Cursor(), 0, 1)) // it was served: drop it
					}
					continue
				}
				b, err := l.Next(context.Background())
				mustNoError(t, err)
				mustEqual(t, ref[i].Indices, b.Indices, "step %d", i)
				mustEqual(t, ref[i].Next, b.Next, "step %d cursor", i)
				l.Commit(b)
				i++
				switch rng.IntN(8) {
				case 0:
					mustNoError(t, l.Reset(l.Cursor(), 0, 1))
				case 1:
					for range rng.IntN(2000) { // a slow step
						runtime.Gosched()
					}
				}
			}
		})
	}
}

// stallDataset: Get(gate) waits for release; the first Get(slow) takes
// stall unless its ctx ends first (a slow read that honours cancellation).
type stallDataset struct {
	Dataset[int]
	gate, slow  int
	stall       time.Duration
	release     chan struct{}
	slowEntered chan struct{}
	slowOnce    atomic.Bool
}

func (d *stallDataset) Get(ctx context.Context, i int) (int, error) {
	switch {
	case i == d.gate:
		select {
		case <-d.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	case i == d.slow && d.slowOnce.CompareAndSwap(false, true):
		close(d.slowEntered)
		tm := time.NewTimer(d.stall)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return d.Dataset.Get(ctx, i)
}

// While Next waits for a batch a worker builds, it builds a later batch
// itself; when its own batch becomes ready meanwhile, that help is
// abandoned, so a slow later sample never holds up a ready batch (it once
// made Next wait for the whole slow build). Whether Next or the worker
// meets the slow sample depends on scheduling; either way batch 1 comes
// long before the slow read would end.
func TestReadyBatchIsNotHeldUpByHelp(t *testing.T) {
	const stall = 3 * time.Second
	ds := &stallDataset{Dataset: idDataset(8), gate: 1, slow: 2, stall: stall, release: make(chan struct{}), slowEntered: make(chan struct{})}
	cfg := Config{GlobalBatch: 1, Prefetch: 3, Workers: 1} // no shuffle: batch k holds index k
	l, err := New[int, []int](ds, collateIDs, cfg)
	mustNoError(t, err)
	defer l.Close()
	ctx := context.Background()
	b, err := l.Next(ctx) // batch 0, built by Next; the worker takes batch 1 and waits at the gate
	mustNoError(t, err)
	mustEqual(t, []int{0}, b.Indices)
	l.Commit(b)
	got := make(chan Batch[[]int], 1)
	go func() {
		b, err := l.Next(ctx) // waits for batch 1: helps with batch 2, which stalls
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	<-ds.slowEntered
	released := time.Now()
	close(ds.release) // batch 1 can be built now
	b = <-got
	mustEqual(t, []int{1}, b.Indices)
	l.Commit(b)
	if took := time.Since(released); took > stall/2 {
		t.Fatalf("batch 1 came %v after it could be built: it waited for the slow help", took)
	}
	for want := 2; want < 6; want++ { // batch 2 is built again, then the rest, in order
		b, err := l.Next(ctx)
		mustNoError(t, err)
		mustEqual(t, []int{want}, b.Indices)
		l.Commit(b)
	}
}
