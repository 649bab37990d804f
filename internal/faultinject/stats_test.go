package faultinject

import (
	"fmt"
	"io"
	"slices"
	"time"
)

// Stats aggregates the results of many runs: faults by kind, violations,
// and recovery times. The zero value is ready to use; not safe for
// concurrent use.
type Stats struct {
	Runs       int
	Violations []string
	kinds      map[Kind]*kindStats
}

type kindStats struct {
	injected, survived, disrupted int
	recovery, afterHeal           []time.Duration
}

// Add folds one run's result in. A fault is survived when it was applied,
// the job progressed after it within the bound, and the run upheld every
// invariant.
func (s *Stats) Add(r RunResult) {
	s.Runs++
	s.Violations = append(s.Violations, r.Violations...)
	if s.kinds == nil {
		s.kinds = map[Kind]*kindStats{}
	}
	for _, in := range r.Injections {
		if in.Skipped != "" {
			continue
		}
		k := s.kinds[in.Fault.Kind]
		if k == nil {
			k = &kindStats{}
			s.kinds[in.Fault.Kind] = k
		}
		k.injected++
		if in.Progressed && len(r.Violations) == 0 {
			k.survived++
		}
		if in.Disrupted {
			k.disrupted++
			k.recovery = append(k.recovery, in.Recovery)
			k.afterHeal = append(k.afterHeal, in.RecoveryAfterHeal)
		}
	}
}

// Injected returns the number of faults applied, in all and by kind.
func (s *Stats) Injected() (int, map[Kind]int) {
	n, by := 0, map[Kind]int{}
	for k, ks := range s.kinds {
		n += ks.injected
		by[k] = ks.injected
	}
	return n, by
}

// Survived returns the number of faults survived (see Add).
func (s *Stats) Survived() int {
	n := 0
	for _, ks := range s.kinds {
		n += ks.survived
	}
	return n
}

// Recoveries returns every recovery time of a disrupting fault (from its
// start to the first step of the new round), over all kinds.
func (s *Stats) Recoveries() []time.Duration {
	var out []time.Duration
	for _, ks := range s.kinds {
		out = append(out, ks.recovery...)
	}
	return out
}

// MedianMax returns the median and maximum of ds (0, 0 when empty).
func MedianMax(ds []time.Duration) (median, maximum time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		median = s[len(s)/2]
	} else {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return median, s[len(s)-1]
}

// Print writes a table: per kind, faults injected, survived, disrupting,
// and recovery median/max (from the fault's start, and after it ended);
// then the totals and every violation.
func (s *Stats) Print(w io.Writer) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }
	fmt.Fprintf(w, "%-16s %8s %8s %9s %12s %12s %12s %12s\n", "kind", "injected", "survived", "disrupted", "rec-median", "rec-max", "heal-median", "heal-max")
	for _, k := range AllKinds() {
		ks := s.kinds[k]
		if ks == nil {
			continue
		}
		m, x := MedianMax(ks.recovery)
		hm, hx := MedianMax(ks.afterHeal)
		fmt.Fprintf(w, "%-16s %8d %8d %9d %12s %12s %12s %12s\n", k, ks.injected, ks.survived, ks.disrupted, ms(m), ms(x), ms(hm), ms(hx))
	}
	n, _ := s.Injected()
	m, x := MedianMax(s.Recoveries())
	fmt.Fprintf(w, "runs %d, faults injected %d, survived %d, invariant violations %d, recovery median %s max %s\n",
		s.Runs, n, s.Survived(), len(s.Violations), ms(m), ms(x))
	for _, v := range s.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
}
