package faultinject_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// Keys of a job in Redis (store.KeyPrefix, see elastic/store/redisstore.go).
func jobKey(job, name string) string { return "et:{" + job + "}:" + name }

// corruption overwrites some of a running job's Redis keys by hand.
type corruption struct {
	name string
	// mayFail: the workers may end with a clear error instead of finishing
	// (the damage cannot be repaired from inside the job, e.g. a key of the
	// wrong type that outlives the outage budget).
	mayFail bool
	apply   func(ctx context.Context, c redis.UniversalClient, job string) error
}

var corruptions = []corruption{
	{name: "state-not-json", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		return c.Set(ctx, jobKey(job, "state"), "}{ not json \x00\xff", 10*time.Minute).Err()
	}},
	{name: "state-wrong-shape", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		return c.Set(ctx, jobKey(job, "state"), `{"inc":7,"round":"x","ranked":"y","ord":[1,2],"open":"yes","dl":-1e300}`, 10*time.Minute).Err()
	}},
	{name: "state-huge-numbers", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		return editState(ctx, c, job, func(s string) string {
			s = replaceJSONNumber(s, "round", "1e300")
			s = replaceJSONNumber(s, "ver", "-1e300")
			return replaceJSONNumber(s, "dl", "9e300")
		})
	}},
	{name: "state-unknown-members", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		// Members nobody registered: in the closed round's ranks, among
		// the arrived, expected and pending members, with orders.
		p := c.TxPipeline()
		long := strings.Repeat("z", 300)
		p.HSet(ctx, jobKey(job, "rank"), "nobody", "0", long, "1")
		for _, k := range []string{"arrived", "expected", "pending", "back"} {
			p.SAdd(ctx, jobKey(job, k), "nobody", long)
		}
		p.HSet(ctx, jobKey(job, "ord"), "nobody", "-5", long, "x")
		p.HSet(ctx, jobKey(job, "since"), "nobody", "1e300", long, "y")
		_, err := p.Exec(ctx)
		return err
	}},
	{name: "roster-garbage", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		return c.Set(ctx, jobKey(job, "roster"), "not json\n\n{\"id\":\"\"}", 10*time.Minute).Err()
	}},
	{name: "members-garbage", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		ids, err := c.HKeys(ctx, jobKey(job, "members")).Result()
		if err != nil {
			return err
		}
		for i, id := range ids {
			v := []string{"not json", `{"id":""}`, `{"id":"x","pid":"nope"}`, "\xff\xfe", `[]`}[i%5]
			if err := c.HSet(ctx, jobKey(job, "members"), id, v).Err(); err != nil {
				return err
			}
		}
		return nil
	}},
	{name: "leases-garbage", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		ids, err := c.ZRange(ctx, jobKey(job, "leases"), 0, -1).Result()
		if err != nil {
			return err
		}
		zs := []redis.Z{{Score: 1e300, Member: "ghost"}}
		for _, id := range ids {
			zs = append(zs, redis.Z{Score: -1e300, Member: id})
		}
		return c.ZAdd(ctx, jobKey(job, "leases"), zs...).Err()
	}},
	{name: "meta-garbage", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		return c.HSet(ctx, jobKey(job, "meta"), "ver", "NaN", "inc", "\x00", "fin", "maybe").Err()
	}},
	{name: "wrong-types", mayFail: true, apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		p := c.TxPipeline()
		for _, k := range []string{"members", "leases"} {
			p.Del(ctx, jobKey(job, k))
			p.Set(ctx, jobKey(job, k), "a string where a hash or sorted set belongs", 10*time.Minute)
		}
		p.Del(ctx, jobKey(job, "meta"))
		p.LPush(ctx, jobKey(job, "meta"), "a list")
		p.Expire(ctx, jobKey(job, "meta"), 10*time.Minute)
		_, err := p.Exec(ctx)
		return err
	}},
	{name: "pubsub-garbage", apply: func(ctx context.Context, c redis.UniversalClient, job string) error {
		ch := jobKey(job, "events")
		for _, m := range []string{"", "x", "99999999999999999999999", "5\n7\ninc\nnot json", "18446744073709551615\n18446744073709551615\n\n{\"id\":\"ghost\",\"addr\":\"127.0.0.1:1\"}",
			"3\n-1\n", strings.Repeat("\n", 1000)} {
			if err := c.Publish(ctx, ch, m).Err(); err != nil {
				return err
			}
		}
		return nil
	}},
}

// editState rewrites the job's state JSON with edit, keeping its TTL.
func editState(ctx context.Context, c redis.UniversalClient, job string, edit func(string) string) error {
	k := jobKey(job, "state")
	s, err := c.Get(ctx, k).Result()
	if err != nil {
		return err
	}
	return c.Set(ctx, k, edit(s), redis.KeepTTL).Err()
}

// replaceJSONNumber replaces the value of "key":<number> in s.
func replaceJSONNumber(s, key, v string) string {
	i := strings.Index(s, `"`+key+`":`)
	if i < 0 {
		return s
	}
	j := i + len(key) + 3
	k := j
	for k < len(s) && strings.IndexByte("-+.0123456789eE", s[k]) >= 0 {
		k++
	}
	return s[:j] + v + s[k:]
}

// Corrupt values read from Redis are errors, never panics: while workers
// train, a job's keys are overwritten by hand with garbage of every sort,
// three times at intervals. Every worker must exit within its bounds,
// without a panic; if the job finishes every invariant holds (the store's
// scripts repair or reset what they cannot read), otherwise every worker
// ended with a clear error (for damage that outlives the outage budget).
func TestRedisGarbageIsAnErrorNeverAPanic(t *testing.T) {
	for _, cr := range corruptions {
		t.Run(cr.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := testredis.Client(t)
			cfg := testConfig(t, testredis.Addr(t))
			cfg.Epochs = 3
			// Long enough that a heavily loaded machine's slow Redis calls
			// are not mistaken for an outage; damage that outlives it
			// still ends the job with a clear error.
			cfg.OutageBudget = 6 * time.Second
			h, err := faultinject.Start(ctx, cfg)
			require.NoError(t, err)
			defer h.Close()
			bound, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			for i := range 3 {
				if err := h.WaitStep(bound, int64(20+60*i)); err != nil {
					break // the job ended or failed (judged below)
				}
				if h.Status().Finished > 0 {
					break
				}
				require.NoError(t, cr.apply(ctx, client, cfg.JobID), "corrupt the keys")
			}
			res := h.Finish(ctx, faultinject.Bounds{Exit: 60 * time.Second})
			finished := false
			for _, w := range h.Workers() {
				r := h.Result(w)
				require.True(t, r.Exited)
				logb, err := os.ReadFile(w.LogPath)
				require.NoError(t, err)
				require.False(t, bytes.Contains(logb, []byte("panic:")), "worker %d panicked:\n%s", w.Index, logb)
				require.Contains(t, []int{faultinject.ExitFinished, faultinject.ExitError, faultinject.ExitJobFinished}, r.ExitCode, "worker %d: %s", w.Index, r.Err)
				if r.ExitCode != faultinject.ExitFinished {
					require.Regexp(t, `^(trainer|elastic|sync): `, r.Err, "a clear error")
					t.Logf("worker %d failed: %s", w.Index, r.Err)
				}
				finished = finished || (r.Final != nil && r.Final.Step == cfg.TotalSteps())
			}
			if finished || !cr.mayFail {
				require.Empty(t, res.Violations, "the job survives %s", cr.name)
			} else {
				t.Logf("the job failed cleanly: %v", fmt.Sprint(res.Violations))
			}
		})
	}
}
