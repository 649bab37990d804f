package elastic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// errRosterGone: the roster key no longer holds the round a view ranked the
// caller in (the next round opened between the script and the GET).
var errRosterGone = errors.New("elastic: the round's roster was replaced before it was read")

// rosterEntry is one round's roster being read or read, shared by every
// caller of this process that needs it (single flight).
type rosterEntry struct {
	done    chan struct{} // closed when members/err are set
	members []Member
	err     error
}

// rosterFetches holds the rosters read in this process, by job, incarnation
// and round. Every member of a round needs the same roster: members that are
// goroutines of one process (tests, the rendezvous bench, single-host jobs)
// read it from Redis and parse it once instead of once each, which at
// thousands of members is the difference between O(n) and O(n^2) bytes
// through this process. A roster is immutable for its (incarnation, round);
// entries are still checked against the caller's view (size, own ID at its
// rank) before use, and a few of the latest are kept.
var rosterFetches struct {
	mu    sync.Mutex
	m     map[string]*rosterEntry
	order []string
}

const rosterFetchesKept = 8

// roster returns the members of the closed round (inc, round) of jobID in
// rank order, read from the roster key with one GET per process and round.
// self and rank, when rank >= 0, are checked against the roster (a mismatch
// reads it again); size likewise when > 0. The slice is shared: callers must
// not modify it.
func (s *RedisStore) roster(ctx context.Context, jobID, inc string, round uint64, size int, rank int, self string) ([]Member, error) {
	key := jobID + "\x00" + inc + "\x00" + strconv.FormatUint(round, 10)
	fits := func(ms []Member) bool {
		return (size <= 0 || len(ms) == size) && (rank < 0 || (rank < len(ms) && ms[rank].ID == self))
	}
	for attempt := 0; ; attempt++ {
		rosterFetches.mu.Lock()
		if rosterFetches.m == nil {
			rosterFetches.m = map[string]*rosterEntry{}
		}
		e, ok := rosterFetches.m[key]
		if !ok {
			e = &rosterEntry{done: make(chan struct{})}
			rosterFetches.m[key] = e
			rosterFetches.order = append(rosterFetches.order, key)
			if len(rosterFetches.order) > rosterFetchesKept {
				delete(rosterFetches.m, rosterFetches.order[0])
				rosterFetches.order = rosterFetches.order[1:]
			}
		}
		rosterFetches.mu.Unlock()
		if !ok {
			e.members, e.err = s.readRoster(ctx, jobID, inc, round)
			close(e.done)
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err == nil && fits(e.members) {
			return e.members, nil
		}
		// A failed read, or an entry that does not fit the caller's view:
		// forget it, and read once more ourselves.
		rosterFetches.mu.Lock()
		if rosterFetches.m[key] == e {
			delete(rosterFetches.m, key)
		}
		rosterFetches.mu.Unlock()
		if attempt > 0 || (e.err != nil && !ok) {
			if e.err != nil {
				return nil, e.err
			}
			return nil, fmt.Errorf("%w: roster of round %d has %d members, view says %d (rank %d)", ErrBadState, round, len(e.members), size, rank)
		}
	}
}

// readRoster GETs the roster key and parses it; errRosterGone if it holds
// another round (or none).
func (s *RedisStore) readRoster(ctx context.Context, jobID, inc string, round uint64) ([]Member, error) {
	raw, err := s.c.Get(ctx, jobKeys(jobID)[11]).Result()
	if errors.Is(err, redis.Nil) {
		return nil, errRosterGone
	}
	if err != nil {
		return nil, err
	}
	head, body, ok := strings.Cut(raw, "\n")
	if !ok || head != inc+" "+strconv.FormatUint(round, 10) {
		return nil, errRosterGone
	}
	return parseRoster(body)
}
