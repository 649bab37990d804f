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
// works (OpenRecordsMapped reads the same from a memory mapping, with no
// system call per record); FromFunc wraps a user's load function and Map a decoding or
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
// implementation. LeasedLoader (below) is the loader that trains a
// synchronous elastic job from such a queue.
//
// # Leased loader
//
// LeasedLoader serves each rank's share of every global batch from the
// shards it leases, and keeps exactly once (invariant 3) across failures,
// rescales and restarts of a synchronous job. It is what package trainer
// calls a StatefulLoader (with StateMerger, CommitListener and
// LineageSetter); the protocol, in the order the trainer drives it:
//
//   - State, at a commit: each rank first leases ahead (LeaseAhead steps of
//     its share), then returns its part: its leases in progress with the
//     next position to serve, its consumed leases not yet acked, and the
//     epoch's consumed shards as a bitmap. MergeStates, a pure function
//     every rank computes, joins the parts into the state to commit: one
//     versioned, CRC-32C checksummed record that is strictly checked on
//     the way in (ErrCorruptState, never a panic).
//   - Committed: a rank acks its consumed leases only once every rank holds
//     the commit that covers them. Acking after one's own commit loses
//     samples: when a peer dies during the commit, a survivor may hold only
//     the previous commit, the next round goes on from it and rolls the
//     shards' last steps back, but an acked shard is never served again.
//   - Restore, at the start of every round, before anyone leases (the
//     trainer holds a barrier after it): the committed leases in progress
//     go to the ranks of the new round (lease i to rank i mod size); rank
//     0 re-acks the committed consumed leases and revokes (Reclaim) every
//     other lease of the commit's epoch and the next. Those were all taken
//     after the commit, by anyone, dead or alive, so none of their samples
//     is in the restored history: they go back to the queue at once and
//     recovery never waits for a dead worker's lease to expire. Rank 0 then
//     checks that every ack in the queue is one the state explains
//     (ErrHistoryDiverged otherwise).
//   - Generations: the queue's epoch numbers carry a generation derived
//     from the history's lineage (SetLineage; the trainer's lineage is new
//     at every fresh start and every restore of a durable checkpoint), so a
//     fresh start never finds the acks of an abandoned history. A state of
//     an older lineage (a checkpoint older than the last commit) continues
//     in a new generation: a shard its bitmap counts as consumed is not
//     served when leased there (it is acked at the next commit), a shard it
//     held in progress resumes at its position. Leases found lost at Restore (a recovery that outlasted
//     the lease TTL) are handled the same way, so their samples are still
//     served once; a lease lost within a round fails the round
//     (ErrLeaseLost) and the next Restore sorts it out.
//   - Epochs: a rank that finds every shard of the epoch acked and holds
//     none serves an empty batch with Batch.EpochDone; the epoch moves on
//     when every rank reported it in one StepOutcome, so every rank's
//     Batch.Epoch changes at the same step. A global batch that trained
//     nothing asks for a commit (Stepped returns true), so that the last
//     consumed shards are acked and the epoch can end. When nothing is free
//     Next waits at most BusyWait, so a pending membership change is still
//     taken at a step boundary.
//   - Shares: equal (ShareOf) by default; with LeasedConfig.Balance they
//     follow each rank's measured speed (a Balancer, the trainer's, fed
//     the agreed per-rank samples and compute seconds of every
//     StepOutcome; WeightedShares cuts its split), computed alike on every
//     rank without a message.
//
// What it assumes: LeaseTTL well above the longest step plus the time a
// failed round takes to recover (otherwise rounds fail and repeat), and no
// process of an older round still calling Restore on the same queue (a
// zombie's Reclaim is not fenced by the round).
//
// # Concurrency
//
// Order, ShareOf and the Cursor methods are pure. A Loader's Next, Reset
// and Commit belong to one goroutine (the training loop); Cursor and Close
// may be called from any. Datasets and collate functions are called from
// the worker goroutines concurrently. MemoryQueue is safe for concurrent
// use. A LeasedLoader's methods must not be called concurrently (the
// training loop calls them); its MergeStates is pure and safe from any
// goroutine; WeightedShares and CostShares are pure; a Balancer belongs
// to the goroutine that calls its Observe (the training loop).
package dataloader
