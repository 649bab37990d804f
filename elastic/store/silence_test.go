package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// silenceClock moves a store's time forward: a fake clock for the
// in-memory store, real time for Redis (its scripts read Redis TIME).
type silenceClock struct {
	fake    bool
	advance func(d time.Duration)
}

// TestSilenceCredit checks the lease rule's silence credit (doc.go) on the
// Go core (in-memory store, fake clock) and on the Lua scripts (Redis, whose
// clock is Redis TIME): a stretch in which no member of the job reached the
// store counts against the leases by at most LeaseTTL/2 if it lasts up to
// 1.5 x LeaseTTL, while one member's silence, with the others calling,
// fences that member when its lease ends, and a job-wide silence of
// 3 x LeaseTTL fences everyone.
func TestSilenceCredit(t *testing.T) {
	const ttl = time.Second
	p := store.Params{MinWorkers: 2, MaxWorkers: 2, LastCall: 0, LeaseTTL: ttl, StateTTL: time.Minute}
	kinds := []struct {
		name string
		make func(t *testing.T) (store.Store, silenceClock)
	}{
		{"memory", func(t *testing.T) (store.Store, silenceClock) {
			s := store.NewMemory()
			var mu sync.Mutex
			now := time.Unix(5000, 0)
			s.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
			return s, silenceClock{fake: true, advance: func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }}
		}},
		{"redis", func(t *testing.T) (store.Store, silenceClock) {
			// Real time is what is under test here: the store's clock.
			return store.NewRedis(testredis.Client(t)), silenceClock{advance: time.Sleep}
		}},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			// start forms a closed round of a and b, both just renewed.
			start := func(t *testing.T) (store.Store, silenceClock, string, func(id string) store.Code, func() store.View) {
				s, clk := k.make(t)
				job := testredis.JobID(t)
				inc := ""
				for _, id := range []string{"a", "b"} {
					v, err := s.Join(ctx, store.JoinRequest{JobID: job, Member: store.Member{ID: id, Addr: id + ":1"}, NewIncarnation: "inc-" + job, Arrive: true, Params: p})
					require.NoError(t, err)
					require.Equal(t, store.CodeOK, v.Code)
					inc = v.Incarnation
				}
				beat := func(id string) store.Code {
					b, err := s.Heartbeat(ctx, store.MemberRequest{JobID: job, MemberID: id, Incarnation: inc, Params: p})
					require.NoError(t, err)
					return b.Code
				}
				check := func() store.View {
					v, err := s.Check(ctx, store.MemberRequest{JobID: job, MemberID: "a", Incarnation: inc, Params: p})
					require.NoError(t, err)
					return v
				}
				require.Equal(t, store.CodeOK, beat("a"))
				require.Equal(t, store.CodeOK, beat("b"))
				v := check()
				require.False(t, v.Open, "a and b form a closed round")
				require.Equal(t, 2, v.Size)
				return s, clk, inc, beat, check
			}

			t.Run("job-wide gap of 1.1 LeaseTTL fences nobody", func(t *testing.T) {
				_, clk, _, beat, check := start(t)
				round := check().Round
				clk.advance(ttl * 11 / 10)
				require.Equal(t, store.CodeOK, beat("a"), "a survives the job-wide silence")
				require.Equal(t, store.CodeOK, beat("b"), "b survives the job-wide silence")
				v := check()
				require.False(t, v.Open, "no eviction reopened the round")
				require.Equal(t, round, v.Round)
				require.Equal(t, 2, v.Size)
			})

			t.Run("one member's gap fences that member on time", func(t *testing.T) {
				_, clk, _, beat, check := start(t)
				round := check().Round
				step := ttl / 10
				for i := 1; i <= 11; i++ {
					clk.advance(step)
					require.Equal(t, store.CodeOK, beat("a"), "a keeps beating (step %d)", i)
					if !clk.fake {
						continue
					}
					v := check()
					if i < 10 {
						require.False(t, v.Open, "b's lease runs until LeaseTTL after its renewal (step %d)", i)
						require.Equal(t, round, v.Round)
					} else {
						require.True(t, v.Open, "b evicted once LeaseTTL passed since its renewal (step %d)", i)
						require.Greater(t, v.Round, round)
					}
				}
				require.Equal(t, store.CodeFenced, beat("b"), "the silent member is fenced, credit or not")
				require.Equal(t, store.CodeOK, beat("a"))
			})

			t.Run("job-wide gap of 3 LeaseTTL fences everyone", func(t *testing.T) {
				_, clk, _, beat, _ := start(t)
				clk.advance(3 * ttl)
				require.Equal(t, store.CodeFenced, beat("a"), "a's own call sweeps every lapsed lease, its own too")
				require.Equal(t, store.CodeFenced, beat("b"))
			})
		})
	}
}
