package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A launcher mark says which launcher runs a job ID on this Redis, so that
// a second launcher of the same job ID with another job secret (whose
// workers would be strangers to the running job) can refuse to start. It is
// one key beside the rendezvous' keys of the job, "et:{<jobID>}:launcher"
// (the same hash slot, a name the rendezvous does not use), holding
// "<owner> <note>" with a TTL: the owner is MarkOwner of the job secret,
// the note tells a human which launcher holds it (package launch writes its
// pid and host). Launchers of one secret share the mark.

// markKey is the Redis key of a job's launcher mark.
func markKey(jobID string) string { return KeyPrefix + "{" + jobID + "}:launcher" }

// MarkOwner returns the owner a launcher of the job secret marks its job
// with: 16 hex digits of a SHA-256 of the secret, which do not reveal it.
func MarkOwner(secret []byte) string {
	h := sha256.Sum256(append([]byte("elastictrain launcher mark\x00"), secret...))
	return hex.EncodeToString(h[:8])
}

// scriptMark sets the mark (KEYS[1] = ARGV[1], which starts with the
// owner ARGV[2], for ARGV[3] ms) unless it holds another owner's mark,
// which it returns.
var scriptMark = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[2]) ~= ARGV[2] then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return false
`)

// scriptUnmark deletes the mark when it is still the caller's.
var scriptUnmark = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return false
`)

// Mark claims the launcher mark of jobID for owner (MarkOwner), or
// renews it, for ttl (at least 1 ms): the mark then holds "<owner> <note>"
// (owner and note without newlines; note may hold spaces). When another
// owner's mark holds the job ID, Mark leaves it and returns it ("<owner>
// <note>" as that launcher wrote it); else it returns "". One atomic
// script. Errors: an invalid job ID, or the Redis call's, as an *Error
// (Op "mark").
func (s *Redis) Mark(ctx context.Context, jobID, owner, note string, ttl time.Duration) (other string, err error) {
	if err := ValidateJobID(jobID); err != nil {
		return "", &Error{Op: "mark", JobID: jobID, Err: err}
	}
	v, err := scriptMark.Run(ctx, s.c, []string{markKey(jobID)}, owner+" "+note, owner, max(1, ttl.Milliseconds())).Text()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", &Error{Op: "mark", JobID: jobID, Err: err}
	}
	return v, nil
}

// Unmark deletes the launcher mark of jobID when it is still the one Mark
// set for owner and note (a mark another launcher took over after this
// one's expired is left alone). Errors: an invalid job ID, or the Redis
// call's, as an *Error (Op "unmark").
func (s *Redis) Unmark(ctx context.Context, jobID, owner, note string) error {
	if err := ValidateJobID(jobID); err != nil {
		return &Error{Op: "unmark", JobID: jobID, Err: err}
	}
	err := scriptUnmark.Run(ctx, s.c, []string{markKey(jobID)}, owner+" "+note).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return &Error{Op: "unmark", JobID: jobID, Err: err}
	}
	return nil
}
