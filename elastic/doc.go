// Package elastic is the membership layer of elastictrain: a rendezvous that
// gives every worker process of a job a rank in a numbered round, notices
// dead, hung and departing workers within seconds, lets newcomers in at a
// step boundary, and fences any worker that was evicted so that it can never
// act under its old rank. It knows nothing of tensors or data: the trainer
// hands the World it returns (round, rank, peer addresses) to package sync
// and to the data loader.
//
// # Terms
//
// A job (Config.JobID) is one training run. A member is one worker process,
// identified by a random ID drawn at process start (NewMember), never by its
// host name. A round is one membership of the job with ranks 0..W-1; rounds
// are numbered and the number only grows. A member holds a lease in the
// store, renewed by a heartbeat; a member whose lease lapsed is evicted.
//
// # Using it
//
// Each worker makes one Agent over a store (see Stores) and calls Join, which blocks until
// the member holds a rank in a closed round and returns that World. The
// trainer then trains; at each step boundary it reads ChangePending (no I/O)
// and, when any rank sees a change (agreed through the allreduce), every rank
// leaves the round together and calls Join again: they land in the next
// round together with any workers that were waiting. When a peer's
// collective connection dies without an abort, the trainer calls
// ReportFailure(round, peerID); the store evicts that member at once and the
// survivors re-form without waiting out the lease. Leave removes a member at
// once; Finish ends the job for everyone; Close stops the Agent's goroutines.
//
// # Rendezvous rules
//
//   - A fresh round closes at once when MaxWorkers members arrived, or
//     LastCall after MinWorkers arrived (so workers starting a moment apart
//     land in one round). With LastCall 0 the arrival that reaches
//     MinWorkers closes it.
//   - A member lost from a running round (its lease lapsed, or it was
//     reported): the survivors that renewed their lease within the last
//     LeaseTTL/2 count as arrived in the next round at once, with any
//     pending joiners, and it closes in the same store call if nobody else
//     is expected and they are at least MinWorkers, without LastCall. Each survivor takes its new World
//     from the change's hint (its next Join makes no store call), so a loss
//     costs the store O(1) calls and one O(n) close, not a Join per
//     survivor.
//   - A round re-formed because a ranked member left it (Leave, or Join to
//     admit joiners or after a failed collective) closes as soon as every
//     other survivor arrived again (or was evicted meanwhile), if at least
//     MinWorkers did; it does not wait for LastCall.
//   - Members arriving while a round runs wait as pending; the running
//     members learn of them (Pub/Sub hint, and the heartbeat's version poll
//     because Pub/Sub can drop messages) through ChangePending and Changes.
//     Pending members beyond MaxWorkers do not trigger a change.
//   - Ranks follow seniority (the first round a member held a rank in),
//     then arrival order: survivors keep their relative order and rank 0
//     stays on the oldest survivor; newcomers take the next ranks. The same
//     membership always gives the same ranks.
//   - Simultaneous joiners never split into two rounds: every transition is
//     one atomic store operation (one Lua script on Redis).
//
// # Leases, failures and fencing
//
// A background goroutine of the Agent, independent of the training loop,
// renews the lease every HeartbeatInterval, so a long step, a GC pause or a
// long checkpoint shorter than LeaseTTL never looks like death. Every store
// call first sweeps expired leases: the first caller to notice an expired
// member of the running round evicts it and opens exactly one new round.
// Lease expiry follows the store's clock (Redis TIME), so the members' clocks
// need not agree.
//
// Silence credit: leases run on the job's time, the store's clock minus a
// credit for stretches in which no member of the job reached the store (a
// machine so loaded that it ran none of the job's processes for a second).
// The store keeps, per job, the time of its last call and the credit (O(1)
// per call: two fields of the meta hash). A call that comes more than
// LeaseTTL/2 after the job's previous one (LeaseTTL/2 is the longest
// HeartbeatInterval allowed, so a job with one live member never gaps
// longer) adds the excess to the credit, at most LeaseTTL per gap. Through
// a job-wide gap of g the job's time thus advances by g up to LeaseTTL/2,
// by LeaseTTL/2 up to 1.5 x LeaseTTL, and by g - LeaseTTL beyond: a member
// that renewed within its HeartbeatInterval before the gap survives one of
// up to 1.5 x LeaseTTL, and a gap longer than 2 x LeaseTTL (a job-wide
// stall, a partition of every member from the store) still fences everyone.
// A member silent while others call earns nothing: its lease lapses
// LeaseTTL after its last renewal, as before. store.Beat.StoreTime stays the
// store's clock, so the Agent's own view of its lease (ChangePending) is
// earlier than the store's, never later.
//
// An evicted member is fenced: its record is gone, every later call answers
// ErrFenced (the member must come back as a new Member with a new Agent),
// and it can never act under its old rank. A member that was paused (SIGSTOP)
// past its lease finds itself fenced when it resumes; ChangePending turns
// true on its own once the lease may have lapsed on the store's clock: each
// heartbeat reply carries the store's time (store.Beat.StoreTime), which the Agent
// maps to its own clock (offset bounds from the fastest round trip seen, as
// NTP does), so the lease is judged by when the store renewed it, not by how
// long the answer took to come back. Heartbeats do not wait for each other
// (up to about a lease's worth are in flight, each on its own pooled
// connection; store.Redis.Warm opens them ahead of need), and a heartbeat
// sent while the lease held keeps the verdict open until it is answered or
// its deadline (2 x LeaseTTL) passes. Latency on one member's store link
// below the lease therefore ends no round; a link that stops delivering
// renewals for longer than LeaseTTL lets the lease lapse in the store and
// the others re-form without that member. A failure report names its round: a report about an older round,
// or about a member that already arrived in the next round, is ignored.
//
// # Stores
//
// The store an Agent runs on lives in package elastic/store, as
// database/sql's drivers' side lives in database/sql/driver: the Store
// interface with the contract of each call (for a store of your own), its
// request and view types, the deterministic core of the transitions, the
// Redis store (store.NewRedis) and the in-memory one (store.NewMemory).
// Package elastic/elastictest has the in-memory store with its test
// controls and a cluster of Agents for tests. Until the next release the
// old names (elastic.Store, elastic.NewRedisStore, elastic.View, ...) stay
// here as deprecated aliases of the moved ones.
//
// # Store and outages
//
// store.NewRedis works over go-redis' UniversalClient (one node, Sentinel,
// Cluster): all keys of a job ("et:{<jobID>}:state", ":meta", ":members",
// ":leases" and the per-member sets and hashes listed in elastic/store's scripts.go) share
// one hash tag, and all carry a TTL (Config.StateTTL, renewed by
// heartbeats), so nothing outlives the job. The state is split so that a
// call costs O(1) Redis commands whatever the job's size (O(log n) for the
// leases' sorted set): a join, a heartbeat, a poll and a lease sweep touch
// only what they change; only the close of a round and the opening of the
// next are O(n), once per round. A heartbeat is a short script of its own
// (the full transition runs only when a lease expired), and the job's keys
// get their TTL when a call may have created one, on a visible change, and
// otherwise once half of StateTTL is spent. A member that holds a round's
// World is not sent its roster again, and the Agents of one process that
// share a go-redis client share one Pub/Sub subscription of the job and
// read a closed round's roster once: a hint too large to carry the roster
// ("<ver>\n<round>\n<inc>") is completed by one read per process, and a
// view of a round whose roster the process holds leaves it out. A round
// opened after a closed one is announced as open ("...\nopen"), so members
// of the closed round learn that it is over without a store call. A hint
// is not trusted for what it says: before its members take a World from
// one, or learn that their round is over, each process checks it with one
// HMGET of the job's meta hash (the store's incarnation, version and
// round, and the SHA-1 of the hint that the close recorded), so a forged
// or replayed PUBLISH on the job's channel only makes members read the
// store. On a Cluster the
// hints are plain PUBLISH from the scripts, which Redis broadcasts to every
// node, so a subscriber on any node receives them (the tests run the
// rendezvous on a three-master cluster). store.NewMemory has the
// same semantics (the same transition code; a differential test holds the
// Lua scripts to it) for unit tests and single-process use;
// elastic/standalone runs an embedded Redis-protocol server for single-host
// jobs.
//
// The state of a job carries a random incarnation. After a whole-job crash,
// a restart with the same job ID finds the old members' leases gone and
// forms a fresh round numbered above the old ones. When Redis restarts empty,
// members see their incarnation gone, re-register with their old arrival
// order and seniority and ask the store to wait (one grace lease each) for
// their old peers: the job re-forms with the same ranks and nobody is
// declared dead because keys vanished. A newcomer that registers in the
// emptied store before the survivors do still ranks after them: round
// numbers grow across the restart, and the survivors' seniority is an older
// round than any the newcomer can first hold a rank in. Every store call
// runs under a deadline the Agent enforces itself (a heartbeat 2 x
// LeaseTTL; any other call SRTT + 4 x RTTVAR of the heartbeats' round trips,
// RFC 6298, between LeaseTTL/2 (at least 100 ms) and 2 x LeaseTTL, so a
// link slower than half a lease still carries a Join), whatever the client does with context
// deadlines: go-redis applies them only with Options.ContextTimeoutEnabled,
// and without it a call through a blackholed link would wait for
// ReadTimeout (3 s). While the store is unreachable, calls retry with
// exponential backoff (10 ms to 1 s); past OutageBudget, counted from the
// start of the first failed call, every member gets ErrStoreUnavailable
// ("store unavailable"). An outage shorter than LeaseTTL is invisible to the
// job. A reply that does not parse (ErrBadState) is retried like an
// outage, because what causes it heals: a job state string that is not
// JSON, or JSON of the wrong shape, is replaced by a fresh state when the
// job re-forms. A key that holds another Redis type than the rendezvous
// uses (Redis answers WRONGTYPE: something else wrote it) never heals by
// itself: the Agent fails at once with ErrWrongType (which wraps
// ErrBadState) and ErrStoreUnavailable, naming the key; so does a call
// Redis refuses for want of permission (NOPERM: an ACL that does not grant
// the job's keys or the scripts), with ErrNoPermission. An outage longer than 2 x LeaseTTL (1.5 x LeaseTTL is
// forgiven as a job-wide silence, see above) while Redis keeps its data (a
// network partition) lets every lease lapse on Redis' clock: the members are then
// fenced when they reach Redis again, because a member that could not renew
// its lease cannot be told apart from a paused one; the trainer rejoins with
// new Members and a fresh round forms.
//
// # Progress: hung is not alive
//
// The heartbeat shows the process lives, not that its training loop does.
// A worker's loop reports progress (Agent.Progress at every step) and marks
// long phases that make no steps but are not hangs (Agent.Busy: a data
// load, an evaluation, a checkpoint write; Agent.Waiting: a collective
// waiting for peers, the time between rounds). A phase marked with Busy
// has a bound of its own, Config.PhaseTimeout (10 min): one still open
// after it is a hang (a data source that never answers). Once the worker
// made no progress for Config.ProgressTimeout outside any marked phase and
// outside Join, or a Busy phase outlasted PhaseTimeout, the Agent counts
// it as hung: it leaves the job (the
// store evicts it at once, so the survivors re-form within a heartbeat) and
// fails with ErrFenced wrapping ErrNoProgress, which the loop meets when it
// wakes. The watch starts with the first Progress or Busy call, so an Agent
// whose user never calls them is judged by its lease alone. When a round
// forms, each survivor logs a WARN naming every member of its previous
// round that is gone (member ID, address, rank).
//
// # Defaults
//
// MinWorkers 1, MaxWorkers 1024, LastCall 500 ms, JoinTimeout 10 min,
// LeaseTTL 3 s, HeartbeatInterval 500 ms, PollInterval 200 ms, OutageBudget
// 30 s, StateTTL 1 h, ProgressTimeout 15 s, PhaseTimeout 10 min (see Config).
//
// # Figures
//
// On loopback (2 cores, Redis 7), examples/rendezvous-bench measures about
// 10-20 ms from the last arrival of 64 members until all hold their World,
// a few milliseconds from a SIGKILL to the survivors' next World through a
// failure report, and LeaseTTL plus a few milliseconds through lease expiry.
// With 1024 members (goroutines of the bench process, an Agent each, sharing
// the two cores with Redis) every member holds its World about 20 ms after
// the last arrival, for about 80 ms of Redis CPU in all; 4096 in about
// 95 ms, for about 0.31 s (14.5x the Redis CPU of 256 members, for 16x the
// members; 8x with the members' starts spread over 2 s). Every member
// joins once; the rest of a formation's cost is the heartbeats of members
// waiting for the others, which grows with the wait, not the count. A
// held round of 4096 costs Redis about 16 % of a core with the defaults
// (MaxHeartbeatRate spaces its beats to one a second per member): a
// heartbeat is about 35-60 us of Redis CPU. A member lost in a round of
// 1024 and reported: every survivor holds the next World about 45 ms after
// the report, for about 25 ms of Redis CPU; through lease expiry about
// 50 ms after the lease lapsed (LeaseTTL 3 s after its last renewal:
// 2.6-2.8 s after a loss at a random point of the heartbeat interval;
// heartbeats start at a random point of their interval, so the first call
// after the lapse sweeps it).
// What still grows with n^2 is the bytes, as every process reads the whole
// roster (n records) once per round.
//
// # References
//
// The design follows the rendezvous of PyTorch's torch.distributed.elastic
// (dynamic rendezvous with min/max nodes, last call and keep-alive
// heartbeats) and Horovod Elastic's host discovery, adding store-side
// fencing by round number and failure reports.
package elastic
