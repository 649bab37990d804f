// Package paramserver is the parameter server of elastictrain: sparse
// embedding tables partitioned by row over the ranks of each round, pulled
// and pushed by the workers, updated by sparse optimizers on the shards,
// committed, restored and re-partitioned as the round's membership changes
// (Li et al., "Scaling Distributed Machine Learning with the Parameter
// Server", OSDI 2014).
//
// It is a protocol of its own on the transport of package sync: a
// sync.Transport forms each round and hands it over as a mesh.Mesh
// (authenticated per-peer streams and the round's failure state); this
// package frames its requests on those streams and never touches the
// collectives' state. trainer/ps runs it inside the trainer's loop as a
// driver.Partition. The names sync.ParamServer, sync.TableSpec,
// sync.NewSparseAdam, ... are deprecated aliases of this package's.
//
// # Why here
//
// The protocol shares the transport's frame codec (sync/internal/wire) and
// errors (package mesh), and must be usable without the trainer (a
// dedicated parameter-server process, examples/ps-bench), so it sits under
// sync rather than in trainer/ps; it is not named ps so that a program can
// import it and trainer/ps side by side.
//
// # Layout and placement
//
// Every table is partitioned by row: row r lives in shard r % Shards
// (interleaved, so popular low IDs spread over all shards), and shard s on
// rank Hosts[s % len(Hosts)] (see World). By default every rank hosts
// one shard and is a worker (colocated, as each elastic worker process of a
// recommendation job). Dedicated parameter-server processes are ranks
// listed in Hosts but not in Workers: they join the same rendezvous (or
// get a World by other means), call Server.Round for every round like the workers
// and then wait on Round.Done; they never pull or push.
//
// # Steps
//
// A worker's step is Pull (the rows its batch needs, grouped by shard,
// split into frames of at most Config.FrameRows rows, every frame sent
// before any reply is awaited), forward and backward, Push (the sparse
// gradients, likewise batched and pipelined). Dense parameters keep using
// the Ring's allreduce in the same step (a hybrid step, as in DLRM). In
// Sync mode a shard applies step t once every worker pushed it, summing
// the contributions in worker rank order, and answers pulls of step t+1
// only then, so results do not depend on timing or on the shard count. In
// Async mode a shard applies each push at once, and refuses (ErrStale)
// one computed on rows pulled more than Config.MaxStaleness updates ago.
//
// # Wire
//
// The parameter server runs on a mesh.Mesh that its own sync.Transport
// hands it for each round (Transport.ConnectMesh; the job's collectives use
// another Transport): the streams are the round's mesh connections, whose
// failures the Transport's control connections report. Each round's connections are authenticated by the
// Transport's handshake (job ID, round, rank, HMAC of the job secret,
// optional TLS), and every frame carries its round, so a rank of an older
// round can never reach a shard of a newer one. Frames are a 48-byte header
// (see sync/internal/wire) and a payload of at most the Transport's
// Config.MaxFrameBytes; each
// connection has a reader that never blocks on anything but the socket, so
// requests and replies flow both ways without deadlock. A malformed frame
// fails the round with sync.ErrBadFrame; a dead peer with a *sync.PeerError naming
// it, on every rank, as fast as the Transport notices (the control connections);
// a hung one with sync.ErrTimeout after the Transport's Config.OpTimeout.
//
// # Commits, checkpoints and elasticity
//
// Round.Commit keeps every shard's rows and optimizer state at a step in
// memory, on its host and on Config.Replicas other ranks (default 1; ranks
// on other hosts first, as the addresses of the round tell them apart):
// the host copies the rows changed since the previous commit into its own
// copy and sends the same rows to each replica, which keeps a copy of its
// own (a replica new to the shard in a round gets every row once). Each
// copy serves its newest commit and the one before it (an undo log of the
// changed rows). Nothing on this path touches a disk. Config.Store, when
// set, also receives every committed shard whole (encoded with its
// optimizer state, versioned and CRC-32C checksummed; DecodeShardInfo reads
// the header), for a whole-job restart. Server.Round(ctx, w, c) starts a
// round from committed step c: rank 0 gathers which ranks of the new round
// hold which commits of step c (as host or replica), picks a complete
// layout (every old shard in a live rank's memory or in the store;
// otherwise ErrRowsLost on every rank, naming the shards, never a table
// with holes), and each new shard gathers its rows (r % newShards) from
// the old shards (r % oldShards): from a live rank holding them, else from
// the store, with their optimizer state. Every row is thus in exactly one
// shard, with the value and state it had at step c, whatever the old and
// new shard counts; a whole-job restart restores from the store alone onto
// any number of shards. Rows pushed after step c are rolled back, in step
// with the dense state and data cursor of the same commit. Round.Stats
// counts the rows restored from memory and from the store.
//
// # Performance
//
// examples/ps-bench measures pull and push throughput between processes on
// one host; on small hosts the limit is the shards' CPU (the optimizer's
// arithmetic and copying rows), not the loopback connections.
//
// # Use
//
// Each process: Listen a sync.Transport for the parameter server, New a
// Server with the tables, and for every round call Server.Round with the
// round's World and the committed step to start from; the returned Round
// pulls, pushes, commits and closes. See ExampleServer.
package paramserver
