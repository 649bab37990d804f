// Package faults is the list of faults a test or a benchmark injects into
// a local job when it reaches given steps: SIGKILL, SIGSTOP or SIGTERM the
// worker holding a rank, or start more workers. launch/monitor applies them
// as the workers' step events arrive; this package parses and checks them
// (Flag, Check). It is a test kit: a production supervisor has no use
// for it.
package faults

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Kind is what the supervisor does to a worker when the job reaches a step.
type Kind string

// The faults the supervisor can inject.
const (
	Kill Kind = "kill" // SIGKILL the worker holding Rank
	Stop Kind = "stop" // SIGSTOP it (a hang); it is killed when the supervisor exits
	Term Kind = "term" // SIGTERM it (preemption: it commits, checkpoints, leaves)
	Join Kind = "join" // start Rank (a count) more workers
	// KillHost SIGKILLs, at once, every live worker on the host (network
	// namespace, launch.Netns) of the worker holding Rank: a host's loss.
	// Without placement in namespaces it is skipped.
	KillHost Kind = "killhost"
)

// Fault is one injected event: Kind applied at global step Step, to the
// worker holding rank Rank (for Join: Rank is how many workers to start).
// When After is set, the fault waits past Step until After is closed, then
// applies at the next step (a benchmark holds a kill until its disturbance
// is in place).
type Fault struct {
	Kind  Kind
	Rank  int
	Step  int64
	After <-chan struct{}
}

// Ready reports whether nothing holds the fault back (After is nil or
// closed).
func (f Fault) Ready() bool {
	if f.After == nil {
		return true
	}
	select {
	case <-f.After:
		return true
	default:
		return false
	}
}

func (f Fault) String() string { return fmt.Sprintf("%s %d@%d", f.Kind, f.Rank, f.Step) }

// Check reports faults that can never apply to a job started with
// workers processes and at most max ranks: joins that would start more
// than max workers in all (CheckCount; monitor.Run refuses them too, given
// max as Spec.MaxWorkers), or a kill, stop or term of a rank that no
// worker can hold (ranks stay below the workers started, counting those
// -join adds). Its messages name the flags of Flag.
func Check(faults []Fault, workers, max int) error {
	if err := CheckCount(faults, workers, max); err != nil {
		return err
	}
	n := workers + Joined(faults)
	for _, f := range faults {
		if f.Kind != Join && f.Rank >= n {
			return fmt.Errorf("-%s %d@%d: no worker can hold rank %d (ranks 0..%d: %d workers at most, counting -join, and -max %d)",
				f.Kind, f.Rank, f.Step, f.Rank, n-1, n, max)
		}
	}
	return nil
}

// Flag is a repeatable flag value "RANK@STEP" (or "N@STEP" for joins) of
// one kind, appending to List:
//
//	fs.Var(faults.Flag{Kind: faults.Kill, List: &list}, "kill", "...")
type Flag struct {
	Kind Kind
	List *[]Fault
}

// String returns the faults of f's kind in List, "A@STEP,...".
func (f Flag) String() string {
	if f.List == nil {
		return ""
	}
	var parts []string
	for _, x := range *f.List {
		if x.Kind == f.Kind {
			parts = append(parts, fmt.Sprintf("%d@%d", x.Rank, x.Step))
		}
	}
	return strings.Join(parts, ",")
}

// Set parses one "A@STEP" value.
func (f Flag) Set(s string) error {
	what := "RANK"
	if f.Kind == Join {
		what = "COUNT"
	}
	a, b, ok := strings.Cut(s, "@")
	if !ok {
		return fmt.Errorf("want -%s %s@STEP, got %q", f.Kind, what, s)
	}
	n, err := strconv.Atoi(a)
	if err != nil || n < 0 {
		return fmt.Errorf("bad -%s %s %q: want a whole number >= 0", f.Kind, what, a)
	}
	if f.Kind == Join && n < 1 {
		return fmt.Errorf("bad join count %d: want at least 1", n)
	}
	step, err := strconv.ParseInt(b, 10, 64)
	if err != nil || step < 1 {
		return fmt.Errorf("bad %s step %q: want a step >= 1", f.Kind, b)
	}
	*f.List = append(*f.List, Fault{Kind: f.Kind, Rank: n, Step: step})
	return nil
}

// Joined is how many workers the Join faults start in all, saturating at
// math.MaxInt (each count comes from a flag and may be huge).
func Joined(faults []Fault) int {
	n := 0
	for _, f := range faults {
		if f.Kind == Join {
			n = satAdd(n, f.Rank)
		}
	}
	return n
}

func satAdd(a, b int) int {
	if b > math.MaxInt-a {
		return math.MaxInt
	}
	return a + b
}

// CheckCount refuses a job that would start more than limit workers over
// its life: workers at once, then every Join fault's count.
func CheckCount(faults []Fault, workers, limit int) error {
	if workers > limit {
		return fmt.Errorf("-workers %d is above -max %d", workers, limit)
	}
	if j := Joined(faults); satAdd(workers, j) > limit {
		return fmt.Errorf("-join: %d workers plus %d joining would start %d, above -max %d (at most %d may join)",
			workers, j, satAdd(workers, j), limit, max(0, limit-workers))
	}
	return nil
}
