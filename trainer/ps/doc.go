// Package ps runs the parameter server (package sync/paramserver) inside the
// trainer's loop, as partitioned state (driver.Partition): embedding tables
// whose rows are split over the ranks of each round, pulled and pushed by
// the user's StepFunc, committed, restored, re-partitioned and
// checkpointed in step with the replicated state (the dense parameters,
// the optimizer, the data cursor). Register it with trainer.WithPartition
// and let the StepFunc capture it:
//
//	part, _ := ps.New(cfg)                 // tables, transport
//	step := func(ctx context.Context, b dataloader.Batch[B]) (float64, error) {
//		part.Pull(ctx, rows...)             // the rows this rank's share needs
//		loss := forwardBackward(b, rows)    // dense gradients into Param.Grad
//		return loss, part.Push(ctx, grads...) // sparse gradients to the shards
//	}
//	tr, _ := trainer.New(params, opt, loader, step, store, tcfg, trainer.WithPartition(part))
//
// The dense part of the model goes through the trainer's gradient sync (a
// hybrid step, as in DLRM); the tables through the shards, which apply
// their sparse optimizer (paramserver.SparseOptimizer) to the pushed rows.
//
// # Why a package of its own
//
// The trainer may import sync, never the reverse (sync moves numbers
// between the ranks of a round and knows nothing of the loop), and the
// Partition contract speaks the trainer's types (driver.PartitionRound),
// so the adapter lives on the trainer's side, beside the protocol in
// sync/paramserver, which stays usable without the trainer (a dedicated
// parameter-server process, examples/ps-bench). It is not in package trainer
// itself because it is one implementation of the contract among others a
// user may write, the way database/sql's drivers live beside it.
//
// # Steps
//
// In PSSync mode (the default) every rank's StepFunc must call Push exactly
// once per call, with no rows when its share of the global batch is empty
// (with a partition registered the trainer calls the StepFunc on such a
// rank too): a shard applies step t once every rank pushed it, and answers the pulls
// of step t+1 only then, so results do not depend on timing. A shard counts
// every push, also those of a global batch in which no rank got a sample
// (which the trainer does not count as a step); the partition keeps the
// mapping from the trainer's steps to the shards' own in its commits and
// checkpoints. A rank that does not push (its StepFunc failed before it
// could) makes the others' next Pull, Commit or EndRound fail with
// sync.ErrTimeout within the transport's Config.OpTimeout, or at once with
// a *sync.PeerError when the rank left: never a hang. The trainer ends the
// round on such errors of a StepFunc's Pull or Push, as on a failed
// collective, and the next round restores the last commit.
//
// # Commits and failures
//
// Commit keeps every shard's rows at the step in memory, on its host and
// on paramserver.Config.Replicas other ranks (default 1, on another host
// when there is one): only the rows changed since the last commit are
// copied and sent, and nothing touches a disk unless Config.Dir is set
// (then each shard is also written there whole: temp, fsync, rename). At
// Restore the ranks of the new round agree on the shards' step of the
// trainer's commit, forget what came after it, and the parameter server
// moves every row to its new owner: from a live rank holding it in memory
// (its host or a replica), from Config.Dir otherwise, re-partitioned over
// any number of ranks. So a killed rank loses nothing that was committed
// while one copy of each of its shards lives, and a rescale 3 -> 2 -> 3
// moves only what it must. When a shard's host and every replica died at
// once and no Dir holds it, Restore fails with trainer.ErrPartitionLost
// naming the shard; the trainer then rolls every rank back to the last
// durable checkpoint, if there is one. Restored and CommitSeconds report
// what restores took from where and the time spent committing.
//
// # Checkpoints
//
// Without Config.Dir (the default), Checkpoint encodes the shards this
// rank hosts in the current round from the commit of that step in its
// memory (paramserver.Server.AppendCommitted: a copy, no I/O) and returns
// them inside its manifest (format 2 below). Rank 0's trainer gathers
// every rank's manifest into its one checkpoint blob and writes it in the
// background to its CheckpointStore (a local directory, or S3-compatible
// object storage with objstore/s3): training waits for the copy and the
// gathering, not for the write (driver.InlineCheckpointer), and no shared
// filesystem is needed. A whole-job restart (PartitionRound.Source
// "checkpoint") checks every rank's manifest, verifies each shard (its
// size, the CRC-32C the manifest names and the one over its bytes), and
// restores onto the new round's ranks, whatever their number
// (paramserver.Server.SetRestoreSource).
//
// With Config.Dir (deprecated), Checkpoint links this rank's share of the
// committed shards of that step into a directory of their own,
// ckpt-<step>-<random>/ under Config.Dir (hard links of the commit's
// files, fsynced; a copy where the filesystem has no links), checks that
// each decodes as the shard of that step, and returns a JSON manifest
// naming them with their sizes and SHA-256 (format 1), which the trainer
// publishes synchronously. The commit files can be pruned
// (Config.KeepSteps) without touching a checkpoint's. A checkpoint's
// directory is removed only once a later checkpoint is published (the
// trainer says which one is, PartitionRound.Published, and publishes a
// checkpoint before it calls Checkpoint again in a round), and, with
// Config.Checkpoints, only once the trainer's CheckpointStore no longer
// lists it: never by count, so checkpoints that failed to be published
// cannot cost the newest published one its shards.
//
// # Manifest format
//
// Format 1, one JSON object per rank:
//
//	{"format": "elastictrain-ps/1", "name": "ps", "step": 300, "ps_step": 302,
//	 "shards": 3, "tables": "<hash of the table specs>",
//	 "files": [{"shard": 0, "path": "ckpt-…/shard-00000-of-00003.bin",
//	            "size": 123456, "sha256": "…"}]}
//
// step is the trainer's step, ps_step the shards' step, shards the layout
// of the files (shard j holds the rows r with r % shards == j), path is
// relative to Config.Dir. The files use the shard encoding of package
// sync/paramserver (versioned, CRC-32C; paramserver.DecodeShardInfo reads
// its header).
//
// Format 2 holds the shards: the 8 bytes "ETPSCKP2", the shards'
// encodings in the order of files, a JSON header like format 1's with
// "format": "elastictrain-ps/2" and files of {"shard", "size", "crc32c"}
// (no path: the CRC-32C is the shard encoding's own, its last 4 bytes),
// and the header's length as a little-endian uint32. Every rank's manifest names
// the shards it hosted; all of them together name every shard once.
package ps
