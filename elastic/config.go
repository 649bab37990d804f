package elastic

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// Default values of Config (see DefaultConfig).
const (
	DefaultMinWorkers        = 1
	DefaultMaxWorkers        = 1024
	DefaultLastCall          = 500 * time.Millisecond
	DefaultJoinTimeout       = 10 * time.Minute
	DefaultLeaseTTL          = 3 * time.Second
	DefaultHeartbeatInterval = 500 * time.Millisecond
	DefaultPollInterval      = 200 * time.Millisecond
	DefaultOutageBudget      = 30 * time.Second
	DefaultProgressTimeout   = 15 * time.Second
	DefaultPhaseTimeout      = 10 * time.Minute
	DefaultStateTTL          = time.Hour
	// DefaultMaxHeartbeatRate is Config.MaxHeartbeatRate's default, in
	// heartbeats per second across the job: about 16 % of one Redis core
	// at the 40 us a heartbeat costs there (examples/rendezvous-bench).
	DefaultMaxHeartbeatRate = 4096
	// MaxJobIDLen is the longest accepted job ID, in bytes
	// (store.MaxJobIDLen).
	MaxJobIDLen = store.MaxJobIDLen
)

// Config holds the rendezvous settings of one job. All members of a job must
// use the same values for MinWorkers, MaxWorkers, LastCall, LeaseTTL and
// StateTTL: the store applies the values sent with each call.
type Config struct {
	// JobID names the job; every store key of the job carries it inside one
	// Redis hash tag. 1..128 bytes, printable ASCII without '{', '}' or
	// spaces. Required (no default).
	JobID string

	// MinWorkers is the smallest world size a round may close with.
	// Default 1.
	MinWorkers int

	// MaxWorkers is the largest world size; a forming round closes at once
	// when it reaches it, and later arrivals wait as pending. Default 1024.
	MaxWorkers int

	// LastCall is how long a forming round stays open after MinWorkers
	// members arrived, so workers that start a moment apart land in one
	// round. 0 closes the round at the arrival that reaches MinWorkers.
	// Rounds re-formed from a running round (survivors known) do not wait:
	// they close as soon as every survivor is back. Default 500 ms.
	LastCall time.Duration

	// JoinTimeout bounds one Join call. Default 10 min.
	JoinTimeout time.Duration

	// LeaseTTL is how long a member stays alive in the store without a
	// heartbeat; a member whose lease lapsed is evicted and a new round
	// opened. It bounds the detection time of a silent death. Default 3 s.
	LeaseTTL time.Duration

	// HeartbeatInterval is how often the Agent's background goroutine renews
	// the lease and polls the job's version (the fallback when a Pub/Sub
	// message is lost). Must be below LeaseTTL/2. Default 500 ms.
	HeartbeatInterval time.Duration

	// PollInterval is how often a waiting Join re-reads the store when no
	// Pub/Sub message arrives. Default 200 ms.
	PollInterval time.Duration

	// OutageBudget is how long the Agent retries (with backoff) while the
	// store is unreachable before returning ErrStoreUnavailable: counted
	// from the start of the oldest store call left unanswered (or failed)
	// since the store last answered, and judged on a timer of its own, so
	// the Agent gives up within OutageBudget + 1 s (a timer's delay, at
	// most; milliseconds on an idle machine)
	// whatever its calls' deadlines; every call in flight then returns
	// ErrStoreUnavailable. Default 30 s.
	OutageBudget time.Duration

	// StateTTL is the time to live of every store key of the job, renewed by
	// every heartbeat: after the last member stops, the job's keys vanish
	// after StateTTL, and a finished job answers ErrJobFinished for that long.
	// Must be at least LeaseTTL. Default 1 h.
	StateTTL time.Duration

	// MaxHeartbeatRate bounds the heartbeats a second that the members of
	// the job send the store together: an Agent whose round has n members
	// (or that waits in a forming round with n arrived, or whose last
	// renewal counted n leases in the job) renews every
	// max(HeartbeatInterval, n / MaxHeartbeatRate seconds), but at least
	// three times a lease (LeaseTTL/3), which wins over the rate when both
	// cannot hold. Up to 2048 members the default interval
	// stands; a round of 4096 renews every second. The lease, and so the
	// detection time of a silent death, does not change. 0 means
	// DefaultMaxHeartbeatRate (4096 a second); negative: no bound (every
	// HeartbeatInterval whatever the job's size). A limit in the manner of
	// Nomad's max_heartbeats_per_second, which spaces its clients'
	// heartbeats as the cluster grows. The members waiting in a forming
	// round spread their re-reads after a change over the same n / rate.
	MaxHeartbeatRate int

	// ProgressTimeout is how long the worker's loop may go without progress
	// (Agent.Progress) while no phase is marked (Agent.Busy) before the
	// Agent counts it as hung: it leaves the job at once, so the others
	// re-form without it, and fails with ErrFenced wrapping ErrNoProgress,
	// which the worker's loop meets when it wakes. The watch starts with the
	// first Progress or Busy call (an Agent whose user never calls them is
	// never judged by progress) and rests while Join runs; it is checked at
	// every heartbeat, so it acts within ProgressTimeout + HeartbeatInterval.
	// 0 turns it off. Default 15 s.
	ProgressTimeout time.Duration

	// PhaseTimeout bounds one phase marked with Agent.Busy (a data fetch,
	// a checkpoint write, an evaluation): a phase still open after it is
	// a hang like a loop without progress (the fetch from a data source
	// that never answers), and the Agent leaves the job for the worker
	// the same way, failing with ErrFenced wrapping ErrNoProgress and
	// naming the phase. Checked at every heartbeat, so it acts within
	// PhaseTimeout + HeartbeatInterval of the phase's start; the round's
	// peers, which wait for a marked phase (sync.Config.BusyTimeout), see
	// the member gone then and re-form without it. Phases marked with
	// Agent.Waiting (waiting for peers, which their own timeouts bound)
	// are not judged by it, nor is a worker inside Join. Raise it above
	// the longest phase a worker may legitimately take. 0 turns it off
	// (a marked phase is never judged); negative is invalid. Default 10
	// min.
	PhaseTimeout time.Duration

	// Logger receives debug and warning records, each with the attribute
	// member (this Agent's member ID). The job ID is not added: a logger
	// that serves more than one job should carry it (Logger.With("job",
	// id)), once. Default: discard.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults listed on each Config field, with an
// empty JobID that the caller must set.
func DefaultConfig() Config {
	return Config{
		MinWorkers:        DefaultMinWorkers,
		MaxWorkers:        DefaultMaxWorkers,
		LastCall:          DefaultLastCall,
		JoinTimeout:       DefaultJoinTimeout,
		LeaseTTL:          DefaultLeaseTTL,
		HeartbeatInterval: DefaultHeartbeatInterval,
		PollInterval:      DefaultPollInterval,
		OutageBudget:      DefaultOutageBudget,
		StateTTL:          DefaultStateTTL,
		ProgressTimeout:   DefaultProgressTimeout,
		PhaseTimeout:      DefaultPhaseTimeout,
	}
}

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("elastic: invalid config")

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if err := ValidateJobID(c.JobID); err != nil {
		return bad("%v", err)
	}
	switch {
	case c.MinWorkers < 1:
		return bad("MinWorkers %d < 1", c.MinWorkers)
	case c.MaxWorkers < c.MinWorkers:
		return bad("MaxWorkers %d < MinWorkers %d", c.MaxWorkers, c.MinWorkers)
	case c.LastCall < 0:
		return bad("LastCall %v < 0", c.LastCall)
	case c.JoinTimeout <= 0:
		return bad("JoinTimeout %v <= 0", c.JoinTimeout)
	case c.LeaseTTL < 10*time.Millisecond:
		return bad("LeaseTTL %v < 10ms", c.LeaseTTL)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval*2 > c.LeaseTTL:
		return bad("HeartbeatInterval %v must be > 0 and <= LeaseTTL/2 (%v)", c.HeartbeatInterval, c.LeaseTTL/2)
	case c.PollInterval <= 0:
		return bad("PollInterval %v <= 0", c.PollInterval)
	case c.OutageBudget <= 0:
		return bad("OutageBudget %v <= 0", c.OutageBudget)
	case c.StateTTL < c.LeaseTTL:
		return bad("StateTTL %v < LeaseTTL %v", c.StateTTL, c.LeaseTTL)
	case c.ProgressTimeout < 0:
		return bad("ProgressTimeout %v < 0", c.ProgressTimeout)
	case c.PhaseTimeout < 0:
		return bad("PhaseTimeout %v < 0", c.PhaseTimeout)
	}
	return nil
}

// ValidateJobID checks a job ID: 1..MaxJobIDLen bytes of printable ASCII
// without '{', '}' (they would break the Redis hash tag) or spaces. It is
// store.ValidateJobID.
func ValidateJobID(id string) error { return store.ValidateJobID(id) }

// HeartbeatEvery is the interval, in time, at which an Agent with this
// Config renews its lease in a job of n members (the round it holds, the
// closed round it saw, or the members arrived in a forming round):
// max(HeartbeatInterval, min(n / MaxHeartbeatRate seconds, LeaseTTL/3)),
// or HeartbeatInterval when MaxHeartbeatRate is negative (0 means
// DefaultMaxHeartbeatRate). A link whose round trip needs more heartbeats
// in flight than an Agent keeps spaces them further, over the round trip.
func (c Config) HeartbeatEvery(n int) time.Duration {
	return max(c.HeartbeatInterval, c.rateSpread(n))
}

// rateSpread is the time over which n calls, one per member, keep to
// MaxHeartbeatRate: n / rate seconds, at most LeaseTTL/3; 0 without a
// bound (a negative rate).
func (c Config) rateSpread(n int) time.Duration {
	return min(c.perMember(n), c.LeaseTTL/3)
}

// perMember is n / MaxHeartbeatRate seconds: the interval at which n
// members, each calling once an interval, call the store
// MaxHeartbeatRate times a second together; 0 without a bound (a negative
// rate).
func (c Config) perMember(n int) time.Duration {
	rate := c.MaxHeartbeatRate
	if rate == 0 {
		rate = DefaultMaxHeartbeatRate
	}
	if rate < 0 {
		return 0
	}
	return time.Duration(float64(time.Second) * float64(max(n, 0)) / float64(rate))
}

// params returns the part of the config the store applies.
func (c Config) params() store.Params {
	return store.Params{
		MinWorkers: c.MinWorkers,
		MaxWorkers: c.MaxWorkers,
		LastCall:   c.LastCall,
		LeaseTTL:   c.LeaseTTL,
		StateTTL:   c.StateTTL,
	}
}
