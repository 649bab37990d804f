package sync

import (
	"fmt"

	"github.com/elastictrain/elastictrain/sync/paramserver"
)

// The parameter server moved to package sync/paramserver, a protocol of its
// own on the Transport's mesh (see package mesh). These aliases keep code
// written against sync compiling for one release.

// ParamServer is the parameter server of this process.
//
// Deprecated: use paramserver.Server.
type ParamServer = paramserver.Server

// PSRound is one round of a parameter server.
//
// Deprecated: use paramserver.Round.
type PSRound = paramserver.Round

// PSConfig holds the settings of a parameter server.
//
// Deprecated: use paramserver.Config.
type PSConfig = paramserver.Config

// PSWorld is one round of a parameter server and the roles of its ranks.
//
// Deprecated: use paramserver.World.
type PSWorld = paramserver.World

// PSMode selects when a parameter server applies pushed gradients.
//
// Deprecated: use paramserver.Mode.
type PSMode = paramserver.Mode

// PSStats counts a parameter-server round's traffic.
//
// Deprecated: use paramserver.Stats.
type PSStats = paramserver.Stats

// Rows names rows of one table and their values or gradients.
//
// Deprecated: use paramserver.Rows.
type Rows = paramserver.Rows

// TableSpec describes one embedding table.
//
// Deprecated: use paramserver.TableSpec.
type TableSpec = paramserver.TableSpec

// SparseOptimizer configures the optimizer a shard applies to its rows.
//
// Deprecated: use paramserver.SparseOptimizer.
type SparseOptimizer = paramserver.SparseOptimizer

// SparseKind names a sparse optimizer algorithm.
//
// Deprecated: use paramserver.SparseKind.
type SparseKind = paramserver.SparseKind

// ShardKey names one committed shard.
//
// Deprecated: use paramserver.ShardKey.
type ShardKey = paramserver.ShardKey

// ShardStore keeps committed parameter-server shards.
//
// Deprecated: use paramserver.ShardStore.
type ShardStore = paramserver.ShardStore

// MemoryShardStore is a ShardStore in memory.
//
// Deprecated: use paramserver.MemoryShardStore.
type MemoryShardStore = paramserver.MemoryShardStore

// DirShardStore is a ShardStore in a directory.
//
// Deprecated: use paramserver.DirShardStore.
type DirShardStore = paramserver.DirShardStore

// ShardInfo describes encoded shard bytes.
//
// Deprecated: use paramserver.ShardInfo.
type ShardInfo = paramserver.ShardInfo

// Parameter-server modes.
const (
	// PSSync applies a step once every worker pushed it.
	//
	// Deprecated: use paramserver.Sync.
	PSSync = paramserver.Sync
	// PSAsync applies each push at once, with bounded staleness.
	//
	// Deprecated: use paramserver.Async.
	PSAsync = paramserver.Async
)

// Sparse optimizers.
const (
	// SparseSGD is plain SGD.
	//
	// Deprecated: use paramserver.SparseSGD.
	SparseSGD = paramserver.SparseSGD
	// SparseAdagrad is Adagrad.
	//
	// Deprecated: use paramserver.SparseAdagrad.
	SparseAdagrad = paramserver.SparseAdagrad
	// SparseAdam is lazy Adam.
	//
	// Deprecated: use paramserver.SparseAdam.
	SparseAdam = paramserver.SparseAdam
)

// Parameter-server errors (the same values as paramserver's).
var (
	// ErrStale: an asynchronous push was too stale.
	//
	// Deprecated: use paramserver.ErrStale.
	ErrStale = paramserver.ErrStale
	// ErrRowsLost: committed rows are on no live rank and not in the store.
	//
	// Deprecated: use paramserver.ErrRowsLost.
	ErrRowsLost = paramserver.ErrRowsLost
	// ErrCorruptShard: encoded shard bytes did not decode.
	//
	// Deprecated: use paramserver.ErrCorruptShard.
	ErrCorruptShard = paramserver.ErrCorruptShard
)

// NewParamServer returns the parameter server of this process for tables,
// exchanging frames over tr.
//
// Deprecated: use paramserver.New.
func NewParamServer(tr *Transport, tables []TableSpec, cfg PSConfig) (*ParamServer, error) {
	if tr == nil {
		return nil, fmt.Errorf("%w: nil Transport", ErrInvalid)
	}
	return paramserver.New(tr, tables, cfg)
}

// DefaultPSConfig returns a PSConfig with the documented defaults.
//
// Deprecated: use paramserver.DefaultConfig.
func DefaultPSConfig() PSConfig { return paramserver.DefaultConfig() }

// NewSparseSGD returns plain SGD with learning rate lr.
//
// Deprecated: use paramserver.NewSparseSGD.
func NewSparseSGD(lr float64) SparseOptimizer { return paramserver.NewSparseSGD(lr) }

// NewSparseAdagrad returns Adagrad with learning rate lr.
//
// Deprecated: use paramserver.NewSparseAdagrad.
func NewSparseAdagrad(lr float64) SparseOptimizer { return paramserver.NewSparseAdagrad(lr) }

// NewSparseAdam returns lazy Adam with learning rate lr.
//
// Deprecated: use paramserver.NewSparseAdam.
func NewSparseAdam(lr float64) SparseOptimizer { return paramserver.NewSparseAdam(lr) }

// ShardOf returns the shard that holds row and the row's index within it.
//
// Deprecated: use paramserver.ShardOf.
func ShardOf(row int64, shards int) (shard int, local int64) {
	return paramserver.ShardOf(row, shards)
}

// ShardRows returns how many rows of a table shard s of shards holds.
//
// Deprecated: use paramserver.ShardRows.
func ShardRows(rows int64, s, shards int) int64 { return paramserver.ShardRows(rows, s, shards) }

// NewMemoryShardStore returns an empty MemoryShardStore.
//
// Deprecated: use paramserver.NewMemoryShardStore.
func NewMemoryShardStore() *MemoryShardStore { return paramserver.NewMemoryShardStore() }

// NewDirShardStore returns a DirShardStore in dir keeping keep steps.
//
// Deprecated: use paramserver.NewDirShardStore.
func NewDirShardStore(dir string, keep int) (*DirShardStore, error) {
	return paramserver.NewDirShardStore(dir, keep)
}

// DecodeShardInfo checks encoded shard bytes and describes them.
//
// Deprecated: use paramserver.DecodeShardInfo.
func DecodeShardInfo(b []byte) (ShardInfo, error) { return paramserver.DecodeShardInfo(b) }
