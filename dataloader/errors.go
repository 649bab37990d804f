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
	// seed, global batch size or shuffle setting than the Loader's.
	ErrCursorMismatch = errors.New("dataloader: cursor does not match loader")

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
