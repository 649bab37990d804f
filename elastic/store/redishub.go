package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A process that runs many Agents of one job over one go-redis client (a
// host with a worker per accelerator, tests, the rendezvous bench) holds one
// Pub/Sub subscription for the job, not one per Agent: a hub. Each message
// is decoded once, and a closed round's roster that is too large for the
// message is read from Redis once per process and round (rosterFetch), then
// handed to every Agent's Watcher. With n Agents in one process that turns
// O(n) subscriptions, O(n) roster reads and O(n^2) record parses per round
// into one of each; a process with one Agent costs what it did.

// hubKey names a hub: one client, one job.
type hubKey struct {
	c     redis.UniversalClient
	jobID string
}

// hub is one Pub/Sub subscription of a job shared by the Watchers of this
// process that use the same client.
type hub struct {
	key    hubKey
	ready  chan struct{} // closed once the subscription is confirmed or failed
	err    error         // set before ready closes
	ps     *redis.PubSub
	ctx    context.Context // cancelled when the last Watcher leaves: ends a roster read in flight
	cancel context.CancelFunc
	done   chan struct{} // closed when forward returns

	mu   sync.Mutex // guards subs (and refs in hubs.m)
	subs map[*redisWatcher]struct{}
}

var hubs struct {
	mu sync.Mutex
	m  map[hubKey]*hub
}

// watchRosterTimeout bounds a hub's roster read; a hint whose roster could not be
// read is delivered as a plain version hint (Agents then read their view).
const watchRosterTimeout = 2 * time.Second

// watch returns a Watcher on the shared hub of (client, job), subscribing
// first if this process has none yet.
func (s *Redis) watch(ctx context.Context, jobID string) (Watcher, error) {
	key := hubKey{c: s.c, jobID: jobID}
	for {
		hubs.mu.Lock()
		if hubs.m == nil {
			hubs.m = map[hubKey]*hub{}
		}
		h := hubs.m[key]
		creator := h == nil
		if creator {
			hctx, cancel := context.WithCancel(context.Background())
			h = &hub{key: key, ready: make(chan struct{}), ctx: hctx, cancel: cancel,
				done: make(chan struct{}), subs: map[*redisWatcher]struct{}{}}
			hubs.m[key] = h
		}
		w := &redisWatcher{h: h, c: make(chan Hint, 1)}
		h.mu.Lock()
		h.subs[w] = struct{}{} // counted now, so the hub is not torn down under us
		h.mu.Unlock()
		hubs.mu.Unlock()

		if creator {
			h.err = h.subscribe(ctx, s)
			if h.err != nil {
				// Later Watches subscribe afresh; the ones waiting on this
				// hub try again themselves.
				hubs.mu.Lock()
				if hubs.m[key] == h {
					delete(hubs.m, key)
				}
				hubs.mu.Unlock()
			}
			close(h.ready)
		}
		select {
		case <-h.ready:
		case <-ctx.Done():
			_ = w.Close()
			return nil, &Error{Op: "watch", JobID: jobID, Err: ctx.Err()}
		}
		if h.err == nil {
			return w, nil
		}
		_ = w.Close()
		if creator {
			return nil, &Error{Op: "watch", JobID: jobID, Err: h.err}
		}
		// Another Watch's subscription failed (its context, say): try our own.
	}
}

// subscribe opens the hub's subscription and starts its forwarder.
func (h *hub) subscribe(ctx context.Context, s *Redis) error {
	ps := s.c.Subscribe(ctx, jobChannel(h.key.jobID))
	// Wait for the subscription to be confirmed, so no change published after
	// Watch returns is missed (unless the connection drops).
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		close(h.done)
		return err
	}
	h.ps = ps
	go h.forward(s, ps.Channel())
	return nil
}

// forward decodes each message once and offers the hint to every Watcher.
// It returns when the subscription is closed (the last Watcher left).
func (h *hub) forward(s *Redis, msgs <-chan *redis.Message) {
	defer close(h.done)
	for m := range msgs {
		hint := parseHint(m.Payload)
		if hint.Round > 0 {
			ctx, cancel := context.WithTimeout(h.ctx, watchRosterTimeout)
			hint = s.checkHint(ctx, h.key.jobID, m.Payload, hint)
			cancel()
		}
		h.mu.Lock()
		for w := range h.subs {
			offer(w.c, hint)
		}
		h.mu.Unlock()
	}
}

// leave drops w; the last Watcher out closes the subscription and waits for
// the forwarder.
func (h *hub) leave(w *redisWatcher) error {
	hubs.mu.Lock()
	h.mu.Lock()
	delete(h.subs, w)
	last := len(h.subs) == 0
	h.mu.Unlock()
	if last && hubs.m[h.key] == h {
		delete(hubs.m, h.key)
	}
	hubs.mu.Unlock()
	if !last {
		return nil
	}
	<-h.ready
	h.cancel()
	var err error
	if h.ps != nil {
		err = h.ps.Close()
	}
	<-h.done
	return err
}

type redisWatcher struct {
	h    *hub
	c    chan Hint
	once sync.Once
}

func (w *redisWatcher) C() <-chan Hint { return w.c }

// Close stops delivery; the last Watcher of the hub closes the subscription
// and waits for its goroutine.
func (w *redisWatcher) Close() error {
	var err error
	w.once.Do(func() { err = w.h.leave(w) })
	return err
}

// rosterEntry is one round's roster being read or read, shared by every
// hub of this process that needs it (single flight).
type rosterEntry struct {
	done    chan struct{} // closed when members and err are set
	members []Member
	err     error
}

// rosterFetch holds the rosters read by this process, by job, incarnation
// and round (a roster never changes for those three; incarnations are
// random). A few of the latest are kept.
var rosterFetch struct {
	mu    sync.Mutex
	m     map[string]*rosterEntry
	order []string
}

const rosterFetchKept = 8

// rosterOf returns the members, in rank order, of the closed round (inc,
// round) of jobID: read with one script call per process and round, shared
// by every caller. The slice is shared: callers must not modify it.
// Errors: errRosterGone if the store holds another round or incarnation now
// (the hint is stale), a ctx or store error.
func (s *Redis) rosterOf(ctx context.Context, jobID, inc string, round uint64) ([]Member, error) {
	key := rosterKey(jobID, inc, round)
	rosterFetch.mu.Lock()
	e, ok := rosterFetch.m[key]
	if !ok {
		e = &rosterEntry{done: make(chan struct{})}
		addRosterLocked(key, e)
	}
	rosterFetch.mu.Unlock()
	if !ok {
		e.members, e.err = s.readRoster(ctx, jobID, inc, round)
		close(e.done)
		if e.err != nil {
			// Not kept: the next caller reads again (the error may be ours,
			// a cancelled context).
			rosterFetch.mu.Lock()
			if rosterFetch.m[key] == e {
				dropRosterLocked(key)
			}
			rosterFetch.mu.Unlock()
		}
	}
	select {
	case <-e.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return e.members, e.err
}

func rosterKey(jobID, inc string, round uint64) string {
	return jobID + "\x00" + inc + "\x00" + strconv.FormatUint(round, 10)
}

// forgetRoster drops the cached roster of (jobID, inc, round).
func forgetRoster(jobID, inc string, round uint64) {
	key := rosterKey(jobID, inc, round)
	rosterFetch.mu.Lock()
	defer rosterFetch.mu.Unlock()
	if e, ok := rosterFetch.m[key]; ok {
		select {
		case <-e.done:
			dropRosterLocked(key)
		default: // a read in flight: it is fresh
		}
	}
}

// dropRosterLocked removes key from the cache; rosterFetch.mu held.
func dropRosterLocked(key string) {
	delete(rosterFetch.m, key)
	if i := slices.Index(rosterFetch.order, key); i >= 0 {
		rosterFetch.order = slices.Delete(rosterFetch.order, i, i+1)
	}
}

// addRosterLocked adds e under key, dropping the oldest entries beyond
// rosterFetchKept; rosterFetch.mu held.
func addRosterLocked(key string, e *rosterEntry) {
	if rosterFetch.m == nil {
		rosterFetch.m = map[string]*rosterEntry{}
	}
	rosterFetch.m[key] = e
	rosterFetch.order = append(rosterFetch.order, key)
	for len(rosterFetch.order) > rosterFetchKept {
		delete(rosterFetch.m, rosterFetch.order[0])
		rosterFetch.order = rosterFetch.order[1:]
	}
}

// cachedRosterRound returns the latest round of (jobID, inc) whose roster
// this process holds, 0 if none.
func cachedRosterRound(jobID, inc string) uint64 {
	prefix := jobID + "\x00" + inc + "\x00"
	rosterFetch.mu.Lock()
	defer rosterFetch.mu.Unlock()
	var best uint64
	for _, key := range rosterFetch.order {
		rest, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		e, ok := rosterFetch.m[key]
		if !ok {
			continue
		}
		select {
		case <-e.done:
		default:
			continue // still being read
		}
		if e.err != nil {
			continue
		}
		if r, err := strconv.ParseUint(rest, 10, 64); err == nil && r > best {
			best = r
		}
	}
	return best
}

// keepRoster records a roster a view brought (the script included it), so
// the process' other members need not read it.
func keepRoster(jobID, inc string, round uint64, ms []Member) {
	if inc == "" || round == 0 || len(ms) == 0 {
		return
	}
	key := rosterKey(jobID, inc, round)
	rosterFetch.mu.Lock()
	defer rosterFetch.mu.Unlock()
	if _, ok := rosterFetch.m[key]; ok {
		return
	}
	e := &rosterEntry{done: make(chan struct{}), members: ms}
	close(e.done)
	addRosterLocked(key, e)
}

// errRosterGone: the store no longer holds the round a hint announced.
var errRosterGone = errors.New("elastic: the round's roster was replaced before it was read")

// readRoster reads the closed round's roster with luaRoster: it answers the
// incarnation, the closed round's number and the roster in one atomic step,
// so the records are those of the round the hint named or none.
func (s *Redis) readRoster(ctx context.Context, jobID, inc string, round uint64) ([]Member, error) {
	keys := jobKeys(jobID)
	res, err := scriptRoster.Run(ctx, s.c, []string{keys[0], keys[11]}).Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != 3 {
		return nil, errRosterGone
	}
	gotInc, e1 := replyString(res[0])
	gotRound, e2 := replyInt(res[1])
	roster, e3 := replyString(res[2])
	if errors.Join(e1, e2, e3) != nil || gotInc != inc || gotRound != int64(round) || roster == "" {
		return nil, errRosterGone
	}
	ms, err := parseRoster(roster)
	if err != nil {
		return nil, err
	}
	return ms, nil
}

// parseHint decodes a change message (see scripts.go): "<ver>";
// "<ver>\n<round>\n<inc>\n<roster>" for a closed round with its records;
// "<ver>\n<round>\n<inc>" for a closed round whose roster is read
// separately (Members left nil for the hub to fill); "<ver>\n<round>\n<inc>\nopen"
// for a round opened after a closed one. A malformed message still counts
// as a hint, with nothing known but that something changed.
func parseHint(payload string) Hint {
	lines := strings.SplitN(payload, "\n", 4)
	ver, err := strconv.ParseUint(lines[0], 10, 64)
	if err != nil {
		return Hint{}
	}
	h := Hint{Version: ver}
	if len(lines) < 3 {
		return h
	}
	round, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || round == 0 || lines[2] == "" {
		return h
	}
	switch {
	case len(lines) == 3:
	case lines[3] == "open":
		h.Open = true
	default:
		members, err := parseRoster(lines[3])
		if err != nil {
			return h
		}
		h.Members = members
	}
	h.Round, h.Incarnation = round, lines[2]
	return h
}

// checkHint returns the hint h (parsed from payload, naming a round) as far
// as the store confirms it, with one HMGET of the job's meta hash: the
// store's incarnation must be h's and its version at least h's; an open
// round must have been opened (the store's round at least h's); a closed
// round's roster carried in the message must hash to the digest its close
// recorded (rdig, see scripts.go), and one left out is read from the store
// (rosterOf). Anything the store does not confirm, a forged PUBLISH on the
// job's channel or a hint the store has moved past, is delivered as a plain
// version hint: members read the store. Redis Pub/Sub is open to any client
// allowed to PUBLISH there, so a World is never taken from a message alone.
func (s *Redis) checkHint(ctx context.Context, jobID, payload string, h Hint) Hint {
	plain := Hint{Version: h.Version}
	res, err := s.c.HMGet(ctx, jobKeys(jobID)[1], "inc", "ver", "round", "rdig").Result()
	if err != nil || len(res) != 4 {
		return plain
	}
	str := func(v any) string { x, _ := v.(string); return x }
	inc, rdig := str(res[0]), str(res[3])
	ver, e1 := strconv.ParseUint(str(res[1]), 10, 64)
	round, e2 := strconv.ParseUint(str(res[2]), 10, 64)
	if e1 != nil || e2 != nil || inc != h.Incarnation || ver < h.Version || round < h.Round {
		return plain
	}
	switch {
	case h.Open:
		return h
	case h.Members != nil:
		// The digest covers what follows the version line: round,
		// incarnation and roster, as the close published them.
		_, tail, _ := strings.Cut(payload, "\n")
		sum := sha1.Sum([]byte(tail))
		if rdig == "" || hex.EncodeToString(sum[:]) != rdig {
			return plain
		}
		return h
	}
	// A closed round whose roster did not fit the message.
	ms, err := s.rosterOf(ctx, jobID, h.Incarnation, h.Round)
	if err != nil {
		return plain
	}
	h.Members = ms
	return h
}
