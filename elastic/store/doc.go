// Package store is the rendezvous store of package elastic: the Store
// interface an Agent calls, the types of its calls, the deterministic core
// of the job state's transitions, and the two stores built on it, Redis
// (NewRedis: go-redis, one Lua script per transition) and Memory
// (NewMemory: the same core in process memory). Package elastic holds what
// a worker calls (Agent, Config, World, the errors) and imports this one;
// this one imports nothing of elastic, as database/sql/driver sits beneath
// database/sql.
//
// Users pass a store to elastic.NewAgent (or trainer.New) and call nothing
// else here:
//
//	agent, err := elastic.NewAgent(store.NewRedis(client), elastic.NewMember(addr), cfg)
//
// # Implementing a Store
//
// A Store keeps the state of many jobs, each under its job ID; every call
// names the job and, but Join, the calling member and the incarnation of
// the job state it registered in. Each call is one atomic transition of
// that job, and a Store is called by many Agents at once (goroutines of one
// process, processes of many hosts): it must be safe for concurrent use,
// and two calls of one job must never interleave.
//
// Every call first sweeps the job's expired leases (evicting those members,
// and opening exactly one new round when a member of the running round was
// among them), then applies its operation, and answers with a Code: CodeOK
// (applied), CodeFenced (the caller was evicted), CodeLost (the job state
// the caller registered in is gone: register again) or CodeFinished.
// Nothing is applied unless the Code is CodeOK. An error, never a Code,
// means the store was not reached or answered garbage: return it as an
// *Error (Op, JobID), wrapping ErrBadState for data that does not parse;
// the Agent retries errors within its outage budget, except ErrWrongType
// and ErrNoPermission, which it does not retry.
//
//   - Join registers the member (JoinRequest.Member; Incarnation "" for a
//     new member, NewIncarnation if the call creates the job state) and,
//     with Arrive, makes it take part in the forming or next round. A
//     ranked member of the closed round that arrives opens the next round;
//     anyone else arriving while a round runs waits as pending.
//   - Check renews the caller's lease, closes the forming round if due
//     (MaxWorkers arrived; LastCall after MinWorkers; every expected
//     survivor back) and returns the caller's View.
//   - Heartbeat renews the lease and answers a Beat: cheap, no roster.
//   - Report evicts a member of the caller's round at once; a report about
//     an older round is ignored.
//   - Leave evicts the caller; Finish ends the job for every member.
//   - Watch returns a Watcher whose channel (capacity 1, the newest hint
//     replaces an unread one, never blocking the sender) carries a Hint
//     after each visible change. Hints may be lost: Agents poll as well.
//
// Ranks follow seniority (View.Since), then arrival order (View.Order); the
// same membership gives the same ranks, also after the store restarted
// empty (members re-register with their Order and Since). The Store
// interface's comment states the rules in full; core.go is their reference
// implementation, and both stores here run it (Memory directly, Redis as
// Lua scripts that mirror it, held to it by a differential test).
//
// Optional capabilities are found by type assertion, as database/sql does
// with its drivers': a store with Warm(ctx, n int) error has the Agent open
// n pooled connections ahead of need (Redis.Warm).
//
// # Redis
//
// All keys of a job start with KeyPrefix and carry the job ID as their
// hash tag ("et:{<jobID>}:..."), so a job lives in one Redis Cluster slot;
// all have a TTL (Params.StateTTL). Lease expiry follows Redis' clock.
// Redis.Mark keeps a launcher's mark on a job ID beside them (package
// launch refuses a second launcher of another job secret with it).
// RedisLogger sends go-redis' own log lines to a *slog.Logger.
package store
