package sync

import (
	"context"
	"testing"
)

func TestSmoke(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		w := newTestWorld(t, n, testConfig(t))
		for _, length := range []int{0, 1, 5, 100000} {
			bufs := make([][]float32, n)
			for r := range bufs {
				bufs[r] = make([]float32, length)
				for i := range bufs[r] {
					bufs[r][i] = float32(r + 1)
				}
			}
			w.must(t, "allreduce", func(rank int, r *Ring) error {
				return r.AllReduceFloat32(context.Background(), bufs[rank], OpSum)
			})
			want := float32(n * (n + 1) / 2)
			for r := range bufs {
				for i, v := range bufs[r] {
					if v != want {
						t.Fatalf("n=%d len=%d rank %d [%d] = %v, want %v", n, length, r, i, v, want)
					}
				}
			}
		}
	}
}
