package dataloader

import "errors"

// Sentinel errors returned by this package, always wrapped with detail;
// match them with errors.Is.
var (
	// ErrInvalidConfig reports a Config, ShardConfig or constructor argument
	// that cannot work (for example GlobalBatch <= 0, or DropLast with a
	// dataset smaller than one global batch).
	ErrInvalidConfig = errors.New("dataloader: invalid config")

	// ErrInvalidWorld reports a rank outside 0..worldSize-1 or a world size
	// below 1.
	ErrInvalidWorld = errors.New("dataloader: invalid rank or world size")

	// ErrInvalidCursor reports a Cursor whose fields are inconsistent in
	// themselves (negative fields, a position that is not a multiple of the
	// global batch or not inside the dataset).
	ErrInvalidCursor = errors.New("dataloader: invalid cursor")

	// ErrCorruptCursor reports bytes that are not an encoded Cursor: wrong
	// length, magic, version, flags or checksum, or decoded fields that fail
	// Cursor.Validate.
	ErrCorruptCursor = errors.New("dataloader: corrupt cursor")

	// ErrCursorMismatch reports a Cursor saved for another dataset length,
	// seed, global batch size or shuffle setting than the Loader's, or a
	// LeasedLoader state saved for another dataset length, shard size, seed
	// or shuffle setting than the LeasedLoader's.
	ErrCursorMismatch = errors.New("dataloader: cursor does not match loader")

	// ErrCorruptState reports bytes that are not a LeasedLoader state (or
	// part of one): wrong length, magic, version, kind or checksum, fields
	// out of range, a shard listed twice, or parts that do not belong
	// together.
	ErrCorruptState = errors.New("dataloader: corrupt loader state")

	// ErrHistoryDiverged is returned by LeasedLoader.Restore when the shard
	// queue holds acks that the restored state cannot explain: another
	// history (an abandoned run, or a restore from an older checkpoint
	// without a new lineage) acked shards in the same generation of the
	// queue. Give the loader the trainer's lineage (SetLineage) or the job a
	// queue of its own.
	ErrHistoryDiverged = errors.New("dataloader: shard queue holds acks of another history")

	// ErrOutOfOrder reports a LeasedLoader call out of its contract's order
	// (Next before Restore, Next twice without Stepped, State with a batch
	// not yet Stepped, any call after an error before the next Restore).
	ErrOutOfOrder = errors.New("dataloader: loader call out of order")

	// ErrInvalidStep reports a StepOutcome that does not fit the round (its
	// slices are not one per rank) or this rank's last batch (another
	// sample count or EpochDone than it served).
	ErrInvalidStep = errors.New("dataloader: step outcome does not match the round")

	// ErrClosed is returned by a Loader or Records after Close.
	ErrClosed = errors.New("dataloader: closed")

	// ErrIndexOutOfRange is returned by Dataset.Get implementations of this
	// package for an index outside 0..Len()-1.
	ErrIndexOutOfRange = errors.New("dataloader: index out of range")

	// ErrBadRecords reports a records file whose size is not header bytes
	// plus a whole number of records, or header/record sizes that make no sense.
	ErrBadRecords = errors.New("dataloader: bad records file")

	// ErrEpochDone is returned by ShardQueue.Lease when every shard of the
	// epoch has been acked.
	ErrEpochDone = errors.New("dataloader: every shard of the epoch is acked")

	// ErrNoShardFree is returned (inside a *BusyError) by ShardQueue.Lease
	// when every shard not yet acked is leased to a worker and no lease has
	// expired: try again later (LeaseWait does).
	ErrNoShardFree = errors.New("dataloader: every remaining shard is leased")

	// ErrLeaseLost is returned by ShardQueue.Ack and Renew when the lease's
	// token is no longer current: the lease expired and the shard was leased
	// again, or it was acked under another lease. The caller's work on the
	// shard does not count.
	ErrLeaseLost = errors.New("dataloader: shard lease lost")

	// ErrShardMismatch reports a ShardQueue whose stored epoch layout
	// (dataset length, shard size) differs from the caller's ShardConfig.
	ErrShardMismatch = errors.New("dataloader: shard layout mismatch")
)
