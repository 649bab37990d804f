package elastic_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// infoCPU returns Redis' used CPU (user + system) in seconds.
func infoCPU(b *testing.B, c redis.UniversalClient) float64 {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var tot float64
	for _, l := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(l), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			tot += f
		}
	}
	return tot
}

// BenchmarkRedisCallCost measures the Redis CPU of one heartbeat and of one
// Check by a member of a closed round of 1024 (which holds its World, so
// the roster is not sent again), on a private redis-server; it reports
// redis-us/op. Both must not grow with the round's size.
//
//	go test -run '^$' -bench RedisCallCost ./elastic/
func BenchmarkRedisCallCost(b *testing.B) {
	ctx := context.Background()
	srv := testredis.Start(b)
	c := newClient(srv.Addr())
	defer c.Close()
	s := store.NewRedis(c)
	for _, n := range []int{64, 1024} {
		p := store.Params{MinWorkers: 1, MaxWorkers: n, LastCall: time.Hour, LeaseTTL: time.Hour, StateTTL: 2 * time.Hour}
		job := fmt.Sprintf("cost-%d", n)
		var inc string
		var round uint64
		for i := range n {
			v, err := s.Join(ctx, store.JoinRequest{JobID: job, Member: elastic.Member{ID: fmt.Sprintf("m%04d", i), Addr: "127.0.0.1:1"},
				NewIncarnation: "inc", Arrive: true, Params: p})
			if err != nil {
				b.Fatal(err)
			}
			inc, round = v.Incarnation, v.Round
		}
		for _, op := range []string{"heartbeat", "check"} {
			b.Run(fmt.Sprintf("%s/members=%d", op, n), func(b *testing.B) {
				cpu0 := infoCPU(b, c)
				for i := 0; b.Loop(); i++ {
					r := store.MemberRequest{JobID: job, MemberID: fmt.Sprintf("m%04d", i%n), Incarnation: inc, Params: p, HaveRound: round}
					var err error
					if op == "check" {
						var v store.View
						v, err = s.Check(ctx, r)
						if err == nil && (v.Role != store.RoleRanked || v.Round != round) {
							err = fmt.Errorf("view %+v", v)
						}
					} else {
						_, err = s.Heartbeat(ctx, r)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(1e6*(infoCPU(b, c)-cpu0)/float64(b.N), "redis-us/op")
			})
		}
	}
}
