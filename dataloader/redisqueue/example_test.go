package redisqueue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/elastic/standalone"
)

// A worker drains epoch 0 of a job's shard queue in Redis (here the
// embedded server; a real deployment passes a client of its Redis).
func Example() {
	ctx := context.Background()
	srv, err := standalone.Start(ctx, "")
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()

	cfg := redisqueue.DefaultConfig()
	cfg.JobID = "example-job"
	cfg.Shards = dataloader.ShardConfig{DatasetLen: 10, ShardSize: 4, LeaseTTL: 30 * time.Second}
	q, err := redisqueue.New(client, cfg)
	if err != nil {
		panic(err)
	}
	order := dataloader.Order(7, 0, cfg.Shards.DatasetLen) // the epoch's order, same in every process
	for {
		s, err := dataloader.LeaseWait(ctx, q, 0, "worker-1", 100*time.Millisecond)
		if err != nil {
			fmt.Println(err)
			break
		}
		// ... train on the samples, apply the update, then ack:
		fmt.Printf("shard %d attempt %d: samples %v\n", s.Index, s.Attempt, s.Indices(order))
		if err := q.Ack(ctx, s); err != nil {
			panic(err)
		}
	}
	p, _ := q.Progress(ctx, 0)
	fmt.Printf("%d of %d shards acked\n", p.Acked, p.Total)
	// Output:
	// shard 0 attempt 1: samples [6 2 8 7]
	// shard 1 attempt 1: samples [5 4 9 0]
	// shard 2 attempt 1: samples [1 3]
	// dataloader: every shard of the epoch is acked: epoch 0
	// 3 of 3 shards acked
}
