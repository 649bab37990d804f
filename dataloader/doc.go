// Package dataloader serves the samples of a dataset to the ranks of an
// elastic training job, batch by batch, with a promise: within an epoch,
// every sample index is part of exactly one applied step, across any number
// of failures, restarts and world size changes, and which samples form each
// global batch never depends on the world size.
//
// # Datasets
//
// A Dataset[T] is random access by index: Len and Get(ctx, i). FromSlice
// serves an in-memory slice, OpenRecords a file of fixed-size records read
// with ReadAt (MNIST's IDX files are one case), so data larger than memory
// works; FromFunc wraps a user's load function and Map a decoding or
// augmentation step. The user's collate function turns one rank's samples
// into the value the step consumes (for example one []float32 tensor).
//
// # Order and global batches
//
// The order of epoch e is Order(seed, e, n): a Fisher-Yates shuffle driven
// by SplitMix64 (Steele, Lea and Flood, OOPSLA 2014) with Lemire's unbiased
// bounded integers, all implemented here, so the order is the same in every
// process, Go version and platform (math/rand is never used). With
// Config.Shuffle false the order is the identity. Step s of epoch e covers
// positions [s*B, (s+1)*B) of that order, B = Config.GlobalBatch. The last,
// partial global batch of an epoch is dropped (Config.DropLast) or served
// smaller (Batch.GlobalSize says how big).
//
// # Ranks and world size
//
// Rank r of W gets ShareOf(G, r, W) of each global batch of G samples: a
// balanced, contiguous part in rank order, so concatenating the ranks'
// Batch.Indices gives the global batch. A change of world size changes only
// how a global batch is split, never which samples form it. With fewer
// samples than ranks some ranks get an empty share, which is valid (the
// step function then contributes zero gradients).
//
// # Micro-batches (deterministic training)
//
// With Config.MicroBatch = M > 0, each global batch is cut into
// micro-batches of M samples at fixed offsets ([k*M, (k+1)*M), only the last
// one smaller; MicroBatches), and each rank owns whole micro-batches,
// balanced and contiguous (MicroShareOf). collate runs once per micro-batch
// and Batch.Micro carries them (Batch.MicroBatch(k) gives one as a Batch).
// A micro-batch has the same samples and shape whatever the world size, so
// a deterministic model computes the same gradient bits for it on any rank;
// summing micro-batch gradients in micro-batch index order then makes the
// whole step independent of the world size.
//
// # Cursor, commit and resume
//
// A Cursor (seed, dataset length, global batch, shuffle, epoch, position) is
// the Loader's whole state: MarshalBinary writes 52 versioned, CRC-32C
// checksummed bytes, and UnmarshalBinary refuses anything else with
// ErrCorruptCursor. The cursor moves when the trainer calls Commit after a
// step was applied by every rank, never when a batch is read: batches read
// or prefetched but not committed are served again after Reset. Reset(c,
// rank, W) restarts from a committed cursor for any rank and world size;
// a cursor for another dataset length, seed, global batch or shuffle setting
// is refused with ErrCursorMismatch. Batch.Next is the cursor after a
// batch; after the last step of an epoch it is (epoch+1, 0), and Next rolls
// on into following epochs for as long as the caller asks.
//
// # Prefetch
//
// With Config.Prefetch = P > 0, Config.Workers goroutines build up to P
// batches ahead (Get and collate) while the step runs; batches reach Next in
// order. A Next that finds its batch not yet claimed by a worker builds it
// itself (no wake-up between goroutines, and the samples stay in this core's
// cache), and while Next waits, workers leave its batch to it and build the
// following ones: a step that is faster than the loading does half the
// loading itself in parallel with the workers, and one that is slower finds
// every batch ready. Reset and Close cancel the workers through the ctx
// given to Get and collate and wait for them to exit. In steady state the Loader itself
// allocates nothing per batch (Indices point into the epoch's order); the
// allocations per batch are collate's own. See bench_test.go for the cost
// per sample against a plain loop.
//
// # Dynamic shards
//
// For parameter-server or asynchronous training and for slow workers, an
// epoch's order can instead be cut into shards (ShardConfig), leased from a
// ShardQueue (DLRover's dynamic data sharding): a worker leases a shard,
// trains on its samples (Shard.Indices of the epoch's Order), and acks it; a
// shard whose worker died returns to the queue when its lease expires (or
// at once, revoked by ShardReclaimer.Reclaim when the survivors know which
// leases are theirs); faster workers simply lease more. Exactly once counts
// acked shards.
// MemoryQueue serves one process; package dataloader/redisqueue keeps the
// queue in Redis for many; package dataloader/shardqueuetest checks any
// implementation.
//
// # Concurrency
//
// Order, ShareOf and the Cursor methods are pure. A Loader's Next, Reset
// and Commit belong to one goroutine (the training loop); Cursor and Close
// may be called from any. Datasets and collate functions are called from
// the worker goroutines concurrently. MemoryQueue is safe for concurrent
// use.
package dataloader
