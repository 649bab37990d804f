package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// KeyPrefix starts every Redis key and channel of the rendezvous. A job's
// keys are "et:{<jobID>}:state", ":meta", ":members", ":leases", ":ord",
// ":since", ":arrived", ":expected", ":back", ":pending", ":rank" and
// ":roster" (see scripts.go for what each holds) and its Pub/Sub channel
// "et:{<jobID>}:events"; the braces make the job ID the hash tag, so all
// keys of a job live in one Redis Cluster slot. A launcher's mark on the
// job (Redis.Mark) is "et:{<jobID>}:launcher".
const KeyPrefix = "et:"

var (
	scriptJoin      = redis.NewScript(luaJoin)
	scriptCheck     = redis.NewScript(luaCheck)
	scriptReport    = redis.NewScript(luaReport)
	scriptLeave     = redis.NewScript(luaLeave)
	scriptFinish    = redis.NewScript(luaFinish)
	scriptHeartbeat = redis.NewScript(luaHeartbeat)
	scriptBeat      = redis.NewScript(luaBeat)
	scriptRoster    = redis.NewScript(luaRoster)
)

// Redis is the Store over Redis (one node, Sentinel or Cluster through
// go-redis' UniversalClient). Each state transition is one Lua script; lease
// expiry follows Redis' clock (TIME), so members' clocks need not agree. Safe
// for concurrent use; it does not own the client (closing the client is the
// caller's business).
type Redis struct {
	c redis.UniversalClient
}

// NewRedis returns a Store over the given client (requires Redis >= 5
// for TIME in scripts; tested with 7.0).
func NewRedis(c redis.UniversalClient) *Redis { return &Redis{c: c} }

func jobKeys(jobID string) []string {
	p := KeyPrefix + "{" + jobID + "}:"
	return []string{p + "state", p + "meta", p + "members", p + "leases", p + "ord", p + "since",
		p + "arrived", p + "expected", p + "back", p + "pending", p + "rank", p + "roster"}
}

func jobChannel(jobID string) string { return KeyPrefix + "{" + jobID + "}:events" }

// commonArgs are the ARGV every script starts with; have is the round whose
// roster the caller needs no copy of (ARGV 9).
func commonArgs(jobID, memberID, inc string, p Params, have uint64) []any {
	return []any{
		jobChannel(jobID),
		p.MinWorkers, p.MaxWorkers,
		ms(p.LastCall), max(1, ms(p.LeaseTTL)), max(1, ms(p.StateTTL)),
		memberID, inc, strconv.FormatUint(have, 10),
	}
}

// viewArgs are commonArgs for a script that answers a view: have is the
// round of the World the caller holds, or a later one whose roster this
// process has read already (rosterOf); runView tells the two apart.
func viewArgs(jobID, memberID, inc string, p Params, have uint64) []any {
	if inc != "" {
		have = max(have, cachedRosterRound(jobID, inc))
	}
	return commonArgs(jobID, memberID, inc, p, have)
}

func (s *Redis) runView(ctx context.Context, op string, sc *redis.Script, jobID, memberID string, p Params, have uint64, args []any) (View, error) {
	if err := ValidateJobID(jobID); err != nil {
		return View{}, &Error{Op: op, JobID: jobID, Err: err}
	}
	res, err := sc.Run(ctx, s.c, jobKeys(jobID), args...).Slice()
	for attempt := 0; ; attempt++ {
		if err != nil {
			return View{}, &Error{Op: op, JobID: jobID, Err: s.mapErr(ctx, jobID, err)}
		}
		rv, perr := parseView(res)
		if perr != nil {
			return View{}, &Error{Op: op, JobID: jobID, Err: perr}
		}
		if rv.Code != CodeOK || rv.Role != RoleRanked || rv.Open {
			return wrapView(rv, op, jobID)
		}
		if len(rv.records) > 0 {
			out, werr := wrapView(rv, op, jobID)
			if werr == nil && (out.Rank >= len(out.Members) || out.Members[out.Rank].ID != memberID) {
				// A member record another ID was written over: the World
				// would put someone else at this member's rank.
				return View{}, &Error{Op: op, JobID: jobID, Err: fmt.Errorf("%w: rank %d of round %d is not this member's record", ErrBadState, out.Rank, out.Round)}
			}
			if werr == nil {
				keepRoster(jobID, out.Incarnation, out.Round, out.Members)
			}
			return out, werr
		}
		// Ranked in a closed round whose roster the script left out: the
		// caller holds its World, this process has read the roster
		// already (viewArgs), or it is larger than hintRosterMax; the
		// records of a large round then cross the link once per process,
		// not once per member.
		rv.omitted = true
		out, werr := wrapView(rv, op, jobID)
		if werr != nil || (have != 0 && rv.Round == have) {
			return out, werr
		}
		ms, rerr := s.rosterOf(ctx, jobID, rv.Incarnation, rv.Round)
		switch {
		case rerr == nil && len(ms) == rv.Size && ms[rv.Rank].ID == memberID:
			out.Members = ms
			return out, nil
		case attempt < 3 && (rerr == nil || errors.Is(rerr, errRosterGone)):
			if rerr == nil {
				// Not the roster this view names: a cached one of the same
				// round number and incarnation from before the store went
				// back to an older state (a failover that lost writes).
				forgetRoster(jobID, rv.Incarnation, rv.Round)
			}
			// Else the next round opened between the script and the read:
			// the view is stale. Either way, read it again (a Check
			// changes nothing the call did not already change).
			res, err = scriptCheck.Run(ctx, s.c, jobKeys(jobID), viewArgs(jobID, memberID, rv.Incarnation, p, have)...).Slice()
			continue
		case rerr == nil:
			rerr = fmt.Errorf("%w: the roster of round %d has %d members, the view %d (rank %d)", ErrBadState, rv.Round, len(ms), rv.Size, rv.Rank)
		}
		return View{}, &Error{Op: op, JobID: jobID, Err: rerr}
	}
}

// Join implements Store.
func (s *Redis) Join(ctx context.Context, r JoinRequest) (View, error) {
	if err := r.Member.Validate(); err != nil {
		return View{}, &Error{Op: "join", JobID: r.JobID, Err: err}
	}
	args := viewArgs(r.JobID, r.Member.ID, r.Incarnation, r.Params, 0)
	arrive := 0
	if r.Arrive {
		arrive = 1
	}
	args = append(args, r.NewIncarnation, r.Member.record(), r.Order, strconv.FormatUint(r.RoundHint, 10), arrive, strconv.FormatUint(r.Since, 10),
		strconv.FormatUint(r.HaveRound, 10))
	for _, p := range r.Peers {
		args = append(args, p)
	}
	return s.runView(ctx, "join", scriptJoin, r.JobID, r.Member.ID, r.Params, 0, args)
}

// Check implements Store.
func (s *Redis) Check(ctx context.Context, r MemberRequest) (View, error) {
	return s.runView(ctx, "check", scriptCheck, r.JobID, r.MemberID, r.Params, r.HaveRound, viewArgs(r.JobID, r.MemberID, r.Incarnation, r.Params, r.HaveRound))
}

// Report implements Store.
func (s *Redis) Report(ctx context.Context, r ReportRequest) (View, error) {
	args := append(viewArgs(r.JobID, r.MemberID, r.Incarnation, r.Params, r.HaveRound), strconv.FormatUint(r.Round, 10), r.Target)
	return s.runView(ctx, "report", scriptReport, r.JobID, r.MemberID, r.Params, r.HaveRound, args)
}

// Leave implements Store.
func (s *Redis) Leave(ctx context.Context, r MemberRequest) (View, error) {
	keep := "0"
	if r.KeepRanked {
		keep = "1"
	}
	args := append(viewArgs(r.JobID, r.MemberID, r.Incarnation, r.Params, r.HaveRound), keep, strconv.FormatUint(r.HaveRound, 10))
	return s.runView(ctx, "leave", scriptLeave, r.JobID, r.MemberID, r.Params, r.HaveRound, args)
}

// Finish implements Store.
func (s *Redis) Finish(ctx context.Context, r MemberRequest) (View, error) {
	return s.runView(ctx, "finish", scriptFinish, r.JobID, r.MemberID, r.Params, r.HaveRound, viewArgs(r.JobID, r.MemberID, r.Incarnation, r.Params, r.HaveRound))
}

// Heartbeat implements Store.
func (s *Redis) Heartbeat(ctx context.Context, r MemberRequest) (Beat, error) {
	fail := func(err error) (Beat, error) {
		return Beat{}, &Error{Op: "heartbeat", JobID: r.JobID, Err: err}
	}
	if err := ValidateJobID(r.JobID); err != nil {
		return fail(err)
	}
	keys := jobKeys(r.JobID)
	res, err := scriptBeat.Run(ctx, s.c, keys[1:4], max(1, ms(r.Params.LeaseTTL)), max(1, ms(r.Params.StateTTL)),
		r.MemberID, r.Incarnation).Slice()
	if err == nil && len(res) == 1 {
		if n, e := replyInt(res[0]); e == nil && n == -1 {
			// A lease expired, or the keys' TTL is due: the heartbeat
			// that sweeps and renews.
			args := commonArgs(r.JobID, r.MemberID, r.Incarnation, r.Params, r.HaveRound)
			res, err = scriptHeartbeat.Run(ctx, s.c, keys, args...).Slice()
		}
	}
	if err != nil {
		return fail(s.mapErr(ctx, r.JobID, err))
	}
	if len(res) < 3 || len(res) > 7 {
		return fail(fmt.Errorf("%w: heartbeat reply has %d elements", ErrBadState, len(res)))
	}
	code, e1 := replyInt(res[0])
	inc, e2 := replyString(res[1])
	ver, e3 := replyInt(res[2])
	var now, leases int64
	var e4, e5 error
	if len(res) >= 4 {
		now, e4 = replyInt(res[3])
	}
	if len(res) >= 5 {
		leases, e5 = replyInt(res[4])
	}
	var round, open int64
	var e6, e7 error
	if len(res) == 7 {
		round, e6 = replyInt(res[5])
		open, e7 = replyInt(res[6])
	}
	if err := errors.Join(e1, e2, e3, e4, e5, e6, e7); err != nil || code < 0 || code > int64(CodeFinished) || ver < 0 || now < 0 ||
		leases < 0 || leases > math.MaxInt32 || round < 0 || open < 0 || open > 1 {
		return fail(fmt.Errorf("%w: heartbeat reply %v", ErrBadState, res))
	}
	return Beat{Code: Code(code), Incarnation: inc, Version: uint64(ver), StoreTime: now, Leases: int(leases),
		Round: uint64(round), Open: open == 1}, nil
}

// keyTypes is the Redis type of each of a job's keys (jobKeys), by the
// name after the job's prefix, as the scripts use them (see scripts.go).
var keyTypes = map[string]string{
	"state": "string", "meta": "hash", "members": "hash", "leases": "zset", "ord": "hash", "since": "hash",
	"arrived": "set", "expected": "set", "back": "set", "pending": "set", "rank": "hash", "roster": "string",
}

// mapErr turns a script's error into the store's: a WRONGTYPE reply (a
// key of the job holds another Redis type than the scripts use: something
// else wrote it) is ErrWrongType naming the key, found by asking Redis the
// type of each of the job's keys; a NOPERM reply (the client's ACL user
// lacks a permission) is ErrNoPermission; anything else is returned as it
// is (an outage, to the Agent).
func (s *Redis) mapErr(ctx context.Context, jobID string, err error) error {
	if strings.HasPrefix(err.Error(), "NOPERM") {
		return fmt.Errorf("%w: job %q: %w", ErrNoPermission, jobID, err)
	}
	if !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		return err
	}
	keys := jobKeys(jobID)
	cmds := make([]*redis.StatusCmd, len(keys))
	_, perr := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Type(ctx, k)
		}
		return nil
	})
	var bad []string
	if perr == nil {
		prefix := KeyPrefix + "{" + jobID + "}:"
		for i, k := range keys {
			got, want := cmds[i].Val(), keyTypes[strings.TrimPrefix(k, prefix)]
			if got != "none" && want != "" && got != want {
				bad = append(bad, fmt.Sprintf("%s holds a %s, not a %s", k, got, want))
			}
		}
	}
	if len(bad) == 0 {
		// The key changed back meanwhile, or its type could not be read:
		// still not an outage.
		return fmt.Errorf("%w: a key of %s* holds another type than the rendezvous uses: %w", ErrWrongType, KeyPrefix+"{"+jobID+"}:", err)
	}
	return fmt.Errorf("%w: %s (something other than this job's members wrote it; delete it, or use another job ID): %w",
		ErrWrongType, strings.Join(bad, ", "), err)
}

func replyInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("%w: %T where an integer was expected", ErrBadState, v)
}

func replyString(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case nil:
		return "", nil
	}
	return "", fmt.Errorf("%w: %T where a string was expected", ErrBadState, v)
}

// parseView decodes a view reply of the scripts (see scripts.go).
func parseView(res []any) (rawView, error) {
	const head = 12
	if len(res) < head {
		return rawView{}, fmt.Errorf("%w: view reply has %d elements", ErrBadState, len(res))
	}
	var ints [head]int64
	var errs []error
	for _, i := range []int{0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} {
		n, err := replyInt(res[i])
		ints[i] = n
		errs = append(errs, err)
	}
	inc, err := replyString(res[1])
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return rawView{}, err
	}
	code, role := ints[0], ints[5]
	if code < 0 || code > int64(CodeFinished) || role < 0 || role > int64(RolePending) ||
		ints[2] < 0 || ints[3] < 0 || ints[11] < 0 || ints[7] < 0 || ints[8] < 0 || ints[9] < 0 {
		return rawView{}, fmt.Errorf("%w: view reply out of range: %v", ErrBadState, res[:head])
	}
	v := rawView{View: View{
		Code:        Code(code),
		Incarnation: inc,
		Version:     uint64(ints[2]),
		Round:       uint64(ints[3]),
		Open:        ints[4] == 1,
		Role:        Role(role),
		Rank:        int(ints[6]),
		Size:        int(ints[7]),
		Pending:     int(ints[8]),
		Wait:        msDuration(ints[9]),
		Order:       ints[10],
		Since:       uint64(ints[11]),
	}}
	if v.Open { // the pending slot carries the arrivals while open
		v.Arrived, v.Pending = v.Pending, 0
	}
	// The scripts answer the records as one roster string, one record per
	// line; each element may hold several.
	for _, r := range res[head:] {
		s, err := replyString(r)
		if err != nil {
			return rawView{}, err
		}
		v.records = append(v.records, strings.Split(s, "\n")...)
	}
	return v, nil
}

// Watch implements Store: a Pub/Sub subscription to the job's channel,
// shared by every Watcher of this process on the same client (see hub).
func (s *Redis) Watch(ctx context.Context, jobID string) (Watcher, error) {
	if err := ValidateJobID(jobID); err != nil {
		return nil, &Error{Op: "watch", JobID: jobID, Err: err}
	}
	return s.watch(ctx, jobID)
}

// DropJob deletes every key of a job. For tests and operators: a running
// job's members treat it like a Redis restarted empty (they re-register).
func (s *Redis) DropJob(ctx context.Context, jobID string) error {
	if err := ValidateJobID(jobID); err != nil {
		return err
	}
	if err := s.c.Del(ctx, jobKeys(jobID)...).Err(); err != nil {
		return &Error{Op: "drop", JobID: jobID, Err: err}
	}
	return nil
}
