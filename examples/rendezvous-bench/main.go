// Command rendezvous-bench measures the elastic rendezvous on this host and
// prints one figure per line:
//
//   - formation: time from the last member's arrival until every member
//     holds its World (LastCall 0), for each member count in -workers;
//     members are goroutines of this process, each with its own Redis
//     connections;
//   - recovery after a SIGKILL, through lease expiry and through a failure
//     report: -procs real child processes form a round, one is SIGKILLed,
//     and the figure is the time from the kill until every survivor holds
//     its next World. In the report case the survivors learn of the death
//     the way a trainer does: their ring connection to the dead peer closes
//     without a goodbye, and they call ReportFailure.
//
// Usage:
//
//	go run ./examples/rendezvous-bench [-workers 2,8,32,64] [-procs 4] [-reps 3]
//	    [-lease 3s] [-redis host:port] [-json]
//
// With -redis empty an embedded server (elastic/standalone) is started.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/standalone"
)

type figure struct {
	Figure   string    `json:"figure"`
	Store    string    `json:"store"`
	Members  int       `json:"members"`
	Reps     int       `json:"reps"`
	MedianMS float64   `json:"median_ms"`
	MinMS    float64   `json:"min_ms"`
	MaxMS    float64   `json:"max_ms"`
	AllMS    []float64 `json:"all_ms"`
	LeaseTTL string    `json:"lease_ttl,omitempty"`
	Goal     string    `json:"goal,omitempty"`
}

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	workers := flag.String("workers", "2,8,32,64", "member counts for the formation figure, comma-separated")
	procs := flag.Int("procs", 4, "child processes in the kill figures (one is killed)")
	reps := flag.Int("reps", 3, "repetitions per figure (the median is reported)")
	lease := flag.Duration("lease", 3*time.Second, "LeaseTTL for the kill figures")
	redisAddr := flag.String("redis", "", "Redis address; empty = start an embedded server (elastic/standalone)")
	asJSON := flag.Bool("json", false, "print one JSON object per figure")
	flag.Parse()

	ctx := context.Background()
	addr, storeName := *redisAddr, "redis"
	if addr == "" {
		srv, err := standalone.Start(ctx, "")
		if err != nil {
			fail(err)
		}
		defer srv.Close()
		addr, storeName = srv.Addr(), "standalone"
	}
	var counts []int
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fail(fmt.Errorf("bad -workers entry %q", f))
		}
		counts = append(counts, n)
	}
	if *procs < 2 || *reps < 1 {
		fail(fmt.Errorf("-procs must be >= 2 and -reps >= 1"))
	}
	emit := func(f figure) {
		if *asJSON {
			b, _ := json.Marshal(f)
			fmt.Println(string(b))
			return
		}
		fmt.Printf("%-26s %-10s members=%-3d median=%8.2fms min=%8.2fms max=%8.2fms %s %s\n",
			f.Figure, f.Store, f.Members, f.MedianMS, f.MinMS, f.MaxMS, f.LeaseTTL, f.Goal)
	}
	for _, n := range counts {
		var samples []time.Duration
		for r := range *reps {
			d, err := formation(ctx, addr, n, r)
			if err != nil {
				fail(fmt.Errorf("formation of %d: %w", n, err))
			}
			samples = append(samples, d)
		}
		f := summarize("formation", storeName, n, samples)
		if n == 64 {
			f.Goal = "under 50 ms"
		}
		emit(f)
	}
	for _, viaReport := range []bool{false, true} {
		var samples []time.Duration
		for r := range *reps {
			d, err := killRecovery(ctx, addr, *procs, *lease, viaReport, r)
			if err != nil {
				fail(fmt.Errorf("kill recovery: %w", err))
			}
			samples = append(samples, d)
		}
		name := "kill_to_world_lease"
		if viaReport {
			name = "kill_to_world_report"
		}
		f := summarize(name, storeName, *procs, samples)
		f.LeaseTTL = lease.String()
		if viaReport {
			f.Goal = "under 100 ms"
		}
		emit(f)
	}
}

func summarize(name, store string, members int, ds []time.Duration) figure {
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	f := figure{Figure: name, Store: store, Members: members, Reps: len(ds),
		MedianMS: msf(sorted[len(sorted)/2]), MinMS: msf(sorted[0]), MaxMS: msf(sorted[len(sorted)-1])}
	for _, d := range ds {
		f.AllMS = append(f.AllMS, msf(d))
	}
	return f
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rendezvous-bench:", err)
	os.Exit(1)
}

func jobID(kind string, rep int) string {
	return fmt.Sprintf("bench-%s-%d-%d-%d", kind, os.Getpid(), time.Now().UnixNano(), rep)
}

func baseConfig(job string) elastic.Config {
	c := elastic.DefaultConfig()
	c.JobID = job
	c.LastCall = 0
	c.JoinTimeout = time.Minute
	return c
}
