// Package shardqueuetest is a conformance suite for implementations of
// dataloader.ShardQueue, for their tests.
//
// # What it checks
//
// Lease order (never-leased shards in index order, with distinct tokens
// and deadlines LeaseTTL ahead), BusyError when every remaining shard is
// leased, ErrEpochDone when all are acked; Ack and Renew only with the
// current token, repeated acks counted once; expiry handing a shard to
// another worker with Attempt 2 and the old holder's Ack failing with
// ErrLeaseLost; a late ack with no re-lease succeeding; renewals keeping a
// shard; epochs independent; concurrent workers acking every shard exactly
// once; a faster worker taking more shards; and, for a
// dataloader.ShardReclaimer, Reclaim revoking every lease but the kept ones
// (the revoked shards served again at once, the old tokens refused). It
// uses the queue's real clock with leases of a few hundred milliseconds
// (TTL), so it takes a few seconds.
//
// # Use
//
//	func TestConformance(t *testing.T) {
//		shardqueuetest.Run(t, func(t *testing.T, cfg dataloader.ShardConfig) dataloader.ShardQueue {
//			q, err := dataloader.NewMemoryQueue(cfg)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return q
//		})
//	}
package shardqueuetest
