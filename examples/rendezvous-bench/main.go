// Command rendezvous-bench measures the elastic rendezvous on this host and
// prints one figure per line:
//
//   - formation: time from the last member's arrival until every member
//     holds its World, for each member count in -workers (first: until the
//     first member holds it, the store's part before the fan-out to every
//     in-process member),
//     with the Redis CPU of the whole formation (INFO cpu, user + system,
//     from the first Join until every World) and this process' own CPU
//     over the same span (the members' cost: they share the cores with
//     Redis); members are goroutines of this process (an Agent each, eight
//     to a go-redis client, each with its own Pub/Sub subscription);
//   - formation_cpu_ratio: Redis CPU per formation of the largest count
//     over the smallest, next to the ratio of the counts (linear growth
//     gives equal ratios);
//   - change_report / change_lease (-change): one member of the formed round
//     is lost (its Agent closed), and the figure is the time from the loss
//     until every survivor holds the next World, with a survivor reporting
//     the loss at once or by lease expiry, and the Redis CPU of that span;
//   - with -hold D: the Redis CPU per second of a formed round held for D
//     (heartbeats only), as a percentage of one core;
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
//	    [-lease 3s] [-redis host:port] [-hold 0] [-kill=true] [-json]
//	    [-change report|lease|none] [-formation-lease 3s] [-heartbeat 500ms]
//
// With -redis empty a private redis-server is started on a free loopback
// port (an embedded server, elastic/standalone, if redis-server is not on
// PATH), so runs of hundreds or thousands of members never load a shared
// Redis. For example, the scale figures:
//
//	go run ./examples/rendezvous-bench -workers 256,1024,4096 -reps 1 -kill=false
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/elastic/store"
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
	// Formation only: medians over the reps.
	FirstMS    float64 `json:"first_ms,omitempty"`       // last arrival until the first member holds its World
	SeenMS     float64 `json:"seen_ms,omitempty"`        // change only: the loss until every survivor's ChangePending was true
	LapseMS    float64 `json:"after_lapse_ms,omitempty"` // change_lease only: the victim's lease end until every survivor holds the next World
	RedisCPUMS float64 `json:"redis_cpu_ms,omitempty"`   // Redis CPU (INFO cpu) for one formation
	BenchCPUMS float64 `json:"bench_cpu_ms,omitempty"`   // this process' CPU over the same span
	CloseCPUMS float64 `json:"close_cpu_ms,omitempty"`   // Redis CPU from the last arrival until every World
	// Formation only: the part of RedisCPUMS that is the leases' upkeep
	// while the members gathered (their heartbeats, priced at what a
	// heartbeat cost while the formed round was held), and the rest: the
	// protocol's work (joins, the close, views, re-reads, connections).
	UpkeepCPUMS   float64 `json:"upkeep_cpu_ms,omitempty"`
	ProtocolCPUMS float64 `json:"protocol_cpu_ms,omitempty"`
	GatherBeats   int64   `json:"gather_beats,omitempty"`  // heartbeats over the formation
	BeatPriceUS   float64 `json:"beat_price_us,omitempty"` // Redis CPU per heartbeat of the held round
	// Formation only: the members' store calls over the formation, per
	// member (medians over the reps), and the span over which they arrived.
	JoinsPerMember  float64 `json:"joins_per_member,omitempty"`
	BeatsPerMember  float64 `json:"beats_per_member,omitempty"`
	ChecksPerMember float64 `json:"checks_per_member,omitempty"`
	ArrivalMS       float64 `json:"arrival_ms,omitempty"` // first member's start until n-1 had arrived
	// Hold only: Redis CPU while a formed round was held, in % of one core.
	HoldCPUPct float64 `json:"hold_cpu_pct,omitempty"`
	HoldS      float64 `json:"hold_s,omitempty"`
	// formation_cpu_ratio only.
	Ratio         float64 `json:"ratio,omitempty"`          // Redis CPU per formation, largest count / smallest
	ProtocolRatio float64 `json:"protocol_ratio,omitempty"` // the same for ProtocolCPUMS
	ArrivalSpanMS float64 `json:"arrival_span_ms"`          // -arrival (0: as fast as the bench can start members)
	MembersRatio  float64 `json:"members_ratio,omitempty"`  // largest count / smallest
	FromMembers   int     `json:"from_members,omitempty"`
	LeaseTTL      string  `json:"lease_ttl,omitempty"`
	Goal          string  `json:"goal,omitempty"`
}

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	workers := flag.String("workers", "2,8,32,64", "member counts for the formation figure, comma-separated")
	procs := flag.Int("procs", 4, "child processes in the kill figures (one is killed)")
	reps := flag.Int("reps", 3, "repetitions per figure (the median is reported)")
	lease := flag.Duration("lease", 3*time.Second, "LeaseTTL for the kill figures")
	redisAddr := flag.String("redis", "", "Redis address; empty = start a private redis-server on a free port (embedded server if not installed)")
	hold := flag.Duration("hold", 0, "after each formation, hold the round this long and report Redis CPU per second (0 = skip)")
	kill := flag.Bool("kill", true, "run the kill-recovery figures")
	verbose := flag.Bool("v", false, "print the busiest Redis commands of each formation (INFO commandstats) and, every 250 ms, the members' store calls so far, on stderr")
	change := flag.String("change", "report", "after each formation lose one member and time the next round: report, lease or none")
	formLease := flag.Duration("formation-lease", elastic.DefaultLeaseTTL, "LeaseTTL of the members in the formation figures")
	formBeat := flag.Duration("heartbeat", elastic.DefaultHeartbeatInterval, "HeartbeatInterval of the members in the formation figures (at most a third of -formation-lease)")
	arrival := flag.Duration("arrival", 0, "spread the starts of a formation's members evenly over this span, the same for every member count (0 = as fast as this process can, a span that grows with the count)")
	cpuProfile := flag.String("cpuprofile", "", "write this process' CPU profile to the file (to see what the members cost)")
	asJSON := flag.Bool("json", false, "print one JSON object per figure")
	flag.Parse()
	// go-redis' own lines (a closed client's Pub/Sub reader at the end of
	// each formation) go to Debug, which the bench does not print.
	redis.SetLogger(store.RedisLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	switch {
	case *formLease <= 0:
		usage(fmt.Errorf("-formation-lease %v: want a lease above 0", *formLease))
	case *formBeat <= 0 || *formBeat > *formLease/3:
		// Three renewals per lease, so a member that misses one under a
		// loaded Redis is not evicted (elastic.Config accepts up to a half).
		usage(fmt.Errorf("-heartbeat %v: want above 0 and at most a third of -formation-lease %v (%v)", *formBeat, *formLease, *formLease/3))
	case *lease <= 0:
		usage(fmt.Errorf("-lease %v: want a lease above 0", *lease))
	case *hold < 0:
		usage(fmt.Errorf("-hold %v: want a span of 0 or more", *hold))
	}
	formationLease, formationBeat = *formLease, *formBeat
	if *arrival < 0 {
		usage(fmt.Errorf("-arrival %v: want a span of 0 or more", *arrival))
	}
	formationArrival = *arrival
	if *verbose {
		progressEvery = 250 * time.Millisecond
	}
	changeMode := *change
	switch changeMode {
	case "none":
		changeMode = ""
	case "report", "lease":
	default:
		usage(fmt.Errorf("-change must be report, lease or none, not %q", changeMode))
	}
	ctx := context.Background()
	addr, storeName := *redisAddr, "redis"
	if addr == "" {
		if pr, err := startPrivateRedis(ctx, 30000); err == nil {
			defer pr.stop()
			addr, storeName = pr.addr, "redis-private"
		} else {
			srv, err := standalone.Start(ctx, "")
			if err != nil {
				fail(err)
			}
			defer srv.Close()
			addr, storeName = srv.Addr(), "standalone"
		}
	}
	if *redisAddr != "" {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		err := c.Ping(pctx).Err()
		_ = c.Close()
		cancel()
		if err != nil {
			fail(fmt.Errorf("-redis %s: Redis does not answer: %w", addr, err))
		}
	}
	var counts []int
	for _, f := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			usage(fmt.Errorf("-workers %q: entry %q is not a member count of 1 or more", *workers, f))
		}
		counts = append(counts, n)
	}
	if *procs < 2 || *reps < 1 {
		usage(fmt.Errorf("-procs must be >= 2 and -reps >= 1"))
	}
	emit := func(f figure) {
		if *asJSON {
			b, _ := json.Marshal(f)
			fmt.Println(string(b))
			return
		}
		goal := ""
		if f.Goal != "" {
			goal = "(goal: " + f.Goal + ")" // a bar, not a verdict
		}
		switch {
		case f.Figure == "formation_cpu_ratio":
			fmt.Printf("%-26s %-13s members=%d->%d redis_cpu_ratio=%.2f protocol_cpu_ratio=%.2f members_ratio=%.2f arrival=%s %s\n",
				f.Figure, f.Store, f.FromMembers, f.Members, f.Ratio, f.ProtocolRatio, f.MembersRatio, arrivalName(f.ArrivalSpanMS), goal)
		case f.Figure == "hold":
			fmt.Printf("%-26s %-13s members=%-4d redis_cpu=%.1f%% of a core over %.0fs (%s) %s\n",
				f.Figure, f.Store, f.Members, f.HoldCPUPct, f.HoldS, f.LeaseTTL, goal)
		default:
			// What the median is of, in words: the time until every member
			// holds the World, from the last arrival (formation) or from
			// the loss (change_*, kill_*).
			what := "every member held its World after the last arrival: "
			if f.Figure != "formation" {
				what = "every survivor held the next World after the loss: "
			}
			if f.SeenMS > 0 {
				what = fmt.Sprintf("every survivor knew of the loss after %.2fms, ", f.SeenMS) + what
			}
			if f.LapseMS != 0 {
				what = fmt.Sprintf("the next World came %.2fms after the lease lapsed, ", f.LapseMS) + what
			}
			var cpuParts []string // what the Redis CPU is made of
			if f.Figure == "formation" {
				cpuParts = append(cpuParts, fmt.Sprintf("%.0fms of it after the last arrival", f.CloseCPUMS))
			}
			if f.UpkeepCPUMS > 0 {
				cpuParts = append(cpuParts, fmt.Sprintf("leases' upkeep %.0fms: %d heartbeats at %.0fus; protocol %.0fms", f.UpkeepCPUMS, f.GatherBeats, f.BeatPriceUS, f.ProtocolCPUMS))
			}
			upkeep := ""
			if len(cpuParts) > 0 {
				upkeep = "(" + strings.Join(cpuParts, "; ") + ") "
			}
			calls := ""
			if f.JoinsPerMember > 0 {
				calls = fmt.Sprintf("arrived over %.0fms, per member %.2f joins %.2f heartbeats %.2f checks; ",
					f.ArrivalMS, f.JoinsPerMember, f.BeatsPerMember, f.ChecksPerMember)
			}
			bench := ""
			if f.BenchCPUMS > 0 { // measured for formations only
				bench = fmt.Sprintf("bench_cpu=%.0fms ", f.BenchCPUMS)
			}
			first := ""
			if f.FirstMS > 0 {
				first = fmt.Sprintf(" (the first after %.2fms)", f.FirstMS)
			}
			rcpu := ""
			if f.RedisCPUMS > 0 || f.Figure == "formation" { // the kill figures do not measure it
				rcpu = fmt.Sprintf("redis_cpu=%.0fms ", f.RedisCPUMS)
			}
			lease := ""
			if f.LeaseTTL != "" {
				lease = "LeaseTTL " + f.LeaseTTL + " "
			}
			fmt.Printf("%-26s %-13s members=%-4d %smedian=%8.2fms min=%8.2fms max=%8.2fms%s; %s%s%s%s%s%s\n",
				f.Figure, f.Store, f.Members, what, f.MedianMS, f.MinMS, f.MaxMS, first, rcpu, upkeep, calls, bench, lease, goal)
		}
	}
	msf := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	median := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	cpuPer, protoPer := map[int]time.Duration{}, map[int]time.Duration{}
	for _, n := range counts {
		var samples, firsts, rcpu, bcpu, ccpu, chg, chgFirst, chgCPU, chgSeen, chgLapse []time.Duration
		var upkeep, proto, prices []time.Duration
		var beats []int64
		var joinsPM, beatsPM, checksPM []float64
		var arrivalSpans []time.Duration
		var holdPct []float64
		var holdS float64
		for r := range *reps {
			res, err := formation(ctx, addr, n, r, *hold, changeMode)
			if err != nil {
				fail(fmt.Errorf("formation of %d: %w", n, err))
			}
			samples, rcpu, bcpu = append(samples, res.afterLast), append(rcpu, res.redisCPU), append(bcpu, res.benchCPU)
			firsts, ccpu = append(firsts, res.firstAt), append(ccpu, res.closeCPU)
			joinsPM, beatsPM = append(joinsPM, float64(res.formJoins)/float64(n)), append(beatsPM, float64(res.formBeats)/float64(n))
			checksPM, arrivalSpans = append(checksPM, float64(res.formChecks)/float64(n)), append(arrivalSpans, res.arrivals)
			if res.beatPrice > 0 && res.redisCPU > 0 {
				upkeep, proto = append(upkeep, res.upkeep()), append(proto, res.redisCPU-res.upkeep())
				prices, beats = append(prices, res.beatPrice), append(beats, res.formBeats)
			}
			if *verbose && res.stats != "" {
				fmt.Fprintf(os.Stderr, "formation of %d: %d members arrived in %v; redis cpu after the last arrival %v; redis %s\n",
					n, n-1, res.arrivals.Round(time.Millisecond), res.closeCPU.Round(time.Millisecond), res.stats)
			}
			if *verbose && res.changeStats != "" {
				fmt.Fprintf(os.Stderr, "change in a round of %d: redis %s\n", n, res.changeStats)
			}
			if res.change > 0 {
				chg, chgCPU, chgFirst = append(chg, res.change), append(chgCPU, res.changeCPU), append(chgFirst, res.changeFirst)
				chgSeen = append(chgSeen, res.changeSeen)
				if res.afterLapse != 0 {
					chgLapse = append(chgLapse, res.afterLapse)
				}
			}
			if res.hold > 0 {
				holdPct = append(holdPct, 100*res.holdCPU.Seconds()/res.hold.Seconds())
				holdS = res.hold.Seconds()
			}
		}
		f := summarize("formation", storeName, n, samples)
		f.RedisCPUMS, f.BenchCPUMS, f.FirstMS = msf(median(rcpu)), msf(median(bcpu)), msf(median(firsts))
		f.CloseCPUMS = msf(median(ccpu))
		f.JoinsPerMember, f.BeatsPerMember, f.ChecksPerMember = medianF(joinsPM), medianF(beatsPM), medianF(checksPM)
		f.ArrivalMS = msf(median(arrivalSpans))
		cpuPer[n] = median(rcpu)
		if len(proto) > 0 {
			f.UpkeepCPUMS, f.ProtocolCPUMS, f.BeatPriceUS = msf(median(upkeep)), msf(median(proto)), msf(median(prices))*1000
			slices.Sort(beats)
			f.GatherBeats = beats[len(beats)/2]
			protoPer[n] = median(proto)
		}
		switch n {
		case 64:
			f.Goal = "under 50 ms"
		case 1024:
			f.Goal = "under 100 ms, redis cpu under 1 s"
		}
		emit(f)
		if len(chg) > 0 {
			c := summarize("change_"+changeMode, storeName, n, chg)
			c.RedisCPUMS, c.FirstMS, c.SeenMS = msf(median(chgCPU)), msf(median(chgFirst)), msf(median(chgSeen))
			if len(chgLapse) > 0 {
				c.LapseMS = msf(median(chgLapse))
			}
			if changeMode == "report" {
				c.Goal = "under 100 ms"
			} else {
				c.Goal = "within the lease " + formationLease.String()
			}
			emit(c)
		}
		if len(holdPct) > 0 {
			slices.Sort(holdPct)
			h := figure{Figure: "hold", Store: storeName, Members: n, Reps: len(holdPct), HoldCPUPct: holdPct[len(holdPct)/2], HoldS: holdS,
				LeaseTTL: fmt.Sprintf("LeaseTTL %v, HeartbeatInterval %v, beats every %v (MaxHeartbeatRate %d a second)",
					formationLease, min(formationBeat, formationLease/3), effectiveBeat(n), elastic.DefaultMaxHeartbeatRate)}
			if n == 4096 {
				h.Goal = "under 20% of a core"
			}
			emit(h)
		}
	}
	if lo, hi := slices.Min(counts), slices.Max(counts); hi > lo && cpuPer[lo] > 0 {
		r := figure{Figure: "formation_cpu_ratio", Store: storeName, Members: hi, FromMembers: lo,
			Ratio: cpuPer[hi].Seconds() / cpuPer[lo].Seconds(), MembersRatio: float64(hi) / float64(lo),
			ArrivalSpanMS: msf(formationArrival), Goal: "ratio at most members_ratio (linear)"}
		if protoPer[lo] > 0 && protoPer[hi] > 0 {
			r.ProtocolRatio = protoPer[hi].Seconds() / protoPer[lo].Seconds()
		}
		emit(r)
	}
	if !*kill {
		return
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

// medianF is the median of xs (0 if empty).
func medianF(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// arrivalName says how a formation's members arrived, from -arrival in ms.
func arrivalName(spanMS float64) string {
	if spanMS == 0 {
		return "as-fast-as-the-bench-starts-them"
	}
	return fmt.Sprintf("spread-over-%gms", spanMS)
}

// usage reports a bad flag and exits with status 2, as package flag does.
func usage(err error) {
	fmt.Fprintln(os.Stderr, "rendezvous-bench:", err)
	os.Exit(2)
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

// effectiveBeat is the interval at which each of n members of the
// formation figures renews (elastic.Config.HeartbeatEvery at the default
// MaxHeartbeatRate).
func effectiveBeat(n int) time.Duration {
	c := elastic.DefaultConfig()
	c.LeaseTTL, c.HeartbeatInterval = formationLease, min(formationBeat, formationLease/3)
	return c.HeartbeatEvery(n)
}
