package paramserver_test

import (
	"context"
	"fmt"
	gosync "sync"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
)

// ExampleServer runs a two-process parameter server inside one
// program: each "process" has its own Transport and Server, hosts one
// shard of an embedding table and trains on it in sync mode. Real jobs run
// one Server per worker process and take the World from the
// rendezvous.
func ExampleServer() {
	ctx := context.Background()
	cfg := sync.DefaultConfig()
	cfg.JobID, cfg.Secret = "example-ps", []byte("a secret of at least 16 bytes")
	table := paramserver.TableSpec{Name: "emb", Rows: 10, Dim: 2, Optimizer: paramserver.NewSparseSGD(0.5)}
	store := paramserver.NewMemoryShardStore() // a directory on shared storage in real jobs

	var nodes []*paramserver.Server
	var addrs []string
	for range 2 {
		tr, err := sync.Listen(ctx, "127.0.0.1:0", cfg)
		if err != nil {
			panic(err)
		}
		defer tr.Close()
		pcfg := paramserver.DefaultConfig()
		pcfg.Store = store
		ps, err := paramserver.New(tr, []paramserver.TableSpec{table}, pcfg)
		if err != nil {
			panic(err)
		}
		defer ps.Close()
		nodes, addrs = append(nodes, ps), append(addrs, tr.Addr())
	}

	var wg gosync.WaitGroup
	out := make([]string, 2)
	for rank, ps := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Round 1, starting from step 0 (the initial rows: zeros).
			r, err := ps.Round(ctx, paramserver.World{World: sync.World{Round: 1, Rank: rank, Addrs: addrs}}, 0)
			if err != nil {
				panic(err)
			}
			defer r.Close()
			rows := paramserver.Rows{Table: 0, IDs: []int64{3, 4}, Values: make([]float32, 4)}
			for step := 0; step < 2; step++ {
				if err := r.Pull(ctx, rows); err != nil {
					panic(err)
				}
				grad := paramserver.Rows{Table: 0, IDs: []int64{3, 4}, Values: []float32{1, 1, -1, -1}}
				if err := r.Push(ctx, grad); err != nil { // both workers push: summed
					panic(err)
				}
			}
			if err := r.Commit(ctx, r.Step()); err != nil { // shards to the store
				panic(err)
			}
			if err := r.Pull(ctx, rows); err != nil {
				panic(err)
			}
			out[rank] = fmt.Sprintf("rank %d at step %d: row 3 = %v, row 4 = %v", rank, r.Step(), rows.Values[:2], rows.Values[2:])
			// Nobody leaves while another rank may still need its shard.
			if err := r.Barrier(ctx); err != nil {
				panic(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// rank 0 at step 2: row 3 = [-2 -2], row 4 = [2 2]
	// rank 1 at step 2: row 3 = [-2 -2], row 4 = [2 2]
}
