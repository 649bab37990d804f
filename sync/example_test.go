package sync_test

import (
	"context"
	"fmt"
	gosync "sync"

	elsync "github.com/elastictrain/elastictrain/sync"
)

// Example forms a round of two ranks on loopback inside one process and
// averages a gradient over them.
func Example() {
	ctx := context.Background()
	cfg := elsync.DefaultConfig()
	cfg.JobID = "example-job"
	cfg.Secret = []byte("a shared secret of 32 bytes.....")

	// Each process listens once for its whole life.
	var ts [2]*elsync.Transport
	var addrs []string
	for i := range ts {
		t, err := elsync.Listen(ctx, "127.0.0.1:0", cfg)
		if err != nil {
			panic(err)
		}
		defer t.Close()
		ts[i] = t
		addrs = append(addrs, t.Addr())
	}

	// Every rank connects the round (normally in its own process) and
	// allreduces its gradient.
	grads := [][]float32{{1, 2, 3}, {3, 4, 5}}
	var wg gosync.WaitGroup
	for rank := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ring, err := ts[rank].Connect(ctx, elsync.World{Round: 1, Rank: rank, Addrs: addrs})
			if err != nil {
				panic(err)
			}
			defer ring.Close()
			if err := ring.AllReduceFloat32(ctx, grads[rank], elsync.OpAvg); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println(grads[0], grads[1])
	// Output: [2 3 4] [2 3 4]
}
