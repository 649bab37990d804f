package elastic_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// jobSnapshot is every key of one job as DUMP returned it, with its TTL.
type jobSnapshot struct {
	keys []string
	dump map[string]string
	ttl  map[string]time.Duration
}

func jobKeys(job string) []string {
	p := store.KeyPrefix + "{" + job + "}:"
	return []string{p + "state", p + "meta", p + "members", p + "leases", p + "ord", p + "since",
		p + "arrived", p + "expected", p + "back", p + "pending", p + "rank", p + "roster"}
}

func snapshotJob(t *testing.T, ctx context.Context, c redis.UniversalClient, job string) jobSnapshot {
	t.Helper()
	s := jobSnapshot{keys: jobKeys(job), dump: map[string]string{}, ttl: map[string]time.Duration{}}
	for _, k := range s.keys {
		d, err := c.Dump(ctx, k).Result()
		if err == redis.Nil {
			continue // an empty set of the state: absent, and absent again after the restore
		}
		if err != nil {
			t.Fatalf("DUMP %s: %v", k, err)
		}
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("PTTL %s: %v %v", k, ttl, err)
		}
		s.dump[k], s.ttl[k] = d, ttl
	}
	return s
}

// restore puts the snapshot back in one MULTI/EXEC, as a promoted replica
// that had not received the writes made since would serve it.
func (s jobSnapshot) restore(t *testing.T, ctx context.Context, c redis.UniversalClient) {
	t.Helper()
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range s.keys {
			if d, ok := s.dump[k]; ok {
				p.RestoreReplace(ctx, k, s.ttl[k], d)
			} else {
				p.Del(ctx, k)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("RESTORE: %v", err)
	}
}

// TestStoreRolledBackToAnOlderState: the store loses its most recent
// writes but keeps an older state of the same incarnation (a Redis
// failover to a replica that lagged behind its master: asynchronous
// replication drops what the replica had not received). Here a member left
// and the survivors formed new rounds (another member came and went); the
// store then goes back to the round before, in which the departed member still holds a rank and a
// lease. The survivors must notice the older state, and a member arriving
// now must be admitted together with them, in a round numbered above every
// round the survivors held (round numbers never repeat, even when the
// store forgot a round).
func TestStoreRolledBackToAnOlderState(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	s := store.NewRedis(c)
	cfg := testConfig(t)
	cfg.MinWorkers, cfg.MaxWorkers = 1, 4
	a, b, leaver := newAgent(t, s, cfg), newAgent(t, s, cfg), newAgent(t, s, cfg)
	wa, wb, wl := startWorker(t, a), startWorker(t, b), startWorker(t, leaver)
	first := awaitRound(t, 20*time.Second, wa, wb, wl)
	snap := snapshotJob(t, ctx, c, cfg.JobID)

	wl.stop()
	if err := leaver.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	awaitRound(t, 20*time.Second, wa, wb)
	// More changes the store will forget: a member comes and goes.
	visitor := newAgent(t, s, cfg)
	wv := startWorker(t, visitor)
	awaitRound(t, 20*time.Second, wa, wb, wv)
	wv.stop()
	if err := visitor.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	second := awaitRound(t, 20*time.Second, wa, wb)
	if second[0].Round <= first[0].Round {
		t.Fatalf("round %d after round %d", second[0].Round, first[0].Round)
	}

	snap.restore(t, ctx, c)
	joiner := newAgent(t, s, cfg)
	wj := startWorker(t, joiner)
	third := awaitRound(t, 10*time.Second, wa, wb, wj)
	checkRound(t, third, []*elastic.Agent{a, b, joiner})
	if third[0].Round <= second[0].Round {
		t.Fatalf("after the rollback the store formed round %d, but the survivors had already held round %d", third[0].Round, second[0].Round)
	}
}

// TestSeeRoundNumbersLaterRoundsAbove: a new Agent told of a round its
// process already held (SeeRound) is given rounds numbered above it, even
// by a store that never saw that round.
func TestSeeRoundNumbersLaterRoundsAbove(t *testing.T) {
	for _, mk := range []struct {
		name string
		new  func(t *testing.T) store.Store
	}{
		{"memory", func(t *testing.T) store.Store { return store.NewMemory() }},
		{"redis", func(t *testing.T) store.Store { return store.NewRedis(testredis.Client(t)) }},
	} {
		t.Run(mk.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MinWorkers, cfg.LastCall = 1, 0
			a := newAgent(t, mk.new(t), cfg)
			a.SeeRound(41)
			a.SeeRound(7) // lower: no effect
			if got := a.LastRound(); got != 41 {
				t.Fatalf("LastRound = %d, want 41", got)
			}
			w, err := a.Join(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if w.Round <= 41 {
				t.Fatalf("round %d, want above 41", w.Round)
			}
			if got := a.LastRound(); got != w.Round {
				t.Fatalf("LastRound = %d after joining round %d", got, w.Round)
			}
		})
	}
}
