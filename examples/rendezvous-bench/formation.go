package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
)

// arrivalSpy reports each member whose Join left it waiting in the forming
// round, so the benchmark can start the last member after all others
// arrived, and counts the members' store calls by kind (calls, shared by
// every member of a formation).
type arrivalSpy struct {
	store.Store
	arrived chan struct{}
	calls   *callCounts
}

// callCounts counts store calls by kind, and the answers that fenced.
type callCounts struct {
	arrived, joins, checks, beats, fenced atomic.Int64
}

func (c *callCounts) String() string {
	return fmt.Sprintf("arrived %d, store calls: joins %d checks %d beats %d (fenced %d)",
		c.arrived.Load(), c.joins.Load(), c.checks.Load(), c.beats.Load(), c.fenced.Load())
}

func (s *arrivalSpy) Join(ctx context.Context, r store.JoinRequest) (store.View, error) {
	s.calls.joins.Add(1)
	v, err := s.Store.Join(ctx, r)
	if err == nil && v.Code == store.CodeFenced {
		s.calls.fenced.Add(1)
	}
	if err == nil && v.Role == store.RoleArrived && r.Incarnation == "" {
		// A member's first arrival only: a waiting member's re-read Join
		// answers RoleArrived again.
		s.calls.arrived.Add(1)
		s.arrived <- struct{}{}
	}
	return v, err
}

func (s *arrivalSpy) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	s.calls.checks.Add(1)
	v, err := s.Store.Check(ctx, r)
	if err == nil && v.Code == store.CodeFenced {
		s.calls.fenced.Add(1)
	}
	return v, err
}

func (s *arrivalSpy) Heartbeat(ctx context.Context, r store.MemberRequest) (store.Beat, error) {
	s.calls.beats.Add(1)
	b, err := s.Store.Heartbeat(ctx, r)
	if err == nil && b.Code == store.CodeFenced {
		s.calls.fenced.Add(1)
	}
	return b, err
}

// formationResult is one formation run.
type formationResult struct {
	afterLast   time.Duration // last member's arrival until every member holds its World
	firstAt     time.Duration // last member's arrival until the first member holds its World (the store's part)
	redisCPU    time.Duration // Redis CPU (INFO cpu) from the first Join until every World; 0 if unknown
	benchCPU    time.Duration // this process' CPU over the same span (the members' own cost)
	holdCPU     time.Duration // Redis CPU while the formed round was held for hold
	hold        time.Duration
	change      time.Duration // one member lost: from the loss (its report) until every survivor holds the next World
	changeCPU   time.Duration // Redis CPU over the same span
	changeFirst time.Duration // from the loss until the first survivor holds the next World
	changeSeen  time.Duration // from the loss until every survivor's ChangePending was true
	afterLapse  time.Duration // "lease" only: from the victim's lease end until every survivor holds the next World
	stats       string        // busiest Redis commands of the formation (INFO commandstats)
	changeStats string        // the same for the membership change
	arrivals    time.Duration // from the first member's start until n-1 had arrived
	closeCPU    time.Duration // Redis CPU from the last arrival until every World
	calls       *callCounts   // the members' store calls (and first arrivals) over the whole run
	formBeats   int64         // heartbeats over the span of redisCPU
	formJoins   int64         // Joins over the same span (first arrivals and re-reads)
	formChecks  int64         // Checks over the same span
	beatPrice   time.Duration // Redis CPU per heartbeat while the formed round was held (0: unknown)
}

// upkeep is the Redis CPU of the heartbeats sent while the members
// gathered (formBeats at beatPrice): the leases' upkeep, which grows with
// the member-seconds of waiting, not with the protocol's work. 0 when the
// price is unknown.
func (r formationResult) upkeep() time.Duration {
	return time.Duration(r.formBeats) * r.beatPrice
}

// membersPerClient members share one go-redis client (its pool), so a run
// of thousands of members stays within the connection limits; each Agent
// still has its own Pub/Sub subscription.
const membersPerClient = 8

// warmPool dials k connections of c's pool before the figure starts, as
// the workers of a job have their Redis connection before they join: n
// dials (each a TCP accept and go-redis' HELLO and CLIENT SETINFO) during
// the gathering would be counted as the protocol's work, and would stretch
// the gathering, whose leases' upkeep grows with its length.
func warmPool(ctx context.Context, c *redis.Client, k int) error {
	conns := make([]*redis.Conn, 0, k)
	defer func() {
		for _, cn := range conns {
			_ = cn.Close() // back to the pool
		}
	}()
	for range k {
		cn := c.Conn()
		conns = append(conns, cn)
		if err := cn.Ping(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}

// formationLease and formationBeat are the members' LeaseTTL and
// HeartbeatInterval in the formation figures (-formation-lease, -heartbeat).
var formationLease, formationBeat = elastic.DefaultLeaseTTL, elastic.DefaultHeartbeatInterval

// formationArrival spreads the members' starts evenly over this span
// (-arrival), as the workers of a job start over the seconds their
// scheduler takes, whatever their number; 0 starts them as fast as this one
// process can, a span that grows with the member count. The leases' upkeep
// while the members gather (their heartbeats) grows with the span times the
// member count.
var formationArrival time.Duration

// formation forms one round of n members (it closes at the n-th arrival)
// and measures the time from the last member's arrival (its Join
// call) until every member's Join returned its World, and the Redis CPU the
// whole formation took. With hold > 0 the formed round is then held (members
// heartbeat) for hold and the Redis CPU of that span is measured too.
//
// change "report" or "lease" then loses one member of the formed round (its
// Agent is closed: no Leave, no more heartbeats) and measures the time until
// every survivor holds the next World: "report" has a survivor report it at
// once (ReportFailure, as a trainer does when its ring connection to the
// dead peer closes), "lease" lets its lease lapse. "" skips it.
func formation(ctx context.Context, addr string, n, rep int, hold time.Duration, change string) (formationResult, error) {
	res := formationResult{calls: &callCounts{}}
	cfg := baseConfig(jobID("formation", rep))
	// The fresh round closes at its n-th arrival (MaxWorkers); LastCall is
	// long so it cannot close earlier, and MinWorkers 1 lets the survivors
	// of a loss re-form at once.
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 1, n, time.Hour
	cfg.LeaseTTL = formationLease
	cfg.JoinTimeout = 5 * time.Minute     // thousands of members start on two shared cores
	cfg.HeartbeatInterval = formationBeat // main checked it is at most LeaseTTL/3
	clients := make([]*redis.Client, (n+membersPerClient-1)/membersPerClient)
	agents := make([]*elastic.Agent, n)
	arrived := make(chan struct{}, n)
	defer func() {
		var wg sync.WaitGroup
		for i := range agents {
			if agents[i] != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = agents[i].Leave(ctx)
					_ = agents[i].Close()
				}()
			}
		}
		wg.Wait()
		for _, c := range clients {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	for i := range clients {
		clients[i] = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2 * membersPerClient,
			DialTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
		if err := warmPool(ctx, clients[i], membersPerClient); err != nil {
			return res, err
		}
	}
	for i := range n {
		a, err := elastic.NewAgent(&arrivalSpy{Store: store.NewRedis(clients[i/membersPerClient]), arrived: arrived, calls: res.calls},
			elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", 30000+i%30000)), cfg)
		if err != nil {
			return res, err
		}
		agents[i] = a
	}
	if progressEvery > 0 {
		stop := make(chan struct{})
		var pwg sync.WaitGroup
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			start, c0 := time.Now(), time.Duration(0)
			c0, _ = redisCPU(ctx, clients[0])
			tick := time.NewTicker(progressEvery)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				c, _ := redisCPU(ctx, clients[0])
				fmt.Fprintf(os.Stderr, "  %d members, %6.2fs: %v; redis cpu %v\n", n, time.Since(start).Seconds(), res.calls, (c - c0).Round(time.Millisecond))
			}
		}()
		defer func() { close(stop); pwg.Wait() }()
	}
	beats0, joins0, checks0 := res.calls.beats.Load(), res.calls.joins.Load(), res.calls.checks.Load()
	cpu0, cpuErr := redisCPU(ctx, clients[0])
	stats0, _ := commandStats(ctx, clients[0])
	self0 := selfCPU()
	done := make([]time.Time, n)
	errs := make([]error, n)
	worlds := make([]elastic.World, n)
	var wg sync.WaitGroup
	join := func(i int) {
		defer wg.Done()
		worlds[i], errs[i] = agents[i].Join(ctx)
		done[i] = time.Now()
	}
	// Members start in a stream with at most startWindow of them not yet
	// arrived, so thousands do not dial and join at the same instant; the
	// figure is taken from the last arrival.
	const startWindow = 128
	awaitArrival := func() error {
		select {
		case <-arrived:
			return nil
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("members did not arrive")
		}
	}
	inFlight := 0
	started := time.Now()
	for i := range n - 1 {
		if formationArrival > 0 && n > 1 {
			// Member i starts at i/(n-1) of the arrival window.
			at := started.Add(time.Duration(int64(formationArrival) * int64(i) / int64(n-1)))
			if d := time.Until(at); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return res, ctx.Err()
				}
			}
		}
		wg.Add(1)
		go join(i)
		if inFlight++; inFlight >= startWindow {
			if err := awaitArrival(); err != nil {
				return res, err
			}
			inFlight--
		}
	}
	for ; inFlight > 0; inFlight-- {
		if err := awaitArrival(); err != nil {
			return res, err
		}
	}
	last := time.Now()
	res.arrivals = last.Sub(started)
	lastCPU, lastErr := redisCPU(ctx, clients[0])
	wg.Add(1)
	go join(n - 1)
	wg.Wait()
	var worst, first time.Time
	for i := range n {
		if errs[i] != nil {
			return res, fmt.Errorf("member %d forming the round: %w", i, errs[i])
		}
		if done[i].After(worst) {
			worst = done[i]
		}
		if first.IsZero() || done[i].Before(first) {
			first = done[i]
		}
	}
	res.afterLast, res.firstAt = worst.Sub(last), first.Sub(last)
	res.benchCPU = selfCPU() - self0
	if stats1, err := commandStats(ctx, clients[0]); err == nil && stats0 != nil {
		res.stats = statsDelta(stats0, stats1)
	}
	if cpuErr == nil {
		if cpu1, err := redisCPU(ctx, clients[0]); err == nil {
			res.redisCPU = cpu1 - cpu0
			if lastErr == nil {
				res.closeCPU = cpu1 - lastCPU
			}
		}
	}
	res.formBeats = res.calls.beats.Load() - beats0
	res.formJoins, res.formChecks = res.calls.joins.Load()-joins0, res.calls.checks.Load()-checks0
	// The formed round is held (its members only heartbeat): for -hold
	// the figure of that, and in any case the price of one heartbeat, what
	// the heartbeats of the gathering cost (formationResult.upkeep). The
	// re-reads a close sets off (spread over up to LeaseTTL/3) and the
	// heartbeats' phases settle first.
	beat := cfg.HeartbeatEvery(n)
	select {
	case <-time.After(max(beat, cfg.LeaseTTL/3)):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	holdFor := hold
	if holdFor <= 0 {
		holdFor = max(2*beat, time.Second)
	}
	h0, err0 := redisCPU(ctx, clients[0])
	b0, chk0 := res.calls.beats.Load(), res.calls.checks.Load()
	start := time.Now()
	select {
	case <-time.After(holdFor):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	for i, a := range agents {
		if a.ChangePending() {
			return res, fmt.Errorf("member %d saw a change while the round of %d was held (a lease lapsed?)", i, n)
		}
	}
	h1, err1 := redisCPU(ctx, clients[0])
	beats, checks := res.calls.beats.Load()-b0, res.calls.checks.Load()-chk0
	if err0 == nil && err1 == nil {
		if hold > 0 {
			res.holdCPU, res.hold = h1-h0, time.Since(start)
		}
		if beats > 0 && checks == 0 {
			res.beatPrice = (h1 - h0) / time.Duration(beats)
		}
	}
	if change == "" || n < 3 {
		return res, nil
	}
	victim := agents[n-1]
	if change == "lease" {
		// Every member renewed its lease with the Join that formed the
		// round just now; a member dies at some point of its heartbeat
		// interval instead. Let heartbeats take over, then lose the victim
		// at a random point of its interval.
		beat := cfg.HeartbeatEvery(n)
		select {
		case <-time.After(beat + time.Duration(mrand.Int64N(int64(beat)))):
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	_ = victim.Close()
	lost := time.Now()
	lapse, lapseErr := leaseEnd(ctx, clients[0], cfg.JobID, victim.Member().ID, lost)
	c0, cErr := redisCPU(ctx, clients[0])
	cstats0, _ := commandStats(ctx, clients[0])
	survivors := agents[:n-1]
	seen := make([]time.Time, len(survivors))
	var cwg sync.WaitGroup
	for i, a := range survivors {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			timeout := time.After(3*cfg.LeaseTTL + time.Minute)
			for !a.ChangePending() {
				select {
				case <-a.Changes():
				case <-timeout:
					errs[i] = fmt.Errorf("member %d saw no change after the loss", i)
					return
				}
			}
			seen[i] = time.Now()
			var w elastic.World
			w, errs[i] = a.Join(ctx)
			done[i] = time.Now()
			if errs[i] == nil && (w.Size != n-1 || w.Round <= worlds[i].Round) {
				errs[i] = fmt.Errorf("member %d: round %d of %d after the loss", i, w.Round, w.Size)
			}
		}()
	}
	if change == "report" {
		lost = time.Now()
		if err := agents[0].ReportFailure(ctx, worlds[0].Round, victim.Member().ID); err != nil {
			return res, fmt.Errorf("report: %w", err)
		}
	}
	cwg.Wait()
	worst, first = time.Time{}, time.Time{}
	for i := range survivors {
		if errs[i] != nil {
			return res, fmt.Errorf("member %d after the loss: %w", i, errs[i])
		}
		if done[i].After(worst) {
			worst = done[i]
		}
		if first.IsZero() || done[i].Before(first) {
			first = done[i]
		}
	}
	res.change, res.changeFirst = worst.Sub(lost), first.Sub(lost)
	if change == "lease" && lapseErr == nil {
		res.afterLapse = worst.Sub(lapse)
	}
	for _, t := range seen {
		res.changeSeen = max(res.changeSeen, t.Sub(lost))
	}
	if c1, err := redisCPU(ctx, clients[0]); err == nil && cErr == nil {
		res.changeCPU = c1 - c0
	}
	if cstats1, err := commandStats(ctx, clients[0]); err == nil && cstats0 != nil {
		res.changeStats = statsDelta(cstats0, cstats1)
	}
	return res, nil
}

// leaseEnd is when member id's lease lapses, on this process' clock (at
// about now, its reading): its lease's score against the job's time on the
// store (Redis TIME less the job's outage credit; see elastic/store/scripts.go). Good to
// a few ms: the reading's round trip, and the credit as last written.
func leaseEnd(ctx context.Context, c redis.UniversalClient, job, id string, now time.Time) (time.Time, error) {
	p := store.KeyPrefix + "{" + job + "}:"
	pipe := c.Pipeline()
	score := pipe.ZScore(ctx, p+"leases", id)
	credit := pipe.HGet(ctx, p+"meta", "credit")
	tm := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, err
	}
	if score.Err() != nil || tm.Err() != nil {
		return time.Time{}, errors.Join(score.Err(), tm.Err())
	}
	cr, _ := credit.Int64() // absent: no credit
	jobNow := tm.Val().UnixMilli() - cr
	return now.Add(time.Duration(int64(score.Val())-jobNow) * time.Millisecond), nil
}

// progressEvery, when > 0 (-v), is how often a formation prints its
// members' store calls so far on stderr.
var progressEvery time.Duration
