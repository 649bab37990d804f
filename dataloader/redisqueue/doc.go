// Package redisqueue is a dataloader.ShardQueue kept in Redis, for dynamic
// data sharding across worker processes and hosts (DLRover-style): workers
// lease shards of an epoch's order, ack them once applied, and a shard
// whose worker died returns to the queue when its lease expires.
//
// # Keys
//
// Every key of a job starts with Prefix + "{" + JobID + "}" so that, on a
// Redis Cluster, all of a job's keys share one hash slot (the braces are a
// hash tag) and each operation runs as one Lua script, atomically. Per
// epoch E there are three keys:
//
//	<prefix>{<job>}:shards:<E>:meta    hash: n, size, total, next, seq, acked
//	<prefix>{<job>}:shards:<E>:leases  sorted set: shard index -> lease deadline (ms)
//	<prefix>{<job>}:shards:<E>:state   hash: t:<i> token, w:<i> worker, a:<i> attempts, k:<i> acked token
//
// Each write refreshes the epoch's keys' TTL (Config.KeyTTL), so a finished
// or abandoned job's keys disappear on their own. Lease deadlines use the
// Redis server's clock (TIME), so workers' clocks need not agree.
//
// # Semantics
//
// Exactly those of dataloader.ShardQueue (the dataloader/shardqueuetest
// suite checks them): expired leases are served first, earliest deadline
// first, then never-leased shards in index order; Ack and Renew succeed only
// for the shard's current token; each shard is acked exactly once.
//
// # Failure
//
// A worker that dies (even by SIGKILL) while holding a shard simply stops
// renewing it: the shard is leased to the next worker that asks once the
// lease's deadline passes (the tests check within LeaseTTL + 1 s, with real
// processes and a real Redis). The dead worker's ack, should it ever come,
// gets ErrLeaseLost. When the survivors know which leases are still theirs
// (e.g. the leases recorded in the commit they restore), Queue.Reclaim
// (dataloader.ShardReclaimer) revokes all the others at once, so the dead
// worker's shards are served again without waiting for their deadline;
// their old tokens are refused from then on. Malformed or foreign data under the keys gives an
// error (dataloader.ErrShardMismatch or a reply error), never a panic.
//
// # Servers
//
// Any Redis 5+ with Lua works, and so does the embedded server of package
// elastic/standalone for single-host jobs. Redis Cluster works because all
// of a job's keys share a hash tag, the JobID (Config.Validate refuses
// braces in JobID and Prefix, which would move the tag).
package redisqueue
