package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// diffClient is what one simulated member remembers between calls.
type diffClient struct {
	m     store.Member
	inc   string
	order int64
	since uint64
	hint  uint64
	have  uint64 // round of the last ranked view with members
	peers []string
}

func viewKey(v store.View) string {
	ids := make([]string, len(v.Members))
	for i, m := range v.Members {
		ids[i] = m.ID
	}
	return fmt.Sprintf("code=%v inc=%s ver=%d round=%d open=%v role=%d rank=%d size=%d pending=%d order=%d since=%d members=%v",
		v.Code, v.Incarnation, v.Version, v.Round, v.Open, v.Role, v.Rank, v.Size, v.Pending, v.Order, v.Since, ids)
}

// TestStoresAgree drives the in-memory store (the Go core) and the Redis
// store (the Lua scripts) with the same random sequences of calls and
// requires identical answers. Leases are long and LastCall is 0 or an hour,
// so the two stores' clocks cannot make them differ.
func TestStoresAgree(t *testing.T) {
	t.Parallel()
	params := []store.Params{
		{MinWorkers: 1, MaxWorkers: 3, LastCall: 0, LeaseTTL: time.Minute, StateTTL: time.Hour},
		{MinWorkers: 2, MaxWorkers: 4, LastCall: time.Hour, LeaseTTL: time.Minute, StateTTL: time.Hour},
		{MinWorkers: 1, MaxWorkers: 2, LastCall: 0, LeaseTTL: time.Minute, StateTTL: time.Hour},
		{MinWorkers: 3, MaxWorkers: 8, LastCall: 0, LeaseTTL: time.Minute, StateTTL: time.Hour},
	}
	// The Redis store on the shared Redis, and on the embedded server
	// elastic/standalone runs: its scripts run there too.
	kinds := []struct {
		name string
		make func(t *testing.T) *store.Redis
	}{
		{"redis", func(t *testing.T) *store.Redis { return store.NewRedis(testredis.Client(t)) }},
		{"standalone", func(t *testing.T) *store.Redis { return store.NewRedis(testredis.EmbeddedClient(t)) }},
	}
	for _, k := range kinds {
		for pi, p := range params {
			for seed := uint64(1); seed <= 3; seed++ {
				t.Run(fmt.Sprintf("%s/params%d/seed%d", k.name, pi, seed), func(t *testing.T) {
					runDifferential(t, k.make(t), p, seed, 400)
				})
			}
		}
	}
}

// TestStoresAgreeOnACluster runs the differential test through a go-redis
// ClusterClient on a real Redis Cluster of three masters: the scripts
// agree with the core there too (every key of the job in one slot).
func TestStoresAgreeOnACluster(t *testing.T) {
	t.Parallel()
	cl := testredis.StartCluster(t)
	runDifferential(t, store.NewRedis(cl.Client(t)), store.Params{MinWorkers: 1, MaxWorkers: 3, LeaseTTL: time.Minute, StateTTL: time.Hour}, 1, 300)
}

func runDifferential(t *testing.T, other *store.Redis, p store.Params, seed uint64, steps int) {
	ctx := context.Background()
	mem := store.NewMemory()
	jobID := testredis.JobID(t)
	rng := rand.New(rand.NewPCG(seed, 99))
	var clients []*diffClient
	newClient := func() *diffClient {
		c := &diffClient{m: store.Member{ID: fmt.Sprintf("m%02d-%d", len(clients), rng.IntN(1000)), Host: "h", PID: len(clients), Addr: fmt.Sprintf("127.0.0.1:%d", 20000+len(clients))}}
		clients = append(clients, c)
		return c
	}
	for range 3 {
		newClient()
	}
	remember := func(c *diffClient, v store.View) {
		if v.Code != store.CodeOK {
			return
		}
		c.inc = v.Incarnation
		if !v.Open {
			c.hint = max(c.hint, v.Round)
		}
		if v.Order > 0 {
			c.order = v.Order
		}
		if v.Since > 0 {
			c.since = v.Since
		}
		if v.Role == store.RoleRanked && v.Members != nil {
			c.have = v.Round
			c.peers = c.peers[:0]
			for _, m := range v.Members {
				if m.ID != c.m.ID {
					c.peers = append(c.peers, m.ID)
				}
			}
		}
	}
	useHave := false // this step's calls say which round's roster they hold
	mreq := func(c *diffClient) store.MemberRequest {
		r := store.MemberRequest{JobID: jobID, MemberID: c.m.ID, Incarnation: c.inc, Params: p}
		if useHave {
			r.HaveRound = c.have
		}
		return r
	}
	var lastRound uint64
	seen := map[string]int{}
	defer func() { t.Logf("last closed round %d; outcomes %v", lastRound, seen) }()
	for step := range steps {
		useHave = rng.IntN(2) == 0
		c := clients[rng.IntN(len(clients))]
		var vm, vo store.View
		var em, eo error
		var op string
		switch r := rng.IntN(100); {
		case r < 8 && len(clients) < 10:
			c = newClient()
			fallthrough
		case r < 40:
			op = "join"
			req := store.JoinRequest{JobID: jobID, Member: c.m, Incarnation: c.inc, NewIncarnation: fmt.Sprintf("inc%d", step),
				RoundHint: c.hint, Arrive: rng.IntN(5) != 0, Params: p}
			if c.inc != "" {
				req.Order, req.Since, req.Peers = c.order, c.since, slices.Clone(c.peers)
			}
			vm, em = mem.Join(ctx, req)
			vo, eo = other.Join(ctx, req)
		case r < 60:
			op = "check"
			vm, em = mem.Check(ctx, mreq(c))
			vo, eo = other.Check(ctx, mreq(c))
		case r < 75:
			op = "heartbeat"
			bm, e1 := mem.Heartbeat(ctx, mreq(c))
			bo, e2 := other.Heartbeat(ctx, mreq(c))
			if e1 != nil || e2 != nil {
				t.Fatalf("step %d heartbeat: %v / %v", step, e1, e2)
			}
			// The two stores' clocks differ; each must report one on a renewal.
			if (bm.StoreTime > 0) != (bm.Code == store.CodeOK) || (bo.StoreTime > 0) != (bo.Code == store.CodeOK) {
				t.Fatalf("step %d heartbeat by %s: store time %d / %d with codes %v / %v", step, c.m.ID, bm.StoreTime, bo.StoreTime, bm.Code, bo.Code)
			}
			bm.StoreTime, bo.StoreTime = 0, 0
			if bm.Code == store.CodeOK && bm.Leases < 1 {
				t.Fatalf("step %d heartbeat by %s renewed, but %d leases are held", step, c.m.ID, bm.Leases)
			}
			if bm != bo { // the lease count too
				t.Fatalf("step %d heartbeat by %s: memory %+v, redis %+v", step, c.m.ID, bm, bo)
			}
			continue
		case r < 85:
			op = "report"
			target := clients[rng.IntN(len(clients))].m.ID
			round := lastRound
			if rng.IntN(3) == 0 && round > 0 {
				round-- // sometimes a stale report
			}
			req := store.ReportRequest{MemberRequest: mreq(c), Round: round, Target: target}
			vm, em = mem.Report(ctx, req)
			vo, eo = other.Report(ctx, req)
		case r < 92:
			op = "leave"
			vm, em = mem.Leave(ctx, mreq(c))
			vo, eo = other.Leave(ctx, mreq(c))
		case r < 93 && step > steps*9/10:
			op = "finish"
			vm, em = mem.Finish(ctx, mreq(c))
			vo, eo = other.Finish(ctx, mreq(c))
		case r < 93:
			op = "check"
			vm, em = mem.Check(ctx, mreq(c))
			vo, eo = other.Check(ctx, mreq(c))
		case r < 95:
			op = "drop"
			mem.Drop(jobID)
			if err := other.DropJob(ctx, jobID); err != nil {
				t.Fatal(err)
			}
			continue
		default:
			// A fenced member comes back as a new member.
			op = "renew"
			c.m.ID += "x"
			c.inc, c.order, c.since, c.peers, c.have = "", 0, 0, nil, 0
			continue
		}
		if em != nil || eo != nil {
			t.Fatalf("step %d %s: errors memory=%v redis=%v", step, op, em, eo)
		}
		if a, b := viewKey(vm), viewKey(vo); a != b {
			t.Fatalf("step %d %s by %s:\n memory %s\n redis  %s", step, op, c.m.ID, a, b)
		}
		remember(c, vm)
		seen[fmt.Sprintf("%s/%v/role%d", op, vm.Code, vm.Role)]++
		if !vm.Open && vm.Code == store.CodeOK {
			lastRound = vm.Round
		}
		if vm.Code == store.CodeFinished {
			return
		}
	}
}
