package sync_test

import (
	"context"
	"errors"
	"testing"

	"github.com/elastictrain/elastictrain/sync"
)

// TestDeprecatedPSNames: a program written against sync's parameter-server
// names (before they moved to sync/paramserver) still compiles and trains:
// one rank, two sync steps of SGD through the aliases and wrappers, a
// commit read back with ReadTables, and the moved sentinels still match.
func TestDeprecatedPSNames(t *testing.T) {
	ctx := context.Background()
	cfg := sync.DefaultConfig()
	cfg.JobID, cfg.Secret = "deprecated-ps-"+t.Name(), []byte("a secret of at least 16 bytes")
	tr, err := sync.Listen(ctx, "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var tables []sync.TableSpec = []sync.TableSpec{{Name: "emb", Rows: 4, Dim: 2, Optimizer: sync.NewSparseSGD(0.5)}}
	var _ sync.SparseOptimizer = sync.NewSparseAdam(0.1)
	var _ sync.SparseOptimizer = sync.NewSparseAdagrad(0.1)
	var pcfg sync.PSConfig = sync.DefaultPSConfig()
	var store sync.ShardStore = sync.NewMemoryShardStore()
	pcfg.Store = store
	var ps *sync.ParamServer
	if ps, err = sync.NewParamServer(tr, tables, pcfg); err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if _, err := sync.NewParamServer(nil, tables, pcfg); !errors.Is(err, sync.ErrInvalid) {
		t.Fatalf("NewParamServer(nil): %v, want ErrInvalid", err)
	}
	var r *sync.PSRound
	if r, err = ps.Round(ctx, sync.PSWorld{World: sync.World{Round: 1, Rank: 0, Addrs: []string{tr.Addr()}}}, 0); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for range 2 {
		if err := r.Push(ctx, sync.Rows{Table: 0, IDs: []int64{1}, Values: []float32{1, -1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Commit(ctx, r.Step()); err != nil {
		t.Fatal(err)
	}
	got, err := ps.ReadTables(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{0, 0, -1, 1, 0, 0, 0, 0}; len(got) != 1 || len(got[0]) != len(want) {
		t.Fatalf("ReadTables = %v, want [%v]", got, want)
	} else {
		for i := range want {
			if got[0][i] != want[i] {
				t.Fatalf("ReadTables = %v, want [%v]", got, want)
			}
		}
	}
	if _, err := ps.ReadTables(ctx, 7); !errors.Is(err, sync.ErrRowsLost) {
		t.Fatalf("ReadTables of an uncommitted step: %v, want ErrRowsLost", err)
	}
	if shard, local := sync.ShardOf(5, 2); shard != 1 || local != 2 || sync.ShardRows(5, 1, 2) != 2 {
		t.Fatal("ShardOf/ShardRows changed")
	}
	b, err := store.LoadShard(ctx, sync.ShardKey{Step: 2, Shards: 1, Shard: 0})
	if err != nil {
		t.Fatal(err)
	}
	var info sync.ShardInfo
	if info, err = sync.DecodeShardInfo(b); err != nil || info.Step != 2 {
		t.Fatalf("DecodeShardInfo = %+v, %v", info, err)
	}
	if _, err := sync.DecodeShardInfo(b[:10]); !errors.Is(err, sync.ErrCorruptShard) {
		t.Fatalf("DecodeShardInfo of a truncated shard: %v, want ErrCorruptShard", err)
	}
	if sync.PSSync.String() != "sync" || sync.PSAsync == sync.PSSync || sync.SparseAdam.String() != "adam" {
		t.Fatal("modes or kinds changed")
	}
	var _ sync.PSStats = r.Stats()
	var _ sync.PSMode = pcfg.Mode
	var _ sync.SparseKind = sync.SparseAdagrad
	if _, err := sync.NewDirShardStore(t.TempDir(), 3); err != nil {
		t.Fatal(err)
	}
	var _ *sync.DirShardStore
	var _ = sync.ErrStale
}
