package store

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// This file is the deterministic core of the rendezvous: the state of one
// job and its transitions, driven by an injected clock (milliseconds). The
// in-memory store runs it directly; the Redis store runs the same transitions
// as Lua scripts (scripts.go), written to mirror these functions line by line.
// Both are checked by the same tests.

// coreState is the JSON document kept under the job's state key.
type coreState struct {
	Inc      string           `json:"inc"`      // incarnation: random, set when the state is created
	Round    uint64           `json:"round"`    // latest round number
	Prev     uint64           `json:"prev"`     // number of the last closed round
	Floor    uint64           `json:"floor"`    // the next round opened gets at least this number
	Open     bool             `json:"open"`     // Round is forming
	Reform   bool             `json:"reform"`   // forming round was opened with survivors expected
	Fin      bool             `json:"fin"`      // job finished
	DL       int64            `json:"dl"`       // last-call deadline (ms) of the forming round; 0 = unset
	Seq      int64            `json:"seq"`      // highest order handed out
	Ver      uint64           `json:"ver"`      // version; grows on every visible change
	Ranked   []string         `json:"ranked"`   // closed round: member IDs in rank order
	Arrived  []string         `json:"arrived"`  // forming round: arrived members
	Expected []string         `json:"expected"` // forming round: survivors not yet arrived
	Back     []string         `json:"back"`     // forming round: survivors that arrived
	Pending  []string         `json:"pending"`  // closed round: waiting joiners in arrival order
	Ord      map[string]int64 `json:"ord"`      // member ID -> arrival order
	Since    map[string]int64 `json:"since"`    // member ID -> first round it held a rank in (seniority)
}

// coreJob is the whole store content of one job: the state document, the
// member records (ID -> JSON of Member) and the leases (ID -> expiry, ms).
type coreJob struct {
	st      *coreState
	members map[string]string
	leases  map[string]int64
	last    int64 // store time (ms) of the job's last call (see tick)
	credit  int64 // silence credit (ms): job time = store time - credit
}

// beatLastStep (ms) is the step in which a plain heartbeat moves the job's
// last call (see heartbeat).
const beatLastStep = 10

// silenceGap is the longest gap (ms) between two calls of the job that is
// not silence: LeaseTTL/2, the longest HeartbeatInterval the configuration
// allows, so a job with one live member never gaps beyond it.
func silenceGap(p Params) int64 { return ms(p.LeaseTTL) / 2 }

// tick records a call that reached the job at store time now and returns
// the job's time, on which leases and the last-call deadline run. A gap
// since the previous call longer than silenceGap, in which no member of the
// job reached the store (a machine too starved to run any of them), is
// credited beyond silenceGap, up to LeaseTTL per gap: through such a gap the
// job's time advances by at most silenceGap (LeaseTTL/2), which a member
// that renewed within its HeartbeatInterval before the gap survives. A
// member silent while others call gains nothing; a job-wide silence longer
// than silenceGap + LeaseTTL still lets every lease lapse.
func (j *coreJob) tick(now int64, p Params) int64 {
	if j.credit < 0 || j.credit >= now { // as the scripts' job_credit
		j.credit = 0
	}
	if gap := now - j.last; gap > silenceGap(p) {
		j.credit += min(gap-silenceGap(p), ms(p.LeaseTTL))
	}
	j.last = now
	return now - j.credit
}

// opCtx collects the effects of one transition.
type opCtx struct {
	changed bool // a visible change: bump Version and publish
	reopen  bool // a ranked member of the closed round was evicted
	closed  bool // the forming round closed
	opened  bool // a round opened after a closed one (openNext)
}

// rawView is a View before member records are parsed.
type rawView struct {
	View
	records []string
	omitted bool // ranked in the round the caller holds: records left out
}

func ms(d time.Duration) int64 { return int64(d / time.Millisecond) }

func contains(list []string, id string) bool { return slices.Contains(list, id) }

func remove(list *[]string, id string) bool {
	i := slices.Index(*list, id)
	if i < 0 {
		return false
	}
	*list = slices.Delete(*list, i, i+1)
	return true
}

func newCoreState(inc string, hint uint64) *coreState {
	return &coreState{Inc: inc, Round: hint, Prev: hint, Floor: hint + 1, Ord: map[string]int64{}, Since: map[string]int64{}}
}

// evict removes a member from everything.
func (j *coreJob) evict(id string, c *opCtx) {
	st := j.st
	delete(j.members, id)
	delete(j.leases, id)
	delete(st.Ord, id)
	delete(st.Since, id)
	if !st.Open && remove(&st.Ranked, id) {
		c.reopen = true
	}
	remove(&st.Arrived, id)
	remove(&st.Expected, id)
	remove(&st.Back, id)
	remove(&st.Pending, id)
	c.changed = true
}

// openNext opens the round after the closed one: pending joiners have
// arrived; survivors (remaining ranked members) are expected, except those
// present says have arrived too (see settle; nil: none).
func (j *coreJob) openNext(c *opCtx, present func(id string) bool) {
	st := j.st
	st.Round = max(st.Round+1, st.Floor)
	st.Open = true
	st.Reform = len(st.Ranked) > 0
	st.DL = 0
	st.Arrived = st.Pending
	st.Pending = []string{}
	st.Expected, st.Back = []string{}, []string{}
	for _, id := range st.Ranked {
		if present != nil && present(id) {
			st.Back = append(st.Back, id)
			st.Arrived = append(st.Arrived, id)
		} else {
			st.Expected = append(st.Expected, id)
		}
	}
	st.Ranked = []string{}
	c.changed, c.opened = true, true
}

// settle opens exactly one new round if an eviction hit the running round.
// A survivor that renewed its lease within the last silenceGap (LeaseTTL/2,
// the longest HeartbeatInterval allowed) counts as arrived in it at once,
// so the round usually re-forms in the call that evicted (tryClose),
// without a store call per survivor (O(n) calls per loss in a round of
// thousands); it takes the new World from the change's hint, or from its
// next Join (JoinRequest.HaveRound tells the store it has not held that
// round yet). A survivor silent for longer is expected as before: members
// that died together (a host of several workers) lapse within a heartbeat
// of each other, and the first lapse must not rank the others in a round
// that would fail at once. At now (job time). Without present (a Leave),
// every survivor is expected.
func (j *coreJob) settle(now int64, p Params, c *opCtx, present bool) {
	if c.reopen {
		c.reopen = false
		if !present {
			j.openNext(c, nil)
			return
		}
		recent := now + ms(p.LeaseTTL) - silenceGap(p) // lease end of a renewal silenceGap ago
		j.openNext(c, func(id string) bool { return j.leases[id] >= recent })
	}
}

// sweep evicts members whose lease expired, then settles. Every member the
// state names holds a lease (leases go only with evict, which removes the
// member from everything, or with the whole job), so the expired leases are
// all there is to look at: a sweep costs O(expired) (a ZRANGEBYSCORE in the
// Lua scripts), not O(members).
func (j *coreJob) sweep(now int64, p Params, c *opCtx) {
	var expired []string
	for id, exp := range j.leases {
		if exp <= now {
			expired = append(expired, id)
		}
	}
	sort.Strings(expired)
	for _, id := range expired {
		j.evict(id, c)
	}
	j.settle(now, p, c, true)
}

func (j *coreJob) arrive(id string) {
	st := j.st
	if remove(&st.Expected, id) {
		st.Back = append(st.Back, id)
	}
	if !contains(st.Arrived, id) {
		st.Arrived = append(st.Arrived, id)
	}
}

// tryClose closes the forming round if its rule says so. A re-formed round
// closes without LastCall only if a survivor came back; if every expected
// survivor was evicted instead (a job restarted after a crash), it gathers
// arrivals like a fresh round.
func (j *coreJob) tryClose(now int64, p Params, c *opCtx) {
	st := j.st
	if !st.Open || len(st.Expected) > 0 {
		return
	}
	n := len(st.Arrived)
	if n == 0 {
		st.DL, st.Reform = 0, false
		return
	}
	closeNow := false
	switch {
	case st.Reform && len(st.Back) > 0 && n >= p.MinWorkers:
		closeNow = true
	case n >= p.MaxWorkers:
		closeNow = true
	case n >= p.MinWorkers:
		if st.DL == 0 {
			st.DL = now + ms(p.LastCall)
		}
		closeNow = now >= st.DL
	default:
		st.DL = 0
	}
	if !closeNow {
		return
	}
	// An arrival without a member record (written outside the protocol)
	// holds no lease, so no sweep removes it: drop it and decide again
	// (scripts.go, try_close).
	ghost := func(id string) bool { _, ok := j.members[id]; return !ok }
	if slices.ContainsFunc(st.Arrived, ghost) {
		st.Arrived = slices.DeleteFunc(st.Arrived, ghost)
		st.Back = slices.DeleteFunc(st.Back, ghost)
		c.changed = true
		j.tryClose(now, p, c)
		return
	}
	arr := slices.Clone(st.Arrived)
	sort.SliceStable(arr, func(a, b int) bool { return st.senior(arr[a], arr[b]) })
	k := min(n, p.MaxWorkers)
	st.Ranked = arr[:k:k]
	for _, id := range st.Ranked {
		if st.Since[id] == 0 {
			st.Since[id] = int64(st.Round)
		}
	}
	st.Pending = slices.Clone(arr[k:])
	st.Open, st.Reform, st.DL = false, false, 0
	st.Prev = st.Round
	st.Expected, st.Arrived, st.Back = []string{}, []string{}, []string{}
	c.changed, c.closed = true, true
}

// senior reports whether member a ranks before member b: the member that
// first held a rank in an earlier round first (members never ranked last),
// then the lower arrival order, then the lower ID. Seniority (Since) is a
// round number, and round numbers grow across store restarts (RoundHint), so
// survivors that re-register with their Since after Redis restarted empty
// rank before a newcomer even if the newcomer registered (and so took a low
// order) first; arrival orders only compare within one incarnation.
func (st *coreState) senior(a, b string) bool {
	sa, sb := st.Since[a], st.Since[b]
	if sa != sb {
		switch {
		case sa == 0:
			return false
		case sb == 0:
			return true
		}
		return sa < sb
	}
	oa, ob := st.Ord[a], st.Ord[b]
	if oa != ob {
		return oa < ob
	}
	return a < b
}

func (j *coreJob) save(c *opCtx) {
	if c.changed {
		j.st.Ver++
	}
}

// hintRosterMax bounds the roster a hint message carries (bytes, about 600
// members). A larger round's close is announced by its version, round and
// incarnation: each process reads the roster once (the Redis store's hub) and
// hands it to its members, instead of thousands of subscribers each
// receiving it, and the small message reaches them fast. The Redis
// store's views leave such a roster out too (the client reads it through
// the same one read per process). The in-memory store hands its members
// the parsed roster whatever its size.
const hintRosterMax = 64 << 10

// hint is what a visible change publishes.
func (j *coreJob) hint(c opCtx) Hint {
	h := Hint{Version: j.st.Ver}
	switch {
	case c.closed && !j.st.Open:
		h.Round, h.Incarnation = j.st.Round, j.st.Inc
		recs := make([]string, len(j.st.Ranked))
		for i, id := range j.st.Ranked {
			recs[i] = j.members[id]
		}
		ms, err := parseRoster(strings.Join(recs, "\n"))
		if err != nil || len(ms) == 0 {
			return Hint{Version: j.st.Ver}
		}
		h.Members = ms
	case c.opened && j.st.Open:
		h.Round, h.Incarnation, h.Open = j.st.Round, j.st.Inc, true
	}
	return h
}

// view is the caller's view; have is the round whose World the caller
// holds (MemberRequest.HaveRound): ranked in it, the records are left out.
func (j *coreJob) view(id string, code Code, now int64, p Params, have uint64) rawView {
	st := j.st
	v := rawView{View: View{Code: code, Rank: -1}}
	if st == nil {
		return v
	}
	v.Incarnation, v.Version, v.Round, v.Open, v.Order = st.Inc, st.Ver, st.Round, st.Open, st.Ord[id]
	v.Since = uint64(st.Since[id])
	if code != CodeOK {
		return v
	}
	if st.Open {
		switch {
		case contains(st.Arrived, id):
			v.Role = RoleArrived
		case contains(st.Expected, id):
			v.Role = RoleExpected
		}
		if st.DL > 0 {
			v.Wait = time.Duration(max(0, st.DL-now)) * time.Millisecond
		}
		v.Arrived = len(st.Arrived)
		return v
	}
	v.Size = len(st.Ranked)
	v.Pending = max(0, min(len(st.Pending), p.MaxWorkers-v.Size))
	if i := slices.Index(st.Ranked, id); i >= 0 {
		v.Role, v.Rank = RoleRanked, i
		if have == st.Round {
			v.omitted = true
			return v
		}
		for _, m := range st.Ranked {
			v.records = append(v.records, j.members[m])
		}
	} else if contains(st.Pending, id) {
		v.Role = RolePending
	}
	return v
}

// precheck answers Lost or Finished before anything is applied.
func (j *coreJob) precheck(inc string) (Code, bool) {
	switch {
	case j.st == nil:
		return CodeLost, false
	case j.st.Fin:
		return CodeFinished, false
	case j.st.Inc != inc:
		return CodeLost, false
	}
	return CodeOK, true
}

func (j *coreJob) join(r JoinRequest, now int64) (rawView, opCtx) {
	p, id := r.Params, r.Member.ID
	var c opCtx
	fresh := j.st == nil
	if fresh {
		j.st = newCoreState(r.NewIncarnation, r.RoundHint)
		j.members, j.leases = map[string]string{}, map[string]int64{}
		c.changed = true
	}
	st := j.st
	if st.Fin {
		return j.view(id, CodeFinished, now, p, 0), opCtx{}
	}
	if fresh {
		j.last, j.credit = now, 0
	} else {
		now = j.tick(now, p)
	}
	j.sweep(now, p, &c)
	_, known := j.members[id]
	if r.Incarnation != "" && r.Incarnation == st.Inc && !known {
		j.save(&c)
		return j.view(id, CodeFenced, now, p, 0), c
	}
	st.Floor = max(st.Floor, r.RoundHint+1)
	if !known {
		order := r.Order
		if order <= 0 {
			st.Seq++
			order = st.Seq
		} else {
			st.Seq = max(st.Seq, order)
		}
		j.members[id] = r.Member.record()
		st.Ord[id] = order
		if r.Since > 0 && r.Since <= r.RoundHint {
			st.Since[id] = int64(r.Since)
		}
	}
	j.leases[id] = now + ms(p.LeaseTTL)
	if st.Open && st.Round < st.Floor {
		st.Round = st.Floor
	}
	if len(r.Peers) > 0 && r.Incarnation != "" && r.Incarnation != st.Inc {
		// Re-registration after the state was lost: wait for the old peers
		// (a grace lease each) instead of declaring them dead.
		if !st.Open && len(st.Ranked) == 0 {
			j.openNext(&c, nil)
		}
		if st.Open {
			for _, peer := range append([]string{id}, r.Peers...) {
				if contains(st.Arrived, peer) || contains(st.Expected, peer) {
					continue
				}
				if _, ok := j.leases[peer]; !ok {
					j.leases[peer] = now + ms(p.LeaseTTL)
				}
				st.Expected = append(st.Expected, peer)
			}
			st.Reform = true
			c.changed = true
		}
	}
	if r.Arrive {
		if !st.Open {
			// A ranked member that holds this round's World (or a later
			// one: the store went back; or says nothing, HaveRound 0)
			// leaves it: the next round opens, expecting the others. One
			// that holds an earlier round is ranked in a round it never
			// held (re-formed after a loss, its hint missed): it just
			// takes it.
			ranked := contains(st.Ranked, id)
			leaves := r.HaveRound == 0 || r.HaveRound >= st.Round
			if (ranked && leaves) || len(st.Ranked) == 0 {
				j.openNext(&c, nil)
			} else if !ranked && !contains(st.Pending, id) {
				st.Pending = append(st.Pending, id)
				c.changed = true
			}
		}
		if st.Open {
			j.arrive(id)
		}
	}
	j.tryClose(now, p, &c)
	j.save(&c)
	return j.view(id, CodeOK, now, p, 0), c
}

// member runs the common prologue of the calls by a registered member:
// precheck, sweep, fencing check, lease renewal.
// It returns the job's time (see tick), or now when the precheck failed.
func (j *coreJob) member(r MemberRequest, now int64, c *opCtx) (Code, int64, bool) {
	if code, ok := j.precheck(r.Incarnation); !ok {
		return code, now, false
	}
	now = j.tick(now, r.Params)
	j.sweep(now, r.Params, c)
	if _, known := j.members[r.MemberID]; !known {
		return CodeFenced, now, false
	}
	j.leases[r.MemberID] = now + ms(r.Params.LeaseTTL)
	return CodeOK, now, true
}

func (j *coreJob) check(r MemberRequest, now int64) (rawView, opCtx) {
	var c opCtx
	code, now, ok := j.member(r, now, &c)
	if ok {
		j.tryClose(now, r.Params, &c)
	}
	if j.st != nil {
		j.save(&c)
	}
	return j.view(r.MemberID, code, now, r.Params, r.HaveRound), c
}

func (j *coreJob) heartbeat(r MemberRequest, now int64) (Beat, opCtx) {
	if code, ok := j.precheck(r.Incarnation); !ok {
		b := Beat{Code: code}
		if j.st != nil {
			b.Incarnation, b.Version = j.st.Inc, j.st.Ver
		}
		return b, opCtx{}
	}
	var c opCtx
	stamp := now
	last, credit := j.last, j.credit
	now = j.tick(now, r.Params)
	swept := false
	for _, exp := range j.leases {
		if exp <= now {
			j.sweep(now, r.Params, &c)
			j.tryClose(now, r.Params, &c) // the survivors of a lapsed lease re-form at once
			swept = true
			break
		}
	}
	if !swept && j.credit == credit && stamp-last < beatLastStep {
		// A plain heartbeat moves the job's last call in steps of
		// beatLastStep ms, not on every beat (a round of thousands beats
		// thousands of times a second): a later gap then counts up to that
		// much longer, so a silence credit may be that much larger.
		j.last = last
	}
	j.save(&c)
	b := Beat{Code: CodeOK, Incarnation: j.st.Inc, Version: j.st.Ver}
	if _, known := j.members[r.MemberID]; !known {
		b.Code = CodeFenced
		return b, c
	}
	j.leases[r.MemberID] = now + ms(r.Params.LeaseTTL)
	b.StoreTime = stamp // the store's clock, not the job's: the Agent maps it to its own
	b.Leases = len(j.leases)
	b.Round, b.Open = j.st.Round, j.st.Open
	return b, c
}

func (j *coreJob) report(r ReportRequest, now int64) (rawView, opCtx) {
	var c opCtx
	code, now, ok := j.member(r.MemberRequest, now, &c)
	if ok {
		st := j.st
		switch {
		case !st.Open && st.Round == r.Round && contains(st.Ranked, r.Target):
			j.evict(r.Target, &c)
		case st.Open && st.Prev == r.Round && contains(st.Expected, r.Target):
			j.evict(r.Target, &c)
		}
		j.settle(now, r.Params, &c, true)
		j.tryClose(now, r.Params, &c)
	}
	if j.st != nil {
		j.save(&c)
	}
	return j.view(r.MemberID, code, now, r.Params, r.HaveRound), c
}

func (j *coreJob) leave(r MemberRequest, now int64) (rawView, opCtx) {
	var c opCtx
	code, now, ok := j.member(r, now, &c)
	st := j.st
	if ok && r.KeepRanked && !st.Open && st.Round > r.HaveRound && contains(st.Ranked, r.MemberID) {
		// Ranked in a closed round it has not held (MemberRequest.
		// KeepRanked): it stays, to join that round and leave it at a
		// step boundary.
		ok = false
	}
	if ok {
		j.evict(r.MemberID, &c)
		// A leave does not re-form at once: members leave in waves (a
		// scale-down, preemptions, the end of a job), and each leave closing
		// a round of n would cost O(n) and a round change per member; the
		// survivors arrive again instead, and the wave's later leaves only
		// leave the forming round.
		j.settle(now, r.Params, &c, false)
		j.tryClose(now, r.Params, &c)
	}
	if j.st != nil {
		j.save(&c)
	}
	return j.view(r.MemberID, code, now, r.Params, r.HaveRound), c
}

func (j *coreJob) finish(r MemberRequest, now int64) (rawView, opCtx) {
	var c opCtx
	code, now, ok := j.member(r, now, &c)
	if ok {
		j.st.Fin = true
		c.changed = true
	}
	if j.st != nil {
		j.save(&c)
	}
	return j.view(r.MemberID, code, now, r.Params, r.HaveRound), c
}

// toView parses the member records of a raw view.
func (v rawView) toView() (View, error) {
	out := v.View
	if v.Role != RoleRanked || (v.omitted && len(v.records) == 0 && v.Rank >= 0 && v.Rank < v.Size) {
		return out, nil
	}
	if len(v.records) != v.Size || v.Rank < 0 || v.Rank >= v.Size {
		return View{}, fmt.Errorf("%w: %d records for size %d, rank %d", ErrBadState, len(v.records), v.Size, v.Rank)
	}
	ms, err := parseRoster(strings.Join(v.records, "\n"))
	if err != nil {
		return View{}, err
	}
	out.Members = ms
	return out, nil
}

func msDuration(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
