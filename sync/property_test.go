package sync

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestPropertyRandom: random world sizes, chunk sizes, direct thresholds,
// stream counts, buffer lengths and operations, each checked against the
// naive reference (float32 within tol32, float64 exact in the documented
// order, bytes exact).
func TestPropertyRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(2026, 3))
	for world := 0; world < 6; world++ {
		n := 2 + rng.IntN(4)
		cfg := testConfig(t)
		cfg.ChunkBytes = 64 + rng.IntN(64<<10)
		cfg.DirectBytes = rng.IntN(8 << 10)
		cfg.Streams = 1 + rng.IntN(4)
		cfg.MaxFrameBytes = max(cfg.ChunkBytes, cfg.DirectBytes)
		t.Run(fmt.Sprintf("n=%d chunk=%d direct=%d streams=%d", n, cfg.ChunkBytes, cfg.DirectBytes, cfg.Streams), func(t *testing.T) {
			w := newTestWorld(t, n, cfg)
			for op := 0; op < 10; op++ {
				length := rng.IntN(40000)
				if rng.IntN(3) == 0 {
					length = rng.IntN(50)
				}
				switch rng.IntN(4) {
				case 0:
					checkAllReduce(t, w, rng, length, Op(rng.IntN(4)))
				case 1:
					checkBroadcast(t, w, rng, length, rng.IntN(n))
				case 2:
					checkAllGather(t, w, rng, length/4)
				case 3:
					checkBuckets(t, w, rng, 1+rng.IntN(60), 4+rng.IntN(64<<10))
				}
			}
			checkBarrier(t, w)
		})
	}
}

// checkBuckets reduces a random model's tensors through Buckets. Values are
// small integers, so the float32 sums are exact in any order.
func checkBuckets(t *testing.T, w *testWorld, rng *rand.Rand, tensors, bucketBytes int) {
	t.Helper()
	n := len(w.rings)
	lens := make([]int, tensors)
	for i := range lens {
		lens[i] = rng.IntN(3000)
		if rng.IntN(4) == 0 {
			lens[i] = rng.IntN(4)
		}
	}
	model := make([][][]float32, n)
	want := make([][]float32, tensors)
	for i, l := range lens {
		want[i] = make([]float32, l)
	}
	for r := range model {
		model[r] = make([][]float32, tensors)
		for i, l := range lens {
			model[r][i] = make([]float32, l)
			for k := range model[r][i] {
				v := float32(rng.IntN(2001) - 1000)
				model[r][i][k] = v
				want[i][k] += v
			}
		}
	}
	bs := make([]*Buckets, n)
	for r := range bs {
		bs[r] = NewBuckets(model[r], bucketBytes)
	}
	if bs[0].Len() > tensors {
		t.Fatalf("%d buckets for %d tensors", bs[0].Len(), tensors)
	}
	w.must(t, fmt.Sprintf("buckets of %d bytes", bucketBytes), func(rank int, r *Ring) error {
		return bs[rank].AllReduce(context.Background(), r, OpSum)
	})
	for r := range model {
		for i := range model[r] {
			for k, v := range model[r][i] {
				if v != want[i][k] {
					t.Fatalf("n=%d buckets of %d bytes: rank %d tensor %d [%d] = %v, want %v", n, bucketBytes, r, i, k, v, want[i][k])
				}
			}
		}
	}
}

func TestBucketsPlan(t *testing.T) {
	ts := [][]float32{make([]float32, 10), make([]float32, 20), {}, make([]float32, 100), make([]float32, 5)}
	b := NewBuckets(ts, 30*4)
	// [10,20] fused; [] skipped; 100 > 30 in place; [5] alone.
	if b.Len() != 3 {
		t.Fatalf("Len = %d, want 3", b.Len())
	}
	for i, bk := range b.buckets {
		t.Logf("bucket %d: first %d count %d in place %v len %d", i, bk.first, bk.count, bk.inPlace, len(bk.buf))
	}
	if !b.buckets[1].inPlace || len(b.buckets[0].buf) != 30 || len(b.buckets[2].buf) != 5 {
		t.Fatal("unexpected plan")
	}
	if err := b.AllReduce(context.Background(), NewLocal(), OpAvg); err != nil {
		t.Fatal(err)
	}
}
