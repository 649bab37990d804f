package elastic_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A client that can PUBLISH on the job's channel cannot hand members a
// round the store never formed: a message announcing a closed round of two
// (the forming round, the store's incarnation and version, the members' own
// records) while the store waits for three is not taken as a World; the
// members take the round of three the store closes next.
func TestForgedCloseHintGivesNoWorld(t *testing.T) {
	c := testredis.Client(t)
	s := store.NewRedis(c)
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 3, 3, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	spy := newSpy(s)
	agents := []*elastic.Agent{newAgent(t, spy, cfg), newAgent(t, spy, cfg)}
	joined := make(chan []elastic.World, 1)
	go func() { joined <- joinAll(t, ctx, agents) }()
	spy.waitArrived(t, agents[0].Member().ID, agents[1].Member().ID)

	prefix := store.KeyPrefix + "{" + cfg.JobID + "}:"
	meta, err := c.HMGet(ctx, prefix+"meta", "inc", "ver", "round", "open").Result()
	if err != nil {
		t.Fatal(err)
	}
	if meta[3] != "1" {
		t.Fatalf("the round should be forming: meta %v", meta)
	}
	recs, err := c.HMGet(ctx, prefix+"members", agents[0].Member().ID, agents[1].Member().ID).Result()
	if err != nil {
		t.Fatal(err)
	}
	roster := []string{recs[0].(string), recs[1].(string)}
	forged := strings.Join([]string{meta[1].(string), meta[2].(string), meta[0].(string), strings.Join(roster, "\n")}, "\n")
	if err := c.Publish(ctx, store.KeyPrefix+"{"+cfg.JobID+"}:events", forged).Err(); err != nil {
		t.Fatal(err)
	}

	last := newAgent(t, spy, cfg)
	w, err := last.Join(ctx) // the store closes the round of three
	if err != nil {
		t.Fatal(err)
	}
	worlds := <-joined
	for i, wd := range worlds {
		if wd.Size != 3 {
			t.Errorf("member %d took a World of %d from the forged message: %+v", i, wd.Size, wd)
		}
	}
	checkRound(t, append(worlds, w), append(agents, last))
}

// checkCounter counts Checks (a member's re-read of its view).
type checkCounter struct {
	store.Store
	checks atomic.Int64
}

func (s *checkCounter) Check(ctx context.Context, r store.MemberRequest) (store.View, error) {
	s.checks.Add(1)
	return s.Store.Check(ctx, r)
}

// A forged message announcing that the store opened the next round does
// not make the members of a running round believe it is over (each would
// leave its round at the next step boundary, a rescale for nothing): the
// message is only a hint to read the store, which says the round runs.
func TestForgedOpenHintSupersedesNothing(t *testing.T) {
	c := testredis.Client(t)
	s := &checkCounter{Store: store.NewRedis(c)}
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers = 2, 2
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agents := []*elastic.Agent{newAgent(t, s, cfg), newAgent(t, s, cfg)}
	ws := joinAll(t, ctx, agents)
	checkRound(t, ws, agents)

	prefix := store.KeyPrefix + "{" + cfg.JobID + "}:"
	meta, err := c.HMGet(ctx, prefix+"meta", "inc", "ver").Result()
	if err != nil {
		t.Fatal(err)
	}
	ver, err := strconv.ParseUint(meta[1].(string), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	before := s.checks.Load()
	forged := fmt.Sprintf("%d\n%d\n%s\nopen", ver+1, ws[0].Round+1, meta[0].(string))
	if err := c.Publish(ctx, store.KeyPrefix+"{"+cfg.JobID+"}:events", forged).Err(); err != nil {
		t.Fatal(err)
	}
	// Both members read the store on the hint (a version they have not
	// seen); the store says their round runs.
	for s.checks.Load() < before+2 {
		select {
		case <-ctx.Done():
			t.Fatalf("the members never read the store after the forged hint (checks %d); pending %v %v",
				s.checks.Load()-before, agents[0].ChangePending(), agents[1].ChangePending())
		case <-agents[0].Changes():
		case <-agents[1].Changes():
		case <-time.After(10 * time.Millisecond):
		}
	}
	for i, a := range agents {
		if a.ChangePending() {
			t.Errorf("member %d believes its round %d is over after a forged open hint", i, ws[i].Round)
		}
	}
}
