package elastic_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// A client that can PUBLISH on the job's channel cannot hand members a
// round the store never formed: a message announcing a closed round of two
// (the forming round, the store's incarnation and version, the members' own
// records) while the store waits for three is not taken as a World; the
// members take the round of three the store closes next.
func TestForgedCloseHintGivesNoWorld(t *testing.T) {
	c := testredis.Client(t)
	s := elastic.NewRedisStore(c)
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers, cfg.LastCall = 3, 3, time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	spy := newSpy(s)
	agents := []*elastic.Agent{newAgent(t, spy, cfg), newAgent(t, spy, cfg)}
	joined := make(chan []elastic.World, 1)
	go func() { joined <- joinAll(t, ctx, agents) }()
	spy.waitArrived(t, agents[0].Member().ID, agents[1].Member().ID)

	prefix := elastic.KeyPrefix + "{" + cfg.JobID + "}:"
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
	if err := c.Publish(ctx, elastic.KeyPrefix+"{"+cfg.JobID+"}:events", forged).Err(); err != nil {
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
