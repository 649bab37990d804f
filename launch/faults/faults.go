package launcher

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// FaultKind is what the launcher does to a worker when the job reaches a step.
type FaultKind string

// The faults the launcher can inject.
const (
	Kill FaultKind = "kill" // SIGKILL the worker holding Rank
	Stop FaultKind = "stop" // SIGSTOP it (a hang); it is killed when the launcher exits
	Term FaultKind = "term" // SIGTERM it (preemption: it commits, checkpoints, leaves)
	Join FaultKind = "join" // start Rank (a count) more workers
)

// Fault is one injected event: Kind applied at global step Step, to the
// worker holding rank Rank (for Join: Rank is how many workers to start).
// When After is set, the fault waits past Step until After is closed, then
// applies at the next step (a benchmark holds a kill until its disturbance
// is in place).
type Fault struct {
	Kind  FaultKind
	Rank  int
	Step  int64
	After <-chan struct{}
}

// ready reports whether nothing holds the fault back.
func (f Fault) ready() bool {
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

// CheckFaults reports faults that can never apply to a job started with
// workers processes and at most max ranks: joins that would start more
// than max workers in all (workers plus every -join count; Run refuses
// them too, given max as Spec.MaxWorkers), or a kill, stop or term of a
// rank that no worker can hold (ranks stay below the workers started,
// counting those -join adds).
func CheckFaults(faults []Fault, workers, max int) error {
	if err := checkCount(faults, workers, max); err != nil {
		return err
	}
	n := workers + joined(faults)
	for _, f := range faults {
		if f.Kind != Join && f.Rank >= n {
			return fmt.Errorf("-%s %d@%d: no worker can hold rank %d (ranks 0..%d: %d workers at most, counting -join, and -max %d)",
				f.Kind, f.Rank, f.Step, f.Rank, n-1, n, max)
		}
	}
	return nil
}

// Faults is a repeatable flag value "RANK@STEP" (or "N@STEP" for joins) of
// one kind.
type Faults struct {
	Kind FaultKind
	List *[]Fault
}

func (f Faults) String() string {
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
func (f Faults) Set(s string) error {
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

// joined is how many workers the Join faults start in all, saturating at
// math.MaxInt (each count comes from a flag and may be huge).
func joined(faults []Fault) int {
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

// checkCount refuses a job that would start more than limit workers over
// its life: workers at once, then every Join fault's count.
func checkCount(faults []Fault, workers, limit int) error {
	if workers > limit {
		return fmt.Errorf("-workers %d is above -max %d", workers, limit)
	}
	if j := joined(faults); satAdd(workers, j) > limit {
		return fmt.Errorf("-join: %d workers plus %d joining would start %d, above -max %d (at most %d may join)",
			workers, j, satAdd(workers, j), limit, max(0, limit-workers))
	}
	return nil
}
