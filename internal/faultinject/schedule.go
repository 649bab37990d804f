package faultinject

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind uint8

// Fault kinds. Process faults hit one worker (chosen by Fault.Target among
// the live workers, ranked ones first); Redis faults hit the server or one
// worker's link to it (Config.ProxyRedis); peer faults hit one worker's
// inbound collective link (Config.ProxyPeers).
const (
	// Kill sends SIGKILL to a worker (a crash).
	Kill Kind = iota + 1
	// Hang sends SIGSTOP, then SIGCONT after Duration (a hung process, a
	// long GC pause, a frozen VM).
	Hang
	// Term sends SIGTERM (preemption): the worker commits, checkpoints and
	// leaves gracefully.
	Term
	// Join starts a new worker.
	Join
	// Crash kills every worker at once and starts as many new ones, which
	// resume from the last durable checkpoint (a whole-job restart).
	Crash
	// RedisRestart restarts Redis empty (every key lost).
	RedisRestart
	// RedisOutage stops Redis for Duration, then starts it empty.
	RedisOutage
	// RedisLatency adds Latency to every chunk on one worker's Redis link
	// for Duration.
	RedisLatency
	// RedisBlackhole holds every byte on one worker's Redis link for
	// Duration (a partition from Redis).
	RedisBlackhole
	// RedisCut resets one worker's Redis connections and refuses new ones
	// for Duration.
	RedisCut
	// PeerLatency adds Latency to every chunk on the connections into one
	// worker's collective port for Duration.
	PeerLatency
	// PeerBandwidth limits the connections into one worker's collective
	// port to Bandwidth bytes per second for Duration.
	PeerBandwidth
	// PeerBlackhole holds every byte on the connections into one worker's
	// collective port for Duration (a partition between ranks).
	PeerBlackhole
	// PeerCut resets the connections into one worker's collective port and
	// refuses new ones for Duration.
	PeerCut
	// JoinKill starts a new worker and SIGKILLs it Duration later (0 to
	// about 0.6 s): while it registers, waits as pending, or holds a rank
	// of a round its peers are still connecting or sending state in.
	JoinKill
	// HostCut takes down the link of one worker's host (Config.Hosts, a
	// network namespace) for Duration, then restores it: every worker on
	// that host is cut off from Redis and its peers, in silence (no reset
	// reaches anyone), as when a machine's cable is pulled.
	HostCut
	numKinds
)

var kindNames = [...]string{
	Kill: "kill", Hang: "hang", Term: "term", Join: "join", Crash: "crash",
	RedisRestart: "redis-restart", RedisOutage: "redis-outage", RedisLatency: "redis-latency",
	RedisBlackhole: "redis-blackhole", RedisCut: "redis-cut",
	PeerLatency: "peer-latency", PeerBandwidth: "peer-bandwidth", PeerBlackhole: "peer-blackhole", PeerCut: "peer-cut",
	JoinKill: "join-kill", HostCut: "host-cut",
}

// String returns the kind's name ("kill", "redis-outage", ...).
func (k Kind) String() string {
	if k > 0 && k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// AllKinds returns every fault kind, in order.
func AllKinds() []Kind {
	out := make([]Kind, 0, numKinds-1)
	for k := Kill; k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// ParseKinds parses a comma-separated list of kind names ("all" = every kind).
func ParseKinds(s string) ([]Kind, error) {
	if s == "" || s == "all" {
		return AllKinds(), nil
	}
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		found := false
		for k := Kill; k < numKinds; k++ {
			if k.String() == strings.TrimSpace(name) {
				out, found = append(out, k), true
			}
		}
		if !found {
			return nil, fmt.Errorf("faultinject: unknown fault kind %q", name)
		}
	}
	return out, nil
}

// needsRedis reports whether k needs Config.Redis; needsRedisProxy and
// needsPeerProxy whether it needs the proxies.
func (k Kind) needsRedis() bool      { return k == RedisRestart || k == RedisOutage }
func (k Kind) needsRedisProxy() bool { return k >= RedisLatency && k <= RedisCut }
func (k Kind) needsPeerProxy() bool  { return k >= PeerLatency && k <= PeerCut }
func (k Kind) needsHosts() bool      { return k == HostCut }

// destructive reports whether k removes a worker for good.
func (k Kind) destructive() bool { return k == Kill || k == Term }

// Fault is one entry of a schedule.
type Fault struct {
	Kind Kind
	// After is how many global steps the job must make after the previous
	// fault healed before this one is injected.
	After int64
	// Target picks the worker among the eligible ones (modulo their count).
	Target int
	// Duration of a hang, outage, link fault or refusal.
	Duration time.Duration
	// Latency of a latency fault.
	Latency time.Duration
	// Bandwidth of a bandwidth fault, in bytes per second.
	Bandwidth int64
}

// String describes the fault in one line.
func (f Fault) String() string {
	s := fmt.Sprintf("%s after %d steps, target %d", f.Kind, f.After, f.Target)
	if f.Duration > 0 {
		s += fmt.Sprintf(", for %v", f.Duration)
	}
	if f.Latency > 0 {
		s += fmt.Sprintf(", latency %v", f.Latency)
	}
	if f.Bandwidth > 0 {
		s += fmt.Sprintf(", %d B/s", f.Bandwidth)
	}
	return s
}

// ScheduleConfig shapes a random schedule.
type ScheduleConfig struct {
	// Faults is the number of faults. Required (> 0).
	Faults int
	// Kinds are the kinds drawn from, uniformly. Default AllKinds().
	Kinds []Kind
	// Workers is the number of workers at the start; MinLive and MaxLive
	// bound the live workers the schedule keeps (a kill or term with
	// MinLive workers left becomes a join; a join with MaxLive becomes
	// another kind). Defaults 3, 3, 5.
	Workers, MinLive, MaxLive int
	// MinAfter and MaxAfter bound Fault.After, in steps. Defaults 3, 15.
	MinAfter, MaxAfter int64
	// MaxDuration bounds fault durations. Default 3 s.
	MaxDuration time.Duration
	// EachKind makes the first faults a random permutation of Kinds, so a
	// short schedule still has every kind (as far as the live-worker bounds
	// allow); later faults are drawn uniformly. Default false.
	EachKind bool
}

// NewSchedule draws a schedule of cfg.Faults faults from seed: the same
// seed and config give the same schedule (math/rand/v2 PCG).
func NewSchedule(seed uint64, cfg ScheduleConfig) []Fault {
	if len(cfg.Kinds) == 0 {
		cfg.Kinds = AllKinds()
	}
	if cfg.Workers == 0 {
		cfg.Workers = 3
	}
	if cfg.MinLive == 0 {
		cfg.MinLive = 3
	}
	if cfg.MaxLive == 0 {
		cfg.MaxLive = 5
	}
	if cfg.MinAfter == 0 {
		cfg.MinAfter = 3
	}
	if cfg.MaxAfter < cfg.MinAfter {
		cfg.MaxAfter = max(cfg.MinAfter, 15)
	}
	if cfg.MaxDuration <= 0 {
		cfg.MaxDuration = 3 * time.Second
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed_fa17))
	dur := func(lo time.Duration) time.Duration {
		hi := max(cfg.MaxDuration, lo+time.Millisecond)
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	live := cfg.Workers
	var first []Kind
	if cfg.EachKind {
		first = append(first, cfg.Kinds...)
		rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	}
	out := make([]Fault, 0, cfg.Faults)
	for len(out) < cfg.Faults {
		f := Fault{Kind: cfg.Kinds[rng.IntN(len(cfg.Kinds))], Target: rng.IntN(1 << 16),
			After: cfg.MinAfter + rng.Int64N(cfg.MaxAfter-cfg.MinAfter+1)}
		if len(first) > 0 {
			f.Kind, first = first[0], first[1:]
		}
		switch {
		case f.Kind.destructive() && live <= cfg.MinLive:
			if len(first) < len(cfg.Kinds) {
				first = append(first, f.Kind) // keep it for later
			}
			f.Kind = Join
		case f.Kind == Join && live >= cfg.MaxLive:
			continue
		}
		switch f.Kind {
		case Kill, Term:
			live--
		case Join:
			live++
		case Hang:
			f.Duration = dur(200 * time.Millisecond)
		case RedisOutage:
			f.Duration = dur(100 * time.Millisecond)
		case RedisLatency:
			f.Duration, f.Latency = dur(300*time.Millisecond), time.Duration(5+rng.IntN(150))*time.Millisecond
		case PeerLatency:
			f.Duration, f.Latency = dur(300*time.Millisecond), time.Duration(1+rng.IntN(30))*time.Millisecond
		case PeerBandwidth:
			f.Duration, f.Bandwidth = dur(300*time.Millisecond), int64(16<<10+rng.IntN(256<<10))
		case RedisBlackhole, PeerBlackhole:
			f.Duration = dur(200 * time.Millisecond)
		case RedisCut, PeerCut:
			f.Duration = time.Duration(rng.Int64N(int64(cfg.MaxDuration / 3)))
		case JoinKill:
			f.Duration = time.Duration(rng.Int64N(int64(600 * time.Millisecond)))
		case HostCut:
			f.Duration = dur(300 * time.Millisecond)
		}
		out = append(out, f)
	}
	return out
}
