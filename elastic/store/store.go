package store

import (
	"context"
	"time"
)

// Params are the rendezvous settings a Store applies in one call; an Agent
// derives them from its Config. Durations are rounded down to milliseconds.
type Params struct {
	MinWorkers int           // smallest world size a round closes with (>= 1)
	MaxWorkers int           // largest world size (>= MinWorkers)
	LastCall   time.Duration // wait after MinWorkers arrived (fresh rounds only)
	LeaseTTL   time.Duration // lease length granted by a heartbeat
	StateTTL   time.Duration // TTL of every key of the job, renewed by heartbeats
}

// Code is the outcome of a store call that reached the store.
type Code int

const (
	// CodeOK means the call was applied.
	CodeOK Code = iota
	// CodeFenced means the caller's member record is gone in the current
	// incarnation of the job state: it was evicted. Nothing was applied.
	CodeFenced
	// CodeLost means the job state the caller registered in is gone (the
	// store restarted empty, or the keys expired): the caller must register
	// again. Nothing was applied.
	CodeLost
	// CodeFinished means the job is finished. Nothing was applied.
	CodeFinished
)

// String returns the code's name.
func (c Code) String() string {
	switch c {
	case CodeOK:
		return "ok"
	case CodeFenced:
		return "fenced"
	case CodeLost:
		return "lost"
	case CodeFinished:
		return "finished"
	}
	return "unknown"
}

// Role is the caller's place in the job state.
type Role int

const (
	// RoleNone: registered (lease held) but in no round and not waiting.
	RoleNone Role = iota
	// RoleRanked: holds View.Rank in the closed round View.Round.
	RoleRanked
	// RoleArrived: arrived in the forming round View.Round.
	RoleArrived
	// RoleExpected: a survivor the forming round View.Round waits for.
	RoleExpected
	// RolePending: waits for the next round while View.Round runs.
	RolePending
)

// View is the job state as one member sees it after a store call.
type View struct {
	Code        Code
	Incarnation string        // random ID of this incarnation of the job state
	Version     uint64        // grows on every visible change (open, close, eviction, pending, finish)
	Round       uint64        // latest round number (forming if Open)
	Open        bool          // Round is forming
	Role        Role          // caller's role
	Rank        int           // caller's rank if Role == RoleRanked, else -1
	Size        int           // world size of the closed round (0 if Open)
	Pending     int           // waiting joiners the closed round could still admit (<= MaxWorkers-Size)
	Arrived     int           // members arrived in the forming round (Open only, else 0)
	Wait        time.Duration // time left until the last-call deadline (Open, deadline set), else 0
	Order       int64         // caller's arrival order (rank order key), 0 if unknown
	Since       uint64        // caller's seniority: the first round it held a rank in, 0 if never ranked
	Members     []Member      // Role == RoleRanked: the round's members in rank order (nil if Round == MemberRequest.HaveRound)
}

// Beat is the result of a heartbeat.
type Beat struct {
	Code        Code
	Incarnation string
	Version     uint64
	// StoreTime is the store's clock when it renewed the lease (Code
	// CodeOK), in ms since the Unix epoch (Redis TIME); the lease then
	// expires at StoreTime + Params.LeaseTTL on that clock. 0 when the
	// store did not say (an older script, or no renewal). The Agent maps it
	// to its own clock to judge its lease from the store's view rather than
	// from round-trip times.
	StoreTime int64
	// Leases is the number of members holding a lease in the job (Code
	// CodeOK; 0 when the store did not say): arrived, ranked, expected or
	// pending alike. The Agent spaces its heartbeats by it
	// (elastic.Config.HeartbeatEvery), so members that gather for a forming round
	// learn the job's size as it grows, not only the arrivals before theirs.
	Leases int
	// Round is the job's latest round and Open whether it is still
	// forming (Code CodeOK; 0 when the store did not say): a Join waiting
	// in a forming round learns from its heartbeat that the round closed,
	// and waits for the hint that brings its World rather than reading the
	// store at once (a round of thousands closing sent thousands of reads).
	Round uint64
	Open  bool
}

// JoinRequest registers a member (if needed) and, with Arrive, makes it take
// part in the next round (or the forming one).
type JoinRequest struct {
	JobID          string
	Member         Member
	Incarnation    string   // incarnation the caller registered in; "" for a new member
	NewIncarnation string   // used if the call creates the job state; random, non-empty
	Order          int64    // caller's previous order when re-registering after a loss; 0 = assign
	RoundHint      uint64   // highest closed round the caller has seen; rounds opened later get a higher number
	Since          uint64   // caller's View.Since when re-registering after a loss (<= RoundHint, else ignored); 0 = never ranked
	Peers          []string // re-registration after a loss: member IDs of the caller's last World
	Arrive         bool     // take part in the next/forming round; false = only (re-)register
	Params         Params
	// HaveRound is the round whose World the caller holds (0 = not said).
	// An arrival of a member ranked in the closed round opens the next
	// round (the caller leaves its round) unless HaveRound is below that
	// round: then the caller is ranked in a round it never held (the round
	// re-formed after a loss while the caller missed its hint) and is
	// simply given it.
	HaveRound uint64
}

// MemberRequest names the calling member of a job.
type MemberRequest struct {
	JobID       string
	MemberID    string
	Incarnation string
	Params      Params
	// HaveRound is the round whose World the caller already holds (0 =
	// none). A view that ranks the caller in that round leaves Members nil
	// instead of sending the whole roster again (O(members) bytes on every
	// call of every member of a large round).
	HaveRound uint64
	// KeepRanked, for Leave only: the caller is not evicted when the
	// latest round is closed, numbered above HaveRound, and ranks it (it
	// arrived, and its Join was cancelled before it learned that the
	// round closed: a leave would fail that round for the others while it
	// forms); the view then says so (RoleRanked in that round). A store
	// that ignores it evicts, as Leave always did.
	KeepRanked bool
}

// ReportRequest reports that Target failed while both were in Round.
type ReportRequest struct {
	MemberRequest
	Round  uint64
	Target string
}

// Hint is a change notification of one job. Version is the job's version
// after the change (0 if unknown). When the change closed a round, Round,
// Incarnation and Members (in rank order) describe it, so a waiting member
// can take its World without another store call; otherwise Members is nil.
// Members is shared by every Watcher of the process: read it, do not modify
// it. A member lost from a running round (lease lapsed, reported) re-forms
// the next round in the same call (its survivors count as arrived): that
// close's hint ranks the survivors, and each takes its World from it. When
// the change opened a round after a closed one without closing it (a
// ranked member left or arrived for the next round, or the survivors of a
// loss are fewer than MinWorkers or some were silent for LeaseTTL/2),
// Open is true and Round and Incarnation name the new round: every member
// of the closed round learns that its round is superseded without a store
// call.
type Hint struct {
	Version     uint64
	Round       uint64
	Incarnation string
	Members     []Member
	Open        bool
}

// Watcher delivers change hints of one job. C has capacity 1; the sender
// never blocks and replaces an unread hint with the newer one. Hints can be
// lost (Redis Pub/Sub drops messages); Agents poll as well.
type Watcher interface {
	C() <-chan Hint
	Close() error // stops delivery and every goroutine of the Watcher; waits for them
}

// offer puts h into c (capacity 1), replacing an unread hint. Only one
// goroutine may send on c.
func offer(c chan Hint, h Hint) {
	for {
		select {
		case c <- h:
			return
		default:
		}
		select {
		case <-c:
		default:
		}
	}
}

// Store is the shared state of the rendezvous: a few atomic operations on the
// state of one job. Each call is one atomic transition (one Lua script on
// Redis). Implementations must be safe for concurrent use by many Agents.
//
// Every call sweeps expired leases first (evicting their members, and opening
// exactly one new round if a member of the running round was among them), then
// applies its operation. A returned error means the store could not be
// reached or answered garbage (see Error); a reached store answers with a
// Code.
//
// Semantics (shared by NewRedis and NewMemory, checked by the same
// tests):
//   - Rounds are numbered and only grow. A round forms (Open) and then closes
//     with ranks 0..W-1.
//   - A fresh round (no survivors) closes at once at MaxWorkers arrivals, or
//     LastCall after MinWorkers arrived. A re-formed round (survivors of the
//     previous round expected) closes as soon as every survivor arrived or was
//     evicted, if at least MinWorkers arrived.
//   - Ranks follow seniority (Since: the first round a member held a rank
//     in; members never ranked come last), then arrival order (Order):
//     survivors keep their relative order and rank 0 stays on the oldest
//     survivor; newcomers take the next ranks. The same membership gives the
//     same ranks. This holds across a store restarted empty too, whoever
//     registers first: survivors re-register with their Order and Since.
//   - Join with Arrive by a ranked member of the closed round opens the next
//     round; by anyone else while a round runs, it adds the caller to the
//     pending joiners (moved into the next round when it opens).
//   - Evicted members are fenced: every later call by them answers CodeFenced.
type Store interface {
	// Join registers r.Member (if needed) and, with r.Arrive, makes it
	// take part in the forming or next round; returns the caller's view.
	Join(ctx context.Context, r JoinRequest) (View, error)
	// Check renews the caller's lease, sweeps, closes the forming round if
	// due, and returns the caller's view.
	Check(ctx context.Context, r MemberRequest) (View, error)
	// Heartbeat renews the caller's lease (cheap: no full state read unless
	// a lease expired).
	Heartbeat(ctx context.Context, r MemberRequest) (Beat, error)
	// Report evicts Target at once if Round is still current (Target ranked
	// in the closed Round, or expected and not yet arrived in the round that
	// followed Round); a stale report is ignored. Returns the caller's view.
	Report(ctx context.Context, r ReportRequest) (View, error)
	// Leave evicts the caller at once.
	Leave(ctx context.Context, r MemberRequest) (View, error)
	// Finish marks the job finished for everyone.
	Finish(ctx context.Context, r MemberRequest) (View, error)
	// Watch subscribes to change hints of the job.
	Watch(ctx context.Context, jobID string) (Watcher, error)
}
