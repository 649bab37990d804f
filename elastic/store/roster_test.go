package store_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/elastictest"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// replyCounter is a go-redis hook that counts, by script, the replies that
// carried a round's roster: views with the records (13 elements) and
// roster reads (luaRoster).
type replyCounter struct {
	viewsWithRoster, rosterReads atomic.Int64
}

func (*replyCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*replyCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *replyCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		rc, ok := cmd.(*redis.Cmd)
		if err != nil || !ok || len(args) < 2 {
			return err
		}
		// go-redis' Script.Run sends EVALSHA, and the script's source with
		// EVAL when the server does not know it yet (NOSCRIPT on a fresh
		// Redis): both are counted, by the script's SHA1.
		var sha string
		switch strings.ToLower(fmt.Sprint(args[0])) {
		case "evalsha":
			sha = fmt.Sprint(args[1])
		case "eval":
			sum := sha1.Sum([]byte(fmt.Sprint(args[1])))
			sha = hex.EncodeToString(sum[:])
		default:
			return err
		}
		reply, _ := rc.Val().([]any)
		switch {
		case sha == store.ScriptRoster.Hash():
			c.rosterReads.Add(1)
		case sha != store.ScriptBeat.Hash() && sha != store.ScriptHeartbeat.Hash() && len(reply) == 13:
			c.viewsWithRoster.Add(1)
		}
		return err
	}
}

// A closed round whose roster is larger than a hint carries (here five
// members of about 16 KB each) reaches every member of a process from one
// roster read: no member's view carries the records (each would be the
// whole roster again, n copies of O(n) bytes), and the Worlds hold every
// member's record in full. At 4096 members of a bench process, members
// whose heartbeat saw the round close before the hub's read returned each
// asked for the 400 KB roster, and parsing those starved the process until
// leases lapsed.
func TestLargeRosterIsReadOncePerProcess(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testredis.Addr(t)})
	defer c.Close()
	var counts replyCounter
	c.AddHook(&counts)
	s := store.NewRedis(c)
	cfg := elastic.DefaultConfig()
	cfg.JobID = testredis.JobID(t)
	cfg.StateTTL = 2 * time.Minute
	const n = 5
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = n, n, time.Hour
	agents := make([]*elastic.Agent, n)
	for i := range agents {
		m := elastic.NewMember(fmt.Sprintf("127.0.0.1:%d", 20000+i))
		m.Endpoints = map[string]string{}
		for e := range elastic.MaxEndpoints {
			m.Endpoints[fmt.Sprintf("ep%02d", e)] = fmt.Sprintf("host-%d-%d.", i, e) + strings.Repeat("x", 4*elastic.MaxMemberFieldLen-40) + ":1"
		}
		a, err := elastic.NewAgent(s, m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		agents[i] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	worlds := elastictest.JoinAll(t, ctx, agents...)
	for i := range agents {
		w := worlds[i]
		if w.Size != n || len(w.Members) != n || w.Members[w.Rank].ID != agents[i].Member().ID {
			t.Fatalf("member %d: world of %d with %d members, rank %d", i, w.Size, len(w.Members), w.Rank)
		}
		for r, m := range w.Members {
			if len(m.Endpoints) != elastic.MaxEndpoints {
				t.Fatalf("member %d: rank %d has %d endpoints, want %d", i, r, len(m.Endpoints), elastic.MaxEndpoints)
			}
		}
	}
	// Every member checks the closed round as a member that holds no
	// World of it would (HaveRound 0), as a Join woken by a heartbeat does.
	inc, err := c.HGet(ctx, store.JobKeys(cfg.JobID)[1], "inc").Result()
	if err != nil {
		t.Fatal(err)
	}
	params := store.Params{MinWorkers: cfg.MinWorkers, MaxWorkers: cfg.MaxWorkers, LastCall: cfg.LastCall, LeaseTTL: cfg.LeaseTTL, StateTTL: cfg.StateTTL}
	for _, a := range agents {
		req := store.MemberRequest{JobID: cfg.JobID, MemberID: a.Member().ID, Incarnation: inc, Params: params}
		v, err := s.Check(ctx, req)
		if err != nil || v.Role != store.RoleRanked || len(v.Members) != n {
			t.Fatalf("check: %+v, %v", v, err)
		}
	}
	if got := counts.viewsWithRoster.Load(); got != 0 {
		t.Errorf("%d views carried the %d-member roster of %d KB; want none", got, n, 16*n)
	}
	if got := counts.rosterReads.Load(); got != 1 {
		t.Errorf("the roster was read %d times by one process; want once", got)
	}
}
