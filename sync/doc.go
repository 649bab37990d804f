// Package sync moves numbers between the ranks of one training round:
// allreduce of gradients, broadcast of state, allgather and barrier, over
// authenticated TCP (or, between ranks on one host, Unix domain socket)
// connections, with deadlines and abort so that no rank ever waits forever.
//
// It knows nothing of Redis or of the training loop: a round is described by
// a plain World value (job ID, round, rank, peer addresses), which the
// rendezvous of package elastic provides and a test can build by hand.
//
// # Use
//
// Each process calls Listen once, advertises Transport.Addr through the
// rendezvous, and for every round calls Transport.Connect with that round's
// World. The returned *Ring implements Synchronizer; close it when the round
// ends. NewLocal is the Synchronizer of a world of size 1; a parameter server
// can implement the same interface. Buckets fuse many small tensors into few
// buffers for AllReduce (tensor fusion).
//
// # Algorithms
//
//   - AllReduce of more than Config.DirectBytes: the bandwidth-optimal ring
//     (reduce-scatter, then allgather; Patarasuk & Yuan, "Bandwidth optimal
//     all-reduce algorithms for clusters of workstations", JPDC 2009). Each
//     rank sends and receives 2(n-1)/n of the buffer. The buffer is split
//     over Config.Streams lanes (parallel connections, each driven by a
//     sending and a receiving goroutine) and every segment is pipelined in
//     chunks of Config.ChunkBytes, so receiving, reducing and forwarding
//     overlap.
//   - AllReduce of more than Config.DirectBytes between two ranks: one
//     exchange instead of the ring's two steps. Each rank sends its whole
//     buffer (pipelined in chunks, over one lane unless every lane gets
//     at least four chunks) and folds the other's into it as
//     x_0 op x_1, the same kernel on the same operands on both ranks, so
//     both hold the same bits. Each rank moves the whole buffer instead of
//     half of it, but the rank that arrives last finds the other's data
//     waiting and the rank that waits is woken once, where the ring's
//     allgather waits on the other rank's reduction: on a loaded host
//     that wake-up, not the bytes, is the cost (examples/mnist's MLP,
//     814 KB of gradients on two processes of one 2-core host).
//   - AllReduce of at most DirectBytes: a direct exchange (every rank sends
//     its buffer to every other and reduces all inputs in rank order), one
//     network step, for latency; in worlds of more than 8 ranks, recursive
//     doubling instead (log2(n) steps of one message; Thakur, Rabenseifner &
//     Gropp, "Optimization of collective communication operations in
//     MPICH", IJHPCA 2005).
//   - AllReduce of more than DirectBytes in a round whose ranks share
//     hosts (several ranks advertise the same host, and there are several
//     hosts): the hierarchical allreduce (Config.Hierarchy). With as many
//     ranks on every host (HierarchyStriped, the default then), the ranks
//     of each host reduce-scatter the buffer over shared memory, the q-th
//     ranks of all hosts allreduce stripe q over a ring of their own, and
//     each host allgathers; otherwise (HierarchyLeaders) the ranks of each
//     host reduce to the host's leader, the leaders allreduce over a ring
//     between hosts, and each leader broadcasts back within its host. The
//     buffer is cut into pieces so that the phases of successive pieces
//     overlap. Each host link carries 2(H-1)/H of the buffer each way for
//     H hosts, where the flat ring over N ranks carries 2(N-1)/N.
//   - Broadcast: pipelined chain root -> root+1 -> ... (direct for small).
//   - AllReduceOrderedFloat32 (OrderedReducer): a chain 0 -> 1 -> ... ->
//     n-1 in which each rank adds its parts, one by one, to the running
//     sum it receives, then the chain n-1 -> 0 -> ... -> n-2 that copies
//     the result back; both pipelined in chunks over the lanes of the ring
//     of all ranks, and overlapping (over the mesh connections for at
//     most DirectBytes). Hierarchical rounds run the same flat chain.
//   - AllGather: ring allgather (direct for small). Barrier: direct exchange.
//
// # Layers
//
// The Transport gives a round its mesh of authenticated streams: a control
// and a mesh connection between every pair of ranks, and Config.Streams
// lanes along each ring the round needs (the ring of all ranks, and for
// the hierarchical allreduce the ring of each host and the ring between
// hosts, chosen from World.Addrs by the same rule on every rank). The
// ring algorithms (reduce-scatter, allgather, chain) run on any of those
// rings; the hierarchical allreduce composes them. Transport.ConnectMesh
// hands a round to another protocol as a mesh.Mesh (package sync/mesh: the
// per-peer mesh streams, the round's failure state and limits, nothing of
// the Ring's own); the parameter server (package sync/paramserver) is such
// a protocol. sync's parameter-server names (ParamServer, TableSpec, the
// sparse optimizers, ...) are deprecated aliases of paramserver's.
//
// Between ranks on one host (Config.LocalSockets, Linux), connections use
// Unix domain sockets, and the ring lanes carry their payloads through
// shared memory (Config.SharedMemory: a sealed memfd per lane, passed over
// the authenticated socket); frame headers and flow-control credits stay on
// the socket, so framing checks, deadlines and abort work the same. Links
// between hosts are TCP (optionally TLS), with Config.Streams connections
// per ring link.
//
// Results are bit-identical on every rank. The reduction order is fixed by
// the buffer length, the Config and the round's layout (which ranks share
// a host), never by timing, so results are reproducible. Rounds of other
// layouts add in other orders: float32 and general float64 sums then
// differ in their last bits, but sums of integer-valued float64 (the
// fixed-point gradients of the trainer's deterministic mode) are exact in
// any order while they stay within 2^53, so they are bit-identical across
// every layout, flat or hierarchical. The ordered allreduce
// (OrderedReducer) goes further for float32: its sum is taken strictly in
// the order of the global sequence of parts (ranks in rank order, each
// rank's parts in order, from +0), so its bits are the same at every
// world size and however the parts are split among the ranks.
// Element values travel as little-endian IEEE 754, as they lie in memory
// (little-endian hosts only).
//
// # Wire and handshake
//
// Every message is a frame: a 40-byte header (kind, op, payload length,
// round, operation sequence number, total length, root) and a payload of at
// most Config.MaxFrameBytes. A receiver checks every header against the
// operation it is running: a disagreement between ranks (sequence, kind,
// op, type, length, root) is ErrMismatch on every rank, never a hang;
// undecodable bytes are ErrBadFrame and close the connection. Ranks in
// different operations may not read each other's connections at all (one
// in a ring allreduce, one in a barrier): an operation still waiting after
// 100 ms is announced on the control connections, which are read at all
// times, so such a disagreement is ErrMismatch on every rank within about
// that time, not ErrTimeout after OpTimeout.
//
// A rank in a long phase outside any operation (a data load, a checkpoint
// write) marks it with Ring.Busy (BusyMarker); once it has lasted 100 ms the
// rank sends a KindBusy frame on its control connections every 500 ms (a
// quarter of OpTimeout if shorter). A rank waiting in an operation that
// hears one moves its deadline to OpTimeout after it, up to
// Config.BusyTimeout after the operation's start, so OpTimeout counts only
// unmarked time. Once an operation has waited OpTimeout, a busy peer no
// longer extends it if some other rank is silent (neither marked busy nor
// waiting in this operation or a later one): it fails with a *TimeoutError
// whose Silent names that rank, as a timeout without busy peers does.
//
// Every connection opens with a handshake: the dialer sends job ID, round,
// its rank, the rank it wants and a nonce; the listener answers with its own
// fresh nonce and an HMAC-SHA256 of the shared Config.Secret over both; the
// dialer checks it and answers with its own HMAC. A wrong job, an older
// round, a wrong or missing secret or a replayed proof is refused on both
// sides with a clear error (ErrJobMismatch, ErrRoundMismatch, ErrAuth) and
// the connection is closed; Transport.Stats counts refusals. Connections for
// a round this rank has not reached yet are held (Config.HoldTimeout), since
// ranks reach Connect at slightly different times. TLS (crypto/tls) can wrap
// every TCP connection (Config.ServerTLS and ClientTLS) for links that
// leave the host; connections over Unix sockets stay on the host and are
// not wrapped.
//
// A peer that does not prove the secret dooms the round, but Connect goes on
// for up to a second forming the other connections and returns an
// *AuthError naming the ranks that proved the secret to this rank and those
// that failed. Members group by secret, so at most one group is more than
// half of the round (AuthError.Majority): the caller (the trainer) evicts
// the failed ranks only from there, and a minority of strangers can never
// evict the job's members.
//
// Connections that have not authenticated yet are bounded per remote
// address (an IPv4 address, an IPv6 /64, all Unix-socket peers), never by
// refusing the newest: over an address's share, or over 3/4 of the
// process's open-file limit, the oldest connection that has sent nothing
// for 250 ms is parked (held open unread, without a goroutine) for about a
// minute, as is one still silent at Config.HandshakeTimeout. A flood of
// silent connections (slowloris) thus neither shuts the job's peers out nor
// makes the flooder reconnect in a loop; Transport.Stats counts parked and
// evicted connections.
//
// # Failures
//
// Every operation takes a context and is bounded by Config.OpTimeout.
// Cancelling the context, or closing the Ring, aborts the operation on this
// rank and on every other. Every pair of ranks keeps a control connection
// that is read at all times: when a rank dies its connections close, every
// other rank sees it at once, and the first to see it sends an abort notice
// naming the failed rank to all; every rank's operation then fails with a
// *PeerError naming that rank (errors.As; errors.Is(err, ErrPeerLost)),
// within milliseconds on one host. A rank that hangs without closing
// (stopped, deadlocked) makes the others fail with ErrTimeout after
// OpTimeout. After any error a Ring stays broken: form a new round.
// Close stops every goroutine a Ring or Transport started.
//
// # Performance
//
// Operations do not allocate once a Ring exists. Measure with
// examples/allreduce-bench, which reports median time, algbw and busbw
// (NCCL-tests: busbw = algbw * 2(n-1)/n) per size.
package sync
